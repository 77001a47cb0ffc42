//! API keys → organizations. A key is `sk_<key id>_<secret>`; the store keeps the key id
//! and a SHA-256 of the secret (keys are random, so a fast hash is enough), and the
//! presented secret is compared in constant time.

use chrono::Utc;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::ids;
use crate::store::{ApiKeyRecord, Store, StoreError, StoreResult};

const KEY_PREFIX: &str = "sk";

/// Creates the organization if needed and a new key for it; returns the full key, which
/// is shown once and never stored.
pub async fn create_api_key(store: &dyn Store, org_name: &str) -> StoreResult<String> {
    // Internal organizations (the standby browsers') are named in parentheses.
    if org_name.trim().is_empty() || org_name.starts_with('(') {
        return Err(StoreError::Conflict(format!(
            "{org_name:?} cannot name an organization (empty, or reserved: in parentheses)"
        )));
    }
    let organization = store.ensure_organization(org_name).await?;
    let key_id = ids::random_lowercase(16);
    let secret = ids::new_secret(43);
    store
        .insert_api_key(&ApiKeyRecord {
            id: key_id.clone(),
            org_id: organization.id,
            secret_hash: hash_secret(&secret),
            created_at: Utc::now(),
        })
        .await?;
    Ok(format!("{KEY_PREFIX}_{key_id}_{secret}"))
}

fn hash_secret(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// Keys that were found valid, by key id. A key never changes once created (there is no
/// revocation yet; when there is, it must evict here), so a hit skips the store on the
/// hot path. Unknown keys are not cached: they cannot fill memory.
#[derive(Default)]
pub struct KeyCache {
    records: std::sync::Mutex<std::collections::HashMap<String, ApiKeyRecord>>,
}

const KEY_CACHE_CAPACITY: usize = 10_000;

impl KeyCache {
    fn get(&self, key_id: &str) -> Option<ApiKeyRecord> {
        self.records.lock().ok()?.get(key_id).cloned()
    }

    fn remember(&self, record: &ApiKeyRecord) {
        if let Ok(mut records) = self.records.lock()
            && records.len() < KEY_CACHE_CAPACITY
        {
            records.insert(record.id.clone(), record.clone());
        }
    }
}

/// Resolves a presented key to its organization id, or `None` if it is not valid.
pub async fn organization_for_key(
    store: &dyn Store,
    cache: &KeyCache,
    key: &str,
) -> StoreResult<Option<String>> {
    let mut parts = key.splitn(3, '_');
    let (Some(KEY_PREFIX), Some(key_id), Some(secret)) = (parts.next(), parts.next(), parts.next())
    else {
        return Ok(None);
    };
    let record = match cache.get(key_id) {
        Some(record) => record,
        None => match store.api_key(key_id).await? {
            Some(record) => {
                cache.remember(&record);
                record
            }
            None => return Ok(None),
        },
    };
    let matches: bool = hash_secret(secret).ct_eq(&record.secret_hash).into();
    Ok(matches.then_some(record.org_id))
}
