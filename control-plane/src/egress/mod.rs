//! What a browser VM's traffic may reach, and the proxy outside the sandbox that is its
//! only way out.

mod allowlist;
mod policy;
mod proxy;

pub use allowlist::HostAllowlist;
pub use policy::{Allowance, EgressError, EgressPolicy, is_internal};
pub use proxy::{EgressServer, VmEgress};
