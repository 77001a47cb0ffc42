#![allow(clippy::expect_used, clippy::unwrap_used)]
//! One contract for `Store`, run against SQLite and a real PostgreSQL server.
//!
//! PostgreSQL comes from `TEST_DATABASE_URL` (the README's test command starts a server
//! and sets it); without it the PostgreSQL test fails rather than silently skipping.

use std::sync::Arc;

#[path = "store_contract/apps.rs"]
mod apps;
#[path = "store_contract/audit_export.rs"]
mod audit_export;
#[path = "store_contract/coordination.rs"]
mod coordination;
#[path = "store_contract/extensions.rs"]
mod extensions;
#[path = "store_contract/pools.rs"]
mod pools;
#[path = "store_contract/projects.rs"]
mod projects;
#[path = "store_contract/replays.rs"]
mod replays;
#[path = "store_contract/resources.rs"]
mod resources;
#[path = "store_contract/signed_in.rs"]
mod signed_in;
#[path = "store_contract/telemetry.rs"]
mod telemetry;
#[path = "store_contract/upgrade.rs"]
mod upgrade;
use extensions::extension_contract;
use pools::{pool_contract, standby_claim_contract};
use replays::replay_contract;
use resources::{auth_connection_contract, profile_contract, proxy_contract, secret_contract};

use chrono::{Duration, Utc};
use control_plane::access::policy::{Policy, Statement};
use control_plane::store::{
    self, AgentLocation, ApiKeyRecord, AuditQuery, AuditRecord, AuthConnectionRecord, CreatedBy,
    ExtensionRecord, PoolLease, PoolRecord, ProfileRecord, ProxyCheck, ProxyRecord, ReplayOutcome,
    ReplayRecord, ReplayStatus, SecretKind, SecretRecord, SessionFilter, SessionProfile,
    SessionRecord, SessionStatus, Store, StoreError, VmSettings,
};

fn session(id: &str, org_id: &str, persistent_id: Option<&str>, age_seconds: i64) -> SessionRecord {
    SessionRecord {
        id: id.to_owned(),
        org_id: org_id.to_owned(),
        persistent_id: persistent_id.map(str::to_owned),
        headless: false,
        stealth: true,
        kiosk_mode: false,
        timeout_seconds: 60,
        viewport_width: 1280,
        viewport_height: 800,
        viewport_refresh_rate: Some(25),
        status: SessionStatus::Starting,
        // Whole microseconds: both backends store timestamps at that precision.
        created_at: Utc::now().with_timezone(&Utc) - Duration::seconds(age_seconds),
        ended_at: None,
        end_reason: None,
        agent: None,
        proxy_id: None,
        pool_id: None,
        pool_lease: None,
        pool_lease_id: None,
        vm_settings: Default::default(),
        profile: None,
        name: None,
        owner: None,
        project_id: Some(format!("proj_of_{org_id}")),
    }
}

fn truncate_to_micros(mut record: SessionRecord) -> SessionRecord {
    let micros = record.created_at.timestamp_micros();
    record.created_at =
        chrono::DateTime::from_timestamp_micros(micros).unwrap_or(record.created_at);
    record
}

fn micros(at: chrono::DateTime<Utc>) -> chrono::DateTime<Utc> {
    chrono::DateTime::from_timestamp_micros(at.timestamp_micros()).unwrap()
}

fn location(port: u16) -> AgentLocation {
    AgentLocation {
        endpoint: format!("http://127.0.0.1:{port}"),
        secret: "s3cret".into(),
        pid: Some(4242),
        vm_root: "/data/browsers/x/root".into(),
    }
}

async fn contract(store: Arc<dyn Store>) {
    // Organizations: created once, found by name afterwards.
    let a = store.ensure_organization("org-a").await.expect("create org a");
    let again = store.ensure_organization("org-a").await.expect("find org a");
    assert_eq!(a, again);
    let b = store.ensure_organization("org-b").await.expect("create org b");
    assert_ne!(a.id, b.id);

    // API keys.
    assert_eq!(store.api_key_count().await.expect("count"), 0);
    let created_at = chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("valid time");
    let key = ApiKeyRecord {
        id: "key1".into(),
        org_id: a.id.clone(),
        secret_hash: vec![1, 2, 3, 255],
        created_at,
        name: "ci".into(),
        project_id: None,
        policy: Some(Policy {
            statements: vec![Statement {
                action: "browsers:use".into(),
                resource: "projects/*/browsers/*".into(),
            }],
        }),
        expires_at: Some(created_at + chrono::TimeDelta::days(30)),
        deleted_at: None,
        last_used_at: None,
        created_by: Some(CreatedBy { id: "cli".into(), email: String::new(), name: None }),
        secret_tail: "wxyz".into(),
    };
    store.insert_api_key(&key).await.expect("insert key");
    assert_eq!(store.api_key("key1").await.expect("get key"), Some(key.clone()));
    assert_eq!(store.api_key("nope").await.expect("get key"), None);
    assert_eq!(store.api_key_count().await.expect("count"), 1);
    assert!(matches!(store.insert_api_key(&key).await, Err(StoreError::Conflict(_))));
    assert!(store.rename_api_key(&a.id, "key1", "renamed").await.expect("rename"));
    assert!(!store.rename_api_key(&b.id, "key1", "theirs").await.expect("rename foreign"));
    let used = created_at + chrono::TimeDelta::minutes(5);
    store.touch_api_key("key1", used).await.expect("touch");
    let rotated = ApiKeyRecord { id: "key2".into(), secret_hash: vec![9], ..key.clone() };
    let old_ends = created_at + chrono::TimeDelta::days(7);
    assert!(store.rotate_api_key("key1", old_ends, &rotated).await.expect("rotate"));
    let old = store.api_key("key1").await.expect("get").expect("kept");
    assert_eq!(
        (old.name.as_str(), old.last_used_at, old.expires_at),
        ("renamed", Some(used), Some(old_ends))
    );
    assert!(store.delete_api_key(&a.id, "key1", used).await.expect("delete"));
    assert!(!store.delete_api_key(&a.id, "key1", used).await.expect("delete twice"));
    // A deleted key cannot be rotated, and the would-be new key is not kept.
    let third = ApiKeyRecord { id: "key3".into(), ..key.clone() };
    assert!(!store.rotate_api_key("key1", old_ends, &third).await.expect("rotate deleted"));
    assert_eq!(store.api_key("key3").await.expect("get"), None);
    let listed: Vec<String> =
        store.api_keys(&a.id).await.expect("list").into_iter().map(|k| k.id).collect();
    assert_eq!(listed, ["key1", "key2"]);
    assert!(store.api_keys(&b.id).await.expect("list b").is_empty());
    let project = store.default_project_id(&a.id).await.expect("default project");
    assert_eq!(store.default_project_id(&a.id).await.expect("again"), project);
    assert_ne!(store.default_project_id(&b.id).await.expect("b's"), project);
    assert_eq!(store.concurrency_cap(&a.id).await.expect("cap"), None);
    store.set_concurrency_cap(&a.id, Some(3)).await.expect("set cap");
    assert_eq!(store.concurrency_cap(&a.id).await.expect("cap"), Some(3));
    assert_eq!(store.concurrency_cap(&b.id).await.expect("b's cap"), None);
    store.set_concurrency_cap(&a.id, None).await.expect("remove cap");
    assert_eq!(store.concurrency_cap(&a.id).await.expect("cap"), None);

    // Audit records: newest first in a time range, filtered, paged by (time, id), pruned.
    let record = |id: &str, ts_us: i64, method: &str, status: i64, key: &str| AuditRecord {
        id: id.into(),
        org_id: a.id.clone(),
        ts_us,
        method: method.into(),
        path: format!("/browsers/{id}"),
        route: "/browsers/{id}".into(),
        status,
        api_key_id: key.into(),
        ..Default::default()
    };
    for audit in [
        record("aud_1", 1_000, "POST", 200, "k1"),
        record("aud_2", 2_000, "DELETE", 404, "k2"),
        record("aud_3", 3_000, "POST", 403, "k1"),
        AuditRecord { org_id: b.id.clone(), ..record("aud_4", 2_500, "POST", 200, "k9") },
    ] {
        store.insert_audit(&audit).await.expect("insert audit");
    }
    let read = |query: AuditQuery| {
        let store = store.clone();
        async move {
            store
                .audit_records(&query)
                .await
                .expect("read audit")
                .into_iter()
                .map(|r| r.id)
                .collect::<Vec<_>>()
        }
    };
    let all = AuditQuery {
        org_id: a.id.clone(),
        since_us: 0,
        until_us: 10_000,
        limit: 10,
        ..Default::default()
    };
    assert_eq!(read(all.clone()).await, ["aud_3", "aud_2", "aud_1"]);
    assert_eq!(read(AuditQuery { limit: 2, ..all.clone() }).await, ["aud_3", "aud_2"]);
    assert_eq!(
        read(AuditQuery { before: Some((2_000, "aud_2".into())), ..all.clone() }).await,
        ["aud_1"]
    );
    assert_eq!(
        read(AuditQuery { since_us: 1_500, until_us: 3_000, ..all.clone() }).await,
        ["aud_2"]
    );
    assert_eq!(read(AuditQuery { method: "POST".into(), ..all.clone() }).await, ["aud_3", "aud_1"]);
    assert_eq!(
        read(AuditQuery { exclude_methods: vec!["POST".into()], ..all.clone() }).await,
        ["aud_2"]
    );
    assert_eq!(read(AuditQuery { search: "403".into(), ..all.clone() }).await, ["aud_3"]);
    assert_eq!(
        read(AuditQuery { search: "BROWSERS/AUD_1".into(), ..all.clone() }).await,
        ["aud_1"]
    );
    assert_eq!(
        read(AuditQuery { search: "100%".into(), ..all.clone() }).await,
        Vec::<String>::new()
    );
    assert_eq!(
        read(AuditQuery { search_key_ids: vec!["k2".into()], ..all.clone() }).await,
        ["aud_2"]
    );
    assert_eq!(store.prune_audit(2_500).await.expect("prune"), 2);
    assert_eq!(read(all).await, ["aud_3"]);

    // Settings: the first value wins, later candidates are ignored.
    assert_eq!(store.setting_or_insert("k", "first").await.expect("setting"), "first");
    assert_eq!(store.setting_or_insert("k", "second").await.expect("setting"), "first");

    // Sessions are scoped to their organization.
    let s1 = truncate_to_micros(session("s1", &a.id, Some("keep"), 30));
    store.insert_session(&s1).await.expect("insert s1");
    assert_eq!(store.session(&a.id, "s1").await.expect("get"), Some(s1.clone()));
    assert_eq!(store.session(&b.id, "s1").await.expect("get"), None);

    // One live session per persistent id and organization; other organizations may reuse it.
    let duplicate = session("s2", &a.id, Some("keep"), 20);
    assert!(matches!(store.insert_session(&duplicate).await, Err(StoreError::Conflict(_))));
    store.insert_session(&session("s3", &b.id, Some("keep"), 20)).await.expect("other org");
    assert_eq!(
        store.live_session_by_persistent_id(&a.id, "keep").await.expect("by pid").map(|s| s.id),
        Some("s1".into())
    );

    // Running: records where the agent is.
    assert!(store.set_session_running("s1", &location(5000)).await.expect("running"));
    let running = store.session(&a.id, "s1").await.expect("get").expect("exists");
    assert_eq!(running.status, SessionStatus::Running);
    assert_eq!(running.agent, Some(location(5000)));

    // Listing: newest first, paged, filtered by liveness.
    store.insert_session(&session("s4", &a.id, None, 10)).await.expect("insert s4");
    store.insert_session(&session("s5", &a.id, None, 0)).await.expect("insert s5");
    let ids = |sessions: Vec<SessionRecord>| sessions.into_iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.list_sessions(&a.id, SessionFilter::Live, 10, 0).await.expect("list")),
        ["s5", "s4", "s1"]
    );
    assert_eq!(
        ids(store.list_sessions(&a.id, SessionFilter::Live, 2, 1).await.expect("list")),
        ["s4", "s1"]
    );
    assert_eq!(
        ids(store.list_sessions(&b.id, SessionFilter::Live, 10, 0).await.expect("list")),
        ["s3"]
    );

    // Settings and the name are kept as given and can be replaced while the session lives.
    let settings = VmSettings {
        allowed_hosts: Some(vec!["example.com".into(), "*.test.org".into()]),
        memory: Some("2GiB".into()),
        chrome_policy: serde_json::json!({"URLBlocklist": ["a.test"]}).as_object().cloned(),
        tags: [("team".to_owned(), "qa".to_owned())].into(),
        start_url: Some("https://example.com/".into()),
        location: Some(control_plane::store::SessionLocation {
            timezone: Some("Europe/Berlin".into()),
            locale: None,
        }),
        invocation_id: Some("inv_1".into()),
        telemetry: Some(control_plane::telemetry::TelemetrySettings {
            categories: [control_plane::telemetry::Category::Console].into(),
            excluded_cdp_methods: Vec::new(),
            destination: Some("otlpdst_x".into()),
            storage: true,
        }),
    };
    assert!(
        store
            .set_session_settings("s1", Some("checkout"), Some("proxy-1"), &settings)
            .await
            .expect("set settings")
    );
    let read = store.session(&a.id, "s1").await.expect("get").expect("exists");
    assert_eq!(read.vm_settings, settings);
    assert_eq!(read.name.as_deref(), Some("checkout"));
    assert_eq!(read.proxy_id.as_deref(), Some("proxy-1"));
    assert!(store.set_session_viewport("s1", 1024, 768, Some(30)).await.expect("set viewport"));
    let read = store.session(&a.id, "s1").await.expect("get").expect("exists");
    assert_eq!(
        (read.viewport_width, read.viewport_height, read.viewport_refresh_rate),
        (1024, 768, Some(30))
    );
    assert_eq!(read.vm_settings, settings, "the viewport alone changed");
    let profile = control_plane::store::SessionProfile { id: "pro_1".into(), save_changes: true };
    assert!(store.set_session_profile("s1", &profile).await.expect("set profile"));
    let read = store.session(&a.id, "s1").await.expect("get").expect("exists");
    assert_eq!(read.profile, Some(profile.clone()));
    assert!(
        !store.set_session_profile("s1", &profile).await.expect("set profile again"),
        "a session keeps the first profile it was given"
    );

    // A live session's name addresses it in its organization only, and is unique there.
    let by_name = store.session(&a.id, "checkout").await.expect("get by name");
    assert_eq!(by_name.map(|s| s.id).as_deref(), Some("s1"));
    assert!(store.session(&b.id, "checkout").await.expect("get").is_none());
    let mut same_name = session("s9", &a.id, None, 0);
    same_name.name = Some("checkout".into());
    assert!(matches!(store.insert_session(&same_name).await, Err(StoreError::Conflict(_))));
    assert!(matches!(
        store.set_session_settings("s4", Some("checkout"), None, &VmSettings::default()).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(
        store
            .set_session_settings("s3", Some("checkout"), None, &VmSettings::default())
            .await
            .expect("another organization may use the name")
    );
    // An id always wins over a name equal to it.
    assert!(
        store
            .set_session_settings("s4", Some("s1"), None, &VmSettings::default())
            .await
            .expect("a name equal to another id")
    );
    assert_eq!(store.session(&a.id, "s1").await.expect("get").map(|s| s.id).as_deref(), Some("s1"));

    // Ending happens once; afterwards the persistent id is free and running is refused.
    let ended_at = chrono::DateTime::from_timestamp(1_900_000_000, 0).expect("valid time");
    assert!(store.end_session("s1", ended_at, "deleted").await.expect("end"));
    assert!(!store.end_session("s1", ended_at, "again").await.expect("end again"));
    assert!(
        !store
            .set_session_settings("s1", None, None, &VmSettings::default())
            .await
            .expect("settings after end")
    );
    assert!(!store.set_session_viewport("s1", 800, 600, None).await.expect("viewport after end"));
    // An ended session's name is free again, and no longer finds it.
    assert!(store.session(&a.id, "checkout").await.expect("get").is_none());
    assert!(
        store
            .set_session_settings("s4", Some("checkout"), None, &VmSettings::default())
            .await
            .expect("the name is free")
    );
    assert!(!store.set_session_running("s1", &location(5001)).await.expect("running after end"));
    let ended = store.session(&a.id, "s1").await.expect("get").expect("kept");
    assert_eq!(
        (ended.status, ended.ended_at, ended.end_reason.as_deref()),
        (SessionStatus::Ended, Some(ended_at), Some("deleted"))
    );
    assert_eq!(
        ids(store.list_sessions(&a.id, SessionFilter::Ended, 10, 0).await.expect("list")),
        ["s1"]
    );
    assert_eq!(
        ids(store.list_sessions(&a.id, SessionFilter::All, 10, 0).await.expect("list")),
        ["s5", "s4", "s1"]
    );
    assert_eq!(store.live_session_by_persistent_id(&a.id, "keep").await.expect("by pid"), None);
    store
        .insert_session(&session("s6", &a.id, Some("keep"), 0))
        .await
        .expect("persistent id reusable");

    // Every organization's live sessions, for reconciliation.
    let mut live = ids(store.live_sessions().await.expect("live"));
    live.sort();
    assert_eq!(live, ["s3", "s4", "s5", "s6"]);
    assert_eq!(store.live_browser_count(&a.id).await.expect("count"), 3);
    assert_eq!(store.live_browser_count(&b.id).await.expect("count"), 1);
    // The deployment's VMs, every organization's, for host admission.
    assert_eq!(store.live_vm_count().await.expect("count"), 4);

    extension_contract(store.as_ref(), &a.id, &b.id).await;
    replay_contract(store.as_ref(), &a.id, &b.id).await;
    proxy_contract(store.as_ref(), &a.id, &b.id).await;
    pool_contract(store.clone(), &a.id, &b.id).await;
    standby_claim_contract(store.clone(), &a.id, &b.id).await;
    profile_contract(store.as_ref(), &a.id, &b.id).await;
    auth_connection_contract(store.as_ref(), &a.id, &b.id).await;
    secret_contract(store.as_ref(), &a.id, &b.id).await;
    apps::apps_contract(store.as_ref(), &a.id, &b.id).await;
    coordination::lease_contract(store.as_ref()).await;
    coordination::session_sharing_contract(store.as_ref(), &a.id).await;
    telemetry::telemetry_contract(store.clone(), &a.id, &b.id).await;
    projects::projects_contract(store.as_ref(), &a.id, &b.id).await;
    audit_export::audit_export_contract(store.as_ref(), &a.id, &b.id).await;
    signed_in::signed_in_contract(store.as_ref(), &a.id).await;
}

#[tokio::test]
async fn sqlite_store_meets_the_contract() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = store::open(None, dir.path()).await.expect("open SQLite");
    contract(store).await;
    // Reopening applies no migration twice and keeps the data.
    let reopened = store::open(None, dir.path()).await.expect("reopen SQLite");
    assert_eq!(reopened.api_key_count().await.expect("count"), 2);
}

#[tokio::test]
async fn an_old_sqlite_database_is_upgraded_in_place() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("control-plane.db");
    upgrade::upgrade_contract(path.to_str().expect("path"), dir.path()).await;
}

#[tokio::test]
async fn an_old_postgres_database_is_upgraded_in_place() {
    let url = std::env::var("TEST_DATABASE_URL").expect(
        "TEST_DATABASE_URL must name a PostgreSQL database the test may own (deploy/test.sh sets it)",
    );
    let schema = format!("upgrade_{}", std::process::id());
    let (admin, connection) =
        tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect to PostgreSQL");
    tokio::spawn(connection);
    admin.batch_execute(&format!("CREATE SCHEMA {schema}")).await.expect("create schema");
    let scoped_url = format!(
        "{url}{}options=-csearch_path%3D{schema}",
        if url.contains('?') { "&" } else { "?" }
    );
    upgrade::upgrade_contract(&scoped_url, std::path::Path::new("/nonexistent")).await;
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.expect("drop schema");
}

#[tokio::test]
async fn postgres_store_meets_the_contract() {
    let url = std::env::var("TEST_DATABASE_URL").expect(
        "TEST_DATABASE_URL must name a PostgreSQL database the test may own (deploy/test.sh sets it)",
    );
    // A fresh schema per run: the contract expects an empty store.
    let schema = format!("contract_{}", std::process::id());
    let admin = {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect to PostgreSQL");
        tokio::spawn(connection);
        client
    };
    admin.batch_execute(&format!("CREATE SCHEMA {schema}")).await.expect("create schema");
    let scoped_url = format!(
        "{url}{}options=-csearch_path%3D{schema}",
        if url.contains('?') { "&" } else { "?" }
    );
    let store = store::open(Some(&scoped_url), std::path::Path::new("/nonexistent"))
        .await
        .expect("open PostgreSQL");
    contract(store).await;
    let reopened =
        store::open(Some(&scoped_url), std::path::Path::new("/nonexistent")).await.expect("reopen");
    assert_eq!(reopened.api_key_count().await.expect("count"), 2);
    let replica = store::open(Some(&scoped_url), std::path::Path::new("/nonexistent"))
        .await
        .expect("open a second replica's store");
    coordination::admission_lock_contract(reopened, replica).await;
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.expect("drop schema");
}
