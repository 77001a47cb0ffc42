//! The store's part for browser telemetry: `seq` drawn per session in commit order (also
//! under concurrent appends), gaps for skipped events, filters and both directions,
//! retention, and the organizations' OTLP destinations.

use std::sync::Arc;

use chrono::Utc;
use control_plane::store::{
    DestinationRecord, NewTelemetryEvent, Store, StoreError, TelemetryQuery,
};

fn event(category: &str, event_type: &str, ts_us: i64) -> NewTelemetryEvent {
    NewTelemetryEvent {
        ts_us,
        category: category.into(),
        event_type: event_type.into(),
        body: format!(r#"{{"type":"{event_type}"}}"#),
    }
}

async fn seqs(store: &dyn Store, query: &TelemetryQuery) -> Vec<i64> {
    store.telemetry_events(query).await.expect("read").iter().map(|row| row.seq).collect()
}

pub async fn telemetry_contract(store: Arc<dyn Store>, a: &str, b: &str) {
    store.insert_session(&super::session("tel1", a, None, 0)).await.expect("session");
    let now = Utc::now().timestamp_micros();
    let first = [
        event("console", "console_log", now - 3),
        event("network", "network_request", now - 2),
        event("console", "console_error", now - 1),
    ];
    let appended = store.append_telemetry("tel1", a, &first, 0, 1000).await.expect("append");
    assert_eq!(appended, [1, 2, 3]);
    // Two events dropped before these: a gap of two.
    let later = [event("page", "page_load", now), event("console", "console_log", now + 1)];
    assert_eq!(store.append_telemetry("tel1", a, &later, 2, 1000).await.expect("append"), [6, 7]);

    let all = TelemetryQuery::all("tel1", 100);
    assert_eq!(seqs(store.as_ref(), &all).await, [1, 2, 3, 6, 7]);
    let newest = TelemetryQuery { newest_first: true, limit: 2, ..all.clone() };
    assert_eq!(seqs(store.as_ref(), &newest).await, [7, 6]);
    let before_six = TelemetryQuery { newest_first: true, to_seq: 6, ..all.clone() };
    assert_eq!(seqs(store.as_ref(), &before_six).await, [3, 2, 1]);
    let from_three = TelemetryQuery { from_seq: 3, ..all.clone() };
    assert_eq!(seqs(store.as_ref(), &from_three).await, [3, 6, 7]);
    let console = TelemetryQuery { categories: vec!["console".into()], ..all.clone() };
    assert_eq!(seqs(store.as_ref(), &console).await, [1, 3, 7]);
    let typed = TelemetryQuery {
        categories: vec!["console".into(), "page".into()],
        types: vec!["console_log".into(), "page_load".into()],
        ..all.clone()
    };
    assert_eq!(seqs(store.as_ref(), &typed).await, [1, 6, 7]);
    let window = TelemetryQuery { since_us: now - 2, until_us: now, ..all.clone() };
    assert_eq!(seqs(store.as_ref(), &window).await, [2, 3]);
    assert!(seqs(store.as_ref(), &TelemetryQuery::all("someone-else", 100)).await.is_empty());

    // Concurrent appends: every seq once, in order.
    let appends = (0..8).map(|_| {
        let store = store.clone();
        let (a, now) = (a.to_owned(), now);
        tokio::spawn(async move {
            let batch: Vec<_> =
                (0..5).map(|i| event("console", "console_log", now + 10 + i)).collect();
            store.append_telemetry("tel1", &a, &batch, 0, 1000).await.expect("concurrent append")
        })
    });
    let mut drawn: Vec<i64> = futures::future::join_all(appends)
        .await
        .into_iter()
        .flat_map(|joined| joined.expect("task"))
        .collect();
    drawn.sort_unstable();
    assert_eq!(drawn, (8..48).collect::<Vec<_>>());

    // Keeping the newest: a session keeps at most `keep` events.
    store
        .append_telemetry("tel1", a, &[event("page", "page_load", now + 100)], 0, 10)
        .await
        .expect("append with a small keep");
    assert_eq!(seqs(store.as_ref(), &all).await, (39..=48).collect::<Vec<_>>());
    assert_eq!(store.forget_telemetry("tel1", now + 50).await.expect("forget"), 9);
    assert_eq!(seqs(store.as_ref(), &all).await, [48]);
    assert_eq!(store.forget_telemetry("someone-else", now + 500).await.expect("forget"), 0);
    assert_eq!(store.prune_telemetry(now + 500).await.expect("prune"), 1);
    assert!(seqs(store.as_ref(), &all).await.is_empty());

    destination_contract(store.as_ref(), a, b).await;
}

async fn destination_contract(store: &dyn Store, a: &str, b: &str) {
    let now = Utc::now();
    let record = DestinationRecord {
        id: "otlpdst_1".into(),
        org_id: a.into(),
        name: "collector".into(),
        description: Some("the team's".into()),
        endpoint: "https://otlp.example".into(),
        header_names: r#"["Authorization"]"#.into(),
        sealed_headers: Some(vec![1, 2, 3]),
        created_at: super::micros(now),
        updated_at: super::micros(now),
        consecutive_failures: 0,
        last_error: None,
        last_error_at: None,
        last_export_at: None,
    };
    store.insert_destination(&record).await.expect("insert");
    let taken = DestinationRecord { id: "otlpdst_2".into(), ..record.clone() };
    assert!(matches!(store.insert_destination(&taken).await, Err(StoreError::Conflict(_))));
    let elsewhere =
        DestinationRecord { id: "otlpdst_3".into(), org_id: b.into(), ..record.clone() };
    store.insert_destination(&elsewhere).await.expect("same name, other organization");
    assert_eq!(store.destination(a, "collector").await.expect("by name"), Some(record.clone()));
    assert_eq!(store.destination(a, "otlpdst_1").await.expect("by id"), Some(record.clone()));
    assert_eq!(store.destination(b, "otlpdst_1").await.expect("foreign"), None);
    assert_eq!(store.list_destinations(a).await.expect("list").len(), 1);

    let renamed = DestinationRecord {
        name: "renamed".into(),
        endpoint: "https://b.example".into(),
        ..record.clone()
    };
    assert!(store.update_destination(&renamed).await.expect("update"));
    store.record_export("otlpdst_1", now, Some("server_error")).await.expect("failure");
    store.record_export("otlpdst_1", now, Some("timeout")).await.expect("failure");
    let failing = store.destination(a, "renamed").await.expect("read").expect("there");
    assert_eq!((failing.consecutive_failures, failing.last_error.as_deref()), (2, Some("timeout")));
    assert!(failing.last_error_at.is_some() && failing.last_export_at.is_none());
    store.record_export("otlpdst_1", now, None).await.expect("success");
    let recovered = store.destination(a, "renamed").await.expect("read").expect("there");
    assert_eq!(recovered.consecutive_failures, 0);
    assert_eq!(recovered.last_error.as_deref(), Some("timeout"), "the last error is kept");
    assert!(recovered.last_export_at.is_some());

    assert!(!store.delete_destination(b, "otlpdst_1").await.expect("foreign delete"));
    assert!(store.delete_destination(a, "otlpdst_1").await.expect("delete"));
    assert_eq!(store.destination(a, "otlpdst_1").await.expect("gone"), None);
}
