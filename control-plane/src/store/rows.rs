//! Each record's columns, in the order its statements list them, and how one row of
//! them becomes the record: written once for both backends.

use super::database::Row;
use super::database::record_of_row;
use super::{
    AgentLocation, AuthConnectionRecord, ExtensionRecord, Organization, PoolLease, PoolRecord,
    ProfileRecord, ProxyRecord, ReplayRecord, ReplayStatus, SecretKind, SecretRecord,
    SessionProfile, SessionRecord, SessionStatus, StoreError, StoreResult,
};

/// Columns of `browser_sessions` in the order both backends read and write them.
pub const SESSION_COLUMNS: &str = "id, org_id, persistent_id, headless, stealth, kiosk_mode, \
    timeout_seconds, viewport_width, viewport_height, viewport_refresh_rate, status, created_at, \
    ended_at, end_reason, agent_endpoint, agent_secret, agent_pid, vm_root, proxy_id, pool_id, \
    pool_lease, profile_id, profile_save_changes, pool_lease_id, vm_settings, name, owner, \
    project_id";
pub const PROFILE_COLUMNS: &str =
    "id, org_id, name, created_at, updated_at, last_used_at, size_bytes";
pub const AUTH_CONNECTION_COLUMNS: &str =
    "id, org_id, domain, profile_name, created_at, document, credentials";
pub const REPLAY_COLUMNS: &str = "id, org_id, session_id, framerate, max_duration_seconds, status, \
    started_at, finished_at, size_bytes, blob_key, failure, record_audio";
pub const PROXY_COLUMNS: &str = "id, org_id, name, type, protocol, bypass_hosts, config, status, \
    last_checked, ip_address, check_error, created_at";
pub const EXTENSION_COLUMNS: &str =
    "id, org_id, name, size_bytes, blob_key, created_at, last_used_at";
pub const POOL_COLUMNS: &str = "id, org_id, name, size, config, created_at, project_id";
pub const SECRET_COLUMNS: &str = "id, org_id, kind, name, created_at, updated_at, document, sealed";

pub fn organization_from_row(row: &Row<'_>) -> StoreResult<Organization> {
    Ok(Organization { id: row.get(0)?, name: row.get(1)?, created_at: row.get(2)? })
}

pub fn session_from_row(row: &Row<'_>) -> StoreResult<SessionRecord> {
    let agent = match row.get::<Option<String>>(14)? {
        Some(endpoint) => Some(AgentLocation {
            endpoint,
            secret: row.get::<Option<String>>(15)?.unwrap_or_default(),
            pid: row.get(16)?,
            vm_root: row.get::<Option<String>>(17)?.unwrap_or_default(),
        }),
        None => None,
    };
    let profile = match row.get::<Option<String>>(21)? {
        Some(id) => {
            Some(SessionProfile { id, save_changes: row.get::<Option<bool>>(22)?.unwrap_or(false) })
        }
        None => None,
    };
    Ok(SessionRecord {
        id: row.get(0)?,
        org_id: row.get(1)?,
        persistent_id: row.get(2)?,
        headless: row.get(3)?,
        stealth: row.get(4)?,
        kiosk_mode: row.get(5)?,
        timeout_seconds: row.get(6)?,
        viewport_width: row.get(7)?,
        viewport_height: row.get(8)?,
        viewport_refresh_rate: row.get(9)?,
        status: SessionStatus::parse(&row.get::<String>(10)?)?,
        created_at: row.get(11)?,
        ended_at: row.get(12)?,
        end_reason: row.get(13)?,
        agent,
        proxy_id: row.get(18)?,
        pool_id: row.get(19)?,
        pool_lease: row
            .get::<Option<String>>(20)?
            .map(|lease| PoolLease::parse(&lease))
            .transpose()?,
        profile,
        pool_lease_id: row.get(23)?,
        vm_settings: row
            .get::<Option<String>>(24)?
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default(),
        name: row.get(25)?,
        owner: row.get(26)?,
        project_id: row.get(27)?,
    })
}

pub fn extension_from_row(row: &Row<'_>) -> StoreResult<ExtensionRecord> {
    record_of_row!(
        row,
        ExtensionRecord { id, org_id, name, size_bytes, blob_key, created_at, last_used_at }
    )
}

pub fn replay_from_row(row: &Row<'_>) -> StoreResult<ReplayRecord> {
    Ok(ReplayRecord {
        id: row.get(0)?,
        org_id: row.get(1)?,
        session_id: row.get(2)?,
        framerate: row.get(3)?,
        max_duration_seconds: row.get(4)?,
        status: ReplayStatus::parse(&row.get::<String>(5)?)?,
        started_at: row.get(6)?,
        finished_at: row.get(7)?,
        size_bytes: row.get(8)?,
        blob_key: row.get(9)?,
        failure: row.get(10)?,
        record_audio: row.get::<Option<bool>>(11)?.unwrap_or(false),
    })
}

pub fn profile_from_row(row: &Row<'_>) -> StoreResult<ProfileRecord> {
    record_of_row!(
        row,
        ProfileRecord { id, org_id, name, created_at, updated_at, last_used_at, size_bytes }
    )
}

pub fn auth_connection_from_row(row: &Row<'_>) -> StoreResult<AuthConnectionRecord> {
    record_of_row!(
        row,
        AuthConnectionRecord {
            id,
            org_id,
            domain,
            profile_name,
            created_at,
            document,
            credentials,
        }
    )
}

pub fn secret_from_row(row: &Row<'_>) -> StoreResult<SecretRecord> {
    let kind: String = row.get(2)?;
    Ok(SecretRecord {
        id: row.get(0)?,
        org_id: row.get(1)?,
        kind: match kind.as_str() {
            "credential" => SecretKind::Credential,
            "credential_provider" => SecretKind::CredentialProvider,
            other => {
                return Err(StoreError::Backend(format!("unknown secret kind {other:?}")));
            }
        },
        name: row.get(3)?,
        created_at: row.get(4)?,
        updated_at: row.get(5)?,
        document: row.get(6)?,
        sealed: row.get(7)?,
    })
}

pub fn pool_from_row(row: &Row<'_>) -> StoreResult<PoolRecord> {
    Ok(PoolRecord {
        id: row.get(0)?,
        org_id: row.get(1)?,
        name: row.get(2)?,
        size: row.get(3)?,
        config: row.json(4)?,
        created_at: row.get(5)?,
        project_id: row.get(6)?,
    })
}

pub fn proxy_from_row(row: &Row<'_>) -> StoreResult<ProxyRecord> {
    Ok(ProxyRecord {
        id: row.get(0)?,
        org_id: row.get(1)?,
        name: row.get(2)?,
        kind: row.get(3)?,
        protocol: row.get(4)?,
        bypass_hosts: row.json(5)?,
        config: row.json(6)?,
        status: row.get(7)?,
        last_checked: row.get(8)?,
        ip_address: row.get(9)?,
        check_error: row.get(10)?,
        created_at: row.get(11)?,
    })
}

pub fn text_from_row(row: &Row<'_>) -> StoreResult<String> {
    row.get(0)
}

pub fn count_from_row(row: &Row<'_>) -> StoreResult<i64> {
    row.get(0)
}
