//! The control plane of a self-hostable, Kernel-compatible browser service.

pub mod access;
pub mod agent;
pub mod api;
pub mod app;
pub mod apps;
pub mod archive_formats;
pub mod audit;
pub mod backup;
pub mod blobs;
pub mod chrome_store;
pub mod config;
#[cfg(test)]
mod config_reference;
pub mod credentials;
pub mod egress;
pub mod error;
pub mod ids;
pub mod in_progress;
pub mod managed_auth;
pub mod mcp;
pub mod memory;
pub mod metrics;
pub mod people;
pub mod pools;
pub mod profiles;
pub mod proxies;
pub mod recent_problems;
pub mod replays;
pub mod replicas;
pub mod runtime;
pub mod server;
pub mod sessions;
pub mod store;
pub mod telemetry;
#[cfg(test)]
pub mod testing;
pub mod tokens;
