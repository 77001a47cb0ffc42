//! Generated gRPC code for the browser agent contract (`browser_agent.v1`).

pub mod v1 {
    #![allow(
        clippy::all,
        clippy::pedantic,
        clippy::unwrap_used,
        clippy::expect_used
    )]
    tonic::include_proto!("browser_agent.v1");
}

/// Metadata key that carries the agent credential on every call.
pub const AUTHORIZATION_METADATA: &str = "authorization";
