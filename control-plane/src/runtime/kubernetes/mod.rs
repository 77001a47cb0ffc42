//! The Kubernetes runtime: each browser VM is a Pod, made from an operator's pod template,
//! whose one container runs `browser-agent` listening on the pod's IP. The control plane
//! reaches the agent over TCP with the per-agent secret (never through a host path):
//! archives the VM starts from travel over the agent's gRPC streams once it answers.
//!
//! One watch over the service's pods (by label) tells every waiter what became of its
//! pod: running with an IP, failed (its node lost, its container ended), or deleted.

mod pods;
mod template;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use browser_agent_proto::v1::DevtoolsState;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use tokio::sync::watch;

use super::isolation::IsolationReport;
use super::{LaunchSpec, Runtime, RuntimeCapabilities, RuntimeError, ZipLimits};
use crate::agent::AgentClient;
use crate::ids;
use crate::store::AgentLocation;
use pods::{PodFate, PodView, SESSION_LABEL, pod_name};
pub use template::PodTemplate;

#[derive(Clone, Debug)]
pub struct KubernetesRuntimeConfig {
    /// The pod every browser VM is made from (see `deploy/kubernetes/`).
    pub template: PodTemplate,
    /// The port the agent listens on in its pod.
    pub agent_port: u16,
    /// Agents serve TLS (the template gives them a certificate).
    pub tls: bool,
    /// How long a pod may take to run (image pull, scheduling) before its launch fails.
    pub start_timeout: Duration,
    pub agent_idle_grace: Duration,
    pub zip_limits: ZipLimits,
    pub max_resized_viewport: crate::config::ScreenSize,
}

pub struct KubernetesRuntime {
    pods: Api<Pod>,
    config: KubernetesRuntimeConfig,
    isolation: IsolationReport,
    /// What the watch last saw of each of the service's pods, by pod name.
    seen: Arc<watch::Sender<PodsSeen>>,
}

/// The service's pods as the watch last saw them.
#[derive(Clone, Debug, Default)]
struct PodsSeen {
    /// False until the first list arrived: until then, a pod not seen may exist.
    synced: bool,
    pods: HashMap<String, PodView>,
    /// Why pods that are gone ended, until their sessions are destroyed.
    ended: HashMap<String, String>,
}

impl PodsSeen {
    fn fate(&self, name: &str) -> Option<PodFate> {
        match self.pods.get(name) {
            Some(view) => Some(view.fate()),
            None if self.synced => Some(PodFate::Gone(
                self.ended
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| "its pod was deleted".to_owned()),
            )),
            None => None,
        }
    }
}

/// Waiting for the agent to answer once its pod runs (it may still be binding its port).
const AGENT_READY_TIMEOUT: Duration = Duration::from_secs(45);
/// Asking the agent to stop cleanly before its pod is deleted.
const DELETE_GRACE_SECONDS: u32 = 5;
/// How long destroy waits for the pod to be gone.
const DELETE_TIMEOUT: Duration = Duration::from_secs(30);
/// A watch is re-opened this often at the latest (the API server ends it anyway).
const WATCH_TIMEOUT_SECONDS: u32 = 240;

impl KubernetesRuntime {
    /// Connects with the ambient configuration (in-cluster service account, or
    /// `KUBECONFIG`) and starts watching the service's pods in `namespace` (default: the
    /// configuration's).
    pub async fn connect(
        namespace: Option<&str>,
        config: KubernetesRuntimeConfig,
    ) -> anyhow::Result<Self> {
        let client = kube::Client::try_default().await?;
        let pods: Api<Pod> = match namespace {
            Some(namespace) => Api::namespaced(client, namespace),
            None => Api::default_namespaced(client),
        };
        // Fail at start, not at the first browser, when the API server or the rights are
        // missing.
        pods.list(
            &ListParams::default()
                .labels(pods::MANAGED_SELECTOR)
                .limit(1),
        )
        .await
        .map_err(|error| anyhow::anyhow!("listing pods through the Kubernetes API: {error}"))?;
        let seen = Arc::new(watch::Sender::new(PodsSeen::default()));
        tokio::spawn(watch_pods(pods.clone(), Arc::downgrade(&seen)));
        let isolation = config.template.isolation_report();
        Ok(Self {
            pods,
            config,
            isolation,
            seen,
        })
    }

    /// Waits until the pod runs with an IP (its address), or ends.
    async fn wait_for_running(&self, name: &str) -> Result<String, RuntimeError> {
        let mut seen = self.seen.subscribe();
        let waited = tokio::time::timeout(self.config.start_timeout, async {
            loop {
                match seen.borrow_and_update().fate(name) {
                    Some(PodFate::Running(ip)) => return Ok(ip),
                    Some(ended) if ended.has_ended() => {
                        return Err(ended.reason().unwrap_or_default());
                    }
                    _ => {}
                }
                if seen.changed().await.is_err() {
                    return Err("the pod watch ended".to_owned());
                }
            }
        })
        .await;
        match waited {
            Ok(Ok(ip)) => Ok(ip),
            Ok(Err(reason)) => Err(RuntimeError::LaunchFailed(format!(
                "the browser's pod ended before it ran: {reason}"
            ))),
            Err(_) => {
                let why = match self.seen.borrow().pods.get(name) {
                    Some(view) => view.pending_reason(),
                    None => "not seen".to_owned(),
                };
                Err(RuntimeError::LaunchFailed(format!(
                    "the browser's pod did not run within {} s ({why})",
                    self.config.start_timeout.as_secs()
                )))
            }
        }
    }

    /// Waits until the agent answers and Chromium's DevTools is up; then hands it the
    /// archives the VM starts from.
    async fn prepare_agent(
        &self,
        spec: &LaunchSpec,
        location: &AgentLocation,
    ) -> Result<(), RuntimeError> {
        let failed = |what: &str, error: &dyn std::fmt::Display| {
            RuntimeError::LaunchFailed(format!("{what}: {error}"))
        };
        let client =
            AgentClient::new(location).map_err(|error| failed("reaching the agent", &error))?;
        let deadline = tokio::time::Instant::now() + AGENT_READY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match client.wait_until_ready(left).await {
                Ok(status) if status.devtools_state() == DevtoolsState::Ready => break,
                Ok(status) => {
                    return Err(RuntimeError::LaunchFailed(format!(
                        "Chromium did not become ready: {}",
                        match status.last_chromium_exit.is_empty() {
                            true => "timed out".to_owned(),
                            false => status.last_chromium_exit,
                        }
                    )));
                }
                // Not listening yet: the container has only just started.
                Err(_) if !left.is_zero() => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => return Err(failed("the browser agent did not answer", &error)),
            }
        }
        if !spec.extensions.is_empty() {
            pods::send_extensions(&client, &spec.extensions)
                .await
                .map_err(|error| failed("loading the extensions", &error))?;
        }
        if let Some(archive) = &spec.profile_archive {
            let archive = tokio::fs::File::open(archive).await?;
            client
                .load_profile(archive)
                .await
                .map_err(|error| failed("loading the profile", &error))?;
        }
        Ok(())
    }

    async fn delete_pod(&self, name: &str) {
        let params = DeleteParams {
            grace_period_seconds: Some(DELETE_GRACE_SECONDS),
            ..DeleteParams::default()
        };
        match self.pods.delete(name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_not_found() => {}
            Err(error) => {
                tracing::warn!(pod = name, %error, "deleting a browser's pod failed");
            }
        }
    }
}

#[async_trait]
impl Runtime for KubernetesRuntime {
    async fn launch(&self, spec: &LaunchSpec) -> Result<AgentLocation, RuntimeError> {
        let secret = ids::new_secret(43);
        let pod = self.config.template.pod_for(spec, &secret, &self.config);
        let name = pod_name(&spec.session_id);
        let created = match self.pods.create(&PostParams::default(), &pod).await {
            Ok(created) => created,
            Err(error) => {
                return Err(RuntimeError::LaunchFailed(format!(
                    "creating the browser's pod failed: {error}"
                )));
            }
        };
        // Known from now on, also before the watch reports it.
        if let Some(view) = PodView::of(&created) {
            self.seen.send_if_modified(|seen| {
                let unseen = !seen.pods.contains_key(&name) && !seen.ended.contains_key(&name);
                if unseen {
                    seen.pods.insert(name.clone(), view);
                }
                unseen
            });
        }
        let started = async {
            let ip = self.wait_for_running(&name).await?;
            let location = AgentLocation {
                endpoint: pods::endpoint(&ip, self.config.agent_port, self.config.tls),
                secret,
                pid: None,
                // The VM's name in its runtime: its pod.
                vm_root: name.clone(),
            };
            self.prepare_agent(spec, &location).await?;
            Ok(location)
        };
        match started.await {
            Ok(location) => Ok(location),
            Err(error) => {
                self.delete_pod(&name).await;
                Err(error)
            }
        }
    }

    async fn destroy(&self, session_id: &str, location: Option<&AgentLocation>) {
        let name = pod_name(session_id);
        // A clean stop first: recordings are finalized, Chromium writes its profile.
        if let Some(client) = location.and_then(|location| AgentClient::new(location).ok()) {
            let _ = tokio::time::timeout(Duration::from_secs(5), client.shutdown()).await;
        }
        self.delete_pod(&name).await;
        let mut seen = self.seen.subscribe();
        let gone = tokio::time::timeout(DELETE_TIMEOUT, async {
            while !matches!(seen.borrow_and_update().fate(&name), Some(PodFate::Gone(_))) {
                if seen.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        if gone.is_err() {
            // The next stray reaping deletes it again.
            tracing::warn!(pod = %name, "a browser's pod was not gone within 30 s");
        }
        self.seen.send_modify(|seen| {
            seen.ended.remove(&name);
        });
    }

    fn agent_exists(&self, _location: &AgentLocation) -> Option<bool> {
        None
    }

    async fn wait_for_exit(&self, location: &AgentLocation) {
        let mut seen = self.seen.subscribe();
        loop {
            if seen
                .borrow_and_update()
                .fate(&location.vm_root)
                .is_some_and(|fate| fate.has_ended())
            {
                return;
            }
            if seen.changed().await.is_err() {
                // The watch task is gone: heartbeats judge the agent from now on.
                return std::future::pending().await;
            }
        }
    }

    fn exit_reason(&self, session_id: &str) -> Option<String> {
        self.seen
            .borrow()
            .fate(&pod_name(session_id))
            .and_then(|fate| fate.reason())
    }

    async fn reap_strays(&self, live_session_ids: &HashSet<String>, spare_younger_than: Duration) {
        let listed = match self
            .pods
            .list(&ListParams::default().labels(pods::MANAGED_SELECTOR))
            .await
        {
            Ok(listed) => listed,
            Err(error) => {
                tracing::warn!(%error, "listing browser pods to reap strays failed");
                return;
            }
        };
        let now = k8s_openapi::jiff::Timestamp::now();
        for pod in listed.items {
            let labels = pod.metadata.labels.clone().unwrap_or_default();
            let live = labels
                .get(SESSION_LABEL)
                .is_some_and(|session| live_session_ids.contains(session));
            let age = pod
                .metadata
                .creation_timestamp
                .as_ref()
                .and_then(|created| Duration::try_from(now.duration_since(created.0)).ok())
                .unwrap_or_default();
            if let Some(name) = pod.metadata.name.as_deref()
                && !live
                && age >= spare_younger_than
            {
                tracing::info!(pod = name, "deleting a browser pod of no live session");
                self.delete_pod(name).await;
            }
        }
    }

    fn leftover_recording(&self, _session_id: &str, _recording_id: &str) -> Option<std::fs::File> {
        // Nothing of a pod is on this host: recordings are collected over gRPC while the
        // agent lives.
        None
    }

    fn isolation(&self) -> IsolationReport {
        self.isolation.clone()
    }

    fn capabilities(&self) -> RuntimeCapabilities {
        RuntimeCapabilities {
            chrome_policy: Err(
                "chrome_policy is not supported with browsers in Kubernetes \
                                pods (--runtime kubernetes)"
                    .to_owned(),
            ),
            egress_rules: Err(
                "browsers in Kubernetes pods (--runtime kubernetes) reach the \
                               network directly under the cluster's NetworkPolicy: \
                               network.allowed_hosts and proxies are not supported"
                    .to_owned(),
            ),
        }
    }
}

/// Lists, then watches, the service's pods, publishing what it saw; re-lists after a
/// watch error (an expired resource version, the API server restarting). Ends with the
/// runtime.
async fn watch_pods(pods: Api<Pod>, seen: std::sync::Weak<watch::Sender<PodsSeen>>) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let Some(sender) = seen.upgrade() else {
            return;
        };
        match list_then_watch(&pods, &sender).await {
            Ok(()) => backoff = Duration::from_millis(200),
            Err(error) => {
                tracing::warn!(%error, "watching browser pods failed; listing them again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

async fn list_then_watch(pods: &Api<Pod>, seen: &watch::Sender<PodsSeen>) -> anyhow::Result<()> {
    let listed = pods
        .list(&ListParams::default().labels(pods::MANAGED_SELECTOR))
        .await?;
    let mut version = listed.metadata.resource_version.unwrap_or_default();
    seen.send_modify(|seen| {
        let current: HashMap<String, PodView> = listed
            .items
            .iter()
            .filter_map(PodView::of)
            .map(|view| (view.name.clone(), view))
            .collect();
        for name in seen.pods.keys() {
            if !current.contains_key(name) {
                seen.ended
                    .insert(name.clone(), "its pod was deleted".to_owned());
            }
        }
        seen.pods = current;
        seen.synced = true;
    });
    loop {
        let params = WatchParams::default()
            .labels(pods::MANAGED_SELECTOR)
            .timeout(WATCH_TIMEOUT_SECONDS);
        let mut events = pods.watch(&params, &version).await?.boxed();
        while let Some(event) = events.try_next().await? {
            match event {
                WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                    remember_version(&mut version, &pod);
                    if let Some(view) = PodView::of(&pod) {
                        seen.send_modify(|seen| {
                            seen.pods.insert(view.name.clone(), view);
                        });
                    }
                }
                WatchEvent::Deleted(pod) => {
                    remember_version(&mut version, &pod);
                    if let Some(view) = PodView::of(&pod) {
                        let reason = match view.fate() {
                            PodFate::Gone(reason) => reason,
                            _ => "its pod was deleted".to_owned(),
                        };
                        seen.send_modify(|seen| {
                            seen.pods.remove(&view.name);
                            seen.ended.insert(view.name.clone(), reason);
                        });
                    }
                }
                WatchEvent::Bookmark(bookmark) => {
                    version = bookmark.metadata.resource_version;
                }
                WatchEvent::Error(status) => {
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
