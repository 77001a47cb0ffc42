//! Projects: a request confined to one sees and makes only that project's rows; counts
//! for limits and deletion; and a database of the release before projects, upgraded in
//! place with everything still reachable.

use chrono::Utc;
use control_plane::store::{
    ExtensionRecord, ProjectRecord, SessionFilter, SessionStatus, Store, StoreError, scope,
};

fn project(id: &str, org_id: &str, name: &str) -> ProjectRecord {
    let now = chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("time");
    ProjectRecord {
        id: id.into(),
        org_id: org_id.into(),
        name: name.into(),
        status: "active".into(),
        is_default: false,
        created_at: now,
        updated_at: now,
        max_concurrent_sessions: None,
        max_concurrent_invocations: None,
    }
}

fn extension(id: &str, org_id: &str) -> ExtensionRecord {
    ExtensionRecord {
        id: id.into(),
        org_id: org_id.into(),
        name: Some(id.into()),
        size_bytes: 10,
        blob_key: format!("extensions/{id}.zip"),
        created_at: Utc::now(),
        last_used_at: None,
    }
}

pub async fn projects_contract(store: &dyn Store, a: &str, b: &str) {
    // Every organization has its default project from the start.
    let projects = store.list_projects(a).await.unwrap();
    assert_eq!(projects.len(), 1);
    assert!(projects[0].is_default);
    let default = projects[0].id.clone();
    assert_eq!(store.default_project_id(a).await.unwrap(), default);

    let team = project("proj_team", a, "team");
    store.insert_project(&team).await.unwrap();
    assert!(matches!(
        store
            .insert_project(&project("proj_team2", a, "team"))
            .await,
        Err(StoreError::Conflict(_))
    ));
    store
        .insert_project(&project("proj_b_team", b, "team"))
        .await
        .expect("names are unique per organization only");
    assert_eq!(store.project(a, "team").await.unwrap(), Some(team.clone()));
    assert_eq!(
        store.project(a, "proj_team").await.unwrap(),
        Some(team.clone())
    );
    assert_eq!(store.project(b, "proj_team").await.unwrap(), None);

    // Made outside a request: the default project. Inside one confined to `team`: there.
    let before = store.list_extensions(a).await.unwrap().len();
    store
        .insert_extension(&extension("ext_default", a))
        .await
        .unwrap();
    scope::request(async {
        scope::confine("proj_team");
        store
            .insert_extension(&extension("ext_team", a))
            .await
            .unwrap();
        let seen: Vec<String> = store
            .list_extensions(a)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(seen, ["ext_team"]);
        assert!(store.extension(a, "ext_default").await.unwrap().is_none());
        assert!(!store.delete_extension(a, "ext_default").await.unwrap());
        // Limits are counted for the whole organization whatever the confinement.
        let all = scope::organization_wide(store.list_extensions(a))
            .await
            .unwrap();
        assert_eq!(all.len(), before + 2);
    })
    .await;
    assert_eq!(store.list_extensions(a).await.unwrap().len(), before + 2);
    scope::request(async {
        scope::confine(&default);
        let seen: Vec<String> = store
            .list_extensions(a)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.id)
            .collect();
        assert!(seen.contains(&"ext_default".to_owned()));
        assert!(!seen.contains(&"ext_team".to_owned()));
    })
    .await;

    // A browser made in `team` counts there; a project holding anything is in use.
    let mut browser = crate::session("s_team", a, None, 0);
    browser.project_id = None;
    scope::request(async {
        scope::confine("proj_team");
        store.insert_session(&browser).await.unwrap();
    })
    .await;
    let stored = store.session(a, "s_team").await.unwrap().expect("stored");
    assert_eq!(stored.project_id.as_deref(), Some("proj_team"));
    assert_eq!(store.project_browsers("proj_team").await.unwrap(), (1, 0));
    let held = store
        .project_in_use("proj_team")
        .await
        .unwrap()
        .expect("in use");
    assert!(
        held.contains("1 browsers") && held.contains("1 extensions"),
        "{held}"
    );
    scope::request(async {
        scope::confine(&default);
        assert!(store.session(a, "s_team").await.unwrap().is_none());
        let live = store
            .list_sessions(a, SessionFilter::All, 100, 0)
            .await
            .unwrap();
        assert!(live.iter().all(|s| s.id != "s_team"));
    })
    .await;

    // Emptied, it can be deleted (the default one never).
    store
        .end_session("s_team", Utc::now(), "test")
        .await
        .unwrap();
    store.delete_extension(a, "ext_team").await.unwrap();
    assert_eq!(store.project_in_use("proj_team").await.unwrap(), None);
    assert!(!store.delete_project(&default, Utc::now()).await.unwrap());
    assert!(store.delete_project("proj_team", Utc::now()).await.unwrap());
    assert_eq!(store.project(a, "team").await.unwrap(), None);
    // Its name is free again.
    store
        .insert_project(&project("proj_team3", a, "team"))
        .await
        .unwrap();
    let mut limited = store.project_by_id("proj_team3").await.unwrap().unwrap();
    limited.max_concurrent_sessions = Some(2);
    limited.status = "archived".into();
    assert!(store.update_project(&limited).await.unwrap());
    assert_eq!(
        store.project_by_id("proj_team3").await.unwrap(),
        Some(limited)
    );
    store.delete_extension(a, "ext_default").await.unwrap();
}

/// What the release before projects (migrations V1–V17) held for one organization, in
/// its own schema.
const OLD_RELEASE_ROWS: &str = "
INSERT INTO organizations (id, name, created_at) VALUES
    ('org_old', 'default', '2026-01-02 03:04:05.000000+00:00');
INSERT INTO browser_sessions (id, org_id, headless, stealth, kiosk_mode, timeout_seconds,
    viewport_width, viewport_height, status, created_at, ended_at, end_reason, name)
    VALUES ('s_old', 'org_old', TRUE, FALSE, FALSE, 60, 1280, 800, 'ended',
    '2026-01-02 03:04:05.000000+00:00', '2026-01-02 03:05:05.000000+00:00', 'deleted', NULL);
INSERT INTO extensions (id, org_id, name, size_bytes, blob_key, created_at)
    VALUES ('ext_old', 'org_old', 'old-extension', 10, 'extensions/ext_old.zip',
    '2026-01-02 03:04:05.000000+00:00');
INSERT INTO profiles (id, org_id, name, created_at)
    VALUES ('prof_old', 'org_old', 'old-profile', '2026-01-02 03:04:05.000000+00:00');
INSERT INTO proxies (id, org_id, name, type, protocol, bypass_hosts, config, created_at)
    VALUES ('proxy_old', 'org_old', 'old-proxy', 'custom', 'http', '[]', '{}',
    '2026-01-02 03:04:05.000000+00:00');
INSERT INTO browser_pools (id, org_id, name, size, config, created_at)
    VALUES ('pool_old', 'org_old', 'old-pool', 0, '{\"size\": 0}',
    '2026-01-02 03:04:05.000000+00:00');
INSERT INTO secrets (id, org_id, kind, name, created_at, updated_at, document)
    VALUES ('cred_old', 'org_old', 'credential', 'old-credential',
    '2026-01-02 03:04:05.000000+00:00', '2026-01-02 03:04:05.000000+00:00', '{}');
INSERT INTO deployments (id, org_id, status, created_at, updated_at, document)
    VALUES ('dep_old', 'org_old', 'stopped', '2026-01-02 03:04:05.000000+00:00',
    '2026-01-02 03:04:05.000000+00:00', '{}');
INSERT INTO telemetry_destinations (id, org_id, name, endpoint, header_names, created_at,
    updated_at) VALUES ('dest_old', 'org_old', 'old-destination', 'https://collector.test',
    '[]', '2026-01-02 03:04:05.000000+00:00', '2026-01-02 03:04:05.000000+00:00');
";

/// Migrations the release before projects applied (V1–V17).
const OLD_RELEASE_MIGRATIONS: usize = 17;

/// Builds the old release's database at `url`, opens it with this release (which
/// migrates it), and reads everything back: unconfined, and confined to the default
/// project that now holds it all.
pub async fn upgrade_contract(url: &str, data_dir: &std::path::Path) {
    control_plane::store::build_old_database(url, OLD_RELEASE_MIGRATIONS, OLD_RELEASE_ROWS)
        .await
        .expect("build the old release's database");
    let store = control_plane::store::open(Some(url), data_dir)
        .await
        .expect("upgrade");
    let organization = store.ensure_organization("default").await.unwrap();
    assert_eq!(organization.id, "org_old");
    let projects = store.list_projects("org_old").await.unwrap();
    assert_eq!(projects.len(), 1, "one default project: {projects:?}");
    assert!(projects[0].is_default && projects[0].status == "active");
    let default = projects[0].id.clone();
    let read_back = || async {
        let session = store
            .session("org_old", "s_old")
            .await
            .unwrap()
            .expect("session");
        assert_eq!(session.status, SessionStatus::Ended);
        assert_eq!(session.project_id.as_deref(), Some(default.as_str()));
        assert!(
            store
                .extension("org_old", "old-extension")
                .await
                .unwrap()
                .is_some()
        );
        assert!(
            store
                .profile("org_old", "old-profile")
                .await
                .unwrap()
                .is_some()
        );
        assert!(store.proxy("org_old", "old-proxy").await.unwrap().is_some());
        let pool = store
            .pool("org_old", "old-pool")
            .await
            .unwrap()
            .expect("pool");
        assert_eq!(pool.project_id.as_deref(), Some(default.as_str()));
        assert_eq!(
            store
                .list_secrets("org_old", control_plane::store::SecretKind::Credential)
                .await
                .unwrap()
                .len(),
            1
        );
        let deployment = store.deployment("org_old", "dep_old").await.unwrap();
        assert_eq!(
            deployment.unwrap().project_id.as_deref(),
            Some(default.as_str())
        );
        assert!(
            store
                .destination("org_old", "old-destination")
                .await
                .unwrap()
                .is_some()
        );
    };
    read_back().await;
    scope::request(async {
        scope::confine(&default);
        read_back().await;
    })
    .await;
    scope::request(async {
        scope::confine("proj_elsewhere");
        assert!(
            store
                .extension("org_old", "old-extension")
                .await
                .unwrap()
                .is_none()
        );
        assert!(store.session("org_old", "s_old").await.unwrap().is_none());
    })
    .await;
}
