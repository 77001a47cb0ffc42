//! Processes in the browser's VM, `/browsers/{id}/process/*`: commands run by the
//! browser's agent inside the VM's sandbox, never on this host.

use std::collections::BTreeMap;
use std::convert::Infallible;

use axum::Json;
use axum::response::sse::{Event, KeepAlive, Sse};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use browser_agent_proto::v1::{ProcessRequest, ResizeTerminalRequest, SpawnRequest, output_chunk};
use chrono::{DateTime, TimeZone, Utc};
use futures::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::agent::AgentClient;
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{JsonBody, PathParam};
use crate::api::org::Org;

/// Longest `timeout_sec`.
const MAX_TIMEOUT_SEC: i64 = 3600;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// A program (name or path) run with `args`; without `args`, a command line with
    /// spaces or shell syntax runs in `sh -c`.
    #[schema(min_length = 1)]
    pub command: String,
    pub args: Option<Vec<String>>,
    /// Absolute directory in the VM; default the VM's home (`/home/kernel`).
    pub cwd: Option<String>,
    /// Added to the VM's environment (HOME, PATH, DISPLAY, and HTTP(S)_PROXY pointing to
    /// the browser's egress, so tools go the browser's way out).
    pub env: Option<BTreeMap<String, String>>,
    /// Root inside a user namespace of its own that maps root to the VM's user: it can
    /// do what root can to the VM's own files, nothing to the host.
    pub as_root: Option<bool>,
    /// `kernel` (the VM's user, the default) or `root` (as `as_root`).
    pub as_user: Option<String>,
    /// exec: default 60; spawn: none by default. At most 3600. A command still running
    /// then is killed with its whole process group (exit code 137; exec also answers
    /// `timed_out: true`).
    #[schema(minimum = 1, maximum = 3600)]
    pub timeout_sec: Option<i64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnBody {
    /// As for exec.
    #[schema(min_length = 1)]
    pub command: String,
    pub args: Option<Vec<String>>,
    pub cwd: Option<String>,
    pub env: Option<BTreeMap<String, String>>,
    pub as_root: Option<bool>,
    pub as_user: Option<String>,
    /// None by default.
    #[schema(minimum = 1, maximum = 3600)]
    pub timeout_sec: Option<i64>,
    /// A terminal (PTY) as its stdin, stdout and stderr (output then streams as stdout).
    pub allocate_tty: Option<bool>,
    /// The terminal's size (default 80x24), 1 to 1000 each.
    #[schema(minimum = 1, maximum = 1000)]
    pub cols: Option<i64>,
    #[schema(minimum = 1, maximum = 1000)]
    pub rows: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ExecResponse {
    /// The exit code; 128 + the signal for a command a signal ended.
    pub exit_code: i32,
    /// The first MiB of standard output, base64; the rest is dropped.
    pub stdout_b64: String,
    /// The first MiB of standard error, base64; the rest is dropped.
    pub stderr_b64: String,
    pub duration_ms: u64,
    /// Whether it was killed at its timeout.
    pub timed_out: bool,
}

impl ExecRequest {
    /// The agent's request, or every problem of this one; a `timeout_sec` of
    /// `default_timeout` when absent (0: none).
    fn into_process(self, default_timeout: i64) -> Result<ProcessRequest, ApiError> {
        let mut problems = Vec::new();
        if self.command.trim().is_empty() {
            problems.push("command must not be empty".to_owned());
        }
        let as_root = match self.as_user.as_deref() {
            None | Some("kernel") => self.as_root.unwrap_or(false),
            Some("root") => true,
            Some(other) => {
                problems
                    .push(format!("as_user: {other:?} is not a user of this VM (kernel, or root)"));
                false
            }
        };
        let timeout_sec = self.timeout_sec.unwrap_or(default_timeout);
        if !(0..=MAX_TIMEOUT_SEC).contains(&timeout_sec) || self.timeout_sec == Some(0) {
            problems.push(format!(
                "timeout_sec must be between 1 and {MAX_TIMEOUT_SEC}, got {timeout_sec}"
            ));
        }
        if !problems.is_empty() {
            return Err(ApiError::invalid_fields(problems));
        }
        Ok(ProcessRequest {
            command: self.command,
            args: self.args.unwrap_or_default(),
            cwd: self.cwd.unwrap_or_default(),
            env: self.env.unwrap_or_default().into_iter().collect(),
            as_root,
            timeout_sec: timeout_sec as u32,
        })
    }
}

/// Run a command in the browser's VM and wait for its end.
#[utoipa::path(post, path = "/browsers/{id}/process/exec", request_body = ExecRequest,
    responses((status = 200, body = ExecResponse),
        (status = 409, description = "The browser runs its most processes", body = ErrorBody)))]
pub async fn exec(
    org: Org, PathParam(id): PathParam<String>, JsonBody(request): JsonBody<ExecRequest>,
) -> Result<Json<ExecResponse>, ApiError> {
    let process = request.into_process(60)?;
    let agent = org.agent(&id).await?;
    let result = agent.exec_process(process).await?;
    Ok(Json(ExecResponse {
        exit_code: result.exit_code,
        stdout_b64: STANDARD.encode(&result.stdout),
        stderr_b64: STANDARD.encode(&result.stderr),
        duration_ms: result.duration_ms,
        timed_out: result.timed_out,
    }))
}

async fn agent_of(org: &Org, id: &str) -> Result<AgentClient, ApiError> {
    let session = org.sessions.live(&org.id, id).await?;
    Ok(org.sessions.agent(&session)?)
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SpawnResponse {
    pub process_id: String,
    /// Its process id in the VM.
    pub pid: u32,
    pub started_at: Option<DateTime<Utc>>,
}

/// Start a command in the browser's VM and answer at once; follow it with the routes
/// under `process/{process_id}`. At most 32 processes run per browser (409 beyond); they
/// end with the session.
#[utoipa::path(post, path = "/browsers/{id}/process/spawn", request_body = SpawnBody,
    responses((status = 200, body = SpawnResponse),
        (status = 409, description = "The browser runs its most processes", body = ErrorBody)))]
pub async fn spawn(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<SpawnBody>,
) -> Result<Json<SpawnResponse>, ApiError> {
    let mut problems = Vec::new();
    let mut side = |name: &str, value: Option<i64>, default: u32| match value {
        None => default,
        Some(value) if (1..=1000).contains(&value) => value as u32,
        Some(value) => {
            problems.push(format!("{name} must be between 1 and 1000, got {value}"));
            default
        }
    };
    let (cols, rows) = (side("cols", body.cols, 80), side("rows", body.rows, 24));
    if !problems.is_empty() {
        return Err(ApiError::invalid_fields(problems));
    }
    let process = ExecRequest {
        command: body.command,
        args: body.args,
        cwd: body.cwd,
        env: body.env,
        as_root: body.as_root,
        as_user: body.as_user,
        timeout_sec: body.timeout_sec,
    }
    .into_process(0)?;
    let agent = agent_of(&org, &id).await?;
    let spawned = agent
        .spawn_process(SpawnRequest {
            process: Some(process),
            allocate_tty: body.allocate_tty.unwrap_or(false),
            cols,
            rows,
        })
        .await?;
    Ok(Json(SpawnResponse {
        process_id: spawned.process_id,
        pid: spawned.pid,
        started_at: Utc.timestamp_millis_opt(spawned.started_at_unix_ms).single(),
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessStatusResponse {
    /// `running` or `exited`.
    pub state: &'static str,
    /// Once exited: its exit code (128 + the signal for one a signal ended).
    pub exit_code: Option<i32>,
    /// CPU time over its life so far, in percent of one core.
    pub cpu_pct: f64,
    /// Resident memory of the process itself (not its children).
    pub mem_bytes: u64,
}

/// A spawned process's state.
#[utoipa::path(get, path = "/browsers/{id}/process/{process_id}/status",
    responses((status = 200, body = ProcessStatusResponse)))]
pub async fn status(
    org: Org, PathParam((id, process_id)): PathParam<(String, String)>,
) -> Result<Json<ProcessStatusResponse>, ApiError> {
    let state = agent_of(&org, &id).await?.get_process(process_id).await?;
    Ok(Json(ProcessStatusResponse {
        state: if state.exited { "exited" } else { "running" },
        exit_code: state.exited.then_some(state.exit_code),
        cpu_pct: state.cpu_pct,
        mem_bytes: state.mem_bytes,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StdinBody {
    /// Base64 of at most 1 MiB to write to its standard input (or terminal).
    pub data_b64: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StdinResponse {
    pub written_bytes: u64,
}

/// Write to a spawned process's standard input (its terminal, with `allocate_tty`).
#[utoipa::path(post, path = "/browsers/{id}/process/{process_id}/stdin", request_body = StdinBody,
    responses((status = 200, body = StdinResponse)))]
pub async fn stdin(
    org: Org, PathParam((id, process_id)): PathParam<(String, String)>,
    JsonBody(body): JsonBody<StdinBody>,
) -> Result<Json<StdinResponse>, ApiError> {
    let data = STANDARD
        .decode(body.data_b64.as_bytes())
        .map_err(|error| ApiError::invalid_field(format!("data_b64 is not base64: {error}")))?;
    let written_bytes = agent_of(&org, &id).await?.write_stdin(process_id, data).await?;
    Ok(Json(StdinResponse { written_bytes }))
}

/// One server-sent event of `stdout/stream`.
#[derive(Debug, Serialize, ToSchema)]
pub struct OutputEventView {
    /// `stdout` or `stderr`, for output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_b64: Option<String>,
    /// `exit`, last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

/// A spawned process's output as server-sent events: what it wrote so far (its last
/// MiB), then what it writes, then its exit. Any number of readers.
#[utoipa::path(get, path = "/browsers/{id}/process/{process_id}/stdout/stream",
    responses((status = 200, content_type = "text/event-stream", body = OutputEventView)))]
pub async fn stream(
    org: Org, PathParam((id, process_id)): PathParam<(String, String)>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let chunks = agent_of(&org, &id).await?.stream_output(process_id).await?;
    let events = chunks.take_while(|chunk| std::future::ready(chunk.is_ok())).filter_map(|chunk| {
        let view = match chunk.ok().and_then(|chunk| chunk.kind) {
            Some(output_chunk::Kind::Stdout(data)) => output("stdout", &data),
            Some(output_chunk::Kind::Stderr(data)) => output("stderr", &data),
            Some(output_chunk::Kind::ExitCode(code)) => OutputEventView {
                stream: None,
                data_b64: None,
                event: Some("exit"),
                exit_code: Some(code),
            },
            None => return std::future::ready(None),
        };
        let data = serde_json::to_string(&view).unwrap_or_default();
        std::future::ready(Some(Ok(Event::default().data(data))))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}

fn output(stream: &'static str, data: &[u8]) -> OutputEventView {
    OutputEventView {
        stream: Some(stream),
        data_b64: Some(STANDARD.encode(data)),
        event: None,
        exit_code: None,
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KillBody {
    /// Sent to the process's whole group.
    #[schema(pattern = "^(TERM|KILL|INT|HUP)$")]
    pub signal: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OkResponse {
    pub ok: bool,
}

/// Send a signal to a spawned process and its process group.
#[utoipa::path(post, path = "/browsers/{id}/process/{process_id}/kill", request_body = KillBody,
    responses((status = 200, body = OkResponse)))]
pub async fn kill(
    org: Org, PathParam((id, process_id)): PathParam<(String, String)>,
    JsonBody(body): JsonBody<KillBody>,
) -> Result<Json<OkResponse>, ApiError> {
    if !matches!(body.signal.as_str(), "TERM" | "KILL" | "INT" | "HUP") {
        return Err(ApiError::invalid_field(format!(
            "signal must be TERM, KILL, INT or HUP, got {:?}",
            body.signal
        )));
    }
    agent_of(&org, &id).await?.signal_process(process_id, body.signal).await?;
    Ok(Json(OkResponse { ok: true }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResizeBody {
    #[schema(minimum = 1, maximum = 1000)]
    pub cols: i64,
    #[schema(minimum = 1, maximum = 1000)]
    pub rows: i64,
}

/// Resize a spawned process's terminal (`allocate_tty`); it gets SIGWINCH.
#[utoipa::path(post, path = "/browsers/{id}/process/{process_id}/resize", request_body = ResizeBody,
    responses((status = 200, body = OkResponse)))]
pub async fn resize(
    org: Org, PathParam((id, process_id)): PathParam<(String, String)>,
    JsonBody(body): JsonBody<ResizeBody>,
) -> Result<Json<OkResponse>, ApiError> {
    let problems: Vec<String> = [("cols", body.cols), ("rows", body.rows)]
        .into_iter()
        .filter(|(_, side)| !(1..=1000).contains(side))
        .map(|(name, side)| format!("{name} must be between 1 and 1000, got {side}"))
        .collect();
    if !problems.is_empty() {
        return Err(ApiError::invalid_fields(problems));
    }
    agent_of(&org, &id)
        .await?
        .resize_terminal(ResizeTerminalRequest {
            process_id,
            cols: body.cols as u32,
            rows: body.rows as u32,
        })
        .await?;
    Ok(Json(OkResponse { ok: true }))
}
