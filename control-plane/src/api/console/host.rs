//! `GET /console/host-report`: what the console's host page shows the people who operate this
//! host (admins of the operator organization, `--operator-org`): its capacity and
//! memory, every organization's live VMs, the isolation report of `/readyz`, the
//! replicas sharing the store and which one holds each duty, and the warnings and
//! errors logged lately. Anyone else is refused: a tenant must not learn of another.

use axum::Json;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};

use crate::api::error::ApiError;
use crate::api::org::{Caller, Org};
use crate::recent_problems::{self, Problem};
use crate::replicas::{DUTIES, Place};
use crate::store::{SessionRecord, SessionStatus};

/// Live VMs listed at most (the counts cover them all).
const MAX_LISTED_VMS: usize = 1_000;

#[derive(Serialize)]
struct LiveVm {
    session_id: String,
    organization: String,
    project_id: Option<String>,
    name: Option<String>,
    status: &'static str,
    headless: bool,
    created_at: DateTime<Utc>,
    pool_id: Option<String>,
    /// `idle`, `leased` or `resetting` for a pool's browser.
    pool_lease: Option<&'static str>,
    /// The replica that serves it.
    replica: Option<String>,
}

#[derive(Serialize)]
struct ReplicaView {
    id: String,
    address: Option<String>,
    this_one: bool,
    /// The duties this replica holds now.
    duties: Vec<&'static str>,
}

/// Whether `org`'s caller operates this host: an admin of the operator organization, or
/// one of its keys that holds every right of the whole organization. Not a key bound to
/// a project or restricted by a policy, nor an action's invocation key.
pub fn is_operator(org: &Org) -> bool {
    if org.id != org.settings.operator_org.id {
        return false;
    }
    match &org.caller {
        // An admin's role has no policy.
        Caller::Person { policy, .. } => policy.is_none(),
        Caller::Key { key: Some(key), invocation: false } => {
            key.policy.is_none() && key.project_id.is_none()
        }
        _ => false,
    }
}

pub async fn host(org: Org) -> Result<Json<Value>, ApiError> {
    if !is_operator(&org) {
        return Err(ApiError::Forbidden(
            "the host page is for the host's operators (admins of the organization named by \
             --operator-org)"
                .into(),
        ));
    }
    let live = org.store.live_sessions().await?;
    let count = |keep: fn(&SessionRecord) -> bool| live.iter().filter(|s| keep(s)).count();
    let counts = json!({
        "live": live.len(),
        "starting": count(|s| s.status == SessionStatus::Starting),
        "running": count(|s| s.status == SessionStatus::Running),
        "headless": count(|s| s.headless),
        "headful": count(|s| !s.headless),
        "pooled": count(|s| s.pool_id.is_some()),
    });
    let vms: Vec<LiveVm> = live
        .into_iter()
        .take(MAX_LISTED_VMS)
        .map(|session| LiveVm {
            status: session.status.as_str(),
            pool_lease: session.pool_lease.map(|lease| lease.as_str()),
            session_id: session.id,
            organization: session.org_id,
            project_id: session.project_id,
            name: session.name,
            headless: session.headless,
            created_at: session.created_at,
            pool_id: session.pool_id,
            replica: session.owner,
        })
        .collect();

    let replica = org.sessions.replica();
    let mut replicas = Vec::new();
    let mut ids: Vec<String> = replica.live_replicas().await?.into_iter().collect();
    ids.sort();
    let mut holders = Vec::new();
    for duty in DUTIES {
        holders.push((duty, replica.duty_holder(duty).await?));
    }
    for id in ids {
        let this_one = id == replica.id();
        let address = org.store.replica_address(&id).await?;
        let duties = holders
            .iter()
            .filter(|(_, place)| match place {
                Place::Here => this_one,
                Place::At(at) => !this_one && address.as_deref() == Some(at.as_str()),
                Place::Nowhere => false,
            })
            .map(|(duty, _)| *duty)
            .collect();
        replicas.push(ReplicaView { id, address, this_one, duties });
    }
    let unheld: Vec<&str> = holders
        .iter()
        .filter(|(_, place)| matches!(place, Place::Nowhere))
        .map(|(duty, _)| *duty)
        .collect();

    let limits = org.sessions.live_limits();
    let problems: Vec<Problem> = recent_problems::recent();
    Ok(Json(json!({
        "capacity": {
            "browsers": org.settings.metrics.capacity.browsers,
            "per_organization": {
                "live_browsers": limits.browsers,
                "live_memory_gib": limits.memory_gib,
            },
            "memory_total_gib": gib(crate::metrics::meminfo_kib("MemTotal")),
            "memory_available_gib": gib(crate::metrics::meminfo_kib("MemAvailable")),
            "cpus": std::thread::available_parallelism().map(usize::from).unwrap_or(1),
            "load_average": std::fs::read_to_string("/proc/loadavg").ok()
                .and_then(|text| text.split_whitespace().next().map(str::to_owned)),
        },
        "counts": counts,
        "vms": vms,
        "isolation": org.runtime.isolation(),
        "replicas": replicas,
        "unheld_duties": unheld,
        "recent_problems": problems,
    })))
}

fn gib(kib: Option<u64>) -> Option<f64> {
    kib.map(|kib| (kib as f64 / 1_048_576.0 * 10.0).round() / 10.0)
}
