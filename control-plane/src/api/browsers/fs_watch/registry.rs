//! The live `fs/watch` watches of this process, which the server's state holds (apart from
//! the routes, so that the state depends on no handler).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::mpsc;
use utoipa::ToSchema;

pub(super) type Events = Arc<tokio::sync::Mutex<mpsc::Receiver<WatchEventView>>>;

pub(super) struct Watch {
    pub(super) org_id: String,
    pub(super) session_id: String,
    pub(super) events: Events,
    pub(super) task: tokio::task::AbortHandle,
}

/// The live watches of this server.
#[derive(Default)]
pub struct Watches {
    pub(super) entries: Mutex<HashMap<String, Watch>>,
}

impl Watches {
    pub(super) fn of_session(&self, session_id: &str) -> usize {
        self.entries
            .lock()
            .map(|entries| entries.values().filter(|w| w.session_id == session_id).count())
            .unwrap_or(0)
    }

    pub(super) fn remove(&self, watch_id: &str) -> Option<Watch> {
        self.entries.lock().ok()?.remove(watch_id)
    }

    /// The events of a watch of this organization's session.
    pub(super) fn events(&self, org_id: &str, session_id: &str, watch_id: &str) -> Option<Events> {
        let entries = self.entries.lock().ok()?;
        let watch = entries.get(watch_id)?;
        (watch.org_id == org_id && watch.session_id == session_id).then(|| watch.events.clone())
    }
}

/// A change, as the SDK reads it.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct WatchEventView {
    /// CREATE, WRITE, DELETE or RENAME.
    #[serde(rename = "type")]
    pub kind: String,
    /// Absolute path in the browser's filesystem.
    pub path: String,
    pub name: String,
    pub is_dir: bool,
}
