//! API keys. A key is `sk_<key id>_<secret>`; the store keeps the key id and a SHA-256 of
//! the secret (keys are random, so a fast hash is enough), and the presented secret is
//! compared in constant time. Keys are made by the command line (`api-keys create`, the
//! first key of an organization) or over the API by another key, which can never give
//! the new key more than it has itself.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, SubsecRound, TimeDelta, Utc};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::policy::Policy;
use crate::error::ServiceError;
use crate::ids;
use crate::store::{ApiKeyRecord, CreatedBy, Store, StoreError, StoreResult};

const KEY_PREFIX: &str = "sk";
const KEY_ID_LENGTH: usize = 16;
const SECRET_LENGTH: usize = 43;
/// Characters of the secret the masked key shows.
const TAIL_LENGTH: usize = 4;
/// Longest lifetime a key may be given.
pub const MAX_DAYS_TO_EXPIRE: i64 = 3650;
/// How long a rotated key keeps working unless the rotation says otherwise.
pub const DEFAULT_ROTATION_GRACE_DAYS: i64 = 7;
const MAX_NAME_CHARS: usize = 255;

/// How long a replica trusts a key it looked up before looking again: a key deleted or
/// rotated on another replica stops working there within this; on the replica that
/// deleted it, at once.
const CACHE_FOR: Duration = Duration::from_secs(2);
/// `last_used_at` is written at most this often per key (and on the first use).
const TOUCH_EVERY: Duration = Duration::from_secs(60);
const KEY_CACHE_CAPACITY: usize = 10_000;

/// Who made keys through the server's command line.
pub fn command_line_maker() -> CreatedBy {
    CreatedBy {
        id: "cli".into(),
        email: String::new(),
        name: Some("control-plane api-keys create".into()),
    }
}

/// Creates the organization if needed and an unrestricted key for it (the command
/// line's bootstrap); returns the full key, which is shown once and never stored.
pub async fn create_bootstrap_key(
    store: &dyn Store, org_name: &str, policy: Option<Policy>, project: Option<&str>,
) -> StoreResult<String> {
    // Internal organizations (the standby browsers') are named in parentheses.
    if org_name.trim().is_empty() || org_name.starts_with('(') {
        return Err(StoreError::Conflict(format!(
            "{org_name:?} cannot name an organization (empty, or reserved: in parentheses)"
        )));
    }
    if let Some(problem) = policy.as_ref().and_then(|p| p.problems().into_iter().next()) {
        return Err(StoreError::Conflict(problem));
    }
    let organization = store.ensure_organization(org_name).await?;
    let project_id = match project {
        Some(project) => Some(project_for_key(store, &organization.id, project).await?),
        None => None,
    };
    let (record, key) = new_key(NewKey {
        org_id: organization.id,
        name: "command line".into(),
        project_id,
        policy,
        expires_at: None,
        created_by: command_line_maker(),
    });
    store.insert_api_key(&record).await?;
    Ok(key)
}

/// The id of the organization's project `id_or_name`, made (by that name) if none is.
async fn project_for_key(store: &dyn Store, org_id: &str, id_or_name: &str) -> StoreResult<String> {
    if let Some(project) = store.project(org_id, id_or_name).await? {
        return Ok(project.id);
    }
    let name = id_or_name.trim();
    if name.is_empty() || name.chars().count() > 255 || name.contains(['/', '%']) {
        return Err(StoreError::Conflict(format!(
            "{id_or_name:?} cannot name a project: 1 to 255 characters, without / or %"
        )));
    }
    let project = crate::store::ProjectRecord::new(org_id, name);
    store.insert_project(&project).await?;
    Ok(project.id)
}

/// What a new key is to be.
pub struct NewKey {
    pub org_id: String,
    pub name: String,
    pub project_id: Option<String>,
    pub policy: Option<Policy>,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_by: CreatedBy,
}

/// The record to store and the full key to show once.
fn new_key(new: NewKey) -> (ApiKeyRecord, String) {
    let id = ids::random_lowercase(KEY_ID_LENGTH);
    let secret = ids::new_secret(SECRET_LENGTH);
    let record = ApiKeyRecord {
        id: id.clone(),
        org_id: new.org_id,
        secret_hash: hash_secret(&secret),
        created_at: stored_precision(Utc::now()),
        name: new.name,
        project_id: new.project_id,
        policy: new.policy,
        expires_at: new.expires_at.map(stored_precision),
        deleted_at: None,
        last_used_at: None,
        created_by: Some(new.created_by),
        secret_tail: secret[secret.len() - TAIL_LENGTH..].to_owned(),
    };
    (record, format!("{KEY_PREFIX}_{id}_{secret}"))
}

/// Times as PostgreSQL keeps them (microseconds), so that what a call answers is what
/// later calls read back.
fn stored_precision(time: DateTime<Utc>) -> DateTime<Utc> {
    time.trunc_subsecs(6)
}

/// The key as lists show it: its id and the secret's last characters.
pub fn masked(record: &ApiKeyRecord) -> String {
    format!("{KEY_PREFIX}_{}_****{}", record.id, record.secret_tail)
}

fn hash_secret(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// Why a presented key was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not a key of ours, or the wrong secret.
    Invalid,
    /// A key of ours, with the right secret, but deleted.
    Deleted(Box<ApiKeyRecord>),
    /// A key of ours, with the right secret, but past its end.
    Expired(Box<ApiKeyRecord>),
}

struct Cached {
    record: ApiKeyRecord,
    fetched: Instant,
    /// When this replica last wrote `last_used_at` for it.
    touched: Option<Instant>,
}

/// The keys service: checks presented keys (with a short-lived cache, so the hot path
/// rarely reaches the store) and makes, renames, rotates and deletes keys.
pub struct ApiKeys {
    store: Arc<dyn Store>,
    cache: Mutex<HashMap<String, Cached>>,
    default_projects: Mutex<HashMap<String, String>>,
}

impl ApiKeys {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store, cache: Mutex::default(), default_projects: Mutex::default() }
    }

    /// The live key `presented` is, or why it is refused.
    pub async fn authenticate(
        &self, presented: &str,
    ) -> Result<Result<ApiKeyRecord, Refused>, StoreError> {
        let mut parts = presented.splitn(3, '_');
        let (Some(KEY_PREFIX), Some(key_id), Some(secret)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Ok(Err(Refused::Invalid));
        };
        let Some((record, touch)) = self.lookup(key_id).await? else {
            return Ok(Err(Refused::Invalid));
        };
        let matches: bool = hash_secret(secret).ct_eq(&record.secret_hash).into();
        if !matches {
            return Ok(Err(Refused::Invalid));
        }
        if let Err(refused) = still_valid(&record) {
            return Ok(Err(refused));
        }
        if touch {
            // Not awaited by the request: a slow store must not slow every call.
            let store = self.store.clone();
            let id = record.id.clone();
            tokio::spawn(async move {
                if let Err(error) = store.touch_api_key(&id, Utc::now()).await {
                    tracing::warn!(%error, key = id, "could not record an API key's use");
                }
            });
        }
        Ok(Ok(record))
    }

    /// The key `id` if it is still valid (not deleted, not expired): for a caller that
    /// acts with a key's rights without presenting it (an invocation's action).
    pub async fn live(&self, id: &str) -> Result<Result<ApiKeyRecord, Refused>, StoreError> {
        Ok(match self.lookup(id).await? {
            Some((record, _)) => still_valid(&record).map(|()| record),
            None => Err(Refused::Invalid),
        })
    }

    /// The key by id, from the cache while fresh; and whether its use is due to be written.
    async fn lookup(&self, key_id: &str) -> StoreResult<Option<(ApiKeyRecord, bool)>> {
        if let Some(found) = self.cached(key_id) {
            return Ok(Some(found));
        }
        Ok(self.store.api_key(key_id).await?.map(|record| (record.clone(), self.remember(record))))
    }

    /// The organization's default project (made on first use); it never changes, so it
    /// is looked up once.
    pub async fn default_project(&self, org_id: &str) -> StoreResult<String> {
        if let Some(id) =
            self.default_projects.lock().ok().and_then(|projects| projects.get(org_id).cloned())
        {
            return Ok(id);
        }
        let id = self.store.default_project_id(org_id).await?;
        if let Ok(mut projects) = self.default_projects.lock() {
            projects.insert(org_id.to_owned(), id.clone());
        }
        Ok(id)
    }

    /// A fresh cached record, and whether its use should be written now.
    fn cached(&self, key_id: &str) -> Option<(ApiKeyRecord, bool)> {
        let mut cache = self.cache.lock().ok()?;
        let entry = cache.get_mut(key_id)?;
        if entry.fetched.elapsed() > CACHE_FOR {
            return None;
        }
        Some((entry.record.clone(), due_for_touch(entry)))
    }

    /// Caches a record just read; answers whether its use should be written now.
    fn remember(&self, record: ApiKeyRecord) -> bool {
        let Ok(mut cache) = self.cache.lock() else {
            return true;
        };
        let touched = cache.get(&record.id).and_then(|old| old.touched);
        if cache.len() >= KEY_CACHE_CAPACITY && !cache.contains_key(&record.id) {
            cache.retain(|_, entry| entry.fetched.elapsed() <= CACHE_FOR);
            if cache.len() >= KEY_CACHE_CAPACITY {
                return record.last_used_at.is_none();
            }
        }
        let mut entry = Cached { record, fetched: Instant::now(), touched };
        let touch = due_for_touch(&mut entry);
        cache.insert(entry.record.id.clone(), entry);
        touch
    }

    fn forget(&self, key_id: &str) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.remove(key_id);
        }
    }

    /// Stores a new key; answers it and the full key (shown once).
    pub async fn create(&self, new: NewKey) -> Result<(ApiKeyRecord, String), ServiceError> {
        check_name(&new.name)?;
        let (record, key) = new_key(new);
        self.store.insert_api_key(&record).await?;
        Ok((record, key))
    }

    pub async fn rename(&self, org_id: &str, id: &str, name: &str) -> Result<(), ServiceError> {
        check_name(name)?;
        if !self.store.rename_api_key(org_id, id, name).await? {
            return Err(api_key_not_found(id));
        }
        self.forget(id);
        Ok(())
    }

    pub async fn delete(&self, org_id: &str, id: &str) -> Result<(), ServiceError> {
        if !self.store.delete_api_key(org_id, id, Utc::now()).await? {
            return Err(api_key_not_found(id));
        }
        self.forget(id);
        Ok(())
    }

    /// Deletes every live key bound to `project_id`, which is being deleted.
    pub async fn delete_bound_to_project(
        &self, org_id: &str, project_id: &str,
    ) -> Result<(), ServiceError> {
        let keys = self.list(org_id).await?;
        let bound = keys.iter().filter(|key| {
            key.deleted_at.is_none() && key.project_id.as_deref() == Some(project_id)
        });
        for key in bound {
            self.store.delete_api_key(org_id, &key.id, Utc::now()).await?;
            self.forget(&key.id);
        }
        Ok(())
    }

    /// A new key with `old`'s name, project and policy; `old` ends `grace` from now (or
    /// earlier, if it was to end earlier anyway).
    pub async fn rotate(
        &self, old: &ApiKeyRecord, lifetime: Option<TimeDelta>, grace: TimeDelta,
        created_by: CreatedBy,
    ) -> Result<(ApiKeyRecord, String), ServiceError> {
        let now = Utc::now();
        let (record, key) = new_key(NewKey {
            org_id: old.org_id.clone(),
            name: old.name.clone(),
            project_id: old.project_id.clone(),
            policy: old.policy.clone(),
            expires_at: lifetime.map(|lifetime| now + lifetime),
            created_by,
        });
        let old_ends = match old.expires_at {
            Some(expires_at) if expires_at < now + grace => expires_at,
            _ => now + grace,
        };
        if !self.store.rotate_api_key(&old.id, old_ends, &record).await? {
            return Err(api_key_not_found(&old.id));
        }
        self.forget(&old.id);
        Ok((record, key))
    }

    /// One of the organization's keys; deleted ones only if asked for.
    pub async fn get(
        &self, org_id: &str, id: &str, include_deleted: bool,
    ) -> Result<ApiKeyRecord, ServiceError> {
        match self.store.api_key(id).await? {
            Some(record)
                if record.org_id == org_id && (include_deleted || record.deleted_at.is_none()) =>
            {
                Ok(record)
            }
            _ => Err(api_key_not_found(id)),
        }
    }

    pub async fn list(&self, org_id: &str) -> Result<Vec<ApiKeyRecord>, ServiceError> {
        Ok(self.store.api_keys(org_id).await?)
    }
}

fn still_valid(record: &ApiKeyRecord) -> Result<(), Refused> {
    if record.deleted_at.is_some() {
        return Err(Refused::Deleted(Box::new(record.clone())));
    }
    match record.expires_at {
        Some(expires_at) if expires_at <= Utc::now() => {
            Err(Refused::Expired(Box::new(record.clone())))
        }
        _ => Ok(()),
    }
}

/// Whether this use should be written, marking it written if so.
fn due_for_touch(entry: &mut Cached) -> bool {
    let due = match entry.touched {
        Some(touched) => touched.elapsed() >= TOUCH_EVERY,
        None => entry
            .record
            .last_used_at
            .is_none_or(|last| (Utc::now() - last).to_std().unwrap_or_default() >= TOUCH_EVERY),
    };
    if due {
        entry.touched = Some(Instant::now());
    }
    due
}

fn check_name(name: &str) -> Result<(), ServiceError> {
    let chars = name.chars().count();
    if chars == 0 || chars > MAX_NAME_CHARS || name.trim().is_empty() {
        return Err(ServiceError::invalid(format!(
            "name: give 1 to {MAX_NAME_CHARS} characters, not only spaces"
        )));
    }
    Ok(())
}

fn api_key_not_found(id: &str) -> ServiceError {
    ServiceError::NotFound(format!("API key {id} not found"))
}
