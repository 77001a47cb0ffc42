//! `GET /browsers/{id}/cdp?jwt=…`: the WebSocket behind `cdp_ws_url`, and
//! `GET /browsers/{id}/webdriver?jwt=…`, the one behind `webdriver_ws_url`. Authenticated
//! by the signed token instead of an API key (Playwright, Puppeteer and Selenium cannot
//! send headers here). A local browser's DevTools socket is handed over by its agent and
//! its bytes passed through (`cdp_passthrough`); otherwise the WebSocket is tunnelled
//! over gRPC to the agent, which connects to Chromium's DevTools, or to the VM's
//! chromedriver for WebDriver BiDi.

use axum::extract::OptionalFromRequestParts;
use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use browser_agent_proto::v1::{CdpClose, CdpFrame, cdp_frame::Kind};
use hyper::upgrade::OnUpgrade;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::sync::mpsc;
use tonic::Streaming;
use utoipa::IntoParams;

use crate::agent::MAX_CDP_MESSAGE_BYTES;
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{PathParam, QueryParams};
use crate::api::state::AppState;
use crate::sessions::CdpConnectionGuard;
use crate::sessions::ClientKind;
use crate::store::PoolLease;
use crate::tokens::SessionClaims;

const TUNNEL_OPEN_TIMEOUT: Duration = Duration::from_secs(15);
/// We ping idle clients this often; one that has sent nothing (not even a pong) for
/// `CLIENT_SILENCE_LIMIT` is gone, and its connection stops keeping the session alive.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const CLIENT_SILENCE_LIMIT: Duration = Duration::from_secs(90);

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CdpQuery {
    /// The token from `cdp_ws_url`.
    pub jwt: Option<String>,
}

/// WebSocket endpoint speaking the Chrome DevTools Protocol of the session's browser.
#[utoipa::path(get, path = "/browsers/{id}/cdp",
    params(("id" = String, Path, description = "Browser session ID"), CdpQuery), security(()),
    responses((status = 101, description = "Switching to the DevTools WebSocket"),
        (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn connect(
    State(state): State<AppState>,
    PathParam(id): PathParam<String>,
    QueryParams(query): QueryParams<CdpQuery>,
    // Before `upgrade`, which takes the connection's upgrade out of the request.
    raw: Option<RawUpgrade>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    tunnel(state, id, query, upgrade, Some(raw)).await
}

/// WebSocket endpoint speaking WebDriver BiDi to the session's browser: open a session
/// with `session.new` (it attaches to this browser whatever Chrome options it names).
#[utoipa::path(get, path = "/browsers/{id}/webdriver",
    params(("id" = String, Path, description = "Browser session ID"), CdpQuery), security(()),
    responses((status = 101, description = "Switching to the WebDriver BiDi WebSocket"),
        (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn webdriver(
    State(state): State<AppState>, PathParam(id): PathParam<String>,
    QueryParams(query): QueryParams<CdpQuery>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    tunnel(state, id, query, upgrade, None).await
}

/// The agent's tunnel path for WebDriver BiDi (its `webdriver::TUNNEL_PATH`).
const WEBDRIVER_TUNNEL_PATH: &str = "webdriver";

/// The WebSocket, once its token names this live session: Chromium's DevTools (with
/// `raw`, the client's connection as it is upgraded) or, without, WebDriver BiDi.
async fn tunnel(
    state: AppState, id: String, query: CdpQuery,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>, raw: Option<Option<RawUpgrade>>,
) -> Result<Response, ApiError> {
    let agent_path = if raw.is_some() { "" } else { WEBDRIVER_TUNNEL_PATH };
    let claims = query
        .jwt
        .as_deref()
        .and_then(|token| state.tokens.verify_cdp(token))
        .filter(|claims| claims.sub == id)
        .ok_or_else(|| ApiError::Unauthorized("missing or invalid jwt for this session".into()))?;
    let upgrade = upgrade.map_err(|rejection| {
        ApiError::invalid_field(format!("this endpoint needs a WebSocket upgrade: {rejection}"))
    })?;
    let session = state.sessions.live(&claims.org, &id).await?;
    let pooled = session.pool_id.is_some();
    if pooled {
        lease_holds(&state, &claims).await?;
    }
    // A local browser's DevTools socket itself, its bytes passed through: one process
    // hop per message instead of three. Other browsers (and any failure) go over gRPC.
    if let Some(raw) = raw.flatten()
        && let Some(location) = &session.agent
    {
        match crate::agent::devtools::open_devtools(location, "").await {
            Ok(Some(handed_over)) => {
                tracing::debug!(session_id = %id, "DevTools handed over; passing bytes through");
                if pooled {
                    lease_holds(&state, &claims).await?;
                }
                let mut guard = state.sessions.client_connected(&session, ClientKind::Cdp);
                guard.hold(Box::new(handed_over.keep_awake));
                return Ok(raw.switch(handed_over.devtools, guard));
            }
            Ok(None) => {}
            Err(error) => {
                tracing::debug!(session_id = %id, %error, "no DevTools hand-off; tunnelling over gRPC")
            }
        }
    }
    let agent = state.sessions.agent(&session)?;
    let (to_agent, from_agent) =
        tokio::time::timeout(TUNNEL_OPEN_TIMEOUT, agent.open_cdp_tunnel(agent_path))
            .await
            .map_err(|_| {
                ApiError::Timeout("the browser's endpoint did not answer in time".into())
            })??;
    if pooled {
        // Again once the tunnel is open: had the lease ended while it opened, the tunnel
        // may lead into the browser already reset for the next lessee (dropping it closes
        // it). A lease that ends later restarts Chromium, which closes the tunnel.
        lease_holds(&state, &claims).await?;
    }
    let guard = state.sessions.client_connected(&session, ClientKind::Cdp);
    Ok(upgrade
        .max_message_size(MAX_CDP_MESSAGE_BYTES)
        .max_frame_size(MAX_CDP_MESSAGE_BYTES)
        .on_upgrade(move |socket| pump(socket, to_agent, from_agent, guard)))
}

/// What the raw pass-through needs of an HTTP/1.1 WebSocket upgrade: the client's key
/// and the connection, once upgraded. Taken before `WebSocketUpgrade` (which checks
/// the request and would take the connection); absent for other requests.
pub struct RawUpgrade {
    key: HeaderValue,
    on_upgrade: OnUpgrade,
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for RawUpgrade {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts, _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        if parts.version > axum::http::Version::HTTP_11 {
            return Ok(None);
        }
        let key = parts.headers.get(header::SEC_WEBSOCKET_KEY).cloned();
        let on_upgrade = parts.extensions.get::<OnUpgrade>().cloned();
        Ok(key.zip(on_upgrade).map(|(key, on_upgrade)| Self { key, on_upgrade }))
    }
}

impl RawUpgrade {
    /// Answers 101 and, once the client's connection is switched, passes its bytes to
    /// and from `devtools`.
    fn switch(self, devtools: tokio::net::TcpStream, guard: CdpConnectionGuard) -> Response {
        let Self { key, on_upgrade } = self;
        tokio::spawn(async move {
            if let Ok(upgraded) = on_upgrade.await {
                super::cdp_passthrough::start(upgraded, devtools, guard);
            }
        });
        let accept = derive_accept_key(key.as_bytes());
        (
            StatusCode::SWITCHING_PROTOCOLS,
            [
                (header::CONNECTION, "upgrade".to_owned()),
                (header::UPGRADE, "websocket".to_owned()),
                (header::SEC_WEBSOCKET_ACCEPT, accept),
            ],
        )
            .into_response()
    }
}

/// A pool browser's DevTools are open only to the lease the token names. Read from the
/// store, not the running-session cache: a lease that has just ended must not let its
/// lessee back in.
pub(in crate::api) async fn lease_holds(
    state: &AppState, claims: &SessionClaims,
) -> Result<(), ApiError> {
    lease_is_current(state, &claims.org, &claims.sub, claims.lease.as_deref()).await
}

/// Whether the pool browser `session_id` is still leased under `lease` (401 otherwise).
pub(in crate::api) async fn lease_is_current(
    state: &AppState, org_id: &str, session_id: &str, lease: Option<&str>,
) -> Result<(), ApiError> {
    let current = state.store.session(org_id, session_id).await?;
    let leased_to_this_token = current.is_some_and(|current| {
        current.pool_lease == Some(PoolLease::Leased) && current.pool_lease_id.as_deref() == lease
    });
    if leased_to_this_token {
        Ok(())
    } else {
        Err(ApiError::Unauthorized(
            "this browser's lease has ended; acquire it again for a new cdp_ws_url".into(),
        ))
    }
}

/// Moves frames both ways until either side closes; the guard keeps the session
/// counted as in use meanwhile.
async fn pump(
    socket: WebSocket, to_agent: mpsc::Sender<CdpFrame>, mut from_agent: Streaming<CdpFrame>,
    guard: CdpConnectionGuard,
) {
    let (mut to_client, mut from_client) = socket.split();
    let opened = Instant::now();
    let last_heard_ms = AtomicU64::new(0);
    let commands = guard.command_recorder();
    let upstream = async {
        while let Some(Ok(message)) = from_client.next().await {
            last_heard_ms.store(opened.elapsed().as_millis() as u64, Ordering::Relaxed);
            let kind = match message {
                Message::Text(text) => {
                    if let Some(commands) = &commands {
                        commands.record(text.as_bytes());
                    }
                    Kind::Text(text.to_string())
                }
                Message::Binary(bytes) => Kind::Binary(bytes.to_vec()),
                Message::Close(frame) => {
                    let (code, reason) = frame
                        .map(|f| (u32::from(f.code), f.reason.to_string()))
                        .unwrap_or((1000, String::new()));
                    let _ = to_agent
                        .send(CdpFrame { kind: Some(Kind::Close(CdpClose { code, reason })) })
                        .await;
                    break;
                }
                Message::Ping(_) | Message::Pong(_) => continue,
            };
            if to_agent.send(CdpFrame { kind: Some(kind) }).await.is_err() {
                break;
            }
        }
    };
    let downstream = async {
        let mut keepalive = tokio::time::interval(KEEPALIVE_INTERVAL);
        keepalive.tick().await; // the first tick is immediate
        loop {
            let frame = tokio::select! {
                frame = from_agent.next() => frame,
                _ = keepalive.tick() => {
                    let heard = Duration::from_millis(last_heard_ms.load(Ordering::Relaxed));
                    if opened.elapsed().saturating_sub(heard) > CLIENT_SILENCE_LIMIT
                        || to_client.send(Message::Ping(Default::default())).await.is_err()
                    {
                        return;
                    }
                    continue;
                }
            };
            let Some(Ok(frame)) = frame else { break };
            let message = match frame.kind {
                Some(Kind::Text(text)) => Message::Text(text.into()),
                Some(Kind::Binary(bytes)) => Message::Binary(bytes.into()),
                Some(Kind::Close(close)) => {
                    let _ = to_client
                        .send(Message::Close(Some(CloseFrame {
                            code: close.code as u16,
                            reason: close.reason.into(),
                        })))
                        .await;
                    return;
                }
                Some(Kind::Open(_)) | None => continue,
            };
            if to_client.send(message).await.is_err() {
                return;
            }
        }
        // The agent or Chromium went away: tell the client rather than leave it hanging.
        let _ = to_client
            .send(Message::Close(Some(CloseFrame {
                code: 1011,
                reason: "browser went away".into(),
            })))
            .await;
    };
    tokio::select! {
        () = upstream => {},
        () = downstream => {},
    }
}
