//! Projects: a request confined to one sees and makes only that project's rows; counts
//! for limits and deletion.

use chrono::Utc;
use control_plane::store::{
    ExtensionRecord, ProjectRecord, SessionFilter, Store, StoreError, scope,
};

fn project(id: &str, org_id: &str, name: &str) -> ProjectRecord {
    let now = chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("time");
    ProjectRecord {
        id: id.into(),
        created_at: now,
        updated_at: now,
        ..ProjectRecord::new(org_id, name)
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
        store.insert_project(&project("proj_team2", a, "team")).await,
        Err(StoreError::Conflict(_))
    ));
    store
        .insert_project(&project("proj_b_team", b, "team"))
        .await
        .expect("names are unique per organization only");
    assert_eq!(store.project(a, "team").await.unwrap(), Some(team.clone()));
    assert_eq!(store.project(a, "proj_team").await.unwrap(), Some(team.clone()));
    assert_eq!(store.project(b, "proj_team").await.unwrap(), None);

    // Made outside a request: the default project. Inside one confined to `team`: there.
    let before = store.list_extensions(a).await.unwrap().len();
    store.insert_extension(&extension("ext_default", a)).await.unwrap();
    scope::request(async {
        scope::confine("proj_team");
        store.insert_extension(&extension("ext_team", a)).await.unwrap();
        let seen: Vec<String> =
            store.list_extensions(a).await.unwrap().into_iter().map(|e| e.id).collect();
        assert_eq!(seen, ["ext_team"]);
        assert!(store.extension(a, "ext_default").await.unwrap().is_none());
        assert!(!store.delete_extension(a, "ext_default").await.unwrap());
        // Limits are counted for the whole organization whatever the confinement.
        let all = scope::organization_wide(store.list_extensions(a)).await.unwrap();
        assert_eq!(all.len(), before + 2);
    })
    .await;
    assert_eq!(store.list_extensions(a).await.unwrap().len(), before + 2);
    scope::request(async {
        scope::confine(&default);
        let seen: Vec<String> =
            store.list_extensions(a).await.unwrap().into_iter().map(|e| e.id).collect();
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
    let held = store.project_in_use("proj_team").await.unwrap().expect("in use");
    assert!(held.contains("1 browsers") && held.contains("1 extensions"), "{held}");
    scope::request(async {
        scope::confine(&default);
        assert!(store.session(a, "s_team").await.unwrap().is_none());
        let live = store.list_sessions(a, SessionFilter::All, 100, 0).await.unwrap();
        assert!(live.iter().all(|s| s.id != "s_team"));
    })
    .await;

    // Emptied, it can be deleted (the default one never).
    store.end_session("s_team", Utc::now(), "test").await.unwrap();
    store.delete_extension(a, "ext_team").await.unwrap();
    assert_eq!(store.project_in_use("proj_team").await.unwrap(), None);
    assert!(!store.delete_project(&default, Utc::now()).await.unwrap());
    assert!(store.delete_project("proj_team", Utc::now()).await.unwrap());
    assert_eq!(store.project(a, "team").await.unwrap(), None);
    // Its name is free again.
    store.insert_project(&project("proj_team3", a, "team")).await.unwrap();
    let mut limited = store.project_by_id("proj_team3").await.unwrap().unwrap();
    limited.max_concurrent_sessions = Some(2);
    limited.status = "archived".into();
    assert!(store.update_project(&limited).await.unwrap());
    assert_eq!(store.project_by_id("proj_team3").await.unwrap(), Some(limited));
    store.delete_extension(a, "ext_default").await.unwrap();
}
