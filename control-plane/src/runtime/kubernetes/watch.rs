//! One list, then watch, over the service's pods, for the life of the process: what it
//! saw is published in a `tokio::sync::watch` channel that launches, exits and destroys
//! wait on. Waiters wake only when a pod's fate changes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use tokio::sync::watch;

use super::pods::{MANAGED_SELECTOR, PodFate, PodView};

/// A watch is re-opened this often at the latest (the API server ends it anyway).
const WATCH_TIMEOUT_SECONDS: u32 = 240;
/// Why a pod ended is kept this long for its session's exit reason.
const ENDED_KEPT: Duration = Duration::from_secs(600);
const DELETED: &str = "its pod was deleted";

/// The service's pods as the watch last saw them.
#[derive(Debug, Default)]
pub struct PodsSeen {
    /// False until the first list arrived: until then, a pod not seen may exist.
    synced: bool,
    pods: HashMap<String, PodView>,
    /// Why pods that are gone ended (and when they went), for their sessions' reasons.
    ended: HashMap<String, (String, Instant)>,
}

impl PodsSeen {
    /// `None` while nothing is known (before the first list).
    pub fn fate(&self, name: &str) -> Option<PodFate> {
        match self.pods.get(name) {
            Some(view) => Some(view.fate()),
            None if self.synced => Some(PodFate::Gone(
                self.ended
                    .get(name)
                    .map(|(reason, _)| reason.clone())
                    .unwrap_or_else(|| DELETED.to_owned()),
            )),
            None => None,
        }
    }

    pub fn view(&self, name: &str) -> Option<&PodView> {
        self.pods.get(name)
    }

    /// A pod this process just created, known before the watch reports it. False (no
    /// change) if the watch was first.
    pub fn created(&mut self, view: PodView) -> bool {
        let unseen = !self.pods.contains_key(&view.name) && !self.ended.contains_key(&view.name);
        if unseen {
            self.pods.insert(view.name.clone(), view);
        }
        unseen
    }

    /// Forgets why a pod ended (its session is over).
    pub fn forget(&mut self, name: &str) {
        self.ended.remove(name);
    }

    /// Records a pod's new state; true if its fate changed.
    fn update(&mut self, view: PodView) -> bool {
        let changed = self.pods.get(&view.name).map(PodView::fate) != Some(view.fate());
        self.pods.insert(view.name.clone(), view);
        changed
    }

    fn gone(&mut self, name: &str, reason: String) {
        self.pods.remove(name);
        self.ended.retain(|_, (_, at)| at.elapsed() < ENDED_KEPT);
        self.ended.insert(name.to_owned(), (reason, Instant::now()));
    }
}

/// Starts watching the pods of `pods` with the service's label.
pub fn start(pods: Api<Pod>) -> Arc<watch::Sender<PodsSeen>> {
    let seen = Arc::new(watch::Sender::new(PodsSeen::default()));
    tokio::spawn(run(pods, seen.clone()));
    seen
}

async fn run(pods: Api<Pod>, seen: Arc<watch::Sender<PodsSeen>>) {
    let mut backoff = Duration::from_millis(200);
    loop {
        // Returns only with an error: the watch ended, or could not be opened.
        if let Err(error) = list_then_watch(&pods, &seen, &mut backoff).await {
            tracing::warn!(%error, "watching browser pods failed; listing them again");
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Lists the pods, then follows their changes from the list's resource version. A pod
/// missing from the list is gone only if a direct read says so: one created after the
/// list was taken is not.
async fn list_then_watch(
    pods: &Api<Pod>, seen: &watch::Sender<PodsSeen>, backoff: &mut Duration,
) -> anyhow::Result<()> {
    let listed = pods.list(&ListParams::default().labels(MANAGED_SELECTOR)).await?;
    *backoff = Duration::from_millis(200);
    let mut version = listed.metadata.resource_version.clone().unwrap_or_default();
    let current: HashMap<String, PodView> =
        listed.items.iter().filter_map(PodView::of).map(|view| (view.name.clone(), view)).collect();
    let missing: Vec<String> = {
        let known = seen.borrow();
        known.pods.keys().filter(|name| !current.contains_key(*name)).cloned().collect()
    };
    let mut still_there = Vec::new();
    let mut gone = HashSet::new();
    for name in missing {
        match pods.get_opt(&name).await? {
            Some(pod) => still_there.extend(PodView::of(&pod)),
            None => {
                gone.insert(name);
            }
        }
    }
    seen.send_modify(|seen| {
        for name in &gone {
            seen.gone(name, DELETED.to_owned());
        }
        for view in current.into_values().chain(still_there) {
            seen.update(view);
        }
        seen.synced = true;
    });
    loop {
        let params = WatchParams::default().labels(MANAGED_SELECTOR).timeout(WATCH_TIMEOUT_SECONDS);
        let mut events = pods.watch(&params, &version).await?.boxed();
        while let Some(event) = events.try_next().await? {
            match event {
                WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                    remember_version(&mut version, &pod);
                    if let Some(view) = PodView::of(&pod) {
                        seen.send_if_modified(|seen| seen.update(view));
                    }
                }
                WatchEvent::Deleted(pod) => {
                    remember_version(&mut version, &pod);
                    if let Some(view) = PodView::of(&pod) {
                        let reason = view.fate().reason().unwrap_or_else(|| DELETED.to_owned());
                        seen.send_modify(|seen| seen.gone(&view.name, reason));
                    }
                }
                WatchEvent::Bookmark(bookmark) => {
                    version = bookmark.metadata.resource_version;
                }
                WatchEvent::Error(status) => {
                    // 410 Gone: the version is too old; list again.
                    anyhow::bail!("the watch ended: {} ({})", status.message, status.code);
                }
            }
        }
    }
}

fn remember_version(version: &mut String, pod: &Pod) {
    if let Some(current) = &pod.metadata.resource_version {
        version.clone_from(current);
    }
}
