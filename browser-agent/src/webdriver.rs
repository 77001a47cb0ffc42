//! WebDriver BiDi for the session (`webdriver_ws_url`): chromedriver (Debian's
//! `chromium-driver`, the same build as the VM's Chromium) runs in the VM, started on the
//! first connection and kept, and each connection is tunnelled to its BiDi endpoint
//! (`/session`, where a client opens its session with `session.new`). chromedriver must
//! drive the VM's running Chromium, never launch one of its own: every `session.new` is
//! rewritten to attach to it (`goog:chromeOptions.debuggerAddress`), whatever Chrome
//! options the client asked for.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::process::GroupLeader;
use crate::processes::Processes;

/// The tunnel path (`CdpOpen.path`) that asks for WebDriver BiDi instead of DevTools.
pub const TUNNEL_PATH: &str = "webdriver";
const READY_TIMEOUT: Duration = Duration::from_secs(10);

pub struct WebDriver {
    processes: Arc<Processes>,
    /// chromedriver's port and process, once started.
    running: tokio::sync::Mutex<Option<(u16, GroupLeader)>>,
}

impl WebDriver {
    pub fn new(processes: Arc<Processes>) -> Self {
        Self { processes, running: tokio::sync::Mutex::new(None) }
    }

    /// The BiDi endpoint of a running chromedriver, started (or started again after it
    /// died) on demand.
    pub async fn endpoint(&self) -> Result<String, String> {
        let mut running = self.running.lock().await;
        if let Some((_, process)) = running.as_mut()
            && process.child.try_wait().ok().flatten().is_some()
        {
            *running = None;
        }
        let port = match running.as_ref() {
            Some((port, _)) => *port,
            None => {
                let (port, process) = self.start().await?;
                *running = Some((port, process));
                port
            }
        };
        Ok(format!("ws://127.0.0.1:{port}/session"))
    }

    async fn start(&self) -> Result<(u16, GroupLeader), String> {
        // A port free now; chromedriver binds it a moment later (the VM's own loopback:
        // only its own processes could take it meanwhile).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|error| format!("no free port for chromedriver: {error}"))?
            .port();
        let mut command = self.processes.in_vm_environment("chromedriver", false);
        command
            .arg(format!("--port={port}"))
            .arg("--log-level=WARNING")
            // chromedriver speaks to Chromium on the VM's loopback, not the way out.
            .env("NO_PROXY", "127.0.0.1")
            .env("no_proxy", "127.0.0.1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(match crate::service_logs::file("webdriver") {
                Some(log) => Stdio::from(log),
                None => Stdio::null(),
            });
        let mut process = GroupLeader::spawn(command)
            .map_err(|error| format!("chromedriver could not be started: {error}"))?;
        let status = format!("http://127.0.0.1:{port}/status");
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            let ready = client
                .get(&status)
                .timeout(Duration::from_secs(1))
                .send()
                .await
                .is_ok_and(|response| response.status().is_success());
            if ready {
                return Ok((port, process));
            }
            if tokio::time::Instant::now() > deadline
                || process.child.try_wait().ok().flatten().is_some()
            {
                process.terminate(Duration::ZERO).await;
                return Err("chromedriver did not start (see the webdriver service log)".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn stop(&self) {
        if let Some((_, mut process)) = self.running.lock().await.take() {
            process.terminate(Duration::from_millis(500)).await;
        }
    }
}

/// A client's BiDi message with a `session.new` made to attach to the VM's Chromium
/// (its DevTools on `devtools_port`); any other command as it is. What is not a JSON
/// command is dropped: chromedriver must never read a `session.new` this did not see
/// (an escaped method name, say).
pub fn attach_sessions_to(devtools_port: u16, message: String) -> Option<String> {
    let mut command = serde_json::from_str::<Value>(&message).ok()?;
    if !command.is_object() {
        return None;
    }
    if command["method"] != "session.new" {
        return Some(message);
    }
    let attach = serde_json::json!({ "debuggerAddress": format!("127.0.0.1:{devtools_port}") });
    let capabilities = &mut command["params"]["capabilities"];
    if !capabilities.is_object() {
        *capabilities = serde_json::json!({});
    }
    // (`get_mut`: indexing a missing key mutably would insert a null.)
    if let Some(first_match) = capabilities.get_mut("firstMatch").and_then(Value::as_array_mut) {
        for alternative in first_match.iter_mut().filter_map(Value::as_object_mut) {
            alternative.remove("goog:chromeOptions");
        }
    }
    if !capabilities["alwaysMatch"].is_object() {
        capabilities["alwaysMatch"] = serde_json::json!({});
    }
    capabilities["alwaysMatch"]["goog:chromeOptions"] = attach;
    Some(command.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_new_session_attaches_to_the_vms_chromium() {
        let asked = r#"{"id":1,"method":"session.new","params":{"capabilities":{
            "alwaysMatch":{"goog:chromeOptions":{"binary":"/bin/evil","args":["--x"]},"webSocketUrl":true},
            "firstMatch":[{"goog:chromeOptions":{"binary":"/bin/evil"}}]}}}"#;
        let sent: Value =
            serde_json::from_str(&attach_sessions_to(9222, asked.into()).expect("kept"))
                .expect("json");
        let capabilities = &sent["params"]["capabilities"];
        assert_eq!(
            capabilities["alwaysMatch"]["goog:chromeOptions"],
            serde_json::json!({ "debuggerAddress": "127.0.0.1:9222" })
        );
        assert_eq!(capabilities["alwaysMatch"]["webSocketUrl"], true);
        assert_eq!(capabilities["firstMatch"][0], serde_json::json!({}));
        assert!(bare_capabilities_stay_bare());
        // An escaped method name is the same method once parsed.
        let bare: Value = serde_json::from_str(
            &attach_sessions_to(1, r#"{"id":2,"method":"session\u002enew","params":{}}"#.into())
                .expect("kept"),
        )
        .expect("json");
        assert_eq!(
            bare["params"]["capabilities"]["alwaysMatch"]["goog:chromeOptions"]["debuggerAddress"],
            "127.0.0.1:1"
        );
        let other = r#"{"id":3,"method":"browsingContext.getTree","params":{}}"#;
        assert_eq!(attach_sessions_to(1, other.into()).as_deref(), Some(other));
        assert_eq!(attach_sessions_to(1, "not json".into()), None);
        assert_eq!(attach_sessions_to(1, "[1]".into()), None);
    }

    fn bare_capabilities_stay_bare() -> bool {
        let asked =
            r#"{"id":1,"method":"session.new","params":{"capabilities":{"alwaysMatch":{}}}}"#;
        let sent: Value = serde_json::from_str(&attach_sessions_to(1, asked.into()).expect("kept"))
            .expect("json");
        sent["params"]["capabilities"].get("firstMatch").is_none()
    }
}
