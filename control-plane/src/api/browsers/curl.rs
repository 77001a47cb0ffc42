//! HTTP requests made by the browser itself: `POST /browsers/{id}/curl` answers them as
//! JSON, `/browsers/{id}/curl/raw?url=…` passes them through as they are (the SDKs'
//! `browsers.request` and `browsers.stream`). Chromium makes them from a tab of its own,
//! with its cookies, user agent, proxy and network policy (see the agent's `curl`).

use std::collections::BTreeMap;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use browser_agent_proto::v1::{CurlRequest, CurlResult};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{JsonBody, PathParam};
use crate::api::org::Org;

const DEFAULT_TIMEOUT_MS: i64 = 30_000;
const MAX_TIMEOUT_MS: i64 = 300_000;
/// Largest request body `curl/raw` passes on.
pub const MAX_RAW_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Longest `url` (as the schema says, `openapi::request_url`).
const MAX_URL_CHARS: usize = 4096;
const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CurlBody {
    /// http or https.
    #[schema(schema_with = crate::api::openapi::request_url)]
    pub url: String,
    /// GET (default), HEAD, POST, PUT, PATCH, DELETE or OPTIONS.
    #[schema(pattern = "^(GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS)$")]
    pub method: Option<String>,
    /// Over the browser's own headers for the request.
    #[schema(schema_with = crate::api::openapi::request_headers)]
    pub headers: Option<BTreeMap<String, String>>,
    pub body: Option<String>,
    /// `utf8` (default; invalid sequences replaced) or `base64`.
    #[schema(pattern = "^(utf8|base64)$")]
    pub response_encoding: Option<String>,
    /// Default 30000, at most 300000.
    #[schema(minimum = 1, maximum = 300000)]
    pub timeout_ms: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CurlResponse {
    pub status: u32,
    /// Each header's values, as received.
    pub headers: BTreeMap<String, Vec<String>>,
    /// Decoded (no content encoding), in `response_encoding`.
    pub body: String,
    pub duration_ms: u64,
}

fn checked_method(method: &str, problems: &mut Vec<String>) -> String {
    if !METHODS.contains(&method) {
        problems.push(format!("method must be one of {}", METHODS.join(", ")));
    }
    method.to_owned()
}

fn checked_url(url: &str, problems: &mut Vec<String>) {
    if url.chars().count() > MAX_URL_CHARS {
        problems.push(format!("url must be at most {MAX_URL_CHARS} characters"));
        return;
    }
    match url::Url::parse(url) {
        Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {}
        Ok(_) => problems.push("url must be http or https".into()),
        Err(error) => problems.push(format!("url: {error}")),
    }
}

/// The agent's answer, or a 502 saying why the browser got none.
async fn made_by_browser(
    org: &Org, id: &str, request: CurlRequest,
) -> Result<CurlResult, ApiError> {
    let session = org.sessions.live(&org.id, id).await?;
    let agent = org.sessions.agent(&session)?;
    let result = agent.curl(request).await?;
    match result.failure {
        Some(failure) => Err(ApiError::BadGateway(failure)),
        None => Ok(result),
    }
}

/// Make an HTTP request from the browser (its cookies, user agent, proxy and network
/// policy) and answer its status, headers and body. Redirects are answered, not
/// followed; a request the browser could not complete is a 502.
#[utoipa::path(post, path = "/browsers/{id}/curl", request_body = CurlBody,
    responses((status = 200, body = CurlResponse),
        (status = 502, description = "The browser got no response", body = ErrorBody)))]
pub async fn curl(
    org: Org, PathParam(id): PathParam<String>, JsonBody(body): JsonBody<CurlBody>,
) -> Result<Json<CurlResponse>, ApiError> {
    let mut problems = Vec::new();
    checked_url(&body.url, &mut problems);
    let method = checked_method(body.method.as_deref().unwrap_or("GET"), &mut problems);
    let base64 = match body.response_encoding.as_deref() {
        None | Some("utf8") => false,
        Some("base64") => true,
        Some(other) => {
            problems.push(format!("response_encoding must be utf8 or base64, got {other:?}"));
            false
        }
    };
    for (name, value) in body.headers.iter().flatten() {
        if HeaderName::try_from(name.as_str()).is_err()
            || HeaderValue::try_from(value.as_str()).is_err()
        {
            problems.push(format!("headers: {name:?} is not a valid HTTP header name and value"));
        }
    }
    let timeout_ms = body.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
    if !(1..=MAX_TIMEOUT_MS).contains(&timeout_ms) {
        problems.push(format!("timeout_ms must be between 1 and {MAX_TIMEOUT_MS}"));
    }
    if !problems.is_empty() {
        return Err(ApiError::invalid_fields(problems));
    }
    let result = made_by_browser(
        &org,
        &id,
        CurlRequest {
            url: body.url,
            method,
            headers: body.headers.unwrap_or_default().into_iter().collect(),
            body: body.body.unwrap_or_default().into_bytes(),
            timeout_ms: timeout_ms as u32,
        },
    )
    .await?;
    let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for header in result.headers {
        headers.entry(header.name).or_default().push(header.value);
    }
    Ok(Json(CurlResponse {
        status: result.status,
        headers,
        body: if base64 {
            STANDARD.encode(&result.body)
        } else {
            String::from_utf8_lossy(&result.body).into_owned()
        },
        duration_ms: result.duration_ms,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RawQuery {
    /// The URL to request (http or https); the route's other query parameters are added
    /// to its query.
    #[param(schema_with = crate::api::openapi::request_url)]
    pub url: String,
}

/// Request headers that are the hop's, the caller's credentials, or the caller's client
/// speaking for itself: the browser sets its own.
fn forwarded(name: &HeaderName) -> bool {
    let name = name.as_str();
    !matches!(
        name,
        "host"
            | "authorization"
            | "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "upgrade"
            | "trailer"
            | "content-length"
            | "accept-encoding"
            | "user-agent"
            | "proxy-authorization"
    ) && !name.starts_with("x-stainless-")
        && !name.starts_with("x-kernel-")
}

/// Response headers passed back: not those that no longer describe the body we send (it
/// is decoded, whole), nor those that would act on this server's own origin (cookies,
/// service workers, site data, CORS and CSP) instead of the site's.
fn passed_back(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    !matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "content-length"
            | "content-encoding"
            | "set-cookie"
            | "set-cookie2"
            | "service-worker-allowed"
            | "clear-site-data"
            | "content-security-policy"
            | "content-security-policy-report-only"
            | "x-content-type-options"
            | "x-frame-options"
            | "refresh"
            | "link"
    ) && !name.starts_with("access-control-")
}

/// The browser's request, passed through: the method, headers (but the caller's own
/// client's) and body of this request go to `url`, and the response comes back (decoded;
/// without the headers that would act on this server's origin, and sandboxed by CSP).
/// Redirects are answered, not followed; a request the browser could not complete is a
/// 502 in the Error shape. (`jwt` is this route's own parameter, never the target's.)
#[utoipa::path(method(get, post, put, patch, delete, head, options),
    path = "/browsers/{id}/curl/raw", params(RawQuery),
    responses((status = 200, description = "The response of the URL, whatever its status"),
        (status = 502, description = "The browser got no response", body = ErrorBody)))]
pub async fn raw(
    org: Org, PathParam(id): PathParam<String>, method: Method, uri: Uri, headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut url = None;
    let mut params = Vec::new();
    for (key, value) in url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "url" => url = Some(value.into_owned()),
            _ => params.push((key.into_owned(), value.into_owned())),
        }
    }
    let mut problems = Vec::new();
    let url = match url {
        Some(url) => {
            checked_url(&url, &mut problems);
            url
        }
        None => {
            problems.push("the url query parameter is required".into());
            String::new()
        }
    };
    let method = checked_method(method.as_str(), &mut problems);
    if !problems.is_empty() {
        return Err(ApiError::invalid_fields(problems));
    }
    let url = match url::Url::parse(&url) {
        Ok(mut target) if !params.is_empty() => {
            target.query_pairs_mut().extend_pairs(params);
            target.to_string()
        }
        _ => url,
    };
    let body = axum::body::to_bytes(body, MAX_RAW_BODY_BYTES).await.map_err(|_| {
        ApiError::PayloadTooLarge(format!(
            "a request body passed on is at most {} MiB",
            MAX_RAW_BODY_BYTES >> 20
        ))
    })?;
    let headers: std::collections::HashMap<String, String> = headers
        .iter()
        .filter(|(name, _)| forwarded(name))
        .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_owned())))
        .collect();
    let result = made_by_browser(
        &org,
        &id,
        CurlRequest {
            url,
            method,
            headers,
            body: body.to_vec(),
            timeout_ms: DEFAULT_TIMEOUT_MS as u32,
        },
    )
    .await?;
    let status = u16::try_from(result.status)
        .ok()
        .and_then(|status| StatusCode::from_u16(status).ok())
        .unwrap_or(StatusCode::BAD_GATEWAY);
    let mut response = (status, Bytes::from(result.body)).into_response();
    let headers = response.headers_mut();
    // The response's own content type, or none: not the default for bytes.
    headers.remove(axum::http::header::CONTENT_TYPE);
    // Another site's page, served from this server's origin, must not run there: a
    // browser that opens it gets a sandbox (an opaque origin, no scripts), and no
    // sniffing of its type.
    headers
        .insert(axum::http::header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("sandbox"));
    headers.insert(axum::http::header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    for header in result.headers.iter().filter(|header| passed_back(&header.name)) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::try_from(header.name.as_str()),
            HeaderValue::try_from(header.value.as_str()),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    Ok(response)
}
