//! HTTP requests made by the browser itself (`/browsers/{id}/curl`): Chromium loads the
//! URL in a background tab of its own, so the request carries the browser's cookies,
//! user agent and TLS, and leaves through its proxy and network policy. The DevTools
//! `Fetch` domain pauses the load twice: before the request leaves, to set its method,
//! headers and body, and when the response headers are in, to read the status, headers
//! and body. The response is then replaced by an empty 204, so nothing is rendered or
//! downloaded and redirects are answered, not followed (like curl without `-L`). The
//! cookies it set are stored already (the network stack does that as the headers
//! arrive); `Fetch` leaves `Set-Cookie` out of the headers it shows, so those come from
//! the `Network` domain's raw headers.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::cdp_client::{CdpClient, Event, Incoming};

/// Largest response body read.
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

pub struct CurlRequest {
    pub url: String,
    pub method: String,
    /// Merged over the browser's own (names case-insensitive).
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
    pub timeout: Duration,
}

pub struct CurlResponse {
    pub status: u32,
    /// In the order received; a name may repeat.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub duration: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum CurlError {
    #[error("{0}")]
    Invalid(String),
    /// The browser could not get a response (refused by the network policy, DNS, TLS…).
    #[error("{0}")]
    Failed(String),
    #[error("the browser is not running")]
    NotRunning,
}

const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// Makes the request from a new background tab of the browser at `browser_ws_url`, and
/// closes the tab again.
pub async fn request(
    browser_ws_url: &str, request: CurlRequest,
) -> Result<CurlResponse, CurlError> {
    let parsed = url::Url::parse(&request.url)
        .map_err(|error| CurlError::Invalid(format!("url: {error}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(CurlError::Invalid("url must be http or https".into()));
    }
    if !METHODS.contains(&request.method.as_str()) {
        return Err(CurlError::Invalid(format!("method must be one of {}", METHODS.join(", "))));
    }
    if browser_ws_url.is_empty() {
        return Err(CurlError::NotRunning);
    }
    let started = Instant::now();
    let mut cdp = CdpClient::connect(browser_ws_url).await.map_err(CurlError::Failed)?;
    let target = cdp
        .call("", "Target.createTarget", json!({ "url": "about:blank", "background": true }))
        .await
        .map_err(CurlError::Failed)?;
    let target_id = target["targetId"].as_str().unwrap_or_default().to_owned();
    let timeout = request.timeout;
    let outcome = match tokio::time::timeout(timeout, load(&mut cdp, &target_id, request)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(CurlError::Failed(format!("no response within {} ms", timeout.as_millis()))),
    };
    let _ = cdp.call("", "Target.closeTarget", json!({ "targetId": target_id })).await;
    outcome.map(|(status, headers, body)| CurlResponse {
        status,
        headers,
        body,
        duration: started.elapsed(),
    })
}

type Loaded = (u32, Vec<(String, String)>, Vec<u8>);

async fn load(
    cdp: &mut CdpClient, target_id: &str, request: CurlRequest,
) -> Result<Loaded, CurlError> {
    let failed = CurlError::Failed;
    let attached = cdp
        .call("", "Target.attachToTarget", json!({ "targetId": target_id, "flatten": true }))
        .await
        .map_err(failed)?;
    let session = attached["sessionId"].as_str().unwrap_or_default().to_owned();
    let stages = json!({ "patterns": [
        { "urlPattern": "*", "requestStage": "Request" },
        { "urlPattern": "*", "requestStage": "Response" },
    ]});
    cdp.call(&session, "Fetch.enable", stages).await.map_err(failed)?;
    cdp.call(&session, "Network.enable", json!({})).await.map_err(failed)?;
    let navigation =
        cdp.send(&session, "Page.navigate", json!({ "url": request.url })).await.map_err(failed)?;
    // The id of our request across its two pauses.
    let mut ours: Option<String> = None;
    // `Set-Cookie` values by network request id, from the raw headers.
    let mut cookies: HashMap<String, Vec<String>> = HashMap::new();
    loop {
        let event = match cdp.next().await.map_err(failed)? {
            Incoming::Answer { id, result } if id == navigation => match result {
                Ok(answer) => match answer["errorText"].as_str() {
                    Some(error) if !error.is_empty() => {
                        return Err(failed(format!("the browser could not load the URL: {error}")));
                    }
                    _ => continue,
                },
                Err(error) => return Err(failed(error)),
            },
            Incoming::Answer { .. } => continue,
            Incoming::Event(event) if event.session == session => event,
            Incoming::Event(_) => continue,
        };
        match event.method.as_str() {
            "Fetch.requestPaused" => {
                if let Some(mut loaded) = paused(cdp, &session, &event, &request, &mut ours).await?
                {
                    let network_id = event.params["networkId"].as_str().unwrap_or_default();
                    let queued = cdp.queued_events().filter_map(set_cookies);
                    for (id, values) in queued.chain(cookies.drain()) {
                        if id == network_id {
                            loaded.1.extend(
                                values.into_iter().map(|value| ("Set-Cookie".to_owned(), value)),
                            );
                        }
                    }
                    return Ok(loaded);
                }
            }
            "Network.responseReceivedExtraInfo" => {
                if let Some((id, values)) = set_cookies(&event) {
                    cookies.insert(id, values);
                }
            }
            "Network.loadingFailed" if event.params["type"] == "Document" => {
                let reason = event.params["errorText"].as_str().unwrap_or("the request failed");
                return Err(failed(format!("the browser could not load the URL: {reason}")));
            }
            _ => {}
        }
    }
}

/// Handles one pause: our request on its way out (method, headers and body set), our
/// response on its way in (read, then replaced), anything else let through.
async fn paused(
    cdp: &mut CdpClient, session: &str, event: &Event, request: &CurlRequest,
    ours: &mut Option<String>,
) -> Result<Option<Loaded>, CurlError> {
    let failed = CurlError::Failed;
    let params = &event.params;
    let request_id = params["requestId"].as_str().unwrap_or_default();
    let is_document = params["resourceType"] == "Document";
    let at_response =
        params.get("responseStatusCode").is_some() || params.get("responseErrorReason").is_some();
    if !at_response {
        if ours.is_none() && is_document {
            *ours = Some(request_id.to_owned());
            let mut continued = json!({
                "requestId": request_id,
                "method": request.method,
                "headers": merged_headers(&params["request"]["headers"], &request.headers),
            });
            if !request.body.is_empty() {
                continued["postData"] = Value::String(STANDARD.encode(&request.body));
            }
            cdp.call(session, "Fetch.continueRequest", continued).await.map_err(failed)?;
        } else {
            let _ = cdp
                .call(session, "Fetch.continueRequest", json!({ "requestId": request_id }))
                .await;
        }
        return Ok(None);
    }
    if ours.as_deref() != Some(request_id) {
        let _ =
            cdp.call(session, "Fetch.continueRequest", json!({ "requestId": request_id })).await;
        return Ok(None);
    }
    if params.get("responseErrorReason").is_some() {
        // Let it fail: the network error's own name (net::ERR_…) follows.
        let _ =
            cdp.call(session, "Fetch.continueRequest", json!({ "requestId": request_id })).await;
        return Ok(None);
    }
    let status = params["responseStatusCode"].as_u64().unwrap_or(0) as u32;
    let headers: Vec<(String, String)> = params["responseHeaders"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|header| {
            let text = |key: &str| header[key].as_str().unwrap_or_default().to_owned();
            (text("name"), text("value"))
        })
        .collect();
    // A redirect or a HEAD has no body to read (Chromium refuses); that is an empty one.
    let body = match cdp
        .call(session, "Fetch.getResponseBody", json!({ "requestId": request_id }))
        .await
    {
        Ok(answer) => {
            let text = answer["body"].as_str().unwrap_or_default();
            if answer["base64Encoded"].as_bool().unwrap_or(false) {
                STANDARD
                    .decode(text)
                    .map_err(|error| failed(format!("the body came garbled: {error}")))?
            } else {
                text.as_bytes().to_vec()
            }
        }
        Err(_) => Vec::new(),
    };
    if body.len() > MAX_BODY_BYTES {
        return Err(failed(format!(
            "the response body is larger than {} MiB",
            MAX_BODY_BYTES >> 20
        )));
    }
    let replaced = json!({ "requestId": request_id, "responseCode": 204, "responseHeaders": [] });
    cdp.call(session, "Fetch.fulfillRequest", replaced).await.map_err(failed)?;
    Ok(Some((status, headers, body)))
}

/// The `Set-Cookie` values of a `Network.responseReceivedExtraInfo` event, by request id
/// (raw headers join repeated values with newlines).
fn set_cookies(event: &Event) -> Option<(String, Vec<String>)> {
    if event.method != "Network.responseReceivedExtraInfo" {
        return None;
    }
    let headers = event.params["headers"].as_object()?;
    let values: Vec<String> = headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("set-cookie"))
        .filter_map(|(_, value)| value.as_str())
        .flat_map(|value| value.split('\n').map(str::to_owned))
        .collect();
    Some((event.params["requestId"].as_str()?.to_owned(), values))
}

/// The browser's headers for the request with the caller's over them (a caller's name
/// replaces the browser's of any case).
fn merged_headers(browser: &Value, custom: &BTreeMap<String, String>) -> Vec<Value> {
    let mut headers: Vec<(String, String)> = browser
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(name, _)| !custom.keys().any(|key| key.eq_ignore_ascii_case(name)))
        .map(|(name, value)| (name.clone(), value.as_str().unwrap_or_default().to_owned()))
        .collect();
    headers.extend(custom.iter().map(|(name, value)| (name.clone(), value.clone())));
    headers.into_iter().map(|(name, value)| json!({ "name": name, "value": value })).collect()
}
