//! The ffmpeg encoder of one recording and the thread that feeds it.
//!
//! Frames travel to ffmpeg as raw I420 in a minimal Matroska stream, each with the
//! timestamp of its slot on the recording's schedule, and go into the video as they are:
//! it shows each frame until the next one's time (a variable frame rate). So neither the
//! recorder nor the encoder handles a frame twice: an unchanged screen costs a look at
//! the X server's damage and the cursor, and slots skipped while the encoder falls behind
//! (a busy machine) cost nothing, yet video time stays wall time.
//!
//! Writing happens on a thread of its own with a pool of [`POOL`] frame buffers, so a
//! write blocked on a slow encoder never delays the schedule or the noticing of a stop:
//! the recorder copies a frame into a free buffer, or skips the slot when none is free.
//!
//! With sound, the same stream carries the VM's sound as a second track (raw PCM,
//! `recording::sound` stamps it on the recording's clock): both tracks' timestamps are
//! set here at capture, so an encoder that falls behind delays the file, never the sync.

use std::io::Write;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;

/// Frame buffers per recording: one being written into the pipe and one waiting for it.
/// More would only queue stale frames behind a slow encoder.
pub const POOL: usize = 2;

/// The writer thread has ended: it failed (or panicked); [`FrameWriter::finish`] says why.
#[derive(Debug)]
pub struct WriterGone;

/// One frame buffer: room for the Matroska block header, then the I420 image.
struct Frame {
    slot: u64,
    bytes: Vec<u8>,
}

impl Frame {
    fn image_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[matroska::BLOCK_PREFIX..]
    }
}

/// What the writer thread writes into the stream.
enum Item {
    Frame(Frame),
    Sound { micros: u64, pcm: Vec<u8> },
}

/// Sound bytes that may wait for a stalled encoder (about 30 s of it); pieces beyond are
/// dropped (the encoder fills their time with silence), so memory stays bounded.
const MAX_PENDING_SOUND_BYTES: usize = 6 * 1024 * 1024;

/// The recording's sound track: 16-bit PCM at this rate, in this many channels.
pub const RATE: u32 = 48_000;
pub const CHANNELS: u8 = 2;

/// Hands the sound's PCM to the writer thread, each piece with its time in the video.
#[derive(Clone)]
pub struct SoundSender {
    items: Sender<Item>,
    pending: Arc<AtomicUsize>,
}

impl SoundSender {
    pub fn send(&self, micros: u64, pcm: Vec<u8>) -> Result<(), WriterGone> {
        if self.pending.load(Ordering::Relaxed) + pcm.len() > MAX_PENDING_SOUND_BYTES {
            return Ok(());
        }
        self.pending.fetch_add(pcm.len(), Ordering::Relaxed);
        self.items.send(Item::Sound { micros, pcm }).map_err(|_| WriterGone)
    }
}

/// Hands frames to the writer thread and gets their buffers back once written.
pub struct FrameWriter {
    /// Unbounded, yet frames never pile up: only [`POOL`] buffers exist; sound is
    /// bounded by `SoundSender`.
    items: Option<Sender<Item>>,
    sound_pending: Arc<AtomicUsize>,
    returned: Receiver<Frame>,
    /// Buffers back from the writer (or never used yet).
    idle: Vec<Frame>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

/// What the Matroska stream says about the frames.
pub struct Format {
    pub width: u32,
    pub height: u32,
    pub framerate: u32,
    /// A sound track follows the video (48 kHz stereo 16-bit PCM).
    pub sound: bool,
}

impl FrameWriter {
    /// Starts the writer thread on the encoder's stdin. Dropping the writer (or
    /// [`finish`](Self::finish)) closes stdin once the frames sent are written: ffmpeg
    /// reads EOF and completes the file.
    pub fn spawn(stdin: ChildStdin, format: &Format, name: &str) -> Result<Self, String> {
        let image_bytes = format.width as usize * format.height as usize * 3 / 2;
        let header = matroska::stream_header(format);
        let framerate = u64::from(format.framerate);
        let (items_tx, items_rx) = mpsc::channel::<Item>();
        let sound_pending = Arc::new(AtomicUsize::new(0));
        let written_sound = sound_pending.clone();
        let (returned_tx, returned_rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("encoder-{name}"))
            .spawn(move || {
                let mut stdin = stdin;
                let broken =
                    |error: std::io::Error| format!("the encoder stopped taking frames: {error}");
                stdin.write_all(&header).map_err(broken)?;
                for item in items_rx {
                    match item {
                        Item::Frame(mut frame) => {
                            let micros = frame.slot * 1_000_000 / framerate;
                            let image = frame.bytes.len() - matroska::BLOCK_PREFIX;
                            frame.bytes[..matroska::BLOCK_PREFIX].copy_from_slice(
                                &matroska::block_prefix(matroska::VIDEO, image, micros),
                            );
                            stdin.write_all(&frame.bytes).map_err(broken)?;
                            // Only a recorder that panicked is gone; its buffers are of no
                            // use then.
                            let _ = returned_tx.send(frame);
                        }
                        Item::Sound { micros, pcm } => {
                            let prefix = matroska::block_prefix(matroska::SOUND, pcm.len(), micros);
                            stdin.write_all(&prefix).map_err(broken)?;
                            stdin.write_all(&pcm).map_err(broken)?;
                            written_sound.fetch_sub(pcm.len(), Ordering::Relaxed);
                        }
                    }
                }
                Ok(())
            })
            .map_err(|error| format!("starting the encoder's writer thread: {error}"))?;
        let idle = (0..POOL)
            .map(|_| Frame { slot: 0, bytes: vec![0; matroska::BLOCK_PREFIX + image_bytes] })
            .collect();
        Ok(Self {
            items: Some(items_tx),
            sound_pending,
            returned: returned_rx,
            idle,
            thread: Some(thread),
        })
    }

    /// Whether a buffer is free for the next frame: `false` while every buffer is still
    /// queued for the encoder or being written into it (the encoder is behind).
    pub fn has_free_buffer(&mut self) -> Result<bool, WriterGone> {
        loop {
            match self.returned.try_recv() {
                Ok(frame) => self.idle.push(frame),
                Err(TryRecvError::Empty) => break,
                // Buffers still in flight never come back: the writer ended.
                Err(TryRecvError::Disconnected) if self.idle.is_empty() => return Err(WriterGone),
                Err(TryRecvError::Disconnected) => break,
            }
        }
        Ok(!self.idle.is_empty())
    }

    /// Waits until a buffer is free for the next frame.
    fn wait_free_buffer(&mut self) -> Result<(), WriterGone> {
        if self.idle.is_empty() {
            let frame = self.returned.recv().map_err(|_| WriterGone)?;
            self.idle.push(frame);
        }
        Ok(())
    }

    /// Waits until every frame sent has been written into the encoder's pipe.
    pub fn wait_written(&mut self) -> Result<(), WriterGone> {
        while self.idle.len() < POOL {
            let frame = self.returned.recv().map_err(|_| WriterGone)?;
            self.idle.push(frame);
        }
        Ok(())
    }

    /// Queues a copy of `image` for the encoder as the image of `slot` (and of the slots
    /// after it up to the next frame's). Waits for a free buffer if there is none; never
    /// blocks on the encoder otherwise: there are no more buffers than room.
    pub fn send_copy(&mut self, slot: u64, image: &[u8]) -> Result<(), WriterGone> {
        self.wait_free_buffer()?;
        let mut frame = self.idle.pop().ok_or(WriterGone)?;
        frame.image_mut().copy_from_slice(image);
        frame.slot = slot;
        self.items.as_ref().ok_or(WriterGone)?.send(Item::Frame(frame)).map_err(|_| WriterGone)
    }

    /// Where the sound's PCM goes into the stream (with `Format::sound`).
    pub fn sound_sender(&self) -> Option<SoundSender> {
        self.items.clone().map(|items| SoundSender { items, pending: self.sound_pending.clone() })
    }

    /// Lets the writer write what is queued, close the encoder's stdin and end; answers
    /// how it ended.
    pub fn finish(mut self) -> Result<(), String> {
        self.items = None;
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(written)) => written,
            Some(Err(_)) => Err("the encoder's writer thread failed unexpectedly".into()),
            None => Ok(()),
        }
    }
}

/// ffmpeg arguments that encode the writer's stream from stdin into fragmented MP4. The
/// benchmark gives `ffmpeg -f x11grab` the same encoder settings
/// (`bench/scenarios/record_cpu.py`). With `Format::sound`, the stream's sound track
/// becomes an AAC track.
pub fn encoder_args(format: &Format, output: &std::path::Path) -> Vec<String> {
    let framerate = format.framerate.to_string();
    let mut args: Vec<String> =
        ["-hide_banner", "-loglevel", "error", "-f", "matroska", "-i", "pipe:0"]
            .map(str::to_owned)
            .into();
    if format.sound {
        args.extend(
            [
                "-map",
                "0:v",
                "-map",
                "0:a",
                // Silence from slot 0 until the sound's first piece (a fragmented MP4
                // starts every track at zero, whatever its first timestamp says), and
                // wherever pieces are missing: the sound stays on its timestamps.
                "-af",
                "aresample=async=1:first_pts=0",
                "-c:a",
                "aac",
                "-b:a",
                "128k",
            ]
            .map(str::to_owned),
        );
    }
    args.extend(
        [
            // Each frame at its slot's time, and only the frames the recorder sent: the
            // video shows a frame until the next (variable frame rate), so an unchanged
            // screen costs the encoder nothing.
            "-fps_mode",
            "passthrough",
            "-c:v",
            "libx264",
            // Chosen by measurement (`bench/scenarios/record_cpu.py` prints it): ultrafast
            // with CABAC at CRF 26 costs about a third of veryfast's CPU, and its SSIM
            // against a lossless capture is higher than veryfast's at the default CRF 23
            // (at about twice the bitrate).
            "-preset",
            "ultrafast",
            "-x264-params",
            "cabac=1",
            "-crf",
            "26",
            "-pix_fmt",
            "yuv420p",
            // Say what the frames are, so players convert the colours back exactly.
            "-colorspace",
            "bt709",
            "-color_primaries",
            "bt709",
            "-color_trc",
            "bt709",
            "-color_range",
            "tv",
            // A keyframe, and so a fragment, at the first frame a second or more after the
            // last keyframe (the recorder sends a frame in every second): a crash loses at
            // most about that. Counted from the last keyframe, not in whole seconds, so
            // frames after a stall are not all keyframes.
            "-force_key_frames",
            "expr:if(isnan(prev_forced_t),1,gte(t,prev_forced_t+1))",
            "-g",
            &framerate,
            "-movflags",
            "+frag_keyframe+empty_moov+default_base_moof",
            // Each fragment reaches the file when it is complete, not when ffmpeg's
            // 32 KiB buffer fills: downloads in progress and crashes see it.
            "-flush_packets",
            "1",
            "-f",
            "mp4",
            "-y",
        ]
        .map(str::to_owned),
    );
    args.push(output.display().to_string());
    args
}

/// Starts ffmpeg on `args` with its stdin piped and its messages in `log`.
///
/// Not in its own process group and without a parent-death signal, on purpose: if the
/// agent is killed, ffmpeg reads EOF and completes the file; the runtime's kill of the
/// agent's process group still reaps it.
pub fn spawn(ffmpeg: &str, args: &[String], log: std::fs::File) -> Result<Encoder, String> {
    let mut command = Command::new(ffmpeg);
    crate::identity::as_agent(&mut command);
    crate::identity::without_agent_secrets(&mut command)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map(|child| {
            // The one process of a recording that may fall behind: its frames and sound
            // are stamped before it gets them. On a busy host it yields to the browser
            // (and to the capture), so what it records keeps its timing.
            // SAFETY: setpriority only reads its arguments.
            let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, child.id(), ENCODER_NICENESS) };
            Encoder(child)
        })
        .map_err(|error| format!("starting {ffmpeg}: {error}"))
}

/// How much the encoder yields to the VM's other processes (`nice`).
const ENCODER_NICENESS: libc::c_int = 10;

/// The encoder child, reaped whatever happens to the recording thread (a panic
/// included): killed if still running, then waited for. After a normal `wait` both are
/// no-ops.
pub struct Encoder(pub std::process::Child);

impl Drop for Encoder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Just enough Matroska (EBML) for ffmpeg's demuxer to read timestamped raw frames (and
/// sound) from a pipe: a header with one uncompressed I420 video track (and one PCM sound
/// track), then one cluster per frame or piece of sound (a cluster's timestamp is
/// absolute, so any gap is fine). The segment has the "unknown" size of live streams;
/// everything else has its real size.
mod matroska {
    use super::Format;

    /// The tracks' numbers.
    pub const VIDEO: u8 = 1;
    pub const SOUND: u8 = 2;
    /// Cluster (id, size, timestamp) and SimpleBlock (id, size, block header) before
    /// each image or piece of sound.
    pub const BLOCK_PREFIX: usize = 4 + 8 + TIMESTAMP + 1 + 8 + 4;
    /// The cluster's Timestamp element: id, size, an 8-byte unsigned integer.
    const TIMESTAMP: usize = 1 + 1 + 8;
    /// Nanoseconds per timestamp unit: microseconds, exact enough for any frame rate.
    const TIMESTAMP_SCALE: u64 = 1_000;

    /// An 8-byte EBML size (any size fits; ffmpeg accepts long forms).
    fn size(bytes: u64) -> [u8; 8] {
        (bytes | 1 << 56).to_be_bytes()
    }

    fn element(out: &mut Vec<u8>, id: &[u8], payload: &[u8]) {
        out.extend_from_slice(id);
        out.extend_from_slice(&size(payload.len() as u64));
        out.extend_from_slice(payload);
    }

    fn unsigned(out: &mut Vec<u8>, id: &[u8], value: u64) {
        element(out, id, &value.to_be_bytes());
    }

    fn master(out: &mut Vec<u8>, id: &[u8], children: impl FnOnce(&mut Vec<u8>)) {
        let mut payload = Vec::new();
        children(&mut payload);
        element(out, id, &payload);
    }

    pub fn stream_header(format: &Format) -> Vec<u8> {
        let mut out = Vec::new();
        master(&mut out, &[0x1A, 0x45, 0xDF, 0xA3], |ebml| {
            unsigned(ebml, &[0x42, 0x86], 1); // EBMLVersion
            unsigned(ebml, &[0x42, 0xF7], 1); // EBMLReadVersion
            unsigned(ebml, &[0x42, 0xF2], 4); // EBMLMaxIDLength
            unsigned(ebml, &[0x42, 0xF3], 8); // EBMLMaxSizeLength
            element(ebml, &[0x42, 0x82], b"matroska"); // DocType
            unsigned(ebml, &[0x42, 0x87], 4); // DocTypeVersion
            unsigned(ebml, &[0x42, 0x85], 2); // DocTypeReadVersion
        });
        // Segment, of unknown size: it lasts until EOF.
        out.extend_from_slice(&[
            0x18, 0x53, 0x80, 0x67, 0x01, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
        ]);
        master(&mut out, &[0x15, 0x49, 0xA9, 0x66], |info| {
            unsigned(info, &[0x2A, 0xD7, 0xB1], TIMESTAMP_SCALE);
            element(info, &[0x4D, 0x80], b"browser-agent"); // MuxingApp
            element(info, &[0x57, 0x41], b"browser-agent"); // WritingApp
        });
        master(&mut out, &[0x16, 0x54, 0xAE, 0x6B], |tracks| {
            master(tracks, &[0xAE], |track| {
                unsigned(track, &[0xD7], VIDEO.into()); // TrackNumber
                unsigned(track, &[0x73, 0xC5], VIDEO.into()); // TrackUID
                unsigned(track, &[0x83], 1); // TrackType: video
                unsigned(track, &[0x9C], 0); // FlagLacing
                // DefaultDuration: the nominal frame rate, so ffmpeg need not measure it
                // from the first frames before it starts encoding.
                unsigned(track, &[0x23, 0xE3, 0x83], 1_000_000_000 / u64::from(format.framerate));
                element(track, &[0x86], b"V_UNCOMPRESSED"); // CodecID
                master(track, &[0xE0], |video| {
                    unsigned(video, &[0xB0], u64::from(format.width)); // PixelWidth
                    unsigned(video, &[0xBA], u64::from(format.height)); // PixelHeight
                    element(video, &[0x2E, 0xB5, 0x24], b"I420"); // ColourSpace (FourCC)
                });
            });
            if format.sound {
                master(tracks, &[0xAE], |track| {
                    unsigned(track, &[0xD7], SOUND.into()); // TrackNumber
                    unsigned(track, &[0x73, 0xC5], SOUND.into()); // TrackUID
                    unsigned(track, &[0x83], 2); // TrackType: audio
                    unsigned(track, &[0x9C], 0); // FlagLacing
                    element(track, &[0x86], b"A_PCM/INT/LIT"); // CodecID
                    master(track, &[0xE1], |audio| {
                        let rate = f64::from(super::RATE);
                        element(audio, &[0xB5], &rate.to_be_bytes()); // SamplingFrequency
                        unsigned(audio, &[0x9F], super::CHANNELS.into());
                        unsigned(audio, &[0x62, 0x64], 16); // BitDepth
                    });
                });
            }
        });
        out
    }

    /// The headers that go before `payload` bytes of `track`: a cluster at `timestamp`
    /// holding them as its one block (a keyframe).
    pub fn block_prefix(track: u8, payload: usize, timestamp: u64) -> [u8; BLOCK_PREFIX] {
        let block = 4 + payload as u64;
        let cluster = TIMESTAMP as u64 + 1 + 8 + block;
        let parts: [&[u8]; 7] = [
            &[0x1F, 0x43, 0xB6, 0x75], // Cluster
            &size(cluster),
            &[0xE7, 0x88], // Timestamp, 8 bytes
            &timestamp.to_be_bytes(),
            &[0xA3], // SimpleBlock
            &size(block),
            // The track (a 1-byte EBML number), no offset from the cluster's timestamp,
            // keyframe.
            &[0x80 | track, 0x00, 0x00, 0x80],
        ];
        let mut prefix = [0; BLOCK_PREFIX];
        let mut at = 0;
        for part in parts {
            prefix[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        prefix
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT: Format = Format { width: 64, height: 48, framerate: 10, sound: false };

    fn image_bytes() -> usize {
        FORMAT.width as usize * FORMAT.height as usize * 3 / 2
    }

    /// A flat grey image of luma `y`.
    fn grey(y: u8) -> Vec<u8> {
        let luma = FORMAT.width as usize * FORMAT.height as usize;
        let mut image = vec![128; image_bytes()];
        image[..luma].fill(y);
        image
    }

    #[test]
    fn frames_cover_their_slots_until_the_next_frame_and_the_video_ends_at_the_last() {
        let dir = tempfile::tempdir().expect("temp dir");
        let output = dir.path().join("out.mp4");
        let log = std::fs::File::create(dir.path().join("log")).expect("log");
        let mut ffmpeg = spawn("ffmpeg", &encoder_args(&FORMAT, &output), log).expect("ffmpeg");
        let stdin = ffmpeg.0.stdin.take().expect("stdin");
        let mut writer = FrameWriter::spawn(stdin, &FORMAT, "test").expect("writer");
        // Gaps of several slots, as when the encoder was behind, then the final slot.
        let frames = [(0, 20), (1, 50), (2, 80), (5, 110), (6, 140), (20, 170), (29, 200)];
        for (slot, y) in frames {
            writer.send_copy(slot, &grey(y)).expect("send");
        }
        writer.finish().expect("written");
        assert!(ffmpeg.0.wait().expect("wait").success());

        // Only the frames sent are encoded, each at its slot's time.
        let probed = Command::new("ffprobe")
            .args(["-v", "error", "-select_streams", "v:0", "-show_entries"])
            .args(["frame=pts_time", "-of", "csv=p=0"])
            .arg(&output)
            .output()
            .expect("ffprobe");
        let times: Vec<f64> = String::from_utf8_lossy(&probed.stdout)
            .lines()
            .filter_map(|line| line.trim().trim_end_matches(',').parse().ok())
            .collect();
        let slots: Vec<f64> = frames.iter().map(|(slot, _)| *slot as f64 / 10.0).collect();
        assert_eq!(times.len(), slots.len(), "{times:?}");
        for (time, slot) in times.iter().zip(&slots) {
            assert!((time - slot).abs() < 0.001, "{times:?} != {slots:?}");
        }

        // Played at the frame rate, each slot shows the latest frame at or before it.
        let decoded = Command::new("ffmpeg")
            .args(["-v", "error", "-i"])
            .arg(&output)
            .args(["-vf", "fps=10", "-f", "rawvideo", "-pix_fmt", "yuv420p", "-"])
            .output()
            .expect("decode");
        assert!(decoded.status.success());
        let shown: Vec<u8> = decoded
            .stdout
            .chunks(image_bytes())
            .map(|frame| frame[FORMAT.width as usize * 24 + 32])
            .collect();
        let expected: Vec<u8> = (0..30)
            .map(|slot| frames.iter().rev().find(|(at, _)| *at <= slot).map_or(0, |(_, y)| *y))
            .collect();
        assert_eq!(shown.len(), expected.len(), "one frame per slot: {shown:?}");
        for (slot, (shown, expected)) in shown.iter().zip(&expected).enumerate() {
            assert!(shown.abs_diff(*expected) <= 3, "slot {slot}: {shown:?} != {expected:?}");
        }
    }

    #[test]
    fn a_busy_encoder_gets_no_more_frames_than_the_pool_and_its_failure_is_reported() {
        // An "encoder" that never reads: the pipe fills and the writer blocks.
        let mut child =
            Encoder(Command::new("sleep").arg("30").stdin(Stdio::piped()).spawn().expect("sleep"));
        let big = Format { width: 640, height: 480, framerate: 10, sound: false };
        let stdin = child.0.stdin.take().expect("stdin");
        let mut writer = FrameWriter::spawn(stdin, &big, "test").expect("writer");
        let image = vec![0; big.width as usize * big.height as usize * 3 / 2];
        for slot in 0..POOL as u64 {
            assert!(writer.has_free_buffer().expect("alive"), "a free buffer");
            writer.send_copy(slot, &image).expect("send");
        }
        // Every buffer is queued or being written: the next slot is to be skipped.
        assert!(!writer.has_free_buffer().expect("alive"));

        child.0.kill().expect("kill");
        let _ = child.0.wait();
        let error = writer.finish().expect_err("the encoder is gone");
        assert!(error.contains("stopped taking frames"), "{error}");
    }
}
