//! Managed auth (auth connections, their settings and timeline, credentials and credential
//! providers), who is calling (`/auth/context`), and people signing in.

pub mod connection_settings;
pub mod connections;
pub mod context;
pub mod credential_providers;
pub mod credentials;
pub mod hosted_login;
pub mod sign_in;
pub mod timeline;
