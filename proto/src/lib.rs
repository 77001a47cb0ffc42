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

/// The same contract as a server whose RPCs all answer `unimplemented` unless overridden,
/// for fake agents in tests (its messages are wire-compatible with `v1`'s, not the same
/// Rust types).
#[cfg(feature = "fake-server")]
pub mod fake_v1 {
    #![allow(
        clippy::all,
        clippy::pedantic,
        clippy::unwrap_used,
        clippy::expect_used
    )]
    include!(concat!(env!("OUT_DIR"), "/stubs/browser_agent.v1.rs"));
}

/// Metadata key that carries the agent credential on every call.
pub const AUTHORIZATION_METADATA: &str = "authorization";

/// File names of a recording in an agent's recordings directory. Runtimes that can reach
/// that directory collect from it the recordings of agents that died.
pub mod recording_files {
    /// While recording: fragmented MP4, playable up to its last complete fragment.
    pub fn in_progress(recording_id: &str) -> String {
        format!("{recording_id}.recording.mp4")
    }

    /// Once finished: a regular MP4 with its index at the front.
    pub fn finished(recording_id: &str) -> String {
        format!("{recording_id}.mp4")
    }
}
