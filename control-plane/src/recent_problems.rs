//! The last warnings and errors this process logged, kept in memory for the console's
//! host page (operators only): the 3 a.m. question "what went wrong on this host?"
//! without a shell. A `tracing` layer beside the one that writes the log: it keeps the
//! warnings and errors of every module (even one `RUST_LOG` silences in the log), as
//! the log would write them (which never holds a secret).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{LazyLock, Mutex};

use chrono::{DateTime, Utc};
use serde::Serialize;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;

/// Problems kept (the oldest are forgotten first).
const KEPT: usize = 100;
/// A longer message is cut here.
const MAX_MESSAGE_CHARS: usize = 2_000;

static RECENT: LazyLock<Mutex<VecDeque<Problem>>> = LazyLock::new(Mutex::default);

/// One warning or error as it was logged.
#[derive(Clone, Debug, Serialize)]
pub struct Problem {
    pub at: DateTime<Utc>,
    /// `warn` or `error`.
    pub level: &'static str,
    /// The module that logged it.
    pub target: String,
    /// The message, then its fields as `name=value`.
    pub message: String,
}

/// The layer to install beside the log writer; it keeps warnings and errors only.
pub fn layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    Keeper.with_filter(tracing_subscriber::filter::LevelFilter::WARN)
}

/// The problems kept, newest first.
pub fn recent() -> Vec<Problem> {
    RECENT.lock().map(|kept| kept.iter().rev().cloned().collect()).unwrap_or_default()
}

struct Keeper;

impl<S: Subscriber> Layer<S> for Keeper {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut text = Text::default();
        event.record(&mut text);
        let mut message = text.message;
        if !text.fields.is_empty() {
            if !message.is_empty() {
                message.push(' ');
            }
            message.push_str(text.fields.trim_start());
        }
        if message.chars().count() > MAX_MESSAGE_CHARS {
            message = message.chars().take(MAX_MESSAGE_CHARS).collect::<String>() + "…";
        }
        let metadata = event.metadata();
        let problem = Problem {
            at: Utc::now(),
            level: if *metadata.level() == Level::ERROR { "error" } else { "warn" },
            target: metadata.target().to_owned(),
            message,
        };
        if let Ok(mut kept) = RECENT.lock() {
            if kept.len() >= KEPT {
                kept.pop_front();
            }
            kept.push_back(problem);
        }
    }
}

#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[test]
    fn keeps_warnings_and_errors_with_their_fields_newest_first() {
        let subscriber = tracing_subscriber::registry().with(layer());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("not a problem");
            tracing::warn!(session_id = "abc", "the agent is slow");
            tracing::error!(code = 3, "the agent is gone");
        });
        let kept = recent();
        let ours: Vec<_> =
            kept.iter().filter(|p| p.target.ends_with("recent_problems::tests")).collect();
        assert_eq!(ours.len(), 2, "{kept:?}");
        assert_eq!(ours[0].level, "error");
        assert_eq!(ours[0].message, "the agent is gone code=3");
        assert_eq!(ours[1].message, "the agent is slow session_id=abc");
    }
}
