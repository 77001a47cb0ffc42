//! The operator's pod template: what every browser pod is made from, and what its
//! security settings really enforce (reported, never assumed).

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use sha2::{Digest, Sha256};

use super::KubernetesRuntimeConfig;
use super::pods::{MANAGED_LABEL, MANAGED_VALUE, SESSION_LABEL, pod_name};
use crate::runtime::LaunchSpec;
use crate::runtime::isolation::{HostCapabilities, IsolationReport, Unenforced};

/// The container that runs the agent, when the template has several.
const AGENT_CONTAINER: &str = "browser-agent";
/// Agent flags the runtime sets per browser, or that only the local runtime uses.
const RUNTIME_FLAGS: &[&str] = &[
    "--listen",
    "--listen-socket",
    "--addr-file",
    "--secret",
    "--secret-sha256",
    "--width",
    "--height",
    "--max-width",
    "--max-height",
    "--idle-grace-seconds",
    "--memory-limit-bytes",
    "--zip-max-entries",
    "--zip-max-expanded-bytes",
    "--zip-max-ratio",
    "--timezone",
    "--locale",
    "--headless",
    "--kiosk",
    "--stealth",
    "--extension",
    "--profile-archive",
    "--egress-socket",
];

#[derive(Clone, Debug)]
pub struct PodTemplate {
    pod: Pod,
    /// Index of the agent's container in `spec.containers`.
    agent: usize,
    /// The control plane reaches agents over TLS.
    tls: bool,
}

impl PodTemplate {
    /// Reads a Pod manifest (YAML or JSON) and checks that it can hold a browser VM whose
    /// agent serves TLS when `tls`.
    pub fn load(path: &Path, tls: bool) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| anyhow::anyhow!("reading {}: {error}", path.display()))?;
        let pod: Pod = serde_yaml_ng::from_str(&text)
            .map_err(|error| anyhow::anyhow!("{} is not a Pod: {error}", path.display()))?;
        Self::new(pod, tls)
    }

    pub fn new(pod: Pod, tls: bool) -> anyhow::Result<Self> {
        let spec =
            pod.spec.as_ref().ok_or_else(|| anyhow::anyhow!("the pod template has no spec"))?;
        let agent = spec
            .containers
            .iter()
            .position(|container| container.name == AGENT_CONTAINER)
            .or((spec.containers.len() == 1).then_some(0))
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "the pod template needs one container, or one named {AGENT_CONTAINER:?}"
                )
            })?;
        let container = &spec.containers[agent];
        anyhow::ensure!(
            container.image.is_some(),
            "the pod template's agent container has no image"
        );
        let reserved = container.args.iter().flatten().find(|arg| {
            let flag = arg.split('=').next().unwrap_or_default();
            RUNTIME_FLAGS.contains(&flag)
        });
        if let Some(arg) = reserved {
            anyhow::bail!(
                "the pod template's agent args set {arg:?}, which the runtime sets for each \
                 browser (or which has no place in a pod)"
            );
        }
        let has_certificate =
            container.args.iter().flatten().any(|arg| arg.starts_with("--tls-cert"))
                || container.env.iter().flatten().any(|var| var.name == "BROWSER_AGENT_TLS_CERT");
        anyhow::ensure!(
            has_certificate == tls,
            "{}",
            match tls {
                true =>
                    "--agent-tls-ca is set, but the pod template gives the agent no \
                         certificate (--tls-cert and --tls-key in its args)",
                false =>
                    "the pod template gives the agent a certificate (--tls-cert): set \
                          --agent-tls-ca to the CA that signed it",
            }
        );
        Ok(Self { pod, agent, tls })
    }

    /// The pod of one browser VM: the template with the session's name and labels, its
    /// agent's settings and secret, and its memory as the container's resources.
    pub fn pod_for(
        &self, spec: &LaunchSpec, secret: &str, config: &KubernetesRuntimeConfig,
    ) -> Pod {
        let mut pod = self.pod.clone();
        pod.metadata.name = Some(pod_name(&spec.session_id));
        pod.metadata.generate_name = None;
        // The runtime's namespace, whatever the template says.
        pod.metadata.namespace = None;
        let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.insert(MANAGED_LABEL.to_owned(), MANAGED_VALUE.to_owned());
        labels.insert(SESSION_LABEL.to_owned(), spec.session_id.clone());
        pod.status = None;
        if let Some(pod_spec) = pod.spec.as_mut() {
            // A VM is never restarted in place: a new agent would be a different browser.
            pod_spec.restart_policy = Some("Never".to_owned());
            let container = &mut pod_spec.containers[self.agent];
            container.args.get_or_insert_with(Vec::new).extend(agent_args(spec, config));
            // Whoever may read pods reads their spec: it carries only the secret's digest,
            // which the agent checks calls against.
            container.env.get_or_insert_with(Vec::new).push(EnvVar {
                name: "BROWSER_AGENT_SECRET_SHA256".to_owned(),
                value: Some(hex::encode(Sha256::digest(secret.as_bytes()))),
                value_from: None,
            });
            if let Some(bytes) = spec.memory_limit_bytes {
                set_memory(container, bytes);
            }
            if let Some(bytes) = config.disk_bytes {
                set_ephemeral_storage(container, bytes);
            }
        }
        pod
    }

    /// The ports the template declares for the agent's container (none if it names none).
    pub fn declared_ports(&self) -> Vec<i32> {
        self.pod
            .spec
            .as_ref()
            .map(|spec| {
                spec.containers[self.agent]
                    .ports
                    .iter()
                    .flatten()
                    .map(|port| port.container_port)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What the template's security settings enforce, and what they leave out.
    pub fn isolation_report(&self) -> IsolationReport {
        let mut enforced = vec!["each browser runs in a Kubernetes pod of its own".to_owned()];
        let mut not_enforced = Vec::new();
        let Some(spec) = self.pod.spec.as_ref() else {
            return IsolationReport::new(false, enforced, not_enforced, HostCapabilities::detect());
        };
        let container = &spec.containers[self.agent];
        let pod_security = spec.security_context.clone().unwrap_or_default();
        let security = container.security_context.clone().unwrap_or_default();
        let run_as_user = security.run_as_user.or(pod_security.run_as_user);
        let non_root = security.run_as_non_root.or(pod_security.run_as_non_root) == Some(true)
            && run_as_user != Some(0);
        let seccomp =
            security.seccomp_profile.or(pod_security.seccomp_profile).is_some_and(|profile| {
                matches!(profile.type_.as_str(), "RuntimeDefault" | "Localhost")
            });
        let drops_all = security
            .capabilities
            .as_ref()
            .and_then(|capabilities| capabilities.drop.as_ref())
            .is_some_and(|drop| drop.iter().any(|capability| capability == "ALL"));
        let shm_in_memory = spec.volumes.iter().flatten().any(|volume| {
            volume.empty_dir.as_ref().is_some_and(|dir| dir.medium.as_deref() == Some("Memory"))
                && container
                    .volume_mounts
                    .iter()
                    .flatten()
                    .any(|mount| mount.name == volume.name && mount.mount_path == "/dev/shm")
        });
        let checks = [
            (non_root, "the agent and its browser run as a non-root user (runAsNonRoot)"),
            (
                security.allow_privilege_escalation == Some(false),
                "no privilege escalation (allowPrivilegeEscalation: false)",
            ),
            (security.privileged != Some(true), "no privileged container"),
            (seccomp, "a seccomp profile (RuntimeDefault)"),
            (drops_all, "every Linux capability dropped"),
            (security.read_only_root_filesystem == Some(true), "a read-only root filesystem"),
            (shm_in_memory, "a memory-backed /dev/shm (emptyDir, medium Memory)"),
            (
                spec.automount_service_account_token == Some(false),
                "no Kubernetes API token in the pod (automountServiceAccountToken: false)",
            ),
            (
                spec.host_network != Some(true)
                    && spec.host_pid != Some(true)
                    && spec.host_ipc != Some(true),
                "the node's network, PID and IPC namespaces stay out of the pod",
            ),
        ];
        for (holds, protection) in checks {
            match holds {
                true => enforced.push(protection.to_owned()),
                false => not_enforced.push(Unenforced {
                    protection: protection.to_owned(),
                    reason: "the pod template does not set it".to_owned(),
                }),
            }
        }
        let encrypted = "gRPC between the control plane and agents is encrypted (TLS, \
                         certificates checked against --agent-tls-ca)";
        match self.tls {
            true => enforced.push(encrypted.to_owned()),
            false => not_enforced.push(Unenforced {
                protection: encrypted.to_owned(),
                reason: "--agent-tls-ca is not set: calls to agents travel in clear inside \
                         the cluster (each still authenticated by its agent's secret)"
                    .to_owned(),
            }),
        }
        not_enforced.push(Unenforced {
            protection: "per-browser egress rules (network.allowed_hosts, proxies)".to_owned(),
            reason: "browser pods reach the network directly; a NetworkPolicy (see \
                     deploy/kubernetes) keeps them to public addresses, and this service \
                     cannot tell whether the cluster enforces it"
                .to_owned(),
        });
        not_enforced.push(Unenforced {
            protection: "tenant code runs apart from the agent (another uid in the VM)".to_owned(),
            reason: "in a pod the agent, Chromium and processes a tenant starts share the \
                     container's user, so a tenant process can signal or trace the agent; \
                     what it could take there is the pod's own (the agent holds only its \
                     secret's digest)"
                .to_owned(),
        });
        let sandboxed = non_root && security.allow_privilege_escalation == Some(false);
        IsolationReport::new(sandboxed, enforced, not_enforced, HostCapabilities::detect())
    }
}

/// The session's settings on the agent's command line, after the template's own.
fn agent_args(spec: &LaunchSpec, config: &KubernetesRuntimeConfig) -> Vec<String> {
    let mut args = vec![
        format!("--listen=0.0.0.0:{}", config.agent_port),
        format!("--width={}", spec.width),
        format!("--height={}", spec.height),
        format!("--max-width={}", config.max_resized_viewport.width),
        format!("--max-height={}", config.max_resized_viewport.height),
        format!("--idle-grace-seconds={}", config.agent_idle_grace.as_secs().max(1)),
        format!(
            "--freeze-idle-after-seconds={}",
            config.freeze_idle_after.map_or(0, |idle| idle.as_secs().max(1))
        ),
        format!("--memory-limit-bytes={}", spec.memory_limit_bytes.unwrap_or(0)),
        format!("--zip-max-entries={}", config.zip_limits.max_entries),
        format!("--zip-max-expanded-bytes={}", config.zip_limits.max_expanded_bytes),
        format!("--zip-max-ratio={}", config.zip_limits.max_ratio),
    ];
    if let Some(timezone) = &spec.timezone {
        args.push(format!("--timezone={timezone}"));
    }
    if let Some(locale) = &spec.locale {
        args.push(format!("--locale={locale}"));
    }
    for (flag, on) in
        [("--headless", spec.headless), ("--kiosk", spec.kiosk), ("--stealth", spec.stealth)]
    {
        if on {
            args.push(flag.to_owned());
        }
    }
    args
}

/// The session's memory as the container's request (the node reserves it), and a limit a
/// little above it: the agent ends the VM at its `memory` with a reason the user sees,
/// and the kernel's OOM killer (at the limit) only catches a burst faster than the agent.
fn set_memory(container: &mut Container, bytes: u64) {
    let resources = container.resources.get_or_insert_with(ResourceRequirements::default);
    let headroom = (bytes / 8).max(256 << 20);
    for (map, value) in
        [(&mut resources.requests, bytes), (&mut resources.limits, bytes.saturating_add(headroom))]
    {
        map.get_or_insert_with(BTreeMap::new)
            .insert("memory".to_owned(), Quantity(value.to_string()));
    }
}

/// The container's ephemeral storage, requested and limited: a VM that fills its disk is
/// evicted by the kubelet instead of filling the node's.
fn set_ephemeral_storage(container: &mut Container, bytes: u64) {
    let resources = container.resources.get_or_insert_with(ResourceRequirements::default);
    for map in [&mut resources.requests, &mut resources.limits] {
        map.get_or_insert_with(BTreeMap::new)
            .insert("ephemeral-storage".to_owned(), Quantity(bytes.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATE: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  labels: {app: browser-vm}
spec:
  automountServiceAccountToken: false
  securityContext:
    runAsNonRoot: true
    runAsUser: 1000
    seccompProfile: {type: RuntimeDefault}
  containers:
    - name: browser-agent
      image: browser-vm:dev
      args: ["--vm-root=/home/kernel"]
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities: {drop: [ALL]}
      volumeMounts: [{name: shm, mountPath: /dev/shm}]
  volumes: [{name: shm, emptyDir: {medium: Memory}}]
"#;

    fn spec() -> LaunchSpec {
        LaunchSpec {
            background: false,
            session_id: "abc123".into(),
            headless: true,
            width: 1280,
            height: 720,
            kiosk: false,
            stealth: false,
            extensions: vec![],
            egress: Default::default(),
            profile_archive: None,
            memory_limit_bytes: Some(2 << 30),
            chrome_policy: None,
            timezone: Some("Europe/Paris".into()),
            locale: None,
        }
    }

    fn config(template: PodTemplate) -> KubernetesRuntimeConfig {
        KubernetesRuntimeConfig {
            template,
            agent_port: 50051,
            tls: false,
            start_timeout: std::time::Duration::from_secs(60),
            agent_idle_grace: std::time::Duration::from_secs(300),
            freeze_idle_after: None,
            zip_limits: crate::runtime::ZipLimits {
                max_entries: 10,
                max_expanded_bytes: 100,
                max_ratio: 5,
            },
            max_resized_viewport: crate::config::ScreenSize { width: 1920, height: 1080 },
            disk_bytes: Some(8 << 30),
        }
    }

    #[test]
    fn a_browser_pod_is_the_template_with_the_session_in_it() {
        let template = PodTemplate::new(serde_yaml_ng::from_str(TEMPLATE).unwrap(), false).unwrap();
        let config = config(template.clone());
        let pod = template.pod_for(&spec(), "s3cret", &config);
        assert_eq!(pod.metadata.name.as_deref(), Some("browser-abc123"));
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels["app"], "browser-vm");
        assert_eq!(labels[SESSION_LABEL], "abc123");
        assert_eq!(labels[MANAGED_LABEL], MANAGED_VALUE);
        let pod_spec = pod.spec.unwrap();
        assert_eq!(pod_spec.restart_policy.as_deref(), Some("Never"));
        let container = &pod_spec.containers[0];
        let args = container.args.clone().unwrap();
        assert_eq!(args[0], "--vm-root=/home/kernel");
        for wanted in
            ["--listen=0.0.0.0:50051", "--width=1280", "--headless", "--timezone=Europe/Paris"]
        {
            assert!(args.iter().any(|arg| arg == wanted), "{wanted} in {args:?}");
        }
        let env = container.env.clone().unwrap();
        let digest = hex::encode(Sha256::digest(b"s3cret"));
        assert!(env.iter().any(|var| var.name == "BROWSER_AGENT_SECRET_SHA256"
            && var.value.as_deref() == Some(digest.as_str())));
        assert!(!serde_json::to_string(&pod_spec).unwrap().contains("s3cret"));
        // The agent ends the VM at its `memory`, before the kernel would at the limit.
        let resources = container.resources.clone().unwrap();
        assert_eq!(resources.requests.unwrap()["memory"].0, (2u64 << 30).to_string());
        let limits = resources.limits.unwrap();
        assert_eq!(limits["memory"].0, ((2u64 << 30) + (256 << 20)).to_string());
        // Its disk: the kubelet evicts the pod past it.
        assert_eq!(limits["ephemeral-storage"].0, (8u64 << 30).to_string());
    }

    #[test]
    fn the_report_names_what_the_template_leaves_out() {
        let template = PodTemplate::new(serde_yaml_ng::from_str(TEMPLATE).unwrap(), false).unwrap();
        let report = template.isolation_report();
        assert!(report.sandboxed);
        let missing: Vec<_> =
            report.not_enforced.iter().map(|item| item.protection.as_str()).collect();
        assert_eq!(missing.len(), 3, "{missing:?}");
        assert!(missing[0].contains("TLS"));
        assert!(missing[1].contains("egress rules"));
        assert!(missing[2].contains("apart from the agent"));

        let mut loose: Pod = serde_yaml_ng::from_str(TEMPLATE).unwrap();
        let spec = loose.spec.as_mut().unwrap();
        spec.security_context = None;
        spec.automount_service_account_token = None;
        let report = PodTemplate::new(loose, false).unwrap().isolation_report();
        assert!(!report.sandboxed);
        let missing: Vec<_> =
            report.not_enforced.iter().map(|item| item.protection.clone()).collect();
        assert!(missing.iter().any(|item| item.contains("runAsNonRoot")));
        assert!(missing.iter().any(|item| item.contains("seccomp")));
        assert!(missing.iter().any(|item| item.contains("API token")));
    }

    #[test]
    fn tls_needs_a_certificate_in_the_template_and_the_other_way_round() {
        let plain: Pod = serde_yaml_ng::from_str(TEMPLATE).unwrap();
        assert!(PodTemplate::new(plain.clone(), true).is_err());
        let mut with_certificate = plain;
        with_certificate.spec.as_mut().unwrap().containers[0]
            .args
            .as_mut()
            .unwrap()
            .extend(["--tls-cert=/tls/tls.crt".into(), "--tls-key=/tls/tls.key".into()]);
        assert!(PodTemplate::new(with_certificate.clone(), false).is_err());
        let report = PodTemplate::new(with_certificate, true).unwrap().isolation_report();
        assert!(report.enforced.iter().any(|item| item.contains("TLS")));
    }

    #[test]
    fn a_template_setting_what_the_runtime_sets_is_refused() {
        let mut pod: Pod = serde_yaml_ng::from_str(TEMPLATE).unwrap();
        pod.spec.as_mut().unwrap().containers[0]
            .args
            .as_mut()
            .unwrap()
            .push("--listen=0.0.0.0:1".into());
        let refused = PodTemplate::new(pod, false).unwrap_err().to_string();
        assert!(refused.contains("--listen"), "{refused}");
    }

    #[test]
    fn a_template_without_an_agent_container_is_refused() {
        let mut pod: Pod = serde_yaml_ng::from_str(TEMPLATE).unwrap();
        let spec = pod.spec.as_mut().unwrap();
        let mut second = spec.containers[0].clone();
        second.name = "sidecar".into();
        spec.containers[0].name = "other".into();
        spec.containers.push(second);
        assert!(PodTemplate::new(pod, false).is_err());
    }
}
