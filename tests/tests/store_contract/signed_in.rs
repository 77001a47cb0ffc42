//! Signed-in sessions: found by their secret's hash until they expire; ending one is
//! seen at once; a new session forgets the expired ones.

use control_plane::store::{SignedInRecord, Store};

pub async fn signed_in_contract(store: &dyn Store, a: &str) {
    let now = chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("time");
    let record = |hash: &str, expires_in: i64| SignedInRecord {
        secret_hash: hash.into(),
        org_id: a.into(),
        principal: r#"{"kind":"key","key_id":"k1"}"#.into(),
        created_at: now,
        expires_at: now + chrono::Duration::seconds(expires_in),
    };
    store.insert_signed_in(&record("live", 3600)).await.unwrap();
    assert_eq!(store.signed_in("live", now).await.unwrap(), Some(record("live", 3600)));
    assert_eq!(store.signed_in("other", now).await.unwrap(), None);
    // Past its expiry it is no session, and the next sign-in forgets it.
    let later = now + chrono::Duration::seconds(7200);
    assert_eq!(store.signed_in("live", later).await.unwrap(), None);
    let mut next = record("next", 3600);
    next.created_at = later;
    next.expires_at = later + chrono::Duration::seconds(3600);
    store.insert_signed_in(&next).await.unwrap();
    assert!(!store.delete_signed_in("live").await.unwrap(), "forgotten when expired");
    // Ending it is seen at once.
    assert!(store.delete_signed_in("next").await.unwrap());
    assert_eq!(store.signed_in("next", later).await.unwrap(), None);
}
