//! The process RPCs: requests turned into `crate::processes` calls and back.

use std::pin::Pin;
use std::time::UNIX_EPOCH;

use browser_agent_proto::v1::{
    ExecResult, OutputChunk, ProcessRequest, ProcessState, SignalRequest, SpawnRequest,
    SpawnResult, StdinRequest, StdinResult, output_chunk,
};
use futures::Stream;
use nix::sys::signal::Signal;
use tokio::sync::broadcast::error::RecvError;
use tonic::Status;

use super::AgentService;
use crate::processes::{OutputEvent, ProcessSpec, SpawnOptions};

pub type OutputStream = Pin<Box<dyn Stream<Item = Result<OutputChunk, Status>> + Send>>;

fn spec_of(request: ProcessRequest) -> ProcessSpec {
    ProcessSpec {
        command: request.command,
        args: request.args,
        cwd: request.cwd,
        env: request.env.into_iter().collect(),
        as_root: request.as_root,
        timeout_sec: request.timeout_sec,
    }
}

/// A terminal's columns or rows.
pub fn terminal_side(side: u32) -> Result<u16, Status> {
    u16::try_from(side).ok().filter(|side| (1..=1000).contains(side)).ok_or_else(|| {
        Status::invalid_argument(format!("cols and rows must be between 1 and 1000, got {side}"))
    })
}

fn chunk(event: OutputEvent) -> OutputChunk {
    let kind = match event {
        OutputEvent::Chunk { stderr: false, data } => output_chunk::Kind::Stdout(data.to_vec()),
        OutputEvent::Chunk { stderr: true, data } => output_chunk::Kind::Stderr(data.to_vec()),
        OutputEvent::Exit(code) => output_chunk::Kind::ExitCode(code),
    };
    OutputChunk { kind: Some(kind) }
}

impl AgentService {
    pub(super) async fn exec_in_vm(&self, request: ProcessRequest) -> Result<ExecResult, Status> {
        let result = self.processes.exec(spec_of(request)).await?;
        Ok(ExecResult {
            exit_code: result.exit_code,
            stdout: result.stdout,
            stderr: result.stderr,
            duration_ms: result.duration.as_millis() as u64,
            timed_out: result.timed_out,
        })
    }

    pub(super) async fn spawn_in_vm(&self, request: SpawnRequest) -> Result<SpawnResult, Status> {
        let process =
            request.process.ok_or_else(|| Status::invalid_argument("process is required"))?;
        let options = SpawnOptions {
            allocate_tty: request.allocate_tty,
            cols: if request.allocate_tty { terminal_side(request.cols.max(1))? } else { 80 },
            rows: if request.allocate_tty { terminal_side(request.rows.max(1))? } else { 24 },
        };
        let spawned = self.processes.spawn(spec_of(process), options).await?;
        Ok(SpawnResult {
            process_id: spawned.id.clone(),
            pid: spawned.pid,
            started_at_unix_ms: spawned
                .started_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_millis() as i64),
        })
    }

    pub(super) fn process_state(&self, id: &str) -> Result<ProcessState, Status> {
        let status = self.processes.spawned(id)?.status();
        Ok(ProcessState {
            exited: status.exit_code.is_some(),
            exit_code: status.exit_code.unwrap_or_default(),
            cpu_pct: status.cpu_pct,
            mem_bytes: status.mem_bytes,
        })
    }

    pub(super) async fn stdin_of(&self, request: StdinRequest) -> Result<StdinResult, Status> {
        let process = self.processes.spawned(&request.process_id)?;
        let written = process.write_stdin(&request.data).await?;
        Ok(StdinResult { written: written as u64 })
    }

    /// The kept output, then live output, then the exit code. A reader too slow for the
    /// live output skips what it missed.
    pub(super) fn output_of(&self, id: &str) -> Result<OutputStream, Status> {
        let (kept, mut live, mut exit) = self.processes.spawned(id)?.follow();
        let shutdown = self.shutdown.clone();
        let stream = async_stream_of(move |sender| async move {
            for event in kept {
                if sender.send(Ok(chunk(event))).await.is_err() {
                    return;
                }
            }
            loop {
                let event = tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return,
                    event = live.recv() => event,
                    // Ended (perhaps before this stream subscribed): all it wrote is in
                    // the receiver by now, the exit last, or was sent before.
                    _ = exit.wait_for(Option::is_some) => Err(RecvError::Closed),
                };
                match event {
                    Ok(event) => {
                        let last = matches!(event, OutputEvent::Exit(_));
                        if sender.send(Ok(chunk(event))).await.is_err() || last {
                            return;
                        }
                    }
                    Err(RecvError::Lagged(_)) => continue,
                    Err(RecvError::Closed) => {
                        while let Ok(event) = live.try_recv() {
                            if matches!(event, OutputEvent::Exit(_)) {
                                break;
                            }
                            let _ = sender.send(Ok(chunk(event))).await;
                        }
                        let code = (*exit.borrow()).unwrap_or(-1);
                        let _ = sender.send(Ok(chunk(OutputEvent::Exit(code)))).await;
                        return;
                    }
                }
            }
        });
        Ok(stream)
    }

    pub(super) fn signal_in_vm(&self, request: SignalRequest) -> Result<(), Status> {
        let signal = match request.signal.as_str() {
            "TERM" => Signal::SIGTERM,
            "KILL" => Signal::SIGKILL,
            "INT" => Signal::SIGINT,
            "HUP" => Signal::SIGHUP,
            other => {
                return Err(Status::invalid_argument(format!(
                    "signal must be TERM, KILL, INT or HUP, got {other:?}"
                )));
            }
        };
        self.processes.spawned(&request.process_id)?.signal(signal)?;
        Ok(())
    }
}

/// A stream fed by a task through a small channel.
fn async_stream_of<F, Fut>(produce: F) -> OutputStream
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<OutputChunk, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (sender, receiver) = tokio::sync::mpsc::channel(16);
    tokio::spawn(produce(sender));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(receiver))
}
