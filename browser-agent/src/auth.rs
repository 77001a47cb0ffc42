//! Every call must carry the agent's secret; each authenticated call also counts as a
//! sign of life from the control plane (see `watchdog`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use browser_agent_proto::AUTHORIZATION_METADATA;
use subtle::ConstantTimeEq;
use tonic::{Request, Status};

#[derive(Clone)]
pub struct Authenticator {
    expected: Arc<Vec<u8>>,
    /// Monotonic, so a wall-clock jump (NTP step, VM resume) cannot stop live browsers.
    started: Instant,
    /// Milliseconds after `started` of the last authenticated call.
    last_contact_ms: Arc<AtomicU64>,
}

impl Authenticator {
    pub fn new(secret: &str) -> Self {
        Self {
            expected: Arc::new(format!("Bearer {secret}").into_bytes()),
            started: Instant::now(),
            last_contact_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    /// How long since a control plane last called (or since the agent started).
    pub fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_contact_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }

    pub fn check(&self, request: Request<()>) -> Result<Request<()>, Status> {
        let presented = request
            .metadata()
            .get(AUTHORIZATION_METADATA)
            .map(|value| value.as_bytes())
            .unwrap_or_default();
        if bool::from(presented.ct_eq(self.expected.as_slice())) {
            let now = self.started.elapsed().as_millis() as u64;
            self.last_contact_ms.store(now, Ordering::Relaxed);
            Ok(request)
        } else {
            Err(Status::unauthenticated("missing or wrong agent credential"))
        }
    }
}
