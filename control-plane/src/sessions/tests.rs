//! Races of the session lifecycle, over a fake runtime (no Chromium).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::*;
use crate::store::AgentLocation;
use crate::testing::{
    eventually, one_running_session, organization, running_session, services, services_over,
    stored_session,
};

#[tokio::test]
async fn an_end_racing_a_launch_ends_the_session_and_reaps_the_browser() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (services, runtime, _) = services(dir.path()).await;
    let org_id = organization(&services).await;
    let gate = runtime.hold_launches();
    let spec = services
        .sessions
        .spec(&org_id, &BrowserConfig::default(), None, Vec::new())
        .await
        .expect("valid");
    let sessions = services.sessions.clone();
    let (org, creating) = (org_id.clone(), spec.clone());
    let create = tokio::spawn(async move { sessions.create(&org, creating).await });
    eventually("the launch has begun", async || !runtime.launched.lock().expect("lock").is_empty())
        .await;
    let id = runtime.launched.lock().expect("lock")[0].clone();
    let starting = stored_session(services.store.as_ref(), &org_id, &id).await;
    assert_eq!(starting.status, SessionStatus::Starting);

    assert!(
        services.sessions.end(&starting, "deleted by the API").await.expect("end"),
        "the first end ends it"
    );
    gate.add_permits(1);
    let created = create.await.expect("create task");
    assert!(
        matches!(created, Err(ServiceError::NotFound(_))),
        "a launch overtaken by an end answers 404 (a 5xx would make SDKs retry): {created:?}"
    );
    let ended = stored_session(services.store.as_ref(), &org_id, &id).await;
    assert_eq!(ended.status, SessionStatus::Ended);
    assert_eq!(ended.end_reason.as_deref(), Some("deleted by the API"));
    assert!(runtime.was_destroyed(&id), "the launched browser is reaped");
}

#[tokio::test]
async fn concurrent_ends_end_a_session_once() {
    let (_dir, services, _, org_id, session) = one_running_session().await;
    let (first, second) = tokio::join!(
        services.sessions.end(&session, "deleted by the API"),
        services.sessions.end(&session, "inactivity timeout"),
    );
    let ended_here = [first.expect("end"), second.expect("end")];
    assert_eq!(ended_here.iter().filter(|here| **here).count(), 1, "{ended_here:?}");
    assert!(matches!(
        services.sessions.live(&org_id, &session.id).await,
        Err(ServiceError::NotFound(_))
    ));
}

#[tokio::test]
async fn a_session_whose_agent_dies_ends_within_two_seconds() {
    let (_dir, services, runtime, org_id, session) = one_running_session().await;
    let killed = Instant::now();
    runtime.kill(&session.id);
    eventually("the session has ended", async || {
        stored_session(services.store.as_ref(), &org_id, &session.id).await.status
            == SessionStatus::Ended
    })
    .await;
    assert!(killed.elapsed() < Duration::from_secs(2), "{:?}", killed.elapsed());
    let ended = stored_session(services.store.as_ref(), &org_id, &session.id).await;
    assert_eq!(ended.end_reason.as_deref(), Some("browser agent exited"));
}

#[tokio::test]
async fn a_restart_adopts_browsers_that_answer_and_ends_the_others() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (before, runtime, _) = services(dir.path()).await;
    let org_id = organization(&before).await;
    let alive = running_session(&before, &org_id).await;
    let dead = running_session(&before, &org_id).await;
    // A previous process lost this agent (nothing listens there any more) and left a
    // launch unfinished.
    let unreachable =
        AgentLocation { endpoint: "http://127.0.0.1:9".into(), ..runtime.location(&dead.id) };
    assert!(before.store.set_session_running(&dead.id, &unreachable).await.expect("store"));
    let half_started = SessionRecord {
        id: ids::new_session_id(),
        status: SessionStatus::Starting,
        agent: None,
        ..alive.clone()
    };
    before.store.insert_session(&half_started).await.expect("store");

    let (after, after_runtime, _) = services_over(before.store.clone(), dir.path()).await;
    // While the replica that serves them is alive, another leaves them alone.
    before.replica.join().await.expect("join");
    after.sessions.adopt(super::replication::Adopt::Orphans).await.expect("adoption");
    let owner = async |id: &str| stored_session(after.store.as_ref(), &org_id, id).await.owner;
    for id in [&alive.id, &dead.id, &half_started.id] {
        assert_eq!(owner(id).await.as_deref(), Some(before.replica.id()));
    }
    assert_eq!(
        stored_session(after.store.as_ref(), &org_id, &half_started.id).await.status,
        SessionStatus::Starting
    );
    // Gone (as after a restart): adopted or ended.
    before.replica.leave().await;
    after.replica.join().await.expect("join");
    after.sessions.start_background(Duration::from_secs(60)).await.expect("adopted");
    assert_eq!(owner(&alive.id).await.as_deref(), Some(after.replica.id()));

    let status = async |id: &str| stored_session(after.store.as_ref(), &org_id, id).await.status;
    assert_eq!(status(&alive.id).await, SessionStatus::Running);
    assert_eq!(status(&dead.id).await, SessionStatus::Ended);
    assert_eq!(status(&half_started.id).await, SessionStatus::Ended);
    let kept = after_runtime.kept_by_reap.lock().expect("lock").clone();
    assert_eq!(
        kept,
        Some(std::collections::HashSet::from([alive.id.clone()])),
        "strays are reaped"
    );
    assert!(after.sessions.live(&org_id, &alive.id).await.is_ok());
    assert_eq!(runtime.launches.load(Ordering::SeqCst), 2);
    assert_eq!(after_runtime.launches.load(Ordering::SeqCst), 0, "nothing relaunched");
}

#[tokio::test]
async fn concurrent_creates_never_take_an_organization_past_its_live_browser_limit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (services, _, _) = services(dir.path()).await;
    let org_id = organization(&services).await;
    let other_org = services.store.ensure_organization("other").await.expect("org").id;
    let spec = services
        .sessions
        .spec(&org_id, &BrowserConfig::default(), None, Vec::new())
        .await
        .expect("valid");
    // The test services allow 5; twice as many creates race.
    let creates: Vec<_> = (0..10)
        .map(|_| {
            let (sessions, org, spec) = (services.sessions.clone(), org_id.clone(), spec.clone());
            tokio::spawn(async move { sessions.create(&org, spec).await })
        })
        .collect();
    let (mut created, mut refused) = (0, 0);
    for create in creates {
        match create.await.expect("create task") {
            Ok(_) => created += 1,
            Err(ServiceError::LimitReached { retry_after, .. }) => {
                assert!(retry_after >= Duration::from_secs(1));
                refused += 1;
            }
            Err(other) => panic!("unexpected: {other:?}"),
        }
    }
    assert_eq!((created, refused), (5, 5));
    assert_eq!(services.store.live_browser_count(&org_id).await.expect("count"), 5);

    // Another organization has a limit of its own; an ended browser frees a place.
    let spec_b = services
        .sessions
        .spec(&other_org, &BrowserConfig::default(), None, Vec::new())
        .await
        .expect("valid");
    services.sessions.create(&other_org, spec_b).await.expect("other organization");
    let live = services
        .store
        .list_sessions(&org_id, crate::store::SessionFilter::Live, 1, 0)
        .await
        .expect("list");
    services.sessions.end(&live[0], "deleted by the API").await.expect("end");
    services.sessions.create(&org_id, spec).await.expect("a place was freed");
}

#[tokio::test]
async fn what_is_held_for_a_session_ended_elsewhere_goes_at_the_next_heartbeat() {
    let (_dir, services, _, org_id, session) = one_running_session().await;
    services.sessions.live(&org_id, &session.id).await.expect("live");
    services.sessions.agent(&session).expect("agent client");
    assert!(services.sessions.held().contains(&session.id));
    // Another replica ends it, and its signal never comes here (the database was away).
    assert!(
        services
            .store
            .end_session(&session.id, chrono::Utc::now(), "elsewhere")
            .await
            .expect("end")
    );
    services.sessions.start_background(Duration::from_millis(100)).await.expect("background");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !services.sessions.held().contains(&session.id),
        "no cached record, activity or agent client is left for it"
    );
}
