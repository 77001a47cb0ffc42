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

use tokio::time::{Instant, MissedTickBehavior};

use chrono::Utc;
use tokio::sync::{broadcast, watch};

use crate::store::{Store, StoreResult};

/// How long a replica's membership lasts unless renewed: a dead replica's browsers are
/// adopted within it.
const MEMBERSHIP_TTL: Duration = Duration::from_secs(5);
/// How long a duty's lease lasts unless renewed: a dead replica's background work moves
/// within it. Longer than a membership: a replica that cannot renew a duty in time must
/// stop that work (and for the workflows, restart), which a host whose CPUs and disk the
/// browsers' start keeps busy for a few seconds must not cause.
const DUTY_TTL: Duration = Duration::from_secs(10);
/// How often leases are renewed: a few renewals fit in one time to live.
const RENEW_INTERVAL: Duration = Duration::from_millis(1500);
/// A holder counts its lease as lost this long before it ends (timed from the start of
/// the renewal that set its end): by then it has stopped the work before another takes it.
const LOSS_MARGIN: Duration = Duration::from_secs(1);
/// How long past its membership's end a replica still counts as live: after the database
/// was unreachable for everyone, each replica renews its own before any adopts another's.
const MEMBERSHIP_GRACE: Duration = Duration::from_secs(2);
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
    EgressChanged { org_id: String, session_id: String, allowlist: bool, proxy: bool },
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
    /// This process's own mark in its membership: another process with the same id
    /// (misconfigured, or this one's previous life) is told apart.
    instance: String,
    /// Until when this replica's membership surely lasts (its last renewal's).
    membership_until: std::sync::Mutex<Option<Instant>>,
    /// Whether other replicas may share the store (PostgreSQL), which then carries
    /// signals between them.
    shared: std::sync::atomic::AtomicBool,
    /// Where the other replicas reach this one (`--internal-url`).
    address: String,
    store: Arc<dyn Store>,
    signals: broadcast::Sender<Signal>,
    /// Set once it left: its membership and duties are no longer renewed.
    left: std::sync::atomic::AtomicBool,
    /// Renewals hold it shared, `leave` alone: a renewal already under way when this
    /// replica leaves would otherwise take back the lease `leave` has just given up.
    renewals: tokio::sync::RwLock<()>,
    /// The leases of its duties.
    duties: std::sync::Mutex<Vec<String>>,
}

impl Replica {
    /// `id` must be unique among the running replicas, and is best kept across restarts:
    /// a restarted replica then takes its sessions back at once.
    pub fn new(store: Arc<dyn Store>, id: String, address: String) -> Arc<Self> {
        Arc::new(Self {
            id,
            // Host and process id: a restart on the same host recognizes its previous life.
            instance: format!("{}/{}", host_name(), std::process::id()),
            membership_until: std::sync::Mutex::default(),
            shared: std::sync::atomic::AtomicBool::new(false),
            address,
            store,
            signals: broadcast::channel(1024).0,
            left: std::sync::atomic::AtomicBool::new(false),
            renewals: tokio::sync::RwLock::new(()),
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
    /// the others' signals. Waits while another process holds the membership of this id
    /// (this replica's previous life, killed less than a lease ago; or another process
    /// given the same id, which must not run twice).
    pub async fn join(self: &Arc<Self>) -> StoreResult<()> {
        self.store.register_replica(&self.id, &self.address, Utc::now()).await?;
        let notices = self.store.listen(SIGNALS_CHANNEL);
        self.shared.store(notices.is_some(), std::sync::atomic::Ordering::SeqCst);
        // This process's previous life (alone on its store, as with SQLite; or on this
        // host, its process gone) gives its membership up at once: its browsers are
        // taken back before their agents, waiting for a control plane, give up.
        if let Some((holder, _)) = self.store.lease(&self.membership()).await?
            && (notices.is_none() || is_dead_process_here(&holder))
        {
            self.store.release_lease(&self.membership(), &holder).await?;
        }
        let mut warned = false;
        while !self.renew_membership().await? {
            if !std::mem::replace(&mut warned, true) {
                tracing::warn!(replica = %self.id, "another process holds this replica id's membership; waiting until its lease ends (each replica needs an id of its own)");
            }
            tokio::time::sleep(RENEW_INTERVAL).await;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = renewal_ticks();
            loop {
                tick.tick().await;
                let _renewing = this.renewals.read().await;
                if this.left.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                // (Had this process stalled past the lease, others adopted its sessions
                // meanwhile; their owner in the store says so, and this one leaves them.)
                match this.renew_membership().await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::error!(replica = %this.id, "another process took this replica id's membership")
                    }
                    Err(error) => {
                        tracing::warn!(%error, "could not renew this replica's membership")
                    }
                }
            }
        });
        if let Some(mut notices) = notices {
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

    /// Gives up this replica's membership and duties at once (a clean shutdown), so that
    /// the others adopt its work without waiting for the leases to expire.
    pub async fn leave(&self) {
        let _no_renewal = self.renewals.write().await;
        self.left.store(true, std::sync::atomic::Ordering::SeqCst);
        let duties = self.duties.lock().map(|d| d.clone()).unwrap_or_default();
        for lease in duties {
            let _ = self.store.release_lease(&lease, &self.id).await;
        }
        let _ = self.store.release_lease(&self.membership(), &self.membership_holder()).await;
    }

    /// Whether other replicas may share the store (and so its work).
    pub fn is_shared(&self) -> bool {
        self.shared.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether this replica's membership surely lasts, so that it may judge others: it
    /// adopts nothing while it cannot reach the database itself.
    pub fn is_current(&self) -> bool {
        self.membership_until
            .lock()
            .ok()
            .and_then(|until| *until)
            .is_some_and(|until| Instant::now() < until)
    }

    fn membership(&self) -> String {
        format!("{MEMBERSHIP_PREFIX}{}", self.id)
    }

    /// The membership's holder: the id, then this process's mark.
    fn membership_holder(&self) -> String {
        format!("{} {}", self.id, self.instance)
    }

    async fn renew_membership(&self) -> StoreResult<bool> {
        let until = self.membership_until.lock().ok().and_then(|until| *until);
        let renewed =
            self.hold(&self.membership(), &self.membership_holder(), until, MEMBERSHIP_TTL).await;
        if let Ok(mut slot) = self.membership_until.lock() {
            // Kept after an error while it lasts (`is_current` compares it with the time).
            if let Ok(until) = &renewed {
                *slot = *until;
            }
        }
        renewed.map(|until| until.is_some())
    }

    /// Takes or renews a lease, timed by the database's clock (replicas' clocks may
    /// differ). Answers until when it surely lasts, or `None` if another holds it.
    ///
    /// A renewal may take as long as the lease it renews still lasts (`held_until`): on
    /// a host whose CPUs the browsers keep busy, the database can take seconds to answer,
    /// and giving up sooner would hand healthy work over to another replica. A lease not
    /// held (or held no longer) is tried for as long as a renewal would make it last.
    /// The answer is `None` unless the lease lasts past now.
    async fn hold(
        &self, lease: &str, holder: &str, held_until: Option<Instant>, ttl: Duration,
    ) -> StoreResult<Option<Instant>> {
        let started = Instant::now();
        let deadline =
            held_until.filter(|until| *until > started).unwrap_or(started + ttl - LOSS_MARGIN);
        let attempt = async {
            let now = self.store.clock().await?;
            let ttl = chrono::Duration::from_std(ttl).unwrap_or_default();
            self.store.hold_lease(lease, holder, now, now + ttl).await
        };
        let held = tokio::time::timeout_at(deadline, attempt).await.unwrap_or_else(|_| {
            Err(crate::store::StoreError::Backend(format!(
                "renewing {lease} took over {:?}",
                deadline - started
            )))
        })?;
        if started.elapsed() > RENEW_INTERVAL {
            tracing::debug!(lease, took = ?started.elapsed(), "a slow lease renewal");
        }
        // The database read its clock after `started`: the lease lasts at least this long.
        let until = started + ttl - LOSS_MARGIN;
        Ok((held && Instant::now() < until).then_some(until))
    }

    /// Replicas whose membership has not expired (or only just), this one included.
    pub async fn live_replicas(&self) -> StoreResult<HashSet<String>> {
        let grace = chrono::Duration::from_std(MEMBERSHIP_GRACE).unwrap_or_default();
        let since = self.store.clock().await? - grace;
        let mut live: HashSet<String> = self
            .store
            .lease_holders(MEMBERSHIP_PREFIX, since)
            .await?
            .into_iter()
            .map(|holder| holder.split(' ').next().unwrap_or_default().to_owned())
            .collect();
        live.insert(self.id.clone());
        Ok(live)
    }

    /// Where the duty `name` runs now.
    pub async fn duty_holder(&self, name: &str) -> StoreResult<Place> {
        let Some((holder, until)) = self.store.lease(&duty_lease(name)).await? else {
            return Ok(Place::Nowhere);
        };
        if until <= self.store.clock().await? {
            return Ok(Place::Nowhere);
        }
        if holder == self.id {
            return Ok(Place::Here);
        }
        Ok(match self.store.replica_address(&holder).await? {
            Some(address) => Place::At(address),
            None => Place::Nowhere,
        })
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
        let envelope = Envelope { from: self.id.clone(), signal };
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
            let mut tick = renewal_ticks();
            let mut held_until: Option<Instant> = None;
            loop {
                // Woken by the next renewal, or by the lease's end when renewals keep
                // failing: the work stops then, not a tick later.
                tokio::select! {
                    _ = tick.tick() => {}
                    () = lapse(held_until) => {
                        held_until = None;
                        tracing::info!(lease, holds = false, "duty changed hands");
                        if held_tx.send(Some(false)).is_err() {
                            return;
                        }
                        continue;
                    }
                }
                let renewing = this.renewals.read().await;
                if this.left.load(std::sync::atomic::Ordering::SeqCst) {
                    let _ = this.store.release_lease(&lease, &this.id).await;
                    return;
                }
                match this.hold(&lease, &this.id, held_until, DUTY_TTL).await {
                    Ok(until) => held_until = until,
                    // The store did not answer: still held while the last renewal
                    // lasts, not after.
                    Err(error) => {
                        tracing::warn!(%error, lease, "could not renew a duty");
                        held_until = held_until.filter(|until| Instant::now() < *until);
                    }
                }
                drop(renewing);
                let holds = held_until.is_some();
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

/// Resolves when a lease held until `until` ends; never for one not held.
async fn lapse(until: Option<Instant>) {
    match until {
        Some(until) => tokio::time::sleep_until(until).await,
        None => std::future::pending().await,
    }
}

/// Renewals every `RENEW_INTERVAL`; one that took longer is followed by the next at
/// once, not by a burst of the missed ones.
fn renewal_ticks() -> tokio::time::Interval {
    let mut ticks = tokio::time::interval(RENEW_INTERVAL);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    ticks
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_default()
}

/// Whether a membership holder (`<id> <host>/<pid>`) names a process of this host that
/// no longer runs a control plane.
fn is_dead_process_here(holder: &str) -> bool {
    let Some((host, pid)) =
        holder.split_once(' ').and_then(|(_, instance)| instance.rsplit_once('/'))
    else {
        return false;
    };
    if host != host_name() || pid.parse::<u32>().is_err() {
        return false;
    }
    let command = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    !String::from_utf8_lossy(&command).contains("control-plane")
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
        if self.held.wait_for(|held| *held == Some(false)).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves once the first attempt to take the duty is over.
    pub async fn settled(&mut self) {
        let _ = self.held.wait_for(Option::is_some).await;
    }
}

/// Where a duty runs.
#[derive(Debug, PartialEq, Eq)]
pub enum Place {
    Here,
    /// At the replica with this address.
    At(String),
    /// Nowhere at this moment (its holder died; another takes it within a lease).
    Nowhere,
}

/// Managed-auth workflows (logins, health checks) and apps (builds, invocations): they
/// live in one process's memory, so one replica runs them all, and the others forward
/// their requests to it.
pub const WORKFLOWS: &str = "workflows";

/// Ends browsers that have been idle past their timeout.
pub const INACTIVITY_REAPER: &str = "inactivity-reaper";
/// Keeps pools (the standby ones included) at their size.
pub const POOL_RECONCILER: &str = "pool-reconciler";
/// Delivers audit logs to their export destinations.
pub const AUDIT_EXPORT: &str = "audit-export";
/// Every duty, for the console's host page.
pub const DUTIES: [&str; 4] = [WORKFLOWS, INACTIVITY_REAPER, POOL_RECONCILER, AUDIT_EXPORT];
