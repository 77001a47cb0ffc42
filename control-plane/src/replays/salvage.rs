//! What a crashed agent left of a recording, made into a replay without trusting it. The
//! file was written inside the VM, so it may be anything a tenant wants: an HLS playlist
//! naming host files, a crafted MP4 with external data references. ffmpeg and ffprobe
//! therefore never see a path: they read the file on stdin and answer on stdout, inside
//! a sandbox of their own (no host file but the system's programs, no network, the VM
//! user, a bounded memory-backed `/tmp`), with the demuxer forced to MP4 (no probing of
//! the content; external data references stay off, as ffmpeg's default) and only the
//! `pipe` protocol for their input. The result must then be an MP4 whose streams are one
//! H.264 video and at most one audio track; anything else is a lost recording.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::runtime::sandbox::Sandbox;

/// A remux or probe that takes longer has failed (a recording is at most a few GB of
/// copied packets: seconds of work).
const MEDIA_TIMEOUT: Duration = Duration::from_secs(120);
/// What ffprobe may say about a file.
const MAX_PROBE_OUTPUT: u64 = 64 * 1024;
/// The remuxed file may be this much larger than what it came from (its index).
const REMUX_GROWTH_BYTES: u64 = 16 << 20;

/// Runs ffmpeg and ffprobe on video a VM wrote.
#[derive(Clone, Debug)]
pub struct VmMedia {
    ffmpeg: String,
    ffprobe: String,
    /// `None` under `--isolation none` (development only): the tools then run on the
    /// host, still fed by pipes with the demuxer forced.
    sandbox: Option<Sandbox>,
}

impl VmMedia {
    pub fn new(ffmpeg: &str, sandbox: Option<Sandbox>) -> Self {
        // ffprobe is installed beside ffmpeg.
        let ffprobe = match ffmpeg.rsplit_once('/') {
            Some((dir, _)) => format!("{dir}/ffprobe"),
            None => "ffprobe".to_owned(),
        };
        Self { ffmpeg: ffmpeg.to_owned(), ffprobe, sandbox }
    }

    /// Remuxes `input` (a fragmented or regular MP4, supposedly) into a regular MP4 with
    /// its index in front, written to `output`, and checks the result.
    pub async fn salvage(
        &self, input: std::fs::File, output: &mut tokio::fs::File,
    ) -> Result<(), String> {
        let input_size = input.metadata().map_err(|e| e.to_string())?.len();
        let limit = input_size + REMUX_GROWTH_BYTES;
        // A seekable file of its own lets ffmpeg put the index in front; it then leaves
        // through stdout. In the sandbox's private /tmp, or else a private directory.
        let scratch = match &self.sandbox {
            Some(_) => None,
            None => Some(tempfile::tempdir().map_err(|e| e.to_string())?),
        };
        let out = match &scratch {
            Some(dir) => dir.path().join("out.mp4").display().to_string(),
            None => "/tmp/out.mp4".to_owned(),
        };
        let script = "ffmpeg=$1; out=$2; shift 2; \"$ffmpeg\" \"$@\" \"$out\" && exec cat \"$out\"";
        let mut args: Vec<String> =
            ["-c", script, "sh", &self.ffmpeg, &out].map(String::from).to_vec();
        args.extend(
            [
                "-y",
                "-hide_banner",
                "-loglevel",
                "error",
                "-nostdin",
                "-protocol_whitelist",
                "pipe",
                "-f",
                "mp4",
                "-i",
                "pipe:0",
                "-map",
                "0:v:0",
                "-map",
                "0:a:0?",
                "-c",
                "copy",
                "-movflags",
                "+faststart",
                "-f",
                "mp4",
            ]
            .map(String::from),
        );
        let mut command = self.command("/bin/sh", &args, limit, &self.ffmpeg);
        let written = run(&mut command, input, output, limit).await?;
        if written == 0 {
            return Err("ffmpeg produced nothing".into());
        }
        output.flush().await.map_err(|e| e.to_string())?;
        self.check(output).await
    }

    /// Whether `video` is an MP4 of one H.264 video stream and at most one audio stream.
    async fn check(&self, video: &tokio::fs::File) -> Result<(), String> {
        let mut copy = video.try_clone().await.map_err(|e| e.to_string())?;
        tokio::io::AsyncSeekExt::rewind(&mut copy).await.map_err(|e| e.to_string())?;
        let args = [
            "-v",
            "error",
            "-protocol_whitelist",
            "pipe",
            "-f",
            "mp4",
            "-show_entries",
            "stream=codec_type,codec_name",
            "-of",
            "json",
            "pipe:0",
        ]
        .map(String::from);
        let mut command = self.command(&self.ffprobe, &args, 1 << 20, &self.ffprobe);
        let mut answer = Vec::new();
        run(&mut command, copy.into_std().await, &mut answer, MAX_PROBE_OUTPUT).await?;
        let probed: serde_json::Value =
            serde_json::from_slice(&answer).map_err(|_| "ffprobe's answer is not JSON")?;
        let streams: Vec<(String, String)> = probed["streams"]
            .as_array()
            .map(|streams| {
                streams
                    .iter()
                    .map(|stream| {
                        let text = |key: &str| stream[key].as_str().unwrap_or("").to_owned();
                        (text("codec_type"), text("codec_name"))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let videos = streams.iter().filter(|(kind, _)| kind == "video").count();
        let audios = streams.iter().filter(|(kind, _)| kind == "audio").count();
        let h264 = streams.iter().any(|(kind, codec)| kind == "video" && codec == "h264");
        if videos == 1 && h264 && audios <= 1 && streams.len() == videos + audios {
            Ok(())
        } else {
            Err(format!("not a recording: streams {streams:?}"))
        }
    }

    /// `program` with `args`, sandboxed when this host sandboxes VMs; `tmp_bytes` bounds
    /// the sandbox's `/tmp`, and `tool` (a path or a name in `PATH`) is the tool it runs.
    fn command(
        &self, program: &str, args: &[String], tmp_bytes: u64, tool: &str,
    ) -> tokio::process::Command {
        let mut command = match &self.sandbox {
            Some(sandbox) => {
                sandbox.tool_command(program, args, tmp_bytes, std::path::Path::new(tool))
            }
            None => {
                let mut command = tokio::process::Command::new(program);
                command.args(args);
                command
            }
        };
        command.stderr(Stdio::null()).kill_on_drop(true);
        command
    }
}

/// Runs `command` with `input` on its stdin, copying its stdout to `output`: fails past
/// `limit` bytes, after `MEDIA_TIMEOUT`, or if it does not exit successfully. Answers
/// the bytes written.
async fn run<W: tokio::io::AsyncWrite + Unpin>(
    command: &mut tokio::process::Command, input: std::fs::File, output: &mut W, limit: u64,
) -> Result<u64, String> {
    let mut input = input;
    std::io::Seek::rewind(&mut input).map_err(|e| e.to_string())?;
    let mut child = command
        .stdin(Stdio::from(input))
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|error| format!("starting the media tool failed: {error}"))?;
    let Some(stdout) = child.stdout.take() else {
        return Err("the media tool has no output".into());
    };
    let work = async {
        let copied = tokio::io::copy(&mut stdout.take(limit + 1), output)
            .await
            .map_err(|e| e.to_string())?;
        if copied > limit {
            return Err(format!("the media tool wrote more than {limit} bytes"));
        }
        let status = child.wait().await.map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("the media tool failed ({status})"));
        }
        Ok(copied)
    };
    let outcome = tokio::time::timeout(MEDIA_TIMEOUT, work)
        .await
        .unwrap_or_else(|_| Err("the media tool timed out".into()));
    if outcome.is_err() {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    outcome
}
