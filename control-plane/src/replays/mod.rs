//! Replays: screen recordings of browser sessions. The agent records; this module starts
//! recordings, and finishes them: on a stop, at their maximum duration, or when their
//! browser ends. Finishing copies the final video from the agent into the blob store
//! (streamed), so it outlives the browser. When the agent is gone (crashed), what it
//! left on this host is salvaged instead. State lives in the store; `resume` picks up
//! recordings after a control-plane restart.

mod salvage;
#[cfg(test)]
mod tests;

pub use salvage::VmMedia;

use std::sync::Arc;
use std::time::Duration;

use browser_agent_proto::v1::RecordingState;
use chrono::{DateTime, TimeZone, Utc};
use tokio::io::AsyncWriteExt;
use tokio::sync::Notify;

use crate::agent::{AgentClient, AgentClients, AgentError};
use crate::blobs::BlobStore;
use crate::error::{ServiceError, ServiceResult, run_to_completion};
use crate::ids;
use crate::in_progress::InProgress;
use crate::runtime::Runtime;
use crate::store::{
    ReplayOutcome, ReplayRecord, ReplayStatus, SessionRecord, SessionStatus, Store, StoreError,
};

pub const DEFAULT_FRAMERATE: u32 = 10;
/// Without a GPU, more than 20 fps at 1080p costs more than a core.
pub const MAX_FRAMERATE: u32 = 20;
pub const DEFAULT_MAX_DURATION_SECONDS: u32 = 3600;
pub const MAX_MAX_DURATION_SECONDS: u32 = 4 * 3600;
/// A copy from the agent that receives nothing for this long has failed.
const COPY_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a salvage waits for a crashed agent's encoder to finish its file.
const SALVAGE_SETTLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a recording's wait for its maximum duration looks whether it is still
/// recording (often in tests, which watch the wait end).
const STILL_RECORDING_CHECK: Duration =
    Duration::from_millis(if cfg!(test) { 100 } else { 30_000 });

pub struct Replays {
    store: Arc<dyn Store>,
    blobs: Arc<dyn BlobStore>,
    runtime: Arc<dyn Runtime>,
    agents: Arc<AgentClients>,
    /// Remuxes recordings salvaged from crashed agents.
    media: VmMedia,
    /// Replays this process is finishing right now, and a signal when one is done.
    finishing: InProgress,
    finished: Notify,
}

/// Something that kept a video from reaching the blob store.
#[derive(Debug, thiserror::Error)]
enum CollectError {
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error("storing the video failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Recorder(String),
}

fn from_unix_ms(ms: i64) -> Option<DateTime<Utc>> {
    Utc.timestamp_millis_opt(ms).single().filter(|_| ms > 0)
}

impl Replays {
    pub fn new(
        store: Arc<dyn Store>, blobs: Arc<dyn BlobStore>, runtime: Arc<dyn Runtime>,
        agents: Arc<AgentClients>, media: VmMedia,
    ) -> Self {
        Self {
            store,
            blobs,
            runtime,
            agents,
            media,
            finishing: InProgress::default(),
            finished: Notify::new(),
        }
    }

    /// Starts recording the session's display; answers once the first frame is captured.
    /// Runs in a task of its own, so a caller that goes away cannot leave a recording
    /// running on the agent without a record.
    pub async fn start(
        self: &Arc<Self>, session: &SessionRecord, agent: AgentClient, framerate: u32,
        max_duration_seconds: u32, record_audio: bool,
    ) -> ServiceResult<ReplayRecord> {
        if session.headless {
            return Err(ServiceError::invalid(format!(
                "browser session {} is headless: it has no display to record",
                session.id
            )));
        }
        let (this, session) = (self.clone(), session.clone());
        run_to_completion(async move {
            this.start_inner(session, agent, framerate, max_duration_seconds, record_audio).await
        })
        .await
    }

    async fn start_inner(
        self: &Arc<Self>, session: SessionRecord, agent: AgentClient, framerate: u32,
        max_duration_seconds: u32, record_audio: bool,
    ) -> ServiceResult<ReplayRecord> {
        let id = ids::new_id("rpl");
        let info =
            match agent.start_recording(&id, framerate, max_duration_seconds, record_audio).await {
                Ok(info) => info,
                Err(error) => {
                    if matches!(error, AgentError::Timeout(_) | AgentError::Unavailable(_)) {
                        // The agent may have started it after all: make sure it does not run on.
                        let agent = agent.clone();
                        let id = id.clone();
                        tokio::spawn(async move {
                            let _ = agent.stop_recording(&id).await;
                            let _ = agent.delete_recording(&id).await;
                        });
                    }
                    return Err(error.into());
                }
            };
        let replay = ReplayRecord {
            id: id.clone(),
            org_id: session.org_id.clone(),
            session_id: session.id.clone(),
            framerate: framerate.into(),
            max_duration_seconds: max_duration_seconds.into(),
            status: ReplayStatus::Recording,
            started_at: from_unix_ms(info.started_at_unix_ms).unwrap_or_else(Utc::now),
            finished_at: None,
            size_bytes: None,
            blob_key: None,
            failure: None,
            record_audio,
        };
        if let Err(error) = self.store.insert_replay(&replay).await {
            // Unrecorded, the recording would never be finished or found: drop it.
            let _ = agent.stop_recording(&id).await;
            let _ = agent.delete_recording(&id).await;
            return Err(error.into());
        }
        // A session that ended meanwhile may have finished its replays before this one
        // was on record: finish it now rather than lose it.
        let ended = !matches!(
            self.store.session(&session.org_id, &session.id).await,
            Ok(Some(current)) if current.status != SessionStatus::Ended
        );
        if ended && self.claim(&replay).await.unwrap_or(false) {
            let _ = self.finish(&session, Some(agent), replay).await;
            return Err(ServiceError::NotFound(format!(
                "browser session {} ended while the recording started",
                session.id
            )));
        }
        self.finish_at_deadline(session, agent, replay.clone());
        Ok(replay)
    }

    /// The agent ends a recording at its maximum duration by itself; this collects it
    /// then (unless something else finished it first). The wait looks at the record now
    /// and then, and ends once a stop, the session's end or another replica has finished
    /// the replay: otherwise every recording would keep a task (and its session's agent
    /// connection) for its whole maximum duration, an hour by default.
    fn finish_at_deadline(
        self: &Arc<Self>, session: SessionRecord, agent: AgentClient, replay: ReplayRecord,
    ) {
        let this = self.clone();
        tokio::spawn(async move {
            let deadline =
                replay.started_at + chrono::Duration::seconds(replay.max_duration_seconds);
            loop {
                let left = (deadline - Utc::now()).to_std().unwrap_or_default();
                if left.is_zero() {
                    break;
                }
                tokio::time::sleep(left.min(STILL_RECORDING_CHECK)).await;
                match this.store.replay(&replay.org_id, &replay.session_id, &replay.id).await {
                    Ok(Some(current)) if current.status == ReplayStatus::Recording => {}
                    Ok(_) => return,
                    // The database is away for now: look again at the next check.
                    Err(_) => {}
                }
            }
            match this.claim(&replay).await {
                Ok(true) => {
                    if let Err(error) = this.finish(&session, Some(agent), replay).await {
                        tracing::warn!(%error, "could not finish a replay at its maximum duration");
                    }
                }
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, "could not finish a replay"),
            }
        });
    }

    /// A caller's stop: finishes the replay and answers it; 409 if it is not recording.
    /// Runs in a task of its own: a caller that goes away mid-finish must not leave the
    /// replay claimed and half-finished.
    pub async fn stop(
        self: &Arc<Self>, session: &SessionRecord, agent: Option<AgentClient>, replay: ReplayRecord,
    ) -> ServiceResult<ReplayRecord> {
        let (this, session) = (self.clone(), session.clone());
        run_to_completion(async move {
            if !this.claim(&replay).await? {
                return Err(ServiceError::Conflict(format!(
                    "replay {} is not recording: it has already been stopped",
                    replay.id
                )));
            }
            this.finish(&session, agent, replay).await
        })
        .await
    }

    /// The session's replays that are recording now.
    pub async fn recording(&self, session: &SessionRecord) -> ServiceResult<Vec<ReplayRecord>> {
        let replays = self.store.list_replays(&session.org_id, &session.id).await?;
        Ok(replays.into_iter().filter(|replay| replay.status == ReplayStatus::Recording).collect())
    }

    /// Runs `change` (a new screen size) with the session's recordings stopped: each is
    /// finished as it was, and once the change is made, or has failed, a new replay
    /// starts with the same frame rate for the rest of its maximum duration, as a
    /// separate segment. Answers the change's outcome.
    pub async fn split_around<T>(
        self: &Arc<Self>, session: &SessionRecord, agent: &AgentClient,
        change: impl Future<Output = ServiceResult<T>>,
    ) -> ServiceResult<T> {
        let mut stopped = Vec::new();
        let mut failure = None;
        for replay in self.recording(session).await? {
            match self.stop(session, Some(agent.clone()), replay.clone()).await {
                Ok(_) => stopped.push(replay),
                // Stopped meanwhile by its owner: nothing to start again.
                Err(ServiceError::Conflict(_)) => {}
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }
        let outcome = match failure {
            Some(error) => Err(error),
            None => change.await,
        };
        for replay in stopped {
            let elapsed = (Utc::now() - replay.started_at).num_seconds();
            let left = (replay.max_duration_seconds - elapsed).clamp(1, i64::from(u32::MAX));
            let restarted = self
                .start(
                    session,
                    agent.clone(),
                    replay.framerate as u32,
                    left as u32,
                    replay.record_audio,
                )
                .await;
            if let Err(error) = restarted {
                tracing::warn!(replay_id = %replay.id, %error, "could not record the next segment after a resize");
            }
        }
        outcome
    }

    /// Claims a replay for finishing; true for exactly one caller. A recording replay
    /// moves to `stopping` in the store; a `stopping` one qualifies only if no task of
    /// this process is finishing it (a previous process was cut off).
    async fn claim(&self, replay: &ReplayRecord) -> Result<bool, StoreError> {
        if !self.finishing.claim(&replay.id) {
            return Ok(false);
        }
        let claimed = match replay.status {
            ReplayStatus::Recording => self.store.begin_replay_stop(&replay.id).await,
            // Read again now that no task here can finish it: `replay` may be older than
            // a finish that has completed meanwhile.
            ReplayStatus::Stopping => {
                self.store.replay(&replay.org_id, &replay.session_id, &replay.id).await.map(
                    |current| {
                        current.is_some_and(|current| current.status == ReplayStatus::Stopping)
                    },
                )
            }
            ReplayStatus::Finished | ReplayStatus::Lost => Ok(false),
        };
        if !matches!(claimed, Ok(true)) {
            self.release(&replay.id);
        }
        claimed
    }

    fn release(&self, id: &str) {
        self.finishing.release(id);
        self.finished.notify_waiters();
    }

    /// Finishes a replay this caller claimed: collects the video from the agent or,
    /// with the agent gone, from what it left behind, and records the outcome.
    async fn finish(
        &self, session: &SessionRecord, agent: Option<AgentClient>, replay: ReplayRecord,
    ) -> ServiceResult<ReplayRecord> {
        let id = replay.id.clone();
        let finished = self.finish_inner(session, agent, replay).await;
        self.release(&id);
        finished
    }

    async fn finish_inner(
        &self, session: &SessionRecord, agent: Option<AgentClient>, replay: ReplayRecord,
    ) -> ServiceResult<ReplayRecord> {
        let collected = match &agent {
            Some(agent) => self.collect(agent, &replay).await,
            None => Err(CollectError::Recorder("the browser's agent is gone".into())),
        };
        let (finished_at, outcome) = match collected {
            Ok(done) => done,
            Err(error) => {
                tracing::warn!(replay_id = %replay.id, %error, "collecting from the agent failed; salvaging");
                self.salvage(session, &replay, &error).await
            }
        };
        if !self.store.finish_replay(&replay.id, finished_at, &outcome).await? {
            // Another replica finished it first; what it stored stands.
            return self
                .store
                .replay(&replay.org_id, &replay.session_id, &replay.id)
                .await?
                .ok_or_else(|| ServiceError::NotFound(format!("replay {} not found", replay.id)));
        }
        if let Some(agent) = &agent {
            // The outcome is on record (the video in the blob store): free the VM's disk.
            let _ = agent.delete_recording(&replay.id).await;
        }
        let (status, size_bytes, blob_key, failure) = outcome.columns();
        Ok(ReplayRecord {
            status,
            finished_at: Some(finished_at),
            size_bytes,
            blob_key: blob_key.map(str::to_owned),
            failure: failure.map(str::to_owned),
            ..replay
        })
    }

    /// Stops the recording on the agent (waiting until its file is final) and streams
    /// the file into the blob store.
    async fn collect(
        &self, agent: &AgentClient, replay: &ReplayRecord,
    ) -> Result<(DateTime<Utc>, ReplayOutcome), CollectError> {
        let info = agent.stop_recording(&replay.id).await?;
        let finished_at = from_unix_ms(info.finished_at_unix_ms).unwrap_or_else(Utc::now);
        match info.state() {
            RecordingState::Finished => {}
            RecordingState::Failed => {
                return Ok((finished_at, ReplayOutcome::Lost(info.error)));
            }
            other => {
                return Err(CollectError::Recorder(format!(
                    "the recording is {other:?} after its stop"
                )));
            }
        }
        let mut video = agent.read_recording(&replay.id).await?;
        let temporary = self.blobs.incoming()?;
        let mut out = tokio::fs::File::from_std(temporary.reopen()?);
        let mut size = 0u64;
        loop {
            let chunk = tokio::time::timeout(COPY_IDLE_TIMEOUT, video.message())
                .await
                .map_err(|_| CollectError::Recorder("the agent stopped sending the video".into()))?
                .map_err(AgentError::from)?;
            let Some(chunk) = chunk else { break };
            size += chunk.data.len() as u64;
            out.write_all(&chunk.data).await?;
        }
        out.flush().await?;
        if size != info.size_bytes {
            return Err(CollectError::Recorder(format!(
                "copied {size} of the video's {} bytes",
                info.size_bytes
            )));
        }
        let blob_key = blob_key(replay);
        self.blobs.put(&blob_key, temporary).await?;
        Ok((finished_at, ReplayOutcome::Video { size_bytes: size as i64, blob_key }))
    }

    /// Keeps what a crashed agent left on this host: remuxed into a regular MP4 (which
    /// also drops a fragment cut off mid-write), or lost if it is not a recording. It
    /// finished when its encoder last wrote to the file (the
    /// encoder completes the file as soon as the agent dies), not when this runs.
    async fn salvage(
        &self, session: &SessionRecord, replay: &ReplayRecord, why: &CollectError,
    ) -> (DateTime<Utc>, ReplayOutcome) {
        let Some(leftover) = self.runtime.leftover_recording(&session.id, &replay.id) else {
            return (Utc::now(), ReplayOutcome::Lost(format!("the recording was lost: {why}")));
        };
        wait_until_settled(&leftover).await;
        let last_written = leftover
            .metadata()
            .and_then(|metadata| metadata.modified())
            .map(DateTime::<Utc>::from)
            .unwrap_or_else(|_| Utc::now())
            .min(Utc::now())
            .max(replay.started_at);
        let outcome = match self.store_salvaged(replay, leftover).await {
            Ok(outcome) => outcome,
            Err(error) => ReplayOutcome::Lost(format!(
                "the recording was cut short ({why}) and could not be kept: {error}"
            )),
        };
        (last_written, outcome)
    }

    async fn store_salvaged(
        &self, replay: &ReplayRecord, leftover: std::fs::File,
    ) -> std::io::Result<ReplayOutcome> {
        // The VM wrote the file: it is remuxed and checked in a sandbox (`salvage`), and
        // kept only if it is a recording.
        let temporary = self.blobs.incoming()?;
        let mut output = tokio::fs::File::from_std(temporary.reopen()?);
        if let Err(why) = self.media.salvage(leftover, &mut output).await {
            tracing::warn!(replay_id = %replay.id, %why, "a salvaged recording is unusable");
            return Ok(ReplayOutcome::Lost(format!(
                "the recording was cut short and what was left is not a usable video: {why}"
            )));
        }
        self.keep_salvaged(replay, temporary).await
    }

    async fn keep_salvaged(
        &self, replay: &ReplayRecord, video: tempfile::NamedTempFile,
    ) -> std::io::Result<ReplayOutcome> {
        let size_bytes = video.as_file().metadata()?.len() as i64;
        let blob_key = blob_key(replay);
        self.blobs.put(&blob_key, video).await?;
        Ok(ReplayOutcome::Video { size_bytes, blob_key })
    }

    /// Finishes every unfinished replay of a session that is ending; called before its
    /// browser is destroyed. Waits for finishes already under way.
    /// Whether the session has a recording not finished yet (when the store cannot
    /// tell: yes, the careful answer).
    pub async fn has_unfinished(&self, session: &SessionRecord) -> bool {
        match self.store.list_replays(&session.org_id, &session.id).await {
            Ok(replays) => replays.iter().any(|replay| {
                !matches!(replay.status, ReplayStatus::Finished | ReplayStatus::Lost)
            }),
            Err(_) => true,
        }
    }

    pub async fn finish_all(&self, session: &SessionRecord, agent: Option<AgentClient>) {
        let replays = match self.store.list_replays(&session.org_id, &session.id).await {
            Ok(replays) => replays,
            Err(error) => {
                tracing::warn!(session_id = %session.id, %error, "could not list the session's replays");
                return;
            }
        };
        let mut finishing = Vec::new();
        let mut under_way = Vec::new();
        for replay in replays {
            if matches!(replay.status, ReplayStatus::Finished | ReplayStatus::Lost) {
                continue;
            }
            let claimed = self.claim(&replay).await.unwrap_or_else(|error| {
                tracing::warn!(replay_id = %replay.id, %error, "could not claim a replay to finish");
                false
            });
            if claimed {
                finishing.push(self.finish(session, agent.clone(), replay));
            } else {
                under_way.push(replay.id);
            }
        }
        for outcome in futures::future::join_all(finishing).await {
            if let Err(error) = outcome {
                tracing::warn!(session_id = %session.id, %error, "could not finish a replay");
            }
        }
        for id in under_way {
            self.wait_until_finished(&id).await;
        }
    }

    fn is_finishing(&self, id: &str) -> bool {
        self.finishing.contains(id)
    }

    async fn wait_until_finished(&self, id: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(330);
        loop {
            let notified = self.finished.notified();
            if !self.is_finishing(id) || tokio::time::Instant::now() > deadline {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
        }
    }

    /// After a restart (and after sessions were adopted): finishes the recordings of
    /// browsers that ended; those of live browsers are their owner's (`resume_for`).
    pub async fn resume(self: &Arc<Self>) -> anyhow::Result<()> {
        for replay in self.store.unfinished_replays().await? {
            let Some(session) = self.store.session(&replay.org_id, &replay.session_id).await?
            else {
                continue;
            };
            // A running session's recordings are its owner's: this replica's only if it
            // adopted the session (`resume_for`).
            if session.status != SessionStatus::Running {
                self.resume_one(session, replay).await?;
            }
        }
        Ok(())
    }

    /// Picks up the recordings of a running session adopted from a replica that is gone:
    /// their deadlines, and finishing those it had begun to stop.
    pub fn resume_for(self: &Arc<Self>, session: &SessionRecord) {
        let (this, session) = (self.clone(), session.clone());
        tokio::spawn(async move {
            let replays = match this.store.unfinished_replays().await {
                Ok(replays) => replays,
                Err(error) => {
                    tracing::warn!(session_id = %session.id, %error, "could not resume an adopted session's recordings");
                    return;
                }
            };
            for replay in replays.into_iter().filter(|r| r.session_id == session.id) {
                if let Err(error) = this.resume_one(session.clone(), replay).await {
                    tracing::warn!(session_id = %session.id, %error, "could not resume a recording");
                }
            }
        });
    }

    async fn resume_one(
        self: &Arc<Self>, session: SessionRecord, replay: ReplayRecord,
    ) -> Result<(), StoreError> {
        let agent = match session.status {
            SessionStatus::Running => self.agents.get(&session.id, session.agent.as_ref()).ok(),
            _ => None,
        };
        match (replay.status, agent) {
            (ReplayStatus::Recording, Some(agent)) => {
                self.finish_at_deadline(session, agent, replay);
            }
            (_, agent) => {
                if !self.claim(&replay).await? {
                    return Ok(());
                }
                let this = self.clone();
                tokio::spawn(async move {
                    if let Err(error) = this.finish(&session, agent, replay).await {
                        tracing::warn!(%error, "could not finish a replay after a restart");
                    }
                });
            }
        }
        Ok(())
    }
}

/// Waits (bounded) until a file has stopped growing: an agent killed mid-recording
/// leaves its encoder to read EOF, flush its last frames and close the file.
async fn wait_until_settled(file: &std::fs::File) {
    let size = || file.metadata().map(|m| m.len()).unwrap_or(0);
    let deadline = tokio::time::Instant::now() + SALVAGE_SETTLE_TIMEOUT;
    let mut last = size();
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = size();
        if now == last {
            return;
        }
        last = now;
    }
}

fn blob_key(replay: &ReplayRecord) -> String {
    format!("replays/{}/{}.mp4", replay.org_id, replay.id)
}
