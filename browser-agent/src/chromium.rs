//! Launches Chromium, decides when it is ready (its DevTools `/json/version` answers),
//! and starts it again when it dies.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use browser_agent_proto::v1::DevtoolsState;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::process::GroupLeader;

/// How Chromium is to be launched; fixed for the agent's life (the extensions to load
/// change through the supervisor's `extensions` channel).
#[derive(Clone, Debug)]
pub struct LaunchConfig {
    pub chromium_path: String,
    /// Extensions must resolve inside it.
    pub vm_root: PathBuf,
    pub user_data_dir: PathBuf,
    /// `None` for headless browsers.
    pub display: Option<String>,
    /// Chromium's window fills it, at whatever size it has when Chromium starts.
    pub screen: std::sync::Arc<crate::screen::Screen>,
    pub kiosk: bool,
    pub stealth: bool,
    /// IANA timezone (`TZ`) of Chromium and its pages.
    pub timezone: Option<String>,
    /// BCP 47 locale of Chromium's UI, `navigator.language` and `Intl`.
    pub locale: Option<String>,
    /// Route all traffic, loopback included, through this proxy
    /// (`http://127.0.0.1:port`, the agent's forwarder to the VM's egress).
    pub proxy: Option<String>,
    /// A stored profile (ZIP of user data) to start from, and to start from again after
    /// each reset.
    pub profile_seed: Option<PathBuf>,
}

/// What the rest of the agent can observe about Chromium.
#[derive(Clone, Debug)]
pub struct BrowserState {
    pub devtools: DevtoolsState,
    pub pid: u32,
    /// Port of the DevTools HTTP/WebSocket server on loopback; 0 until ready.
    pub devtools_port: u16,
    pub browser_ws_url: String,
    pub restarts: u32,
    pub last_exit: String,
    /// Version of the extension set the running Chromium was launched with, so a caller
    /// can wait until its extensions are really loaded.
    pub extensions_version: u64,
    /// How many resets (fresh profile) the running Chromium has behind it.
    pub reset_generation: u64,
    /// The last `Relaunch` generation the running Chromium was started with.
    pub relaunch_generation: u64,
}

impl BrowserState {
    pub fn initial() -> Self {
        Self::starting(0, String::new(), 0, 0, 0)
    }

    fn starting(
        restarts: u32, last_exit: String, extensions_version: u64, reset_generation: u64,
        relaunch_generation: u64,
    ) -> Self {
        Self {
            devtools: DevtoolsState::Starting,
            pid: 0,
            devtools_port: 0,
            browser_ws_url: String::new(),
            restarts,
            last_exit,
            extensions_version,
            reset_generation,
            relaunch_generation,
        }
    }
}

/// Launch settings a running browser can change (PATCH `location`, `profile`), each
/// change applied by a clean restart of Chromium: its cookies and storage are written
/// first, and the pages it had open again afterwards (or, when a profile is loaded,
/// the profile's own last session).
#[derive(Clone, Debug, Default)]
pub struct Relaunch {
    /// Bumped by each change.
    pub generation: u64,
    pub timezone: Option<String>,
    pub locale: Option<String>,
    /// A profile (ZIP of user data) to use in place of the user data in use.
    pub profile_seed: Option<PathBuf>,
}

/// What a starting Chromium shows first.
#[derive(Debug, Default)]
enum FirstPages {
    /// Its own choice: a new tab page, or the profile's startup setting.
    #[default]
    Default,
    /// These URLs, each in a tab (the pages of the Chromium it replaces), once it runs.
    Urls(Vec<String>),
    /// The tabs of the profile's last session.
    LastSession,
}

/// Chromium's user data (the profile), inside the VM root.
pub const USER_DATA_DIR: &str = "user-data";

const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Consecutive failed starts after which the agent gives up and reports FAILED.
const MAX_FAILED_STARTS: u32 = 5;
/// How long a clean exit (writing cookies and storage) may take before Chromium is killed.
const CLEAN_EXIT_TIMEOUT: Duration = Duration::from_secs(15);

/// Removes Chromium's profile directory (a missing one is fine).
async fn wipe_profile(profile: &std::path::Path) -> std::io::Result<()> {
    let profile = profile.to_owned();
    tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&profile) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Removes everything in the VM root (the profile included) but the extensions, which
/// stay loaded across resets. Through cap-std, which follows no link out of the root: a
/// directory swapped for a link meanwhile (the filesystem API may still be called) cannot
/// lead the removal outside.
async fn wipe_vm_files(vm_root: &Path) -> std::io::Result<()> {
    fn clear(dir: &cap_std::fs::Dir, keep: &Path) -> std::io::Result<()> {
        for entry in dir.entries()? {
            let entry = entry?;
            let name = entry.file_name();
            let name = Path::new(&name);
            if name == keep {
                continue;
            }
            let is_dir = entry.file_type()?.is_dir();
            match keep.strip_prefix(name) {
                Ok(rest) if is_dir => clear(&dir.open_dir(name)?, rest)?,
                _ if is_dir => dir.remove_dir_all(name)?,
                _ => dir.remove_file(name)?,
            }
        }
        Ok(())
    }
    let keep = PathBuf::from(crate::extensions::EXTENSIONS_DIR.trim_start_matches('/'));
    let vm_root = vm_root.to_owned();
    tokio::task::spawn_blocking(move || {
        let root = cap_std::fs::Dir::open_ambient_dir(&vm_root, cap_std::ambient_authority())?;
        clear(&root, &keep)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Unpacks the profile seed, if any, into the (empty) user-data directory.
async fn seed_profile(config: &LaunchConfig) -> anyhow::Result<()> {
    let Some(archive) = config.profile_seed.clone() else {
        return Ok(());
    };
    if !archive.exists() {
        // The profile was deleted since this browser was launched: start empty.
        tracing::warn!(archive = %archive.display(), "the profile's state is gone; starting without it");
        return Ok(());
    }
    let dir = config.user_data_dir.clone();
    tokio::task::spawn_blocking(move || crate::profile::seed(&archive, &dir)).await?
}

/// How long a started Chromium may take to map its window.
const WINDOW_PATIENCE: Duration = Duration::from_secs(2);

/// Makes a new Chromium's window fill the screen exactly (see `Screen::fit_new_windows`)
/// before anyone is told it is ready.
async fn fit_windows(config: &LaunchConfig) {
    let screen = config.screen.clone();
    let started = std::time::Instant::now();
    let fitted = tokio::task::spawn_blocking(move || screen.fit_new_windows(WINDOW_PATIENCE)).await;
    match fitted {
        Ok(Ok(())) => {
            tracing::debug!(waited = ?started.elapsed(), "Chromium's window fills the screen")
        }
        Ok(Err(error)) => tracing::warn!(%error, "could not size Chromium's window"),
        Err(error) => tracing::warn!(%error, "the window sizing task failed"),
    }
}

/// Keeps Chromium running until `shutdown` is cancelled, publishing its state. A change
/// of `extensions` restarts it with the new set; a new `resets` generation restarts it
/// with a fresh profile (no tabs, cookies, storage or cache; the profile seed again, if
/// there is one). Once `stop` turns true, Chromium exits cleanly (its profile complete
/// on disk) and is not started again.
pub async fn supervise(
    config: LaunchConfig, mut extensions: watch::Receiver<crate::extensions::ExtensionSet>,
    mut resets: watch::Receiver<u64>, mut relaunches: watch::Receiver<Relaunch>,
    mut stop: watch::Receiver<bool>, state: watch::Sender<BrowserState>,
    shutdown: CancellationToken,
) {
    let mut config = config;
    let mut first_pages = FirstPages::Default;
    let mut loading_profile = false;
    let mut relaunched = 0;
    let mut restarts = 0;
    let mut failed_starts = 0;
    // The reset generation whose fresh profile is on disk. A reset that arrives while
    // Chromium is down (restarting for extensions, after a crash) is caught here too.
    // `None` until the profile seed is in place.
    let mut wiped_generation = None;
    loop {
        let stop_now = *stop.borrow();
        if stop_now {
            stopped(&state, &shutdown).await;
            return;
        }
        let (version, loaded) = extensions.borrow_and_update().clone();
        let generation = *resets.borrow_and_update();
        let relaunch = relaunches.borrow_and_update().clone();
        if relaunch.generation != relaunched {
            config.timezone = relaunch.timezone;
            config.locale = relaunch.locale;
            if relaunch.profile_seed.is_some() && relaunch.profile_seed != config.profile_seed {
                config.profile_seed = relaunch.profile_seed;
                // Unpacked below, in place of the user data in use.
                loading_profile = true;
                first_pages = FirstPages::LastSession;
            }
            relaunched = relaunch.generation;
        }
        if wiped_generation != Some(generation) || loading_profile {
            // A reset is for the browser's next user (a pool's next lessee): the files the
            // previous one wrote go too. The first start keeps what the VM was created with.
            let cleared = if generation == 0 || loading_profile {
                wipe_profile(&config.user_data_dir).await
            } else {
                // Nothing the previous user started lives on (a `setsid nohup` loop
                // would go on writing into the next user's home).
                let left = crate::identity::end_tenant_processes().await;
                if left > 0 {
                    tracing::error!(left, "tenant processes survived SIGKILL");
                }
                wipe_vm_files(&config.vm_root).await
            };
            let wiped = match cleared {
                Ok(()) => seed_profile(&config).await,
                Err(error) => Err(error.into()),
            };
            if let Err(error) = wiped {
                // The next user must never see the previous one's data: give up.
                tracing::error!(error = format!("{error:#}"), "could not prepare the profile");
                failed(&state, &shutdown, format!("could not prepare the profile: {error:#}"))
                    .await;
                return;
            }
            wiped_generation = Some(generation);
            loading_profile = false;
        }
        let first = std::mem::take(&mut first_pages);
        let started = match spawn(&config, &loaded, matches!(first, FirstPages::LastSession)) {
            Ok(mut chromium) => {
                tracing::debug!(pid = chromium.pid(), "Chromium started");
                state.send_modify(|s| {
                    s.pid = chromium.pid();
                    s.restarts = restarts;
                });
                // Shutdown must win over a slow start, or a deleted browser lingers.
                let ready = tokio::select! {
                    () = shutdown.cancelled() => {
                        chromium.terminate(Duration::from_secs(2)).await;
                        return;
                    }
                    ready = tokio::time::timeout(READY_TIMEOUT, wait_until_ready(&mut chromium)) => ready,
                };
                match ready {
                    Ok(Ok(devtools)) => {
                        fit_windows(&config).await;
                        if let FirstPages::Urls(urls) = &first {
                            crate::tabs::reopen_pages(devtools.0, urls).await;
                        }
                        Ok((chromium, devtools))
                    }
                    outcome => {
                        chromium.terminate(Duration::from_millis(500)).await;
                        Err(match outcome {
                            Ok(Err(error)) => error,
                            _ => anyhow!("DevTools did not answer within {READY_TIMEOUT:?}"),
                        })
                    }
                }
            }
            Err(error) => Err(error),
        };
        let (mut chromium, browser_ws_url) = match started {
            Ok((chromium, (port, browser_ws_url))) => {
                failed_starts = 0;
                state.send_modify(|s| {
                    s.devtools = DevtoolsState::Ready;
                    s.devtools_port = port;
                    s.browser_ws_url = browser_ws_url.clone();
                    s.extensions_version = version;
                    s.reset_generation = generation;
                    s.relaunch_generation = relaunched;
                });
                (chromium, browser_ws_url)
            }
            Err(error) => {
                failed_starts += 1;
                tracing::error!(
                    error = format!("{error:#}"),
                    failed_starts,
                    "Chromium did not start"
                );
                if failed_starts >= MAX_FAILED_STARTS {
                    failed(&state, &shutdown, format!("could not start: {error:#}")).await;
                    return;
                }
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(500)) => continue,
                }
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => {
                chromium.terminate(Duration::from_secs(2)).await;
                return;
            }
            // (The guard `wait_for` returns must not live across the awaits below.)
            () = async { let _ = stop.wait_for(|stop| *stop).await; } => {
                tracing::info!("stopping Chromium for good");
                close_cleanly(&mut chromium, &browser_ws_url).await;
                stopped(&state, &shutdown).await;
                return;
            }
            // New settings: a clean exit (cookies and storage written), and the same pages
            // in the next Chromium unless it loads a profile (which has its own).
            changed = relaunches.changed() => {
                if changed.is_err() {
                    shutdown.cancelled().await;
                    return;
                }
                tracing::info!("restarting Chromium with new settings");
                let devtools_port = state.borrow().devtools_port;
                let pages = crate::tabs::open_pages(devtools_port).await;
                close_cleanly(&mut chromium, &browser_ws_url).await;
                first_pages = FirstPages::Urls(pages);
                state.send_replace(BrowserState::starting(restarts, String::new(), version, generation, relaunched));
            }
            // A deliberate restart, not a crash: the new extension set, or a fresh profile
            // (wiped at the top of the loop, before the next start).
            changed = async {
                tokio::select! {
                    changed = extensions.changed() => ("to load extensions", Duration::from_secs(2), changed),
                    // A reset wipes the profile, so Chromium need not write it on the way
                    // out: killing it at once saves its shutdown on the way to the next
                    // lease. With new extensions the profile stays: it gets to be written.
                    changed = resets.changed() => ("with a fresh profile", Duration::ZERO, changed),
                }
            } => {
                let (why, grace, changed) = changed;
                tracing::info!("restarting Chromium {why}");
                chromium.terminate(grace).await;
                state.send_replace(BrowserState::starting(restarts, String::new(), version, generation, relaunched));
                if changed.is_err() {
                    // A sender is gone only when the agent stops.
                    shutdown.cancelled().await;
                    return;
                }
            }
            exit = chromium.wait() => {
                let reason = match exit {
                    Ok(status) => format!("Chromium exited: {status}"),
                    Err(error) => format!("waiting for Chromium failed: {error}"),
                };
                // The zygote and renderers of the dead browser must not linger.
                chromium.terminate(Duration::from_millis(200)).await;
                restarts += 1;
                tracing::warn!(%reason, restarts, "restarting Chromium");
                state.send_replace(BrowserState::starting(restarts, reason, version, generation, relaunched));
            }
        }
    }
}

/// Closes Chromium the way its own UI does (CDP `Browser.close`), so that it writes its
/// cookie database and storage before exiting; on signals it skips some of that.
/// Falls back to SIGTERM, then kills the group.
async fn close_cleanly(chromium: &mut GroupLeader, browser_ws_url: &str) {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let asked = async {
        let (mut socket, _) = tokio_tungstenite::connect_async(browser_ws_url).await.ok()?;
        let close = r#"{"id":1,"method":"Browser.close"}"#;
        socket.send(Message::text(close)).await.ok()?;
        // Chromium answers, then drops the connection as it exits.
        while let Some(Ok(_)) = socket.next().await {}
        Some(())
    };
    let asked = tokio::time::timeout(Duration::from_secs(5), asked).await;
    if !matches!(asked, Ok(Some(()))) {
        tracing::warn!("Browser.close failed; stopping Chromium with SIGTERM");
    }
    chromium.exit_cleanly(CLEAN_EXIT_TIMEOUT).await;
}

/// Publishes that Chromium is stopped for good and waits for the agent to end.
/// Chromium cannot be (re)started: says why, and waits for the agent to shut down.
async fn failed(state: &watch::Sender<BrowserState>, shutdown: &CancellationToken, why: String) {
    state.send_modify(|s| {
        s.devtools = DevtoolsState::Failed;
        s.pid = 0;
        s.last_exit = why;
    });
    shutdown.cancelled().await;
}

async fn stopped(state: &watch::Sender<BrowserState>, shutdown: &CancellationToken) {
    state.send_modify(|s| {
        s.devtools = DevtoolsState::Stopped;
        s.pid = 0;
        s.devtools_port = 0;
        s.browser_ws_url.clear();
    });
    shutdown.cancelled().await;
}

fn arguments(config: &LaunchConfig, extensions: &[PathBuf]) -> Vec<String> {
    let mut args = vec![
        "--remote-debugging-address=127.0.0.1".to_owned(),
        // Port 0: Chromium picks a free port and prints it, so agents never collide.
        "--remote-debugging-port=0".to_owned(),
        format!("--user-data-dir={}", config.user_data_dir.display()),
        "--no-first-run".to_owned(),
        "--no-default-browser-check".to_owned(),
        "--disable-background-networking".to_owned(),
        "--disable-component-update".to_owned(),
        "--disable-sync".to_owned(),
        "--disable-dev-shm-usage".to_owned(),
        "--password-store=basic".to_owned(),
        // What Debian's launcher script (`/usr/bin/chromium`, not run: see the control
        // plane's `--chromium`) adds that a page or the network would notice: no
        // hyperlink-auditing pings, no Cast device discovery.
        "--disable-pings".to_owned(),
        "--media-router=0".to_owned(),
        // The VM has no GPU (Xvfb has no GLX): each start, Chromium tried to set one up
        // in a GPU process that failed and was started again, two or three times, before
        // it composited in software, which it now does from the start. WebGL was not
        // available either way.
        "--disable-gpu".to_owned(),
        // Pages play sound without waiting for a user's gesture: programs drive these
        // browsers, and people watch and hear them through the live view.
        "--autoplay-policy=no-user-gesture-required".to_owned(),
        // WebMCP (`document.modelContext`, declarative form tools), still behind a
        // feature in this Chromium: pages register tools the WebMCP routes list and call.
        "--enable-features=WebMCP".to_owned(),
        // Without a window manager Chromium opens at +10+10 with its own size.
        "--window-position=0,0".to_owned(),
        {
            let (width, height) = config.screen.size();
            format!("--window-size={width},{height}")
        },
    ];
    if running_as_root() {
        // Root cannot use the sandbox; --test-type hides the warning bar that would
        // otherwise shift every page coordinate by 57 px.
        args.push("--no-sandbox".to_owned());
        args.push("--test-type".to_owned());
    }
    if config.display.is_none() {
        args.push("--headless=new".to_owned());
    }
    if config.kiosk {
        args.push("--kiosk".to_owned());
    }
    if config.stealth {
        args.push("--disable-blink-features=AutomationControlled".to_owned());
    }
    if let Some(locale) = &config.locale {
        // --lang picks the UI and ICU locale; --accept-lang what pages see first in
        // navigator.languages and Accept-Language.
        args.push(format!("--lang={locale}"));
        args.push(format!("--accept-lang={locale}"));
    }
    if !extensions.is_empty() {
        let list: Vec<String> = extensions.iter().map(|dir| dir.display().to_string()).collect();
        args.push(format!("--load-extension={}", list.join(",")));
        // Debian's Chromium honours --load-extension as is; builds that disable the switch
        // by default need this, and it is harmless elsewhere.
        args.push("--disable-features=DisableLoadExtensionCommandLineSwitch".to_owned());
    }
    if let Some(proxy) = &config.proxy {
        args.push(format!("--proxy-server={proxy}"));
        // `<-loopback>` removes Chromium's implicit bypass of localhost: all traffic goes
        // through the egress, which judges every destination (bypasses are its business).
        args.push("--proxy-bypass-list=<-loopback>".to_owned());
        // WebRTC's UDP would otherwise go direct and reveal the real address.
        args.push("--force-webrtc-ip-handling-policy=disable_non_proxied_udp".to_owned());
    }
    args.push("about:blank".to_owned());
    args
}

fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The extension directories that really lie inside the VM root, resolved. A user can
/// rearrange the VM's files (and plant symlinks) after an extension was unpacked; Chromium
/// runs as root, so it must only ever be handed real paths beneath the root.
fn confined(vm_root: &Path, extensions: &[PathBuf]) -> Vec<PathBuf> {
    let Ok(root) = vm_root.canonicalize() else {
        return Vec::new();
    };
    extensions
        .iter()
        .filter_map(|dir| match dir.canonicalize() {
            Ok(real) if real.starts_with(&root) && real.join("manifest.json").is_file() => Some(real),
            _ => {
                tracing::warn!(dir = %dir.display(), "extension directory moved or left the VM root; not loading it");
                None
            }
        })
        .collect()
}

fn spawn(
    config: &LaunchConfig, extensions: &[PathBuf], restore_last_session: bool,
) -> anyhow::Result<GroupLeader> {
    let extensions = confined(&config.vm_root, extensions);
    let extensions = extensions.as_slice();
    std::fs::create_dir_all(&config.user_data_dir)
        .with_context(|| format!("creating {}", config.user_data_dir.display()))?;
    let mut command = std::process::Command::new(&config.chromium_path);
    crate::identity::as_tenant(&mut command);
    crate::identity::without_agent_secrets(&mut command)
        .args(arguments(config, extensions))
        .args(restore_last_session.then_some("--restore-last-session"))
        .env_remove("WAYLAND_DISPLAY")
        .env_remove("XDG_SESSION_TYPE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    match &config.display {
        Some(display) => command.env("DISPLAY", display),
        None => command.env_remove("DISPLAY"),
    };
    if let Some(timezone) = &config.timezone {
        command.env("TZ", timezone);
    }
    if let Some(locale) = &config.locale {
        // Chromium on Linux takes its application locale from the environment.
        command.env("LANGUAGE", locale.replace('-', "_"));
    }
    GroupLeader::spawn(command).with_context(|| format!("starting {}", config.chromium_path))
}

/// Reads Chromium's stderr until it announces its DevTools port, then polls
/// `/json/version` until it answers. Keeps draining stderr into our log afterwards so
/// Chromium never blocks on a full pipe.
async fn wait_until_ready(chromium: &mut GroupLeader) -> anyhow::Result<(u16, String)> {
    let stderr = chromium.child.stderr.take().context("Chromium stderr is not piped")?;
    let mut stderr = BufReader::new(stderr);
    // Raw bytes, decoded lossily: Chromium's log is not guaranteed to be UTF-8, and a
    // decoding error must not stop the draining (a full pipe would block Chromium).
    let mut line = Vec::new();
    let port = loop {
        line.clear();
        if stderr.read_until(b'\n', &mut line).await? == 0 {
            bail!("Chromium exited before DevTools started");
        }
        crate::service_logs::append("chromium", &line);
        let text = String::from_utf8_lossy(&line);
        if let Some(port) = devtools_port_from_log_line(&text) {
            tracing::debug!(port, "DevTools listening");
            break port;
        }
        tracing::debug!(target: "chromium", "{}", text.trim_end());
    };
    tokio::spawn(async move {
        let mut line = Vec::new();
        while stderr.read_until(b'\n', &mut line).await.is_ok_and(|read| read > 0) {
            crate::service_logs::append("chromium", &line);
            tracing::debug!(target: "chromium", "{}", String::from_utf8_lossy(&line).trim_end());
            line.clear();
        }
    });

    let client = reqwest::Client::new();
    let url = format!("http://127.0.0.1:{port}/json/version");
    loop {
        if let Ok(response) = client.get(&url).send().await
            && let Ok(version) = response.json::<serde_json::Value>().await
            && let Some(ws) = version.get("webSocketDebuggerUrl").and_then(|v| v.as_str())
        {
            tracing::debug!("DevTools answered /json/version");
            return Ok((port, ws.to_owned()));
        }
        if let Ok(Some(status)) = chromium.child.try_wait() {
            bail!("Chromium exited before DevTools answered: {status}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Parses "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/UUID".
fn devtools_port_from_log_line(line: &str) -> Option<u16> {
    let rest = line.split("DevTools listening on ws://").nth(1)?;
    let host_port = rest.split('/').next()?;
    host_port.rsplit(':').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reset_keeps_only_the_extensions_and_nothing_outside_the_root_is_touched() {
        let outside = tempfile::tempdir().expect("temp dir");
        std::fs::write(outside.path().join("keep.txt"), "outside").expect("write");
        let root = tempfile::tempdir().expect("temp dir");
        let vm = root.path();
        std::fs::create_dir_all(vm.join("home/kernel/extensions/ext")).expect("dirs");
        std::fs::write(vm.join("home/kernel/extensions/ext/bg.js"), "ext").expect("write");
        std::fs::write(vm.join("home/kernel/notes.txt"), "lessee").expect("write");
        std::fs::create_dir_all(vm.join("user-data/Default")).expect("dirs");
        std::fs::create_dir_all(vm.join("tmp/deep")).expect("dirs");
        std::os::unix::fs::symlink(outside.path(), vm.join("link-out")).expect("symlink");
        std::os::unix::fs::symlink(outside.path(), vm.join("home/kernel/out")).expect("symlink");

        wipe_vm_files(vm).await.expect("wipe");

        let mut left: Vec<String> = walk(vm);
        left.sort();
        assert_eq!(
            left,
            [
                "home",
                "home/kernel",
                "home/kernel/extensions",
                "home/kernel/extensions/ext",
                "home/kernel/extensions/ext/bg.js"
            ]
        );
        assert_eq!(
            std::fs::read_to_string(outside.path().join("keep.txt")).expect("read"),
            "outside"
        );
    }

    fn walk(root: &Path) -> Vec<String> {
        let mut found = Vec::new();
        let mut pending = vec![root.to_owned()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).expect("read dir") {
                let path = entry.expect("entry").path();
                found.push(path.strip_prefix(root).expect("inside").display().to_string());
                if path.is_dir() && !path.is_symlink() {
                    pending.push(path);
                }
            }
        }
        found
    }

    #[test]
    fn only_extension_directories_inside_the_root_are_loaded() {
        let root = tempfile::tempdir().expect("root");
        let outside = tempfile::tempdir().expect("outside");
        for dir in [root.path().join("inside"), outside.path().join("elsewhere")] {
            std::fs::create_dir_all(&dir).expect("dir");
            std::fs::write(dir.join("manifest.json"), "{}").expect("manifest");
        }
        // A symlink planted inside the root that points outside it.
        std::os::unix::fs::symlink(outside.path().join("elsewhere"), root.path().join("planted"))
            .expect("link");
        let dirs =
            [root.path().join("inside"), root.path().join("planted"), root.path().join("missing")];
        let loaded = confined(root.path(), &dirs);
        assert_eq!(loaded, vec![root.path().join("inside").canonicalize().expect("real")]);
    }

    #[test]
    fn parses_the_devtools_announcement() {
        assert_eq!(
            devtools_port_from_log_line(
                "DevTools listening on ws://127.0.0.1:36789/devtools/browser/4c1d-..."
            ),
            Some(36789)
        );
        assert_eq!(devtools_port_from_log_line("[123:456:ERROR] something"), None);
    }

    #[test]
    fn headless_and_headful_arguments_differ_only_where_they_must() {
        let mut config = LaunchConfig {
            chromium_path: "chromium".into(),
            vm_root: "/tmp".into(),
            user_data_dir: "/tmp/x".into(),
            display: Some(":5".into()),
            screen: std::sync::Arc::new(crate::screen::Screen::new(None, (1280, 800), (1280, 800))),
            kiosk: false,
            stealth: false,
            timezone: None,
            locale: None,
            proxy: None,
            profile_seed: None,
        };
        let headful = arguments(&config, &[]);
        assert!(!headful.iter().any(|a| a.starts_with("--proxy")));
        config.proxy = Some("http://127.0.0.1:9".into());
        let proxied = arguments(&config, &[]);
        assert!(proxied.contains(&"--proxy-server=http://127.0.0.1:9".to_owned()));
        assert!(proxied.contains(&"--proxy-bypass-list=<-loopback>".to_owned()));
        config.proxy = None;
        assert!(headful.contains(&"--window-size=1280,800".to_owned()));
        assert!(!headful.iter().any(|a| a.starts_with("--headless")));
        config.display = None;
        assert!(arguments(&config, &[]).contains(&"--headless=new".to_owned()));
        let loaded = arguments(&config, &["/r/a".into(), "/r/b".into()]);
        assert!(loaded.contains(&"--load-extension=/r/a,/r/b".to_owned()));
    }
}
