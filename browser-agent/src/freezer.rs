//! Idle browsers cost no CPU. Once no call has been in flight for the idle period and
//! the VM runs nothing on its user's behalf (a command, a recording), every process of
//! the VM but the agent is stopped (SIGSTOP: Chromium, its renderers, Xvfb, the sound
//! server). The next call (a CDP, live-view or WebDriver connection, any API call) lets
//! them go on (SIGCONT) before it is served, so nothing outside can tell, except that
//! the page's clocks paused meanwhile. The control plane's heartbeat (`Status`) neither
//! wakes the VM nor counts as use.
//!
//! The agent itself keeps running (it is what answers), so this needs nothing of the
//! host: it works the same in a bubblewrap sandbox and in a Kubernetes pod.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio_util::sync::CancellationToken;

use crate::memory::VmProcesses;

/// What keeps a VM awake although no call is in flight; `None` when nothing does.
pub type BusyCheck = Box<dyn Fn() -> Option<&'static str> + Send + Sync>;
/// The processes to stop.
pub type ProcessList = Box<dyn Fn() -> Vec<i32> + Send + Sync>;

/// How often the idle period is checked.
const CHECK_EVERY: Duration = Duration::from_millis(500);
/// The gRPC method the control plane calls as a heartbeat.
const HEARTBEAT_PATH: &str = "/browser_agent.v1.BrowserAgent/Status";

struct State {
    in_flight: usize,
    last_call: Instant,
    /// The processes stopped, while frozen.
    stopped: Option<Vec<i32>>,
}

pub struct Freezer {
    idle_after: Option<Duration>,
    processes: ProcessList,
    state: Mutex<State>,
    busy: BusyCheck,
}

impl Freezer {
    /// `idle_after` `None`: never freezes.
    pub fn new(idle_after: Option<Duration>, processes: ProcessList, busy: BusyCheck) -> Arc<Self> {
        Arc::new(Self {
            idle_after,
            processes,
            state: Mutex::new(State { in_flight: 0, last_call: Instant::now(), stopped: None }),
            busy,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    #[cfg(test)]
    fn is_frozen(&self) -> bool {
        self.lock().stopped.is_some()
    }

    /// A call begins: the VM is thawed (if frozen) before this returns, and stays awake
    /// until the guard (held for the whole call, a stream's included) is dropped.
    pub fn begin_call(self: &Arc<Self>) -> CallGuard {
        let mut state = self.lock();
        state.in_flight += 1;
        if let Some(stopped) = state.stopped.take() {
            let started = Instant::now();
            for pid in &stopped {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGCONT);
            }
            tracing::info!(
                processes = stopped.len(),
                micros = started.elapsed().as_micros() as u64,
                "thawed the VM for a call"
            );
        }
        CallGuard { freezer: self.clone() }
    }

    /// Thaws for good (shutting down: processes must be able to end).
    pub fn thaw(self: &Arc<Self>) {
        drop(self.begin_call());
    }

    /// Freezes the VM whenever it has been idle long enough; until `shutdown`.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let Some(idle_after) = self.idle_after else {
            return;
        };
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(CHECK_EVERY) => {}
            }
            let mut state = self.lock();
            if state.stopped.is_some()
                || state.in_flight > 0
                || state.last_call.elapsed() < idle_after
            {
                continue;
            }
            if let Some(reason) = (self.busy)() {
                // Busy counts as use: the idle period starts again once it is over.
                state.last_call = Instant::now();
                tracing::debug!(reason, "not freezing a busy VM");
                continue;
            }
            // Under the lock: a call that begins now waits, and then thaws what this
            // stopped.
            let stopped: Vec<i32> = (self.processes)()
                .into_iter()
                .filter(|pid| kill(Pid::from_raw(*pid), Signal::SIGSTOP).is_ok())
                .collect();
            tracing::info!(processes = stopped.len(), "froze the idle VM");
            state.stopped = Some(stopped);
        }
        self.thaw();
    }
}

/// Keeps the VM awake while held.
pub struct CallGuard {
    freezer: Arc<Freezer>,
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let mut state = self.freezer.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        state.last_call = Instant::now();
    }
}

/// The VM's processes other than the agent and a sandbox's PID 1 (which only waits for
/// the agent, and which a signal from inside its namespace could not stop anyway).
pub fn vm_processes(scope: VmProcesses) -> Vec<i32> {
    let me = std::process::id();
    crate::memory::vm_pids(scope)
        .into_iter()
        .filter(|pid| *pid != me && *pid != 1)
        .filter_map(|pid| i32::try_from(pid).ok())
        .collect()
}

/// A tower layer over the agent's gRPC server: every call but the heartbeat thaws the VM
/// and keeps it awake until its response (a stream's last message) has been sent.
#[derive(Clone)]
pub struct FreezerLayer(pub Arc<Freezer>);

impl<S> tower::Layer<S> for FreezerLayer {
    type Service = FreezerService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FreezerService { inner, freezer: self.0.clone() }
    }
}

#[derive(Clone)]
pub struct FreezerService<S> {
    inner: S,
    freezer: Arc<Freezer>,
}

impl<S, B, R> tower::Service<http::Request<B>> for FreezerService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<GuardedBody<R>>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let guard = (request.uri().path() != HEARTBEAT_PATH).then(|| self.freezer.begin_call());
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| GuardedBody { body, guard }))
        })
    }
}

/// A response body that keeps its call's guard until the body is done with.
pub struct GuardedBody<B> {
    body: B,
    guard: Option<CallGuard>,
}

impl<B: http_body::Body + Unpin> http_body::Body for GuardedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>, cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.guard = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_a_sandbox_only_the_agents_own_descendants() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let found = vm_processes(VmProcesses::Descendants);
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.contains(&(child.id() as i32)), "{found:?}");
        assert!(!found.contains(&1));
        assert!(!found.contains(&(std::process::id() as i32)));
        assert!(!found.contains(&nix::unistd::getppid().as_raw()), "{found:?}");
    }

    #[tokio::test]
    async fn an_idle_vm_is_stopped_and_a_call_continues_it_first() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let state = || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            stat[stat.rfind(')').unwrap() + 2..][..1].to_owned()
        };
        let busy = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let flag = busy.clone();
        let freezer = Freezer::new(
            Some(Duration::from_millis(100)),
            Box::new(move || vec![pid as i32]),
            Box::new(move || flag.load(std::sync::atomic::Ordering::Relaxed).then_some("x")),
        );
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(freezer.clone().run(shutdown.clone()));
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(!freezer.is_frozen(), "a busy VM stays awake");
        busy.store(false, std::sync::atomic::Ordering::Relaxed);
        let call = freezer.begin_call();
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(!freezer.is_frozen(), "a call in flight keeps it awake");
        drop(call);
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert!(freezer.is_frozen());
        assert_eq!(state(), "T");
        let call = freezer.begin_call();
        assert!(!freezer.is_frozen());
        assert_ne!(state(), "T");
        drop(call);
        shutdown.cancel();
        running.await.unwrap();
        let _ = child.kill();
        let _ = child.wait();
    }
}
