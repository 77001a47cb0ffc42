//! MCP resources: what an assistant may read (and attach to a conversation) rather than
//! call: the caller's browsers, a browser's screen, its replays and their videos. Like
//! the tools, every read is made of REST calls with the caller's credentials, so another
//! organization's browser is not found.
//!
//! `kernel://browsers`                                the caller's browsers (JSON)
//! `kernel://browsers/{session_id}`                   one browser (JSON)
//! `kernel://browsers/{session_id}/screenshot`        what it shows now (PNG)
//! `kernel://browsers/{session_id}/replays`           its replays (JSON)
//! `kernel://browsers/{session_id}/replays/{replay_id}`  a finished replay (MP4)

use axum::http::request::Parts;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use rmcp::ErrorData;
use rmcp::model::{
    CacheScope, ListResourceTemplatesResult, ListResourcesResult, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate,
};
use serde_json::Value;

use super::rest::{Failure, segment};
use super::tools::{BrowserTools, Picture};

const PREFIX: &str = "kernel://browsers";

/// The longest replay video read as a resource: base64 makes it a third larger again in
/// the JSON answer. Longer ones are downloaded over REST.
const MAX_REPLAY_BYTES: usize = 16 * 1024 * 1024;

/// The browsers whose resources a listing names (it is one REST call per listing).
const LISTED_BROWSERS: usize = 50;

/// A resource address, parsed.
#[derive(Debug, PartialEq)]
enum Address<'a> {
    Browsers,
    Browser(&'a str),
    Screenshot(&'a str),
    Replays(&'a str),
    Replay(&'a str, &'a str),
}

fn parse(uri: &str) -> Option<Address<'_>> {
    let rest = uri.strip_prefix(PREFIX)?;
    if rest.is_empty() {
        return Some(Address::Browsers);
    }
    let parts: Vec<&str> = rest.strip_prefix('/')?.split('/').collect();
    if parts.iter().any(|part| part.is_empty()) {
        return None;
    }
    match parts.as_slice() {
        [id] => Some(Address::Browser(id)),
        [id, "screenshot"] => Some(Address::Screenshot(id)),
        [id, "replays"] => Some(Address::Replays(id)),
        [id, "replays", replay] => Some(Address::Replay(id, replay)),
        _ => None,
    }
}

/// Resources are the caller's own and change from one moment to the next: never cached
/// for anyone else, nor for long.
fn private_and_fresh(contents: Vec<ResourceContents>) -> ReadResourceResult {
    ReadResourceResult::new(contents).with_ttl_ms(0).with_cache_scope(CacheScope::Private)
}

fn json_contents(uri: &str, value: &Value) -> ResourceContents {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    ResourceContents::text(text, uri).with_mime_type("application/json")
}

fn resource(uri: String, name: String, description: &str, mime_type: &str) -> Resource {
    Resource::new(uri, name).with_description(description).with_mime_type(mime_type)
}

/// A refused read, as MCP clients expect it: "not found" for what the caller cannot see
/// (or that does not exist), an invalid request for the caller's other mistakes (a
/// replay not finished, one too long, a key without the right), an internal error
/// otherwise; each with the API's status and message.
fn read_failure(uri: &str, Failure(text): Failure) -> ErrorData {
    let message = format!("{uri}: {text}");
    if text.starts_with("404") {
        ErrorData::resource_not_found(message, None)
    } else if text.starts_with('4') || text.starts_with("the answer is larger") {
        ErrorData::invalid_request(message, None)
    } else {
        ErrorData::internal_error(message, None)
    }
}

impl BrowserTools {
    /// The templates of every resource, for clients that build addresses themselves.
    pub(super) fn resource_templates() -> ListResourceTemplatesResult {
        let template = |path: &str, name: &str, description: &str, mime_type: &str| {
            ResourceTemplate::new(format!("{PREFIX}{path}"), name)
                .with_description(description)
                .with_mime_type(mime_type)
        };
        ListResourceTemplatesResult::with_all_items(vec![
            template(
                "/{session_id}",
                "browser",
                "One browser: its settings, status and URLs.",
                "application/json",
            ),
            template(
                "/{session_id}/screenshot",
                "screenshot",
                "A PNG of what the browser shows when read (its page when headless).",
                "image/png",
            ),
            template(
                "/{session_id}/replays",
                "replays",
                "The browser's replays (video recordings): ids, status, times, view URLs.",
                "application/json",
            ),
            template(
                "/{session_id}/replays/{replay_id}",
                "replay video",
                "A finished replay's MP4 video (at most 16 MiB through MCP).",
                "video/mp4",
            ),
        ])
        .with_ttl_ms(0)
        .with_cache_scope(CacheScope::Private)
    }

    /// The caller's browsers (the first 50), each with its screenshot and replays.
    pub(super) async fn resources(&self, caller: &Parts) -> Result<ListResourcesResult, ErrorData> {
        let browsers =
            self.get(caller, "/browsers").await.map_err(|failure| read_failure(PREFIX, failure))?;
        let mut listed = vec![resource(
            PREFIX.into(),
            "browsers".into(),
            "Your browsers: settings, status and URLs.",
            "application/json",
        )];
        let ids = browsers
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|browser| browser["session_id"].as_str())
            .take(LISTED_BROWSERS);
        for id in ids {
            let uri = format!("{PREFIX}/{id}");
            listed.push(resource(
                format!("{uri}/screenshot"),
                format!("screenshot of {id}"),
                "A PNG of what the browser shows when read (its page when headless).",
                "image/png",
            ));
            listed.push(resource(
                format!("{uri}/replays"),
                format!("replays of {id}"),
                "The browser's replays: ids, status, times, view URLs.",
                "application/json",
            ));
            listed.push(resource(
                uri,
                format!("browser {id}"),
                "The browser's settings, status and URLs.",
                "application/json",
            ));
        }
        Ok(ListResourcesResult::with_all_items(listed)
            .with_ttl_ms(0)
            .with_cache_scope(CacheScope::Private))
    }

    pub(super) async fn read(
        &self, caller: &Parts, uri: &str,
    ) -> Result<ReadResourceResult, ErrorData> {
        let Some(address) = parse(uri) else {
            return Err(ErrorData::resource_not_found(
                format!("{uri} is not a resource of this server (see resources/templates/list)"),
                None,
            ));
        };
        let failed = |failure| read_failure(uri, failure);
        let contents = match address {
            Address::Browsers => {
                json_contents(uri, &self.get(caller, "/browsers").await.map_err(failed)?)
            }
            Address::Browser(id) => {
                let path = format!("/browsers/{}", segment(id));
                json_contents(uri, &self.get(caller, &path).await.map_err(failed)?)
            }
            Address::Replays(id) => {
                let path = format!("/browsers/{}/replays", segment(id));
                json_contents(uri, &self.get(caller, &path).await.map_err(failed)?)
            }
            Address::Screenshot(id) => {
                let Picture { base64, mime_type } =
                    self.picture(caller, id).await.map_err(failed)?;
                ResourceContents::blob(base64, uri).with_mime_type(mime_type)
            }
            Address::Replay(id, replay) => {
                let path = format!("/browsers/{}/replays/{}", segment(id), segment(replay));
                let answer = self
                    .rest
                    .call_within(caller, axum::http::Method::GET, &path, None, MAX_REPLAY_BYTES)
                    .await
                    .map_err(|Failure(text)| {
                        failed(Failure(format!("{text}; download it over REST: GET {path}")))
                    })?;
                let mime_type = answer.content_type.unwrap_or_else(|| "video/mp4".into());
                ResourceContents::blob(BASE64.encode(&answer.body), uri).with_mime_type(mime_type)
            }
        };
        Ok(private_and_fresh(vec![contents]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_nothing_else_does() {
        assert_eq!(parse("kernel://browsers"), Some(Address::Browsers));
        assert_eq!(parse("kernel://browsers/ses_1"), Some(Address::Browser("ses_1")));
        assert_eq!(parse("kernel://browsers/ses_1/screenshot"), Some(Address::Screenshot("ses_1")));
        assert_eq!(parse("kernel://browsers/ses_1/replays"), Some(Address::Replays("ses_1")));
        assert_eq!(
            parse("kernel://browsers/ses_1/replays/r_2"),
            Some(Address::Replay("ses_1", "r_2"))
        );
        for wrong in [
            "kernel://browsersx",
            "kernel://browsers/",
            "kernel://browsers//screenshot",
            "kernel://browsers/ses_1/replays/r_2/stop",
            "kernel://browsers/ses_1/fs",
            "file:///etc/passwd",
        ] {
            assert_eq!(parse(wrong), None, "{wrong}");
        }
    }
}
