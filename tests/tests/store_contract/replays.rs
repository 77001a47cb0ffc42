//! Replays: from their start to their video or the reason they were lost.

use super::*;

pub(super) fn replay(id: &str, org_id: &str, session_id: &str, age_seconds: i64) -> ReplayRecord {
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

pub(super) async fn replay_contract(store: &dyn Store, a: &str, b: &str) {
    // Sessions s1 and s4 of org a exist from the session contract.
    let first = replay("rpl_1", a, "s1", 30);
    store.insert_replay(&first).await.expect("insert");
    store.insert_replay(&replay("rpl_2", a, "s1", 10)).await.expect("insert");
    store.insert_replay(&replay("rpl_3", a, "s4", 5)).await.expect("insert");
    assert!(matches!(store.insert_replay(&first).await, Err(StoreError::Conflict(_))));

    assert_eq!(store.replay(a, "s1", "rpl_1").await.expect("get"), Some(first.clone()));
    // Scoped to the organization and the session.
    assert_eq!(store.replay(b, "s1", "rpl_1").await.expect("foreign"), None);
    assert_eq!(store.replay(a, "s4", "rpl_1").await.expect("other session"), None);
    let listed: Vec<String> =
        store.list_replays(a, "s1").await.expect("list").into_iter().map(|r| r.id).collect();
    assert_eq!(listed, ["rpl_1", "rpl_2"]);
    assert!(store.list_replays(b, "s1").await.expect("foreign list").is_empty());

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
    let video = ReplayOutcome::Video { size_bytes: 4096, blob_key: "replays/a/rpl_1.mp4".into() };
    assert!(!store.finish_replay("rpl_2", finished_at, &video).await.expect("not stopping"));
    assert!(store.finish_replay("rpl_1", finished_at, &video).await.expect("finish"));
    // Finished once: a late second finish changes nothing.
    assert!(
        !store
            .finish_replay("rpl_1", finished_at, &ReplayOutcome::Lost("late".into()))
            .await
            .expect("finish again")
    );
    let finished = store.replay(a, "s1", "rpl_1").await.expect("get").expect("exists");
    assert_eq!(
        (finished.status, finished.finished_at, finished.size_bytes, finished.blob_key),
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
            .finish_replay("rpl_2", finished_at, &ReplayOutcome::Lost("agent gone".into()))
            .await
            .expect("lose")
    );
    let lost = store.replay(a, "s1", "rpl_2").await.expect("get").expect("exists");
    assert_eq!(
        (lost.status, lost.failure, lost.blob_key),
        (ReplayStatus::Lost, Some("agent gone".to_owned()), None)
    );
    let unfinished: Vec<String> =
        store.unfinished_replays().await.expect("unfinished").into_iter().map(|r| r.id).collect();
    assert_eq!(unfinished, ["rpl_3"]);
}
