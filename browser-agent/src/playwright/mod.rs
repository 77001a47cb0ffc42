//! Server-side Playwright (`/browsers/{id}/playwright/*`): users' code runs in executors,
//! each a Node.js process of the VM's runtime (`browser-agent/node/executor.mjs`) with
//! the real `playwright-core` connected to this VM's Chromium. An executor is started on
//! its first call and kept warm; its calls run one at a time, different executors run
//! at once. The `default` executor always exists and binds `page` to the active tab;
//! named ones (at most `MAX_NAMED`) each own a tab they open in the background.
//!
//! Timeouts: the executor stops waiting for the code at `timeout_ms` and drops its
//! browser connection (the code cannot drive the browser on); if it cannot even answer
//! (a blocked event loop), the agent kills its process `BLOCKED_GRACE` later, and the
//! next call starts a new one. So does a call after a crash.

mod repl;
mod runner;

pub use repl::{Repl, ReplContent};
use runner::NodeRunner;
pub use runner::NodeRuntime;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

/// Named executors a browser may have; the default one does not count.
pub const MAX_NAMED: usize = 8;
/// The executor calls without a name run in.
pub const DEFAULT_EXECUTOR: &str = "default";
/// How long past its timeout an executor may take to answer before it is killed.
const BLOCKED_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum PlaywrightError {
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    NotFound(String),
}

/// What a call answers, as the API reports it.
#[derive(Debug, Default)]
pub struct Outcome {
    pub success: bool,
    pub error: Option<String>,
    /// The returned value as JSON text, when the code returned one.
    pub result_json: Option<String>,
    pub stdout: String,
    pub stderr: String,
    /// The tab `page` was bound to: (target id, whether this call opened it).
    pub tab: Option<(String, bool)>,
}

/// An executor as listed.
pub struct ExecutorInfo {
    pub name: String,
    pub busy: bool,
    pub created_at: SystemTime,
    pub last_used_at: SystemTime,
    pub target_id: Option<String>,
    pub url: Option<String>,
}

struct Executor {
    name: String,
    created_at: SystemTime,
    /// The runner, held for the length of a call: calls queue here.
    runner: tokio::sync::Mutex<Option<(u64, NodeRunner)>>,
    state: std::sync::Mutex<ExecutorState>,
    busy: AtomicBool,
    /// Set once a named executor is deleted: its queued calls fail.
    deleted: AtomicBool,
}

struct ExecutorState {
    last_used_at: SystemTime,
    /// The tab a named executor owns.
    target_id: Option<String>,
    /// Cancelled to end the running call (deletion, restart).
    stop: CancellationToken,
    /// Bumped by each restart: a process of an older generation is not used again.
    generation: u64,
}

impl Executor {
    fn new(name: &str) -> Arc<Self> {
        let now = SystemTime::now();
        Arc::new(Self {
            name: name.to_owned(),
            created_at: now,
            runner: tokio::sync::Mutex::new(None),
            state: std::sync::Mutex::new(ExecutorState {
                last_used_at: now,
                target_id: None,
                stop: CancellationToken::new(),
                generation: 0,
            }),
            busy: AtomicBool::new(false),
            deleted: AtomicBool::new(false),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ExecutorState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn owns_tab(&self) -> bool {
        self.name != DEFAULT_EXECUTOR
    }

    /// Ends the running call, if any, and stops the process.
    async fn stop(&self) {
        let stop = {
            let mut state = self.state();
            state.generation += 1;
            std::mem::take(&mut state.stop)
        };
        stop.cancel();
        // Idle: stop the process now. Busy: the running call stops it as it ends (and
        // a call about to start sees the new generation).
        if let Ok(mut runner) = self.runner.try_lock()
            && let Some((_, runner)) = runner.take()
        {
            runner.stop().await;
        }
    }
}

/// Clears `busy` when the call ends, however it ends.
struct Busy<'a>(&'a AtomicBool);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

pub struct Executors {
    runtime: NodeRuntime,
    /// Resets of the browser so far: a call queued before one does not run after it.
    resets: std::sync::atomic::AtomicU64,
    default: Arc<Executor>,
    /// In creation order.
    named: std::sync::Mutex<Vec<Arc<Executor>>>,
}

impl Executors {
    pub fn new(runtime: NodeRuntime) -> Self {
        Self {
            runtime,
            resets: std::sync::atomic::AtomicU64::new(0),
            default: Executor::new(DEFAULT_EXECUTOR),
            named: std::sync::Mutex::default(),
        }
    }

    fn named(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Executor>>> {
        self.named.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The executor of `name`, created if it is new.
    fn executor(&self, name: &str) -> Result<Arc<Executor>, PlaywrightError> {
        if name == DEFAULT_EXECUTOR {
            return Ok(self.default.clone());
        }
        let mut named = self.named();
        if let Some(executor) = named.iter().find(|executor| executor.name == name) {
            return Ok(executor.clone());
        }
        if named.len() >= MAX_NAMED {
            let names: Vec<&str> = named.iter().map(|executor| executor.name.as_str()).collect();
            return Err(PlaywrightError::Conflict(format!(
                "a browser has at most {MAX_NAMED} named executors; it has {}: delete one first",
                names.join(", ")
            )));
        }
        let executor = Executor::new(name);
        named.push(executor.clone());
        Ok(executor)
    }

    fn start_runner(&self, executor: &Executor) -> Result<NodeRunner, PlaywrightError> {
        let env: &[(&str, &str)] =
            if executor.owns_tab() { &[("EXECUTOR_OWNS_TAB", "1")] } else { &[] };
        self.runtime.start("executor.mjs", env)
    }

    /// Runs `code` on the executor `name` (created if new), waiting for the calls before
    /// it on that executor. The call runs to its end in a task of its own, even if the
    /// caller goes away: a request dropped between writing to the executor and reading
    /// its answer would leave that answer for the next call.
    pub async fn execute(
        self: Arc<Self>, name: &str, code: String, timeout: Duration,
    ) -> Result<Outcome, PlaywrightError> {
        let executor = self.executor(name)?;
        let resets = self.resets.load(Ordering::Acquire);
        tokio::spawn(async move { self.run(executor, code, timeout, resets).await })
            .await
            .map_err(|error| PlaywrightError::Unavailable(format!("the call failed: {error}")))?
    }

    async fn run(
        &self, executor: Arc<Executor>, code: String, timeout: Duration, resets: u64,
    ) -> Result<Outcome, PlaywrightError> {
        let name = &executor.name;
        let mut runner = executor.runner.lock().await;
        let (stop, generation) = {
            let mut state = executor.state();
            state.last_used_at = SystemTime::now();
            (state.stop.clone(), state.generation)
        };
        // Checked after the state is read: a deletion marks the executor before it
        // bumps the generation, so a call that read the new one sees the mark.
        if executor.deleted.load(Ordering::Acquire) {
            return Err(PlaywrightError::NotFound(format!("the executor {name:?} was deleted")));
        }
        if self.resets.load(Ordering::Acquire) != resets {
            return Err(PlaywrightError::Unavailable(
                "the browser was reset while the call waited".into(),
            ));
        }
        executor.busy.store(true, Ordering::Release);
        let _busy = Busy(&executor.busy);
        let endpoint = self.runtime.devtools()?;
        if let Some((started_in, _)) = runner.as_ref()
            && *started_in != generation
            && let Some((_, outdated)) = runner.take()
        {
            outdated.stop().await;
        }
        let running = match runner.as_mut() {
            Some((_, running)) => running,
            None => &mut runner.insert((generation, self.start_runner(&executor)?)).1,
        };
        let request = serde_json::json!({
            "code": code,
            "timeout_ms": timeout.as_millis() as u64,
            "cdp": endpoint,
        });
        let answered = tokio::select! {
            answered = tokio::time::timeout(timeout + BLOCKED_GRACE, running.call(&request)) => answered,
            () = stop.cancelled() => {
                if let Some((_, process)) = runner.take() {
                    process.stop().await;
                }
                let what = if executor.deleted.load(Ordering::Acquire) { "deleted" } else { "restarted" };
                return Ok(Outcome::failed(format!("the executor was {what} while the code ran")));
            }
        };
        let outcome = match answered {
            Ok(Ok(answer)) => Outcome::from_answer(&answer),
            Ok(Err(error)) => {
                if let Some((_, process)) = runner.take() {
                    process.stop().await;
                }
                Outcome::failed(format!("{error}; the next call on this executor starts a new one"))
            }
            Err(_) => {
                if let Some((_, process)) = runner.take() {
                    process.stop().await;
                }
                Outcome::failed(format!(
                    "execution timed out after {} s and the executor did not respond (a blocked \
                     event loop): its process was stopped, the next call starts a new one",
                    timeout.as_secs()
                ))
            }
        };
        if executor.owns_tab()
            && let Some((target_id, _)) = &outcome.tab
        {
            executor.state().target_id = Some(target_id.clone());
        }
        Ok(outcome)
    }

    /// The default executor, then the named ones, with their tabs' current URLs.
    pub async fn list(&self) -> Vec<ExecutorInfo> {
        let executors: Vec<Arc<Executor>> =
            std::iter::once(self.default.clone()).chain(self.named().iter().cloned()).collect();
        let pages = crate::tabs::page_urls(self.runtime.devtools_port()).await;
        executors
            .iter()
            .map(|executor| {
                let state = executor.state();
                let target_id = state.target_id.clone().filter(|target| pages.contains_key(target));
                ExecutorInfo {
                    name: executor.name.clone(),
                    busy: executor.busy.load(Ordering::Acquire),
                    created_at: executor.created_at,
                    last_used_at: state.last_used_at,
                    url: target_id.as_ref().and_then(|target| pages.get(target).cloned()),
                    target_id,
                }
            })
            .collect()
    }

    /// Deletes a named executor (its process, and with `close_tab` its tab), or restarts
    /// the default one.
    pub async fn delete(&self, name: &str, close_tab: bool) -> Result<(), PlaywrightError> {
        if name == DEFAULT_EXECUTOR {
            self.default.stop().await;
            return Ok(());
        }
        let executor = {
            let mut named = self.named();
            let index = named
                .iter()
                .position(|executor| executor.name == name)
                .ok_or_else(|| PlaywrightError::NotFound(format!("no executor named {name:?}")))?;
            named.remove(index)
        };
        executor.deleted.store(true, Ordering::Release);
        executor.stop().await;
        let target = executor.state().target_id.clone();
        if close_tab && let Some(target) = target {
            crate::tabs::close(self.runtime.devtools_port(), &target).await;
        }
        Ok(())
    }

    /// Deletes the named executors and restarts the default one: nothing of what
    /// earlier calls left survives (a pool browser's next lease, the agent's end).
    pub async fn reset(&self) {
        self.resets.fetch_add(1, Ordering::AcqRel);
        let named: Vec<Arc<Executor>> = std::mem::take(&mut *self.named());
        for executor in named {
            executor.deleted.store(true, Ordering::Release);
            executor.stop().await;
        }
        self.default.stop().await;
    }
}

impl Outcome {
    fn failed(error: String) -> Self {
        Self { error: Some(error), ..Self::default() }
    }

    /// An executor's answer (see `executor.mjs`).
    fn from_answer(answer: &serde_json::Value) -> Self {
        let text = |key: &str| answer[key].as_str().map(str::to_owned);
        Self {
            success: answer["success"].as_bool().unwrap_or(false),
            error: text("error"),
            result_json: answer
                .get("result")
                .filter(|result| !result.is_null())
                .map(serde_json::Value::to_string),
            stdout: text("stdout").unwrap_or_default(),
            stderr: text("stderr").unwrap_or_default(),
            tab: answer["tab"]["target_id"].as_str().map(|target| {
                (target.to_owned(), answer["tab"]["created"].as_bool().unwrap_or(false))
            }),
        }
    }
}
