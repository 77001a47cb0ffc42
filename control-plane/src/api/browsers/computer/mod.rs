//! Computer controls, `/browsers/{id}/computer/*`: OS-level mouse and keyboard on the
//! browser's X display, and screenshots of it. Requests are validated here against the
//! session's screen; the agent performs them with enigo and X11 requests.

use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use browser_agent_proto::v1::{
    ClickKind, ClickMouseRequest, DragMouseRequest, MouseButton, MoveMouseRequest, Point,
    PressKeysRequest, Region, ScreenshotRequest, ScrollRequest, TypeTextRequest,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use crate::agent::AgentClient;
use crate::api::error::{ApiError, ErrorDetail};
use crate::api::extract::{JsonBody, PathParam};
use crate::api::org::Org;
use crate::store::SessionRecord;

pub mod batch;
pub mod desktop;

/// Upper bounds that keep one request from occupying a browser's input for long.
pub const MAX_NUM_CLICKS: i64 = 100;
pub const MAX_PATH_POINTS: usize = 1000;
pub const MAX_STEPS_PER_SEGMENT: i64 = 1000;
/// Relative moves of one drag (path segments × steps).
pub const MAX_DRAG_MOVES: i64 = 100_000;
pub const MAX_DELAY_MS: i64 = 60_000;
pub const MAX_TEXT_CHARS: usize = 100_000;
pub const MAX_KEYS: usize = 100;
/// Longest a single drag, typing or key press may take in total.
pub const MAX_ACTION_DURATION: Duration = Duration::from_secs(300);

const DEFAULT_STEPS_PER_SEGMENT: i64 = 10;
const DEFAULT_STEP_DELAY_MS: i64 = 50;

/// The session's agent, refusing headless sessions up front.
async fn screen_of(org: &Org, id: &str) -> Result<(SessionRecord, AgentClient), ApiError> {
    let session = org.sessions.live(&org.id, id).await?;
    if session.headless {
        return Err(ApiError::invalid_field(
            "this browser is headless: computer controls need a display (create it with headless: false)",
        ));
    }
    let agent = org.sessions.agent(&session)?;
    Ok((session, agent))
}

/// Collects every validation problem of a request before answering; in a batch each
/// message starts with the action it is about (`actions[3].click_mouse: …`).
#[derive(Default)]
struct Problems {
    found: Vec<ErrorDetail>,
    prefix: String,
}

impl Problems {
    fn add(&mut self, message: impl Into<String>) {
        let message = format!("{}{}", self.prefix, message.into());
        self.found.push(ErrorDetail::invalid_input(message));
    }

    fn on_screen(&mut self, session: &SessionRecord, field: &str, x: i64, y: i64) {
        let (width, height) = (session.viewport_width, session.viewport_height);
        if !(0..width).contains(&x) || !(0..height).contains(&y) {
            self.add(format!("{field} ({x}, {y}) is outside the {width}x{height} screen"));
        }
    }

    fn in_range(&mut self, field: &str, value: i64, min: i64, max: i64) {
        if !(min..=max).contains(&value) {
            self.add(format!("{field} must be between {min} and {max}, got {value}"));
        }
    }

    fn finish(self) -> Result<(), ApiError> {
        if self.found.is_empty() { Ok(()) } else { Err(ApiError::invalid(self.found)) }
    }
}

fn button(problems: &mut Problems, value: Option<&str>, allowed: &[&str]) -> MouseButton {
    let value = value.unwrap_or("left");
    if !allowed.contains(&value) {
        problems.add(format!("button must be one of {}, got {value:?}", allowed.join(", ")));
    }
    match value {
        "middle" => MouseButton::Middle,
        "right" => MouseButton::Right,
        "back" => MouseButton::Back,
        "forward" => MouseButton::Forward,
        _ => MouseButton::Left,
    }
}

fn point(x: i64, y: i64) -> Option<Point> {
    Some(Point { x: x as i32, y: y as i32 })
}

fn millis(value: i64) -> u32 {
    value.clamp(0, u32::MAX.into()) as u32
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClickMouseBody {
    pub x: i64,
    pub y: i64,
    /// left (default), right, middle, back or forward.
    pub button: Option<String>,
    /// click (default), down or up.
    pub click_type: Option<String>,
    /// Modifier keys held during the click, e.g. `["shift"]`.
    pub hold_keys: Option<Vec<String>>,
    /// How often to repeat a `click` (default 1).
    pub num_clicks: Option<i64>,
}

/// Simulate a mouse click (seed 4.4).
#[utoipa::path(post, path = "/browsers/{id}/computer/click_mouse", request_body = ClickMouseBody,
    responses((status = 200, description = "Mouse action performed")))]
pub async fn click_mouse(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<ClickMouseBody>,
) -> Result<StatusCode, ApiError> {
    let (session, agent) = screen_of(&org, &id).await?;
    let mut problems = Problems::default();
    let (x, y) = (body.x, body.y);
    let request = click_request(&session, body, &mut problems);
    problems.finish()?;
    agent.click_mouse(request).await?;
    interaction(&org, &session, "interaction_click", json!({ "x": x, "y": y }));
    Ok(StatusCode::OK)
}

/// An `interaction` telemetry event of an action done through this API.
fn interaction(org: &Org, session: &SessionRecord, kind: &str, data: serde_json::Value) {
    org.telemetry.record(
        session,
        crate::telemetry::Event::api(crate::telemetry::Category::Interaction, kind, data),
    );
}

/// A click, checked against the session's screen.
fn click_request(
    session: &SessionRecord, body: ClickMouseBody, problems: &mut Problems,
) -> ClickMouseRequest {
    problems.on_screen(session, "(x, y)", body.x, body.y);
    let button =
        button(problems, body.button.as_deref(), &["left", "right", "middle", "back", "forward"]);
    let kind = match body.click_type.as_deref().unwrap_or("click") {
        "click" => ClickKind::Click,
        "down" => ClickKind::Down,
        "up" => ClickKind::Up,
        other => {
            problems.add(format!("click_type must be one of click, down, up, got {other:?}"));
            ClickKind::Click
        }
    };
    let count = body.num_clicks.unwrap_or(1);
    problems.in_range("num_clicks", count, 1, MAX_NUM_CLICKS);
    ClickMouseRequest {
        position: point(body.x, body.y),
        button: button.into(),
        kind: kind.into(),
        count: count.max(0) as u32,
        hold_keys: body.hold_keys.unwrap_or_default(),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DragMouseBody {
    /// Points `[x, y]` to move through while the button is held; at least 2.
    pub path: Vec<Vec<i64>>,
    /// left (default), middle or right.
    pub button: Option<String>,
    /// Milliseconds between button down and the first move (default 0).
    pub delay: Option<i64>,
    /// Relative moves per path segment (default 10, at least 1).
    pub steps_per_segment: Option<i64>,
    /// Milliseconds between relative moves (default 50).
    pub step_delay_ms: Option<i64>,
    pub hold_keys: Option<Vec<String>>,
    /// Human-like curves between the points instead of straight steps
    /// (`steps_per_segment` and `step_delay_ms` are then ignored).
    pub smooth: Option<bool>,
    /// With `smooth`: the whole motion's duration, 1 to 60000 ms (default: from the
    /// path's length, at most 1.2 s).
    pub duration_ms: Option<i64>,
}

/// Drag the mouse along a path (seed 4.3): move to `path[0]`, press, wait `delay`, then
/// per segment `steps_per_segment` relative moves that sum exactly to it, `step_delay_ms`
/// apart, then release.
#[utoipa::path(post, path = "/browsers/{id}/computer/drag_mouse", request_body = DragMouseBody,
    responses((status = 200, description = "Drag performed")))]
pub async fn drag_mouse(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<DragMouseBody>,
) -> Result<StatusCode, ApiError> {
    let (session, agent) = screen_of(&org, &id).await?;
    let mut problems = Problems::default();
    let (request, expected) = drag_request(&session, body, &mut problems);
    problems.finish()?;
    agent.drag_mouse(request, expected).await?;
    Ok(StatusCode::OK)
}

/// A drag checked against the session's screen, and how long it will take.
fn drag_request(
    session: &SessionRecord, body: DragMouseBody, problems: &mut Problems,
) -> (DragMouseRequest, Duration) {
    if body.path.len() < 2 || body.path.len() > MAX_PATH_POINTS {
        problems
            .add(format!("path must have 2 to {MAX_PATH_POINTS} points, got {}", body.path.len()));
    }
    let mut path = Vec::new();
    for (index, pair) in body.path.iter().enumerate() {
        match pair.as_slice() {
            [x, y] => {
                problems.on_screen(session, &format!("path[{index}]"), *x, *y);
                path.push(Point { x: *x as i32, y: *y as i32 });
            }
            _ => problems.add(format!(
                "path[{index}] must be [x, y]: exactly 2 integers, got {}",
                pair.len()
            )),
        }
    }
    let button = button(problems, body.button.as_deref(), &["left", "middle", "right"]);
    let delay = body.delay.unwrap_or(0);
    let steps = body.steps_per_segment.unwrap_or(DEFAULT_STEPS_PER_SEGMENT);
    let step_delay = body.step_delay_ms.unwrap_or(DEFAULT_STEP_DELAY_MS);
    problems.in_range("delay", delay, 0, MAX_DELAY_MS);
    problems.in_range("steps_per_segment", steps, 1, MAX_STEPS_PER_SEGMENT);
    problems.in_range("step_delay_ms", step_delay, 0, MAX_DELAY_MS);
    let (smooth, duration_ms) = smoothness(problems, body.smooth, body.duration_ms);
    let moves =
        if smooth { 0 } else { (path.len().saturating_sub(1) as i64).saturating_mul(steps.max(1)) };
    if moves > MAX_DRAG_MOVES {
        problems.add(format!("the drag would make {moves} moves; the limit is {MAX_DRAG_MOVES}"));
    }
    let expected = Duration::from_millis(
        delay.max(0).saturating_add(moves.saturating_mul(step_delay.max(0))) as u64,
    ) + motion_time(smooth, duration_ms);
    if expected > MAX_ACTION_DURATION {
        problems.add(format!(
            "the drag would take {} s; the limit is {} s",
            expected.as_secs(),
            MAX_ACTION_DURATION.as_secs()
        ));
    }
    let request = DragMouseRequest {
        path,
        button: button.into(),
        delay_ms: millis(delay),
        steps_per_segment: steps.max(0) as u32,
        step_delay_ms: millis(step_delay),
        hold_keys: body.hold_keys.unwrap_or_default(),
        smooth,
        duration_ms,
    };
    (request, expected)
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MousePosition {
    pub x: i32,
    pub y: i32,
}

/// The current position of the mouse cursor (seed 4.5).
#[utoipa::path(post, path = "/browsers/{id}/computer/get_mouse_position",
    responses((status = 200, body = MousePosition)))]
pub async fn get_mouse_position(
    org: Org, PathParam(id): PathParam<String>,
) -> Result<Json<MousePosition>, ApiError> {
    let (_, agent) = screen_of(&org, &id).await?;
    let position = agent.mouse_position().await?;
    Ok(Json(MousePosition { x: position.x, y: position.y }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveMouseBody {
    pub x: i64,
    pub y: i64,
    pub hold_keys: Option<Vec<String>>,
    /// Move along a human-like curve instead of jumping.
    pub smooth: Option<bool>,
    /// With `smooth`: the motion's duration, 1 to 60000 ms (default: from the distance,
    /// at most 1.2 s).
    pub duration_ms: Option<i64>,
}

/// Move the mouse cursor.
#[utoipa::path(post, path = "/browsers/{id}/computer/move_mouse", request_body = MoveMouseBody,
    responses((status = 200, description = "Moved")))]
pub async fn move_mouse(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<MoveMouseBody>,
) -> Result<StatusCode, ApiError> {
    let (session, agent) = screen_of(&org, &id).await?;
    let mut problems = Problems::default();
    let request = move_request(&session, body, &mut problems);
    problems.finish()?;
    let expected = motion_time(request.smooth, request.duration_ms);
    agent.move_mouse(request, expected).await?;
    Ok(StatusCode::OK)
}

fn move_request(
    session: &SessionRecord, body: MoveMouseBody, problems: &mut Problems,
) -> MoveMouseRequest {
    problems.on_screen(session, "(x, y)", body.x, body.y);
    let (smooth, duration_ms) = smoothness(problems, body.smooth, body.duration_ms);
    MoveMouseRequest {
        position: point(body.x, body.y),
        hold_keys: body.hold_keys.unwrap_or_default(),
        smooth,
        duration_ms,
    }
}

/// How long a smooth motion may take when the caller leaves it to us.
const LONGEST_DEFAULT_MOTION: Duration = Duration::from_millis(1200);

/// `smooth` and `duration_ms` checked: `duration_ms` only with `smooth`.
fn smoothness(
    problems: &mut Problems, smooth: Option<bool>, duration_ms: Option<i64>,
) -> (bool, u32) {
    let smooth = smooth.unwrap_or(false);
    if let Some(duration) = duration_ms {
        if !smooth {
            problems.add("duration_ms needs smooth: true");
        }
        problems.in_range("duration_ms", duration, 1, MAX_DELAY_MS);
    }
    (smooth, millis(duration_ms.unwrap_or(0)))
}

/// How long a motion takes at most: its duration, or the longest default one.
fn motion_time(smooth: bool, duration_ms: u32) -> Duration {
    match (smooth, duration_ms) {
        (false, _) => Duration::ZERO,
        (true, 0) => LONGEST_DEFAULT_MOTION,
        (true, ms) => Duration::from_millis(ms.into()),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TypeBody {
    pub text: String,
    /// Milliseconds between keystrokes (default 0).
    pub delay: Option<i64>,
}

/// Type text with the keyboard.
#[utoipa::path(post, path = "/browsers/{id}/computer/type", request_body = TypeBody,
    responses((status = 200, description = "Typed")))]
pub async fn type_text(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<TypeBody>,
) -> Result<StatusCode, ApiError> {
    let (session, agent) = screen_of(&org, &id).await?;
    let mut problems = Problems::default();
    let (request, expected) = type_request(body, &mut problems);
    problems.finish()?;
    // What was typed may be a password: only how much.
    let text_length = request.text.chars().count();
    agent.type_text(request, expected).await?;
    interaction(&org, &session, "interaction_key", json!({ "text_length": text_length }));
    Ok(StatusCode::OK)
}

/// Typing, checked, and how long it will take.
fn type_request(body: TypeBody, problems: &mut Problems) -> (TypeTextRequest, Duration) {
    let characters = body.text.chars().count();
    if characters > MAX_TEXT_CHARS {
        problems.add(format!("text is limited to {MAX_TEXT_CHARS} characters, got {characters}"));
    }
    let delay = body.delay.unwrap_or(0);
    problems.in_range("delay", delay, 0, MAX_DELAY_MS);
    let expected = Duration::from_millis((delay.max(0) as u64).saturating_mul(characters as u64));
    if expected > MAX_ACTION_DURATION {
        problems.add(format!(
            "typing would take {} s; the limit is {} s",
            expected.as_secs(),
            MAX_ACTION_DURATION.as_secs()
        ));
    }
    let request = TypeTextRequest { text: body.text, delay_ms: millis(delay) };
    (request, expected)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PressKeyBody {
    /// Keys (X keysym names or usual names) or combinations such as `Ctrl+t`.
    pub keys: Vec<String>,
    /// Milliseconds to hold each key or combination (default 0: tap).
    pub duration: Option<i64>,
    pub hold_keys: Option<Vec<String>>,
}

/// Press keys or key combinations.
#[utoipa::path(post, path = "/browsers/{id}/computer/press_key", request_body = PressKeyBody,
    responses((status = 200, description = "Pressed")))]
pub async fn press_key(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<PressKeyBody>,
) -> Result<StatusCode, ApiError> {
    let (session, agent) = screen_of(&org, &id).await?;
    let mut problems = Problems::default();
    let (request, expected) = press_request(body, &mut problems);
    problems.finish()?;
    let keys = request.keys.clone();
    agent.press_keys(request, expected).await?;
    for key in keys {
        interaction(&org, &session, "interaction_key", json!({ "key": key }));
    }
    Ok(StatusCode::OK)
}

/// Key presses, checked, and how long they will take.
fn press_request(body: PressKeyBody, problems: &mut Problems) -> (PressKeysRequest, Duration) {
    if body.keys.is_empty() || body.keys.len() > MAX_KEYS {
        problems.add(format!("keys must name 1 to {MAX_KEYS} keys"));
    }
    let duration = body.duration.unwrap_or(0);
    problems.in_range("duration", duration, 0, MAX_DELAY_MS);
    let expected =
        Duration::from_millis((duration.max(0) as u64).saturating_mul(body.keys.len() as u64));
    if expected > MAX_ACTION_DURATION {
        problems.add(format!(
            "pressing the keys would take {} s; the limit is {} s",
            expected.as_secs(),
            MAX_ACTION_DURATION.as_secs()
        ));
    }
    let request = PressKeysRequest {
        keys: body.keys,
        duration_ms: millis(duration),
        hold_keys: body.hold_keys.unwrap_or_default(),
    };
    (request, expected)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScrollBody {
    pub x: i64,
    pub y: i64,
    /// Positive scrolls right.
    pub delta_x: Option<i64>,
    /// Positive scrolls down.
    pub delta_y: Option<i64>,
    pub hold_keys: Option<Vec<String>>,
}

/// Scroll at a point.
#[utoipa::path(post, path = "/browsers/{id}/computer/scroll", request_body = ScrollBody,
    responses((status = 200, description = "Scrolled")))]
pub async fn scroll(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<ScrollBody>,
) -> Result<StatusCode, ApiError> {
    let (session, agent) = screen_of(&org, &id).await?;
    let mut problems = Problems::default();
    let request = scroll_request(&session, body, &mut problems);
    problems.finish()?;
    agent.scroll(request).await?;
    Ok(StatusCode::OK)
}

fn scroll_request(
    session: &SessionRecord, body: ScrollBody, problems: &mut Problems,
) -> ScrollRequest {
    problems.on_screen(session, "(x, y)", body.x, body.y);
    let (delta_x, delta_y) = (body.delta_x.unwrap_or(0), body.delta_y.unwrap_or(0));
    problems.in_range("delta_x", delta_x, -1000, 1000);
    problems.in_range("delta_y", delta_y, -1000, 1000);
    ScrollRequest {
        position: point(body.x, body.y),
        delta_x: delta_x.clamp(-1000, 1000) as i32,
        delta_y: delta_y.clamp(-1000, 1000) as i32,
        hold_keys: body.hold_keys.unwrap_or_default(),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RegionBody {
    pub x: i64,
    pub y: i64,
    pub width: i64,
    pub height: i64,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScreenshotBody {
    /// Part of the screen to capture; the whole screen if absent.
    pub region: Option<RegionBody>,
}

/// A PNG screenshot of the browser's display.
#[utoipa::path(post, path = "/browsers/{id}/computer/screenshot", request_body = ScreenshotBody,
    responses((status = 200, content_type = "image/png", body = Vec<u8>)))]
pub async fn screenshot(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<ScreenshotBody>,
) -> Result<Response, ApiError> {
    let (session, agent) = screen_of(&org, &id).await?;
    let mut problems = Problems::default();
    let region = body.region.map(|r| {
        problems.in_range("region.x", r.x, 0, session.viewport_width - 1);
        problems.in_range("region.y", r.y, 0, session.viewport_height - 1);
        problems.in_range("region.width", r.width, 1, session.viewport_width - r.x.max(0));
        problems.in_range("region.height", r.height, 1, session.viewport_height - r.y.max(0));
        Region {
            x: r.x.max(0) as u32,
            y: r.y.max(0) as u32,
            width: r.width.max(0) as u32,
            height: r.height.max(0) as u32,
        }
    });
    problems.finish()?;
    let png = agent.screenshot(ScreenshotRequest { region }).await?;
    Ok(([(CONTENT_TYPE, "image/png")], png).into_response())
}
