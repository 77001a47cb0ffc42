//! Every call must carry the agent's secret; each authenticated call also counts as a
//! sign of life from the control plane (see `watchdog`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use browser_agent_proto::AUTHORIZATION_METADATA;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::{Request, Status};

#[derive(Clone)]
pub struct Authenticator {
    /// SHA-256 of the secret: the agent may be given only that (`from_sha256`).
    expected: Arc<[u8; 32]>,
    /// Monotonic, so a wall-clock jump (NTP step, VM resume) cannot stop live browsers.
    started: Instant,
    /// Milliseconds after `started` of the last authenticated call.
    last_contact_ms: Arc<AtomicU64>,
}

impl Authenticator {
    pub fn new(secret: &str) -> Self {
        Self::expecting(Sha256::digest(secret.as_bytes()).into())
    }

    /// Expects the secret whose SHA-256 is `digest` (hex); `None` if it is not one.
    pub fn from_sha256(digest: &str) -> Option<Self> {
        let bytes: [u8; 32] = hex::decode(digest.trim()).ok()?.try_into().ok()?;
        Some(Self::expecting(bytes))
    }

    fn expecting(digest: [u8; 32]) -> Self {
        Self {
            expected: Arc::new(digest),
            started: Instant::now(),
            last_contact_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    /// How long since a control plane last called (or since the agent started).
    pub fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_contact_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }

    /// Whether `secret` is the agent's; if so, it counts as contact.
    pub fn admits(&self, secret: &[u8]) -> bool {
        let digest: [u8; 32] = Sha256::digest(secret).into();
        let admitted = !secret.is_empty() && bool::from(digest.ct_eq(self.expected.as_ref()));
        if admitted {
            let now = self.started.elapsed().as_millis() as u64;
            self.last_contact_ms.store(now, Ordering::Relaxed);
        }
        admitted
    }

    pub fn check(&self, request: Request<()>) -> Result<Request<()>, Status> {
        let presented = request
            .metadata()
            .get(AUTHORIZATION_METADATA)
            .map(|value| value.as_bytes())
            .unwrap_or_default();
        let secret = presented.strip_prefix(b"Bearer ").unwrap_or_default();
        if self.admits(secret) {
            Ok(request)
        } else {
            Err(Status::unauthenticated("missing or wrong agent credential"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn presenting(credential: &str) -> Request<()> {
        let mut request = Request::new(());
        request.metadata_mut().insert(AUTHORIZATION_METADATA, credential.parse().unwrap());
        request
    }

    #[test]
    fn the_secret_or_its_digest_admits_exactly_the_secret() {
        let digest = hex::encode(Sha256::digest(b"s3cret"));
        for authenticator in
            [Authenticator::new("s3cret"), Authenticator::from_sha256(&digest).unwrap()]
        {
            assert!(authenticator.check(presenting("Bearer s3cret")).is_ok());
            for wrong in ["Bearer s3cre", "s3cret", "Bearer ", &format!("Bearer {digest}")] {
                assert!(authenticator.check(presenting(wrong)).is_err(), "{wrong}");
            }
            assert!(authenticator.check(Request::new(())).is_err());
        }
        assert!(Authenticator::from_sha256("abc").is_none());
    }
}
