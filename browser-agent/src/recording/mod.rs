//! Screen recordings. Each recording is a thread that looks at the screen on a fixed
//! schedule, keeps a picture of it up to date from what the X server says was drawn
//! (`grabber`, `canvas`), and hands that picture, raw and timestamped with its slot, to a
//! writer thread feeding an ffmpeg child that encodes H.264 into fragmented MP4
//! (`encoder`) whenever it changed: whatever was recorded up to
//! a crash stays playable (if the agent dies, ffmpeg reads EOF and closes the file
//! properly). When the recording ends (stop, its maximum duration, or a failure) the file
//! is remuxed into a regular MP4 with its index at the front.
//!
//! Files live in the agent's recordings directory, outside the VM root:
//! `<id>.recording.mp4` while recording, `<id>.mp4` once finished.

mod canvas;
mod encoder;
pub(crate) mod grabber;
pub mod sound;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use browser_agent_proto::recording_files;
use tokio::sync::{oneshot, watch};

use canvas::Canvas;
pub use grabber::Grabber;

/// Recordings of one display capturing at the same time.
pub const MAX_CONCURRENT: usize = 4;
/// Frame rates the agent accepts (the control plane's public bound is lower).
const FRAMERATES: std::ops::RangeInclusive<u32> = 1..=60;
/// Longest recording the agent accepts (the control plane's public bound is lower).
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);
/// How long a stop waits for ffmpeg to flush and the file to be remuxed.
const FINALIZE_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("{0}")]
    Invalid(String),
    #[error("this browser is headless: it has no display to record")]
    Headless,
    #[error("this browser has no sound server, so its sound cannot be recorded")]
    NoSound,
    #[error("recording {0} not found")]
    NotFound(String),
    #[error("recording {0} already exists")]
    Exists(String),
    #[error("{MAX_CONCURRENT} recordings of this browser are already running")]
    TooMany,
    #[error("recording {0} is still running")]
    StillRunning(String),
    #[error("recording failed: {0}")]
    Failed(String),
}

/// Where a recording is in its life.
#[derive(Clone, Debug)]
pub enum Progress {
    Recording,
    /// Capture ended; ffmpeg is flushing and the file is being remuxed.
    Finalizing,
    Finished {
        at: SystemTime,
        bytes: u64,
        frames: u64,
    },
    Failed {
        at: SystemTime,
        message: String,
    },
}

impl Progress {
    fn is_over(&self) -> bool {
        matches!(self, Self::Finished { .. } | Self::Failed { .. })
    }
}

/// A recording as seen from outside.
#[derive(Clone, Debug)]
pub struct RecordingInfo {
    pub id: String,
    pub started_at: SystemTime,
    pub progress: Progress,
}

struct Recording {
    /// Dropping the sender, or sending the instant the stop was asked for, ends the
    /// capture: the video ends at that instant however late the recorder sees it.
    stop: Mutex<Option<mpsc::Sender<Instant>>>,
    progress: watch::Receiver<Progress>,
    started_at: OnceLock<SystemTime>,
}

impl Recording {
    fn info(&self, id: &str) -> RecordingInfo {
        RecordingInfo {
            id: id.to_owned(),
            started_at: self.started_at.get().copied().unwrap_or(SystemTime::UNIX_EPOCH),
            progress: self.progress.borrow().clone(),
        }
    }
}

pub struct Recordings {
    /// `None` for headless browsers.
    display: Option<String>,
    /// A recording keeps the size the screen had when it started; the screen changes
    /// size only while none is capturing (`while_none_capture`).
    screen: Arc<crate::screen::Screen>,
    dir: PathBuf,
    ffmpeg: String,
    /// Whether the VM has a sound server to record from.
    sound: bool,
    recordings: Mutex<HashMap<String, Arc<Recording>>>,
}

/// What one recording thread needs.
struct Job {
    id: String,
    display: String,
    width: u32,
    height: u32,
    framerate: u32,
    max_frames: u64,
    dir: PathBuf,
    ffmpeg: String,
    /// Also the VM's sound, from its sound server's monitor.
    record_audio: bool,
    stop: mpsc::Receiver<Instant>,
}

impl Recordings {
    pub fn new(
        display: Option<String>, screen: Arc<crate::screen::Screen>, dir: PathBuf, ffmpeg: String,
        sound: bool,
    ) -> Self {
        Self { display, screen, dir, ffmpeg, sound, recordings: Mutex::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Recording>>> {
        // A panic while holding this lock cannot leave the map inconsistent.
        self.recordings.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn get(&self, id: &str) -> Result<Arc<Recording>, RecordingError> {
        self.lock().get(id).cloned().ok_or_else(|| RecordingError::NotFound(id.to_owned()))
    }

    /// Starts recording; answers once the first frame is in the encoder.
    pub async fn start(
        &self, id: &str, framerate: u32, max_duration: Duration, record_audio: bool,
    ) -> Result<RecordingInfo, RecordingError> {
        valid_id(id)?;
        if !FRAMERATES.contains(&framerate) {
            return Err(RecordingError::Invalid(format!(
                "framerate must be between {} and {}",
                FRAMERATES.start(),
                FRAMERATES.end()
            )));
        }
        if max_duration.is_zero() || max_duration > MAX_DURATION {
            return Err(RecordingError::Invalid(format!(
                "the maximum duration must be between 1 s and {} s",
                MAX_DURATION.as_secs()
            )));
        }
        let display = self.display.clone().ok_or(RecordingError::Headless)?;
        if record_audio && !self.sound {
            return Err(RecordingError::NoSound);
        }
        std::fs::create_dir_all(&self.dir)
            .map_err(|error| RecordingError::Failed(format!("recordings directory: {error}")))?;

        let (stop_tx, stop_rx) = mpsc::channel();
        let (progress_tx, progress_rx) = watch::channel(Progress::Recording);
        let recording = Arc::new(Recording {
            stop: Mutex::new(Some(stop_tx)),
            progress: progress_rx,
            started_at: OnceLock::new(),
        });
        let (width, height) = {
            let mut recordings = self.lock();
            if recordings.contains_key(id) {
                return Err(RecordingError::Exists(id.to_owned()));
            }
            let running = recordings
                .values()
                .filter(|r| matches!(*r.progress.borrow(), Progress::Recording))
                .count();
            if running >= MAX_CONCURRENT {
                return Err(RecordingError::TooMany);
            }
            recordings.insert(id.to_owned(), recording.clone());
            // Read under the lock that resizes take: the size holds while it captures.
            self.screen.size()
        };

        let job = Job {
            id: id.to_owned(),
            display,
            width,
            height,
            framerate,
            max_frames: (max_duration.as_secs_f64() * f64::from(framerate)).ceil() as u64,
            dir: self.dir.clone(),
            ffmpeg: self.ffmpeg.clone(),
            record_audio,
            stop: stop_rx,
        };
        let (started_tx, started_rx) = oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name(format!("recorder-{id}"))
            .spawn(move || run(job, started_tx, progress_tx));
        let started = match spawned {
            Ok(_) => started_rx.await.unwrap_or_else(|_| Err("the recorder stopped".into())),
            Err(error) => Err(format!("starting the recorder thread: {error}")),
        };
        match started {
            Ok(at) => {
                let _ = recording.started_at.set(at);
                Ok(recording.info(id))
            }
            Err(message) => {
                self.lock().remove(id);
                Err(RecordingError::Failed(message))
            }
        }
    }

    /// Whether a recording captures or is being finalized.
    pub fn any_running(&self) -> bool {
        self.lock().values().any(|r| !r.progress.borrow().is_over())
    }

    /// Runs `change` (a resize of the screen) while no recording captures, so that none
    /// sees the screen change size under it; a capturing one is `StillRunning`.
    pub fn while_none_capture<T>(&self, change: impl FnOnce() -> T) -> Result<T, RecordingError> {
        let recordings = self.lock();
        let capturing =
            recordings.iter().find(|(_, r)| matches!(*r.progress.borrow(), Progress::Recording));
        if let Some((id, _)) = capturing {
            return Err(RecordingError::StillRunning(id.clone()));
        }
        Ok(change())
    }

    /// Ends the capture (if still running) and waits until the file is final.
    /// Stopping a finished recording answers its final state.
    pub async fn stop(&self, id: &str) -> Result<RecordingInfo, RecordingError> {
        let recording = self.get(id)?;
        if let Some(stop) =
            recording.stop.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()
        {
            let _ = stop.send(Instant::now());
        }
        let mut progress = recording.progress.clone();
        match tokio::time::timeout(FINALIZE_TIMEOUT, progress.wait_for(Progress::is_over)).await {
            Ok(Ok(_)) => Ok(recording.info(id)),
            Ok(Err(_)) => Err(RecordingError::Failed("the recorder vanished".into())),
            Err(_) => Err(RecordingError::Failed("finalizing the recording timed out".into())),
        }
    }

    pub fn info(&self, id: &str) -> Result<RecordingInfo, RecordingError> {
        Ok(self.get(id)?.info(id))
    }

    /// The recording's file as it is now: the final MP4, or while recording the
    /// fragmented MP4 written so far.
    pub fn open(&self, id: &str) -> Result<std::fs::File, RecordingError> {
        let recording = self.get(id)?;
        let (final_path, recording_path) =
            (final_path(&self.dir, id), recording_path(&self.dir, id));
        let open = |path: &Path| std::fs::File::open(path);
        let file = match *recording.progress.borrow() {
            Progress::Finished { .. } => open(&final_path),
            // Finalizing renames the fragmented file away at its end.
            _ => open(&recording_path).or_else(|_| open(&final_path)),
        };
        file.map_err(|error| RecordingError::Failed(format!("opening the recording: {error}")))
    }

    /// Forgets a finished recording and removes its file (after the control plane has
    /// copied it).
    pub fn delete(&self, id: &str) -> Result<(), RecordingError> {
        let mut recordings = self.lock();
        let recording =
            recordings.get(id).ok_or_else(|| RecordingError::NotFound(id.to_owned()))?;
        if !recording.progress.borrow().is_over() {
            return Err(RecordingError::StillRunning(id.to_owned()));
        }
        recordings.remove(id);
        for path in [
            final_path(&self.dir, id),
            recording_path(&self.dir, id),
            remuxing_path(&self.dir, id),
            encoder_log_path(&self.dir, id),
        ] {
            let _ = std::fs::remove_file(path);
        }
        Ok(())
    }
}

/// Recording ids become file names: letters, digits, `_` and `-` only.
fn valid_id(id: &str) -> Result<(), RecordingError> {
    if id.is_empty()
        || id.len() > 128
        || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(RecordingError::Invalid(format!("invalid recording id {id:?}")));
    }
    Ok(())
}

fn recording_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(recording_files::in_progress(id))
}

fn final_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(recording_files::finished(id))
}

fn remuxing_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.finalizing.mp4"))
}

fn encoder_log_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.ffmpeg.log"))
}

/// The recording thread: capture, then finalize, reporting progress throughout. Even a
/// panic ends in a final state, so the recording does not hold a slot forever.
fn run(
    job: Job, started: oneshot::Sender<Result<SystemTime, String>>,
    progress: watch::Sender<Progress>,
) {
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        record_and_finalize(&job, started, &progress)
    }));
    if ran.is_err() {
        let _ = progress.send(Progress::Failed {
            at: SystemTime::now(),
            message: "the recorder failed unexpectedly".into(),
        });
    }
}

fn record_and_finalize(
    job: &Job, started: oneshot::Sender<Result<SystemTime, String>>,
    progress: &watch::Sender<Progress>,
) {
    let mut started = Some(started);
    let captured = capture(job, &mut started);
    if let Some(started) = started.take() {
        // Not even one frame: the start call reports the failure.
        let message = match captured {
            Err((_, message)) => message,
            Ok(_) => "no frame was captured".into(),
        };
        let _ = std::fs::remove_file(recording_path(&job.dir, &job.id));
        let _ = progress.send(Progress::Failed { at: SystemTime::now(), message: message.clone() });
        let _ = started.send(Err(message));
        return;
    }
    let frames = match captured {
        Ok(frames) => frames,
        Err((frames, message)) => {
            tracing::warn!(id = %job.id, %message, "recording ended early; keeping what was captured");
            frames
        }
    };
    let _ = progress.send(Progress::Finalizing);
    let outcome = match finalize(job) {
        Ok(bytes) => Progress::Finished { at: SystemTime::now(), bytes, frames },
        Err(message) => Progress::Failed { at: SystemTime::now(), message },
    };
    tracing::info!(id = %job.id, ?outcome, "recording over");
    let _ = progress.send(outcome);
}

/// Looks at the screen on the job's schedule and hands a frame to the encoder for each
/// slot in which the screen changed, until stopped, the maximum duration, or a failure.
/// Each frame carries its slot on the schedule, and the video shows it until the next
/// frame's slot: an unchanged screen costs no frame at all (but one a second, so the
/// file in progress keeps up with the time), a late frame covers the slots that passed,
/// and while the encoder is behind (every buffer still queued for it) slots are skipped
/// rather than queued, so the recorder never floods a slow encoder and always sees a
/// stop at once. What is drawn meanwhile waits in the X server's damage. The video ends
/// at the stop instant (or the maximum duration): it covers the slots begun by then.
/// Returns the video's slots, or with an error the slots handed to the encoder before it.
fn capture(
    job: &Job, started: &mut Option<oneshot::Sender<Result<SystemTime, String>>>,
) -> Result<u64, (u64, String)> {
    let mut grabber =
        Grabber::connect(&job.display, job.width, job.height).map_err(|error| (0, error))?;
    let log = std::fs::File::create(encoder_log_path(&job.dir, &job.id))
        .map_err(|error| (0, format!("creating the encoder log: {error}")))?;
    // The sound capture's messages go to the same log.
    let sound_log = log.try_clone();
    let mut canvas = Canvas::new(grabber.size().0, grabber.size().1);
    let format = encoder::Format {
        width: canvas.width().into(),
        height: canvas.height().into(),
        framerate: job.framerate,
        sound: job.record_audio,
    };
    let args = encoder::encoder_args(&format, &recording_path(&job.dir, &job.id));
    let mut ffmpeg = encoder::spawn(&job.ffmpeg, &args, log).map_err(|error| (0, error))?;
    let stdin = ffmpeg.0.stdin.take().ok_or_else(|| (0, "the encoder has no stdin".to_owned()))?;
    let mut writer =
        encoder::FrameWriter::spawn(stdin, &format, &job.id).map_err(|error| (0, error))?;
    // Slot 0's instant: the schedule's start, and the sound's clock's.
    let start = Instant::now();
    let sound = match writer.sound_sender().filter(|_| job.record_audio) {
        Some(sink) => {
            let log =
                sound_log.map_err(|error| (0, format!("opening the encoder log: {error}")))?;
            Some(
                sound::SoundCapture::start(&job.ffmpeg, start, sink, log)
                    .map_err(|error| (0, error))?,
            )
        }
        None => None,
    };

    let schedule = Schedule { start, period: Duration::from_secs(1) / job.framerate };
    // An unchanged screen still gets a frame in every second of the video (slots per
    // second), so the file in progress keeps up with the time.
    let second = u64::from(job.framerate);
    // The last slot handed to the encoder.
    let mut last: Option<u64> = None;
    // Slots in which the screen was not looked at because the encoder was behind: what
    // changed then shows in the next frame, at its own time (never time-shifted).
    let mut skipped: u64 = 0;
    // The slots the video covers; `Err(None)` when the writer ended (it says why).
    let ended: Result<u64, Option<String>> = loop {
        let slot = schedule.slot_at(Instant::now());
        if slot >= job.max_frames {
            break Ok(job.max_frames);
        }
        match writer.has_free_buffer() {
            // Read only with a buffer free, so a change is handed over in its slot.
            Ok(true) => {
                let changed = match grabber.update(&mut canvas) {
                    Ok(changed) => changed,
                    Err(error) => break Err(Some(error)),
                };
                if changed || last.is_none_or(|last| slot / second > last / second) {
                    if writer.send_copy(slot, canvas.image()).is_err() {
                        break Err(None);
                    }
                    last = Some(slot);
                }
            }
            // The encoder is behind: the previous frame covers this slot too.
            Ok(false) => skipped += 1,
            Err(encoder::WriterGone) => break Err(None),
        }
        if started.is_some() {
            // The start is answered once the first frame is in the encoder: that proves
            // the encoder runs. Until then a failure is the start's.
            if writer.wait_written().is_err() {
                break Err(None);
            }
            if let Some(started) = started.take() {
                let _ = started.send(Ok(SystemTime::now() - schedule.start.elapsed()));
            }
        }
        if slot + 1 >= job.max_frames {
            break Ok(job.max_frames);
        }
        let next = schedule.slot_start(slot + 1);
        match job.stop.recv_timeout(next.saturating_duration_since(Instant::now())) {
            Err(RecvTimeoutError::Timeout) => continue,
            Ok(asked) => break Ok(schedule.slot_at(asked) + 1),
            Err(RecvTimeoutError::Disconnected) => {
                break Ok(schedule.slot_at(Instant::now()) + 1);
            }
        }
    };
    // The video's last slot needs a frame of its own if it was skipped, or the video
    // would end at the last frame handed over. Grabbed now: the display at the end.
    let ended = ended.and_then(|slots| {
        let slots = slots.min(job.max_frames).max(last.map_or(0, |slot| slot + 1));
        let final_slot = slots.saturating_sub(1);
        if last.is_some_and(|slot| slot < final_slot) {
            grabber.update(&mut canvas).map_err(Some)?;
            writer.send_copy(final_slot, canvas.image()).map_err(|_| None)?;
            last = Some(final_slot);
        }
        Ok(slots)
    });
    let handed = last.map_or(0, |slot| slot + 1);
    if skipped > 0 {
        tracing::info!(id = %job.id, skipped, "slots skipped while the encoder was behind");
    }
    // The sound up to the video's end goes in before the stream ends.
    let sound_ended = match sound {
        Some(sound) => {
            let slots = *ended.as_ref().unwrap_or(&handed);
            sound.finish(slots * 1_000_000 / u64::from(job.framerate))
        }
        None => Ok(()),
    };
    // The writer writes what is queued and closes stdin: EOF makes ffmpeg flush its last
    // frames and close the file.
    let written = writer.finish().and(sound_ended);
    let encoded = match ffmpeg.0.wait() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("the encoder failed ({status}); see its log")),
        Err(error) => Err(format!("waiting for the encoder: {error}")),
    };
    let captured = match ended {
        Ok(slots) => written.map(|()| slots),
        Err(Some(error)) => Err(error),
        Err(None) => written.and(Err("the encoder's writer ended early".to_owned())),
    };
    captured.and_then(|slots| encoded.map(|()| slots)).map_err(|error| (handed, error))
}

/// The recording's fixed schedule: slot `n` begins `n` periods after the start.
struct Schedule {
    start: Instant,
    period: Duration,
}

impl Schedule {
    /// The slot under way at `at`.
    fn slot_at(&self, at: Instant) -> u64 {
        (at.saturating_duration_since(self.start).as_nanos() / self.period.as_nanos()) as u64
    }

    fn slot_start(&self, slot: u64) -> Instant {
        self.start + Duration::from_nanos((self.period.as_nanos() * u128::from(slot)) as u64)
    }
}

/// Remuxes the fragmented recording into a regular MP4 with the index at the front
/// (`+faststart`). If the remux fails, the fragmented file, itself a playable MP4,
/// becomes the result. Returns the final size.
fn finalize(job: &Job) -> Result<u64, String> {
    let (recorded, finished) = (recording_path(&job.dir, &job.id), final_path(&job.dir, &job.id));
    let remuxing = remuxing_path(&job.dir, &job.id);
    let mut command = Command::new(&job.ffmpeg);
    crate::identity::as_agent(&mut command);
    let remuxed = command
        .args(["-hide_banner", "-loglevel", "error", "-y", "-i"])
        .arg(&recorded)
        .args(["-c", "copy", "-movflags", "+faststart", "-f", "mp4"])
        .arg(&remuxing)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    let source = match remuxed {
        Ok(output) if output.status.success() => remuxing,
        outcome => {
            let reason = match outcome {
                Ok(output) => String::from_utf8_lossy(&output.stderr).trim().to_owned(),
                Err(error) => error.to_string(),
            };
            tracing::warn!(id = %job.id, %reason, "remux failed; keeping the fragmented MP4");
            let _ = std::fs::remove_file(&remuxing);
            recorded.clone()
        }
    };
    // Renamed before the fragmented file goes, so a usable file exists at every moment.
    let size = std::fs::rename(&source, &finished)
        .and_then(|()| std::fs::metadata(&finished))
        .map(|metadata| metadata.len())
        .map_err(|error| format!("nothing playable was recorded: {error}"))?;
    let _ = std::fs::remove_file(&recorded);
    Ok(size)
}
