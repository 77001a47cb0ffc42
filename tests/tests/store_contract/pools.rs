//! Pools: leases (never one browser twice, also concurrently) and the claim of a standby
//! browser.

use super::*;

pub(super) async fn pool_contract(store: Arc<dyn Store>, a: &str, b: &str) {
    let pool = PoolRecord {
        id: "pool_1".into(),
        org_id: a.into(),
        name: Some("warm".into()),
        size: 3,
        config: serde_json::json!({"size": 3, "headless": true}),
        created_at: chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("time"),
        project_id: Some("proj_warm".into()),
    };
    store.insert_pool(&pool).await.expect("insert");
    let same_name = PoolRecord { id: "pool_2".into(), ..pool.clone() };
    assert!(matches!(store.insert_pool(&same_name).await, Err(StoreError::Conflict(_))));
    store
        .insert_pool(&PoolRecord { id: "pool_3".into(), org_id: b.into(), ..pool.clone() })
        .await
        .expect("same name, other organization");
    assert_eq!(store.pool(a, "warm").await.expect("by name"), Some(pool.clone()));
    assert_eq!(store.pool(a, "pool_1").await.expect("by id"), Some(pool.clone()));
    assert_eq!(store.pool(b, "pool_1").await.expect("foreign"), None);
    assert_eq!(store.list_pools(Some(a)).await.expect("list").len(), 1);
    assert_eq!(store.list_pools(None).await.expect("all").len(), 2);
    let resized = PoolRecord { size: 5, ..pool.clone() };
    store.update_pool(&resized).await.expect("update");
    assert_eq!(store.pool(a, "pool_1").await.expect("get").map(|p| p.size), Some(5));

    // Members: three running idle browsers and one still starting. Pools have a limit
    // of their own: their browsers are not counted as the organization's live browsers.
    let outside_pools = store.live_browser_count(a).await.expect("count");
    for (index, status) in [
        SessionStatus::Running,
        SessionStatus::Running,
        SessionStatus::Running,
        SessionStatus::Starting,
    ]
    .into_iter()
    .enumerate()
    {
        let mut member = session(&format!("p{index}"), a, None, 10 - index as i64);
        member.pool_id = Some("pool_1".into());
        member.pool_lease = Some(PoolLease::Idle);
        store.insert_session(&member).await.expect("member");
        if status == SessionStatus::Running {
            store
                .set_session_running(&member.id, &location(9000 + index as u16))
                .await
                .expect("running");
        }
    }
    assert_eq!(store.pool_members("pool_1").await.expect("members").len(), 4);
    assert_eq!(store.live_browser_count(a).await.expect("count"), outside_pools);
    // Host admission counts pools' browsers, starting ones included.
    assert_eq!(
        store.live_vm_count().await.expect("count"),
        store.live_sessions().await.expect("live").len() as u64
    );

    // Eight concurrent leases of three running idle browsers: exactly three succeed,
    // each a different browser.
    let leases = (0..8).map(|n| {
        let store = store.clone();
        tokio::spawn(async move { store.lease_pool_browser("pool_1", &format!("lease{n}")).await })
    });
    let mut leased: Vec<String> = futures::future::join_all(leases)
        .await
        .into_iter()
        .filter_map(|outcome| outcome.expect("task").expect("lease"))
        .map(|session| {
            assert_eq!(session.pool_lease, Some(PoolLease::Leased));
            assert!(session.pool_lease_id.is_some_and(|id| id.starts_with("lease")));
            session.id
        })
        .collect();
    leased.sort();
    assert_eq!(leased, ["p0", "p1", "p2"]);

    assert!(
        store.set_pool_lease("p0", PoolLease::Leased, PoolLease::Resetting).await.expect("release")
    );
    assert!(
        !store.set_pool_lease("p0", PoolLease::Leased, PoolLease::Resetting).await.expect("twice")
    );
    assert_eq!(store.lease_pool_browser("pool_1", "leaseX").await.expect("none idle"), None);
    assert!(
        store.set_pool_lease("p0", PoolLease::Resetting, PoolLease::Idle).await.expect("reset")
    );
    let again = store.lease_pool_browser("pool_1", "second").await.expect("lease");
    assert_eq!(again.map(|s| (s.id, s.pool_lease_id)), Some(("p0".into(), Some("second".into()))));
    assert_eq!(
        store.session(a, "p0").await.expect("get").and_then(|s| s.pool_lease_id),
        Some("second".into()),
        "the lease id is stored"
    );
    assert!(store.delete_pool("pool_1", Utc::now()).await.expect("delete"));
    assert!(!store.delete_pool("pool_1", Utc::now()).await.expect("again"));
    assert_eq!(store.pool(a, "warm").await.expect("deleted"), None);
    // The name is free again.
    store.insert_pool(&PoolRecord { id: "pool_4".into(), ..pool }).await.expect("name reused");
}

/// Standby browsers are idle members of a pool of another organization (`b` here); a claim
/// moves one to the caller's organization (`a`) in one statement.
pub(super) async fn standby_claim_contract(store: Arc<dyn Store>, a: &str, b: &str) {
    let pool = PoolRecord {
        id: "standby_pool".into(),
        org_id: b.into(),
        name: Some("standby-headful".into()),
        size: 3,
        config: serde_json::json!({"size": 3}),
        created_at: Utc::now(),
        project_id: None,
    };
    store.insert_pool(&pool).await.expect("pool");
    for (id, owner, running) in [("sb0", "r1", true), ("sb1", "r2", true), ("sb2", "r1", false)] {
        let mut member = session(id, b, None, 100);
        member.pool_id = Some(pool.id.clone());
        member.pool_lease = Some(PoolLease::Idle);
        member.owner = Some(owner.into());
        store.insert_session(&member).await.expect("member");
        if running {
            store.set_session_running(id, &location(9100)).await.expect("running");
        }
    }
    let mut wanted = session("unused-id", a, Some("persist"), 0);
    wanted.name = Some("claimed".into());
    wanted.timeout_seconds = 120;
    wanted.viewport_width = 1024;
    wanted.viewport_height = 768;
    wanted.vm_settings.tags.insert("team".into(), "speed".into());
    let wanted = truncate_to_micros(wanted);

    // Four concurrent claims by replica r1 for its own browsers: one gets the one it
    // serves that runs; the others find none (r2's is not theirs, sb2 is not running).
    let claims = (0..4).map(|n| {
        let (store, pool_id, mut wanted) = (store.clone(), pool.id.clone(), wanted.clone());
        wanted.name = Some(format!("claimed-{n}"));
        wanted.persistent_id = Some(format!("persist-{n}"));
        tokio::spawn(
            async move { store.claim_standby_browser(&pool_id, "r1", false, &wanted).await },
        )
    });
    let claimed: Vec<SessionRecord> = futures::future::join_all(claims)
        .await
        .into_iter()
        .filter_map(|outcome| outcome.expect("task").expect("claim"))
        .collect();
    assert_eq!(claimed.len(), 1, "{claimed:?}");
    let first = &claimed[0];
    assert_eq!(first.id, "sb0");
    assert_eq!(
        (first.org_id.as_str(), first.pool_id.as_deref(), first.pool_lease),
        (a, None, None)
    );
    assert_eq!(first.owner.as_deref(), Some("r1"));
    assert_eq!(first.agent, Some(location(9100)), "the VM stays");
    assert_eq!(first.status, SessionStatus::Running);
    assert_eq!(
        (first.timeout_seconds, first.viewport_width, first.viewport_height),
        (120, 1024, 768)
    );
    assert_eq!(first.created_at, wanted.created_at);
    assert_eq!(first.vm_settings.tags.get("team").map(String::as_str), Some("speed"));
    assert!(store.session(a, "sb0").await.expect("get").is_some());
    assert_eq!(store.session(b, "sb0").await.expect("foreign"), None);
    assert_eq!(store.pool_members(&pool.id).await.expect("members").len(), 2);

    // A name already live in the caller's organization: Conflict, and nothing changes.
    let taken = SessionRecord { name: first.name.clone(), persistent_id: None, ..wanted.clone() };
    assert!(matches!(
        store.claim_standby_browser(&pool.id, "r1", true, &taken).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(store.pool_members(&pool.id).await.expect("members").len(), 2);
    // Any owner's: r2's browser.
    let second = store
        .claim_standby_browser(&pool.id, "r1", true, &wanted)
        .await
        .expect("claim")
        .expect("a browser");
    assert_eq!((second.id.as_str(), second.owner.as_deref()), ("sb1", Some("r2")));
    assert_eq!(
        store.claim_standby_browser(&pool.id, "r1", true, &wanted).await.expect("claim"),
        None,
        "the one left is still starting"
    );
}
