//! Extensions: an organization's library, by id and by name.

use super::*;

pub(super) fn extension(
    id: &str, org_id: &str, name: Option<&str>, age_seconds: i64,
) -> ExtensionRecord {
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

pub(super) async fn extension_contract(store: &dyn Store, a: &str, b: &str) {
    let first = extension("ext_1", a, Some("adblock"), 20);
    store.insert_extension(&first).await.expect("insert");
    store.insert_extension(&extension("ext_2", a, None, 10)).await.expect("unnamed");
    store.insert_extension(&extension("ext_3", a, None, 5)).await.expect("several unnamed");
    // Names are unique per organization, not across organizations.
    let duplicate = extension("ext_4", a, Some("adblock"), 0);
    assert!(matches!(store.insert_extension(&duplicate).await, Err(StoreError::Conflict(_))));
    store.insert_extension(&extension("ext_5", b, Some("adblock"), 0)).await.expect("other org");

    assert_eq!(store.extension(a, "ext_1").await.expect("by id"), Some(first.clone()));
    assert_eq!(store.extension(a, "adblock").await.expect("by name"), Some(first.clone()));
    assert_eq!(
        store.extension(b, "adblock").await.expect("by name").map(|e| e.id),
        Some("ext_5".into())
    );
    assert_eq!(store.extension(b, "ext_1").await.expect("foreign id"), None);
    // An id wins over a name that happens to equal it.
    store.insert_extension(&extension("ext_6", a, Some("ext_2"), 0)).await.expect("odd name");
    assert_eq!(
        store.extension(a, "ext_2").await.expect("id first").map(|e| e.id),
        Some("ext_2".into())
    );

    let listed: Vec<_> =
        store.list_extensions(a).await.expect("list").into_iter().map(|e| e.id).collect();
    assert_eq!(listed, ["ext_1", "ext_2", "ext_3", "ext_6"]);

    let used_at = chrono::DateTime::from_timestamp(1_900_000_000, 0).expect("time");
    store.mark_extensions_used(&["ext_1".into(), "ext_3".into()], used_at).await.expect("used");
    assert_eq!(
        store.extension(a, "ext_3").await.expect("get").and_then(|e| e.last_used_at),
        Some(used_at)
    );
    assert_eq!(store.extension(a, "ext_2").await.expect("get").and_then(|e| e.last_used_at), None);

    assert!(!store.delete_extension(b, "ext_1").await.expect("foreign delete"));
    assert!(store.delete_extension(a, "ext_1").await.expect("delete"));
    assert!(!store.delete_extension(a, "ext_1").await.expect("delete again"));
    assert_eq!(store.extension(a, "adblock").await.expect("gone"), None);
    // The name is free again.
    store.insert_extension(&extension("ext_7", a, Some("adblock"), 0)).await.expect("name reused");
}
