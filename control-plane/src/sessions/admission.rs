//! Admission: whether an organization may have one more browser now, and whether the
//! host has room for one more VM. Everything that counts an organization's browsers and
//! then adds to them holds this process's turn and the store's per-organization lock;
//! everything that starts a VM also holds the store's deployment-wide lock while it
//! counts every live VM and inserts its own. So replicas never admit past a limit or
//! past the host's capacity together.
//!
//! A create the host has no room for waits its turn (first come, first served on this
//! replica) for up to `HostLimits::queue_wait`, taking the place of an idle standby
//! browser if there is one, then gets 429 with `Retry-After` (the SDKs retry). Pool
//! fills and standby refills never wait: they leave the room to the creates waiting
//! and try again at the reconciler's next pass.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{LIMIT_RETRY_AFTER, Sessions, spec};
use crate::error::{ServiceError, ServiceResult};
use crate::metrics::METRICS;
use crate::store::{PoolLease, SessionFilter, SessionRecord, StoreResult, scope};

/// When a create refused for lack of room on the host is told to try again: browsers
/// end all the time on a full host, so soon.
const HOST_RETRY_AFTER: Duration = Duration::from_secs(5);
/// How often a waiting create looks again without being woken (a browser ended on
/// another replica does not wake it).
const RECHECK: Duration = Duration::from_millis(250);

/// What the whole deployment may hold at once.
#[derive(Clone, Copy, Debug)]
pub struct HostLimits {
    /// Browser VMs live at once, every organization's, pools' and standby browsers
    /// included (`--capacity-browsers`).
    pub browsers: u64,
    /// A VM is started on this host only while it has at least this much memory
    /// available (bytes, `MemAvailable`); `None` where VMs run elsewhere (Kubernetes).
    pub min_available_memory: Option<u64>,
    /// How long a create waits for room before it is refused.
    pub queue_wait: Duration,
}

/// The creates of this replica waiting for room, in the order they came.
#[derive(Default)]
pub(super) struct HostQueue {
    /// VMs of ended sessions this replica is still taking apart slowly (their recordings
    /// finished, their profiles saved, before they go): they still hold their place.
    pub(super) tearing_down: AtomicU64,
    next_ticket: AtomicU64,
    waiting: Mutex<BTreeSet<u64>>,
    freed: tokio::sync::Notify,
}

impl HostQueue {
    /// A browser ended: the waiting creates look again.
    pub(super) fn room_freed(&self) {
        self.freed.notify_waiters();
    }

    fn enter(&self) -> Place<'_> {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut waiting) = self.waiting.lock() {
            waiting.insert(ticket);
        }
        METRICS.admission_queued(1);
        Place { queue: self, ticket }
    }

    /// How many creates waiting here came before `ticket` (all of them for `None`).
    fn ahead_of(&self, ticket: Option<u64>) -> u64 {
        let Ok(waiting) = self.waiting.lock() else {
            return 0;
        };
        match ticket {
            Some(ticket) => waiting.range(..ticket).count() as u64,
            None => waiting.len() as u64,
        }
    }
}

/// A VM being taken apart slowly holds its place until this is dropped (whatever
/// happens to the teardown); then the creates waiting look again.
pub(super) struct TearingDown<'a>(&'a HostQueue);

impl<'a> TearingDown<'a> {
    pub(super) fn new(queue: &'a HostQueue) -> Self {
        queue.tearing_down.fetch_add(1, Ordering::Relaxed);
        Self(queue)
    }
}

impl Drop for TearingDown<'_> {
    fn drop(&mut self) {
        self.0.tearing_down.fetch_sub(1, Ordering::Relaxed);
        self.0.room_freed();
    }
}

/// Why the host has no room now.
struct Full {
    reason: String,
    /// Short of memory rather than of places.
    memory: bool,
}

/// A create's place in the queue, given up when it is dropped (admitted, refused, or
/// its caller gone).
struct Place<'a> {
    queue: &'a HostQueue,
    ticket: u64,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if let Ok(mut waiting) = self.queue.waiting.lock() {
            waiting.remove(&self.ticket);
        }
        METRICS.admission_queued(-1);
    }
}

impl Sessions {
    /// Admits the new session and records it (the store's answer to the insert), or
    /// says why not. Waits for room on the host as the module says.
    pub(super) async fn admit(
        self: &Arc<Self>, record: &SessionRecord,
    ) -> ServiceResult<StoreResult<()>> {
        let deadline = Instant::now() + self.host_limits.queue_wait;
        let mut place: Option<Place<'_>> = None;
        let mut retired_for_memory = false;
        loop {
            // Registered before looking, so that an end in between still wakes it.
            let freed = self.host_queue.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let ahead = self.host_queue.ahead_of(place.as_ref().map(|p| p.ticket));
            // A create waiting behind others looks without locks first: only those that
            // may fit take the locks (many waiters would otherwise hold up every create).
            let hopeless = match &place {
                Some(_) => self.host_is_full(ahead).await?,
                None => None,
            };
            let Full { reason, memory } = match hopeless {
                Some(full) => full,
                None => match self.try_admit(record, ahead).await? {
                    Ok(inserted) => return Ok(inserted),
                    Err(full) => full,
                },
            };
            let refused = || {
                METRICS.admission_refused();
                ServiceError::LimitReached {
                    message: format!("{reason}; try again shortly"),
                    retry_after: HOST_RETRY_AFTER,
                }
            };
            if record.pool_id.is_some() {
                return Err(refused());
            }
            if place.is_none() {
                place = Some(self.host_queue.enter());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(refused());
            }
            // An idle standby browser is worth less than a caller's: it makes room. Short
            // of memory, one at most: the kernel takes a VM's memory back only after its
            // end, and another would not be needed.
            if !(memory && retired_for_memory) && self.retire_an_idle_standby_browser().await {
                retired_for_memory |= memory;
                if memory {
                    tokio::time::sleep(RECHECK).await;
                }
                continue;
            }
            tokio::select! {
                () = &mut freed => {}
                () = tokio::time::sleep((deadline - now).min(RECHECK)) => {}
            }
        }
    }

    /// One attempt: the organization's limits (refused at once), then the host's room,
    /// leaving `ahead` places to creates that came first. `Err` says the host is full.
    async fn try_admit(
        &self, record: &SessionRecord, ahead: u64,
    ) -> ServiceResult<Result<StoreResult<()>, Full>> {
        // In this process, then across replicas: no two admissions count before the
        // other inserted its own.
        let _turn = self.admission.lock().await;
        let organization_lock = match record.pool_id {
            None => Some(self.store.lock_admission(&record.org_id).await?),
            Some(_) => None,
        };
        let decided = async {
            self.check_live_limit(record).await?;
            let host_lock = self.store.lock_host_admission().await?;
            let decided = match self.host_is_full(ahead).await {
                Ok(None) => Ok(Ok(self.store.insert_session(record).await)),
                Ok(Some(full)) => Ok(Err(full)),
                Err(error) => Err(error),
            };
            host_lock.release().await;
            decided
        }
        .await;
        if let Some(lock) = organization_lock {
            lock.release().await;
        }
        decided
    }

    /// Why the host cannot take one more VM now with `reserved` places kept for others,
    /// if it cannot.
    async fn host_is_full(&self, reserved: u64) -> ServiceResult<Option<Full>> {
        let live = self.live_vms().await?;
        let capacity = self.host_limits.browsers;
        if live + reserved >= capacity {
            let waiting = match reserved {
                0 => String::new(),
                n => format!(" and {n} earlier creates are waiting"),
            };
            return Ok(Some(Full {
                reason: format!(
                    "the host runs {live} browsers, all it has room for ({capacity}){waiting}"
                ),
                memory: false,
            }));
        }
        Ok(self.short_of_memory())
    }

    /// Why this host is too short of memory to start a VM, if it is.
    fn short_of_memory(&self) -> Option<Full> {
        let needed = self.host_limits.min_available_memory?;
        let available = crate::metrics::meminfo_kib("MemAvailable")? << 10;
        (available < needed).then(|| Full {
            reason: format!(
                "the host has {} MiB of memory available, less than the {} MiB it keeps \
                 for starting a browser",
                available >> 20,
                needed >> 20
            ),
            memory: true,
        })
    }

    /// How many more VMs pool fills may start now (creates waiting here go first); an
    /// estimate without locks: each launch is admitted again when it records itself.
    pub async fn host_room_for_pools(&self) -> ServiceResult<u64> {
        if self.short_of_memory().is_some() {
            return Ok(0);
        }
        let reserved = self.live_vms().await? + self.host_queue.ahead_of(None);
        Ok(self.host_limits.browsers.saturating_sub(reserved))
    }

    /// The deployment's live VMs: its live sessions, and those of this replica still
    /// being taken apart (ended, but finishing a recording or saving a profile first).
    async fn live_vms(&self) -> ServiceResult<u64> {
        let live = self.store.live_vm_count().await?;
        Ok(live + self.host_queue.tearing_down.load(Ordering::Relaxed))
    }

    /// Ends one idle standby browser, if there is one; true if it did.
    async fn retire_an_idle_standby_browser(self: &Arc<Self>) -> bool {
        let Some(standby) = self.standby.get() else {
            return false;
        };
        for pool_id in standby.pool_ids() {
            let Ok(members) = self.store.pool_members(pool_id).await else {
                continue;
            };
            for member in members {
                if member.pool_lease != Some(PoolLease::Idle)
                    || !self
                        .store
                        .set_pool_lease(&member.id, PoolLease::Idle, PoolLease::Retiring)
                        .await
                        .unwrap_or(false)
                {
                    continue;
                }
                if let Err(error) = self.end(&member, "made room on the host for a create").await {
                    tracing::warn!(session_id = %member.id, %error, "could not end a standby browser");
                }
                return true;
            }
        }
        false
    }

    /// This process's admission turn: held, with the store's per-organization lock,
    /// by anything that counts an organization's browsers and then adds to them (a
    /// create here, a pool's create or resize). SQLite's lock is this one alone.
    pub async fn admission_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.admission.lock().await
    }

    pub(super) async fn check_live_limit(&self, record: &SessionRecord) -> ServiceResult<()> {
        if record.pool_id.is_some() {
            return Ok(());
        }
        if let Some(project_id) = &record.project_id {
            self.check_project_limit(project_id).await?;
        }
        // The organization's limits count all of its projects.
        scope::organization_wide(self.check_organization_limits(record)).await
    }

    /// A project's own cap (`projects.limits`; the default project's is also
    /// `organization.limits`' `default_project_max_concurrent_sessions`), on its live
    /// browsers and its pools' reservations together.
    async fn check_project_limit(&self, project_id: &str) -> ServiceResult<()> {
        let Some(project) = self.store.project_by_id(project_id).await? else {
            return Ok(());
        };
        let Some(cap) = project.max_concurrent_sessions else {
            return Ok(());
        };
        let (live, reserved) = self.store.project_browsers(project_id).await?;
        if live + reserved >= cap {
            return Err(ServiceError::LimitReached {
                message: format!(
                    "project {} has {live} live browsers and {reserved} reserved by its pools: \
                     its max_concurrent_sessions is {cap}; end one or try again later",
                    project.name
                ),
                retry_after: LIMIT_RETRY_AFTER,
            });
        }
        Ok(())
    }

    async fn check_organization_limits(&self, record: &SessionRecord) -> ServiceResult<()> {
        let refused = |message: String| ServiceError::LimitReached {
            message,
            retry_after: LIMIT_RETRY_AFTER,
        };
        let live = self.store.live_browser_count(&record.org_id).await?;
        if live >= u64::from(self.live_limits.browsers) {
            return Err(refused(format!(
                "the organization has {live} live browsers, its limit; end one or try again later"
            )));
        }
        let memory_of = |session: &SessionRecord| {
            session.vm_settings.memory.as_deref().map_or(0, spec::memory_bytes)
        };
        let in_use: u64 = self
            .store
            .list_sessions(&record.org_id, SessionFilter::Live, u32::MAX, 0)
            .await?
            .iter()
            .filter(|session| session.pool_id.is_none())
            .map(memory_of)
            .sum();
        let limit = u64::from(self.live_limits.memory_gib) << 30;
        if in_use + memory_of(record) > limit {
            return Err(refused(format!(
                "the organization's live browsers have {} GiB of memory and this one asks for {}; \
                 the limit is {} GiB: end one or try again later",
                in_use >> 30,
                record.vm_settings.memory.as_deref().unwrap_or("none"),
                self.live_limits.memory_gib
            )));
        }
        Ok(())
    }
}
