//! The records of one kind of secret (credentials, credential providers) in the store:
//! what both services do with them alike. A record's document holds its public settings
//! (JSON); its sealed part opens only for the record it was sealed for (`owner`).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{ServiceError, ServiceResult};
use crate::store::{SecretKind, SecretRecord, Store, StoreError};

#[derive(Clone)]
pub struct Secrets {
    store: Arc<dyn Store>,
    kind: SecretKind,
}

impl Secrets {
    pub fn new(store: Arc<dyn Store>, kind: SecretKind) -> Self {
        Self { store, kind }
    }

    /// The record with this id, or this name; 404 when there is none.
    pub async fn record(&self, org_id: &str, id_or_name: &str) -> ServiceResult<SecretRecord> {
        self.store
            .secret(org_id, self.kind, id_or_name)
            .await?
            .ok_or_else(|| self.not_found(id_or_name))
    }

    /// Every record, oldest first, each as `view` shows it.
    pub async fn list<T>(
        &self, org_id: &str, view: impl Fn(&SecretRecord) -> ServiceResult<T>,
    ) -> ServiceResult<Vec<T>> {
        let records = self.store.list_secrets(org_id, self.kind).await?;
        records.iter().map(view).collect()
    }

    /// A new record; 409 when its name is taken.
    pub async fn insert(&self, record: &SecretRecord) -> ServiceResult<()> {
        self.store.insert_secret(record).await.map_err(|error| self.name_taken(error, &record.name))
    }

    /// Writes a record changed since it was read at `read_at`: a 404 if it is gone, a 409
    /// if another change landed in between (the SDKs retry a 409, which reads it again)
    /// or its new name is taken.
    pub async fn write_changed(
        &self, record: &SecretRecord, read_at: DateTime<Utc>,
    ) -> ServiceResult<()> {
        if self
            .store
            .update_secret(record, read_at)
            .await
            .map_err(|error| self.name_taken(error, &record.name))?
        {
            return Ok(());
        }
        match self.store.secret(&record.org_id, self.kind, &record.id).await? {
            Some(_) => Err(ServiceError::Conflict(format!(
                "{} {} was changed at the same time; retry",
                self.noun(),
                record.id
            ))),
            None => Err(self.not_found(&record.id)),
        }
    }

    /// Deletes the record with this id; 404 when there is none.
    pub async fn delete(&self, org_id: &str, id: &str) -> ServiceResult<()> {
        if self.store.delete_secret(org_id, self.kind, id).await? {
            Ok(())
        } else {
            Err(self.not_found(id))
        }
    }

    /// The associated data a record's secrets are sealed with: they open for it only.
    pub fn owner(&self, org_id: &str, id: &str) -> String {
        format!("{}/{org_id}/{id}", self.kind.as_str())
    }

    fn noun(&self) -> &'static str {
        match self.kind {
            SecretKind::Credential => "credential",
            SecretKind::CredentialProvider => "credential provider",
        }
    }

    fn not_found(&self, id_or_name: &str) -> ServiceError {
        ServiceError::NotFound(format!("{} {id_or_name} not found", self.noun()))
    }

    fn name_taken(&self, error: StoreError, name: &str) -> ServiceError {
        match error {
            StoreError::Conflict(_) => {
                ServiceError::Conflict(format!("a {} named {name:?} exists", self.noun()))
            }
            other => other.into(),
        }
    }
}

/// A record's public settings.
pub fn settings_of<S: DeserializeOwned>(record: &SecretRecord) -> ServiceResult<S> {
    Ok(serde_json::from_str(&record.document).map_err(anyhow::Error::from)?)
}

/// The document that holds `settings`.
pub fn document_of(settings: &impl Serialize) -> ServiceResult<String> {
    Ok(serde_json::to_string(settings).map_err(anyhow::Error::from)?)
}
