//! Deployments, apps and invocations as the SDKs read them (`kernel==0.131.0`'s
//! `types/deployment_*`, `app_list_response`, `invocation_*`), and the events streamed
//! about them. Environment variable values are never in a view: API callers receive
//! every name with an empty value, as the SDK documents. The same structs document the
//! answers in `/openapi.json`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::{AppDefinition, DeploymentDocument, InvocationDocument, REGION};
use crate::store::{AppVersionRecord, DeploymentRecord, InvocationRecord};

fn redacted(names: &[String]) -> BTreeMap<String, String> {
    names.iter().map(|name| (name.clone(), String::new())).collect()
}

/// An action of an app.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Action {
    pub name: String,
}

fn actions(names: &[String]) -> Vec<Action> {
    names.iter().map(|name| Action { name: name.clone() }).collect()
}

/// A deployment.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Deployment {
    pub id: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Always `aws.us-east-1a`, the one region the SDK knows.
    pub region: &'static str,
    /// queued, in_progress, running, failed or stopped.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_reason: Option<String>,
    pub entrypoint_rel_path: String,
    /// Every variable's name, each with an empty value (values are never returned).
    pub env_vars: BTreeMap<String, String>,
    /// `file` or `github`.
    pub source_type: String,
    /// SHA-256 (hex) of the uploaded archive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_checksum: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_ref: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_path: Option<String>,
}

pub fn deployment(record: &DeploymentRecord) -> Deployment {
    let document = DeploymentDocument::of(record);
    Deployment {
        id: record.id.clone(),
        created_at: record.created_at,
        updated_at: record.updated_at,
        region: REGION,
        status: record.status.clone(),
        status_reason: document.status_reason,
        entrypoint_rel_path: document.entrypoint_rel_path,
        env_vars: redacted(&document.env_var_names),
        source_type: document.source_type,
        source_checksum: document.source_checksum,
        source_url: document.source_url,
        source_ref: document.source_ref,
        source_path: document.source_path,
    }
}

pub fn deployment_state_event(record: &DeploymentRecord) -> Value {
    json!({
        "event": "deployment_state",
        "deployment": deployment(record),
        "timestamp": Utc::now(),
    })
}

pub fn app_version_summary_event(app: &AppVersionRecord, definition: &AppDefinition) -> Value {
    json!({
        "event": "app_version_summary",
        "id": app.id,
        "app_name": definition.name,
        "version": app.version,
        "region": REGION,
        "actions": actions(&definition.actions),
        "timestamp": Utc::now(),
    })
}

pub fn log_event(message: &str) -> Value {
    json!({"event": "log", "message": message, "timestamp": Utc::now()})
}

/// One app at one version, as `GET /apps` lists it.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct AppVersion {
    pub id: String,
    pub app_name: String,
    pub version: String,
    /// The deployment that published it.
    pub deployment: String,
    pub region: &'static str,
    /// Every variable's name, each with an empty value.
    pub env_vars: BTreeMap<String, String>,
    pub actions: Vec<Action>,
}

/// `env_var_names` are its deployment's.
pub fn app(app: &AppVersionRecord, env_var_names: &[String]) -> AppVersion {
    let names: Vec<String> = serde_json::from_str(&app.actions).unwrap_or_default();
    AppVersion {
        id: app.id.clone(),
        app_name: app.app_name.clone(),
        version: app.version.clone(),
        deployment: app.deployment_id.clone(),
        region: REGION,
        env_vars: redacted(env_var_names),
        actions: actions(&names),
    }
}

/// An invocation.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Invocation {
    pub id: String,
    pub app_name: String,
    pub action_name: String,
    pub version: String,
    /// queued, running, succeeded or failed.
    pub status: String,
    pub started_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// The action's return value as JSON, or the traceback of what it raised.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// Present when failed: a summary that never holds the action's output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_reason: Option<String>,
}

pub fn invocation(record: &InvocationRecord) -> Invocation {
    let document = InvocationDocument::of(record);
    Invocation {
        id: record.id.clone(),
        app_name: record.app_name.clone(),
        action_name: record.action_name.clone(),
        version: record.version.clone(),
        status: record.status.clone(),
        started_at: record.started_at,
        finished_at: record.finished_at,
        output: document.output,
        payload: document.payload,
        status_reason: document.status_reason,
    }
}

pub fn invocation_state_event(record: &InvocationRecord) -> Value {
    json!({
        "event": "invocation_state",
        "invocation": invocation(record),
        "timestamp": Utc::now(),
    })
}
