//! Durable state. `Store` is the only way the rest of the control plane reads or writes
//! it. `SqlStore` implements it once, over SQLite (embedded, the default) or PostgreSQL
//! (many replicas); one contract test suite (`tests/tests/store_contract.rs`) runs
//! against both.

mod access;
mod apps;
mod audit;
mod audit_export;
mod coordination;
mod database;
mod pools;
mod postgres_pool;
mod projects;
mod replays;
mod rows;
pub mod scope;
mod signed_in;
mod sql;
mod sql_store;
pub mod statements;
mod telemetry;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

pub use access::{AccessStore, ApiKeyRecord, CreatedBy};
pub use apps::{AppVersionRecord, AppsStore, DeploymentRecord, InvocationRecord};
pub use audit::{AuditQuery, AuditRecord, AuditStore};
pub use audit_export::{AuditExportStore, ExportDestinationRecord};
pub use coordination::{CoordinationStore, ExclusiveLock};
pub use pools::PoolsStore;
pub use projects::{ProjectRecord, ProjectsStore};
pub use replays::ReplaysStore;
pub use signed_in::{SignedInRecord, SignedInStore};
pub use sql_store::SqlStore;
pub use telemetry::{
    DestinationRecord, NewTelemetryEvent, TelemetryQuery, TelemetryRow, TelemetryStore,
};

use database::Database;
#[doc(hidden)]
pub use database::build_old_database;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A uniqueness rule was violated (e.g. a second live session for a persistent id).
    #[error("conflict: {0}")]
    Conflict(String),
    #[error("database error: {0}")]
    Backend(String),
    /// Another replica held what this call needed for too long; retrying may succeed.
    #[error("busy: {0}")]
    Busy(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Organization {
    pub id: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionStatus {
    /// Recorded, its agent being launched.
    Starting,
    Running,
    Ended,
}

impl SessionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Ended => "ended",
        }
    }

    pub fn parse(text: &str) -> StoreResult<Self> {
        match text {
            "starting" => Ok(Self::Starting),
            "running" => Ok(Self::Running),
            "ended" => Ok(Self::Ended),
            other => Err(StoreError::Backend(format!("unknown session status {other:?}"))),
        }
    }
}

/// Where a session's agent runs and how to reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentLocation {
    /// gRPC endpoint such as `http://127.0.0.1:41234`.
    pub endpoint: String,
    pub secret: String,
    /// Process id when the agent runs on this host (local runtime).
    pub pid: Option<i64>,
    /// Names the VM in its runtime: its root directory on this host (local runtime), or
    /// its pod (Kubernetes).
    pub vm_root: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRecord {
    pub id: String,
    pub org_id: String,
    pub persistent_id: Option<String>,
    pub headless: bool,
    pub stealth: bool,
    pub kiosk_mode: bool,
    pub timeout_seconds: i64,
    pub viewport_width: i64,
    pub viewport_height: i64,
    pub viewport_refresh_rate: Option<i64>,
    pub status: SessionStatus,
    pub created_at: DateTime<Utc>,
    pub ended_at: Option<DateTime<Utc>>,
    pub end_reason: Option<String>,
    pub agent: Option<AgentLocation>,
    pub proxy_id: Option<String>,
    /// The pool this browser belongs to, and its lease state there.
    pub pool_id: Option<String>,
    pub pool_lease: Option<PoolLease>,
    /// Names the current lease of a leased pool browser.
    pub pool_lease_id: Option<String>,
    /// The profile the browser started with.
    pub profile: Option<SessionProfile>,
    pub vm_settings: VmSettings,
    /// Unique among the organization's live sessions; addresses the session like its id.
    pub name: Option<String>,
    /// The control-plane replica that serves it: its launch, its egress, the watch on its
    /// agent. Another replica adopts it when this one is gone.
    pub owner: Option<String>,
    /// Its project. `None` when inserting: the project of the request that makes it (see
    /// `scope`), its organization's default project outside one.
    pub project_id: Option<String>,
}

/// What a session was created (or updated) with beyond its launch options: settings of
/// its VM, and the caller's labels.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VmSettings {
    /// `network.allowed_hosts`, as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_hosts: Option<Vec<String>>,
    /// `memory`, such as `1GiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chrome_policy: Option<serde_json::Map<String, serde_json::Value>>,
    /// The caller's key/value tags (empty when none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// The URL the browser was asked to open (recorded as given, not what loaded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_url: Option<String>,
    /// Timezone and locale overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<SessionLocation>,
    /// The invocation whose action created the browser.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invocation_id: Option<String>,
    /// What the browser's telemetry captures and where it goes; `None`: never enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<crate::telemetry::settings::TelemetrySettings>,
}

/// A session's timezone (IANA) and locale (BCP 47) overrides; absent ones are the
/// server's defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionLocation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locale: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionProfile {
    pub id: String,
    /// Save the browser's state back into the profile when the session ends.
    pub save_changes: bool,
}

/// A browser profile; its stored state is the blob `blob_key()`, once saved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileRecord {
    pub id: String,
    pub org_id: String,
    pub name: Option<String>,
    pub created_at: DateTime<Utc>,
    /// When a session last saved state into it; `None` while it has none.
    pub updated_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub size_bytes: Option<i64>,
}

impl ProfileRecord {
    pub fn blob_key(&self) -> String {
        profile_blob_key(&self.id)
    }
}

pub fn profile_blob_key(profile_id: &str) -> String {
    format!("profiles/{profile_id}.zip")
}

/// An auth connection. The store keeps its settings and workflow state as an opaque
/// JSON `document` (the auth module's); `credentials` are encrypted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthConnectionRecord {
    pub id: String,
    pub org_id: String,
    pub domain: String,
    pub profile_name: String,
    pub created_at: DateTime<Utc>,
    pub document: String,
    pub credentials: Option<Vec<u8>>,
}

/// What a `SecretRecord` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretKind {
    Credential,
    CredentialProvider,
}

impl SecretKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Credential => "credential",
            Self::CredentialProvider => "credential_provider",
        }
    }
}

/// A credential or a credential provider. The store keeps its public settings as an
/// opaque JSON `document` (the credentials module's) and its secrets `sealed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRecord {
    pub id: String,
    pub org_id: String,
    pub kind: SecretKind,
    /// Unique per organization and kind.
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub document: String,
    pub sealed: Option<Vec<u8>>,
}

/// Where a pool's browser is in its cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolLease {
    /// Ready to be acquired.
    Idle,
    Leased,
    /// Released with reuse: its state is being cleared before it is idle again.
    Resetting,
    /// Claimed for ending (flush, shrink, failed reset): never leased again.
    Retiring,
}

impl PoolLease {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Leased => "leased",
            Self::Resetting => "resetting",
            Self::Retiring => "retiring",
        }
    }

    pub fn parse(text: &str) -> StoreResult<Self> {
        match text {
            "idle" => Ok(Self::Idle),
            "leased" => Ok(Self::Leased),
            "resetting" => Ok(Self::Resetting),
            "retiring" => Ok(Self::Retiring),
            other => Err(StoreError::Backend(format!("unknown pool lease {other:?}"))),
        }
    }
}

/// A proxy of an organization.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyRecord {
    pub id: String,
    pub org_id: String,
    pub name: Option<String>,
    /// datacenter, isp, residential, mobile or custom.
    pub kind: String,
    pub protocol: String,
    pub bypass_hosts: Vec<String>,
    /// As given at creation, secrets included.
    pub config: serde_json::Value,
    pub status: Option<String>,
    pub last_checked: Option<DateTime<Utc>>,
    pub ip_address: Option<String>,
    pub check_error: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A browser pool of an organization.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolRecord {
    pub id: String,
    pub org_id: String,
    pub name: Option<String>,
    pub size: i64,
    /// The browsers' configuration as the API reads it back.
    pub config: serde_json::Value,
    pub created_at: DateTime<Utc>,
    /// Its project, and its browsers'. `None` when inserting: as `SessionRecord`'s.
    pub project_id: Option<String>,
}

/// The result of a proxy check.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyCheck {
    pub status: String,
    pub at: DateTime<Utc>,
    pub ip_address: Option<String>,
    pub error: Option<String>,
}

/// An extension archive in an organization's library; the bytes are in the blob store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtensionRecord {
    pub id: String,
    pub org_id: String,
    pub name: Option<String>,
    pub size_bytes: i64,
    pub blob_key: String,
    pub created_at: DateTime<Utc>,
    pub last_used_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayStatus {
    Recording,
    /// Being finalized and copied into the blob store.
    Stopping,
    /// The video is in the blob store.
    Finished,
    /// Ended without a video (`failure` says why).
    Lost,
}

impl ReplayStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Recording => "recording",
            Self::Stopping => "stopping",
            Self::Finished => "finished",
            Self::Lost => "lost",
        }
    }

    pub fn parse(text: &str) -> StoreResult<Self> {
        match text {
            "recording" => Ok(Self::Recording),
            "stopping" => Ok(Self::Stopping),
            "finished" => Ok(Self::Finished),
            "lost" => Ok(Self::Lost),
            other => Err(StoreError::Backend(format!("unknown replay status {other:?}"))),
        }
    }
}

/// A screen recording of a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayRecord {
    pub id: String,
    pub org_id: String,
    pub session_id: String,
    pub framerate: i64,
    pub max_duration_seconds: i64,
    pub status: ReplayStatus,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub size_bytes: Option<i64>,
    pub blob_key: Option<String>,
    pub failure: Option<String>,
    /// The browser's sound is recorded too.
    pub record_audio: bool,
}

/// How a recording ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplayOutcome {
    Video { size_bytes: i64, blob_key: String },
    Lost(String),
}

/// Which sessions a listing returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionFilter {
    /// Starting or running.
    Live,
    Ended,
    All,
}

#[async_trait]
pub trait Store:
    AccessStore
    + AppsStore
    + AuditStore
    + AuditExportStore
    + CoordinationStore
    + ProjectsStore
    + ReplaysStore
    + PoolsStore
    + SignedInStore
    + TelemetryStore
    + Send
    + Sync
    + 'static
{
    /// Returns the organization with this name, creating it first if needed.
    async fn ensure_organization(&self, name: &str) -> StoreResult<Organization>;

    /// Stores `value` under `key` unless a value is already there; returns the stored one.
    /// Replicas use it to agree on shared secrets such as the token signing key.
    async fn setting_or_insert(&self, key: &str, value: &str) -> StoreResult<String>;

    /// Fails with `Conflict` when the organization already has a live session with the
    /// same persistent id or name.
    async fn insert_session(&self, session: &SessionRecord) -> StoreResult<()>;
    /// By id, or else by the name of a live session: a name that equals another session's
    /// id never shadows that session.
    async fn session(&self, org_id: &str, id_or_name: &str) -> StoreResult<Option<SessionRecord>>;
    async fn live_session_by_persistent_id(
        &self, org_id: &str, persistent_id: &str,
    ) -> StoreResult<Option<SessionRecord>>;
    /// Newest first.
    async fn list_sessions(
        &self, org_id: &str, filter: SessionFilter, limit: u32, offset: u32,
    ) -> StoreResult<Vec<SessionRecord>>;
    /// How many starting or running sessions the organization has outside pools.
    async fn live_browser_count(&self, org_id: &str) -> StoreResult<u64>;
    /// Every starting or running session of every organization.
    async fn live_sessions(&self) -> StoreResult<Vec<SessionRecord>>;
    /// Records where the agent runs and marks the session running, unless it ended
    /// meanwhile; returns whether it did.
    async fn set_session_running(&self, id: &str, agent: &AgentLocation) -> StoreResult<bool>;
    /// Marks a live session ended; returns false if it had already ended (or is unknown),
    /// so exactly one caller goes on to reap it.
    async fn end_session(&self, id: &str, at: DateTime<Utc>, reason: &str) -> StoreResult<bool>;
    /// Replaces a live session's name, proxy and settings; false if it has ended,
    /// `Conflict` if another live session of the organization has the name.
    async fn set_session_settings(
        &self, id: &str, name: Option<&str>, proxy_id: Option<&str>, settings: &VmSettings,
    ) -> StoreResult<bool>;

    /// Gives a live session that has no profile this one; false if it has ended or
    /// already has a profile.
    async fn set_session_profile(&self, id: &str, profile: &SessionProfile) -> StoreResult<bool>;

    /// Records a live session's new viewport; false if it has ended.
    async fn set_session_viewport(
        &self, id: &str, width: i64, height: i64, refresh_rate: Option<i64>,
    ) -> StoreResult<bool>;

    /// Fails with `Conflict` when the organization already has an extension of that name.
    async fn insert_extension(&self, extension: &ExtensionRecord) -> StoreResult<()>;
    /// Looks the id up first, then the name: a name that equals another extension's id
    /// never shadows that extension.
    async fn extension(
        &self, org_id: &str, id_or_name: &str,
    ) -> StoreResult<Option<ExtensionRecord>>;
    /// Oldest first.
    async fn list_extensions(&self, org_id: &str) -> StoreResult<Vec<ExtensionRecord>>;
    /// Returns whether it existed.
    async fn delete_extension(&self, org_id: &str, id: &str) -> StoreResult<bool>;
    async fn mark_extensions_used(&self, ids: &[String], at: DateTime<Utc>) -> StoreResult<()>;

    async fn insert_proxy(&self, proxy: &ProxyRecord) -> StoreResult<()>;
    /// A proxy that is not deleted: by id, or by the name of exactly one proxy (`Conflict`
    /// when several share it).
    async fn proxy(&self, org_id: &str, id_or_name: &str) -> StoreResult<Option<ProxyRecord>>;
    /// Renames a proxy that is not deleted; false if there is none.
    async fn rename_proxy(&self, org_id: &str, id: &str, name: &str) -> StoreResult<bool>;
    /// Proxies that are not deleted, oldest first.
    async fn list_proxies(&self, org_id: &str) -> StoreResult<Vec<ProxyRecord>>;
    /// Soft delete; returns whether a live proxy was deleted.
    async fn delete_proxy(&self, org_id: &str, id: &str, at: DateTime<Utc>) -> StoreResult<bool>;
    async fn record_proxy_check(&self, id: &str, check: &ProxyCheck) -> StoreResult<()>;

    /// Fails with `Conflict` when the organization has a profile of that name.
    async fn insert_profile(&self, profile: &ProfileRecord) -> StoreResult<()>;
    /// By id first, then by name.
    async fn profile(&self, org_id: &str, id_or_name: &str) -> StoreResult<Option<ProfileRecord>>;
    /// Oldest first.
    async fn list_profiles(&self, org_id: &str) -> StoreResult<Vec<ProfileRecord>>;
    /// Renames a profile; false if there is none, `Conflict` if the name is taken.
    async fn rename_profile(&self, org_id: &str, id: &str, name: &str) -> StoreResult<bool>;
    async fn delete_profile(&self, org_id: &str, id: &str) -> StoreResult<bool>;
    /// Records a saved state; false if the profile is gone.
    async fn profile_saved(
        &self, id: &str, at: DateTime<Utc>, size_bytes: i64,
    ) -> StoreResult<bool>;
    async fn mark_profile_used(&self, id: &str, at: DateTime<Utc>) -> StoreResult<()>;

    /// Fails with `Conflict` when the organization has a connection for the same profile
    /// and domain.
    async fn insert_auth_connection(&self, connection: &AuthConnectionRecord) -> StoreResult<()>;
    async fn auth_connection(
        &self, org_id: &str, id: &str,
    ) -> StoreResult<Option<AuthConnectionRecord>>;
    /// Oldest first; every organization's with `None`.
    async fn list_auth_connections(
        &self, org_id: Option<&str>,
    ) -> StoreResult<Vec<AuthConnectionRecord>>;
    /// Replaces `document` and `credentials`; false if the connection is gone.
    async fn update_auth_connection(&self, connection: &AuthConnectionRecord) -> StoreResult<bool>;
    async fn delete_auth_connection(&self, org_id: &str, id: &str) -> StoreResult<bool>;

    /// Fails with `Conflict` when the organization has one of that kind and name.
    async fn insert_secret(&self, secret: &SecretRecord) -> StoreResult<()>;
    /// By id, else by name.
    async fn secret(
        &self, org_id: &str, kind: SecretKind, id_or_name: &str,
    ) -> StoreResult<Option<SecretRecord>>;
    /// Oldest first.
    async fn list_secrets(&self, org_id: &str, kind: SecretKind) -> StoreResult<Vec<SecretRecord>>;
    /// Replaces name, `updated_at`, document and sealed secrets if the stored record was
    /// last updated at `read_at` (as read before the change); false if it is gone or was
    /// changed since. Fails with `Conflict` when the new name is taken.
    async fn update_secret(
        &self, secret: &SecretRecord, read_at: DateTime<Utc>,
    ) -> StoreResult<bool>;
    async fn delete_secret(&self, org_id: &str, kind: SecretKind, id: &str) -> StoreResult<bool>;
}

impl ReplayOutcome {
    /// The replay's (status, size_bytes, blob_key, failure) after this outcome.
    pub fn columns(&self) -> (ReplayStatus, Option<i64>, Option<&str>, Option<&str>) {
        match self {
            Self::Video { size_bytes, blob_key } => {
                (ReplayStatus::Finished, Some(*size_bytes), Some(blob_key), None)
            }
            Self::Lost(why) => (ReplayStatus::Lost, None, None, Some(why)),
        }
    }
}

/// Opens the store that `database_url` names: `postgres://…` / `postgresql://…` for
/// PostgreSQL, otherwise (or when absent) the SQLite file `<data_dir>/control-plane.db`.
/// Applies pending migrations.
pub async fn open(database_url: Option<&str>, data_dir: &Path) -> anyhow::Result<Arc<dyn Store>> {
    let database = match database_url {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
            Database::connect_postgres(url).await
        }
        Some(url) => {
            let path = url.strip_prefix("sqlite://").unwrap_or(url);
            Database::open_sqlite(Path::new(path)).await
        }
        None => Database::open_sqlite(&data_dir.join("control-plane.db")).await,
    }?;
    Ok(Arc::new(SqlStore::new(database)))
}
