//! The live view behind `browser_live_view_url`: `GET /browsers/{id}/live?jwt=…` serves the
//! viewer page and `GET /browsers/{id}/live/ws?jwt=…` its WebSocket, through the same
//! public address as the API. The signed token names the session, its organization, its
//! lease for pool browsers, and whether the viewer may use the browser or only watch; it
//! works while that session (and lease) lives, without an API key.
//!
//! The agent sends what the screen changed as JPEG tiles (one encoder per display,
//! however many viewers); each becomes one binary WebSocket message:
//! `[1][u32 LE header length][header JSON][the tiles' JPEG bytes, in order]`, the header
//! `{"w","h","full","px","py","pv","t","tiles":[[x, y, width, height, bytes], …]}`.
//! Once the viewer unmutes, the browser's sound comes as messages of kind 2 (see
//! [`encode_update`]).
//! The viewer sends its input as JSON text messages ([`ViewerInput`]).

use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, REFERRER_POLICY};
use axum::response::{Html, IntoResponse, Response};
use browser_agent_proto::v1::{
    LiveKey, LivePointer, LiveViewInput, LiveViewUpdate, LiveWheel, live_pointer,
    live_view_input::Kind,
};
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::json;
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::Streaming;
use utoipa::IntoParams;

use super::cdp::lease_is_current;
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{PathParam, QueryParams};
use crate::api::state::AppState;
use crate::managed_auth::Document;
use crate::sessions::CdpConnectionGuard;
use crate::sessions::ClientKind;
use crate::store::SessionRecord;
use crate::telemetry::{Category, Event};
use crate::tokens::SessionClaims;

const VIEWER_PAGE: &str = include_str!("viewer.html");
const OPEN_TIMEOUT: Duration = Duration::from_secs(15);
/// Viewers are pinged this often; one that answers nothing for `SILENCE_LIMIT` is gone.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
const SILENCE_LIMIT: Duration = Duration::from_secs(60);
/// Largest message from a viewer (a paste, typed text).
const MAX_INPUT_BYTES: usize = 256 * 1024;
const MAX_KEY_NAME: usize = 64;
/// Longest text typed in one message (key by key, or a composition): typing is slow
/// (it holds the display's input), so longer text is for paste.
const MAX_TYPED_CHARS: usize = 256;
/// A viewer that takes longer than this to accept a message is gone.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LiveQuery {
    /// The token from `browser_live_view_url`.
    pub jwt: Option<String>,
    /// `true`: the picture only, without the viewer's toolbar (for an iframe).
    pub embed: Option<bool>,
}

/// The viewer's live view URLs of a headful session: interactive and watch-only.
pub fn urls(state: &AppState, session: &SessionRecord) -> Option<(String, String)> {
    if session.headless {
        return None;
    }
    let url = |read_only| {
        let token = state.tokens.issue_live_view(
            &session.id,
            &session.org_id,
            session.pool_lease_id.as_deref(),
            read_only,
        );
        format!(
            "{}/browsers/{}/live?jwt={token}",
            state.settings.public_url.trim_end_matches('/'),
            session.id
        )
    };
    Some((url(false), url(true)))
}

/// The claims, if the token is genuine and names this session.
fn claims_for(state: &AppState, id: &str, jwt: Option<&str>) -> Result<SessionClaims, ApiError> {
    jwt.and_then(|token| state.tokens.verify_live_view(token))
        .filter(|claims| claims.sub == id)
        .ok_or_else(|| {
            ApiError::Unauthorized("missing or invalid live view token for this session".into())
        })
}

/// The session the claims name, while it (and the lease they name) lives.
async fn viewed_session(
    state: &AppState, claims: &SessionClaims,
) -> Result<SessionRecord, ApiError> {
    let session = state.sessions.live(&claims.org, &claims.sub).await?;
    if session.pool_id.is_some() {
        lease_is_current(state, &claims.org, &claims.sub, claims.lease.as_deref()).await?;
    }
    Ok(session)
}

/// The live view page: the session's screen, and (unless the token is watch-only) the
/// viewer's mouse, keyboard and clipboard paste sent to it.
#[utoipa::path(get, path = "/browsers/{id}/live",
    params(("id" = String, Path, description = "Browser session ID"), LiveQuery), security(()),
    responses((status = 200, content_type = "text/html", body = String),
        (status = 401, body = ErrorBody)))]
pub async fn page(
    State(state): State<AppState>, PathParam(id): PathParam<String>,
    QueryParams(query): QueryParams<LiveQuery>,
) -> Result<Response, ApiError> {
    let claims = claims_for(&state, &id, query.jwt.as_deref())?;
    viewed_session(&state, &claims).await?;
    Ok(viewer_page(claims.read_only, query.embed.unwrap_or(false)))
}

/// The viewer page; it opens its WebSocket at its own path + `/ws`, with its query.
fn viewer_page(read_only: bool, embed: bool) -> Response {
    let mode = match (read_only, embed) {
        (true, true) => "read-only embed",
        (true, false) => "read-only",
        (false, true) => "interactive embed",
        (false, false) => "interactive",
    };
    let page = VIEWER_PAGE.replace("{{MODE}}", mode);
    (
        [
            (CACHE_CONTROL, "no-store"),
            // The token is in the URL: never send it on as a referrer.
            (REFERRER_POLICY, "no-referrer"),
            (
                CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 img-src blob:; media-src blob:; connect-src 'self'",
            ),
        ],
        Html(page),
    )
        .into_response()
}

/// The live view's WebSocket (see the module's documentation for the messages).
#[utoipa::path(get, path = "/browsers/{id}/live/ws",
    params(("id" = String, Path, description = "Browser session ID"), LiveQuery), security(()),
    responses((status = 101, description = "Switching to the live view WebSocket"),
        (status = 401, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn socket(
    State(state): State<AppState>, PathParam(id): PathParam<String>,
    QueryParams(query): QueryParams<LiveQuery>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let claims = claims_for(&state, &id, query.jwt.as_deref())?;
    let upgrade = upgrade.map_err(|rejection| {
        ApiError::invalid_field(format!("this endpoint needs a WebSocket upgrade: {rejection}"))
    })?;
    let session = viewed_session(&state, &claims).await?;
    let lease = session.pool_id.is_some().then_some(&claims);
    open_socket(&state, &session, claims.read_only, lease, upgrade).await
}

/// The WebSocket of a viewer of `session`'s display, once the agent's stream is open.
async fn open_socket(
    state: &AppState, session: &SessionRecord, read_only: bool, lease: Option<&SessionClaims>,
    upgrade: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    if session.headless {
        return Err(ApiError::Conflict(
            "this browser is headless: it has no display to view".into(),
        ));
    }
    let agent = state.sessions.agent(session)?;
    let (to_agent, from_agent) = tokio::time::timeout(OPEN_TIMEOUT, agent.open_live_view())
        .await
        .map_err(|_| ApiError::Timeout("the browser's display did not answer in time".into()))??;
    if let Some(claims) = lease {
        // Again once the stream is open: had the lease ended meanwhile, its reset may have
        // come before the stream and would not have closed it (dropping it closes it).
        lease_is_current(state, &claims.org, &claims.sub, claims.lease.as_deref()).await?;
    }
    let guard = state.sessions.client_connected(session, ClientKind::LiveView);
    let (telemetry, session) = (state.telemetry.clone(), session.clone());
    let record = move |(kind, data): (&str, serde_json::Value)| {
        telemetry.record_current(&session, Event::api(Category::Interaction, kind, data));
    };
    Ok(upgrade
        .max_message_size(MAX_INPUT_BYTES)
        .on_upgrade(move |socket| pump(socket, to_agent, from_agent, read_only, record, guard)))
}

/// The browser of the connection's login flow in progress, if the token names this
/// connection.
async fn flow_session(
    state: &AppState, connection_id: &str, jwt: Option<&str>,
) -> Result<SessionRecord, ApiError> {
    let claims = jwt
        .and_then(|token| state.tokens.verify_flow_live_view(token))
        .filter(|claims| claims.sub == connection_id)
        .ok_or_else(|| {
            ApiError::Unauthorized("missing or invalid live view link for this connection".into())
        })?;
    let record = state
        .store
        .auth_connection(&claims.org, connection_id)
        .await?
        .ok_or_else(|| ApiError::NotFound("this connection no longer exists".into()))?;
    let document = Document::parse(&record)?;
    let session_id =
        document.flow_in_progress().and_then(|flow| flow.session_id.clone()).ok_or_else(|| {
            ApiError::NotFound("this connection has no login flow with a browser now".into())
        })?;
    Ok(state.sessions.live(&record.org_id, &session_id).await?)
}

/// `live_view_url` of a login flow: the flow's browser, for a person to complete what
/// the automation cannot (an unexpected challenge). Granted by its own token (not
/// `hosted_url`'s), until the flow ends.
#[utoipa::path(get, path = "/auth/connections/{id}/live",
    params(("id" = String, Path, description = "Auth connection id"), LiveQuery), security(()),
    responses((status = 200, content_type = "text/html", body = String),
        (status = 401, body = ErrorBody)))]
pub async fn flow_page(
    State(state): State<AppState>, PathParam(id): PathParam<String>,
    QueryParams(query): QueryParams<LiveQuery>,
) -> Result<Response, ApiError> {
    flow_session(&state, &id, query.jwt.as_deref()).await?;
    Ok(viewer_page(false, query.embed.unwrap_or(false)))
}

/// The WebSocket of a login flow's live view.
#[utoipa::path(get, path = "/auth/connections/{id}/live/ws",
    params(("id" = String, Path, description = "Auth connection id"), LiveQuery), security(()),
    responses((status = 101, description = "Switching to the live view WebSocket"),
        (status = 401, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn flow_socket(
    State(state): State<AppState>, PathParam(id): PathParam<String>,
    QueryParams(query): QueryParams<LiveQuery>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let session = flow_session(&state, &id, query.jwt.as_deref()).await?;
    let upgrade = upgrade.map_err(|rejection| {
        ApiError::invalid_field(format!("this endpoint needs a WebSocket upgrade: {rejection}"))
    })?;
    open_socket(&state, &session, false, None, upgrade).await
}

/// A viewer's input, as its page sends it.
#[derive(Debug, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
enum ViewerInput {
    Refresh,
    Move {
        x: i32,
        y: i32,
    },
    Down {
        x: i32,
        y: i32,
        b: u32,
    },
    Up {
        x: i32,
        y: i32,
        b: u32,
    },
    Wheel {
        x: i32,
        y: i32,
        dx: i32,
        dy: i32,
    },
    Key {
        key: String,
        down: bool,
    },
    Text {
        text: String,
    },
    Paste {
        text: String,
    },
    /// Start or stop hearing the browser's sound.
    Audio {
        on: bool,
    },
}

impl ViewerInput {
    /// The `interaction` telemetry event of input the agent was sent: presses of a button
    /// and of a key (typed text is counted, never kept), as the computer API records its
    /// own.
    fn interaction(&self) -> Option<(&'static str, serde_json::Value)> {
        match self {
            Self::Down { x, y, .. } => Some(("interaction_click", json!({ "x": x, "y": y }))),
            Self::Key { key, down: true } => Some(("interaction_key", json!({ "key": key }))),
            Self::Text { text } | Self::Paste { text } => {
                Some(("interaction_key", json!({ "text_length": text.chars().count() })))
            }
            _ => None,
        }
    }

    /// What the agent is sent; `None` for input a watch-only viewer may not give, or
    /// that makes no sense.
    fn into_agent_input(self, read_only: bool) -> Option<LiveViewInput> {
        let pointer = |action: live_pointer::Action, x, y, button| {
            Kind::Pointer(LivePointer { action: action.into(), x, y, button })
        };
        let kind = match self {
            Self::Refresh => Kind::Refresh(true),
            // Hearing is watching.
            Self::Audio { on } => Kind::Audio(on),
            _ if read_only => return None,
            Self::Move { x, y } => pointer(live_pointer::Action::Move, x, y, 0),
            Self::Down { x, y, b } => pointer(live_pointer::Action::Down, x, y, b.clamp(1, 3)),
            Self::Up { x, y, b } => pointer(live_pointer::Action::Up, x, y, b.clamp(1, 3)),
            Self::Wheel { x, y, dx, dy } => Kind::Wheel(LiveWheel {
                x,
                y,
                delta_x: dx.clamp(-20, 20),
                delta_y: dy.clamp(-20, 20),
            }),
            Self::Key { key, down } if !key.is_empty() && key.len() <= MAX_KEY_NAME => {
                Kind::Key(LiveKey { key, down })
            }
            Self::Text { text } if !text.is_empty() && text.chars().count() <= MAX_TYPED_CHARS => {
                Kind::Text(text)
            }
            Self::Paste { text } if !text.is_empty() => Kind::Paste(text),
            _ => return None,
        };
        Some(LiveViewInput { kind: Some(kind) })
    }
}

/// One update as the viewer's binary message: a picture (kind 1) or sound (kind 2:
/// `[2][u32 LE sample rate][u8 channels][16-bit LE PCM, interleaved]`).
fn encode_update(update: LiveViewUpdate) -> Vec<u8> {
    if !update.audio.is_empty() {
        let mut message = Vec::with_capacity(6 + update.audio.len());
        message.push(2);
        message.extend_from_slice(&update.audio_rate.to_le_bytes());
        message.push(update.audio_channels.min(8) as u8);
        message.extend_from_slice(&update.audio);
        return message;
    }
    let tiles: Vec<[u64; 5]> = update
        .tiles
        .iter()
        .map(|tile| {
            [
                tile.x.into(),
                tile.y.into(),
                tile.width.into(),
                tile.height.into(),
                tile.jpeg.len() as u64,
            ]
        })
        .collect();
    let header = serde_json::json!({
        "w": update.width,
        "h": update.height,
        "full": update.full,
        "px": update.pointer_x,
        "py": update.pointer_y,
        "pv": update.pointer_visible,
        "t": update.captured_at_us,
        "tiles": tiles,
    })
    .to_string();
    let body: usize = update.tiles.iter().map(|tile| tile.jpeg.len()).sum();
    let mut message = Vec::with_capacity(5 + header.len() + body);
    message.push(1);
    message.extend_from_slice(&(header.len() as u32).to_le_bytes());
    message.extend_from_slice(header.as_bytes());
    for tile in update.tiles {
        message.extend_from_slice(&tile.jpeg);
    }
    message
}

/// Carries updates to the viewer and its input to the agent until either side ends;
/// the guard keeps the session counted as in use meanwhile.
async fn pump(
    socket: WebSocket, to_agent: mpsc::Sender<LiveViewInput>,
    mut from_agent: Streaming<LiveViewUpdate>, read_only: bool,
    record_interaction: impl Fn((&str, serde_json::Value)) + Send, _guard: CdpConnectionGuard,
) {
    let (mut to_viewer, mut from_viewer) = socket.split();
    let (heard, mut last_heard) = tokio::sync::watch::channel(tokio::time::Instant::now());
    let upstream = async {
        while let Some(Ok(message)) = from_viewer.next().await {
            let _ = heard.send(tokio::time::Instant::now());
            let text = match message {
                Message::Text(text) => text,
                Message::Close(_) => break,
                _ => continue,
            };
            let Ok(input) = serde_json::from_str::<ViewerInput>(&text) else {
                continue;
            };
            let interaction = input.interaction();
            let Some(input) = input.into_agent_input(read_only) else {
                continue;
            };
            if to_agent.send(input).await.is_err() {
                break;
            }
            if let Some(interaction) = interaction {
                record_interaction(interaction);
            }
        }
    };
    let downstream = async {
        let mut keepalive = tokio::time::interval(KEEPALIVE_INTERVAL);
        keepalive.tick().await; // the first tick is immediate
        loop {
            let update = tokio::select! {
                update = from_agent.next() => update,
                _ = keepalive.tick() => {
                    if last_heard.borrow_and_update().elapsed() > SILENCE_LIMIT
                        || !sent(&mut to_viewer, Message::Ping(Default::default())).await
                    {
                        return;
                    }
                    continue;
                }
            };
            let Some(Ok(update)) = update else { break };
            if !sent(&mut to_viewer, Message::Binary(encode_update(update).into())).await {
                return;
            }
        }
        // The display went away (the session ended): say so rather than leave it hanging.
        let closing = Message::Close(Some(CloseFrame {
            code: 1000,
            reason: "the browser session ended".into(),
        }));
        sent(&mut to_viewer, closing).await;
    };
    // Either side's end ends both: the viewer's input stops reaching the agent with it.
    tokio::select! {
        () = upstream => {},
        () = downstream => {},
    }
}

/// Sends one message; false if the viewer is gone or does not take it in time.
async fn sent(
    to_viewer: &mut futures::stream::SplitSink<WebSocket, Message>, message: Message,
) -> bool {
    matches!(tokio::time::timeout(SEND_TIMEOUT, to_viewer.send(message)).await, Ok(Ok(())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_only_viewers_can_only_ask_for_the_screen() {
        let click: ViewerInput =
            serde_json::from_str(r#"{"t":"down","x":5,"y":6,"b":1}"#).expect("parses");
        assert!(click.into_agent_input(true).is_none());
        let refresh: ViewerInput = serde_json::from_str(r#"{"t":"refresh"}"#).expect("parses");
        assert!(matches!(
            refresh.into_agent_input(true).and_then(|input| input.kind),
            Some(Kind::Refresh(true))
        ));
        let key: ViewerInput =
            serde_json::from_str(r#"{"t":"key","key":"Return","down":true}"#).expect("parses");
        assert!(matches!(
            key.into_agent_input(false).and_then(|input| input.kind),
            Some(Kind::Key(LiveKey { down: true, .. }))
        ));
    }

    #[test]
    fn an_update_is_one_message_with_its_header_and_tiles() {
        let update = LiveViewUpdate {
            width: 100,
            height: 50,
            tiles: vec![browser_agent_proto::v1::LiveTile {
                x: 1,
                y: 2,
                width: 3,
                height: 4,
                jpeg: vec![9, 9, 9],
            }],
            full: true,
            ..Default::default()
        };
        let message = encode_update(update);
        assert_eq!(message[0], 1);
        let length = u32::from_le_bytes([message[1], message[2], message[3], message[4]]) as usize;
        let header: serde_json::Value =
            serde_json::from_slice(&message[5..5 + length]).expect("json");
        assert_eq!(header["tiles"], serde_json::json!([[1, 2, 3, 4, 3]]));
        assert_eq!(&message[5 + length..], &[9, 9, 9]);
    }
}
