//! The server-sent event streams of deployments and invocations (`crate::apps::events`):
//! what happened so far (from `since`), then what happens, with `sse_heartbeat` events
//! every 5 s, until the last state.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::IntoResponse;
use axum::response::sse::{Event, Sse};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use utoipa::IntoParams;

use crate::api::error::ApiError;
use crate::apps::events::EventLogs;

const HEARTBEAT: Duration = Duration::from_secs(5);

/// `since`: an RFC 3339 time, or a duration back from now such as `90s`, `5m`, `2h`, `1d`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct Since {
    #[param(schema_with = crate::api::openapi::since)]
    pub since: Option<String>,
}

impl Since {
    pub fn parse(&self) -> Result<Option<DateTime<Utc>>, ApiError> {
        self.since.as_deref().map(parse_since).transpose()
    }
}

/// An RFC 3339 time, or a duration back from now.
pub fn parse_since(text: &str) -> Result<DateTime<Utc>, ApiError> {
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        return Ok(time.with_timezone(&Utc));
    }
    let invalid = || {
        ApiError::invalid_field(format!(
            "since must be an RFC 3339 time or a duration such as 5m, got {text:?}"
        ))
    };
    let split =
        text.len().checked_sub(1).filter(|&at| text.is_char_boundary(at)).ok_or_else(invalid)?;
    let (number, unit) = text.split_at(split);
    if number.is_empty() || !number.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(invalid());
    }
    let number: i64 = number.parse().unwrap_or(i64::MAX);
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(invalid()),
    };
    // Further back than anything kept is as good as the beginning.
    let back = number.saturating_mul(seconds).min(100 * 365 * 86_400);
    Ok(Utc::now() - chrono::Duration::seconds(back))
}

/// The stream of `id`'s events. When this process keeps no log of it (it ended long
/// ago, or before a restart, which ends whatever was under way), the stream is
/// `current` alone: its state now.
pub fn stream(
    logs: &EventLogs, id: &str, since: Option<DateTime<Utc>>, current: Value,
) -> impl IntoResponse + use<> {
    let following = logs.follow(id, since);
    let (sender, receiver) = mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        let send = |value: &Value| {
            let name = value["event"].as_str().unwrap_or("message").to_owned();
            Event::default().event(name).json_data(value).ok().map(Ok)
        };
        let (past, live) = match following {
            Some(following) => (following.past, following.live),
            None => {
                if let Some(event) = send(&current) {
                    let _ = sender.send(event).await;
                }
                return;
            }
        };
        for event in &past {
            let Some(message) = send(&event.body) else {
                return;
            };
            if sender.send(message).await.is_err() || event.last {
                return;
            }
        }
        let Some(mut live) = live else { return };
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        heartbeat.tick().await;
        loop {
            let event = tokio::select! {
                () = sender.closed() => return,
                _ = heartbeat.tick() => {
                    let Some(message) = send(&json!({"event": "sse_heartbeat", "timestamp": Utc::now()})) else { return };
                    if sender.send(message).await.is_err() {
                        return;
                    }
                    continue;
                }
                event = live.recv() => match event {
                    Ok(event) => event,
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            let Some(message) = send(&event.body) else {
                return;
            };
            if sender.send(message).await.is_err() || event.last {
                return;
            }
        }
    });
    Sse::new(ReceiverStream::new(receiver))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_times_and_durations() {
        let now = Utc::now();
        let five = parse_since("5m").expect("duration");
        assert!((now - five).num_seconds() >= 299);
        let time = parse_since("2026-01-02T03:04:05Z").expect("time");
        assert_eq!(time.to_rfc3339(), "2026-01-02T03:04:05+00:00");
        assert!(parse_since("999999999d").is_ok());
        for bad in ["", "m", "5x", "-5m", "é", "+5m"] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
    }
}
