//! What a browser VM's traffic may reach, and the proxy outside the sandbox that is its
//! only way out.

mod allowlist;
mod failures;
mod policy;
mod proxy;

pub use allowlist::HostAllowlist;
pub use failures::{ProxyFailure, ProxyFailures};
pub use policy::{Allowance, EgressError, EgressPolicy, is_internal};
pub use proxy::{EgressServer, FailureLog, VmEgress};
