//! Audit-log export destinations: kept per organization; delivery moves the cursor only
//! from where it started (a pause or resume meanwhile wins); records after a cursor come
//! oldest first.

use chrono::Utc;
use control_plane::store::{AuditRecord, ExportDestinationRecord, Store};

pub async fn audit_export_contract(store: &dyn Store, a: &str, b: &str) {
    let now = chrono::DateTime::from_timestamp(1_800_000_000, 0).expect("time");
    let destination = ExportDestinationRecord {
        id: "aed_1".into(),
        org_id: a.into(),
        bucket: "bucket".into(),
        prefix: "logs".into(),
        region: "eu-west-1".into(),
        role_arn: "arn:aws:iam::1:role/r".into(),
        kms_key_id: None,
        external_id: "ext".into(),
        status: "active".into(),
        created_at: now,
        updated_at: now,
        cursor: (5_000, String::new()),
        consecutive_failures: 0,
        last_error: None,
        last_error_at: None,
        last_success_at: None,
        next_attempt_at: None,
    };
    store.insert_export_destination(&destination).await.unwrap();
    assert_eq!(store.export_destination(a, "aed_1").await.unwrap(), Some(destination.clone()));
    assert_eq!(store.export_destination(b, "aed_1").await.unwrap(), None);
    assert_eq!(store.export_destinations(Some(b)).await.unwrap(), vec![]);
    assert_eq!(store.export_destinations(None).await.unwrap().len(), 1);

    for (id, ts_us, org) in [
        ("aud_x1", 4_000, a),
        ("aud_x2", 6_000, a),
        ("aud_x3", 6_000, b),
        ("aud_x4", 7_000, a),
        ("aud_x5", 9_000, a),
    ] {
        let record = AuditRecord { id: id.into(), org_id: org.into(), ts_us, ..Default::default() };
        store.insert_audit(&record).await.unwrap();
    }
    let after = |cursor: (i64, String), until: i64| async move {
        store
            .audit_records_after(a, &cursor, until, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|record| record.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(after((5_000, String::new()), 8_000).await, ["aud_x2", "aud_x4"]);
    assert_eq!(after((6_000, "aud_x2".into()), 10_000).await, ["aud_x4", "aud_x5"]);

    // A failure, then a delivery: the failures are forgotten, the cursor moves.
    let at = Utc::now();
    store
        .export_failed("aed_1", "503 SlowDown", at, at + chrono::Duration::seconds(2))
        .await
        .unwrap();
    let failed = store.export_destination(a, "aed_1").await.unwrap().unwrap();
    assert_eq!(failed.consecutive_failures, 1);
    assert_eq!(failed.last_error.as_deref(), Some("503 SlowDown"));
    assert!(failed.next_attempt_at.is_some());
    store
        .export_delivered("aed_1", &destination.cursor, &(7_000, "aud_x4".into()), at)
        .await
        .unwrap();
    let delivered = store.export_destination(a, "aed_1").await.unwrap().unwrap();
    assert_eq!(delivered.cursor, (7_000, "aud_x4".into()));
    assert_eq!(delivered.consecutive_failures, 0);
    assert!(delivered.next_attempt_at.is_none() && delivered.last_success_at.is_some());

    // Paused (and resumed at a new cursor) meanwhile: a delivery that started before
    // does not move the cursor back.
    let mut resumed = delivered.clone();
    resumed.cursor = (8_500, String::new());
    assert!(store.update_export_destination(&resumed).await.unwrap());
    store
        .export_delivered("aed_1", &delivered.cursor, &(9_000, "aud_x5".into()), at)
        .await
        .unwrap();
    let kept = store.export_destination(a, "aed_1").await.unwrap().unwrap();
    assert_eq!(kept.cursor, (8_500, String::new()));

    assert!(!store.delete_export_destination(b, "aed_1").await.unwrap());
    assert!(store.delete_export_destination(a, "aed_1").await.unwrap());
    assert_eq!(store.export_destination(a, "aed_1").await.unwrap(), None);
}
