//! Every call must carry the agent's secret; each authenticated call also counts as a
//! sign of life from the control plane (see `watchdog`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use browser_agent_proto::AUTHORIZATION_METADATA;
use subtle::ConstantTimeEq;
use tonic::{Request, Status};

#[derive(Clone)]
pub struct Authenticator {
    expected: Arc<Vec<u8>>,
    pub last_contact: Arc<AtomicU64>,
}

impl Authenticator {
    pub fn new(secret: &str) -> Self {
        Self {
            expected: Arc::new(format!("Bearer {secret}").into_bytes()),
            last_contact: Arc::new(AtomicU64::new(now_millis())),
        }
    }

    pub fn check(&self, request: Request<()>) -> Result<Request<()>, Status> {
        let presented = request
            .metadata()
            .get(AUTHORIZATION_METADATA)
            .map(|value| value.as_bytes())
            .unwrap_or_default();
        if bool::from(presented.ct_eq(self.expected.as_slice())) {
            self.last_contact.store(now_millis(), Ordering::Relaxed);
            Ok(request)
        } else {
            Err(Status::unauthenticated("missing or wrong agent credential"))
        }
    }
}

pub fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
