//! Upgrades in place: a database written by an older release, with a row in every table
//! of an organization's resources it had, opened by this release (which migrates it) and read back through the store,
//! unconfined and confined to the default project that now holds what came before
//! projects. Two steps: the release before projects (V1–V17), then the previous release
//! (V18–V20: projects, people in the audit log, audit export destinations).

use control_plane::store::{
    AuditQuery, ReplayStatus, SecretKind, SessionStatus, Store, TelemetryQuery, scope,
};

const AT: &str = "'2026-01-02 03:04:05.000000+00:00'";
const LATER: &str = "'2026-01-02 03:05:05.000000+00:00'";
/// 2026-01-02 03:04:05 UTC in microseconds.
const AT_US: i64 = 1_767_323_045_000_000;

/// Migrations the release before projects applied.
const BEFORE_PROJECTS: usize = 17;
/// Migrations the previous release applied.
const PREVIOUS_RELEASE: usize = 20;

/// One row in every table of the release before projects, for one organization. `{hash}`
/// stands for a key's secret hash, written as each backend writes bytes.
fn rows_before_projects(hash: &str) -> String {
    format!(
        "
INSERT INTO organizations (id, name, created_at, default_project_max_concurrent_sessions)
    VALUES ('org_old', 'default', {AT}, 7);
INSERT INTO settings (key, value) VALUES ('old-setting', 'kept');
-- That release made an organization's default project when first asked for it (with an
-- id of its own), and let keys be bound to projects.
INSERT INTO projects (id, org_id, name, status, is_default, created_at, updated_at)
    VALUES ('proj_made_lazily', 'org_old', 'default', 'active', TRUE, {LATER}, {LATER}),
    ('proj_side', 'org_old', 'side', 'active', FALSE, {LATER}, {LATER});
INSERT INTO api_keys (id, org_id, secret_hash, created_at, name, secret_tail, project_id)
    VALUES ('key_old', 'org_old', {hash}, {AT}, 'old-key', 'wxyz', 'proj_side');
INSERT INTO browser_sessions (id, org_id, headless, stealth, kiosk_mode, timeout_seconds,
    viewport_width, viewport_height, status, created_at, ended_at, end_reason, name,
    telemetry_seq)
    VALUES ('s_old', 'org_old', TRUE, FALSE, FALSE, 60, 1280, 800, 'ended', {AT}, {LATER},
    'deleted', NULL, 1);
INSERT INTO replays (id, org_id, session_id, framerate, max_duration_seconds, status,
    started_at, finished_at, size_bytes, blob_key, failure, record_audio)
    VALUES ('rep_old', 'org_old', 's_old', 10, 60, 'finished', {AT}, {LATER}, 1234,
    'replays/rep_old.mp4', NULL, TRUE);
INSERT INTO telemetry_events (session_id, seq, org_id, ts_us, category, event_type, body)
    VALUES ('s_old', 1, 'org_old', {AT_US}, 'console', 'console_log', '{{\"text\":\"old\"}}');
INSERT INTO extensions (id, org_id, name, size_bytes, blob_key, created_at)
    VALUES ('ext_old', 'org_old', 'old-extension', 10, 'extensions/ext_old.zip', {AT});
INSERT INTO profiles (id, org_id, name, created_at)
    VALUES ('prof_old', 'org_old', 'old-profile', {AT});
INSERT INTO proxies (id, org_id, name, type, protocol, bypass_hosts, config, created_at)
    VALUES ('proxy_old', 'org_old', 'old-proxy', 'custom', 'http', '[]', '{{}}', {AT});
INSERT INTO browser_pools (id, org_id, name, size, config, created_at)
    VALUES ('pool_old', 'org_old', 'old-pool', 0, '{{\"size\": 0}}', {AT});
INSERT INTO auth_connections (id, org_id, domain, profile_name, created_at, document)
    VALUES ('conn_old', 'org_old', 'login.test', 'old-profile', {AT}, '{{\"status\":\"AUTHENTICATED\"}}');
INSERT INTO secrets (id, org_id, kind, name, created_at, updated_at, document)
    VALUES ('cred_old', 'org_old', 'credential', 'old-credential', {AT}, {AT}, '{{}}');
INSERT INTO deployments (id, org_id, status, created_at, updated_at, document)
    VALUES ('dep_old', 'org_old', 'stopped', {AT}, {AT}, '{{}}');
INSERT INTO app_versions (id, org_id, app_name, version, deployment_id, actions, created_at)
    VALUES ('ver_old', 'org_old', 'old-app', '1.0', 'dep_old', '[\"run\"]', {AT});
INSERT INTO invocations (id, org_id, deployment_id, app_name, action_name, version, status,
    started_at, finished_at, document)
    VALUES ('inv_old', 'org_old', 'dep_old', 'old-app', 'run', '1.0', 'succeeded', {AT},
    {LATER}, '{{\"output\":\"done\"}}');
INSERT INTO telemetry_destinations (id, org_id, name, endpoint, header_names, created_at,
    updated_at) VALUES ('dest_old', 'org_old', 'old-destination', 'https://collector.test',
    '[]', {AT}, {AT});
INSERT INTO audit_log (id, org_id, ts_us, method, path, route, status, duration_ms,
    client_ip, user_agent, domain, auth_strategy, api_key_id, action, resource, outcome,
    request_id)
    VALUES ('aud_old', 'org_old', {AT_US}, 'POST', '/browsers', '/browsers', 200, 5,
    '127.0.0.1', 'old-agent', '', 'api_key', 'key_old', 'browsers:create', 's_old',
    'success', 'req_old');
"
    )
}

/// What only the previous release could write: a project of its own with a limit, a
/// person named in the audit log, an audit export destination.
fn rows_of_previous_release() -> String {
    let person_at = AT_US + 1;
    format!(
        "
INSERT INTO projects (id, org_id, name, status, is_default, created_at, updated_at,
    max_concurrent_sessions) VALUES ('proj_team', 'org_old', 'team', 'active', FALSE, {AT},
    {AT}, 3);
INSERT INTO extensions (id, org_id, name, size_bytes, blob_key, created_at, project_id)
    VALUES ('ext_team', 'org_old', 'team-extension', 10, 'extensions/ext_team.zip', {AT},
    'proj_team');
INSERT INTO audit_log (id, org_id, ts_us, method, path, route, status, duration_ms,
    client_ip, user_agent, domain, auth_strategy, api_key_id, action, resource, outcome,
    request_id, user_id, email)
    VALUES ('aud_person', 'org_old', {person_at}, 'DELETE', '/browsers/s_old',
    '/browsers/{{id}}', 204, 3, '127.0.0.1', 'console', '', 'oidc', '', 'browsers:delete',
    's_old', 'success', 'req_person', 'user_1', 'ada@example.test');
INSERT INTO audit_export_destinations (id, org_id, bucket, prefix, region, role_arn,
    kms_key_id, external_id, status, created_at, updated_at, cursor_ts_us, cursor_id)
    VALUES ('aed_old', 'org_old', 'audit-bucket', 'kernel/', 'eu-west-1',
    'arn:aws:iam::123456789012:role/audit', NULL, 'ext-id-old', 'active', {AT}, {AT},
    {AT_US}, 'aud_old');
"
    )
}

/// Builds the older releases' database at `url` step by step, opens it with this release
/// and reads every row back.
pub async fn upgrade_contract(url: &str, data_dir: &std::path::Path) {
    let postgres = url.starts_with("postgres");
    let hash = if postgres { "decode('0102ff', 'hex')" } else { "X'0102ff'" };
    control_plane::store::build_old_database(url, BEFORE_PROJECTS, &rows_before_projects(hash))
        .await
        .expect("build the database of the release before projects");
    control_plane::store::build_old_database(url, PREVIOUS_RELEASE, &rows_of_previous_release())
        .await
        .expect("upgrade it to the previous release and add its rows");
    let store = control_plane::store::open(Some(url), data_dir).await.expect("upgrade");
    let organization = store.ensure_organization("default").await.unwrap();
    assert_eq!(organization.id, "org_old");
    let projects = store.list_projects("org_old").await.unwrap();
    let ids: Vec<_> = projects.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(ids, ["proj_team", "proj_made_lazily", "proj_side"], "{projects:?}");
    // The default project the old release had made is the one that takes everything.
    let default = &projects[1];
    assert!(default.is_default && default.status == "active" && default.name == "default");
    assert_eq!(
        default.max_concurrent_sessions,
        Some(7),
        "the organization's cap of the release before projects is its default project's"
    );
    assert_eq!(projects[0].max_concurrent_sessions, Some(3));
    assert!(!projects[2].is_default);
    assert_eq!(store.setting_or_insert("old-setting", "new").await.unwrap(), "kept");
    let key = store.api_key("key_old").await.unwrap().expect("api key");
    assert_eq!(
        (key.org_id.as_str(), key.name.as_str(), key.secret_hash.as_slice()),
        ("org_old", "old-key", &[1u8, 2, 255][..])
    );
    assert!(key.deleted_at.is_none() && key.policy.is_none());
    assert_eq!(key.project_id.as_deref(), Some("proj_side"));
    read_audit_log(store.as_ref()).await;
    let destination = store
        .export_destination("org_old", "aed_old")
        .await
        .unwrap()
        .expect("audit export destination");
    assert_eq!(destination.bucket, "audit-bucket");
    assert_eq!(destination.cursor, (AT_US, "aud_old".to_owned()));

    read_default_project(store.as_ref(), &default.id).await;
    scope::request(async {
        scope::confine(&default.id);
        read_default_project(store.as_ref(), &default.id).await;
        assert!(!extension_found(store.as_ref(), "team-extension").await);
    })
    .await;
    scope::request(async {
        scope::confine("proj_team");
        assert!(extension_found(store.as_ref(), "team-extension").await);
        assert!(!extension_found(store.as_ref(), "old-extension").await);
        assert!(store.session("org_old", "s_old").await.unwrap().is_none());
    })
    .await;
}

/// Whether the organization's extension `name` is found (in the request's project).
async fn extension_found(store: &dyn Store, name: &str) -> bool {
    store.extension("org_old", name).await.unwrap().is_some()
}

/// Every row the release before projects wrote, now in the default project.
async fn read_default_project(store: &dyn Store, default: &str) {
    let in_default = |project_id: Option<&str>| assert_eq!(project_id, Some(default));
    let session = store.session("org_old", "s_old").await.unwrap().expect("session");
    assert_eq!(session.status, SessionStatus::Ended);
    in_default(session.project_id.as_deref());
    let replay = store.replay("org_old", "s_old", "rep_old").await.unwrap().expect("replay");
    assert_eq!(replay.status, ReplayStatus::Finished);
    assert_eq!(replay.size_bytes, Some(1234));
    assert!(replay.record_audio);
    let events = store.telemetry_events(&TelemetryQuery::all("s_old", 10)).await.unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!((events[0].seq, events[0].ts_us), (1, AT_US));
    assert_eq!(events[0].body, r#"{"text":"old"}"#);
    // These records do not name their project: being found while confined to the
    // default project (and not while confined to another) is what shows it.
    let extension = store.extension("org_old", "old-extension").await.unwrap();
    assert_eq!(extension.expect("extension").size_bytes, 10);
    let profile = store.profile("org_old", "old-profile").await.unwrap();
    assert_eq!(profile.expect("profile").id, "prof_old");
    let proxy = store.proxy("org_old", "old-proxy").await.unwrap();
    assert_eq!(proxy.expect("proxy").id, "proxy_old");
    let pool = store.pool("org_old", "old-pool").await.unwrap();
    in_default(pool.expect("pool").project_id.as_deref());
    let connection =
        store.auth_connection("org_old", "conn_old").await.unwrap().expect("auth connection");
    assert_eq!(connection.domain, "login.test");
    let credential =
        store.secret("org_old", SecretKind::Credential, "old-credential").await.unwrap();
    assert_eq!(credential.expect("credential").id, "cred_old");
    let deployment = store.deployment("org_old", "dep_old").await.unwrap();
    in_default(deployment.expect("deployment").project_id.as_deref());
    let versions = store.list_app_versions("org_old").await.unwrap();
    assert_eq!(versions.len(), 1);
    assert_eq!(versions[0].actions, r#"["run"]"#);
    in_default(versions[0].project_id.as_deref());
    let invocation = store.invocation("org_old", "inv_old").await.unwrap().expect("invocation");
    assert_eq!(invocation.status, "succeeded");
    assert_eq!(invocation.document, r#"{"output":"done"}"#);
    in_default(invocation.project_id.as_deref());
    let destination = store.destination("org_old", "old-destination").await.unwrap();
    assert_eq!(destination.expect("telemetry destination").endpoint, "https://collector.test");
}

/// Both releases' audit records, newest first, the person's with who they were.
async fn read_audit_log(store: &dyn Store) {
    let records = store
        .audit_records(&AuditQuery {
            org_id: "org_old".into(),
            until_us: i64::MAX,
            limit: 10,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    let read: Vec<_> =
        records.iter().map(|r| (r.id.as_str(), r.action.as_str(), r.email.as_str())).collect();
    assert_eq!(
        read,
        [("aud_person", "browsers:delete", "ada@example.test"), ("aud_old", "browsers:create", ""),]
    );
}
