//! The browser's REPL (`/browsers/{id}/repl`): one Node.js process of the VM's runtime
//! (`repl.mjs`), started on the first call and kept, so top-level bindings persist
//! between calls. A reset, a timeout (the agent kills the process: nothing else can stop
//! a blocked event loop) or a crash ends it; the next call starts a new one with a new
//! id.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::PlaywrightError;
use super::runner::{NodeRunner, NodeRuntime, RunnerError};

pub enum ReplContent {
    Text { channel: String, text: String },
    Image { data_b64: String, mime_type: String },
}

#[derive(Default)]
pub struct ReplOutcome {
    pub repl_id: String,
    pub success: bool,
    pub content: Vec<ReplContent>,
    pub content_truncated: bool,
    pub error: Option<String>,
    pub stack: Option<String>,
    /// Whether this call ended the REPL (its timeout, or its crash).
    pub terminated: bool,
    pub duration: Duration,
}

pub struct Repl {
    runtime: NodeRuntime,
    /// The REPL's id and process, held for the length of a call: calls queue here.
    current: tokio::sync::Mutex<Option<(String, NodeRunner)>>,
    /// Cancelled by a reset of the browser, to end the running call at once.
    stop: std::sync::Mutex<CancellationToken>,
    /// Resets of the browser so far: a call queued before one does not run after it.
    resets: AtomicU64,
}

impl Repl {
    pub fn new(runtime: NodeRuntime) -> Self {
        Self {
            runtime,
            current: tokio::sync::Mutex::new(None),
            stop: std::sync::Mutex::default(),
            resets: AtomicU64::new(0),
        }
    }

    fn stop_token(&self) -> std::sync::MutexGuard<'_, CancellationToken> {
        self.stop.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Evaluates `code` (after a fresh start with `reset`), waiting for calls before it.
    /// The call runs to its end in a task of its own, even if the caller goes away (an
    /// answer left unread would be the next call's).
    pub async fn eval(
        self: Arc<Self>, code: String, reset: bool, timeout: Duration,
    ) -> Result<ReplOutcome, PlaywrightError> {
        let resets = self.resets.load(Ordering::Acquire);
        tokio::spawn(async move { self.run(code, reset, timeout, resets).await })
            .await
            .map_err(|error| PlaywrightError::Unavailable(format!("the call failed: {error}")))?
    }

    async fn run(
        &self, code: String, reset: bool, timeout: Duration, resets: u64,
    ) -> Result<ReplOutcome, PlaywrightError> {
        let mut current = self.current.lock().await;
        let stop = self.stop_token().clone();
        if self.resets.load(Ordering::Acquire) != resets {
            return Err(PlaywrightError::Unavailable(
                "the browser was reset while the call waited".into(),
            ));
        }
        let started = Instant::now();
        if reset && let Some((_, runner)) = current.take() {
            runner.stop().await;
        }
        let endpoint = self.runtime.devtools()?;
        let (repl_id, runner) = match current.as_mut() {
            Some((id, runner)) => (id.clone(), runner),
            None => {
                let id = new_repl_id();
                let runner = self.runtime.start("repl.mjs", &[])?;
                let (_, runner) = current.insert((id.clone(), runner));
                (id, runner)
            }
        };
        let request = serde_json::json!({ "code": code, "cdp": endpoint });
        let answered = tokio::select! {
            answered = tokio::time::timeout(timeout, runner.call(&request)) => answered,
            () = stop.cancelled() => Ok(Err(RunnerError::Ended("the browser was reset".into()))),
        };
        let failure = match answered {
            Ok(Ok(answer)) => {
                return Ok(ReplOutcome {
                    duration: started.elapsed(),
                    ..outcome_of(repl_id, &answer)
                });
            }
            Ok(Err(error)) => format!("the REPL ended: {error}"),
            Err(_) => format!(
                "execution timed out after {} s; the REPL was terminated (its bindings are lost)",
                timeout.as_secs()
            ),
        };
        if let Some((_, runner)) = current.take() {
            runner.stop().await;
        }
        Ok(ReplOutcome {
            repl_id,
            error: Some(failure),
            terminated: true,
            duration: started.elapsed(),
            ..ReplOutcome::default()
        })
    }

    /// Ends the REPL, a call running in it, and calls waiting for it (a pool browser's
    /// next lease, the agent's end).
    pub async fn reset(&self) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        std::mem::take(&mut *self.stop_token()).cancel();
        if let Some((_, runner)) = self.current.lock().await.take() {
            runner.stop().await;
        }
    }
}

/// An answer of `repl.mjs`.
fn outcome_of(repl_id: String, answer: &serde_json::Value) -> ReplOutcome {
    let text =
        |value: &serde_json::Value, key: &str| value[key].as_str().unwrap_or_default().to_owned();
    let content = answer["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| match item["type"].as_str()? {
            "text" => {
                Some(ReplContent::Text { channel: text(item, "channel"), text: text(item, "text") })
            }
            "image" => Some(ReplContent::Image {
                data_b64: text(item, "data_b64"),
                mime_type: text(item, "mime_type"),
            }),
            _ => None,
        })
        .collect();
    ReplOutcome {
        repl_id,
        success: answer["success"].as_bool().unwrap_or(false),
        content,
        content_truncated: answer["content_truncated"].as_bool().unwrap_or(false),
        error: answer["error"].as_str().map(str::to_owned),
        stack: answer["stack"].as_str().map(str::to_owned),
        ..ReplOutcome::default()
    }
}

/// A CUID2-like id: a letter, then 23 lowercase letters and digits.
fn new_repl_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = [0u8; 24];
    let read =
        std::fs::File::open("/dev/urandom").and_then(|mut random| random.read_exact(&mut bytes));
    if read.is_err() {
        // Unique enough without the kernel's randomness: the time.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        bytes.copy_from_slice(&nanos.to_le_bytes().repeat(2)[..24]);
    }
    bytes
        .iter()
        .enumerate()
        .map(|(index, byte)| {
            let letters = if index == 0 { 26 } else { ALPHABET.len() };
            ALPHABET[usize::from(*byte) % letters] as char
        })
        .collect()
}
