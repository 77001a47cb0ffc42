//! People signing in with OpenID Connect (`crate::people`): `GET /auth/oidc/login`
//! sends the browser to the provider (authorization code with PKCE), the provider sends
//! it back to `GET /auth/oidc/callback`, which checks the ID token and starts the
//! person's session (`crate::people::sessions`, its secret in an HttpOnly cookie);
//! `POST /auth/oidc/logout` ends it. Browser routes, outside the OpenAPI document:
//! programs use API keys.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use chrono::Utc;
use serde::Deserialize;
use serde_json::Value;

use crate::api::error::ApiError;
use crate::api::state::AppState;
use crate::people::oidc::{OidcProvider, SignInError};
use crate::people::{
    Role, SESSION_COOKIE, SESSION_HOURS, SIGN_IN_AUDIENCE, SIGN_IN_COOKIE, SIGN_IN_MINUTES,
    SessionClaims, SignInClaims, cookie, safe_return_path, sessions,
};

pub const LOGIN_PATH: &str = "/auth/oidc/login";
pub const CALLBACK_PATH: &str = "/auth/oidc/callback";
pub const LOGOUT_PATH: &str = "/auth/oidc/logout";

#[derive(Debug, Deserialize)]
pub struct LoginQuery {
    return_to: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

fn provider(state: &AppState) -> Result<&OidcProvider, ApiError> {
    state.settings.oidc.as_deref().ok_or_else(|| {
        ApiError::NotFound(
            "sign-in with OpenID Connect is not configured on this server (--oidc-issuer)".into(),
        )
    })
}

impl From<SignInError> for ApiError {
    fn from(error: SignInError) -> Self {
        match error {
            SignInError::Provider(_) => Self::BadGateway(error.to_string()),
            SignInError::Token(_) => Self::Unauthorized(error.to_string()),
        }
    }
}

/// `Set-Cookie` for `name`, HttpOnly, Secure when the server is reached over HTTPS.
pub fn set_cookie(state: &AppState, name: &str, value: &str, attributes: &str) -> HeaderValue {
    let secure = if state.settings.public_url.starts_with("https://") { "; Secure" } else { "" };
    HeaderValue::from_str(&format!("{name}={value}; HttpOnly{secure}; {attributes}"))
        .unwrap_or_else(|_| HeaderValue::from_static(""))
}

fn callback_url(state: &AppState) -> String {
    format!("{}{CALLBACK_PATH}", state.settings.public_url)
}

/// Sends the browser to the provider to sign in.
pub async fn login(
    State(state): State<AppState>, Query(query): Query<LoginQuery>,
) -> Result<Response, ApiError> {
    let provider = provider(&state)?;
    let claims = SignInClaims {
        state: crate::ids::new_secret(32),
        nonce: crate::ids::new_secret(32),
        verifier: crate::ids::new_secret(64),
        return_to: safe_return_path(query.return_to.as_deref()),
        aud: SIGN_IN_AUDIENCE.into(),
        exp: (Utc::now() + chrono::Duration::minutes(SIGN_IN_MINUTES)).timestamp(),
    };
    let location = provider
        .authorization_url(&callback_url(&state), &claims.state, &claims.nonce, &claims.verifier)
        .await?;
    let token = state.tokens.issue_claims(&claims);
    let mut headers = HeaderMap::new();
    headers.insert(
        header::LOCATION,
        HeaderValue::from_str(&location).map_err(|_| {
            ApiError::BadGateway("the provider's authorization URL is unusable".into())
        })?,
    );
    // Lax: the provider's redirect back is a top-level navigation from its site.
    headers.insert(
        header::SET_COOKIE,
        set_cookie(
            &state,
            SIGN_IN_COOKIE,
            &token,
            &format!("SameSite=Lax; Path=/auth/oidc; Max-Age={}", SIGN_IN_MINUTES * 60),
        ),
    );
    Ok((StatusCode::SEE_OTHER, headers).into_response())
}

/// The provider sends the browser back here with a code; the person is signed in.
pub async fn callback(
    State(state): State<AppState>, Query(query): Query<CallbackQuery>, request_headers: HeaderMap,
) -> Result<Response, ApiError> {
    let provider = provider(&state)?;
    let started = cookie(&request_headers, SIGN_IN_COOKIE)
        .and_then(|token| state.tokens.verify_claims::<SignInClaims>(token, SIGN_IN_AUDIENCE))
        .ok_or_else(|| {
            ApiError::invalid_field(format!(
                "this sign-in expired or did not start here: start again at {LOGIN_PATH}"
            ))
        })?;
    if let Some(error) = &query.error {
        return Err(ApiError::Unauthorized(format!(
            "the identity provider refused the sign-in: {error}"
        )));
    }
    if query.state.as_deref() != Some(started.state.as_str()) {
        return Err(ApiError::invalid_field(
            "state does not match this browser's sign-in (a forged callback?)",
        ));
    }
    let code = query
        .code
        .as_deref()
        .ok_or_else(|| ApiError::invalid_field("the provider sent no code"))?;
    let claims =
        provider.sign_in(code, &callback_url(&state), &started.verifier, &started.nonce).await?;
    let person = session_of(&state, provider, &claims).await?;
    tracing::info!(subject = %person.sub, org_id = %person.org, role = ?person.role, "a person signed in");
    let org_id = person.org.clone();
    let secret =
        sessions::start(&*state.store, &org_id, &sessions::Principal::Person(person.clone()))
            .await?;
    let mut headers = HeaderMap::new();
    headers.append(header::SET_COOKIE, session_cookie(&state, &secret));
    headers.append(
        header::SET_COOKIE,
        set_cookie(&state, SIGN_IN_COOKIE, "", "SameSite=Lax; Path=/auth/oidc; Max-Age=0"),
    );
    // A page of ours moves on: the browser sends a SameSite=Strict cookie on a
    // navigation this site starts, not at the end of the provider's redirects.
    let target = html_escape(&started.return_to);
    let page = format!(
        "<!doctype html><meta charset=utf-8><meta http-equiv=refresh content=\"0;url={target}\">\
         <title>Signed in</title><p>Signed in as {}. <a href=\"{target}\">Continue</a>",
        html_escape(if person.email.is_empty() { &person.sub } else { &person.email })
    );
    Ok((StatusCode::OK, headers, Html(page)).into_response())
}

/// The `Set-Cookie` of a new signed-in session.
pub fn session_cookie(state: &AppState, secret: &str) -> HeaderValue {
    set_cookie(
        state,
        SESSION_COOKIE,
        secret,
        &format!("SameSite=Strict; Path=/; Max-Age={}", SESSION_HOURS * 3600),
    )
}

/// Ends the session the request's cookie holds, on every replica (the store forgets
/// it), and clears the cookie; answers the `Set-Cookie` that clears it.
pub async fn end_session(
    state: &AppState, request_headers: &HeaderMap,
) -> Result<HeaderValue, ApiError> {
    if let Some(secret) = cookie(request_headers, SESSION_COOKIE) {
        sessions::end(&*state.store, secret).await?;
    }
    Ok(set_cookie(state, SESSION_COOKIE, "", "SameSite=Strict; Path=/; Max-Age=0"))
}

/// Ends the person's session.
pub async fn logout(
    State(state): State<AppState>, request_headers: HeaderMap,
) -> Result<Response, ApiError> {
    let mut headers = HeaderMap::new();
    headers.insert(header::SET_COOKIE, end_session(&state, &request_headers).await?);
    Ok((StatusCode::NO_CONTENT, headers).into_response())
}

/// The session of the person the ID token `claims` describe: their organization and
/// role from the configured claims, refused (403) when either is missing or unknown.
async fn session_of(
    state: &AppState, provider: &OidcProvider, claims: &serde_json::Map<String, Value>,
) -> Result<SessionClaims, ApiError> {
    let settings = provider.settings();
    let organization = claims
        .get(&settings.organization_claim)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|name| !name.is_empty() && !name.starts_with('('))
        .ok_or_else(|| {
            ApiError::Forbidden(format!(
                "your identity provider does not say which organization you belong to (claim {:?})",
                settings.organization_claim
            ))
        })?;
    let role = match claims.get(&settings.role_claim) {
        Some(Value::String(role)) => Role::parse(role),
        Some(Value::Array(roles)) => roles.iter().filter_map(Value::as_str).find_map(Role::parse),
        _ => None,
    }
    .ok_or_else(|| {
        ApiError::Forbidden(format!(
            "your identity provider gives you no role of this server (claim {:?}: admin, member or viewer)",
            settings.role_claim
        ))
    })?;
    let org = state.store.ensure_organization(organization).await?;
    let text = |name: &str| claims.get(name).and_then(Value::as_str).map(str::to_owned);
    Ok(SessionClaims {
        sub: text("sub").unwrap_or_default(),
        idp: settings.issuer.clone(),
        org: org.id,
        role,
        email: text("email").unwrap_or_default(),
        name: text("name"),
    })
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}
