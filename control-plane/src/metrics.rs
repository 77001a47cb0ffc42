//! Prometheus metrics (`GET /metrics`, OpenMetrics text). Two kinds:
//! - events counted by this process as they happen (HTTP requests, create and acquire
//!   latency, pending acquires, agent RPC errors), in the process-wide [`METRICS`];
//! - the state of the service, read from the store at each scrape (sessions, pools,
//!   recordings, capacity), so that every replica reports the same values and they match
//!   what the API answers.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::store::{PoolLease, SessionStatus, Store, StoreResult};

/// Every metric's name starts with this.
const PREFIX: &str = "browser_service";

/// The media type of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    /// The route's template (`/browsers/{id}`), never the raw path: bounded cardinality.
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: String,
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcErrorLabels {
    code: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// From 1 ms to about 65 s.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// What this process counts as it happens.
pub struct Metrics {
    registry: Registry,
    http_requests: Family<RequestLabels, Counter>,
    http_duration: Histograms<RouteLabels>,
    browser_create: Histogram,
    pool_acquire: Histogram,
    pending_acquires: Gauge,
    admission_queue: Gauge,
    admission_refusals: Counter,
    agent_rpc_errors: Family<RpcErrorLabels, Counter>,
}

pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let http_requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests answered, by method, route and status",
            http_requests.clone(),
        );
        let http_duration = Histograms::<RouteLabels>::new_with_constructor(latency_histogram);
        registry.register(
            "http_request_duration_seconds",
            "Time to answer an HTTP request (to the upgrade, for WebSockets), by method and route",
            http_duration.clone(),
        );
        let browser_create = latency_histogram();
        registry.register(
            "browser_create_duration_seconds",
            "Time to start a browser (POST /browsers, login flows, pool fills), started ones only",
            browser_create.clone(),
        );
        let pool_acquire = latency_histogram();
        registry.register(
            "pool_acquire_duration_seconds",
            "Time a pool acquire took, waiting included, whether it got a browser or timed out",
            pool_acquire.clone(),
        );
        let pending_acquires = Gauge::default();
        registry.register(
            "pool_acquires_pending",
            "Pool acquires this process is answering now (waiting for an idle browser)",
            pending_acquires.clone(),
        );
        let admission_queue = Gauge::default();
        registry.register(
            "admission_queue",
            "Creates this process holds until the host has room for another browser",
            admission_queue.clone(),
        );
        let admission_refusals = Counter::default();
        registry.register(
            "admission_refusals",
            "Creates and pool fills refused (429) because the host had no room for another \
             browser",
            admission_refusals.clone(),
        );
        let agent_rpc_errors = Family::<RpcErrorLabels, Counter>::default();
        registry.register(
            "agent_rpc_errors",
            "Calls to browser agents that failed for a reason not the caller's (unreachable, \
             timed out, internal), by gRPC code",
            agent_rpc_errors.clone(),
        );
        Self {
            registry,
            http_requests,
            http_duration,
            browser_create,
            pool_acquire,
            pending_acquires,
            admission_queue,
            admission_refusals,
            agent_rpc_errors,
        }
    }

    /// A create joined (`1`) or left (`-1`) the queue for room on the host.
    pub fn admission_queued(&self, change: i64) {
        self.admission_queue.inc_by(change);
    }

    pub fn admission_refused(&self) {
        self.admission_refusals.inc();
    }

    /// Creates waiting for room on the host now.
    pub fn admission_queue_length(&self) -> i64 {
        self.admission_queue.get()
    }

    pub fn http_request(&self, labels: RequestLabels, started: Instant) {
        self.http_duration
            .get_or_create(&RouteLabels {
                method: labels.method.clone(),
                route: labels.route.clone(),
            })
            .observe(started.elapsed().as_secs_f64());
        self.http_requests.get_or_create(&labels).inc();
    }

    pub fn browser_created(&self, started: Instant) {
        self.browser_create.observe(started.elapsed().as_secs_f64());
    }

    /// Counts an acquire as pending until the returned guard drops, then records how long
    /// it took (also when the caller went away).
    pub fn acquire_started(&'static self) -> PendingAcquire {
        self.pending_acquires.inc();
        PendingAcquire { metrics: self, started: Instant::now() }
    }

    pub fn agent_rpc_error(&self, code: tonic::Code) {
        self.agent_rpc_errors.get_or_create(&RpcErrorLabels { code: format!("{code:?}") }).inc();
    }
}

pub struct PendingAcquire {
    metrics: &'static Metrics,
    started: Instant,
}

impl Drop for PendingAcquire {
    fn drop(&mut self) {
        self.metrics.pending_acquires.dec();
        self.metrics.pool_acquire.observe(self.started.elapsed().as_secs_f64());
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct SessionLabels {
    organization: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct PoolLabels {
    organization: String,
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct PoolStateLabels {
    organization: String,
    pool: String,
    state: String,
}

/// What the host is sized for, for autoscalers.
#[derive(Clone, Copy, Debug)]
pub struct Capacity {
    /// How many browser VMs this deployment is sized for.
    pub browsers: u64,
}

/// A line of this host's `/proc/meminfo` (`MemTotal`, `MemAvailable`, …), in KiB.
pub fn meminfo_kib(field: &str) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    info.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().trim_end_matches("kB").trim().parse().ok()
    })
}

/// The whole exposition: this process's counters, then the service's state as the store
/// has it now.
pub async fn render(store: &dyn Store, capacity: Capacity) -> StoreResult<String> {
    let state = state_registry(store, capacity).await?;
    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = encode_registry(&mut text, &METRICS.registry)
        .and_then(|()| encode_registry(&mut text, &state))
        .and_then(|()| encode_eof(&mut text));
    Ok(text)
}

async fn state_registry(store: &dyn Store, capacity: Capacity) -> StoreResult<Registry> {
    let live = store.live_sessions().await?;
    let pools = store.list_pools(None).await?;
    let recordings = store.unfinished_replays().await?;

    // Every organization's browsers in both states, zeros included, so a series does not
    // vanish (and a dashboard stay at its last value) when the last browser ends.
    let mut sessions: BTreeMap<SessionLabels, i64> = BTreeMap::new();
    let mut pool_states: BTreeMap<PoolStateLabels, i64> = BTreeMap::new();
    for pool in &pools {
        for state in [PoolLease::Idle, PoolLease::Leased, PoolLease::Resetting] {
            pool_states.insert(
                PoolStateLabels {
                    organization: pool.org_id.clone(),
                    pool: pool.id.clone(),
                    state: state.as_str().to_owned(),
                },
                0,
            );
        }
    }
    for session in &live {
        match (&session.pool_id, session.pool_lease) {
            (None, _) => {
                for state in [SessionStatus::Starting, SessionStatus::Running] {
                    sessions
                        .entry(SessionLabels {
                            organization: session.org_id.clone(),
                            state: state.as_str().to_owned(),
                        })
                        .or_insert(0);
                }
                *sessions
                    .entry(SessionLabels {
                        organization: session.org_id.clone(),
                        state: session.status.as_str().to_owned(),
                    })
                    .or_insert(0) += 1;
            }
            // Counted as the pool's API counts them: running browsers by lease.
            (Some(pool_id), Some(lease)) if session.status == SessionStatus::Running => {
                *pool_states
                    .entry(PoolStateLabels {
                        organization: session.org_id.clone(),
                        pool: pool_id.clone(),
                        state: lease.as_str().to_owned(),
                    })
                    .or_insert(0) += 1;
            }
            _ => {}
        }
    }

    let mut registry = Registry::with_prefix(PREFIX);
    registry.register(
        "browser_sessions",
        "Live browsers outside pools, by organization and state (starting, running)",
        gauges(sessions),
    );
    registry.register(
        "pool_browsers",
        "Running browsers of each pool, by lease state (idle, leased, resetting)",
        gauges(pool_states),
    );
    let pool_targets = pools.iter().map(|pool| {
        (PoolLabels { organization: pool.org_id.clone(), pool: pool.id.clone() }, pool.size)
    });
    registry.register(
        "pool_target_size",
        "How many browsers each pool is to hold",
        gauges(pool_targets),
    );
    let active_recordings = gauge(recordings.len() as i64);
    registry.register(
        "recordings_active",
        "Recordings under way or being finished",
        active_recordings,
    );

    // Every live VM takes capacity, pool browsers included.
    let used = live.len() as u64;
    let capacity_gauge = gauge(i64::try_from(capacity.browsers).unwrap_or(i64::MAX));
    registry.register(
        "capacity_browsers",
        "How many browser VMs the deployment is sized for (--capacity-browsers)",
        capacity_gauge,
    );
    let vms = gauge(used as i64);
    registry.register("browser_vms", "Live browser VMs, pools' included: what takes capacity", vms);
    let utilization = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
    utilization.set(used as f64 / capacity.browsers.max(1) as f64);
    registry.register(
        "capacity_utilization",
        "browser_vms / capacity_browsers: scale out above your target (KEDA, HPA)",
        utilization,
    );
    if let Some(heap) = crate::memory::heap_usage() {
        let in_use = gauge(i64::try_from(heap.in_use).unwrap_or(i64::MAX));
        let held = gauge(i64::try_from(heap.held).unwrap_or(i64::MAX));
        registry.register(
            "heap_in_use_bytes",
            "This process's heap holding live data (the allocator's count)",
            in_use,
        );
        registry.register(
            "heap_held_bytes",
            "This process's heap taken from the system: in use, or free and kept for reuse",
            held,
        );
    }
    Ok(registry)
}

/// A gauge set to `value`.
fn gauge(value: i64) -> Gauge {
    let gauge = Gauge::default();
    gauge.set(value);
    gauge
}

/// One gauge by label set, set to its value.
fn gauges<L: Clone + std::hash::Hash + Eq>(
    values: impl IntoIterator<Item = (L, i64)>,
) -> Family<L, Gauge> {
    let family = Family::<L, Gauge>::default();
    for (labels, value) in values {
        family.get_or_create(&labels).set(value);
    }
    family
}
