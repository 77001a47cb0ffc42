//! The coordination part of the store contract: leases, and the admission lock that
//! spans replicas (PostgreSQL only: SQLite's file serves one process).

use std::sync::Arc;
use std::time::Duration as StdDuration;

use chrono::{Duration, Utc};
use control_plane::store::Store;

pub async fn lease_contract(store: &dyn Store) {
    // The database's clock (this host's, here).
    let clock = store.clock().await.unwrap();
    assert!((clock - Utc::now()).num_seconds().abs() < 5, "{clock}");
    let now = Utc::now();
    let until = now + Duration::seconds(10);
    assert!(store.hold_lease("reaper", "r1", now, until).await.unwrap());
    assert!(store.lease("reaper").await.unwrap().is_some_and(|(h, _)| h == "r1"));
    // Held by another, not expired: refused.
    assert!(!store.hold_lease("reaper", "r2", now, until).await.unwrap());
    // The holder renews.
    assert!(store.hold_lease("reaper", "r1", now, until + Duration::seconds(5)).await.unwrap());
    // Leases are independent of each other.
    assert!(store.hold_lease("pools", "r2", now, until).await.unwrap());
    // Expired: another takes it, and the former holder cannot renew it any more.
    let later = until + Duration::seconds(6);
    assert!(store.hold_lease("reaper", "r2", later, later + Duration::seconds(10)).await.unwrap());
    assert!(!store.hold_lease("reaper", "r1", later, later + Duration::seconds(10)).await.unwrap());
    // Only the holder releases it.
    store.release_lease("reaper", "r1").await.unwrap();
    assert!(store.lease("reaper").await.unwrap().is_some_and(|(h, _)| h == "r2"));
    store.release_lease("reaper", "r2").await.unwrap();
    assert!(store.lease("reaper").await.unwrap().is_none());
    assert!(store.hold_lease("reaper", "r1", later, later + Duration::seconds(10)).await.unwrap());
    // Holders by prefix, unexpired only.
    assert!(store.hold_lease("replica:r1", "r1", now, until).await.unwrap());
    assert!(store.hold_lease("replica:r2", "r2", now, now + Duration::seconds(1)).await.unwrap());
    let mut holders = store.lease_holders("replica:", now + Duration::seconds(2)).await.unwrap();
    holders.sort();
    assert_eq!(holders, vec!["r1".to_owned()]);
    // Replicas' addresses, replaced when a replica joins again.
    assert_eq!(store.replica_address("r1").await.unwrap(), None);
    store.register_replica("r1", "http://10.0.0.1:8080", now).await.unwrap();
    store.register_replica("r1", "http://10.0.0.2:8080", now).await.unwrap();
    assert_eq!(store.replica_address("r1").await.unwrap().as_deref(), Some("http://10.0.0.2:8080"));
}

/// Sessions' owners and activity, as replicas share them.
pub async fn session_sharing_contract(store: &dyn Store, org_id: &str) {
    let now = Utc::now();
    let session_id = "s_shared";
    let mut record = super::session(session_id, org_id, None, 0);
    record.owner = Some("r0".into());
    store.insert_session(&record).await.unwrap();
    let stored = store.live_sessions().await.unwrap();
    let owner = stored.into_iter().find(|s| s.id == session_id).unwrap().owner;
    assert_eq!(owner.as_deref(), Some("r0"));
    // Only from the owner it has.
    assert!(!store.claim_session(session_id, Some("nobody"), "r9").await.unwrap());
    assert!(store.claim_session(session_id, owner.as_deref(), "r1").await.unwrap());
    assert!(!store.claim_session(session_id, owner.as_deref(), "r2").await.unwrap());
    assert!(store.claim_session(session_id, Some("r1"), "r2").await.unwrap());
    let activity = |all: Vec<(String, Option<chrono::DateTime<Utc>>)>| {
        all.into_iter().find(|(id, _)| id == session_id).map(|(_, at)| at)
    };
    assert_eq!(activity(store.session_activity().await.unwrap()), Some(None));
    store.record_activity(session_id, now).await.unwrap();
    // An older report (a slower replica) does not move it back.
    store.record_activity(session_id, now - Duration::seconds(30)).await.unwrap();
    let recorded = activity(store.session_activity().await.unwrap()).flatten().unwrap();
    assert!((recorded - now).num_milliseconds().abs() < 2, "{recorded} vs {now}");
}

/// Takes the organization's admission lock, which must come within 5 s (else `free`
/// is what failed), and releases it.
async fn lock_and_release(store: &Arc<dyn Store>, org_id: &str, free: &str) {
    let lock = tokio::time::timeout(StdDuration::from_secs(5), store.lock_admission(org_id));
    lock.await.expect(free).unwrap().release().await;
}

/// Two stores on one PostgreSQL database, as two replicas have.
pub async fn admission_lock_contract(first: Arc<dyn Store>, second: Arc<dyn Store>) {
    let held = first.lock_admission("org_a").await.unwrap();
    // Another organization's admissions do not wait.
    lock_and_release(&second, "org_b", "another organization is not locked").await;
    // The same organization's wait, also on another replica; a waiter that gives up
    // leaves nothing held behind.
    assert!(
        tokio::time::timeout(StdDuration::from_millis(300), second.lock_admission("org_a"))
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
    lock_and_release(&first, "org_a", "a dropped lock is released").await;
}
