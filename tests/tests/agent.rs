//! The real browser-agent binary over real gRPC: its credential, its status, Chromium
//! supervision and shutdown. Needs Chromium (deploy/test.sh installs it) and the agent
//! built by `cargo build --workspace`.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use browser_agent_proto::v1::browser_agent_client::BrowserAgentClient;
use browser_agent_proto::v1::{
    DevtoolsState, RecordingRequest, RecordingState, ShutdownRequest, StartRecordingRequest,
    StatusRequest,
};
use tonic::Code;
use tonic::transport::Channel;

fn agent_binary() -> PathBuf {
    // target/<profile>/deps/agent-<hash> → target/<profile>/browser-agent
    let exe = std::env::current_exe().expect("test binary path");
    let path =
        exe.parent().and_then(|deps| deps.parent()).expect("target dir").join("browser-agent");
    assert!(path.exists(), "{} is missing: run `cargo build --workspace` first", path.display());
    path
}

struct Agent {
    child: Child,
    address: String,
    _dir: tempfile::TempDir,
}

impl Drop for Agent {
    fn drop(&mut self) {
        // Its children die with it (parent-death signal).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_agent(secret: &str, args: &[&str]) -> Agent {
    let dir = tempfile::tempdir().expect("temp dir");
    let addr_file = dir.path().join("agent.addr");
    let child = Command::new(agent_binary())
        .arg("--vm-root")
        .arg(dir.path().join("root"))
        .arg("--addr-file")
        .arg(&addr_file)
        .args(args)
        .env("BROWSER_AGENT_SECRET", secret)
        .spawn()
        .expect("start agent");
    let deadline = Instant::now() + Duration::from_secs(10);
    let address = loop {
        if let Ok(address) = std::fs::read_to_string(&addr_file) {
            break address;
        }
        assert!(Instant::now() < deadline, "agent did not write its address");
        std::thread::sleep(Duration::from_millis(10));
    };
    Agent { child, address: format!("http://{}", address.trim()), _dir: dir }
}

async fn client(agent: &Agent) -> BrowserAgentClient<Channel> {
    BrowserAgentClient::connect(agent.address.clone()).await.expect("connect")
}

fn with_secret<T>(message: T, secret: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {secret}").parse().expect("ascii"));
    request
}

fn is_running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            !matches!(stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next()), Some('Z' | 'X'))
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn agent_demands_its_credential_supervises_chromium_and_shuts_down() {
    let mut agent = start_agent("right-secret", &["--headless", "--width=800", "--height=600"]);
    let mut client = client(&agent).await;

    for request in [
        tonic::Request::new(StatusRequest::default()),
        with_secret(StatusRequest::default(), "wrong-secret"),
    ] {
        let status = client.status(request).await.expect_err("must be refused");
        assert_eq!(status.code(), Code::Unauthenticated);
    }
    let refused = client.shutdown(with_secret(ShutdownRequest {}, "wrong-secret")).await;
    assert_eq!(refused.expect_err("must be refused").code(), Code::Unauthenticated);

    let ready = |wait| StatusRequest { wait_until_ready: wait, wait_timeout_ms: 30_000 };
    let status =
        client.status(with_secret(ready(true), "right-secret")).await.expect("status").into_inner();
    assert_eq!(status.devtools_state(), DevtoolsState::Ready);
    assert!(status.headless && status.display.is_empty());
    assert_eq!((status.screen_width, status.screen_height), (800, 600));
    assert!(status.devtools_browser_url.starts_with("ws://127.0.0.1:"));
    let first_pid = status.chromium_pid;
    assert!(is_running(first_pid));

    // Chromium dies: the agent notices, starts it again and says so.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill Chromium");
    let deadline = Instant::now() + Duration::from_secs(30);
    let restarted = loop {
        let status = client
            .status(with_secret(ready(true), "right-secret"))
            .await
            .expect("status")
            .into_inner();
        if status.chromium_restarts == 1 && status.devtools_state() == DevtoolsState::Ready {
            break status;
        }
        assert!(Instant::now() < deadline, "Chromium was not restarted: {status:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_ne!(restarted.chromium_pid, first_pid);
    assert!(restarted.last_chromium_exit.contains("signal"), "{}", restarted.last_chromium_exit);

    // Shutdown reaps Chromium and ends the agent.
    client.shutdown(with_secret(ShutdownRequest {}, "right-secret")).await.expect("shutdown");
    let deadline = Instant::now() + Duration::from_secs(10);
    while agent.child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "agent did not exit after Shutdown");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!is_running(restarted.chromium_pid), "Chromium outlived its agent");
}

#[tokio::test]
async fn agent_without_a_control_plane_shuts_itself_down() {
    let dir = tempfile::tempdir().expect("temp dir");
    let addr_file = dir.path().join("agent.addr");
    let mut child = Command::new(agent_binary())
        .arg("--vm-root")
        .arg(dir.path().join("root"))
        .arg("--addr-file")
        .arg(&addr_file)
        .args(["--headless", "--idle-grace-seconds=2"])
        .env("BROWSER_AGENT_SECRET", "s")
        .spawn()
        .expect("start agent");
    let deadline = Instant::now() + Duration::from_secs(15);
    let exited = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the agent kept running without a control plane");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(exited.success(), "{exited:?}");
}

/// What a recording is: its codec, when each of its frames begins (seconds; the video
/// holds a frame only when the screen changed, a variable frame rate), and its duration.
fn probe(path: &std::path::Path) -> (String, Vec<f64>, f64) {
    let run = |args: &[&str]| {
        let output = Command::new("ffprobe")
            .args(["-v", "error", "-select_streams", "v:0"])
            .args(args)
            .args(["-of", "default=noprint_wrappers=1"])
            .arg(path)
            .output()
            .expect("run ffprobe");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let text = run(&["-show_entries", "stream=codec_name:format=duration"]);
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("ffprobe said no {name}: {text}"))
            .to_owned()
    };
    let mut times: Vec<f64> = run(&["-show_entries", "packet=pts_time"])
        .lines()
        .filter_map(|line| line.strip_prefix("pts_time=")?.parse().ok())
        .collect();
    times.sort_by(f64::total_cmp);
    (field("codec_name"), times, field("duration").parse().expect("duration"))
}

/// A recording's video written to a file and checked: H.264, every frame on the grid of
/// 10 frames a second. Answers the file (in a temporary directory that lives as long as
/// the first value) and its duration.
fn saved_h264(video: &[u8], name: &str) -> (tempfile::TempDir, std::path::PathBuf, f64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(name);
    std::fs::write(&path, video).expect("write");
    let (codec, times, duration) = probe(&path);
    assert_eq!(codec, "h264");
    assert!(on_the_grid(&times, 10.0), "{times:?}");
    (dir, path, duration)
}

/// Whether every frame begins at a slot of `rate` frames a second, at most one per slot.
fn on_the_grid(times: &[f64], rate: f64) -> bool {
    let slots: Vec<i64> = times.iter().map(|t| (t * rate).round() as i64).collect();
    times.iter().zip(&slots).all(|(t, slot)| (t * rate - *slot as f64).abs() < 0.01)
        && slots.windows(2).all(|pair| pair[0] < pair[1])
}

/// How many frames a player shows at `rate` frames a second.
fn frames_played(path: &std::path::Path, rate: u32) -> u64 {
    let output = Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(path)
        .args(["-vf", &format!("fps={rate},scale=2:2")])
        .args(["-f", "rawvideo", "-pix_fmt", "gray", "-"])
        .output()
        .expect("run ffmpeg");
    assert!(output.status.success());
    output.stdout.len() as u64 / 4
}

#[tokio::test]
async fn agent_records_the_display_into_a_faststart_mp4() {
    let secret = "s";
    // Odd sides: the encoder needs even ones and must crop, not fail.
    let agent = start_agent(secret, &["--width=641", "--height=481"]);
    let mut client = client(&agent).await;
    let start = |id: &str, framerate, max_duration_seconds| {
        with_secret(
            StartRecordingRequest {
                recording_id: id.into(),
                framerate,
                max_duration_seconds,
                record_audio: false,
            },
            secret,
        )
    };
    let bad_id = client.start_recording(start("../x", 10, 5)).await;
    assert_eq!(bad_id.expect_err("bad id").code(), Code::InvalidArgument);
    let bad_rate = client.start_recording(start("r0", 0, 5)).await;
    assert_eq!(bad_rate.expect_err("bad rate").code(), Code::InvalidArgument);

    // One recording ends by itself at its maximum duration, exactly 2 s of 10 fps.
    let before = std::time::SystemTime::now();
    let started = client.start_recording(start("r1", 10, 2)).await.expect("start").into_inner();
    let started_ms =
        before.duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as i64;
    assert!((started.started_at_unix_ms - started_ms).abs() < 5_000);
    assert_eq!(started.state(), RecordingState::Recording);
    let again = client.start_recording(start("r1", 10, 2)).await;
    assert_eq!(again.expect_err("same id").code(), Code::AlreadyExists);

    let deadline = Instant::now() + Duration::from_secs(20);
    let finished = loop {
        let info = client
            .get_recording(with_secret(RecordingRequest { recording_id: "r1".into() }, secret))
            .await
            .expect("get")
            .into_inner();
        if info.state() == RecordingState::Finished {
            break info;
        }
        assert!(Instant::now() < deadline, "did not finish by itself: {info:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(finished.frames, 20);
    // Stop is idempotent on a finished recording.
    let stopped = client
        .stop_recording(with_secret(RecordingRequest { recording_id: "r1".into() }, secret))
        .await
        .expect("stop")
        .into_inner();
    assert_eq!(
        (stopped.state(), stopped.size_bytes),
        (RecordingState::Finished, finished.size_bytes)
    );

    let video = read_video(&mut client, secret, "r1").await;
    assert_eq!(video.len() as u64, finished.size_bytes);
    // faststart: the index (moov) comes before the media data (mdat).
    let position = |atom: &[u8]| video.windows(4).position(|w| w == atom).expect("atom");
    assert!(position(b"moov") < position(b"mdat"));
    let (_dir, path, duration) = saved_h264(&video, "r1.mp4");
    // Played at its frame rate: a frame in each of the 20 slots.
    assert_eq!(frames_played(&path, 10), 20);
    assert!((duration - 2.0).abs() < 0.2, "duration {duration}");

    // Delete forgets it; a second delete is NOT_FOUND.
    let delete = || with_secret(RecordingRequest { recording_id: "r1".into() }, secret);
    client.delete_recording(delete()).await.expect("delete");
    let gone = client.delete_recording(delete()).await;
    assert_eq!(gone.expect_err("deleted").code(), Code::NotFound);

    // At most four at once.
    for id in ["a", "b", "c", "d"] {
        client.start_recording(start(id, 5, 60)).await.expect("start");
    }
    let fifth = client.start_recording(start("e", 5, 60)).await;
    assert_eq!(fifth.expect_err("fifth").code(), Code::ResourceExhausted);
    for id in ["a", "b", "c", "d"] {
        let info = client
            .stop_recording(with_secret(RecordingRequest { recording_id: id.into() }, secret))
            .await
            .expect("stop")
            .into_inner();
        assert_eq!(info.state(), RecordingState::Finished, "{info:?}");
        assert!(info.frames >= 1);
    }
}

/// Reads a whole recording over gRPC.
async fn read_video(client: &mut BrowserAgentClient<Channel>, secret: &str, id: &str) -> Vec<u8> {
    let mut stream = client
        .read_recording(with_secret(RecordingRequest { recording_id: id.into() }, secret))
        .await
        .expect("read")
        .into_inner();
    let mut video = Vec::new();
    while let Some(chunk) = stream.message().await.expect("chunk") {
        video.extend_from_slice(&chunk.data);
    }
    video
}

#[tokio::test]
async fn a_recording_fed_to_a_slow_encoder_still_ends_at_its_stop() {
    // An encoder taking frames at about 1.3 MB/s: 2.8 of the 640x480 frames a second,
    // where the recording makes 10.
    let tools = tempfile::tempdir().expect("temp dir");
    let slow_ffmpeg = tools.path().join("slow-ffmpeg");
    std::fs::write(
        &slow_ffmpeg,
        "#!/bin/sh\npython3 -c '\nimport sys, time\nwhile chunk := sys.stdin.buffer.read1(65536):\n    \
         sys.stdout.buffer.write(chunk); sys.stdout.buffer.flush(); time.sleep(0.05)\n' | ffmpeg \"$@\"\n",
    )
    .expect("write the slow encoder");
    let mut permissions = std::fs::metadata(&slow_ffmpeg).expect("metadata").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&slow_ffmpeg, permissions).expect("chmod");
    let secret = "s";
    let ffmpeg_arg = format!("--ffmpeg-path={}", slow_ffmpeg.display());
    let agent = start_agent(secret, &["--width=640", "--height=480", &ffmpeg_arg]);
    let mut client = client(&agent).await;

    let started = client
        .start_recording(with_secret(
            StartRecordingRequest {
                recording_id: "slow".into(),
                framerate: 10,
                max_duration_seconds: 60,
                record_audio: false,
            },
            secret,
        ))
        .await
        .expect("start")
        .into_inner();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stop_asked = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let asked = Instant::now();
    let stopped = client
        .stop_recording(with_secret(RecordingRequest { recording_id: "slow".into() }, secret))
        .await
        .expect("stop")
        .into_inner();
    assert_eq!(stopped.state(), RecordingState::Finished, "{stopped:?}");
    // Only the frames queued at the stop are left to encode, not seconds of repeats.
    assert!(asked.elapsed() < Duration::from_secs(10), "{:?}", asked.elapsed());

    let wall = (stop_asked - started.started_at_unix_ms) as f64 / 1000.0;
    let video = read_video(&mut client, secret, "slow").await;
    let (_dir, path, duration) = saved_h264(&video, "slow.mp4");
    // Every slot from the first frame to the stop is covered, however few frames the
    // encoder took.
    assert!((duration - wall).abs() <= 0.1 * wall, "duration {duration} for {wall} s");
    assert_eq!(frames_played(&path, 10), stopped.frames, "{stopped:?}");
}
