//! The coordination part of the store contract: leases, and the admission lock that
//! spans replicas (PostgreSQL only: SQLite's file serves one process).

use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::{Duration, Utc};
use control_plane::store::Store;

pub async fn lease_contract(store: &dyn Store) {
    let now = Utc::now();
    let until = now + Duration::seconds(10);
    assert!(store.hold_lease("reaper", "r1", now, until).await.unwrap());
    assert!(
        store
            .lease("reaper")
            .await
            .unwrap()
            .is_some_and(|(h, _)| h == "r1")
    );
    // Held by another, not expired: refused.
    assert!(!store.hold_lease("reaper", "r2", now, until).await.unwrap());
    // The holder renews.
    assert!(
        store
            .hold_lease("reaper", "r1", now, until + Duration::seconds(5))
            .await
            .unwrap()
    );
    // Leases are independent of each other.
    assert!(store.hold_lease("pools", "r2", now, until).await.unwrap());
    // Expired: another takes it, and the former holder cannot renew it any more.
    let later = until + Duration::seconds(6);
    assert!(
        store
            .hold_lease("reaper", "r2", later, later + Duration::seconds(10))
            .await
            .unwrap()
    );
    assert!(
        !store
            .hold_lease("reaper", "r1", later, later + Duration::seconds(10))
            .await
            .unwrap()
    );
    // Only the holder releases it.
    store.release_lease("reaper", "r1").await.unwrap();
    assert!(
        store
            .lease("reaper")
            .await
            .unwrap()
            .is_some_and(|(h, _)| h == "r2")
    );
    store.release_lease("reaper", "r2").await.unwrap();
    assert!(store.lease("reaper").await.unwrap().is_none());
    assert!(
        store
            .hold_lease("reaper", "r1", later, later + Duration::seconds(10))
            .await
            .unwrap()
    );
}

/// Two stores on one PostgreSQL database, as two replicas have.
pub async fn admission_lock_contract(first: Arc<dyn Store>, second: Arc<dyn Store>) {
    let held = first.lock_admission("org_a").await.unwrap();
    // Another organization's admissions do not wait.
    tokio::time::timeout(StdDuration::from_secs(5), second.lock_admission("org_b"))
        .await
        .expect("another organization is not locked")
        .unwrap()
        .release()
        .await;
    // The same organization's wait, also on another replica; a waiter that gives up
    // leaves nothing held behind.
    assert!(
        tokio::time::timeout(
            StdDuration::from_millis(300),
            second.lock_admission("org_a")
        )
        .await
        .is_err(),
        "a second replica got the lock while the first held it"
    );
    let waiting = tokio::spawn({
        let started = std::time::Instant::now();
        let second = second.clone();
        async move { (second.lock_admission("org_a").await, started.elapsed()) }
    });
    tokio::time::sleep(StdDuration::from_millis(300)).await;
    held.release().await;
    let (lock, waited) = tokio::time::timeout(StdDuration::from_secs(5), waiting)
        .await
        .expect("the waiter gets the lock once released")
        .unwrap();
    assert!(waited >= StdDuration::from_millis(250), "{waited:?}");
    // A holder that is dropped (its task cancelled) releases it too.
    drop(lock.unwrap());
    tokio::time::timeout(StdDuration::from_secs(5), first.lock_admission("org_a"))
        .await
        .expect("a dropped lock is released")
        .unwrap()
        .release()
        .await;
}
