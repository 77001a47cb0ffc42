//! The browser agent contract (`browser_agent.v1`) as a server whose RPCs all answer
//! `unimplemented` unless overridden, for fake agents in tests. Its messages are
//! wire-compatible with `browser_agent_proto::v1`'s, not the same Rust types.
//!
//! A crate of its own, a dev-dependency only: as a feature of `browser-agent-proto` it
//! made `cargo test` build that crate, and everything above it, a second time.

// Generated code only.
#![allow(clippy::all, clippy::pedantic, clippy::unwrap_used, clippy::expect_used)]

pub mod v1 {
    tonic::include_proto!("browser_agent.v1");
}
