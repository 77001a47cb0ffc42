//! Restarting Chromium on request: a fresh profile (reset), new launch settings
//! (relaunch), a profile loaded into a browser without one, and the clean stop that
//! exports the profile as the session ends.

use std::io::Seek;

use browser_agent_proto::v1::{DevtoolsState, ProfileChunk, RelaunchRequest, profile_chunk};
use tokio::sync::watch;
use tonic::{Status, Streaming};

use super::{AgentService, DEFAULT_WAIT, DataStream, stream_file};
use crate::chromium::{BrowserState, Relaunch, USER_DATA_DIR};
use crate::upload::{Part, spool};

/// Waits until Chromium is ready again in a state `caught_up` accepts, or has failed.
pub(super) async fn restarted(
    mut browser: watch::Receiver<BrowserState>, caught_up: impl Fn(&BrowserState) -> bool,
    failure: &'static str,
) -> Result<(), Status> {
    let restarted = browser.wait_for(|s| {
        (caught_up(s) && s.devtools == DevtoolsState::Ready) || s.devtools == DevtoolsState::Failed
    });
    match tokio::time::timeout(DEFAULT_WAIT, restarted).await {
        Ok(Ok(state)) if state.devtools == DevtoolsState::Ready => Ok(()),
        _ => Err(Status::unavailable(failure)),
    }
}

impl AgentService {
    /// Restarts Chromium with a fresh profile and waits until it runs.
    pub(super) async fn reset(&self) -> Result<(), Status> {
        // Nothing of what earlier Playwright, REPL and WebDriver clients left (globals,
        // tabs, sessions) survives.
        self.executors.reset().await;
        self.repl.reset().await;
        // Its BiDi sessions end too (the next connection starts chromedriver again).
        self.webdriver.stop().await;
        // And whoever watched it: the next user's screen is not theirs to see.
        if let Some(live) = &self.live {
            live.disconnect_all();
        }
        let mut generation = 0;
        self.resets.send_modify(|g| {
            *g += 1;
            generation = *g;
        });
        restarted(
            self.browser.clone(),
            |s| s.reset_generation >= generation,
            "Chromium did not come back with a fresh profile",
        )
        .await
    }

    /// Restarts Chromium in another timezone and locale.
    pub(super) async fn relaunch_in(&self, request: RelaunchRequest) -> Result<(), Status> {
        let RelaunchRequest { timezone, locale } = request;
        for (name, value) in [("timezone", &timezone), ("locale", &locale)] {
            // Checked by the control plane; here only what could harm a launch.
            if value.len() > 64 || value.chars().any(|c| c.is_control() || c.is_whitespace()) {
                return Err(Status::invalid_argument(format!("{name} {value:?} is malformed")));
            }
        }
        let present = |value: String| (!value.is_empty()).then_some(value);
        self.relaunch_with(|settings| {
            settings.timezone = present(timezone);
            settings.locale = present(locale);
        })
        .await
    }

    /// Stores the profile archive the stream carries, checks it, and restarts Chromium
    /// with it.
    pub(super) async fn load_profile_from(
        &self, mut chunks: Streaming<ProfileChunk>,
    ) -> Result<(), Status> {
        if self.relaunches.borrow().profile_seed.is_some() {
            return Err(Status::failed_precondition("this browser already has a profile"));
        }
        let internal =
            |error: std::io::Error| Status::internal(format!("storing the profile: {error}"));
        // Removed again on any failure (dropped), kept on success.
        let pending = tempfile::Builder::new()
            .prefix("profile-")
            .suffix(".zip")
            .tempfile_in(&self.scratch_dir)
            .map_err(internal)?;
        let mut out = tokio::fs::File::from_std(pending.reopen().map_err(internal)?);
        spool(&mut chunks, &mut out, |chunk| match chunk.kind {
            Some(profile_chunk::Kind::Data(data)) => Ok(Part::Data(data)),
            Some(profile_chunk::Kind::Commit(_)) => Ok(Part::Done(())),
            None => Ok(Part::Skip),
        })
        .await
        .map_err(|error| error.into_status("the stream ended without commit", internal))?;
        out.sync_all().await.map_err(internal)?;
        let checked = pending.path().to_owned();
        tokio::task::spawn_blocking(move || crate::profile::check(&checked))
            .await
            .map_err(|error| Status::internal(error.to_string()))?
            .map_err(|error| {
                Status::invalid_argument(format!("the profile archive is unreadable: {error:#}"))
            })?;
        // Kept for the browser's life: resets start from it again.
        let (_, archive) = pending.keep().map_err(|error| internal(error.error))?;
        self.relaunch_with(|settings| settings.profile_seed = Some(archive)).await
    }

    /// Changes Chromium's launch settings and waits until it runs with them.
    async fn relaunch_with(&self, change: impl FnOnce(&mut Relaunch)) -> Result<(), Status> {
        // chromedriver's sessions are of the Chromium that goes away, like CDP connections.
        self.webdriver.stop().await;
        let mut generation = 0;
        self.relaunches.send_modify(|settings| {
            change(settings);
            settings.generation += 1;
            generation = settings.generation;
        });
        restarted(
            self.browser.clone(),
            |s| s.relaunch_generation >= generation,
            "Chromium did not come back with its new settings",
        )
        .await
    }

    /// Stops Chromium for good with a clean exit and streams its profile as a ZIP.
    pub(super) async fn stop_and_export_profile(&self) -> Result<DataStream, Status> {
        self.stop_chromium.send_replace(true);
        let mut browser = self.browser.clone();
        let stopped = browser.wait_for(|s| s.devtools == DevtoolsState::Stopped);
        // A stop that arrives while Chromium is starting waits for the start, then the
        // clean exit.
        match tokio::time::timeout(2 * DEFAULT_WAIT, stopped).await {
            Ok(Ok(_)) => {}
            _ => return Err(Status::unavailable("Chromium did not stop in time")),
        }
        let (dir, scratch_dir) = (self.vm_root.join(USER_DATA_DIR), self.scratch_dir.clone());
        let archive = tokio::task::spawn_blocking(move || {
            let mut archive = crate::profile::export(&dir, tempfile::tempfile_in(&scratch_dir)?)?;
            archive.rewind()?;
            anyhow::Ok(archive)
        })
        .await
        .map_err(|error| Status::internal(error.to_string()))?
        .map_err(|error| Status::internal(format!("exporting the profile failed: {error:#}")))?;
        Ok(stream_file(archive))
    }
}
