//! One agent client per running session, reused across calls (clients share their HTTP/2
//! connection), so the hot path (a click) does not reconnect.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use super::{AgentClient, AgentError};
use crate::store::AgentLocation;

#[derive(Default)]
pub struct AgentClients {
    clients: Mutex<HashMap<String, AgentClient>>,
}

impl AgentClients {
    /// The client of the session's agent; `location` is `None` while it is starting.
    pub fn get(
        &self, session_id: &str, location: Option<&AgentLocation>,
    ) -> Result<AgentClient, AgentError> {
        let location = location
            .ok_or_else(|| AgentError::Unavailable("the browser is still starting".into()))?;
        let mut clients = self
            .clients
            .lock()
            .map_err(|_| AgentError::Internal("agent client cache poisoned".into()))?;
        if let Some(client) = clients.get(session_id) {
            return Ok(client.clone());
        }
        let client = AgentClient::new(location)?;
        clients.insert(session_id.to_owned(), client.clone());
        Ok(client)
    }

    /// The sessions that have a client here.
    pub fn held(&self) -> HashSet<String> {
        self.clients.lock().map(|clients| clients.keys().cloned().collect()).unwrap_or_default()
    }

    /// Drops the session's client (its session ended).
    pub fn forget(&self, session_id: &str) {
        if let Ok(mut clients) = self.clients.lock() {
            clients.remove(session_id);
        }
    }
}
