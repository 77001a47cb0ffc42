//! Several control planes (replicas) on one PostgreSQL database, any of them serving any
//! request. What they share lives in the store; what is per process is coordinated here:
//! - membership: each replica holds a lease named after its id while it runs; a replica
//!   whose lease expired is gone, and the others adopt its sessions;
//! - duties: background work that must run once across replicas (the inactivity reaper,
//!   the pool reconciler) runs where its lease is held, and moves within the lease's
//!   time to live when that replica dies;
//! - signals: what one replica changed that another must act on (a session ended, its
//!   egress changed, a pool browser to reset), sent with PostgreSQL's NOTIFY; the sender
//!   acts on its own change directly.
//!
//! With SQLite (one process) the same code runs: every lease is this process's, and
//! signals go only to itself.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::{broadcast, watch};

use crate::store::{Store, StoreResult};

/// How long a lease lasts unless renewed: a dead replica's work moves within it.
const LEASE_TTL: Duration = Duration::from_secs(6);
/// How often leases are renewed: a few renewals fit in one time to live.
const RENEW_INTERVAL: Duration = Duration::from_secs(2);
/// The NOTIFY channel of signals.
const SIGNALS_CHANNEL: &str = "browser_service_signals";
const MEMBERSHIP_PREFIX: &str = "replica:";

/// What one replica tells the others (and itself).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "signal", rename_all = "snake_case")]
pub enum Signal {
    /// The session ended: what is cached of it goes, its owner drops its egress.
    SessionEnded { session_id: String },
    /// The session's record changed (its viewport, name, profile): cached copies go.
    SessionChanged { session_id: String },
    /// The session's allowlist or proxy changed in the store: its owner applies it.
    EgressChanged {
        org_id: String,
        session_id: String,
        allowlist: bool,
        proxy: bool,
    },
    /// The pool browser was released for reuse: its owner resets it.
    ResetRequested { org_id: String, session_id: String },
    /// This replica adopted the session from a replica that is gone (never sent to
    /// others).
    Adopted { org_id: String, session_id: String },
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Envelope {
    from: String,
    #[serde(flatten)]
    signal: Signal,
}

pub struct Replica {
    id: String,
    /// Where the other replicas reach this one (`--internal-url`).
    address: String,
    store: Arc<dyn Store>,
    signals: broadcast::Sender<Signal>,
    /// Set once it left: its membership and duties are no longer renewed.
    left: std::sync::atomic::AtomicBool,
    /// The leases of its duties.
    duties: std::sync::Mutex<Vec<String>>,
}

impl Replica {
    /// `id` must be unique among the running replicas, and is best kept across restarts:
    /// a restarted replica then takes its sessions back at once.
    pub fn new(store: Arc<dyn Store>, id: String, address: String) -> Arc<Self> {
        Arc::new(Self {
            id,
            address,
            store,
            signals: broadcast::channel(1024).0,
            left: std::sync::atomic::AtomicBool::new(false),
            duties: std::sync::Mutex::default(),
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether this replica serves the session.
    pub fn owns(&self, session: &crate::store::SessionRecord) -> bool {
        session.owner.as_deref() == Some(self.id.as_str())
    }

    /// Joins: holds this replica's membership (and keeps renewing it) and listens for
    /// the others' signals.
    pub async fn join(self: &Arc<Self>) -> StoreResult<()> {
        self.store
            .register_replica(&self.id, &self.address, Utc::now())
            .await?;
        self.renew(&self.membership()).await?;
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RENEW_INTERVAL);
            loop {
                tick.tick().await;
                if this.left.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                // Nobody else holds a replica's own membership: only the store can fail.
                // (Had this process stalled past the lease, others adopted its sessions
                // meanwhile; their owner in the store says so, and this one leaves them.)
                if let Err(error) = this.renew(&this.membership()).await {
                    tracing::warn!(%error, "could not renew this replica's membership");
                }
            }
        });
        if let Some(mut notices) = self.store.listen(SIGNALS_CHANNEL) {
            let this = self.clone();
            tokio::spawn(async move {
                while let Some(payload) = notices.recv().await {
                    match serde_json::from_str::<Envelope>(&payload) {
                        // Its own: it acted when it sent it.
                        Ok(envelope) if envelope.from == this.id => {}
                        Ok(envelope) => {
                            let _ = this.signals.send(envelope.signal);
                        }
                        Err(error) => tracing::warn!(%error, "an unreadable signal"),
                    }
                }
            });
        }
        Ok(())
    }

    /// Gives up this replica's membership and duties at once (a clean shutdown), so that the others adopt its work without waiting for the leases
    /// to expire.
    pub async fn leave(&self) {
        self.left.store(true, std::sync::atomic::Ordering::SeqCst);
        let duties = self.duties.lock().map(|d| d.clone()).unwrap_or_default();
        for lease in duties {
            let _ = self.store.release_lease(&lease, &self.id).await;
        }
        let _ = self.store.release_lease(&self.membership(), &self.id).await;
    }

    fn membership(&self) -> String {
        format!("{MEMBERSHIP_PREFIX}{}", self.id)
    }

    async fn renew(&self, lease: &str) -> StoreResult<bool> {
        let now = Utc::now();
        let ttl = chrono::Duration::from_std(LEASE_TTL).unwrap_or_default();
        self.store.hold_lease(lease, &self.id, now, now + ttl).await
    }

    /// Replicas whose membership has not expired, this one included.
    pub async fn live_replicas(&self) -> StoreResult<HashSet<String>> {
        let mut live: HashSet<String> = self
            .store
            .lease_holders(MEMBERSHIP_PREFIX, Utc::now())
            .await?
            .into_iter()
            .collect();
        live.insert(self.id.clone());
        Ok(live)
    }

    /// Where to reach the live replica that holds the duty `name`, if another one does.
    pub async fn duty_holder_elsewhere(&self, name: &str) -> StoreResult<Option<String>> {
        let Some((holder, until)) = self.store.lease(&duty_lease(name)).await? else {
            return Ok(None);
        };
        if holder == self.id || until <= Utc::now() {
            return Ok(None);
        }
        self.store.replica_address(&holder).await
    }

    /// Where to reach the replica that serves the live session `id`, if it is another
    /// live one.
    pub async fn owner_elsewhere(&self, session_id: &str) -> StoreResult<Option<String>> {
        let Some(owner) = self.store.session_owner(session_id).await? else {
            return Ok(None);
        };
        if owner == self.id || !self.live_replicas().await?.contains(&owner) {
            return Ok(None);
        }
        self.store.replica_address(&owner).await
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Signal> {
        self.signals.subscribe()
    }

    /// Sends the signal to the other replicas (this one acts on its own change itself).
    pub async fn publish(&self, signal: Signal) {
        let envelope = Envelope {
            from: self.id.clone(),
            signal,
        };
        let Ok(payload) = serde_json::to_string(&envelope) else {
            return;
        };
        if let Err(error) = self.store.notify(SIGNALS_CHANNEL, &payload).await {
            tracing::warn!(%error, "could not signal the other replicas");
        }
    }

    /// Tells only this replica.
    pub fn publish_here(&self, signal: Signal) {
        let _ = self.signals.send(signal);
    }

    /// Starts holding the duty `name` whenever no other live replica holds it.
    pub fn duty(self: &Arc<Self>, name: &str) -> Duty {
        let (held_tx, held) = watch::channel(None);
        let (this, lease) = (self.clone(), duty_lease(name));
        if let Ok(mut duties) = self.duties.lock() {
            duties.push(lease.clone());
        }
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RENEW_INTERVAL);
            let mut renewed: Option<std::time::Instant> = None;
            loop {
                tick.tick().await;
                if this.left.load(std::sync::atomic::Ordering::SeqCst) {
                    let _ = this.store.release_lease(&lease, &this.id).await;
                    return;
                }
                let holds = match this.renew(&lease).await {
                    Ok(holds) => {
                        renewed = holds.then(std::time::Instant::now);
                        holds
                    }
                    // The store did not answer: still held while the last renewal
                    // lasts (with a renewal's margin), not after.
                    Err(error) => {
                        tracing::warn!(%error, lease, "could not renew a duty");
                        renewed.is_some_and(|at| at.elapsed() < LEASE_TTL - RENEW_INTERVAL)
                    }
                };
                if *held_tx.borrow() != Some(holds) {
                    tracing::info!(lease, holds, "duty changed hands");
                }
                if held_tx.send(Some(holds)).is_err() {
                    let _ = this.store.release_lease(&lease, &this.id).await;
                    return;
                }
            }
        });
        Duty { held }
    }
}

fn duty_lease(name: &str) -> String {
    format!("duty:{name}")
}

/// A piece of background work that runs on one replica at a time.
pub struct Duty {
    /// `None` until the first attempt to take it.
    held: watch::Receiver<Option<bool>>,
}

impl Duty {
    pub fn is_held(&self) -> bool {
        *self.held.borrow() == Some(true)
    }

    /// Resolves once this replica holds the duty.
    pub async fn held(&mut self) {
        let _ = self.held.wait_for(|held| *held == Some(true)).await;
    }

    /// Resolves once this replica no longer holds the duty (never after it left).
    pub async fn lost(&mut self) {
        if self
            .held
            .wait_for(|held| *held == Some(false))
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves once the first attempt to take the duty is over.
    pub async fn settled(&mut self) {
        let _ = self.held.wait_for(Option::is_some).await;
    }
}

/// Managed-auth workflows (logins, health checks) and apps (builds, invocations): they
/// live in one process's memory, so one replica runs them all, and the others forward
/// their requests to it.
pub const WORKFLOWS: &str = "workflows";

/// How long a replica that died keeps its work: within this, another takes it over.
pub const TAKEOVER: Duration = LEASE_TTL;
