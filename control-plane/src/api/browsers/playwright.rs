//! Server-side Playwright, `/browsers/{id}/playwright/*`, and the browser's REPL,
//! `/browsers/{id}/repl`: users' code runs inside the browser's VM (Node.js with
//! playwright-core, next to Chromium), never on this host.

use axum::Json;
use axum::http::StatusCode;
use browser_agent_proto::v1::{PlaywrightRequest, ReplRequest, repl_content};
use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{JsonBody, PathParam, QueryParams};
use crate::api::org::Org;

/// Longest `timeout_sec`.
const MAX_TIMEOUT_SEC: i64 = 3600;
const DEFAULT_TIMEOUT_SEC: i64 = 60;
/// Largest `code`.
const MAX_CODE_BYTES: usize = 1024 * 1024;
/// Longest executor name.
const MAX_NAME_CHARS: usize = 64;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    /// TypeScript or JavaScript: the body of an async function with `page`, `context` and
    /// `browser`; its `return` value is the answer's `result`. At most 1 MiB.
    #[schema(min_length = 1)]
    pub code: String,
    /// The executor to run in (default `default`): letters, digits, `.`, `_` and `-`, up
    /// to 64. A new name creates one; a browser has at most 8 named executors.
    #[schema(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub executor: Option<String>,
    /// Default 60, at most 3600. Past it the call fails and the executor drops its
    /// browser connection; an executor that cannot even answer then is restarted.
    #[schema(minimum = 1, maximum = 3600)]
    pub timeout_sec: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Tab {
    /// CDP target id of the tab.
    pub target_id: String,
    /// Whether this call opened it.
    pub created: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ExecuteResponse {
    pub success: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What the code returned (JSON values as they are; anything else as its inspected
    /// text). Absent when it returned nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    /// What the code printed (console included): the first MiB of each.
    pub stdout: String,
    pub stderr: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tab: Option<Tab>,
}

/// A call's `timeout_sec` (default 60) in milliseconds, or its problem.
fn timeout_ms(timeout_sec: Option<i64>, problems: &mut Vec<String>) -> u32 {
    let timeout_sec = timeout_sec.unwrap_or(DEFAULT_TIMEOUT_SEC);
    if !(1..=MAX_TIMEOUT_SEC).contains(&timeout_sec) {
        problems.push(format!(
            "timeout_sec must be between 1 and {MAX_TIMEOUT_SEC}, got {timeout_sec}"
        ));
        return 0;
    }
    (timeout_sec * 1000) as u32
}

fn name_problem(name: &str) -> Option<String> {
    let valid = (1..=MAX_NAME_CHARS).contains(&name.chars().count())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    (!valid).then(|| {
        format!(
            "executor: {name:?} is not a name of 1 to {MAX_NAME_CHARS} letters, digits, `.`, `_` or `-`"
        )
    })
}

/// Run Playwright code next to the browser, in one of its executors.
#[utoipa::path(post, path = "/browsers/{id}/playwright/execute", request_body = ExecuteRequest,
    responses((status = 200, body = ExecuteResponse),
        (status = 409, description = "A new executor past the 8 named ones", body = ErrorBody),
        (status = 503, description = "No Node.js runtime, or the browser is restarting", body = ErrorBody)))]
pub async fn execute(
    org: Org, PathParam(id): PathParam<String>, JsonBody(request): JsonBody<ExecuteRequest>,
) -> Result<Json<ExecuteResponse>, ApiError> {
    let mut problems = Vec::new();
    if request.code.is_empty() {
        problems.push("code must not be empty".to_owned());
    }
    if request.code.len() > MAX_CODE_BYTES {
        problems.push(format!("code must be at most {MAX_CODE_BYTES} bytes"));
    }
    let executor = request.executor.unwrap_or_default();
    if !executor.is_empty() {
        problems.extend(name_problem(&executor));
    }
    let timeout_ms = timeout_ms(request.timeout_sec, &mut problems);
    if !problems.is_empty() {
        return Err(ApiError::invalid_fields(problems));
    }
    let agent = org.agent(&id).await?;
    let answer = agent
        .playwright_execute(PlaywrightRequest { code: request.code, executor, timeout_ms })
        .await?;
    // The agent's JSON is the executor's; anything unparsable is reported as text.
    let result = answer
        .result_json
        .map(|json| serde_json::from_str(&json).unwrap_or(serde_json::Value::String(json)));
    Ok(Json(ExecuteResponse {
        success: answer.success,
        error: answer.error,
        result,
        stdout: answer.stdout,
        stderr: answer.stderr,
        tab: answer.tab.map(|tab| Tab { target_id: tab.target_id, created: tab.created }),
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Executor {
    pub name: String,
    /// Whether a call runs on it.
    pub busy: bool,
    pub created_at: DateTime<Utc>,
    /// When its latest call started.
    pub last_used_at: DateTime<Utc>,
    /// The tab a named executor owns, while it is open.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ExecutorList {
    /// The default executor, then the named ones in creation order.
    pub executors: Vec<Executor>,
}

fn time(unix_ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(unix_ms).single().unwrap_or_default()
}

/// The browser's Playwright executors.
#[utoipa::path(get, path = "/browsers/{id}/playwright/executors",
    responses((status = 200, body = ExecutorList)))]
pub async fn list_executors(
    org: Org, PathParam(id): PathParam<String>,
) -> Result<Json<ExecutorList>, ApiError> {
    let agent = org.agent(&id).await?;
    let executors = agent
        .list_executors()
        .await?
        .executors
        .into_iter()
        .map(|executor| Executor {
            name: executor.name,
            busy: executor.busy,
            created_at: time(executor.created_at_unix_ms),
            last_used_at: time(executor.last_used_at_unix_ms),
            target_id: executor.target_id,
            url: executor.url,
        })
        .collect();
    Ok(Json(ExecutorList { executors }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// Close the executor's tab too (default true).
    pub close_tab: Option<bool>,
}

/// Delete a named executor (a call running on it fails; its tab closes unless
/// `close_tab=false`), or restart the default one.
#[utoipa::path(delete, path = "/browsers/{id}/playwright/executors/{name}", params(DeleteQuery),
    responses((status = 204)))]
pub async fn delete_executor(
    org: Org, PathParam((id, name)): PathParam<(String, String)>,
    QueryParams(query): QueryParams<DeleteQuery>,
) -> Result<StatusCode, ApiError> {
    let session = org.sessions.live(&org.id, &id).await?;
    if let Some(problem) = name_problem(&name) {
        return Err(ApiError::invalid_fields(vec![problem]));
    }
    let agent = org.sessions.agent(&session)?;
    agent.delete_executor(name, query.close_tab.unwrap_or(true)).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplBody {
    /// JavaScript, evaluated as Node's REPL does (top-level `await`; top-level bindings
    /// persist between calls). Output comes from `repl.write(text)`, console methods and
    /// `repl.emitImage(bytes or base64, mime_type)`; expression values are not output.
    /// Empty evaluates nothing (with `reset`: just a fresh REPL). At most 1 MiB.
    pub code: String,
    /// End the current REPL and start a fresh one before evaluating.
    pub reset: Option<bool>,
    /// Default 60, at most 3600. Past it the REPL is terminated (`repl_terminated`).
    #[schema(minimum = 1, maximum = 3600)]
    pub timeout_sec: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ReplContent {
    /// `channel`: `write` (repl.write), `stdout` or `stderr` (console).
    Text {
        channel: String,
        text: String,
    },
    Image {
        data_b64: String,
        mime_type: String,
    },
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReplResponse {
    /// The REPL process this call ran in; a new one after a reset, a timeout or a crash.
    pub repl_id: String,
    pub success: bool,
    /// Text and images in the order they were produced (text: the first MiB; images:
    /// 16 MiB together).
    pub content: Vec<ReplContent>,
    pub content_truncated: bool,
    pub duration_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stack: Option<String>,
    /// Whether this call ended the REPL `repl_id` names (its timeout or crash).
    pub repl_terminated: bool,
}

/// Evaluate JavaScript in the browser's persistent REPL, with Playwright's `page`,
/// `context` and `browser` bound to it.
#[utoipa::path(post, path = "/browsers/{id}/repl", request_body = ReplBody,
    responses((status = 200, body = ReplResponse),
        (status = 503, description = "No Node.js runtime, or the browser is restarting", body = ErrorBody)))]
pub async fn repl(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<ReplBody>,
) -> Result<Json<ReplResponse>, ApiError> {
    let mut problems = Vec::new();
    // Empty code (the SDK sends it with `reset`) evaluates nothing.
    let reset = body.reset.unwrap_or(false);
    if body.code.len() > MAX_CODE_BYTES {
        problems.push(format!("code must be at most {MAX_CODE_BYTES} bytes"));
    }
    let timeout_ms = timeout_ms(body.timeout_sec, &mut problems);
    if !problems.is_empty() {
        return Err(ApiError::invalid_fields(problems));
    }
    let agent = org.agent(&id).await?;
    let answer = agent.repl(ReplRequest { code: body.code, reset, timeout_ms }).await?;
    let content = answer
        .content
        .into_iter()
        .filter_map(|item| match item.kind? {
            repl_content::Kind::Text(text) => {
                Some(ReplContent::Text { channel: text.channel, text: text.text })
            }
            repl_content::Kind::Image(image) => {
                Some(ReplContent::Image { data_b64: image.data_b64, mime_type: image.mime_type })
            }
        })
        .collect();
    Ok(Json(ReplResponse {
        repl_id: answer.repl_id,
        success: answer.success,
        content,
        content_truncated: answer.content_truncated,
        duration_ms: answer.duration_ms,
        error: answer.error,
        stack: answer.stack,
        repl_terminated: answer.repl_terminated,
    }))
}
