//! A record as the API answers it: the SDK's `AuditLogEntry`, plus what this server also
//! knows (the key, the action and resource, the outcome, the request id).

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::store::AuditRecord;

/// The only service this server's audit log has (the SDK's `service` filter).
pub const SERVICE: &str = "api";

pub fn entry(record: &AuditRecord) -> Value {
    let timestamp = DateTime::<Utc>::from_timestamp_micros(record.ts_us).unwrap_or_default();
    json!({
        "event_id": record.id,
        "timestamp": timestamp,
        "service": SERVICE,
        "method": record.method,
        "path": record.path,
        "route": record.route,
        "status": record.status,
        "duration_ms": record.duration_ms,
        "client_ip": record.client_ip,
        "user_agent": record.user_agent,
        "domain": record.domain,
        "auth_strategy": record.auth_strategy,
        "user_id": record.user_id,
        "email": record.email,
        "api_key_id": record.api_key_id,
        "action": record.action,
        "resource": record.resource,
        "outcome": record.outcome,
        "request_id": record.request_id,
    })
}
