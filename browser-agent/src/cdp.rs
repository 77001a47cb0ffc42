//! The agent's end of the CDP tunnel: gRPC frames from the control plane on one side,
//! one of Chromium's DevTools WebSockets (or chromedriver's WebDriver BiDi one) on the
//! other.

use browser_agent_proto::v1::{CdpClose, CdpFrame, cdp_frame::Kind};
use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tonic::{Status, Streaming};

/// CDP messages can be large (full-page screenshots, big DOM snapshots).
pub const MAX_CDP_MESSAGE_BYTES: usize = 256 * 1024 * 1024;
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Chooses the DevTools WebSocket URL for the path the control plane asked for.
pub fn target_url(path: &str, devtools_port: u16, browser_ws_url: &str) -> Result<String, Status> {
    if path.is_empty() {
        return Ok(browser_ws_url.to_owned());
    }
    if !path.starts_with("/devtools/") || path.contains("..") {
        return Err(Status::invalid_argument(format!(
            "CDP path must start with /devtools/, got {path:?}"
        )));
    }
    Ok(format!("ws://127.0.0.1:{devtools_port}{path}"))
}

/// What the tunnel does to each text message from the client on its way in (`None`
/// drops it).
pub type Rewrite = Box<dyn Fn(String) -> Option<String> + Send + Sync>;

/// Connects to Chromium (or another WebSocket of the VM) and pumps frames both ways
/// until either side closes. Frames from Chromium go to `outbound`; the client's text
/// messages pass through `rewrite`, if any, and its binary ones only without one.
pub async fn connect(
    url: &str, mut inbound: Streaming<CdpFrame>, outbound: mpsc::Sender<Result<CdpFrame, Status>>,
    rewrite: Option<Rewrite>,
) -> Result<(), Status> {
    let mut config = WebSocketConfig::default();
    config.max_message_size = Some(MAX_CDP_MESSAGE_BYTES);
    config.max_frame_size = Some(MAX_CDP_MESSAGE_BYTES);
    let connecting = tokio_tungstenite::connect_async_with_config(url, Some(config), true);
    let (socket, _) = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| Status::deadline_exceeded("DevTools did not accept the connection in time"))?
        .map_err(|error| Status::unavailable(format!("connecting to DevTools failed: {error}")))?;
    let (mut to_chromium, mut from_chromium) = socket.split();

    tokio::spawn(async move {
        let upstream = async {
            while let Some(Ok(frame)) = inbound.next().await {
                let message = match frame.kind {
                    Some(Kind::Text(text)) => match &rewrite {
                        None => Message::text(text),
                        Some(rewrite) => match rewrite(text) {
                            Some(text) => Message::text(text),
                            None => continue,
                        },
                    },
                    // A rewritten conversation is JSON text only.
                    Some(Kind::Binary(_)) if rewrite.is_some() => continue,
                    Some(Kind::Binary(bytes)) => Message::binary(bytes),
                    Some(Kind::Close(close)) => {
                        let _ = to_chromium
                            .send(Message::Close(Some(CloseFrame {
                                code: (close.code as u16).into(),
                                reason: close.reason.into(),
                            })))
                            .await;
                        break;
                    }
                    Some(Kind::Open(_)) | None => continue,
                };
                if to_chromium.send(message).await.is_err() {
                    break;
                }
            }
            let _ = to_chromium.close().await;
        };
        let downstream = async {
            while let Some(message) = from_chromium.next().await {
                let kind = match message {
                    Ok(Message::Text(text)) => Kind::Text(text.to_string()),
                    Ok(Message::Binary(bytes)) => Kind::Binary(bytes.to_vec()),
                    Ok(Message::Close(frame)) => {
                        let (code, reason) = frame
                            .map(|f| (u16::from(f.code) as u32, f.reason.to_string()))
                            .unwrap_or((1000, String::new()));
                        let _ = outbound
                            .send(Ok(CdpFrame {
                                kind: Some(Kind::Close(CdpClose { code, reason })),
                            }))
                            .await;
                        break;
                    }
                    Ok(_) => continue,
                    Err(error) => {
                        tracing::debug!(%error, "DevTools socket ended");
                        break;
                    }
                };
                if outbound.send(Ok(CdpFrame { kind: Some(kind) })).await.is_err() {
                    break;
                }
            }
        };
        // Whichever side finishes first ends the tunnel; dropping the other half
        // closes both the WebSocket and the gRPC stream.
        tokio::select! {
            () = upstream => {},
            () = downstream => {},
        }
    });
    Ok(())
}
