//! The web console at `/console`: a page of ours (`index.html`, `console.css` and the
//! script modules listed in `ASSETS`, compiled into the binary, no build step and
//! nothing from elsewhere) that calls the public API as the signed-in principal, same
//! origin, with the session cookie. It holds no rights of its own: what it shows and may change is what the
//! API answers that principal, so another project's or organization's resources are
//! 404 there as everywhere.
//!
//! Signing in: with OpenID Connect (`crate::api::auth::sign_in`) or by pasting an API key into
//! the form here, which starts a server-side session (`crate::people::sessions`); the
//! key itself is never stored, in the browser or here. Cross-site request forgery is
//! refused by the `Org` extractor (changes need a same-origin request) and by the
//! SameSite=Strict cookie; the pages run under a Content-Security-Policy without
//! inline script.

mod host;

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, LOCATION, REFERRER_POLICY, SET_COOKIE,
    X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use browser_agent_proto::v1::ScreenshotRequest;
use serde_json::{Value, json};

use super::auth::sign_in::{end_session, session_cookie};
use super::error::ApiError;
use super::extract::PathParam;
use super::org::{Org, same_origin};
use super::state::AppState;
use crate::access::keys::Refused;
use crate::access::policy::KINDS;
use crate::people::sessions;

const SHELL: &str = include_str!("index.html");
/// The console's files under `/console/assets/`: its style and its script modules
/// (`console.js` routes; `ui.js` is what every page uses; one module per group of pages).
const ASSETS: [(&str, &str, &str); 7] = [
    ("console.css", "text/css; charset=utf-8", include_str!("console.css")),
    ("console.js", JAVASCRIPT, include_str!("console.js")),
    ("ui.js", JAVASCRIPT, include_str!("ui.js")),
    ("browsers.js", JAVASCRIPT, include_str!("browsers.js")),
    ("resources.js", JAVASCRIPT, include_str!("resources.js")),
    ("team.js", JAVASCRIPT, include_str!("team.js")),
    ("host.js", JAVASCRIPT, include_str!("host.js")),
];
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";
/// No inline script or style, nothing from another origin; the live view and the
/// inspector (pages of ours) may be framed.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; media-src 'self'; connect-src 'self'; frame-src 'self'; \
     form-action 'self'; base-uri 'none'; frame-ancestors 'none'";
/// A browser's thumbnail is taken at most this often, whoever looks.
const THUMBNAIL_EVERY: Duration = Duration::from_secs(3);
/// Thumbnails kept at most (the oldest are forgotten first when full).
const MAX_THUMBNAILS: usize = 256;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/console", get(shell))
        .route("/console/{*page}", get(shell))
        .route("/console/assets/{name}", get(asset))
        .route("/console/sign-in", post(sign_in))
        .route("/console/sign-out", post(sign_out))
        .route("/console/me", get(me))
        .route("/console/host-report", get(host::host))
        .route("/console/thumbnails/{id}", get(thumbnail))
}

/// The console's one page (every path under `/console` is a view of it).
async fn shell(State(state): State<AppState>) -> Response {
    let oidc = if state.settings.oidc.is_some() {
        "<p><a class=\"button\" href=\"/auth/oidc/login?return_to=/console\">Sign in with \
         your identity provider</a></p>"
    } else {
        ""
    };
    (
        [
            (CONTENT_SECURITY_POLICY, POLICY),
            (CACHE_CONTROL, "no-store"),
            (REFERRER_POLICY, "same-origin"),
            (X_FRAME_OPTIONS, "DENY"),
            (X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (CONTENT_TYPE, "text/html; charset=utf-8"),
        ],
        SHELL.replace("<!--oidc-->", oidc),
    )
        .into_response()
}

/// One of `ASSETS`, by name.
async fn asset(PathParam(name): PathParam<String>) -> Result<Response, ApiError> {
    let (_, content_type, body) = ASSETS
        .iter()
        .find(|(file, _, _)| *file == name)
        .ok_or_else(|| ApiError::NotFound(format!("the console has no file {name:?}")))?;
    Ok((
        [
            (CONTENT_TYPE, *content_type),
            (CACHE_CONTROL, "no-cache"),
            (X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        *body,
    )
        .into_response())
}

fn see_other(location: &str, cookie: Option<axum::http::HeaderValue>) -> Response {
    let mut headers = HeaderMap::new();
    if let Ok(location) = location.parse() {
        headers.insert(LOCATION, location);
    }
    if let Some(cookie) = cookie {
        headers.insert(SET_COOKIE, cookie);
    }
    (StatusCode::SEE_OTHER, headers).into_response()
}

/// The sign-in form's post (`api_key`, form-encoded): a session acting with that key's
/// rights while the key lives. Only from our own page: another site must not sign a
/// visitor in as someone else.
async fn sign_in(
    State(state): State<AppState>, headers: HeaderMap, body: Bytes,
) -> Result<Response, ApiError> {
    if !same_origin(&headers) {
        return Err(ApiError::Forbidden(
            "signing in must come from this server's own sign-in page (same origin)".into(),
        ));
    }
    let form: HashMap<String, String> = serde_urlencoded::from_bytes(&body)
        .map_err(|_| ApiError::invalid_field("the sign-in form must be form-encoded"))?;
    let presented = form
        .get("api_key")
        .map(|key| key.trim())
        .filter(|key| !key.is_empty())
        .ok_or_else(|| ApiError::invalid_field("api_key: paste an API key to sign in"))?;
    let key = match state.api_keys.authenticate(presented).await? {
        Ok(key) => key,
        Err(Refused::Expired(_)) => return Ok(see_other("/console?sign_in=expired", None)),
        Err(_) => return Ok(see_other("/console?sign_in=invalid", None)),
    };
    let principal = sessions::Principal::Key { key_id: key.id.clone() };
    let secret = sessions::start(&*state.store, &key.org_id, &principal).await?;
    tracing::info!(org_id = %key.org_id, key = %key.id, "an API key signed in to the console");
    Ok(see_other("/console/sessions", Some(session_cookie(&state, &secret))))
}

/// Ends the session (every replica forgets it) and goes back to the sign-in page.
async fn sign_out(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    if !same_origin(&headers) {
        return Err(ApiError::Forbidden(
            "signing out must come from this server's own pages (same origin)".into(),
        ));
    }
    let cleared = end_session(&state, &headers).await?;
    Ok(see_other("/console", Some(cleared)))
}

/// Who is signed in, and what their rights allow in the project they look at (for the
/// console to offer only what the API would accept; the API decides all the same).
async fn me(org: Org) -> Result<Json, ApiError> {
    let mut can = serde_json::Map::new();
    for kind in KINDS {
        let mut verbs = serde_json::Map::new();
        for verb in ["read", "write", "use"] {
            verbs.insert(verb.into(), org.allows(kind, verb, "*").await?.into());
        }
        can.insert(kind.into(), verbs.into());
    }
    let (principal, name) = match (org.caller.person(), org.caller.key()) {
        (Some(person), _) => (
            json!({ "type": "user", "role": person.role, "email": person.email }),
            person.name.clone().unwrap_or_else(|| person.email.clone()),
        ),
        (None, Some(key)) => (
            json!({ "type": "api_key", "id": key.id, "masked_key": crate::access::keys::masked(key) }),
            key.name.clone(),
        ),
        (None, None) => (json!({ "type": "other" }), String::new()),
    };
    Ok(axum::Json(json!({
        "organization": { "id": org.id },
        "project": org.project.as_ref().map(|p| json!({ "id": p.id, "name": p.name })),
        "principal": principal,
        "name": name,
        "can": can,
        "oidc": org.settings.oidc.is_some(),
        "operator": host::is_operator(&org),
    })))
}

type Json = axum::Json<Value>;

/// Recent thumbnails by session id: (taken at, PNG).
static THUMBNAILS: LazyLock<Mutex<HashMap<String, (Instant, Bytes)>>> =
    LazyLock::new(Mutex::default);

/// A live headful browser's screen as a PNG, taken at most every `THUMBNAIL_EVERY`
/// whoever asks. The bytes are the agent's screenshot, passed on as the screenshot
/// route passes them (never decoded here), as an image the console's `<img>` shows.
async fn thumbnail(org: Org, PathParam(id): PathParam<String>) -> Result<Response, ApiError> {
    let session = org.sessions.live(&org.id, &id).await?;
    if session.headless {
        return Err(ApiError::NotFound("a headless browser has no screen to show".into()));
    }
    let cached = THUMBNAILS.lock().ok().and_then(|thumbnails| {
        thumbnails
            .get(&session.id)
            .filter(|(taken, _)| taken.elapsed() < THUMBNAIL_EVERY)
            .map(|(_, png)| png.clone())
    });
    let png = match cached {
        Some(png) => png,
        None => {
            let agent = org.sessions.agent(&session)?;
            let png = Bytes::from(agent.screenshot(ScreenshotRequest { region: None }).await?);
            if let Ok(mut thumbnails) = THUMBNAILS.lock() {
                if thumbnails.len() >= MAX_THUMBNAILS {
                    thumbnails.retain(|_, (taken, _)| taken.elapsed() < THUMBNAIL_EVERY);
                    if thumbnails.len() >= MAX_THUMBNAILS {
                        thumbnails.clear();
                    }
                }
                thumbnails.insert(session.id.clone(), (Instant::now(), png.clone()));
            }
            png
        }
    };
    Ok((
        [
            (CONTENT_TYPE, "image/png"),
            (CACHE_CONTROL, "private, max-age=3"),
            (X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        png,
    )
        .into_response())
}
