//! The clients of a session (CDP and WebDriver clients, live viewers) and its activity:
//! an open client keeps the session from timing out, and its coming and going are
//! telemetry `connection` events.

use std::sync::Arc;
use std::time::Instant;

use super::{Sessions, activity_of};
use crate::store::SessionRecord;
use crate::telemetry::Category;
use crate::telemetry::cdp_commands::CommandRecorder;

impl Sessions {
    pub fn touch(&self, id: &str) {
        if let Ok(mut activity) = self.activity.lock() {
            let entry = activity_of(&mut activity, id);
            entry.last = Instant::now();
            entry.recorded = false;
        }
    }

    /// Gives a browser started ahead of demand the priority of one in use
    /// (`Runtime::promote`): it has just been handed to a caller.
    pub fn promote(&self, id: &str) {
        self.runtime.promote(id);
    }

    /// Marks a CDP connection open until the returned guard is dropped; an open
    /// connection keeps the session from timing out.
    pub fn cdp_connection_opened(self: &Arc<Self>, id: &str) -> CdpConnectionGuard {
        if let Ok(mut activity) = self.activity.lock() {
            let entry = activity_of(&mut activity, id);
            entry.open_cdp_connections += 1;
            entry.last = Instant::now();
            entry.recorded = false;
        }
        CdpConnectionGuard { sessions: self.clone(), id: id.to_owned(), client: None, held: None }
    }

    /// `cdp_connection_opened` for a client of the session's user (a CDP or WebDriver
    /// client, a live viewer): its coming and going are telemetry `connection` events.
    pub fn client_connected(
        self: &Arc<Self>, session: &SessionRecord, kind: ClientKind,
    ) -> CdpConnectionGuard {
        let mut guard = self.cdp_connection_opened(&session.id);
        let connection_id = crate::ids::random_lowercase(16);
        let (kind_name, data) = match kind {
            ClientKind::Cdp => {
                ("cdp_connect", serde_json::json!({ "connection_id": connection_id }))
            }
            ClientKind::LiveView => {
                ("live_view_connect", serde_json::json!({ "session_id": connection_id }))
            }
        };
        self.telemetry
            .record(session, crate::telemetry::Event::api(Category::Connection, kind_name, data));
        guard.client = Some(ConnectedClient {
            session: session.clone(),
            kind,
            connection_id,
            since: Instant::now(),
        });
        guard
    }
}

/// Who connected to a browser, for its telemetry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientKind {
    Cdp,
    LiveView,
}

struct ConnectedClient {
    session: SessionRecord,
    kind: ClientKind,
    connection_id: String,
    since: Instant,
}

pub struct CdpConnectionGuard {
    sessions: Arc<Sessions>,
    id: String,
    client: Option<ConnectedClient>,
    /// What must live as long as the connection (the agent's keep-awake hand-off).
    held: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl CdpConnectionGuard {
    /// Keeps `resource` until the connection ends.
    pub fn hold(&mut self, resource: Box<dyn std::any::Any + Send + Sync>) {
        self.held = Some(resource);
    }

    /// Reports the CDP client's browser-control commands (`cdp_command`), if the session
    /// captured `control` telemetry when the client connected.
    pub fn command_recorder(&self) -> Option<CommandRecorder> {
        let client = self.client.as_ref()?;
        let captures = client
            .session
            .vm_settings
            .telemetry
            .as_ref()
            .is_some_and(|settings| settings.captures(Category::Control));
        (captures && client.kind == ClientKind::Cdp).then(|| {
            CommandRecorder::new(
                self.sessions.telemetry.clone(),
                client.session.clone(),
                client.connection_id.clone(),
            )
        })
    }
}

impl Drop for CdpConnectionGuard {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            let duration_ms = client.since.elapsed().as_secs_f64() * 1000.0;
            let (kind, data) = match client.kind {
                ClientKind::Cdp => (
                    "cdp_disconnect",
                    serde_json::json!({
                        "connection_id": client.connection_id,
                        "duration_ms": duration_ms,
                        "message_count": 0,
                        "reason": "client_close",
                    }),
                ),
                ClientKind::LiveView => (
                    "live_view_disconnect",
                    serde_json::json!({ "session_id": client.connection_id, "duration_ms": duration_ms }),
                ),
            };
            self.sessions.telemetry.record_current(
                &client.session,
                crate::telemetry::Event::api(Category::Connection, kind, data),
            );
        }
        if let Ok(mut activity) = self.sessions.activity.lock()
            && let Some(entry) = activity.get_mut(&self.id)
        {
            entry.open_cdp_connections = entry.open_cdp_connections.saturating_sub(1);
            entry.last = Instant::now();
            entry.recorded = false;
        }
    }
}
