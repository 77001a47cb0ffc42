//! Secrets, profiles, auth connections and proxies: each organization's own, by id and
//! by name, renamed and deleted.

use super::*;

pub(super) async fn secret_contract(store: &dyn Store, a: &str, b: &str) {
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
        store.insert_secret(&secret("cred_2", a, SecretKind::Credential, "shop")).await,
        Err(StoreError::Conflict(_))
    ));
    store.insert_secret(&secret("cred_3", b, SecretKind::Credential, "shop")).await.unwrap();
    store.insert_secret(&secret("cp_1", a, SecretKind::CredentialProvider, "shop")).await.unwrap();
    assert_eq!(store.secret(a, SecretKind::Credential, "shop").await.unwrap(), Some(first.clone()));
    assert_eq!(
        store.secret(a, SecretKind::Credential, "cred_1").await.unwrap(),
        Some(first.clone())
    );
    assert_eq!(store.secret(b, SecretKind::Credential, "cred_1").await.unwrap(), None);
    assert_eq!(store.secret(a, SecretKind::CredentialProvider, "cred_1").await.unwrap(), None);
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
    assert!(store.update_secret(&renamed, first.updated_at).await.unwrap());
    assert_eq!(
        store.secret(a, SecretKind::Credential, "shop-2").await.unwrap(),
        Some(renamed.clone())
    );
    // Another organization's record is not updated or deleted.
    let mut foreign = renamed.clone();
    foreign.org_id = b.into();
    assert!(!store.update_secret(&foreign, renamed.updated_at).await.unwrap());
    assert!(!store.delete_secret(b, SecretKind::Credential, "cred_1").await.unwrap());
    assert!(store.delete_secret(a, SecretKind::Credential, "cred_1").await.unwrap());
    assert!(!store.delete_secret(a, SecretKind::Credential, "cred_1").await.unwrap());
    assert!(!store.update_secret(&renamed, renamed.updated_at).await.unwrap());
}

pub(super) async fn profile_contract(store: &dyn Store, a: &str, b: &str) {
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
        store.insert_profile(&profile("prof_3", a, Some("work"), 0)).await,
        Err(StoreError::Conflict(_))
    ));
    store.insert_profile(&profile("prof_4", b, Some("work"), 0)).await.unwrap();
    assert_eq!(store.profile(a, "work").await.unwrap(), Some(older.clone()));
    assert_eq!(store.profile(a, "prof_2").await.unwrap(), Some(newer.clone()));
    assert_eq!(store.profile(b, "prof_1").await.unwrap(), None);
    let listed: Vec<String> =
        store.list_profiles(a).await.unwrap().into_iter().map(|p| p.id).collect();
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
    with_profile.profile = Some(SessionProfile { id: "prof_2".into(), save_changes: true });
    let with_profile = truncate_to_micros(with_profile);
    store.insert_session(&with_profile).await.unwrap();
    assert_eq!(store.session(a, "sess_profile").await.unwrap(), Some(with_profile));
}

pub(super) async fn auth_connection_contract(store: &dyn Store, a: &str, b: &str) {
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
    store.insert_auth_connection(&connection("auth_2", a, "p2", 10)).await.unwrap();
    store.insert_auth_connection(&first).await.unwrap();
    store.insert_auth_connection(&connection("auth_3", b, "p1", 0)).await.unwrap();
    // One connection per profile and domain in an organization.
    assert!(matches!(
        store.insert_auth_connection(&connection("auth_4", a, "p1", 0)).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(store.auth_connection(a, "auth_1").await.unwrap(), Some(first.clone()));
    assert_eq!(store.auth_connection(b, "auth_1").await.unwrap(), None);
    let ids = |list: Vec<AuthConnectionRecord>| list.into_iter().map(|c| c.id).collect::<Vec<_>>();
    assert_eq!(ids(store.list_auth_connections(Some(a)).await.unwrap()), ["auth_1", "auth_2"]);
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
    assert_eq!(store.auth_connection(a, "auth_1").await.unwrap(), Some(updated.clone()));
    assert!(!store.delete_auth_connection(b, "auth_1").await.unwrap());
    assert!(store.delete_auth_connection(a, "auth_1").await.unwrap());
    assert!(!store.delete_auth_connection(a, "auth_1").await.unwrap());
    assert!(!store.update_auth_connection(&updated).await.unwrap());
}

pub(super) async fn proxy_contract(store: &dyn Store, a: &str, b: &str) {
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
    assert_eq!(store.proxy(a, "proxy_1").await.expect("get"), Some(proxy.clone()));
    assert_eq!(store.proxy(b, "proxy_1").await.expect("foreign"), None);
    let check = ProxyCheck {
        status: "unavailable".into(),
        at: chrono::DateTime::from_timestamp(1_800_000_100, 0).expect("time"),
        ip_address: None,
        error: Some("refused".into()),
    };
    store.record_proxy_check("proxy_1", &check).await.expect("check");
    let checked = store.proxy(a, "proxy_1").await.expect("get").expect("exists");
    assert_eq!(
        (checked.status.as_deref(), checked.last_checked, checked.check_error.as_deref()),
        (Some("unavailable"), Some(check.at), Some("refused"))
    );
    assert_eq!(store.list_proxies(a).await.expect("list").len(), 1);
    assert!(!store.delete_proxy(b, "proxy_1", check.at).await.expect("foreign delete"));
    assert!(store.delete_proxy(a, "proxy_1", check.at).await.expect("delete"));
    assert!(!store.delete_proxy(a, "proxy_1", check.at).await.expect("again"));
    assert_eq!(store.proxy(a, "proxy_1").await.expect("deleted"), None);
    assert!(store.list_proxies(a).await.expect("list").is_empty());
}
