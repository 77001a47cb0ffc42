//! The apps part of the store contract: deployments, app versions, invocations.

use chrono::{Duration, Utc};
use control_plane::store::{
    AppVersionRecord, DeploymentRecord, InvocationRecord, Store, StoreError,
};

fn micros(at: chrono::DateTime<Utc>) -> chrono::DateTime<Utc> {
    super::micros(at)
}

pub async fn apps_contract(store: &dyn Store, a: &str, b: &str) {
    let deployment = |id: &str, org: &str, age: i64| DeploymentRecord {
        id: id.into(),
        org_id: org.into(),
        status: "queued".into(),
        created_at: micros(Utc::now() - Duration::seconds(age)),
        updated_at: micros(Utc::now() - Duration::seconds(age)),
        document: format!("{{\"of\":\"{id}\"}}"),
        sealed: Some(vec![9, 8, 7]),
        project_id: Some(format!("proj_of_{org}")),
    };
    store.insert_deployment(&deployment("dep_1", a, 20)).await.unwrap();
    store.insert_deployment(&deployment("dep_2", a, 10)).await.unwrap();
    store.insert_deployment(&deployment("dep_3", b, 5)).await.unwrap();
    // Scoped to the organization; oldest first.
    assert!(store.deployment(b, "dep_1").await.unwrap().is_none());
    let listed: Vec<String> =
        store.list_deployments(a).await.unwrap().into_iter().map(|d| d.id).collect();
    assert_eq!(listed, ["dep_1", "dep_2"]);
    let mut running = store.deployment(a, "dep_1").await.unwrap().unwrap();
    assert_eq!(
        (running.status.as_str(), running.sealed.as_deref()),
        ("queued", Some(&[9u8, 8, 7][..]))
    );
    running.status = "running".into();
    running.document = "{\"apps\":[]}".into();
    assert!(store.update_deployment(&running).await.unwrap());
    let read = store.deployment(a, "dep_1").await.unwrap().unwrap();
    assert_eq!((read.status.as_str(), read.document.as_str()), ("running", "{\"apps\":[]}"));
    let queued: Vec<String> = store
        .deployments_in(&["queued", "in_progress"])
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.id)
        .collect();
    assert_eq!(queued, ["dep_2", "dep_3"]);

    // One app per organization, name and version.
    let app = |id: &str, org: &str, name: &str, version: &str, deployment: &str| AppVersionRecord {
        id: id.into(),
        org_id: org.into(),
        app_name: name.into(),
        version: version.into(),
        deployment_id: deployment.into(),
        actions: "[\"hello\"]".into(),
        created_at: micros(Utc::now()),
        project_id: Some(format!("proj_of_{org}")),
    };
    store.insert_app_version(&app("app_1", a, "shop", "1", "dep_1")).await.unwrap();
    assert!(matches!(
        store.insert_app_version(&app("app_2", a, "shop", "1", "dep_2")).await,
        Err(StoreError::Conflict(_))
    ));
    store.insert_app_version(&app("app_3", a, "shop", "2", "dep_2")).await.unwrap();
    store.insert_app_version(&app("app_4", b, "shop", "1", "dep_3")).await.unwrap();
    assert_eq!(
        store.app_version(a, "shop", "1").await.unwrap().map(|v| v.id),
        Some("app_1".into())
    );
    assert_eq!(store.list_app_versions(a).await.unwrap().len(), 2);
    assert_eq!(store.delete_app_versions(a, "dep_2").await.unwrap(), 1);
    assert!(store.app_version(a, "shop", "2").await.unwrap().is_none());
    // Deleting a deployment takes its app versions along, and only its organization's.
    assert!(!store.delete_deployment(b, "dep_1").await.unwrap());
    assert!(store.delete_deployment(a, "dep_1").await.unwrap());
    assert!(store.app_version(a, "shop", "1").await.unwrap().is_none());
    assert!(store.app_version(b, "shop", "1").await.unwrap().is_some());

    // Invocations: newest first; the first end wins.
    let invocation = |id: &str, org: &str, age: i64| InvocationRecord {
        id: id.into(),
        org_id: org.into(),
        deployment_id: "dep_2".into(),
        app_name: "shop".into(),
        action_name: "hello".into(),
        version: "2".into(),
        status: "queued".into(),
        started_at: micros(Utc::now() - Duration::seconds(age)),
        finished_at: None,
        document: "{}".into(),
        project_id: Some(format!("proj_of_{org}")),
    };
    store.insert_invocation(&invocation("inv_1", a, 30)).await.unwrap();
    store.insert_invocation(&invocation("inv_2", a, 10)).await.unwrap();
    store.insert_invocation(&invocation("inv_3", b, 10)).await.unwrap();
    let listed: Vec<String> =
        store.list_invocations(a).await.unwrap().into_iter().map(|i| i.id).collect();
    assert_eq!(listed, ["inv_2", "inv_1"]);
    assert!(store.invocation(b, "inv_1").await.unwrap().is_none());
    let mut first = store.invocation(a, "inv_1").await.unwrap().unwrap();
    first.status = "running".into();
    assert!(store.update_unfinished_invocation(&first).await.unwrap());
    first.status = "succeeded".into();
    first.finished_at = Some(micros(Utc::now()));
    first.document = "{\"output\":\"1\"}".into();
    assert!(store.update_unfinished_invocation(&first).await.unwrap());
    let mut late = first.clone();
    late.status = "failed".into();
    assert!(!store.update_unfinished_invocation(&late).await.unwrap());
    assert_eq!(store.invocation(a, "inv_1").await.unwrap().unwrap(), first);
    let unfinished: Vec<String> =
        store.unfinished_invocations().await.unwrap().into_iter().map(|i| i.id).collect();
    assert_eq!(unfinished.len(), 2);
    assert!(unfinished.contains(&"inv_2".to_owned()) && unfinished.contains(&"inv_3".to_owned()));
}
