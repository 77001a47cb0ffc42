//! Work this process has under way, by id, so that two tasks never do the same work at
//! once.

use std::collections::HashSet;
use std::sync::Mutex;

/// Ids of the work this process is doing now.
#[derive(Debug, Default)]
pub struct InProgress(Mutex<HashSet<String>>);

impl InProgress {
    /// True for exactly one caller until the id is released.
    pub fn claim(&self, id: &str) -> bool {
        self.0.lock().map(|mut ids| ids.insert(id.to_owned())).unwrap_or(false)
    }

    pub fn release(&self, id: &str) {
        if let Ok(mut ids) = self.0.lock() {
            ids.remove(id);
        }
    }

    pub fn contains(&self, id: &str) -> bool {
        self.0.lock().map(|ids| ids.contains(id)).unwrap_or(false)
    }
}
