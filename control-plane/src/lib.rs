//! The control plane of a self-hostable, Kernel-compatible browser service.

pub mod agent;
pub mod api;
pub mod auth;
pub mod blobs;
pub mod config;
pub mod error;
pub mod ids;
pub mod managed_auth;
pub mod pools;
pub mod profiles;
pub mod proxies;
pub mod replays;
pub mod runtime;
pub mod server;
pub mod sessions;
pub mod state;
pub mod store;
pub mod tokens;
