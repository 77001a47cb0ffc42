//! A Node.js process of the VM's runtime (`browser-agent/node`), spoken to one JSON line
//! at a time: a request on its stdin, its answer on its stdout. Its own stderr (Node's
//! crash reports) goes to the `playwright` service log.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::watch;

use super::PlaywrightError;
use crate::chromium::BrowserState;
use crate::process::GroupLeader;
use crate::processes::Processes;

/// The VM's Node.js runtime (`browser-agent/node`) and what its processes need: the
/// VM's environment and the running Chromium.
#[derive(Clone)]
pub struct NodeRuntime {
    /// Its directory (scripts, `node_modules`); `None` when the VM has none.
    dir: Option<PathBuf>,
    processes: Arc<Processes>,
    browser: watch::Receiver<BrowserState>,
}

impl NodeRuntime {
    pub fn new(
        dir: Option<PathBuf>, processes: Arc<Processes>, browser: watch::Receiver<BrowserState>,
    ) -> Self {
        Self { dir, processes, browser }
    }

    pub fn devtools_port(&self) -> u16 {
        self.browser.borrow().devtools_port
    }

    /// The DevTools HTTP endpoint of the running Chromium.
    pub fn devtools(&self) -> Result<String, PlaywrightError> {
        match self.devtools_port() {
            0 => Err(PlaywrightError::Unavailable(
                "the browser is not running (it is starting or restarting)".into(),
            )),
            port => Ok(format!("http://127.0.0.1:{port}")),
        }
    }

    /// Starts one of the runtime's scripts with the VM's environment and `env`.
    pub fn start(&self, script: &str, env: &[(&str, &str)]) -> Result<NodeRunner, PlaywrightError> {
        let dir = self.dir.as_ref().ok_or_else(|| {
            PlaywrightError::Unavailable(
                "this browser VM has no Node.js runtime for Playwright (see docs/reference/flags.md: \
                 the control plane's --node-runtime)"
                    .into(),
            )
        })?;
        let mut command = self.processes.in_vm_environment("node", false);
        // playwright-core honours HTTP(S)_PROXY for its own DevTools requests too; the
        // VM's Chromium is on its loopback, not behind the way out.
        command.env("NO_PROXY", "127.0.0.1").env("no_proxy", "127.0.0.1");
        command.envs(env.iter().copied());
        NodeRunner::start(command, &dir.join(script))
            .map_err(|error| PlaywrightError::Unavailable(error.to_string()))
    }
}

/// Longest answer line read (a result, output and images); a longer one ends the process.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

pub struct NodeRunner {
    process: GroupLeader,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The id of the last request; its answer carries it back.
    last_id: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("Node.js could not be started: {0}")]
    Start(std::io::Error),
    #[error("the Node.js process ended ({0})")]
    Ended(String),
}

impl NodeRunner {
    /// Starts `script` of the runtime directory with `command` (the VM's environment,
    /// `node` as its program).
    pub fn start(mut command: std::process::Command, script: &Path) -> Result<Self, RunnerError> {
        command.arg(script).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(
            match crate::service_logs::file("playwright") {
                Some(log) => Stdio::from(log),
                None => Stdio::null(),
            },
        );
        let mut process = GroupLeader::spawn(command).map_err(RunnerError::Start)?;
        let (Some(stdin), Some(stdout)) = (process.child.stdin.take(), process.child.stdout.take())
        else {
            return Err(RunnerError::Start(std::io::Error::other("its pipes are missing")));
        };
        Ok(Self { process, stdin, stdout: BufReader::new(stdout), last_id: 0 })
    }

    /// Sends one request and waits for its answer (no deadline: the caller sets one).
    /// Requests carry an id that answers echo: a line that is not the answer (users'
    /// code writing to the descriptor itself, say) is skipped, so a stray line cannot
    /// pass for the answer of this call or the next.
    pub async fn call(
        &mut self, request: &serde_json::Value,
    ) -> Result<serde_json::Value, RunnerError> {
        self.last_id += 1;
        let mut request = request.clone();
        request["id"] = self.last_id.into();
        let mut line = request.to_string();
        line.push('\n');
        if let Err(error) = self.stdin.write_all(line.as_bytes()).await {
            return Err(self.ended(error.to_string()).await);
        }
        let mut line = Vec::new();
        loop {
            line.clear();
            let read = (&mut self.stdout)
                .take(MAX_ANSWER_BYTES as u64 + 1)
                .read_until(b'\n', &mut line)
                .await;
            match read {
                Ok(0) => return Err(self.ended("it closed its output".into()).await),
                Ok(_) if line.len() > MAX_ANSWER_BYTES => {
                    return Err(RunnerError::Ended(format!(
                        "it wrote a line larger than {} MiB",
                        MAX_ANSWER_BYTES >> 20
                    )));
                }
                Ok(_) => {}
                Err(error) => return Err(self.ended(error.to_string()).await),
            }
            let answer: Option<serde_json::Value> = serde_json::from_slice(&line).ok();
            match answer {
                Some(answer) if answer["id"].as_u64() == Some(self.last_id) => return Ok(answer),
                // (Answers start with a newline of their own: skip the empty line.)
                _ if line == b"\n" => {}
                _ => crate::service_logs::append("playwright", &line),
            }
        }
    }

    /// Why the process ended, when it did: its exit status if it has one by now.
    async fn ended(&mut self, otherwise: String) -> RunnerError {
        match tokio::time::timeout(Duration::from_millis(200), self.process.wait()).await {
            Ok(Ok(status)) => RunnerError::Ended(status.to_string()),
            _ => RunnerError::Ended(otherwise),
        }
    }

    /// Kills the process and everything it started, and reaps it.
    pub async fn stop(mut self) {
        self.process.terminate(Duration::ZERO).await;
    }
}
