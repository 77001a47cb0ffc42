//! Finishing recordings when stops, session ends and dead agents race, over a fake
//! runtime and a fake agent.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use super::*;
use crate::app::Services;
use crate::testing::{
    FAKE_VIDEO, FakeAgent, FakeRuntime, one_running_session, organization, running_session,
    services,
};

async fn recording_session(
    dir: &Path,
) -> (Services, Arc<FakeRuntime>, FakeAgent, SessionRecord, ReplayRecord) {
    let (services, runtime, agent) = services(dir).await;
    let org_id = organization(&services).await;
    let session = running_session(&services, &org_id).await;
    let client = services.sessions.agent(&session).expect("agent");
    let replay = services.replays.start(&session, client, 10, 60, false).await.expect("recording");
    (services, runtime, agent, session, replay)
}

async fn stored(services: &Services, replay: &ReplayRecord) -> ReplayRecord {
    services
        .store
        .replay(&replay.org_id, &replay.session_id, &replay.id)
        .await
        .expect("store")
        .expect("on record")
}

fn stored_video(services: &Services, replay: &ReplayRecord) -> Vec<u8> {
    let key = replay.blob_key.as_deref().expect("a video is stored");
    let path = services.blobs.local_path(key).expect("local blob");
    std::fs::read(path).expect("the video is readable")
}

#[tokio::test]
async fn a_stop_racing_the_end_of_its_session_finishes_the_replay_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (services, _, agent, session, replay) = recording_session(dir.path()).await;
    let client = services.sessions.agent(&session).ok();
    let (stopped, ended) = tokio::join!(
        services.replays.stop(&session, client, replay.clone()),
        services.sessions.end(&session, "deleted by the API"),
    );
    assert!(ended.expect("end"), "the end ended the session");
    match stopped {
        Ok(answered) => assert_eq!(answered.status, ReplayStatus::Finished),
        // The end claimed it first.
        Err(ServiceError::Conflict(_)) => {}
        Err(other) => panic!("a racing stop must answer the replay or 409: {other:?}"),
    }
    let finished = stored(&services, &replay).await;
    assert_eq!(finished.status, ReplayStatus::Finished);
    assert_eq!(finished.size_bytes, Some(FAKE_VIDEO.len() as i64));
    assert_eq!(stored_video(&services, &finished), FAKE_VIDEO);
    assert_eq!(agent.recording_reads.load(Ordering::SeqCst), 1, "collected once");
}

#[tokio::test]
async fn a_stopped_replay_no_longer_waits_for_its_maximum_duration() {
    let (_dir, services, _, _, session) = one_running_session().await;
    let tasks = || tokio::runtime::Handle::current().metrics().num_alive_tasks();
    let client = services.sessions.agent(&session).expect("agent");
    // Connected first: the connection's own tasks are not counted.
    client.status().await.expect("the agent answers");
    let before = tasks();
    let replay =
        services.replays.start(&session, client.clone(), 10, 60, false).await.expect("recording");
    assert_eq!(tasks(), before + 1, "the wait for the recording's maximum duration");
    services.replays.stop(&session, Some(client), replay).await.expect("stopped");
    // The wait looks at the record every 100 ms in tests (30 s otherwise), far sooner
    // than the recording's 60 s.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(tasks(), before, "no task (holding the agent's connection) is left behind");
}

/// A browser whose agent died 200 ms into its recording, leaving `leftover` (its
/// encoder completed the file then); answers the replay as the end left it, and when the
/// agent died (and the services, with the directory holding their blobs).
async fn salvaged(leftover: &[u8]) -> (ReplayRecord, SystemTime, (Services, tempfile::TempDir)) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (services, runtime, agent, session, replay) = recording_session(dir.path()).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let path = dir.path().join("left.recording.mp4");
    std::fs::write(&path, leftover).expect("leftover");
    let died_at = SystemTime::from(replay.started_at) + Duration::from_millis(200);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|file| file.set_modified(died_at))
        .expect("mtime");
    *runtime.leftover.lock().expect("lock") = Some(path);
    agent.recordings_unreachable.store(true, Ordering::SeqCst);
    services.sessions.end(&session, "browser agent exited").await.expect("end");
    (stored(&services, &replay).await, died_at, (services, dir))
}

#[tokio::test]
async fn a_replay_whose_agent_died_keeps_the_video_left_and_ends_when_it_was_written() {
    // What an encoder leaves while recording: a fragmented MP4 of H.264.
    let made = std::process::Command::new("ffmpeg")
        .args(["-hide_banner", "-loglevel", "error", "-f", "lavfi", "-i"])
        .args(["testsrc=size=64x64:rate=10:duration=1", "-c:v", "libx264"])
        .args(["-movflags", "frag_keyframe+empty_moov", "-f", "mp4", "pipe:1"])
        .output()
        .expect("ffmpeg");
    assert!(made.status.success() && !made.stdout.is_empty());
    let (finished, died_at, (services, _dir)) = salvaged(&made.stdout).await;
    assert_eq!(finished.status, ReplayStatus::Finished, "{:?}", finished.failure);
    let video = stored_video(&services, &finished);
    // Remuxed into a regular MP4 with its index in front.
    assert_eq!(&video[4..8], b"ftyp");
    assert!(
        video.windows(4).position(|w| w == b"moov") < video.windows(4).position(|w| w == b"mdat")
    );
    let finished_at = finished.finished_at.expect("finished");
    assert_eq!(
        finished_at.timestamp_millis(),
        DateTime::<Utc>::from(died_at).timestamp_millis(),
        "finished_at is the end of what was recorded, not the reap"
    );
}

#[tokio::test]
async fn a_replay_whose_agent_left_no_video_is_lost_with_a_reason() {
    // The VM can write anything there: an HLS playlist naming host files, say.
    let playlist = b"#EXTM3U\n#EXTINF:10,\nfile:/etc/passwd\n#EXT-X-ENDLIST\n";
    let (lost, died_at, _services) = salvaged(playlist).await;
    assert_eq!(lost.status, ReplayStatus::Lost);
    assert!(lost.blob_key.is_none());
    let why = lost.failure.unwrap_or_default();
    assert!(why.contains("not a usable video"), "{why}");
    assert_eq!(
        lost.finished_at.expect("finished").timestamp_millis(),
        DateTime::<Utc>::from(died_at).timestamp_millis()
    );
}

#[tokio::test]
async fn a_headless_browser_has_nothing_to_record() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (services, _, _, session, _) = recording_session(dir.path()).await;
    let headless = SessionRecord { headless: true, ..session.clone() };
    let client = services.sessions.agent(&session).expect("agent");
    let refused = services.replays.start(&headless, client, 10, 60, false).await;
    assert!(matches!(refused, Err(ServiceError::Invalid(_))), "{refused:?}");
}
