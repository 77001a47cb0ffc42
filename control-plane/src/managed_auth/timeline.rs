//! A connection's history (`GET /auth/connections/{id}/timeline`): its login and REAUTH
//! flows and its health checks, kept in its document, the latest `MAX_EVENTS` only.

use chrono::Utc;
use serde::Serialize;

pub use super::document::TimelineEvent;
use super::document::{AuthStatus, Document, FlowType};
use crate::ids;

/// Events kept per connection; older ones are dropped.
pub const MAX_EVENTS: usize = 200;

fn text<T: Serialize>(value: T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_default()
}

impl Document {
    /// Brings the current flow's event up to date (adding it the first time).
    pub fn record_flow(&mut self) {
        let Some(flow) = &self.flow else {
            return;
        };
        if flow.id.is_empty() {
            return;
        }
        let kind = match flow.flow_type {
            FlowType::Login => "login",
            FlowType::Reauth => "reauth",
        };
        let status = text(flow.status);
        let finished = !flow.in_progress();
        let index = match self.timeline.iter().position(|event| event.id == flow.id) {
            Some(index) => index,
            // Trimmed away since it finished: it stays out.
            None if finished => return,
            None => {
                self.timeline.push(TimelineEvent {
                    id: flow.id.clone(),
                    kind: kind.into(),
                    status: status.clone(),
                    timestamp: flow.started_at.unwrap_or_else(Utc::now),
                    browser_session_id: None,
                    completed_at: None,
                    error_code: None,
                    error_message: None,
                    previous_status: None,
                    step: None,
                    replay_id: None,
                });
                self.timeline.len() - 1
            }
        };
        let event = &mut self.timeline[index];
        event.status = status;
        event.step = Some(text(flow.step));
        event.browser_session_id = flow.session_id.clone().or(event.browser_session_id.take());
        event.error_code = flow.error_code.clone();
        event.error_message = flow.error_message.clone();
        event.replay_id = flow.replay_id.clone().or(event.replay_id.take());
        if finished && event.completed_at.is_none() {
            event.completed_at = Some(Utc::now());
        }
        self.trim_timeline();
    }

    /// Adds a health check that saw `now` after `before`.
    pub fn record_health_check(
        &mut self, before: AuthStatus, now: AuthStatus, browser_session_id: Option<String>,
    ) {
        self.timeline.push(TimelineEvent {
            id: ids::new_id("hc"),
            kind: "health_check".into(),
            status: text(now),
            timestamp: Utc::now(),
            browser_session_id,
            completed_at: None,
            error_code: None,
            error_message: None,
            previous_status: Some(text(before)),
            step: None,
            replay_id: None,
        });
        self.trim_timeline();
    }

    fn trim_timeline(&mut self) {
        if self.timeline.len() > MAX_EVENTS {
            let extra = self.timeline.len() - MAX_EVENTS;
            self.timeline.drain(..extra);
        }
    }
}
