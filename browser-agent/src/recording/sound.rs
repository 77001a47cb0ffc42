//! A recording's sound, on the recording's own clock.
//!
//! An ffmpeg reads the VM's sound server's monitor as raw PCM and a thread of the
//! recorder reads that in 10 ms pieces. Each piece's time in the video comes from its
//! position in the sound (samples since the first one) plus one offset: when sample 0
//! was played, on the recording's clock. The offset is the smallest "read at, minus
//! samples so far" seen: a read that comes late (a busy CPU, a starved capture process)
//! only makes that difference larger, so one prompt read sets it, and a late one shifts
//! nothing. Pieces are held back `HOLD` before they go into the stream, so that the
//! offset has settled by then even if the first reads were all late.

use std::collections::VecDeque;
use std::io::Read;
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::encoder::{CHANNELS, RATE, SoundSender};

/// Bytes per sample frame: 16-bit samples of each channel.
const FRAME_BYTES: usize = 2 * CHANNELS as usize;
/// 10 ms of sound: what PulseAudio hands over at once with this fragment size.
const PIECE_BYTES: usize = (RATE as usize / 100) * FRAME_BYTES;
/// How long pieces wait before their timestamps are final.
const HOLD: Duration = Duration::from_millis(500);

/// The sound being captured for one recording.
pub struct SoundCapture {
    capture: Child,
    thread: Option<JoinHandle<Result<(), String>>>,
    /// Where the video ends (microseconds), once known: sound after it is dropped.
    end: Arc<AtomicU64>,
}

impl SoundCapture {
    /// Starts capturing; `start` is slot 0's instant. The capture process is the
    /// agent's (it reads the VM's sound server, like the live view's sound).
    pub fn start(
        ffmpeg: &str, start: Instant, sink: SoundSender, log: std::fs::File,
    ) -> Result<Self, String> {
        let mut capture = crate::sound::capture_pcm(ffmpeg, RATE, CHANNELS.into(), log.into())
            .map_err(|error| format!("starting the sound capture: {error}"))?;
        let Some(stdout) = capture.stdout.take() else {
            let _ = capture.kill();
            let _ = capture.wait();
            return Err("the sound capture has no stdout".to_owned());
        };
        let end = Arc::new(AtomicU64::new(u64::MAX));
        let thread = {
            let end = end.clone();
            std::thread::Builder::new()
                .name("recording-sound".into())
                .spawn(move || stamp(stdout, start, &sink, &end))
        };
        match thread {
            Ok(thread) => Ok(Self { capture, thread: Some(thread), end }),
            Err(error) => {
                let _ = capture.kill();
                let _ = capture.wait();
                Err(format!("starting the sound thread: {error}"))
            }
        }
    }

    /// Ends the capture; the sound up to `end_micros` (the video's end) is in the stream
    /// when this returns.
    pub fn finish(mut self, end_micros: u64) -> Result<(), String> {
        self.end.store(end_micros, Ordering::Relaxed);
        let _ = self.capture.kill();
        let _ = self.capture.wait();
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(outcome)) => outcome,
            Some(Err(_)) => Err("the recording's sound thread failed unexpectedly".into()),
            None => Ok(()),
        }
    }
}

impl Drop for SoundCapture {
    /// Reaped whatever happens to the recording (a panic included).
    fn drop(&mut self) {
        let _ = self.capture.kill();
        let _ = self.capture.wait();
    }
}

/// The clock of the sound: where sample 0 falls on the recording's clock.
#[derive(Default)]
struct Clock {
    /// Sample frames read so far.
    frames: u64,
    /// The smallest (read at − duration read so far), in microseconds; it may be
    /// negative: the capture started before slot 0.
    offset: Option<i64>,
}

impl Clock {
    /// Notes a read of `frames` more sample frames at `micros`; returns the position
    /// (in sample frames) where they begin.
    fn read(&mut self, frames: u64, micros: i64) -> u64 {
        let begins = self.frames;
        self.frames += frames;
        let candidate = micros - frames_to_micros(self.frames) as i64;
        self.offset = Some(self.offset.map_or(candidate, |offset| offset.min(candidate)));
        begins
    }

    /// The time in the video of sample frame `position` (none before slot 0).
    fn micros_of(&self, position: u64) -> Option<u64> {
        let at = self.offset? + frames_to_micros(position) as i64;
        u64::try_from(at).ok()
    }
}

fn frames_to_micros(frames: u64) -> u64 {
    frames * 1_000_000 / u64::from(RATE)
}

/// Reads the capture's PCM until it ends, stamping each piece and handing it to the
/// stream once held long enough (all of it at the end, up to the video's end).
fn stamp(
    mut pcm: impl Read, start: Instant, sink: &SoundSender, end: &AtomicU64,
) -> Result<(), String> {
    let mut clock = Clock::default();
    let mut held: VecDeque<(u64, Vec<u8>)> = VecDeque::new();
    // A first piece of silence at once: the encoder starts its sound track (and the
    // file) without waiting for a sound server that may hand over nothing for long.
    let silence = vec![0; PIECE_BYTES];
    let piece_micros = frames_to_micros((PIECE_BYTES / FRAME_BYTES) as u64);
    sink.send(0, silence.clone()).map_err(|_| "the encoder stopped taking sound".to_owned())?;
    // Where the sound handed over so far ends: no piece goes before it (should the clock's
    // offset still fall after a piece was sent, the overlap is dropped, never played twice
    // or out of order).
    let mut sent_until = piece_micros;
    let mut send = |clock: &Clock, (position, piece): (u64, Vec<u8>)| -> Result<(), String> {
        let Some(micros) = clock.micros_of(position) else {
            return Ok(());
        };
        let length = frames_to_micros((piece.len() / FRAME_BYTES) as u64);
        if micros >= end.load(Ordering::Relaxed) || micros + length <= sent_until {
            return Ok(());
        }
        let micros = micros.max(sent_until);
        sent_until = micros + length;
        sink.send(micros, piece).map_err(|_| "the encoder stopped taking sound".to_owned())
    };
    loop {
        let mut piece = vec![0; PIECE_BYTES];
        let read = read_piece(&mut pcm, &mut piece)
            .map_err(|error| format!("reading the sound capture: {error}"))?;
        if read == 0 {
            break;
        }
        piece.truncate(read - read % FRAME_BYTES);
        let now = start.elapsed();
        let position = clock.read((piece.len() / FRAME_BYTES) as u64, now.as_micros() as i64);
        held.push_back((position, piece));
        let settled = |position: u64| {
            clock
                .micros_of(position)
                .is_none_or(|micros| micros + (HOLD.as_micros() as u64) < now.as_micros() as u64)
        };
        while let Some(oldest) = held.pop_front() {
            if !settled(oldest.0) {
                held.push_front(oldest);
                break;
            }
            send(&clock, oldest)?;
        }
    }
    for piece in held {
        send(&clock, piece)?;
    }
    // An idle sound server may hand over nothing at all (it suspends a sink nobody
    // plays into): the track still runs to the video's end, in silence (the encoder
    // fills what lies between pieces).
    let end = end.load(Ordering::Relaxed);
    let last = end.saturating_sub(piece_micros);
    if end != u64::MAX && sent_until < last {
        sink.send(last, silence).map_err(|_| "the encoder stopped taking sound".to_owned())?;
    }
    Ok(())
}

/// Fills `piece` unless the capture ends first; returns how much was read.
fn read_piece(pcm: &mut impl Read, piece: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < piece.len() {
        match pcm.read(&mut piece[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_reads_do_not_move_the_sound_and_one_prompt_read_sets_it() {
        let mut clock = Clock::default();
        // 10 ms pieces; the first two are read 300 ms late, the third on time.
        let piece = u64::from(RATE) / 100;
        assert_eq!(clock.read(piece, 310_000), 0);
        assert_eq!(clock.micros_of(0), Some(300_000));
        clock.read(piece, 320_000);
        clock.read(piece, 30_000 + 5_000);
        // Sample 0 was played at 5 ms, and every piece follows at its place in the sound.
        assert_eq!(clock.micros_of(0), Some(5_000));
        assert_eq!(clock.micros_of(piece), Some(15_000));
        // A piece read very late later on does not change it.
        clock.read(piece, 2_000_000);
        assert_eq!(clock.micros_of(3 * piece), Some(35_000));
    }

    #[test]
    fn sound_from_before_slot_0_has_no_place() {
        let mut clock = Clock::default();
        clock.read(u64::from(RATE) / 100, 4_000);
        assert_eq!(clock.micros_of(0), None);
        assert_eq!(clock.micros_of(u64::from(RATE) / 100), Some(4_000));
    }
}
