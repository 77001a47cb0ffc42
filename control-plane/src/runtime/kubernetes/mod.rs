//! The Kubernetes runtime: each browser VM is a Pod, made from an operator's pod template,
//! whose one container runs `browser-agent` listening on the pod's IP. The control plane
//! reaches the agent over TCP with the per-agent secret (never through a host path):
//! archives the VM starts from travel over the agent's gRPC streams once it answers.
//!
//! One watch over the service's pods (by label) tells every waiter what became of its
//! pod: running with an IP, failed (its container ended), evicted (its node lost), or
//! deleted.

mod pods;
mod template;
mod watch;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use browser_agent_proto::v1::DevtoolsState;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use super::isolation::IsolationReport;
use super::{LaunchSpec, Runtime, RuntimeCapabilities, RuntimeError, ZipLimits};
use crate::agent::AgentClient;
use crate::ids;
use crate::store::AgentLocation;
use pods::{PodFate, PodView, SESSION_LABEL, pod_name};
pub use template::PodTemplate;
use watch::PodsSeen;

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
    /// An agent stops its VM's processes after this long idle (`None`: never).
    pub freeze_idle_after: Option<Duration>,
    pub zip_limits: ZipLimits,
    pub max_resized_viewport: crate::config::ScreenSize,
    /// Each pod's ephemeral storage (its writable layer, `emptyDir`s and logs): the
    /// kubelet evicts a pod past it (`--vm-disk-gib`; `None`: the template's).
    pub disk_bytes: Option<u64>,
}

pub struct KubernetesRuntime {
    pods: Api<Pod>,
    config: KubernetesRuntimeConfig,
    isolation: IsolationReport,
    /// What the watch last saw of each of the service's pods, by pod name.
    seen: Arc<tokio::sync::watch::Sender<PodsSeen>>,
}

/// Waiting for the agent to answer once its pod runs (it may still be binding its port).
const AGENT_READY_TIMEOUT: Duration = Duration::from_secs(45);
/// The agent's time to stop cleanly once its pod is being deleted.
const DELETE_GRACE_SECONDS: u32 = 5;
/// How long destroy waits for a pod to be gone before deleting it without grace (its
/// kubelet may be unreachable, and its pod would be Terminating for good).
const DELETE_TIMEOUT: Duration = Duration::from_secs(15);

impl KubernetesRuntime {
    /// Connects with the ambient configuration (in-cluster service account, or
    /// `KUBECONFIG`) and starts watching the service's pods in `namespace` (default: the
    /// configuration's).
    pub async fn connect(
        namespace: Option<&str>, config: KubernetesRuntimeConfig,
    ) -> anyhow::Result<Self> {
        let client = kube::Client::try_default().await?;
        let pods: Api<Pod> = match namespace {
            Some(namespace) => Api::namespaced(client, namespace),
            None => Api::default_namespaced(client),
        };
        // Fail at start, not at the first browser, when the API server or the rights are
        // missing.
        pods.list(&ListParams::default().labels(pods::MANAGED_SELECTOR).limit(1))
            .await
            .map_err(|error| anyhow::anyhow!("listing pods through the Kubernetes API: {error}"))?;
        let declared = config.template.declared_ports();
        anyhow::ensure!(
            declared.is_empty() || declared.contains(&i32::from(config.agent_port)),
            "the pod template declares the agent's port as {declared:?}, but agents listen on \
             --kubernetes-agent-port {}",
            config.agent_port
        );
        let seen = watch::start(pods.clone());
        let isolation = config.template.isolation_report();
        Ok(Self { pods, config, isolation, seen })
    }

    /// Waits until the pod's fate passes `settled`, and returns that fate.
    async fn fate_when(&self, name: &str, settled: impl Fn(&PodFate) -> bool) -> PodFate {
        let mut seen = self.seen.subscribe();
        let found = seen.wait_for(|seen| seen.fate(name).is_some_and(|fate| settled(&fate))).await;
        // (The lock `found` holds is released here, before any other wait.)
        let fate = found.ok().and_then(|seen| seen.fate(name));
        match fate {
            Some(fate) => fate,
            // The sender lives as long as `self`: this is never reached.
            None => std::future::pending().await,
        }
    }

    /// Waits until the pod runs with an IP (its address), or ends.
    async fn wait_for_running(&self, name: &str) -> Result<String, RuntimeError> {
        let started = |fate: &PodFate| matches!(fate, PodFate::Running(_)) || fate.has_ended();
        let waited =
            tokio::time::timeout(self.config.start_timeout, self.fate_when(name, started)).await;
        match waited {
            Ok(PodFate::Running(ip)) => Ok(ip),
            Ok(ended) => Err(RuntimeError::LaunchFailed(format!(
                "the browser's pod ended before it ran: {}",
                ended.reason().unwrap_or_default()
            ))),
            Err(_) => {
                let why = match self.seen.borrow().view(name) {
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
        &self, spec: &LaunchSpec, location: &AgentLocation,
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
                // Retrying cannot help an agent whose certificate is refused.
                Err(error) if error.to_string().contains("certificate") => {
                    return Err(failed(
                        "the agent's TLS certificate is not trusted (--agent-tls-ca, \
                         --agent-tls-server-name)",
                        &error,
                    ));
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

    /// Deletes a pod (gone already counts as done); true once the API server took it.
    async fn delete_pod(&self, name: &str, grace_seconds: u32) -> bool {
        let params =
            DeleteParams { grace_period_seconds: Some(grace_seconds), ..DeleteParams::default() };
        match self.pods.delete(name, &params).await {
            Ok(_) => true,
            Err(kube::Error::Api(status)) if status.is_not_found() => true,
            Err(error) => {
                tracing::warn!(pod = name, %error, "deleting a browser's pod failed");
                false
            }
        }
    }

    /// Waits until the pod is gone, at most `wait`; true if it is.
    async fn wait_until_gone(&self, name: &str, wait: Duration) -> bool {
        let gone = |fate: &PodFate| matches!(fate, PodFate::Gone(_));
        tokio::time::timeout(wait, self.fate_when(name, gone)).await.is_ok()
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
                tracing::warn!(pod = %name, %error, "creating a browser's pod failed");
                // An answer lost after the pod was made (a timeout) would leave it behind.
                if !matches!(&error, kube::Error::Api(status) if status.code < 500) {
                    self.delete_pod(&name, 0).await;
                }
                return Err(RuntimeError::LaunchFailed(
                    "the browser's pod could not be created".into(),
                ));
            }
        };
        // Known from now on, also before the watch reports it.
        if let Some(view) = PodView::of(&created) {
            self.seen.send_if_modified(|seen| seen.created(view));
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
                self.delete_pod(&name, 0).await;
                self.forget(&spec.session_id);
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
        if !(self.delete_pod(&name, DELETE_GRACE_SECONDS).await
            && self.wait_until_gone(&name, DELETE_TIMEOUT).await)
        {
            // Its node may be unreachable: the pod would stay Terminating for good.
            tracing::warn!(pod = %name, "a browser's pod was not gone in time; deleting it without grace");
            if !(self.delete_pod(&name, 0).await
                && self.wait_until_gone(&name, Duration::from_secs(5)).await)
            {
                // The stray sweep deletes it again.
                tracing::warn!(pod = %name, "a browser's pod is still there");
            }
        }
        self.forget(session_id);
    }

    fn agent_exists(&self, _location: &AgentLocation) -> Option<bool> {
        None
    }

    async fn wait_for_exit(&self, location: &AgentLocation) {
        self.fate_when(&location.vm_root, PodFate::has_ended).await;
    }

    fn exit_reason(&self, session_id: &str) -> Option<String> {
        self.seen.borrow().fate(&pod_name(session_id)).and_then(|fate| fate.reason())
    }

    async fn reap_strays(&self, live_session_ids: &HashSet<String>, spare_younger_than: Duration) {
        let listed =
            match self.pods.list(&ListParams::default().labels(pods::MANAGED_SELECTOR)).await {
                Ok(listed) => listed,
                Err(error) => {
                    tracing::warn!(%error, "listing browser pods to reap strays failed");
                    return;
                }
            };
        let now = k8s_openapi::jiff::Timestamp::now();
        for pod in listed.items {
            let labels = pod.metadata.labels.clone().unwrap_or_default();
            let live =
                labels.get(SESSION_LABEL).is_some_and(|session| live_session_ids.contains(session));
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
                self.delete_pod(name, DELETE_GRACE_SECONDS).await;
            }
        }
    }

    fn forget(&self, session_id: &str) {
        let name = pod_name(session_id);
        self.seen.send_if_modified(|seen| {
            seen.forget(&name);
            false
        });
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
            chrome_policy: Err("chrome_policy is not supported with browsers in Kubernetes \
                                pods (--runtime kubernetes)"
                .to_owned()),
            egress_rules: Err("browsers in Kubernetes pods (--runtime kubernetes) reach the \
                               network directly under the cluster's NetworkPolicy: \
                               network.allowed_hosts and proxies are not supported"
                .to_owned()),
        }
    }
}
