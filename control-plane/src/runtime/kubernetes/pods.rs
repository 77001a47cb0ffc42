//! Browser pods as the runtime sees them: their names and labels, what became of one,
//! and what is handed to its agent over gRPC once it answers.

use std::path::PathBuf;

use browser_agent_proto::v1::{
    Empty, ExtensionName, ExtensionUploadChunk, extension_upload_chunk::Kind,
};
use k8s_openapi::api::core::v1::Pod;
use tokio::io::AsyncReadExt;

use crate::agent::{AgentClient, AgentError};

/// Every pod this service creates carries it, and nothing else does.
pub const MANAGED_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_VALUE: &str = "browser-service";
pub const MANAGED_SELECTOR: &str = "app.kubernetes.io/managed-by=browser-service";
/// The browser session a pod serves.
pub const SESSION_LABEL: &str = "browser-service/session";

/// The pod of a session (session ids are lowercase letters and digits: a valid name).
pub fn pod_name(session_id: &str) -> String {
    format!("browser-{session_id}")
}

/// The agent's gRPC endpoint at a pod IP (IPv6 in brackets).
pub fn endpoint(ip: &str, port: u16, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) => format!("{scheme}://[{v6}]:{port}"),
        _ => format!("{scheme}://{ip}:{port}"),
    }
}

/// What became of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodFate {
    /// Not running yet, with why (scheduling, image pull).
    Pending(String),
    /// Running at this IP.
    Running(String),
    /// Being deleted (by us, a drain, an eviction: why, when the pod says): its VM is
    /// ending.
    Terminating(Option<String>),
    /// Ended (failed, its node lost) or deleted, with why.
    Gone(String),
}

impl PodFate {
    /// The VM has ended or is ending.
    pub fn has_ended(&self) -> bool {
        matches!(self, Self::Terminating(_) | Self::Gone(_))
    }

    /// Why the VM ended, once it has.
    pub fn reason(&self) -> Option<String> {
        match self {
            Self::Terminating(None) => Some("its pod was deleted".to_owned()),
            Self::Terminating(Some(why)) => Some(format!("its pod was evicted ({why})")),
            Self::Gone(reason) => Some(reason.clone()),
            Self::Pending(_) | Self::Running(_) => None,
        }
    }
}

/// The parts of a pod's status the runtime acts on.
#[derive(Clone, Debug)]
pub struct PodView {
    pub name: String,
    phase: String,
    ip: Option<String>,
    reason: Option<String>,
    message: Option<String>,
    terminating: bool,
    /// Why it is not running yet: a condition's or a container's waiting reason.
    waiting: Option<String>,
    /// How the container ended (`OOMKilled`, its exit code), once it has.
    terminated: Option<String>,
    /// Why the pod is being taken down (its `DisruptionTarget` condition: an eviction,
    /// a preemption, a node's taint).
    disruption: Option<String>,
}

impl PodView {
    pub fn of(pod: &Pod) -> Option<Self> {
        let name = pod.metadata.name.clone()?;
        let status = pod.status.clone().unwrap_or_default();
        let unscheduled = status
            .conditions
            .iter()
            .flatten()
            .find(|condition| condition.type_ == "PodScheduled" && condition.status == "False")
            .map(|condition| {
                condition
                    .message
                    .clone()
                    .or(condition.reason.clone())
                    .unwrap_or_else(|| "not scheduled".to_owned())
            });
        let condition = |wanted: &str| {
            status
                .conditions
                .iter()
                .flatten()
                .find(|condition| condition.type_ == wanted && condition.status == "True")
        };
        let disruption = condition("DisruptionTarget").map(|condition| {
            [condition.reason.as_deref(), condition.message.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(": ")
        });
        let states = || status.container_statuses.iter().flatten().filter_map(|c| c.state.as_ref());
        let terminated = states()
            .filter_map(|state| state.terminated.as_ref())
            .map(|terminated| {
                let reason = terminated.reason.as_deref().unwrap_or("ended");
                match &terminated.message {
                    Some(message) => {
                        format!("{reason}, exit code {}: {message}", terminated.exit_code)
                    }
                    None => format!("{reason}, exit code {}", terminated.exit_code),
                }
            })
            .next();
        let container_waiting =
            states().filter_map(|state| state.waiting.as_ref()).find_map(|waiting| {
                let reason = waiting.reason.clone()?;
                Some(match &waiting.message {
                    Some(message) => format!("{reason}: {message}"),
                    None => reason,
                })
            });
        Some(Self {
            name,
            phase: status.phase.unwrap_or_else(|| "Pending".to_owned()),
            ip: status.pod_ip.filter(|ip| !ip.is_empty()),
            reason: status.reason,
            message: status.message,
            terminating: pod.metadata.deletion_timestamp.is_some(),
            waiting: container_waiting.or(unscheduled),
            terminated,
            disruption,
        })
    }

    pub fn fate(&self) -> PodFate {
        match self.phase.as_str() {
            "Failed" | "Succeeded" => {
                let detail =
                    [self.reason.as_deref(), self.message.as_deref(), self.terminated.as_deref()]
                        .into_iter()
                        .flatten()
                        .collect::<Vec<_>>()
                        .join(": ");
                PodFate::Gone(match detail.is_empty() {
                    true => format!("its pod ended ({})", self.phase),
                    false => format!("its pod ended ({}): {detail}", self.phase),
                })
            }
            _ if self.terminating => PodFate::Terminating(self.disruption.clone()),
            "Running" => match &self.ip {
                Some(ip) => PodFate::Running(ip.clone()),
                None => PodFate::Pending("running without an IP yet".to_owned()),
            },
            _ => PodFate::Pending(self.pending_reason()),
        }
    }

    pub fn pending_reason(&self) -> String {
        match &self.waiting {
            Some(waiting) => format!("{}: {waiting}", self.phase),
            None => self.phase.clone(),
        }
    }
}

/// Unpacks the extensions the VM starts with, streamed from the blob store's files.
pub async fn send_extensions(
    client: &AgentClient, extensions: &[(String, PathBuf)],
) -> Result<(), AgentError> {
    let (sender, receiver) = tokio::sync::mpsc::channel(8);
    let call = {
        let client = client.clone();
        tokio::spawn(async move { client.load_extensions(receiver).await })
    };
    let send = |kind| {
        let sender = sender.clone();
        async move { sender.send(ExtensionUploadChunk { kind: Some(kind) }).await.is_ok() }
    };
    let fed: std::io::Result<bool> = async {
        for (index, (name, archive)) in extensions.iter().enumerate() {
            let slot = index.to_string();
            let name = Kind::Name(ExtensionName { slot: slot.clone(), name: name.clone() });
            if !send(Kind::BeginSlot(slot)).await || !send(name).await {
                return Ok(false);
            }
            let mut file = tokio::fs::File::open(archive).await?;
            let mut buffer = vec![0u8; 256 * 1024];
            loop {
                let read = file.read(&mut buffer).await?;
                if read == 0 {
                    break;
                }
                if !send(Kind::Data(buffer[..read].to_vec())).await {
                    return Ok(false);
                }
            }
        }
        Ok(send(Kind::Commit(Empty {})).await)
    }
    .await;
    // Without `commit` the agent changes nothing; its answer says why it stopped.
    drop(sender);
    let answer = call.await.map_err(|error| AgentError::Internal(error.to_string()))?;
    match fed {
        Err(error) => Err(AgentError::Internal(format!("reading an extension archive: {error}"))),
        Ok(_) => answer.map(|_| ()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("a pod")
    }

    #[test]
    fn fates_follow_the_pod_status() {
        let running = pod(serde_json::json!({
            "metadata": {"name": "browser-a"},
            "status": {"phase": "Running", "podIP": "10.1.2.3"}
        }));
        assert_eq!(PodView::of(&running).unwrap().fate(), PodFate::Running("10.1.2.3".into()));
        let lost = pod(serde_json::json!({
            "metadata": {"name": "browser-a"},
            "status": {"phase": "Failed", "reason": "NodeLost", "message": "node n1 is unresponsive"}
        }));
        assert_eq!(
            PodView::of(&lost).unwrap().fate(),
            PodFate::Gone("its pod ended (Failed): NodeLost: node n1 is unresponsive".into())
        );
        let deleting = pod(serde_json::json!({
            "metadata": {"name": "browser-a", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Running", "podIP": "10.1.2.3"}
        }));
        assert!(PodView::of(&deleting).unwrap().fate().has_ended());
        let pulling = pod(serde_json::json!({
            "metadata": {"name": "browser-a"},
            "status": {"phase": "Pending", "containerStatuses": [{
                "name": "agent", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}
            }]}
        }));
        assert_eq!(
            PodView::of(&pulling).unwrap().fate(),
            PodFate::Pending("Pending: ImagePullBackOff: not found".into())
        );
    }

    #[test]
    fn an_evicted_or_killed_pod_says_why() {
        let evicted = pod(serde_json::json!({
            "metadata": {"name": "browser-a", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Running", "conditions": [{
                "type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                "message": "Taint manager: deleting due to NoExecute taint"}]}
        }));
        assert_eq!(
            PodView::of(&evicted).unwrap().fate().reason().unwrap(),
            "its pod was evicted (DeletionByTaintManager: Taint manager: deleting due to NoExecute taint)"
        );
        let killed = pod(serde_json::json!({
            "metadata": {"name": "browser-a"},
            "status": {"phase": "Failed", "containerStatuses": [{
                "name": "agent", "image": "x", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
            }]}
        }));
        assert_eq!(
            PodView::of(&killed).unwrap().fate(),
            PodFate::Gone("its pod ended (Failed): OOMKilled, exit code 137".into())
        );
    }

    #[test]
    fn endpoints_bracket_ipv6() {
        assert_eq!(endpoint("10.0.0.7", 50051, false), "http://10.0.0.7:50051");
        assert_eq!(endpoint("fd00::7", 50051, true), "https://[fd00::7]:50051");
    }
}
