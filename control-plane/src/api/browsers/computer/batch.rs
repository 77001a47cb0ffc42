//! `POST /browsers/{id}/computer/batch`: several computer actions in one call, run in
//! order by the agent without a round trip per action.

use std::time::Duration;

use axum::http::StatusCode;
use browser_agent_proto::v1::{ActionBatch, CursorVisibility, InputAction, input_action};
use serde::Deserialize;
use utoipa::ToSchema;

use super::desktop::CursorBody;
use super::{
    ClickMouseBody, DragMouseBody, MAX_ACTION_DURATION, MAX_DELAY_MS, MoveMouseBody, PressKeyBody,
    Problems, ScrollBody, TypeBody, click_request, drag_request, motion_time, move_request,
    press_request, screen_of, scroll_request, type_request,
};
use crate::api::error::ApiError;
use crate::api::extract::{JsonBody, PathParam};
use crate::api::org::Org;

/// Most actions one batch may hold.
pub const MAX_BATCH_ACTIONS: usize = 100;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    /// 1 to 100 actions, run in order.
    pub actions: Vec<BatchAction>,
}

/// One action: `type` names it, and the field of that name holds its parameters (the
/// same as the action's own route).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchAction {
    /// click_mouse, move_mouse, type_text, press_key, scroll, drag_mouse, set_cursor or
    /// sleep.
    #[serde(rename = "type")]
    pub kind: String,
    pub click_mouse: Option<ClickMouseBody>,
    pub move_mouse: Option<MoveMouseBody>,
    pub type_text: Option<TypeBody>,
    pub press_key: Option<PressKeyBody>,
    pub scroll: Option<ScrollBody>,
    pub drag_mouse: Option<DragMouseBody>,
    pub sleep: Option<SleepBody>,
    pub set_cursor: Option<CursorBody>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SleepBody {
    /// 0 to 60000.
    pub duration_ms: i64,
}

/// Run computer actions in order in one call. Every action is checked before the first
/// runs (a 400 names each problem by index); while running, the first failure stops the
/// batch and its error names the failing index.
#[utoipa::path(post, path = "/browsers/{id}/computer/batch", request_body = BatchBody,
    responses((status = 200, description = "Every action ran")))]
pub async fn batch(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<BatchBody>,
) -> Result<StatusCode, ApiError> {
    let (session, agent) = screen_of(&org, &id).await?;
    let mut problems = Problems::default();
    if body.actions.is_empty() || body.actions.len() > MAX_BATCH_ACTIONS {
        problems.add(format!(
            "actions must hold 1 to {MAX_BATCH_ACTIONS} actions, got {}",
            body.actions.len()
        ));
    }
    let mut actions = Vec::with_capacity(body.actions.len());
    let mut expected = Duration::ZERO;
    for (index, action) in body.actions.into_iter().enumerate() {
        problems.prefix = format!("actions[{index}].{}: ", action.kind);
        let (action, takes) = checked(&session, action, &mut problems);
        expected += takes;
        actions.push(InputAction { action });
    }
    problems.prefix.clear();
    if expected > MAX_ACTION_DURATION {
        problems.add(format!(
            "the batch would take {} s; the limit is {} s",
            expected.as_secs(),
            MAX_ACTION_DURATION.as_secs()
        ));
    }
    problems.finish()?;
    agent.run_actions(ActionBatch { actions }, expected).await?;
    Ok(StatusCode::OK)
}

/// The action for the agent, checked, and how long it will take.
fn checked(
    session: &crate::store::SessionRecord, action: BatchAction, problems: &mut Problems,
) -> (Option<input_action::Action>, Duration) {
    use input_action::Action as Kind;
    let given = [
        ("click_mouse", action.click_mouse.is_some()),
        ("move_mouse", action.move_mouse.is_some()),
        ("type_text", action.type_text.is_some()),
        ("press_key", action.press_key.is_some()),
        ("scroll", action.scroll.is_some()),
        ("drag_mouse", action.drag_mouse.is_some()),
        ("sleep", action.sleep.is_some()),
        ("set_cursor", action.set_cursor.is_some()),
    ];
    for (field, _) in given.iter().filter(|(field, set)| *set && *field != action.kind) {
        problems.add(format!("{field} does not belong to an action of this type"));
    }
    let missing = |problems: &mut Problems| {
        problems.add(format!("the action's parameters (`{}`) are required", action.kind));
        (None, Duration::ZERO)
    };
    match action.kind.as_str() {
        "click_mouse" => match action.click_mouse {
            Some(body) => {
                (Some(Kind::ClickMouse(click_request(session, body, problems))), Duration::ZERO)
            }
            None => missing(problems),
        },
        "move_mouse" => match action.move_mouse {
            Some(body) => {
                let request = move_request(session, body, problems);
                let takes = motion_time(request.smooth, request.duration_ms);
                (Some(Kind::MoveMouse(request)), takes)
            }
            None => missing(problems),
        },
        "drag_mouse" => match action.drag_mouse {
            Some(body) => {
                let (request, takes) = drag_request(session, body, problems);
                (Some(Kind::DragMouse(request)), takes)
            }
            None => missing(problems),
        },
        "type_text" => match action.type_text {
            Some(body) => {
                let (request, takes) = type_request(body, problems);
                (Some(Kind::TypeText(request)), takes)
            }
            None => missing(problems),
        },
        "press_key" => match action.press_key {
            Some(body) => {
                let (request, takes) = press_request(body, problems);
                (Some(Kind::PressKeys(request)), takes)
            }
            None => missing(problems),
        },
        "scroll" => match action.scroll {
            Some(body) => {
                (Some(Kind::Scroll(scroll_request(session, body, problems))), Duration::ZERO)
            }
            None => missing(problems),
        },
        "sleep" => match action.sleep {
            Some(SleepBody { duration_ms }) => {
                problems.in_range("duration_ms", duration_ms, 0, MAX_DELAY_MS);
                let ms = duration_ms.clamp(0, MAX_DELAY_MS) as u32;
                (Some(Kind::SleepMs(ms)), Duration::from_millis(ms.into()))
            }
            None => missing(problems),
        },
        "set_cursor" => match action.set_cursor {
            Some(body) => {
                (Some(Kind::SetCursor(CursorVisibility { hidden: body.hidden })), Duration::ZERO)
            }
            None => missing(problems),
        },
        other => {
            problems.add(format!(
                "type must be one of click_mouse, move_mouse, type_text, press_key, scroll, \
                 drag_mouse, set_cursor, sleep; got {other:?}"
            ));
            (None, Duration::ZERO)
        }
    }
}
