//! The hosted login page of an auth connection (`hosted_url`): the flow's state and, while
//! it waits for input, a form with the fields it discovered. Needs no API key: its token
//! grants one flow until it expires.

use std::collections::BTreeMap;

use axum::Form;
use axum::extract::State;
use axum::extract::rejection::FormRejection;
use axum::http::StatusCode;
use axum::http::header::CACHE_CONTROL;
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde::Deserialize;
use serde_json::json;
use utoipa::IntoParams;

use super::connections::{check_values, live_view_path};
use crate::api::browsers::replays::escape_html;
use crate::api::error::ApiError;
use crate::api::extract::{PathParam, QueryParams};
use crate::api::state::AppState;
use crate::managed_auth::{Document, FlowStep};
use crate::store::AuthConnectionRecord;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HostedQuery {
    pub jwt: Option<String>,
}

/// The connection of a genuine hosted-login token for `id`.
async fn hosted_connection(
    state: &AppState, id: &str, jwt: Option<&str>,
) -> Result<Option<AuthConnectionRecord>, ApiError> {
    let Some(claims) = jwt.and_then(|jwt| state.tokens.verify_hosted_login(jwt)) else {
        return Ok(None);
    };
    if claims.sub != id {
        return Ok(None);
    }
    Ok(state.store.auth_connection(&claims.org, id).await?)
}

const HOSTED_DENIED: &str = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<title>Login link expired</title></head><body><h1>This login link is invalid or has expired</h1>\
<p>Start a new login flow.</p></body></html>";

/// The page behind `hosted_url`: the flow's state and, while it waits for input, a form
/// with the discovered fields. Needs no API key; the `jwt` grants this flow until it
/// expires.
#[utoipa::path(get, path = "/auth/connections/{id}/hosted",
    params(("id" = String, Path, description = "Auth connection id"), HostedQuery), security(()),
    responses((status = 200, content_type = "text/html", body = String),
        (status = 401, content_type = "text/html", body = String)))]
pub async fn hosted_page(
    State(state): State<AppState>, PathParam(id): PathParam<String>,
    QueryParams(query): QueryParams<HostedQuery>,
) -> Result<Response, ApiError> {
    let Some(record) = hosted_connection(&state, &id, query.jwt.as_deref()).await? else {
        return Ok((StatusCode::UNAUTHORIZED, Html(HOSTED_DENIED)).into_response());
    };
    let document = Document::parse(&record)?;
    let mut body = String::new();
    match &document.flow {
        Some(flow) if flow.in_progress() && flow.step == FlowStep::AwaitingInput => {
            if let Some(error) = &flow.website_error {
                body.push_str(&format!("<p class=\"error\">{}</p>", escape_html(error)));
            }
            body.push_str("<form method=\"post\">");
            for field in flow.discovered_fields.iter().flatten() {
                let kind = if field.kind == "password" { "password" } else { "text" };
                body.push_str(&format!(
                    "<p><label>{label}<br><input type=\"{kind}\" name=\"{name}\" autocomplete=\"off\"></label></p>",
                    label = escape_html(&field.label),
                    name = escape_html(&field.name),
                ));
            }
            body.push_str("<p><button type=\"submit\">Log in</button></p></form>");
            // The flow's browser itself, for what the form cannot do (a challenge).
            let token =
                state.tokens.issue_flow_live_view(&record.id, &record.org_id, flow.expires_at);
            body.push_str(&format!(
                "<h2>Or finish in the browser</h2><iframe title=\"The login browser\" \
                 src=\"{src}&amp;embed=true\" \
                 style=\"width:100%;aspect-ratio:16/9;border:1px solid #ccc\"></iframe>",
                src = escape_html(&live_view_path(&record.id, &token)),
            ));
        }
        Some(flow) if flow.in_progress() => {
            body.push_str("<p>Working…</p><meta http-equiv=\"refresh\" content=\"1\">");
        }
        Some(flow) => body.push_str(&format!(
            "<p>The login flow ended: {}.</p>",
            escape_html(json!(flow.status).as_str().unwrap_or_default())
        )),
        None => body.push_str("<p>No login flow was started.</p>"),
    }
    let page = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>Log in to {domain}</title>\
<style>body{{font-family:sans-serif;max-width:960px;margin:40px auto}}form{{max-width:420px}}\
.error{{color:#b00}}</style></head>\
<body><h1>Log in to {domain}</h1>{body}</body></html>",
        domain = escape_html(&record.domain),
    );
    Ok(([(CACHE_CONTROL, "no-store")], Html(page)).into_response())
}

/// The hosted page's form: submits the values to the flow, then shows the page again.
#[utoipa::path(post, path = "/auth/connections/{id}/hosted",
    params(("id" = String, Path, description = "Auth connection id"), HostedQuery),
    request_body(content = BTreeMap<String, String>, content_type = "application/x-www-form-urlencoded", description = "The discovered fields' values"),
    security(()),
    responses((status = 303, description = "Submitted: back to the page"),
        (status = 401, content_type = "text/html", body = String)))]
pub async fn hosted_submit(
    State(state): State<AppState>, PathParam(id): PathParam<String>,
    QueryParams(query): QueryParams<HostedQuery>,
    form: Result<Form<BTreeMap<String, String>>, FormRejection>,
) -> Result<Response, ApiError> {
    if hosted_connection(&state, &id, query.jwt.as_deref()).await?.is_none() {
        return Ok((StatusCode::UNAUTHORIZED, Html(HOSTED_DENIED)).into_response());
    }
    let Form(fields) = form.map_err(|rejection| match rejection.status() {
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::UnsupportedMediaType(rejection.body_text()),
        _ => ApiError::invalid_field(format!("the form: {}", rejection.body_text())),
    })?;
    check_values(&fields)?;
    state.managed_auth.submit(&id, fields).await?;
    let back = format!("/auth/connections/{id}/hosted?jwt={}", query.jwt.unwrap_or_default());
    Ok(Redirect::to(&back).into_response())
}
