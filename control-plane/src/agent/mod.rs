//! The one place that speaks gRPC to browser agents: credentials, deadlines and the
//! mapping of `tonic::Status` to errors the API can answer.

mod clients;
pub mod devtools;
pub mod page;
mod webmcp;

use std::path::PathBuf;
use std::time::Duration;

use browser_agent_proto::AUTHORIZATION_METADATA;
use browser_agent_proto::v1::browser_agent_client::BrowserAgentClient;
use browser_agent_proto::v1::{
    ActionBatch, CdpFrame, CdpOpen, ClickMouseRequest, ClipboardText, CreateDirectoryRequest,
    CurlRequest, CurlResult, CursorVisibility, DataChunk, DeleteExecutorRequest, DeletePathRequest,
    DragMouseRequest, Empty, ExecResult, ExecutorList, ExtensionUploadChunk, ExtractZipChunk,
    ExtractZipResponse, FileInfo, FollowFileRequest, LiveViewInput, LiveViewUpdate,
    LoadExtensionsResponse, LogLine, MoveMouseRequest, MovePathRequest, OutputChunk, PathRequest,
    PlaywrightRequest, PlaywrightResult, Point, PressKeysRequest, ProcessRef, ProcessRequest,
    ProcessState, ProfileChunk, RecordingInfo, RecordingRequest, RelaunchRequest, ReplRequest,
    ReplResult, ResizeTerminalRequest, ScreenSize, ScreenshotRequest, ScrollRequest,
    SetPermissionsRequest, ShutdownRequest, SignalRequest, SpawnRequest, SpawnResult,
    StartRecordingRequest, StatusRequest, StatusResponse, StdinRequest, TelemetryCapture,
    TelemetryRecord, TypeTextRequest, WatchEvent, WatchRequest, WriteFileChunk, cdp_frame::Kind,
    profile_chunk,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};

use crate::store::AgentLocation;

pub use clients::AgentClients;

/// CDP messages can be large (screenshots, DOM snapshots); matches the agent's limit.
pub const MAX_CDP_MESSAGE_BYTES: usize = 256 * 1024 * 1024;
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Filesystem calls may walk large trees (recursive delete, listing).
const FS_CALL_TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a Playwright or REPL call may wait for the calls queued before it.
const PLAYWRIGHT_QUEUE_ALLOWANCE: Duration = Duration::from_secs(300);
/// Stopping a recording waits for ffmpeg to flush and the file to be remuxed.
const FINALIZE_TIMEOUT: Duration = Duration::from_secs(310);

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("browser agent unavailable: {0}")]
    Unavailable(String),
    #[error("browser agent did not answer in time: {0}")]
    Timeout(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("browser agent failed: {0}")]
    Internal(String),
}

impl From<Status> for AgentError {
    fn from(status: Status) -> Self {
        let message = status.message().to_owned();
        if agent_at_fault(status.code()) {
            crate::metrics::METRICS.agent_rpc_error(status.code());
        }
        match status.code() {
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange | Code::Aborted => {
                Self::InvalidArgument(message)
            }
            Code::NotFound => Self::NotFound(message),
            Code::AlreadyExists | Code::ResourceExhausted => Self::Conflict(message),
            Code::PermissionDenied => Self::Forbidden(message),
            Code::DeadlineExceeded => Self::Timeout(message),
            Code::Unavailable | Code::Unknown | Code::Cancelled => Self::Unavailable(message),
            _ => Self::Internal(format!("{:?}: {message}", status.code())),
        }
    }
}

/// Whether a call failed because of the agent or the way to it, not because of what the
/// caller asked (a missing file, a bad argument) or because the caller went away.
fn agent_at_fault(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::Unknown
            | Code::DeadlineExceeded
            | Code::Internal
            | Code::DataLoss
            | Code::Unimplemented
            | Code::Unauthenticated
    )
}

type Authenticated = InterceptedService<Channel, BearerCredential>;

#[derive(Clone)]
pub struct BearerCredential(MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for BearerCredential {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        request.metadata_mut().insert(AUTHORIZATION_METADATA, self.0.clone());
        Ok(request)
    }
}

/// Endpoints of agents reached over a Unix socket (local VMs): `unix:<socket path>`.
pub const UNIX_ENDPOINT_PREFIX: &str = "unix:";

/// A lazy channel to an agent's Unix socket. The URI only names the HTTP/2 authority;
/// every connection goes to the socket.
fn unix_channel(socket: PathBuf) -> Result<Channel, AgentError> {
    let endpoint = Endpoint::from_static("http://browser-agent").connect_timeout(CONNECT_TIMEOUT);
    Ok(endpoint.connect_with_connector_lazy(tower::service_fn(move |_: tonic::transport::Uri| {
        let socket = socket.clone();
        async move {
            let short = browser_agent_proto::unix_socket::short_path(&socket)?;
            let stream = tokio::net::UnixStream::connect(&short.path).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    })))
}

/// How agents reached over `https://` endpoints prove who they are: the CA that signed
/// their certificates and the name the certificates carry. Set once at start.
static AGENT_TLS: std::sync::OnceLock<tonic::transport::ClientTlsConfig> =
    std::sync::OnceLock::new();

/// Verifies agents' certificates against `ca_pem` (PEM) and `server_name` from now on.
pub fn use_agent_tls(ca_pem: Vec<u8>, server_name: &str) {
    let config = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca_pem))
        .domain_name(server_name);
    let _ = AGENT_TLS.set(config);
}

/// A TCP channel to an agent; `https://` endpoints over TLS.
fn network_channel(endpoint: &str) -> Result<Channel, AgentError> {
    let bad = |error: &dyn std::fmt::Display| {
        AgentError::Unavailable(format!("bad agent endpoint: {error}"))
    };
    let mut channel = Endpoint::from_shared(endpoint.to_owned())
        .map_err(|error| bad(&error))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    if endpoint.starts_with("https://") {
        let tls = AGENT_TLS.get().ok_or_else(|| {
            AgentError::Unavailable("the agent speaks TLS but no agent CA is configured".into())
        })?;
        channel = channel.tls_config(tls.clone()).map_err(|error| bad(&error))?;
    }
    Ok(channel.connect_lazy())
}

/// A client for one agent. Cheap to clone; clones share the HTTP/2 connection.
#[derive(Clone)]
pub struct AgentClient {
    inner: BrowserAgentClient<Authenticated>,
}

impl AgentClient {
    /// Connects lazily: no I/O until the first call.
    pub fn new(location: &AgentLocation) -> Result<Self, AgentError> {
        let channel = match location.endpoint.strip_prefix(UNIX_ENDPOINT_PREFIX) {
            Some(socket) => unix_channel(PathBuf::from(socket))?,
            None => network_channel(&location.endpoint)?,
        };
        let credential = MetadataValue::try_from(format!("Bearer {}", location.secret))
            .map_err(|_| AgentError::Internal("agent secret is not valid metadata".into()))?;
        let inner = BrowserAgentClient::with_interceptor(channel, BearerCredential(credential))
            .max_decoding_message_size(MAX_CDP_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_CDP_MESSAGE_BYTES);
        Ok(Self { inner })
    }

    pub async fn status(&self) -> Result<StatusResponse, AgentError> {
        let mut request = tonic::Request::new(StatusRequest::default());
        request.set_timeout(CALL_TIMEOUT);
        Ok(self.inner.clone().status(request).await?.into_inner())
    }

    /// Waits until Chromium's DevTools answers (or failed), at most `wait`.
    pub async fn wait_until_ready(&self, wait: Duration) -> Result<StatusResponse, AgentError> {
        let mut request = tonic::Request::new(StatusRequest {
            wait_until_ready: true,
            wait_timeout_ms: wait.as_millis() as u32,
        });
        request.set_timeout(wait + CALL_TIMEOUT);
        Ok(self.inner.clone().status(request).await?.into_inner())
    }

    pub async fn shutdown(&self) -> Result<(), AgentError> {
        let mut request = tonic::Request::new(ShutdownRequest {});
        request.set_timeout(CALL_TIMEOUT);
        self.inner.clone().shutdown(request).await?;
        Ok(())
    }

    /// Opens a tunnel to the DevTools WebSocket at `path` (empty: the browser endpoint).
    /// Returns the sender for frames towards Chromium and the stream of frames from it.
    pub async fn open_cdp_tunnel(
        &self, path: &str,
    ) -> Result<(mpsc::Sender<CdpFrame>, Streaming<CdpFrame>), AgentError> {
        let (to_agent, outbound) = mpsc::channel(64);
        to_agent
            .send(CdpFrame { kind: Some(Kind::Open(CdpOpen { path: path.to_owned() })) })
            .await
            .map_err(|_| AgentError::Internal("tunnel channel closed".into()))?;
        let response = self.inner.clone().cdp_tunnel(ReceiverStream::new(outbound)).await?;
        Ok((to_agent, response.into_inner()))
    }

    /// Opens the display's live view: returns the sender for the viewer's input and the
    /// stream of screen updates, which ends with the display.
    pub async fn open_live_view(
        &self,
    ) -> Result<(mpsc::Sender<LiveViewInput>, Streaming<LiveViewUpdate>), AgentError> {
        let (to_agent, outbound) = mpsc::channel(256);
        let response = self.inner.clone().live_view(ReceiverStream::new(outbound)).await?;
        Ok((to_agent, response.into_inner()))
    }

    fn fs_request<T>(message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(FS_CALL_TIMEOUT);
        request
    }

    pub async fn move_path(&self, src_path: String, dest_path: String) -> Result<(), AgentError> {
        let request = Self::fs_request(MovePathRequest { src_path, dest_path });
        self.inner.clone().move_path(request).await?;
        Ok(())
    }

    pub async fn stat(&self, path: String) -> Result<FileInfo, AgentError> {
        let request = Self::fs_request(PathRequest { path });
        Ok(self.inner.clone().stat_path(request).await?.into_inner())
    }

    pub async fn list(&self, path: String) -> Result<Vec<FileInfo>, AgentError> {
        let request = Self::fs_request(PathRequest { path });
        Ok(self.inner.clone().list_directory(request).await?.into_inner().files)
    }

    pub async fn read_file(&self, path: String) -> Result<Streaming<DataChunk>, AgentError> {
        Ok(self.inner.clone().read_file(PathRequest { path }).await?.into_inner())
    }

    /// `chunks` starts with the target; the agent commits the file when it ends.
    pub async fn write_file(
        &self, chunks: mpsc::Receiver<WriteFileChunk>,
    ) -> Result<(), AgentError> {
        self.inner.clone().write_file(ReceiverStream::new(chunks)).await?;
        Ok(())
    }

    pub async fn create_directory(&self, path: String, mode: u32) -> Result<(), AgentError> {
        let request = Self::fs_request(CreateDirectoryRequest { path, mode });
        self.inner.clone().create_directory(request).await?;
        Ok(())
    }

    pub async fn delete_path(&self, path: String, directory: bool) -> Result<(), AgentError> {
        let request = Self::fs_request(DeletePathRequest { path, directory });
        self.inner.clone().delete_path(request).await?;
        Ok(())
    }

    pub async fn set_permissions(&self, request: SetPermissionsRequest) -> Result<(), AgentError> {
        self.inner.clone().set_permissions(Self::fs_request(request)).await?;
        Ok(())
    }

    /// `chunks` carries the archive and ends with `finish`; dropping the sender before
    /// `finish` abandons the upload without changing anything.
    pub async fn extract_zip(
        &self, chunks: mpsc::Receiver<ExtractZipChunk>,
    ) -> Result<ExtractZipResponse, AgentError> {
        Ok(self.inner.clone().extract_zip(ReceiverStream::new(chunks)).await?.into_inner())
    }

    pub async fn zip_directory(&self, path: String) -> Result<Streaming<DataChunk>, AgentError> {
        Ok(self.inner.clone().zip_directory(PathRequest { path }).await?.into_inner())
    }

    /// Watches a directory: the stream's first event is STARTED, then one per change,
    /// until the stream is dropped.
    pub async fn watch_directory(
        &self, path: String, recursive: bool,
    ) -> Result<Streaming<WatchEvent>, AgentError> {
        Ok(self.inner.clone().watch_directory(WatchRequest { path, recursive }).await?.into_inner())
    }

    /// Input calls may legitimately take long (drags with delays, slow typing).
    fn input_request<T>(message: T, expected: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(expected + CALL_TIMEOUT);
        request
    }

    pub async fn click_mouse(&self, request: ClickMouseRequest) -> Result<(), AgentError> {
        self.inner.clone().click_mouse(Self::input_request(request, Duration::ZERO)).await?;
        Ok(())
    }

    pub async fn move_mouse(
        &self, request: MoveMouseRequest, expected: Duration,
    ) -> Result<(), AgentError> {
        self.inner.clone().move_mouse(Self::input_request(request, expected)).await?;
        Ok(())
    }

    pub async fn drag_mouse(
        &self, request: DragMouseRequest, expected: Duration,
    ) -> Result<(), AgentError> {
        self.inner.clone().drag_mouse(Self::input_request(request, expected)).await?;
        Ok(())
    }

    pub async fn mouse_position(&self) -> Result<Point, AgentError> {
        let request = Self::input_request(Empty {}, Duration::ZERO);
        Ok(self.inner.clone().get_mouse_position(request).await?.into_inner())
    }

    pub async fn type_text(
        &self, request: TypeTextRequest, expected: Duration,
    ) -> Result<(), AgentError> {
        self.inner.clone().type_text(Self::input_request(request, expected)).await?;
        Ok(())
    }

    pub async fn press_keys(
        &self, request: PressKeysRequest, expected: Duration,
    ) -> Result<(), AgentError> {
        self.inner.clone().press_keys(Self::input_request(request, expected)).await?;
        Ok(())
    }

    /// Runs the actions in order in one call; the first failure stops them (its message
    /// names the index).
    pub async fn run_actions(
        &self, batch: ActionBatch, expected: Duration,
    ) -> Result<(), AgentError> {
        self.inner.clone().run_actions(Self::input_request(batch, expected)).await?;
        Ok(())
    }

    pub async fn read_clipboard(&self) -> Result<String, AgentError> {
        let request = Self::input_request(Empty {}, Duration::ZERO);
        Ok(self.inner.clone().read_clipboard(request).await?.into_inner().text)
    }

    pub async fn write_clipboard(&self, text: String) -> Result<(), AgentError> {
        let request = Self::input_request(ClipboardText { text }, Duration::ZERO);
        self.inner.clone().write_clipboard(request).await?;
        Ok(())
    }

    pub async fn set_cursor_visibility(&self, hidden: bool) -> Result<(), AgentError> {
        let request = Self::input_request(CursorVisibility { hidden }, Duration::ZERO);
        self.inner.clone().set_cursor_visibility(request).await?;
        Ok(())
    }

    /// Resizes the screen and Chromium's windows (headful browsers).
    pub async fn resize_screen(&self, width: u32, height: u32) -> Result<(), AgentError> {
        let request = Self::input_request(ScreenSize { width, height }, Duration::ZERO);
        self.inner.clone().resize_screen(request).await?;
        Ok(())
    }

    pub async fn scroll(&self, request: ScrollRequest) -> Result<(), AgentError> {
        self.inner.clone().scroll(Self::input_request(request, Duration::ZERO)).await?;
        Ok(())
    }

    pub async fn screenshot(&self, request: ScreenshotRequest) -> Result<Vec<u8>, AgentError> {
        let request = Self::input_request(request, Duration::ZERO);
        Ok(self.inner.clone().screenshot(request).await?.into_inner().png)
    }

    /// Chromium restarts during this call; it answers when the new DevTools answers.
    pub async fn load_extensions(
        &self, chunks: mpsc::Receiver<ExtensionUploadChunk>,
    ) -> Result<LoadExtensionsResponse, AgentError> {
        Ok(self.inner.clone().load_extensions(ReceiverStream::new(chunks)).await?.into_inner())
    }

    /// Stops Chromium for good (a clean exit) and streams its profile as a ZIP.
    pub async fn export_profile(&self) -> Result<Streaming<DataChunk>, AgentError> {
        let mut request = tonic::Request::new(Empty {});
        request.set_timeout(Duration::from_secs(120));
        Ok(self.inner.clone().export_profile(request).await?.into_inner())
    }

    /// Restarts Chromium cleanly with another timezone and locale (`None`: the VM's
    /// default), reopening its pages; answers once it is ready again.
    pub async fn relaunch(
        &self, timezone: Option<&str>, locale: Option<&str>,
    ) -> Result<(), AgentError> {
        let mut request = tonic::Request::new(RelaunchRequest {
            timezone: timezone.unwrap_or_default().to_owned(),
            locale: locale.unwrap_or_default().to_owned(),
        });
        request.set_timeout(Duration::from_secs(60));
        self.inner.clone().relaunch(request).await?;
        Ok(())
    }

    /// Loads a stored profile (its ZIP) into a browser that has none: Chromium restarts
    /// with it. Answers once it is ready again.
    pub async fn load_profile(&self, archive: tokio::fs::File) -> Result<(), AgentError> {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tokio_stream::StreamExt;
        // A read error ends the stream without `commit`, which changes nothing.
        let failed = std::sync::Arc::new(AtomicBool::new(false));
        let read_failed = failed.clone();
        let chunks = tokio_util::io::ReaderStream::with_capacity(archive, 256 * 1024)
            .map_while(move |chunk| match chunk {
                Ok(data) => {
                    Some(ProfileChunk { kind: Some(profile_chunk::Kind::Data(data.to_vec())) })
                }
                Err(error) => {
                    tracing::warn!(%error, "reading a profile archive failed");
                    read_failed.store(true, Ordering::Relaxed);
                    None
                }
            })
            .chain(futures::stream::once(async move {
                ProfileChunk {
                    kind: (!failed.load(Ordering::Relaxed))
                        .then_some(profile_chunk::Kind::Commit(Empty {})),
                }
            }));
        let mut request = tonic::Request::new(chunks);
        request.set_timeout(Duration::from_secs(120));
        self.inner.clone().load_profile(request).await?;
        Ok(())
    }

    /// Runs a command in the VM to its end (or its timeout).
    pub async fn exec_process(&self, request: ProcessRequest) -> Result<ExecResult, AgentError> {
        // The agent enforces the timeout; the call waits a little longer for its answer.
        let timeout = Duration::from_secs(if request.timeout_sec == 0 {
            60
        } else {
            request.timeout_sec.into()
        });
        let request = Self::input_request(request, timeout);
        Ok(self.inner.clone().exec_process(request).await?.into_inner())
    }

    pub async fn spawn_process(&self, request: SpawnRequest) -> Result<SpawnResult, AgentError> {
        let request = Self::input_request(request, Duration::ZERO);
        Ok(self.inner.clone().spawn_process(request).await?.into_inner())
    }

    pub async fn get_process(&self, process_id: String) -> Result<ProcessState, AgentError> {
        let request = Self::input_request(ProcessRef { process_id }, Duration::ZERO);
        Ok(self.inner.clone().get_process(request).await?.into_inner())
    }

    pub async fn write_stdin(&self, process_id: String, data: Vec<u8>) -> Result<u64, AgentError> {
        // A process that reads slowly may hold the write back a while.
        let request =
            Self::input_request(StdinRequest { process_id, data }, Duration::from_secs(30));
        Ok(self.inner.clone().write_stdin(request).await?.into_inner().written)
    }

    /// A file of the VM root (`path`), or a service's log (`service`), line by line.
    pub async fn follow_file(
        &self, path: String, service: String, follow: bool,
    ) -> Result<Streaming<LogLine>, AgentError> {
        Ok(self
            .inner
            .clone()
            .follow_file(FollowFileRequest { path, follow, service })
            .await?
            .into_inner())
    }

    /// The process's kept output, then live output, then its exit code.
    pub async fn stream_output(
        &self, process_id: String,
    ) -> Result<Streaming<OutputChunk>, AgentError> {
        Ok(self.inner.clone().stream_output(ProcessRef { process_id }).await?.into_inner())
    }

    pub async fn signal_process(
        &self, process_id: String, signal: String,
    ) -> Result<(), AgentError> {
        let request = Self::input_request(SignalRequest { process_id, signal }, Duration::ZERO);
        self.inner.clone().signal_process(request).await?;
        Ok(())
    }

    pub async fn resize_terminal(&self, request: ResizeTerminalRequest) -> Result<(), AgentError> {
        let request = Self::input_request(request, Duration::ZERO);
        self.inner.clone().resize_terminal(request).await?;
        Ok(())
    }

    /// Runs Playwright code in one of the VM's executors. The agent enforces the
    /// timeout; the call also allows for calls queued before it on that executor.
    pub async fn playwright_execute(
        &self, request: PlaywrightRequest,
    ) -> Result<PlaywrightResult, AgentError> {
        let expected =
            Duration::from_millis(request.timeout_ms.into()) + PLAYWRIGHT_QUEUE_ALLOWANCE;
        let request = Self::input_request(request, expected);
        Ok(self.inner.clone().playwright_execute(request).await?.into_inner())
    }

    /// An HTTP request made by the browser itself; the agent enforces the timeout.
    pub async fn curl(&self, request: CurlRequest) -> Result<CurlResult, AgentError> {
        let expected = Duration::from_millis(request.timeout_ms.into());
        let request = Self::input_request(request, expected);
        Ok(self.inner.clone().curl(request).await?.into_inner())
    }

    /// Evaluates code in the VM's REPL; the agent enforces the timeout, and the call
    /// allows for calls queued before it.
    pub async fn repl(&self, request: ReplRequest) -> Result<ReplResult, AgentError> {
        let expected =
            Duration::from_millis(request.timeout_ms.into()) + PLAYWRIGHT_QUEUE_ALLOWANCE;
        let request = Self::input_request(request, expected);
        Ok(self.inner.clone().repl(request).await?.into_inner())
    }

    pub async fn list_executors(&self) -> Result<ExecutorList, AgentError> {
        let request = Self::input_request(Empty {}, Duration::ZERO);
        Ok(self.inner.clone().list_executors(request).await?.into_inner())
    }

    pub async fn delete_executor(&self, name: String, close_tab: bool) -> Result<(), AgentError> {
        let request =
            Self::input_request(DeleteExecutorRequest { name, close_tab }, Duration::ZERO);
        self.inner.clone().delete_executor(request).await?;
        Ok(())
    }

    /// Which CDP categories the VM's telemetry monitor captures.
    pub async fn set_telemetry(&self, capture: TelemetryCapture) -> Result<(), AgentError> {
        self.inner.clone().set_telemetry(capture).await?;
        Ok(())
    }

    /// The VM's buffered telemetry, then its live events.
    pub async fn telemetry_events(&self) -> Result<Streaming<TelemetryRecord>, AgentError> {
        Ok(self.inner.clone().telemetry_events(Empty {}).await?.into_inner())
    }

    /// Restarts Chromium with a fresh profile; answers once it is ready again.
    pub async fn reset_browser(&self) -> Result<(), AgentError> {
        let mut request = tonic::Request::new(Empty {});
        request.set_timeout(Duration::from_secs(45));
        self.inner.clone().reset_browser(request).await?;
        Ok(())
    }

    /// Answers once the first frame is captured.
    pub async fn start_recording(
        &self, recording_id: &str, framerate: u32, max_duration_seconds: u32, record_audio: bool,
    ) -> Result<RecordingInfo, AgentError> {
        let mut request = tonic::Request::new(StartRecordingRequest {
            recording_id: recording_id.to_owned(),
            framerate,
            max_duration_seconds,
            record_audio,
        });
        request.set_timeout(CALL_TIMEOUT);
        Ok(self.inner.clone().start_recording(request).await?.into_inner())
    }

    fn recording_request(
        recording_id: &str, timeout: Duration,
    ) -> tonic::Request<RecordingRequest> {
        let mut request =
            tonic::Request::new(RecordingRequest { recording_id: recording_id.to_owned() });
        request.set_timeout(timeout);
        request
    }

    /// Ends the recording and waits until its file is final.
    pub async fn stop_recording(&self, recording_id: &str) -> Result<RecordingInfo, AgentError> {
        let request = Self::recording_request(recording_id, FINALIZE_TIMEOUT);
        Ok(self.inner.clone().stop_recording(request).await?.into_inner())
    }

    pub async fn read_recording(
        &self, recording_id: &str,
    ) -> Result<Streaming<DataChunk>, AgentError> {
        let request =
            tonic::Request::new(RecordingRequest { recording_id: recording_id.to_owned() });
        Ok(self.inner.clone().read_recording(request).await?.into_inner())
    }

    pub async fn delete_recording(&self, recording_id: &str) -> Result<(), AgentError> {
        let request = Self::recording_request(recording_id, CALL_TIMEOUT);
        self.inner.clone().delete_recording(request).await?;
        Ok(())
    }
}
