//! The display's clipboard and the pointer's visibility: `computer/clipboard/read`,
//! `computer/clipboard/write` and `computer/cursor`.

use axum::Json;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::screen_of;
use crate::api::error::ApiError;
use crate::api::extract::{JsonBody, PathParam};
use crate::api::org::Org;

#[derive(Debug, Serialize, ToSchema)]
pub struct ClipboardContent {
    /// The clipboard's text; empty when it holds none (or no text).
    pub text: String,
}

/// The text on the browser's clipboard (the X clipboard of its display), such as what a
/// page copied.
#[utoipa::path(post, path = "/browsers/{id}/computer/clipboard/read",
    responses((status = 200, body = ClipboardContent)))]
pub async fn read_clipboard(
    org: Org, PathParam(id): PathParam<String>,
) -> Result<Json<ClipboardContent>, ApiError> {
    let (_, agent) = screen_of(&org, &id).await?;
    let text = agent.read_clipboard().await?;
    Ok(Json(ClipboardContent { text }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteClipboardBody {
    /// Up to 1 MiB of text (the JSON body limit).
    pub text: String,
}

/// Put text on the browser's clipboard, for a page to paste (Ctrl+V).
#[utoipa::path(post, path = "/browsers/{id}/computer/clipboard/write",
    request_body = WriteClipboardBody,
    responses((status = 200, description = "Written")))]
pub async fn write_clipboard(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<WriteClipboardBody>,
) -> Result<StatusCode, ApiError> {
    let (_, agent) = screen_of(&org, &id).await?;
    agent.write_clipboard(body.text).await?;
    Ok(StatusCode::OK)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CursorBody {
    /// Hide (true) or show (false) the pointer.
    pub hidden: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OkResponse {
    pub ok: bool,
}

/// Hide or show the pointer on the browser's display, and in its recordings.
#[utoipa::path(post, path = "/browsers/{id}/computer/cursor", request_body = CursorBody,
    responses((status = 200, body = OkResponse)))]
pub async fn set_cursor(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<CursorBody>,
) -> Result<Json<OkResponse>, ApiError> {
    let (_, agent) = screen_of(&org, &id).await?;
    agent.set_cursor_visibility(body.hidden).await?;
    Ok(Json(OkResponse { ok: true }))
}
