//! The gRPC service: status, CDP tunnel, shutdown. Authentication happens in the
//! interceptor (`auth`), before any of these run.

use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use browser_agent_proto::v1::browser_agent_server::BrowserAgent;
use browser_agent_proto::v1::{
    ActionBatch, CdpFrame, ClickMouseRequest, ClipboardText, CreateDirectoryRequest, CurlRequest,
    CurlResult, CursorVisibility, DeleteExecutorRequest, DeletePathRequest, DevtoolsState,
    DragMouseRequest, Empty, ExecResult, ExecutorList, ExtensionUploadChunk, ExtractZipChunk,
    ExtractZipResponse, FileInfo, FileList, FollowFileRequest, LoadExtensionsResponse, LogLine,
    MoveMouseRequest, MovePathRequest, PathRequest, PlaywrightRequest, PlaywrightResult, Point,
    PressKeysRequest, ProcessRef, ProcessRequest, ProcessState, ProfileChunk, RecordingRequest,
    RelaunchRequest, ReplRequest, ReplResult, ResizeTerminalRequest, ScreenSize, ScreenshotRequest,
    ScreenshotResponse, ScrollRequest, SetPermissionsRequest, ShutdownRequest, ShutdownResponse,
    SignalRequest, SpawnRequest, SpawnResult, StartRecordingRequest, StatusRequest, StatusResponse,
    StdinRequest, StdinResult, TelemetryCapture, TelemetryRecord, TypeTextRequest, WatchEvent,
    WatchRequest, WriteFileChunk, cdp_frame::Kind, extract_zip_chunk, write_file_chunk,
};
use futures::{Stream, StreamExt};
use std::io::Seek;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

mod browser;
mod extensions;
mod live;
mod playwright;
mod processes;
mod status;
mod support;
mod webmcp;

use processes::{OutputStream, terminal_side};
use status::recording_info;
use support::{DataStream, blocking, scratch_failed, stream_file};

use crate::actions;
use crate::capture;
use crate::cdp;
use crate::chromium::{BrowserState, Relaunch};
use crate::desktop::Desktop;
use crate::dir_watch;
use crate::extensions::Extensions;
use crate::fs::{VmFs, ZipLimits};
use crate::input::{Action, Input};
use crate::playwright::{Executors, Repl};
use crate::processes::Processes;
use crate::recording::Recordings;
use crate::screen::Screen;
use crate::upload::{Part, spool};
use crate::webdriver::{self, WebDriver};

const DEFAULT_WAIT: Duration = Duration::from_secs(30);

pub struct AgentService {
    /// `None` for headless browsers, which have no display.
    pub input: Option<Input>,
    /// The display's clipboard and pointer; `None` for headless browsers.
    pub desktop: Option<Arc<Desktop>>,
    pub display: Option<String>,
    pub screen: Arc<Screen>,
    pub vm_root: PathBuf,
    pub browser: watch::Receiver<BrowserState>,
    pub shutdown: CancellationToken,
    pub fs: Arc<VmFs>,
    pub zip_limits: ZipLimits,
    pub extensions: Arc<Extensions>,
    /// Where uploads wait before extraction (outside the VM root).
    pub scratch_dir: PathBuf,
    pub recordings: Arc<Recordings>,
    /// Bumped to restart Chromium with a fresh profile.
    pub resets: watch::Sender<u64>,
    /// Changed to restart Chromium with other settings.
    pub relaunches: watch::Sender<Relaunch>,
    /// Commands run in the VM on request.
    pub processes: Arc<Processes>,
    /// Users' Playwright code, run next to the browser.
    pub executors: Arc<Executors>,
    /// The browser's JavaScript REPL.
    pub repl: Arc<Repl>,
    /// WebDriver BiDi (chromedriver attached to the browser).
    pub webdriver: Arc<WebDriver>,
    /// The display's live view encoder; `None` for headless browsers.
    pub live: Option<Arc<crate::live::LiveView>>,
    /// Set to stop Chromium for good (a clean exit), before exporting its profile.
    pub stop_chromium: watch::Sender<bool>,
    /// What the browser's telemetry captures, and the events waiting to be read.
    pub telemetry: Arc<crate::telemetry::Telemetry>,
    /// Numbers for the tabs and frames WebMCP tools are listed from.
    pub webmcp_numbering: crate::webmcp::Numbering,
    /// The custom WebMCP tools callers defined for this browser.
    pub webmcp_custom: crate::webmcp::CustomTools,
}

type CdpStream = Pin<Box<dyn Stream<Item = Result<CdpFrame, Status>> + Send>>;

#[tonic::async_trait]
impl BrowserAgent for AgentService {
    async fn status(
        &self, request: Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        let request = request.into_inner();
        let mut browser = self.browser.clone();
        if request.wait_until_ready {
            let wait = match request.wait_timeout_ms {
                0 => DEFAULT_WAIT,
                ms => Duration::from_millis(ms.into()),
            };
            let settled = browser.wait_for(|s| s.devtools != DevtoolsState::Starting);
            // On timeout we answer the current (still starting) state; the caller decides.
            let _ = tokio::time::timeout(wait, settled).await;
        }
        let state = browser.borrow().clone();
        Ok(Response::new(self.status_of(&state)))
    }

    type CdpTunnelStream = CdpStream;

    async fn cdp_tunnel(
        &self, request: Request<Streaming<CdpFrame>>,
    ) -> Result<Response<Self::CdpTunnelStream>, Status> {
        let mut inbound = request.into_inner();
        let path = match inbound.next().await {
            Some(Ok(CdpFrame { kind: Some(Kind::Open(open)) })) => open.path,
            Some(Err(status)) => return Err(status),
            _ => {
                return Err(Status::invalid_argument("the first CDP frame must be `open`"));
            }
        };
        let state = self.browser.borrow().clone();
        if state.devtools != DevtoolsState::Ready {
            return Err(Status::unavailable("Chromium's DevTools endpoint is not ready"));
        }
        let (outbound, receiver) = mpsc::channel(64);
        if path == webdriver::TUNNEL_PATH {
            let url = self.webdriver.endpoint().await.map_err(Status::unavailable)?;
            let port = state.devtools_port;
            let attach = move |message| webdriver::attach_sessions_to(port, message);
            cdp::connect(&url, inbound, outbound, Some(Box::new(attach))).await?;
        } else {
            let url = cdp::target_url(&path, state.devtools_port, &state.browser_ws_url)?;
            cdp::connect(&url, inbound, outbound, None).await?;
        }
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn move_path(
        &self, request: Request<MovePathRequest>,
    ) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        self.on_fs(move |fs| fs.move_path(&request.src_path, &request.dest_path)).await?;
        Ok(Response::new(Empty {}))
    }

    async fn stat_path(&self, request: Request<PathRequest>) -> Result<Response<FileInfo>, Status> {
        let path = request.into_inner().path;
        Ok(Response::new(self.on_fs(move |fs| fs.stat(&path)).await?))
    }

    async fn list_directory(
        &self, request: Request<PathRequest>,
    ) -> Result<Response<FileList>, Status> {
        let path = request.into_inner().path;
        let files = self.on_fs(move |fs| fs.list(&path)).await?;
        Ok(Response::new(FileList { files }))
    }

    type ReadFileStream = DataStream;

    async fn read_file(
        &self, request: Request<PathRequest>,
    ) -> Result<Response<DataStream>, Status> {
        let path = request.into_inner().path;
        let file = self.on_fs(move |fs| fs.open_for_reading(&path)).await?;
        Ok(Response::new(stream_file(file)))
    }

    async fn write_file(
        &self, request: Request<Streaming<WriteFileChunk>>,
    ) -> Result<Response<Empty>, Status> {
        let mut chunks = request.into_inner();
        let target = match chunks.next().await {
            Some(Ok(WriteFileChunk { kind: Some(write_file_chunk::Kind::Target(target)) })) => {
                target
            }
            Some(Err(status)) => return Err(status),
            _ => {
                return Err(Status::invalid_argument("the first message must name the target"));
            }
        };
        let mode = if target.mode == 0 { 0o644 } else { target.mode };
        let path = target.path.clone();
        let pending = self.on_fs(move |fs| fs.begin_write(&path, mode)).await?;
        let internal = |error: std::io::Error| Status::internal(error.to_string());
        let written = async {
            let mut out = tokio::fs::File::from_std(pending.file.try_clone().map_err(internal)?);
            spool(&mut chunks, &mut out, |chunk| match chunk.kind {
                Some(write_file_chunk::Kind::Data(data)) => Ok(Part::Data(data)),
                Some(write_file_chunk::Kind::Commit(_)) => Ok(Part::Done(())),
                _ => Err(Status::invalid_argument("unexpected message after the target")),
            })
            .await
            .map_err(|error| error.into_status("the stream ended without commit", internal))?;
            out.flush().await.map_err(internal)
        }
        .await;
        match written {
            Ok(()) => self.on_fs(move |fs| fs.commit_write(pending)).await?,
            Err(status) => {
                // Dropping the pending write removes its temporary file.
                tokio::task::spawn_blocking(move || drop(pending));
                // Whatever went wrong, the call is aborted; only its message is kept.
                return Err(Status::aborted(format!(
                    "the upload did not complete: {}",
                    status.message()
                )));
            }
        }
        Ok(Response::new(Empty {}))
    }

    async fn create_directory(
        &self, request: Request<CreateDirectoryRequest>,
    ) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        let mode = if request.mode == 0 { 0o755 } else { request.mode };
        self.on_fs(move |fs| fs.create_directory(&request.path, mode)).await?;
        Ok(Response::new(Empty {}))
    }

    async fn delete_path(
        &self, request: Request<DeletePathRequest>,
    ) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        self.on_fs(move |fs| fs.delete(&request.path, request.directory)).await?;
        Ok(Response::new(Empty {}))
    }

    async fn set_permissions(
        &self, request: Request<SetPermissionsRequest>,
    ) -> Result<Response<Empty>, Status> {
        let r = request.into_inner();
        self.on_fs(move |fs| fs.set_permissions(&r.path, r.mode, &r.owner, &r.group)).await?;
        Ok(Response::new(Empty {}))
    }

    async fn extract_zip(
        &self, request: Request<Streaming<ExtractZipChunk>>,
    ) -> Result<Response<ExtractZipResponse>, Status> {
        let mut chunks = request.into_inner();
        // The archive waits in a scratch file outside the VM root, never whole in memory.
        let scratch = tempfile::tempfile_in(&self.scratch_dir).map_err(|error| {
            Status::internal(format!("creating a scratch file failed: {error}"))
        })?;
        let mut out = tokio::fs::File::from_std(
            scratch.try_clone().map_err(|error| Status::internal(error.to_string()))?,
        );
        let dest_path = spool(&mut chunks, &mut out, |chunk| {
            Ok(match chunk.kind {
                Some(extract_zip_chunk::Kind::Data(data)) => Part::Data(data),
                Some(extract_zip_chunk::Kind::Finish(finish)) => Part::Done(finish.dest_path),
                None => Part::Skip,
            })
        })
        .await
        .map_err(|error| {
            error.into_status("the upload ended without a destination", |error| {
                Status::internal(format!("buffering the upload failed: {error}"))
            })
        })?;
        out.flush().await.map_err(|error| Status::internal(error.to_string()))?;
        drop(out);
        let limits = self.zip_limits;
        let (files, bytes) = self
            .on_fs(move |fs| {
                let mut archive = scratch;
                archive.rewind().map_err(scratch_failed)?;
                fs.extract_zip(std::io::BufReader::new(archive), &dest_path, limits)
            })
            .await?;
        Ok(Response::new(ExtractZipResponse { files, bytes }))
    }

    type ZipDirectoryStream = DataStream;

    async fn zip_directory(
        &self, request: Request<PathRequest>,
    ) -> Result<Response<DataStream>, Status> {
        let (path, scratch_dir) = (request.into_inner().path, self.scratch_dir.clone());
        let archive = self
            .on_fs(move |fs| {
                let scratch = tempfile::tempfile_in(&scratch_dir).map_err(scratch_failed)?;
                let mut archive = fs.zip_directory(&path, scratch)?;
                archive.rewind().map_err(scratch_failed)?;
                Ok(archive)
            })
            .await?;
        Ok(Response::new(stream_file(archive)))
    }

    type WatchDirectoryStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send>>;

    async fn watch_directory(
        &self, request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchDirectoryStream>, Status> {
        let WatchRequest { path, recursive } = request.into_inner();
        let root = self.vm_root.clone();
        let watched = path.clone();
        let dir_watch::Watch { watcher, events } =
            blocking(move || dir_watch::start(&root, &watched, recursive)).await?;
        let started = WatchEvent { kind: "STARTED".into(), path, ..Default::default() };
        // The watcher lives as long as the stream: dropping the stream ends the watch.
        let changes =
            futures::stream::unfold((watcher, events), |(watcher, mut events)| async move {
                let event = events.recv().await?;
                Some((Ok(event), (watcher, events)))
            });
        let stream = futures::stream::once(async move { Ok(started) }).chain(changes);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn click_mouse(
        &self, request: Request<ClickMouseRequest>,
    ) -> Result<Response<Empty>, Status> {
        self.act(actions::click(request.into_inner())?).await
    }

    async fn move_mouse(
        &self, request: Request<MoveMouseRequest>,
    ) -> Result<Response<Empty>, Status> {
        self.act(actions::move_to(request.into_inner())?).await
    }

    async fn drag_mouse(
        &self, request: Request<DragMouseRequest>,
    ) -> Result<Response<Empty>, Status> {
        self.act(actions::drag(request.into_inner())?).await
    }

    async fn get_mouse_position(
        &self, _request: Request<Empty>,
    ) -> Result<Response<Point>, Status> {
        let (x, y) = self.input()?.run(Action::Position).await?;
        Ok(Response::new(Point { x, y }))
    }

    async fn type_text(
        &self, request: Request<TypeTextRequest>,
    ) -> Result<Response<Empty>, Status> {
        self.act(actions::type_text(request.into_inner())).await
    }

    async fn press_keys(
        &self, request: Request<PressKeysRequest>,
    ) -> Result<Response<Empty>, Status> {
        self.act(actions::press_keys(request.into_inner())?).await
    }

    async fn scroll(&self, request: Request<ScrollRequest>) -> Result<Response<Empty>, Status> {
        self.act(actions::scroll(request.into_inner())?).await
    }

    async fn read_clipboard(
        &self, _request: Request<Empty>,
    ) -> Result<Response<ClipboardText>, Status> {
        let text = self.on_desktop(|desktop| desktop.read_clipboard()).await?;
        Ok(Response::new(ClipboardText { text }))
    }

    async fn write_clipboard(
        &self, request: Request<ClipboardText>,
    ) -> Result<Response<Empty>, Status> {
        let text = request.into_inner().text;
        self.on_desktop(move |desktop| desktop.write_clipboard(&text)).await?;
        Ok(Response::new(Empty {}))
    }

    async fn set_cursor_visibility(
        &self, request: Request<CursorVisibility>,
    ) -> Result<Response<Empty>, Status> {
        let hidden = request.into_inner().hidden;
        self.on_desktop(move |desktop| desktop.set_cursor_hidden(hidden)).await?;
        Ok(Response::new(Empty {}))
    }

    async fn run_actions(&self, request: Request<ActionBatch>) -> Result<Response<Empty>, Status> {
        let desktop = self
            .desktop
            .as_ref()
            .ok_or_else(|| Status::failed_precondition("this browser has no display"))?;
        actions::run_batch(self.input()?, desktop, request.into_inner()).await?;
        Ok(Response::new(Empty {}))
    }

    async fn resize_screen(&self, request: Request<ScreenSize>) -> Result<Response<Empty>, Status> {
        let ScreenSize { width, height } = request.into_inner();
        let (screen, recordings) = (self.screen.clone(), self.recordings.clone());
        tokio::task::spawn_blocking(move || {
            recordings.while_none_capture(|| screen.resize(width, height))
        })
        .await
        .map_err(|error| Status::internal(format!("resize task failed: {error}")))???;
        Ok(Response::new(Empty {}))
    }

    async fn screenshot(
        &self, request: Request<ScreenshotRequest>,
    ) -> Result<Response<ScreenshotResponse>, Status> {
        self.input()?;
        let display = self.display.clone().unwrap_or_default();
        let region = request.into_inner().region.map(|r| (r.x, r.y, r.width, r.height));
        let screen = self.screen.size();
        let png =
            tokio::task::spawn_blocking(move || capture::screenshot(&display, region, screen))
                .await
                .map_err(|error| Status::internal(format!("capture task failed: {error}")))??;
        Ok(Response::new(ScreenshotResponse { png }))
    }

    async fn start_recording(
        &self, request: Request<StartRecordingRequest>,
    ) -> Result<Response<browser_agent_proto::v1::RecordingInfo>, Status> {
        let request = request.into_inner();
        let info = self
            .recordings
            .start(
                &request.recording_id,
                request.framerate,
                Duration::from_secs(request.max_duration_seconds.into()),
                request.record_audio,
            )
            .await?;
        Ok(Response::new(recording_info(info)))
    }

    async fn stop_recording(
        &self, request: Request<RecordingRequest>,
    ) -> Result<Response<browser_agent_proto::v1::RecordingInfo>, Status> {
        let info = self.recordings.stop(&request.into_inner().recording_id).await?;
        Ok(Response::new(recording_info(info)))
    }

    async fn get_recording(
        &self, request: Request<RecordingRequest>,
    ) -> Result<Response<browser_agent_proto::v1::RecordingInfo>, Status> {
        let info = self.recordings.info(&request.into_inner().recording_id)?;
        Ok(Response::new(recording_info(info)))
    }

    type ReadRecordingStream = DataStream;

    async fn read_recording(
        &self, request: Request<RecordingRequest>,
    ) -> Result<Response<Self::ReadRecordingStream>, Status> {
        let file = self.recordings.open(&request.into_inner().recording_id)?;
        Ok(Response::new(stream_file(file)))
    }

    async fn delete_recording(
        &self, request: Request<RecordingRequest>,
    ) -> Result<Response<Empty>, Status> {
        self.recordings.delete(&request.into_inner().recording_id)?;
        Ok(Response::new(Empty {}))
    }

    async fn reset_browser(&self, _: Request<Empty>) -> Result<Response<Empty>, Status> {
        self.reset().await?;
        Ok(Response::new(Empty {}))
    }

    async fn relaunch(&self, request: Request<RelaunchRequest>) -> Result<Response<Empty>, Status> {
        self.relaunch_in(request.into_inner()).await?;
        Ok(Response::new(Empty {}))
    }

    async fn load_profile(
        &self, request: Request<Streaming<ProfileChunk>>,
    ) -> Result<Response<Empty>, Status> {
        self.load_profile_from(request.into_inner()).await?;
        Ok(Response::new(Empty {}))
    }

    async fn exec_process(
        &self, request: Request<ProcessRequest>,
    ) -> Result<Response<ExecResult>, Status> {
        Ok(Response::new(self.exec_in_vm(request.into_inner()).await?))
    }

    async fn spawn_process(
        &self, request: Request<SpawnRequest>,
    ) -> Result<Response<SpawnResult>, Status> {
        Ok(Response::new(self.spawn_in_vm(request.into_inner()).await?))
    }

    async fn get_process(
        &self, request: Request<ProcessRef>,
    ) -> Result<Response<ProcessState>, Status> {
        Ok(Response::new(self.process_state(&request.into_inner().process_id)?))
    }

    async fn write_stdin(
        &self, request: Request<StdinRequest>,
    ) -> Result<Response<StdinResult>, Status> {
        Ok(Response::new(self.stdin_of(request.into_inner()).await?))
    }

    type StreamOutputStream = OutputStream;

    async fn stream_output(
        &self, request: Request<ProcessRef>,
    ) -> Result<Response<OutputStream>, Status> {
        Ok(Response::new(self.output_of(&request.into_inner().process_id)?))
    }

    async fn signal_process(
        &self, request: Request<SignalRequest>,
    ) -> Result<Response<Empty>, Status> {
        self.signal_in_vm(request.into_inner())?;
        Ok(Response::new(Empty {}))
    }

    type FollowFileStream = Pin<Box<dyn Stream<Item = Result<LogLine, Status>> + Send>>;

    async fn follow_file(
        &self, request: Request<FollowFileRequest>,
    ) -> Result<Response<Self::FollowFileStream>, Status> {
        let FollowFileRequest { path, follow, service } = request.into_inner();
        let file = if service.is_empty() {
            self.on_fs(move |fs| fs.open_for_reading(&path)).await?
        } else {
            let log = crate::service_logs::path(&service).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "supervisor_process must be one of {}, got {service:?}",
                    crate::service_logs::SERVICES.join(", ")
                ))
            })?;
            // Created empty if the service has written nothing yet.
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .and_then(|_| std::fs::File::open(&log))
                .map_err(|error| Status::internal(format!("opening the {service} log: {error}")))?
        };
        let lines = crate::logs::follow_file(file, follow, self.shutdown.clone());
        let lines = tokio_stream::wrappers::ReceiverStream::new(lines)
            .map(|(message, unix_ms)| Ok(LogLine { message, unix_ms }));
        Ok(Response::new(Box::pin(lines)))
    }

    async fn resize_terminal(
        &self, request: Request<ResizeTerminalRequest>,
    ) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        let (cols, rows) = (terminal_side(request.cols)?, terminal_side(request.rows)?);
        self.processes.spawned(&request.process_id)?.resize(cols, rows)?;
        Ok(Response::new(Empty {}))
    }

    type ExportProfileStream = DataStream;

    async fn export_profile(&self, _: Request<Empty>) -> Result<Response<DataStream>, Status> {
        Ok(Response::new(self.stop_and_export_profile().await?))
    }

    async fn load_extensions(
        &self, request: Request<Streaming<ExtensionUploadChunk>>,
    ) -> Result<Response<LoadExtensionsResponse>, Status> {
        Ok(Response::new(self.load_extensions_from(request.into_inner()).await?))
    }

    async fn playwright_execute(
        &self, request: Request<PlaywrightRequest>,
    ) -> Result<Response<PlaywrightResult>, Status> {
        Ok(Response::new(self.execute_playwright(request.into_inner()).await?))
    }

    async fn list_executors(&self, _: Request<Empty>) -> Result<Response<ExecutorList>, Status> {
        Ok(Response::new(self.executor_list().await))
    }

    async fn repl(&self, request: Request<ReplRequest>) -> Result<Response<ReplResult>, Status> {
        Ok(Response::new(self.repl_eval(request.into_inner()).await?))
    }

    async fn list_webmcp_tools(
        &self, request: Request<browser_agent_proto::v1::WebmcpToolsRequest>,
    ) -> Result<Response<browser_agent_proto::v1::WebmcpTools>, Status> {
        Ok(Response::new(self.webmcp_tools(request.into_inner()).await?))
    }

    async fn add_webmcp_custom_tools(
        &self, request: Request<browser_agent_proto::v1::AddCustomToolsRequest>,
    ) -> Result<Response<browser_agent_proto::v1::CustomTools>, Status> {
        Ok(Response::new(self.webmcp_add_custom(request.into_inner()).await?))
    }

    async fn list_webmcp_custom_tools(
        &self, _: Request<Empty>,
    ) -> Result<Response<browser_agent_proto::v1::CustomTools>, Status> {
        Ok(Response::new(self.webmcp_custom_tools()))
    }

    async fn remove_webmcp_custom_tool(
        &self, request: Request<browser_agent_proto::v1::CustomToolRef>,
    ) -> Result<Response<Empty>, Status> {
        self.webmcp_remove_custom(&request.into_inner().id)?;
        Ok(Response::new(Empty {}))
    }

    async fn invoke_webmcp_tool(
        &self, request: Request<browser_agent_proto::v1::WebmcpInvocation>,
    ) -> Result<Response<browser_agent_proto::v1::WebmcpResult>, Status> {
        Ok(Response::new(self.webmcp_invoke(request.into_inner()).await?))
    }

    async fn curl(&self, request: Request<CurlRequest>) -> Result<Response<CurlResult>, Status> {
        Ok(Response::new(self.browser_curl(request.into_inner()).await?))
    }

    async fn delete_executor(
        &self, request: Request<DeleteExecutorRequest>,
    ) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        self.executors.delete(&request.name, request.close_tab).await?;
        Ok(Response::new(Empty {}))
    }

    type LiveViewStream = live::LiveStream;

    async fn live_view(
        &self, request: Request<Streaming<browser_agent_proto::v1::LiveViewInput>>,
    ) -> Result<Response<Self::LiveViewStream>, Status> {
        let (Some(view), Some(desktop)) = (&self.live, &self.desktop) else {
            return Err(Status::failed_precondition(
                "this browser is headless: it has no display to view",
            ));
        };
        let stream =
            live::open(view.clone(), self.input()?.clone(), desktop.clone(), request.into_inner())
                .await?;
        Ok(Response::new(stream))
    }

    async fn set_telemetry(
        &self, request: Request<TelemetryCapture>,
    ) -> Result<Response<Empty>, Status> {
        let capture = request.into_inner();
        self.telemetry.set_capture(capture);
        self.telemetry.until_applied(&capture, Duration::from_secs(3)).await;
        Ok(Response::new(Empty {}))
    }

    type TelemetryEventsStream =
        Pin<Box<dyn Stream<Item = Result<TelemetryRecord, Status>> + Send>>;

    async fn telemetry_events(
        &self, _request: Request<Empty>,
    ) -> Result<Response<Self::TelemetryEventsStream>, Status> {
        let (sender, receiver) = mpsc::channel(256);
        tokio::spawn(crate::telemetry::forward(self.telemetry.clone(), sender));
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver).map(Ok))))
    }

    async fn shutdown(
        &self, _request: Request<ShutdownRequest>,
    ) -> Result<Response<ShutdownResponse>, Status> {
        tracing::info!("shutdown requested by the control plane");
        let shutdown = self.shutdown.clone();
        // Let this response leave before the server stops.
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            shutdown.cancel();
        });
        Ok(Response::new(ShutdownResponse {}))
    }
}
