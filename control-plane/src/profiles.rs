//! Browser profiles: a stored copy of Chromium's user data (cookies, local storage,
//! IndexedDB, …) that new browsers start from, and that a session saves back when it ends.
//!
//! A save replaces the stored archive atomically, and only with a complete archive: the
//! agent's export is streamed to a temporary blob, checked to be a readable ZIP, and then
//! renamed over the previous one. Saves of one profile are serialized (the last to finish
//! wins), so two sessions saving the same profile never mix their files.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::agent::AgentClient;
use crate::blobs::BlobStore;
use crate::error::{ServiceError, ServiceResult};
use crate::ids;
use crate::store::{ProfileRecord, Store, StoreError, profile_blob_key};

/// Longest profile name.
pub const MAX_NAME_LENGTH: usize = 255;

/// The problem with a profile name, if any.
pub fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() || name.chars().count() > MAX_NAME_LENGTH {
        return Some(format!("name must be 1 to {MAX_NAME_LENGTH} characters"));
    }
    if name.chars().any(char::is_control) {
        return Some("name must not contain control characters".into());
    }
    None
}

/// Longest a save may take: Chromium's clean exit plus archiving and the transfer.
const SAVE_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest stored profile; a bigger export is refused (the previous state stays).
const MAX_PROFILE_BYTES: i64 = 1024 * 1024 * 1024;

pub struct Profiles {
    store: Arc<dyn Store>,
    blobs: Arc<dyn BlobStore>,
    /// One lock per profile being saved.
    saving: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Profiles {
    pub fn new(store: Arc<dyn Store>, blobs: Arc<dyn BlobStore>) -> Self {
        Self { store, blobs, saving: Mutex::default() }
    }

    /// Creates a profile of the organization (empty until a session saves into it);
    /// `Conflict` when the name is taken.
    pub async fn create(&self, org_id: &str, name: Option<String>) -> ServiceResult<ProfileRecord> {
        if let Some(problem) = name.as_deref().and_then(name_problem) {
            return Err(ServiceError::invalid(problem));
        }
        let record = ProfileRecord {
            id: ids::new_id("prof"),
            org_id: org_id.to_owned(),
            name,
            created_at: Utc::now(),
            updated_at: None,
            last_used_at: None,
            size_bytes: None,
        };
        match self.store.insert_profile(&record).await {
            Ok(()) => Ok(record),
            Err(StoreError::Conflict(_)) => Err(ServiceError::Conflict(format!(
                "a profile named {:?} already exists",
                record.name.unwrap_or_default()
            ))),
            Err(error) => Err(error.into()),
        }
    }

    /// The archive a browser starts from; `None` while the profile has no saved state.
    pub fn launch_archive(&self, profile: &ProfileRecord) -> Option<PathBuf> {
        profile.size_bytes.and_then(|_| self.blobs.local_path(&profile.blob_key()))
    }

    /// Stops the browser's Chromium, exports its user data and makes it the profile's
    /// stored state. On any failure the previous state stays as it was.
    pub async fn save_from(&self, profile_id: &str, agent: &AgentClient) -> anyhow::Result<()> {
        let lock = {
            let mut saving =
                self.saving.lock().map_err(|_| anyhow::anyhow!("profile save locks poisoned"))?;
            saving.entry(profile_id.to_owned()).or_default().clone()
        };
        let result = {
            let _serialized = lock.lock().await;
            tokio::time::timeout(SAVE_TIMEOUT, self.save_locked(profile_id, agent))
                .await
                .unwrap_or_else(|_| {
                    Err(anyhow::anyhow!("saving took longer than {SAVE_TIMEOUT:?}"))
                })
        };
        if let Ok(mut saving) = self.saving.lock()
            && Arc::strong_count(&lock) == 2
        {
            // Nobody else waits on it (the map's copy and ours).
            saving.remove(profile_id);
        }
        result
    }

    async fn save_locked(&self, profile_id: &str, agent: &AgentClient) -> anyhow::Result<()> {
        let incoming = self.blobs.incoming().context("creating a temporary blob")?;
        let mut file = tokio::fs::File::from_std(incoming.reopen()?);
        let mut chunks = agent.export_profile().await?;
        let mut size: i64 = 0;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.context("the export was cut short")?;
            size += chunk.data.len() as i64;
            if size > MAX_PROFILE_BYTES {
                anyhow::bail!("the profile is larger than {MAX_PROFILE_BYTES} bytes");
            }
            file.write_all(&chunk.data).await?;
        }
        file.flush().await?;
        drop(file);
        let check = incoming.reopen()?;
        tokio::task::spawn_blocking(move || zip::ZipArchive::new(check).map(|_| ()))
            .await?
            .context("the exported profile is not a complete archive")?;
        let key = profile_blob_key(profile_id);
        self.blobs.put(&key, incoming).await?;
        if !self.store.profile_saved(profile_id, Utc::now(), size).await? {
            // The profile was deleted meanwhile.
            self.blobs.delete(&key).await?;
            anyhow::bail!("the profile was deleted while it was being saved");
        }
        tracing::info!(profile_id, size, "profile saved");
        Ok(())
    }
}
