//! A session's network events as an HTTP Archive (HAR 1.2): one entry per request, with
//! its response (or its failure) when one was seen. Like the events, it carries no
//! bodies, and secret headers stay redacted.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

fn headers(value: &Value) -> Vec<Value> {
    value
        .as_object()
        .map(|headers| {
            headers
                .iter()
                .map(|(name, value)| json!({ "name": name, "value": value.as_str().unwrap_or_default() }))
                .collect()
        })
        .unwrap_or_default()
}

fn query_string(url: &str) -> Vec<Value> {
    url::Url::parse(url)
        .map(|url| {
            url.query_pairs().map(|(name, value)| json!({ "name": name, "value": value })).collect()
        })
        .unwrap_or_default()
}

fn time(ts_us: i64) -> String {
    DateTime::<Utc>::from_timestamp_micros(ts_us)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The archive of `events` (SDK event objects, oldest first).
pub fn archive(events: &[Value]) -> Value {
    let mut entries: Vec<Value> = Vec::new();
    let mut by_request: HashMap<String, (usize, i64)> = HashMap::new();
    for event in events {
        let data = &event["data"];
        let request_id = data["request_id"].as_str().unwrap_or_default().to_owned();
        let ts = event["ts"].as_i64().unwrap_or_default();
        match event["type"].as_str() {
            Some("network_request") => {
                let url = data["url"].as_str().unwrap_or_default();
                by_request.insert(request_id, (entries.len(), ts));
                entries.push(json!({
                    "startedDateTime": time(ts),
                    "time": 0,
                    "request": {
                        "method": data["method"].as_str().unwrap_or("GET"),
                        "url": url,
                        "httpVersion": "HTTP/1.1",
                        "cookies": [],
                        "headers": headers(&data["headers"]),
                        "queryString": query_string(url),
                        "headersSize": -1,
                        "bodySize": -1,
                    },
                    "response": {
                        "status": 0, "statusText": "", "httpVersion": "HTTP/1.1", "cookies": [],
                        "headers": [], "content": { "size": 0, "mimeType": "x-unknown" },
                        "redirectURL": "", "headersSize": -1, "bodySize": -1,
                    },
                    "cache": {},
                    "timings": { "send": 0, "wait": 0, "receive": 0 },
                    "_resourceType": data["resource_type"],
                }));
            }
            Some(kind @ ("network_response" | "network_loading_failed")) => {
                let Some(&(index, started)) = by_request.get(&request_id) else {
                    continue;
                };
                let elapsed_ms = ((ts - started).max(0) as f64) / 1000.0;
                let entry = &mut entries[index];
                entry["time"] = json!(elapsed_ms);
                entry["timings"]["wait"] = json!(elapsed_ms);
                if kind == "network_response" {
                    let response = &mut entry["response"];
                    response["status"] = json!(data["status"].as_i64().unwrap_or_default());
                    response["statusText"] =
                        json!(data["status_text"].as_str().unwrap_or_default());
                    response["headers"] = json!(headers(&data["headers"]));
                    response["content"]["mimeType"] =
                        json!(data["mime_type"].as_str().unwrap_or("x-unknown"));
                } else {
                    entry["response"]["_error"] =
                        json!(data["error_text"].as_str().unwrap_or_default());
                }
            }
            _ => {}
        }
    }
    json!({
        "log": {
            "version": "1.2",
            "creator": { "name": "kernel-browser-telemetry", "version": env!("CARGO_PKG_VERSION") },
            "pages": [],
            "entries": entries,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_and_its_response_make_one_entry() {
        let events = [
            json!({"type": "network_request", "ts": 1_000_000, "data": {"request_id": "1", "url": "https://a.test/x?q=1", "method": "GET", "headers": {"Accept": "*/*"}}}),
            json!({"type": "network_response", "ts": 1_250_000, "data": {"request_id": "1", "status": 404, "status_text": "Not Found", "mime_type": "text/html", "headers": {}}}),
        ];
        let har = archive(&events);
        let entry = &har["log"]["entries"][0];
        assert_eq!(entry["response"]["status"], 404);
        assert_eq!(entry["time"], 250.0);
        assert_eq!(entry["request"]["queryString"][0]["name"], "q");
    }
}
