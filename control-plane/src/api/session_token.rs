//! Session-token access to a browser's own routes. Session responses carry `base_url`
//! (`<public url>/browsers/<session id>`); today's SDKs send the calls they route "to the
//! VM" (`curl`, `computer`, `fs`, `process`, `playwright`, `logs/stream`, `telemetry/stream`, and the raw
//! requests of `browsers.request`) there, with the token of `cdp_ws_url` as `?jwt=`
//! instead of an API key. Such a token opens those routes of its own session only (and
//! of a pool browser only while its lease lasts), nothing else. That widens nothing: a
//! holder of `cdp_ws_url` already commands the browser, and the VM is all it reaches.

use axum::extract::{Request, State};
use axum::http::Uri;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::browsers::cdp::lease_holds;
use super::error::ApiError;
use super::state::AppState;

/// The routes under `/browsers/{id}/` a session token opens, as the SDKs route them.
const SUBRESOURCES: [&str; 7] =
    ["curl", "computer", "fs", "process", "playwright", "logs/stream", "telemetry/stream"];

/// The organization a valid session token speaks for; `Org` takes it instead of an API
/// key.
#[derive(Clone, Debug)]
pub struct SessionCaller {
    pub org: String,
}

/// The session id and whether the path is one of `SUBRESOURCES` of it.
fn session_route(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/browsers/")?;
    let (session, tail) = rest.split_once('/')?;
    let opened = SUBRESOURCES
        .iter()
        .any(|prefix| tail == *prefix || tail.starts_with(&format!("{prefix}/")));
    opened.then_some(session)
}

/// The query without its `jwt` (handlers do not know it), and the token.
fn take_jwt(uri: &Uri) -> Option<(String, String)> {
    let query = uri.query()?;
    let mut token = None;
    let rest: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .filter_map(|(key, value)| {
            if key == "jwt" {
                token = Some(value.into_owned());
                None
            } else {
                Some((key.into_owned(), value.into_owned()))
            }
        })
        .collect();
    let rest = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(rest).finish();
    Some((token?, rest))
}

/// Turns `?jwt=` on a session's own routes, without an API key, into a `SessionCaller`.
pub async fn accept_session_tokens(
    State(state): State<AppState>, mut request: Request, next: Next,
) -> Response {
    let has_key = request.headers().contains_key(axum::http::header::AUTHORIZATION);
    let Some(session_id) = session_route(request.uri().path()).map(str::to_owned) else {
        return next.run(request).await;
    };
    let Some((token, rest)) = take_jwt(request.uri()) else {
        return next.run(request).await;
    };
    let path = request.uri().path().to_owned();
    let without_token = if rest.is_empty() { path } else { format!("{path}?{rest}") };
    match without_token.parse::<Uri>() {
        Ok(uri) => *request.uri_mut() = uri,
        Err(_) => return ApiError::invalid_field("a malformed query".to_owned()).into_response(),
    }
    // With an API key too, the key decides (the token is only taken out of the way).
    if has_key {
        return next.run(request).await;
    }
    let Some(claims) = state.tokens.verify_cdp(&token).filter(|claims| claims.sub == session_id)
    else {
        return ApiError::Unauthorized("invalid session token (jwt) for this browser".into())
            .into_response();
    };
    // A pool browser's routes are open only to the lease the token names (the
    // session's own lookup, in the handler, sees to everything else).
    let pooled = match state.store.session(&claims.org, &claims.sub).await {
        Ok(session) => session.is_some_and(|session| session.pool_id.is_some()),
        Err(error) => return ApiError::from(error).into_response(),
    };
    if pooled && let Err(error) = lease_holds(&state, &claims).await {
        return error.into_response();
    }
    request.extensions_mut().insert(SessionCaller { org: claims.org });
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_sessions_own_vm_routes_are_opened() {
        assert_eq!(session_route("/browsers/abc/curl/raw"), Some("abc"));
        assert_eq!(session_route("/browsers/abc/computer/click_mouse"), Some("abc"));
        assert_eq!(session_route("/browsers/abc/logs/stream"), Some("abc"));
        for closed in [
            "/browsers/abc",
            "/browsers/abc/replays",
            "/browsers/abc/logs/other",
            "/browsers/abc/curlx",
            "/profiles/abc/fs",
        ] {
            assert_eq!(session_route(closed), None, "{closed}");
        }
    }

    #[test]
    fn the_token_leaves_the_query() {
        let uri: Uri = "/browsers/a/curl/raw?url=http%3A%2F%2Fx%2F%3Fq%3D1&jwt=t.k.n&q=2"
            .parse()
            .expect("uri");
        let (token, rest) = take_jwt(&uri).expect("jwt");
        assert_eq!(token, "t.k.n");
        assert_eq!(rest, "url=http%3A%2F%2Fx%2F%3Fq%3D1&q=2");
    }
}
