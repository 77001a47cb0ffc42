//! What the service's calls share: blocking work off the executor (the VM's files, the
//! display's clipboard and pointer), file streams, and the agent's status.

use std::io::Read;
use std::pin::Pin;

use browser_agent_proto::v1::{DataChunk, Empty, StatusResponse};
use futures::Stream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Response, Status};

use super::AgentService;
use crate::chromium::BrowserState;
use crate::desktop::{Desktop, DesktopError};
use crate::fs::{FsError, VmFs};
use crate::input::{Action, Input};

/// Chunk size of file data on the wire.
pub(super) const CHUNK_BYTES: usize = 256 * 1024;

/// Runs blocking filesystem work off the async executor.
pub(super) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, FsError> + Send + 'static,
) -> Result<T, Status> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| Status::internal(format!("filesystem task failed: {error}")))?
        .map_err(Status::from)
}

/// A failure of the agent's own scratch file, outside the VM root.
pub(super) fn scratch_failed(error: std::io::Error) -> FsError {
    FsError::Io { context: "scratch file".into(), source: error }
}

pub(super) type DataStream = Pin<Box<dyn Stream<Item = Result<DataChunk, Status>> + Send>>;

/// Streams a file's contents from a blocking thread.
pub(super) fn stream_file(mut file: std::fs::File) -> DataStream {
    let (sender, receiver) = mpsc::channel(8);
    tokio::task::spawn_blocking(move || {
        let mut buffer = vec![0; CHUNK_BYTES];
        loop {
            let message = match file.read(&mut buffer) {
                Ok(0) => return,
                Ok(read) => Ok(DataChunk { data: buffer[..read].to_vec() }),
                Err(error) => Err(Status::internal(format!("reading failed: {error}"))),
            };
            let failed = message.is_err();
            if sender.blocking_send(message).is_err() || failed {
                return;
            }
        }
    });
    Box::pin(ReceiverStream::new(receiver))
}

impl AgentService {
    pub(super) fn input(&self) -> Result<&Input, Status> {
        self.input.as_ref().ok_or_else(|| {
            Status::failed_precondition(
                "this browser is headless: it has no display for computer controls",
            )
        })
    }

    /// Runs blocking work on the VM's filesystem off the async executor.
    pub(super) async fn on_fs<T: Send + 'static>(
        &self, work: impl FnOnce(&VmFs) -> Result<T, FsError> + Send + 'static,
    ) -> Result<T, Status> {
        let fs = self.fs.clone();
        blocking(move || work(&fs)).await
    }

    /// Runs blocking work on the display's clipboard or pointer off the async executor.
    pub(super) async fn on_desktop<T: Send + 'static>(
        &self, work: impl FnOnce(&Desktop) -> Result<T, DesktopError> + Send + 'static,
    ) -> Result<T, Status> {
        self.input()?;
        let desktop = self
            .desktop
            .clone()
            .ok_or_else(|| Status::failed_precondition("this browser has no display"))?;
        tokio::task::spawn_blocking(move || work(&desktop))
            .await
            .map_err(|error| Status::internal(format!("desktop task failed: {error}")))?
            .map_err(|error| Status::internal(error.to_string()))
    }

    pub(super) async fn act(&self, action: Action) -> Result<Response<Empty>, Status> {
        self.input()?.run(action).await?;
        Ok(Response::new(Empty {}))
    }

    pub(super) fn status_of(&self, state: &BrowserState) -> StatusResponse {
        StatusResponse {
            display: self.display.clone().unwrap_or_default(),
            screen_width: self.screen.size().0,
            screen_height: self.screen.size().1,
            headless: self.display.is_none(),
            chromium_pid: state.pid,
            devtools_state: state.devtools as i32,
            devtools_browser_url: state.browser_ws_url.clone(),
            chromium_restarts: state.restarts,
            last_chromium_exit: state.last_exit.clone(),
            agent_pid: std::process::id(),
            vm_root: self.vm_root.display().to_string(),
        }
    }
}
