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
#[path = "store_contract/projects.rs"]
mod projects;
#[path = "store_contract/signed_in.rs"]
mod signed_in;
#[path = "store_contract/telemetry.rs"]
mod telemetry;

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
    let a = store
        .ensure_organization("org-a")
        .await
        .expect("create org a");
    let again = store
        .ensure_organization("org-a")
        .await
        .expect("find org a");
    assert_eq!(a, again);
    let b = store
        .ensure_organization("org-b")
        .await
        .expect("create org b");
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
        created_by: Some(CreatedBy {
            id: "cli".into(),
            email: String::new(),
            name: None,
        }),
        secret_tail: "wxyz".into(),
    };
    store.insert_api_key(&key).await.expect("insert key");
    assert_eq!(
        store.api_key("key1").await.expect("get key"),
        Some(key.clone())
    );
    assert_eq!(store.api_key("nope").await.expect("get key"), None);
    assert_eq!(store.api_key_count().await.expect("count"), 1);
    assert!(matches!(
        store.insert_api_key(&key).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(
        store
            .rename_api_key(&a.id, "key1", "renamed")
            .await
            .expect("rename")
    );
    assert!(
        !store
            .rename_api_key(&b.id, "key1", "theirs")
            .await
            .expect("rename foreign")
    );
    let used = created_at + chrono::TimeDelta::minutes(5);
    store.touch_api_key("key1", used).await.expect("touch");
    let rotated = ApiKeyRecord {
        id: "key2".into(),
        secret_hash: vec![9],
        ..key.clone()
    };
    let old_ends = created_at + chrono::TimeDelta::days(7);
    assert!(
        store
            .rotate_api_key("key1", old_ends, &rotated)
            .await
            .expect("rotate")
    );
    let old = store.api_key("key1").await.expect("get").expect("kept");
    assert_eq!(
        (old.name.as_str(), old.last_used_at, old.expires_at),
        ("renamed", Some(used), Some(old_ends))
    );
    assert!(
        store
            .delete_api_key(&a.id, "key1", used)
            .await
            .expect("delete")
    );
    assert!(
        !store
            .delete_api_key(&a.id, "key1", used)
            .await
            .expect("delete twice")
    );
    // A deleted key cannot be rotated, and the would-be new key is not kept.
    let third = ApiKeyRecord {
        id: "key3".into(),
        ..key.clone()
    };
    assert!(
        !store
            .rotate_api_key("key1", old_ends, &third)
            .await
            .expect("rotate deleted")
    );
    assert_eq!(store.api_key("key3").await.expect("get"), None);
    let listed: Vec<String> = store
        .api_keys(&a.id)
        .await
        .expect("list")
        .into_iter()
        .map(|k| k.id)
        .collect();
    assert_eq!(listed, ["key1", "key2"]);
    assert!(store.api_keys(&b.id).await.expect("list b").is_empty());
    let project = store
        .default_project_id(&a.id)
        .await
        .expect("default project");
    assert_eq!(
        store.default_project_id(&a.id).await.expect("again"),
        project
    );
    assert_ne!(store.default_project_id(&b.id).await.expect("b's"), project);
    assert_eq!(store.concurrency_cap(&a.id).await.expect("cap"), None);
    store
        .set_concurrency_cap(&a.id, Some(3))
        .await
        .expect("set cap");
    assert_eq!(store.concurrency_cap(&a.id).await.expect("cap"), Some(3));
    assert_eq!(store.concurrency_cap(&b.id).await.expect("b's cap"), None);
    store
        .set_concurrency_cap(&a.id, None)
        .await
        .expect("remove cap");
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
        AuditRecord {
            org_id: b.id.clone(),
            ..record("aud_4", 2_500, "POST", 200, "k9")
        },
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
    assert_eq!(
        read(AuditQuery {
            limit: 2,
            ..all.clone()
        })
        .await,
        ["aud_3", "aud_2"]
    );
    assert_eq!(
        read(AuditQuery {
            before: Some((2_000, "aud_2".into())),
            ..all.clone()
        })
        .await,
        ["aud_1"]
    );
    assert_eq!(
        read(AuditQuery {
            since_us: 1_500,
            until_us: 3_000,
            ..all.clone()
        })
        .await,
        ["aud_2"]
    );
    assert_eq!(
        read(AuditQuery {
            method: "POST".into(),
            ..all.clone()
        })
        .await,
        ["aud_3", "aud_1"]
    );
    assert_eq!(
        read(AuditQuery {
            exclude_methods: vec!["POST".into()],
            ..all.clone()
        })
        .await,
        ["aud_2"]
    );
    assert_eq!(
        read(AuditQuery {
            search: "403".into(),
            ..all.clone()
        })
        .await,
        ["aud_3"]
    );
    assert_eq!(
        read(AuditQuery {
            search: "BROWSERS/AUD_1".into(),
            ..all.clone()
        })
        .await,
        ["aud_1"]
    );
    assert_eq!(
        read(AuditQuery {
            search: "100%".into(),
            ..all.clone()
        })
        .await,
        Vec::<String>::new()
    );
    assert_eq!(
        read(AuditQuery {
            search_key_ids: vec!["k2".into()],
            ..all.clone()
        })
        .await,
        ["aud_2"]
    );
    assert_eq!(store.prune_audit(2_500).await.expect("prune"), 2);
    assert_eq!(read(all).await, ["aud_3"]);

    // Settings: the first value wins, later candidates are ignored.
    assert_eq!(
        store
            .setting_or_insert("k", "first")
            .await
            .expect("setting"),
        "first"
    );
    assert_eq!(
        store
            .setting_or_insert("k", "second")
            .await
            .expect("setting"),
        "first"
    );

    // Sessions are scoped to their organization.
    let s1 = truncate_to_micros(session("s1", &a.id, Some("keep"), 30));
    store.insert_session(&s1).await.expect("insert s1");
    assert_eq!(
        store.session(&a.id, "s1").await.expect("get"),
        Some(s1.clone())
    );
    assert_eq!(store.session(&b.id, "s1").await.expect("get"), None);

    // One live session per persistent id and organization; other organizations may reuse it.
    let duplicate = session("s2", &a.id, Some("keep"), 20);
    assert!(matches!(
        store.insert_session(&duplicate).await,
        Err(StoreError::Conflict(_))
    ));
    store
        .insert_session(&session("s3", &b.id, Some("keep"), 20))
        .await
        .expect("other org");
    assert_eq!(
        store
            .live_session_by_persistent_id(&a.id, "keep")
            .await
            .expect("by pid")
            .map(|s| s.id),
        Some("s1".into())
    );

    // Running: records where the agent is.
    assert!(
        store
            .set_session_running("s1", &location(5000))
            .await
            .expect("running")
    );
    let running = store
        .session(&a.id, "s1")
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(running.status, SessionStatus::Running);
    assert_eq!(running.agent, Some(location(5000)));

    // Listing: newest first, paged, filtered by liveness.
    store
        .insert_session(&session("s4", &a.id, None, 10))
        .await
        .expect("insert s4");
    store
        .insert_session(&session("s5", &a.id, None, 0))
        .await
        .expect("insert s5");
    let ids = |sessions: Vec<SessionRecord>| sessions.into_iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store
            .list_sessions(&a.id, SessionFilter::Live, 10, 0)
            .await
            .expect("list")),
        ["s5", "s4", "s1"]
    );
    assert_eq!(
        ids(store
            .list_sessions(&a.id, SessionFilter::Live, 2, 1)
            .await
            .expect("list")),
        ["s4", "s1"]
    );
    assert_eq!(
        ids(store
            .list_sessions(&b.id, SessionFilter::Live, 10, 0)
            .await
            .expect("list")),
        ["s3"]
    );

    // Settings and the name are kept as given and can be replaced while the session lives.
    let settings = VmSettings {
        allowed_hosts: Some(vec!["example.com".into(), "*.test.org".into()]),
        memory: Some("2GiB".into()),
        chrome_policy: serde_json::json!({"URLBlocklist": ["a.test"]})
            .as_object()
            .cloned(),
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
    let read = store
        .session(&a.id, "s1")
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(read.vm_settings, settings);
    assert_eq!(read.name.as_deref(), Some("checkout"));
    assert_eq!(read.proxy_id.as_deref(), Some("proxy-1"));
    assert!(
        store
            .set_session_viewport("s1", 1024, 768, Some(30))
            .await
            .expect("set viewport")
    );
    let read = store
        .session(&a.id, "s1")
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(
        (
            read.viewport_width,
            read.viewport_height,
            read.viewport_refresh_rate
        ),
        (1024, 768, Some(30))
    );
    assert_eq!(read.vm_settings, settings, "the viewport alone changed");
    let profile = control_plane::store::SessionProfile {
        id: "pro_1".into(),
        save_changes: true,
    };
    assert!(
        store
            .set_session_profile("s1", &profile)
            .await
            .expect("set profile")
    );
    let read = store
        .session(&a.id, "s1")
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(read.profile, Some(profile.clone()));
    assert!(
        !store
            .set_session_profile("s1", &profile)
            .await
            .expect("set profile again"),
        "a session keeps the first profile it was given"
    );

    // A live session's name addresses it in its organization only, and is unique there.
    let by_name = store.session(&a.id, "checkout").await.expect("get by name");
    assert_eq!(by_name.map(|s| s.id).as_deref(), Some("s1"));
    assert!(
        store
            .session(&b.id, "checkout")
            .await
            .expect("get")
            .is_none()
    );
    let mut same_name = session("s9", &a.id, None, 0);
    same_name.name = Some("checkout".into());
    assert!(matches!(
        store.insert_session(&same_name).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        store
            .set_session_settings("s4", Some("checkout"), None, &VmSettings::default())
            .await,
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
    assert_eq!(
        store
            .session(&a.id, "s1")
            .await
            .expect("get")
            .map(|s| s.id)
            .as_deref(),
        Some("s1")
    );

    // Ending happens once; afterwards the persistent id is free and running is refused.
    let ended_at = chrono::DateTime::from_timestamp(1_900_000_000, 0).expect("valid time");
    assert!(
        store
            .end_session("s1", ended_at, "deleted")
            .await
            .expect("end")
    );
    assert!(
        !store
            .end_session("s1", ended_at, "again")
            .await
            .expect("end again")
    );
    assert!(
        !store
            .set_session_settings("s1", None, None, &VmSettings::default())
            .await
            .expect("settings after end")
    );
    assert!(
        !store
            .set_session_viewport("s1", 800, 600, None)
            .await
            .expect("viewport after end")
    );
    // An ended session's name is free again, and no longer finds it.
    assert!(
        store
            .session(&a.id, "checkout")
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        store
            .set_session_settings("s4", Some("checkout"), None, &VmSettings::default())
            .await
            .expect("the name is free")
    );
    assert!(
        !store
            .set_session_running("s1", &location(5001))
            .await
            .expect("running after end")
    );
    let ended = store
        .session(&a.id, "s1")
        .await
        .expect("get")
        .expect("kept");
    assert_eq!(
        (ended.status, ended.ended_at, ended.end_reason.as_deref()),
        (SessionStatus::Ended, Some(ended_at), Some("deleted"))
    );
    assert_eq!(
        ids(store
            .list_sessions(&a.id, SessionFilter::Ended, 10, 0)
            .await
            .expect("list")),
        ["s1"]
    );
    assert_eq!(
        ids(store
            .list_sessions(&a.id, SessionFilter::All, 10, 0)
            .await
            .expect("list")),
        ["s5", "s4", "s1"]
    );
    assert_eq!(
        store
            .live_session_by_persistent_id(&a.id, "keep")
            .await
            .expect("by pid"),
        None
    );
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

async fn secret_contract(store: &dyn Store, a: &str, b: &str) {
    let secret = |id: &str, org: &str, kind: SecretKind, name: &str| SecretRecord {
        id: id.into(),
        org_id: org.into(),
        kind,
        name: name.into(),
        created_at: micros(Utc::now()),
        updated_at: micros(Utc::now()),
        document: format!("{{\"of\":\"{id}\"}}"),
        sealed: Some(vec![1, 2, 3]),
    };
    let first = secret("cred_1", a, SecretKind::Credential, "shop");
    store.insert_secret(&first).await.unwrap();
    // Names are unique per organization and kind only.
    assert!(matches!(
        store
            .insert_secret(&secret("cred_2", a, SecretKind::Credential, "shop"))
            .await,
        Err(StoreError::Conflict(_))
    ));
    store
        .insert_secret(&secret("cred_3", b, SecretKind::Credential, "shop"))
        .await
        .unwrap();
    store
        .insert_secret(&secret("cp_1", a, SecretKind::CredentialProvider, "shop"))
        .await
        .unwrap();
    assert_eq!(
        store
            .secret(a, SecretKind::Credential, "shop")
            .await
            .unwrap(),
        Some(first.clone())
    );
    assert_eq!(
        store
            .secret(a, SecretKind::Credential, "cred_1")
            .await
            .unwrap(),
        Some(first.clone())
    );
    assert_eq!(
        store
            .secret(b, SecretKind::Credential, "cred_1")
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .secret(a, SecretKind::CredentialProvider, "cred_1")
            .await
            .unwrap(),
        None
    );
    let listed = store.list_secrets(a, SecretKind::Credential).await.unwrap();
    assert_eq!(listed, vec![first.clone()]);
    let mut renamed = first.clone();
    renamed.name = "shop-2".into();
    renamed.document = "{}".into();
    renamed.sealed = None;
    renamed.updated_at = micros(Utc::now() + Duration::seconds(1));
    // Not over a change made since it was read.
    let stale = micros(first.updated_at - Duration::seconds(5));
    assert!(!store.update_secret(&renamed, stale).await.unwrap());
    assert!(
        store
            .update_secret(&renamed, first.updated_at)
            .await
            .unwrap()
    );
    assert_eq!(
        store
            .secret(a, SecretKind::Credential, "shop-2")
            .await
            .unwrap(),
        Some(renamed.clone())
    );
    // Another organization's record is not updated or deleted.
    let mut foreign = renamed.clone();
    foreign.org_id = b.into();
    assert!(
        !store
            .update_secret(&foreign, renamed.updated_at)
            .await
            .unwrap()
    );
    assert!(
        !store
            .delete_secret(b, SecretKind::Credential, "cred_1")
            .await
            .unwrap()
    );
    assert!(
        store
            .delete_secret(a, SecretKind::Credential, "cred_1")
            .await
            .unwrap()
    );
    assert!(
        !store
            .delete_secret(a, SecretKind::Credential, "cred_1")
            .await
            .unwrap()
    );
    assert!(
        !store
            .update_secret(&renamed, renamed.updated_at)
            .await
            .unwrap()
    );
}

fn micros(at: chrono::DateTime<Utc>) -> chrono::DateTime<Utc> {
    chrono::DateTime::from_timestamp_micros(at.timestamp_micros()).unwrap()
}

async fn profile_contract(store: &dyn Store, a: &str, b: &str) {
    let profile = |id: &str, org: &str, name: Option<&str>, age: i64| ProfileRecord {
        id: id.into(),
        org_id: org.into(),
        name: name.map(str::to_owned),
        created_at: micros(Utc::now() - Duration::seconds(age)),
        updated_at: None,
        last_used_at: None,
        size_bytes: None,
    };
    let older = profile("prof_1", a, Some("work"), 20);
    let newer = profile("prof_2", a, None, 10);
    store.insert_profile(&newer).await.unwrap();
    store.insert_profile(&older).await.unwrap();
    // Names are unique per organization, not across them.
    assert!(matches!(
        store
            .insert_profile(&profile("prof_3", a, Some("work"), 0))
            .await,
        Err(StoreError::Conflict(_))
    ));
    store
        .insert_profile(&profile("prof_4", b, Some("work"), 0))
        .await
        .unwrap();
    assert_eq!(store.profile(a, "work").await.unwrap(), Some(older.clone()));
    assert_eq!(
        store.profile(a, "prof_2").await.unwrap(),
        Some(newer.clone())
    );
    assert_eq!(store.profile(b, "prof_1").await.unwrap(), None);
    let listed: Vec<String> = store
        .list_profiles(a)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(listed, ["prof_1", "prof_2"]);

    let at = micros(Utc::now());
    assert!(store.profile_saved("prof_1", at, 1234).await.unwrap());
    store.mark_profile_used("prof_1", at).await.unwrap();
    let saved = store.profile(a, "prof_1").await.unwrap().unwrap();
    assert_eq!(
        (saved.updated_at, saved.last_used_at, saved.size_bytes),
        (Some(at), Some(at), Some(1234))
    );
    assert!(!store.delete_profile(b, "prof_1").await.unwrap());
    assert!(store.delete_profile(a, "prof_1").await.unwrap());
    assert!(!store.profile_saved("prof_1", at, 1).await.unwrap());

    // A session remembers its profile and whether it saves into it.
    let mut with_profile = session("sess_profile", a, None, 0);
    with_profile.profile = Some(SessionProfile {
        id: "prof_2".into(),
        save_changes: true,
    });
    let with_profile = truncate_to_micros(with_profile);
    store.insert_session(&with_profile).await.unwrap();
    assert_eq!(
        store.session(a, "sess_profile").await.unwrap(),
        Some(with_profile)
    );
}

async fn auth_connection_contract(store: &dyn Store, a: &str, b: &str) {
    let connection = |id: &str, org: &str, profile: &str, age: i64| AuthConnectionRecord {
        id: id.into(),
        org_id: org.into(),
        domain: "example.com".into(),
        profile_name: profile.into(),
        created_at: micros(Utc::now() - Duration::seconds(age)),
        document: r#"{"status":"NEEDS_AUTH"}"#.into(),
        credentials: None,
    };
    let first = connection("auth_1", a, "p1", 20);
    store
        .insert_auth_connection(&connection("auth_2", a, "p2", 10))
        .await
        .unwrap();
    store.insert_auth_connection(&first).await.unwrap();
    store
        .insert_auth_connection(&connection("auth_3", b, "p1", 0))
        .await
        .unwrap();
    // One connection per profile and domain in an organization.
    assert!(matches!(
        store
            .insert_auth_connection(&connection("auth_4", a, "p1", 0))
            .await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(
        store.auth_connection(a, "auth_1").await.unwrap(),
        Some(first.clone())
    );
    assert_eq!(store.auth_connection(b, "auth_1").await.unwrap(), None);
    let ids = |list: Vec<AuthConnectionRecord>| list.into_iter().map(|c| c.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.list_auth_connections(Some(a)).await.unwrap()),
        ["auth_1", "auth_2"]
    );
    assert_eq!(
        ids(store.list_auth_connections(None).await.unwrap()),
        ["auth_1", "auth_2", "auth_3"]
    );

    let updated = AuthConnectionRecord {
        document: r#"{"status":"AUTHENTICATED"}"#.into(),
        credentials: Some(vec![0, 1, 2, 255]),
        ..first
    };
    assert!(store.update_auth_connection(&updated).await.unwrap());
    assert_eq!(
        store.auth_connection(a, "auth_1").await.unwrap(),
        Some(updated.clone())
    );
    assert!(!store.delete_auth_connection(b, "auth_1").await.unwrap());
    assert!(store.delete_auth_connection(a, "auth_1").await.unwrap());
    assert!(!store.delete_auth_connection(a, "auth_1").await.unwrap());
    assert!(!store.update_auth_connection(&updated).await.unwrap());
}

async fn proxy_contract(store: &dyn Store, a: &str, b: &str) {
    let proxy = ProxyRecord {
        id: "proxy_1".into(),
        org_id: a.into(),
        name: Some("office".into()),
        kind: "custom".into(),
        protocol: "http".into(),
        bypass_hosts: vec!["intranet.test".into()],
        config: serde_json::json!({"host": "10.0.0.1", "port": 3128, "password": "pw"}),
        status: None,
        last_checked: None,
        ip_address: None,
        check_error: None,
        created_at: chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("time"),
    };
    store.insert_proxy(&proxy).await.expect("insert");
    assert_eq!(
        store.proxy(a, "proxy_1").await.expect("get"),
        Some(proxy.clone())
    );
    assert_eq!(store.proxy(b, "proxy_1").await.expect("foreign"), None);
    let check = ProxyCheck {
        status: "unavailable".into(),
        at: chrono::DateTime::from_timestamp(1_800_000_100, 0).expect("time"),
        ip_address: None,
        error: Some("refused".into()),
    };
    store
        .record_proxy_check("proxy_1", &check)
        .await
        .expect("check");
    let checked = store
        .proxy(a, "proxy_1")
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(
        (
            checked.status.as_deref(),
            checked.last_checked,
            checked.check_error.as_deref()
        ),
        (Some("unavailable"), Some(check.at), Some("refused"))
    );
    assert_eq!(store.list_proxies(a).await.expect("list").len(), 1);
    assert!(
        !store
            .delete_proxy(b, "proxy_1", check.at)
            .await
            .expect("foreign delete")
    );
    assert!(
        store
            .delete_proxy(a, "proxy_1", check.at)
            .await
            .expect("delete")
    );
    assert!(
        !store
            .delete_proxy(a, "proxy_1", check.at)
            .await
            .expect("again")
    );
    assert_eq!(store.proxy(a, "proxy_1").await.expect("deleted"), None);
    assert!(store.list_proxies(a).await.expect("list").is_empty());
}

async fn pool_contract(store: Arc<dyn Store>, a: &str, b: &str) {
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
    let same_name = PoolRecord {
        id: "pool_2".into(),
        ..pool.clone()
    };
    assert!(matches!(
        store.insert_pool(&same_name).await,
        Err(StoreError::Conflict(_))
    ));
    store
        .insert_pool(&PoolRecord {
            id: "pool_3".into(),
            org_id: b.into(),
            ..pool.clone()
        })
        .await
        .expect("same name, other organization");
    assert_eq!(
        store.pool(a, "warm").await.expect("by name"),
        Some(pool.clone())
    );
    assert_eq!(
        store.pool(a, "pool_1").await.expect("by id"),
        Some(pool.clone())
    );
    assert_eq!(store.pool(b, "pool_1").await.expect("foreign"), None);
    assert_eq!(store.list_pools(Some(a)).await.expect("list").len(), 1);
    assert_eq!(store.list_pools(None).await.expect("all").len(), 2);
    let resized = PoolRecord {
        size: 5,
        ..pool.clone()
    };
    store.update_pool(&resized).await.expect("update");
    assert_eq!(
        store.pool(a, "pool_1").await.expect("get").map(|p| p.size),
        Some(5)
    );

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
    assert_eq!(
        store.pool_members("pool_1").await.expect("members").len(),
        4
    );
    assert_eq!(
        store.live_browser_count(a).await.expect("count"),
        outside_pools
    );
    // Host admission counts pools' browsers, starting ones included.
    assert_eq!(
        store.live_vm_count().await.expect("count"),
        store.live_sessions().await.expect("live").len() as u64
    );

    // Eight concurrent leases of three running idle browsers: exactly three succeed,
    // each a different browser.
    let leases = (0..8).map(|n| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .lease_pool_browser("pool_1", &format!("lease{n}"))
                .await
        })
    });
    let mut leased: Vec<String> = futures::future::join_all(leases)
        .await
        .into_iter()
        .filter_map(|outcome| outcome.expect("task").expect("lease"))
        .map(|session| {
            assert_eq!(session.pool_lease, Some(PoolLease::Leased));
            assert!(
                session
                    .pool_lease_id
                    .is_some_and(|id| id.starts_with("lease"))
            );
            session.id
        })
        .collect();
    leased.sort();
    assert_eq!(leased, ["p0", "p1", "p2"]);

    assert!(
        store
            .set_pool_lease("p0", PoolLease::Leased, PoolLease::Resetting)
            .await
            .expect("release")
    );
    assert!(
        !store
            .set_pool_lease("p0", PoolLease::Leased, PoolLease::Resetting)
            .await
            .expect("twice")
    );
    assert_eq!(
        store
            .lease_pool_browser("pool_1", "leaseX")
            .await
            .expect("none idle"),
        None
    );
    assert!(
        store
            .set_pool_lease("p0", PoolLease::Resetting, PoolLease::Idle)
            .await
            .expect("reset")
    );
    let again = store
        .lease_pool_browser("pool_1", "second")
        .await
        .expect("lease");
    assert_eq!(
        again.map(|s| (s.id, s.pool_lease_id)),
        Some(("p0".into(), Some("second".into())))
    );
    assert_eq!(
        store
            .session(a, "p0")
            .await
            .expect("get")
            .and_then(|s| s.pool_lease_id),
        Some("second".into()),
        "the lease id is stored"
    );
    assert!(
        store
            .delete_pool("pool_1", Utc::now())
            .await
            .expect("delete")
    );
    assert!(
        !store
            .delete_pool("pool_1", Utc::now())
            .await
            .expect("again")
    );
    assert_eq!(store.pool(a, "warm").await.expect("deleted"), None);
    // The name is free again.
    store
        .insert_pool(&PoolRecord {
            id: "pool_4".into(),
            ..pool
        })
        .await
        .expect("name reused");
}

/// Standby browsers are idle members of a pool of another organization (`b` here); a claim
/// moves one to the caller's organization (`a`) in one statement.
async fn standby_claim_contract(store: Arc<dyn Store>, a: &str, b: &str) {
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
    for (id, owner, running) in [
        ("sb0", "r1", true),
        ("sb1", "r2", true),
        ("sb2", "r1", false),
    ] {
        let mut member = session(id, b, None, 100);
        member.pool_id = Some(pool.id.clone());
        member.pool_lease = Some(PoolLease::Idle);
        member.owner = Some(owner.into());
        store.insert_session(&member).await.expect("member");
        if running {
            store
                .set_session_running(id, &location(9100))
                .await
                .expect("running");
        }
    }
    let mut wanted = session("unused-id", a, Some("persist"), 0);
    wanted.name = Some("claimed".into());
    wanted.timeout_seconds = 120;
    wanted.viewport_width = 1024;
    wanted.viewport_height = 768;
    wanted
        .vm_settings
        .tags
        .insert("team".into(), "speed".into());
    let wanted = truncate_to_micros(wanted);

    // Four concurrent claims by replica r1 for its own browsers: one gets the one it
    // serves that runs; the others find none (r2's is not theirs, sb2 is not running).
    let claims = (0..4).map(|n| {
        let (store, pool_id, mut wanted) = (store.clone(), pool.id.clone(), wanted.clone());
        wanted.name = Some(format!("claimed-{n}"));
        wanted.persistent_id = Some(format!("persist-{n}"));
        tokio::spawn(async move {
            store
                .claim_standby_browser(&pool_id, "r1", false, &wanted)
                .await
        })
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
        (
            first.org_id.as_str(),
            first.pool_id.as_deref(),
            first.pool_lease
        ),
        (a, None, None)
    );
    assert_eq!(first.owner.as_deref(), Some("r1"));
    assert_eq!(first.agent, Some(location(9100)), "the VM stays");
    assert_eq!(first.status, SessionStatus::Running);
    assert_eq!(
        (
            first.timeout_seconds,
            first.viewport_width,
            first.viewport_height
        ),
        (120, 1024, 768)
    );
    assert_eq!(first.created_at, wanted.created_at);
    assert_eq!(
        first.vm_settings.tags.get("team").map(String::as_str),
        Some("speed")
    );
    assert!(store.session(a, "sb0").await.expect("get").is_some());
    assert_eq!(store.session(b, "sb0").await.expect("foreign"), None);
    assert_eq!(
        store.pool_members(&pool.id).await.expect("members").len(),
        2
    );

    // A name already live in the caller's organization: Conflict, and nothing changes.
    let taken = SessionRecord {
        name: first.name.clone(),
        persistent_id: None,
        ..wanted.clone()
    };
    assert!(matches!(
        store
            .claim_standby_browser(&pool.id, "r1", true, &taken)
            .await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(
        store.pool_members(&pool.id).await.expect("members").len(),
        2
    );
    // Any owner's: r2's browser.
    let second = store
        .claim_standby_browser(&pool.id, "r1", true, &wanted)
        .await
        .expect("claim")
        .expect("a browser");
    assert_eq!(
        (second.id.as_str(), second.owner.as_deref()),
        ("sb1", Some("r2"))
    );
    assert_eq!(
        store
            .claim_standby_browser(&pool.id, "r1", true, &wanted)
            .await
            .expect("claim"),
        None,
        "the one left is still starting"
    );
}

fn replay(id: &str, org_id: &str, session_id: &str, age_seconds: i64) -> ReplayRecord {
    ReplayRecord {
        id: id.to_owned(),
        org_id: org_id.to_owned(),
        session_id: session_id.to_owned(),
        framerate: 10,
        max_duration_seconds: 3600,
        status: ReplayStatus::Recording,
        started_at: chrono::DateTime::from_timestamp_millis(1_800_000_000_123 - age_seconds * 1000)
            .expect("time"),
        finished_at: None,
        size_bytes: None,
        blob_key: None,
        failure: None,
        record_audio: age_seconds % 2 == 0,
    }
}

async fn replay_contract(store: &dyn Store, a: &str, b: &str) {
    // Sessions s1 and s4 of org a exist from the session contract.
    let first = replay("rpl_1", a, "s1", 30);
    store.insert_replay(&first).await.expect("insert");
    store
        .insert_replay(&replay("rpl_2", a, "s1", 10))
        .await
        .expect("insert");
    store
        .insert_replay(&replay("rpl_3", a, "s4", 5))
        .await
        .expect("insert");
    assert!(matches!(
        store.insert_replay(&first).await,
        Err(StoreError::Conflict(_))
    ));

    assert_eq!(
        store.replay(a, "s1", "rpl_1").await.expect("get"),
        Some(first.clone())
    );
    // Scoped to the organization and the session.
    assert_eq!(store.replay(b, "s1", "rpl_1").await.expect("foreign"), None);
    assert_eq!(
        store.replay(a, "s4", "rpl_1").await.expect("other session"),
        None
    );
    let listed: Vec<String> = store
        .list_replays(a, "s1")
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(listed, ["rpl_1", "rpl_2"]);
    assert!(
        store
            .list_replays(b, "s1")
            .await
            .expect("foreign list")
            .is_empty()
    );

    // Exactly one caller moves a recording replay to stopping.
    assert!(store.begin_replay_stop("rpl_1").await.expect("stop"));
    assert!(!store.begin_replay_stop("rpl_1").await.expect("stop again"));
    let mut unfinished: Vec<(String, ReplayStatus)> = store
        .unfinished_replays()
        .await
        .expect("unfinished")
        .into_iter()
        .map(|r| (r.id, r.status))
        .collect();
    unfinished.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        unfinished,
        [
            ("rpl_1".to_owned(), ReplayStatus::Stopping),
            ("rpl_2".to_owned(), ReplayStatus::Recording),
            ("rpl_3".to_owned(), ReplayStatus::Recording),
        ]
    );

    let finished_at = chrono::DateTime::from_timestamp_millis(1_800_000_100_456).expect("time");
    let video = ReplayOutcome::Video {
        size_bytes: 4096,
        blob_key: "replays/a/rpl_1.mp4".into(),
    };
    assert!(
        !store
            .finish_replay("rpl_2", finished_at, &video)
            .await
            .expect("not stopping")
    );
    assert!(
        store
            .finish_replay("rpl_1", finished_at, &video)
            .await
            .expect("finish")
    );
    // Finished once: a late second finish changes nothing.
    assert!(
        !store
            .finish_replay("rpl_1", finished_at, &ReplayOutcome::Lost("late".into()))
            .await
            .expect("finish again")
    );
    let finished = store
        .replay(a, "s1", "rpl_1")
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(
        (
            finished.status,
            finished.finished_at,
            finished.size_bytes,
            finished.blob_key
        ),
        (
            ReplayStatus::Finished,
            Some(finished_at),
            Some(4096),
            Some("replays/a/rpl_1.mp4".to_owned())
        )
    );
    assert!(!store.begin_replay_stop("rpl_1").await.expect("finished"));

    assert!(store.begin_replay_stop("rpl_2").await.expect("stop"));
    assert!(
        store
            .finish_replay(
                "rpl_2",
                finished_at,
                &ReplayOutcome::Lost("agent gone".into())
            )
            .await
            .expect("lose")
    );
    let lost = store
        .replay(a, "s1", "rpl_2")
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(
        (lost.status, lost.failure, lost.blob_key),
        (ReplayStatus::Lost, Some("agent gone".to_owned()), None)
    );
    let unfinished: Vec<String> = store
        .unfinished_replays()
        .await
        .expect("unfinished")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(unfinished, ["rpl_3"]);
}

fn extension(id: &str, org_id: &str, name: Option<&str>, age_seconds: i64) -> ExtensionRecord {
    ExtensionRecord {
        id: id.to_owned(),
        org_id: org_id.to_owned(),
        name: name.map(str::to_owned),
        size_bytes: 1234,
        blob_key: format!("extensions/{id}"),
        created_at: chrono::DateTime::from_timestamp(1_800_000_000 - age_seconds, 0).expect("time"),
        last_used_at: None,
    }
}

async fn extension_contract(store: &dyn Store, a: &str, b: &str) {
    let first = extension("ext_1", a, Some("adblock"), 20);
    store.insert_extension(&first).await.expect("insert");
    store
        .insert_extension(&extension("ext_2", a, None, 10))
        .await
        .expect("unnamed");
    store
        .insert_extension(&extension("ext_3", a, None, 5))
        .await
        .expect("several unnamed");
    // Names are unique per organization, not across organizations.
    let duplicate = extension("ext_4", a, Some("adblock"), 0);
    assert!(matches!(
        store.insert_extension(&duplicate).await,
        Err(StoreError::Conflict(_))
    ));
    store
        .insert_extension(&extension("ext_5", b, Some("adblock"), 0))
        .await
        .expect("other org");

    assert_eq!(
        store.extension(a, "ext_1").await.expect("by id"),
        Some(first.clone())
    );
    assert_eq!(
        store.extension(a, "adblock").await.expect("by name"),
        Some(first.clone())
    );
    assert_eq!(
        store
            .extension(b, "adblock")
            .await
            .expect("by name")
            .map(|e| e.id),
        Some("ext_5".into())
    );
    assert_eq!(store.extension(b, "ext_1").await.expect("foreign id"), None);
    // An id wins over a name that happens to equal it.
    store
        .insert_extension(&extension("ext_6", a, Some("ext_2"), 0))
        .await
        .expect("odd name");
    assert_eq!(
        store
            .extension(a, "ext_2")
            .await
            .expect("id first")
            .map(|e| e.id),
        Some("ext_2".into())
    );

    let listed: Vec<_> = store
        .list_extensions(a)
        .await
        .expect("list")
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(listed, ["ext_1", "ext_2", "ext_3", "ext_6"]);

    let used_at = chrono::DateTime::from_timestamp(1_900_000_000, 0).expect("time");
    store
        .mark_extensions_used(&["ext_1".into(), "ext_3".into()], used_at)
        .await
        .expect("used");
    assert_eq!(
        store
            .extension(a, "ext_3")
            .await
            .expect("get")
            .and_then(|e| e.last_used_at),
        Some(used_at)
    );
    assert_eq!(
        store
            .extension(a, "ext_2")
            .await
            .expect("get")
            .and_then(|e| e.last_used_at),
        None
    );

    assert!(
        !store
            .delete_extension(b, "ext_1")
            .await
            .expect("foreign delete")
    );
    assert!(store.delete_extension(a, "ext_1").await.expect("delete"));
    assert!(
        !store
            .delete_extension(a, "ext_1")
            .await
            .expect("delete again")
    );
    assert_eq!(store.extension(a, "adblock").await.expect("gone"), None);
    // The name is free again.
    store
        .insert_extension(&extension("ext_7", a, Some("adblock"), 0))
        .await
        .expect("name reused");
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
    projects::upgrade_contract(path.to_str().expect("path"), dir.path()).await;
}

#[tokio::test]
async fn an_old_postgres_database_is_upgraded_in_place() {
    let url = std::env::var("TEST_DATABASE_URL").expect(
        "TEST_DATABASE_URL must name a PostgreSQL database the test may own (deploy/test.sh sets it)",
    );
    let schema = format!("upgrade_{}", std::process::id());
    let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect to PostgreSQL");
    tokio::spawn(connection);
    admin
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .expect("create schema");
    let scoped_url = format!(
        "{url}{}options=-csearch_path%3D{schema}",
        if url.contains('?') { "&" } else { "?" }
    );
    projects::upgrade_contract(&scoped_url, std::path::Path::new("/nonexistent")).await;
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop schema");
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
    admin
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .expect("create schema");
    let scoped_url = format!(
        "{url}{}options=-csearch_path%3D{schema}",
        if url.contains('?') { "&" } else { "?" }
    );
    let store = store::open(Some(&scoped_url), std::path::Path::new("/nonexistent"))
        .await
        .expect("open PostgreSQL");
    contract(store).await;
    let reopened = store::open(Some(&scoped_url), std::path::Path::new("/nonexistent"))
        .await
        .expect("reopen");
    assert_eq!(reopened.api_key_count().await.expect("count"), 2);
    let replica = store::open(Some(&scoped_url), std::path::Path::new("/nonexistent"))
        .await
        .expect("open a second replica's store");
    coordination::admission_lock_contract(reopened, replica).await;
    admin
        .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
        .await
        .expect("drop schema");
}
