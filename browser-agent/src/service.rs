//! The gRPC service: status, CDP tunnel, shutdown. Authentication happens in the
//! interceptor (`auth`), before any of these run.

use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use browser_agent_proto::v1::browser_agent_server::BrowserAgent;
use browser_agent_proto::v1::{
    CdpFrame, DevtoolsState, ShutdownRequest, ShutdownResponse, StatusRequest, StatusResponse,
    cdp_frame::Kind,
};
use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::cdp;
use crate::chromium::BrowserState;

const DEFAULT_WAIT: Duration = Duration::from_secs(30);

pub struct AgentService {
    pub display: Option<String>,
    pub width: u32,
    pub height: u32,
    pub vm_root: PathBuf,
    pub browser: watch::Receiver<BrowserState>,
    pub shutdown: CancellationToken,
}

impl AgentService {
    fn status_of(&self, state: &BrowserState) -> StatusResponse {
        StatusResponse {
            display: self.display.clone().unwrap_or_default(),
            screen_width: self.width,
            screen_height: self.height,
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

type CdpStream = Pin<Box<dyn Stream<Item = Result<CdpFrame, Status>> + Send>>;

#[tonic::async_trait]
impl BrowserAgent for AgentService {
    async fn status(
        &self,
        request: Request<StatusRequest>,
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
        &self,
        request: Request<Streaming<CdpFrame>>,
    ) -> Result<Response<Self::CdpTunnelStream>, Status> {
        let mut inbound = request.into_inner();
        let path = match inbound.next().await {
            Some(Ok(CdpFrame {
                kind: Some(Kind::Open(open)),
            })) => open.path,
            Some(Err(status)) => return Err(status),
            _ => {
                return Err(Status::invalid_argument(
                    "the first CDP frame must be `open`",
                ));
            }
        };
        let state = self.browser.borrow().clone();
        if state.devtools != DevtoolsState::Ready {
            return Err(Status::unavailable(
                "Chromium's DevTools endpoint is not ready",
            ));
        }
        let url = cdp::target_url(&path, state.devtools_port, &state.browser_ws_url)?;
        let (outbound, receiver) = mpsc::channel(64);
        cdp::connect(&url, inbound, outbound).await?;
        Ok(Response::new(Box::pin(ReceiverStream::new(receiver))))
    }

    async fn shutdown(
        &self,
        _request: Request<ShutdownRequest>,
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
