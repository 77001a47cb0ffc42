//! Races between leasing, releasing, timeouts and flushes, over a fake runtime.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tempfile::TempDir;

use super::*;
use crate::app::Services;
use crate::testing::{FakeAgent, FakeRuntime, eventually, organization, services, stored_session};

/// Started services over fakes in a directory of their own (keep it while they run),
/// with an organization and its full pool of `size` browsers.
async fn full_pool(
    size: i64,
) -> (TempDir, Services, Arc<FakeRuntime>, FakeAgent, String, PoolView) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (services, runtime, agent) = services(dir.path()).await;
    services.start(Duration::from_secs(3600)).await.expect("services start");
    let org_id = organization(&services).await;
    let pool = services
        .pools
        .create(
            &org_id,
            PoolChanges {
                size: Some(size),
                fill_rate_per_minute: Some(10_000),
                ..Default::default()
            },
        )
        .await
        .expect("pool created");
    let filled = async || {
        services.pools.get(&org_id, &pool.record.id).await.expect("pool").available_count == size
    };
    eventually("the pool is full", filled).await;
    (dir, services, runtime, agent, org_id, pool)
}

async fn members(services: &Services, pool: &PoolView) -> Vec<SessionRecord> {
    services.store.pool_members(&pool.record.id).await.expect("members")
}

async fn lease(services: &Services, org_id: &str, pool: &PoolView) -> SessionRecord {
    let (_, leased) = services
        .pools
        .acquire(org_id, &pool.record.id, Some(Duration::ZERO))
        .await
        .expect("acquire");
    leased.expect("an idle browser was leased")
}

async fn is_idle_again(services: &Services, pool: &PoolView, id: &str) -> bool {
    members(services, pool)
        .await
        .iter()
        .any(|m| m.id == id && m.pool_lease == Some(PoolLease::Idle))
}

#[tokio::test]
async fn a_release_racing_the_lease_timeout_leaves_one_outcome_and_the_pool_refills() {
    let (_dir, services, _, _, org_id, pool) = full_pool(1).await;
    let leased = lease(&services, &org_id, &pool).await;

    let (released, timed_out) = tokio::join!(
        services.pools.release(&org_id, &pool.record.id, &leased.id, true),
        services.sessions.end(&leased, "inactivity timeout"),
    );
    // Whichever came second finds the browser ended or being released: a 4xx, never 5xx.
    if let Err(error) = &released {
        assert!(
            matches!(
                error,
                ServiceError::NotFound(_) | ServiceError::Conflict(_) | ServiceError::Invalid(_)
            ),
            "{error:?}"
        );
    }
    assert!(timed_out.is_ok(), "{timed_out:?}");
    let ended = stored_session(services.store.as_ref(), &org_id, &leased.id).await;
    assert_eq!(ended.status, SessionStatus::Ended, "the timeout ended it");
    let refilled = async || {
        let members = members(&services, &pool).await;
        members.len() == 1
            && members[0].id != leased.id
            && members[0].pool_lease == Some(PoolLease::Idle)
            && members[0].status == SessionStatus::Running
    };
    eventually("a fresh idle browser replaced it", refilled).await;
}

#[tokio::test]
async fn a_flush_racing_acquires_never_ends_a_leased_browser() {
    let (_dir, services, runtime, _, org_id, pool) = full_pool(3).await;
    let (flushed, first, second) = tokio::join!(
        services.pools.flush(&org_id, &pool.record.id),
        services.pools.acquire(&org_id, &pool.record.id, Some(Duration::ZERO)),
        services.pools.acquire(&org_id, &pool.record.id, Some(Duration::ZERO)),
    );
    flushed.expect("flush");
    for (_, leased) in [first.expect("acquire"), second.expect("acquire")] {
        let Some(leased) = leased else { continue };
        let now = stored_session(services.store.as_ref(), &org_id, &leased.id).await;
        assert_eq!(now.status, SessionStatus::Running, "a leased browser was ended");
        assert_eq!(now.pool_lease, Some(PoolLease::Leased));
        assert!(!runtime.was_destroyed(&leased.id));
    }
    let no_old_idle = async || {
        members(&services, &pool).await.iter().all(|member| {
            member.pool_lease != Some(PoolLease::Idle) || !runtime.was_destroyed(&member.id)
        })
    };
    eventually("no flushed browser counts as idle", no_old_idle).await;
}

#[tokio::test]
async fn a_release_for_reuse_resets_the_browser_and_makes_it_idle_again() {
    let (_dir, services, _, agent, org_id, pool) = full_pool(1).await;
    let leased = lease(&services, &org_id, &pool).await;
    services.pools.release(&org_id, &pool.record.id, &leased.id, true).await.expect("released");
    let idle_again = async || is_idle_again(&services, &pool, &leased.id).await;
    eventually("the same browser is idle again", idle_again).await;
    assert_eq!(agent.resets.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_restart_resumes_the_resets_a_previous_process_left() {
    let (dir, services, _, agent, org_id, pool) = full_pool(1).await;
    let leased = lease(&services, &org_id, &pool).await;
    // The previous process marked it resetting and was cut off before resetting it.
    assert!(
        services
            .store
            .set_pool_lease(&leased.id, PoolLease::Leased, PoolLease::Resetting)
            .await
            .expect("store")
    );
    // ... and left (a clean stop; a killed one's membership expires instead).
    services.replica.leave().await;
    let (after, _, after_agent) =
        crate::testing::services_over(services.store.clone(), dir.path()).await;
    after.start(Duration::from_secs(3600)).await.expect("restarted");
    let idle_again = async || is_idle_again(&after, &pool, &leased.id).await;
    eventually("the reset is resumed", idle_again).await;
    // The adopted browser still names the first fake agent, which did the reset.
    assert_eq!(agent.resets.load(Ordering::SeqCst) + after_agent.resets.load(Ordering::SeqCst), 1);
}
