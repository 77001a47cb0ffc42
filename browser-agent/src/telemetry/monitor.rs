//! The CDP monitor: one DevTools client of the agent's own that attaches to every page
//! (never pausing it: `waitForDebuggerOnStart` is off), enables only the domains of the
//! categories being captured, and turns their events into telemetry. Its sessions are
//! its own, so the user's clients see nothing of it. When Chromium restarts (PATCH,
//! extensions, a profile, a crash) it reports `monitor_disconnected`, attaches to the new
//! Chromium and reports `monitor_reconnected`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use browser_agent_proto::v1::{DevtoolsState, TelemetryCapture};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::cdp_events::{self, Requests, Target};
use super::settle::Settling;
use super::{Captured, Telemetry};
use crate::cdp_client::{CdpClient, Incoming};
use crate::chromium::BrowserState;

/// Pause before trying DevTools again after a failed connection.
const RETRY: Duration = Duration::from_secs(1);

/// How often the visible tab is captured when `screenshot` is on.
const SCREENSHOT_EVERY: Duration = Duration::from_secs(10);
/// How soon a screenshot is tried again when no page was attached.
const NO_PAGE_RETRY: Duration = Duration::from_secs(1);
/// A screenshot larger than this (base64) is reported without its image.
const MAX_SCREENSHOT_BASE64: usize = 1024 * 1024;

pub fn any_cdp_category(capture: &TelemetryCapture) -> bool {
    capture.console || capture.network || capture.page || capture.interaction || capture.screenshot
}

/// The DevTools domains `capture` needs in each attached page.
fn domains(capture: &TelemetryCapture) -> Vec<(&'static str, Value)> {
    let mut domains = Vec::new();
    if capture.console {
        domains.push(("Runtime.enable", json!({})));
    }
    if capture.network {
        // No post data, and as little body buffering as DevTools allows: bodies are
        // never reported.
        domains.push((
            "Network.enable",
            json!({ "maxPostDataSize": 0, "maxResourceBufferSize": 0, "maxTotalBufferSize": 0 }),
        ));
    }
    if capture.page {
        domains.push(("Page.enable", json!({})));
        domains.push((
            "PerformanceTimeline.enable",
            json!({ "eventTypes": ["largest-contentful-paint", "layout-shift"] }),
        ));
    }
    domains
}

/// How one connection to Chromium ended.
enum Ended {
    Shutdown,
    /// No CDP category is captured any more.
    CaptureOff,
    /// Chromium went away (restarted or crashed).
    Lost,
}

pub async fn run(
    telemetry: Arc<Telemetry>, mut browser: watch::Receiver<BrowserState>,
    shutdown: CancellationToken,
) {
    let mut capture = telemetry.capture();
    let mut lost_at: Option<Instant> = None;
    let mut init_failure_reported = false;
    // Kept across reconnections, so a new monitor does not capture again at once.
    let mut next_screenshot = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            wanted = capture.wait_for(any_cdp_category) => if wanted.is_err() { return },
        }
        let url = tokio::select! {
            () = shutdown.cancelled() => return,
            ready = browser.wait_for(|s| s.devtools == DevtoolsState::Ready && !s.browser_ws_url.is_empty()) => match ready {
                Ok(state) => state.browser_ws_url.clone(),
                Err(_) => return,
            },
        };
        let client = match CdpClient::connect(&url).await {
            Ok(client) => client,
            Err(error) => {
                tracing::debug!(%error, "the telemetry monitor could not reach DevTools");
                if !init_failure_reported && lost_at.is_none() {
                    init_failure_reported = true;
                    telemetry
                        .record(monitor_event("monitor_init_failed", json!({ "step": "connect" })));
                }
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        init_failure_reported = false;
        if let Some(lost) = lost_at.take() {
            telemetry.record(monitor_event(
                "monitor_reconnected",
                json!({ "reconnect_duration_ms": lost.elapsed().as_millis() as u64 }),
            ));
        }
        let mut client = client;
        client.only_events(cdp_events::is_wanted);
        let mut monitor = Monitor {
            client,
            telemetry: &telemetry,
            targets: HashMap::new(),
            enabled: HashMap::new(),
            requests: Requests::default(),
            opening: HashSet::new(),
            screenshot_pending: None,
            next_screenshot,
            settling: Settling::default(),
        };
        let ended = monitor.watch(&mut capture, &mut browser, &url, &shutdown).await;
        next_screenshot = monitor.next_screenshot;
        telemetry.applied(None);
        match ended {
            Ended::Shutdown => return,
            Ended::CaptureOff => {}
            Ended::Lost => {
                telemetry.record(monitor_event(
                    "monitor_disconnected",
                    json!({ "reason": "chrome_restarted" }),
                ));
                lost_at = Some(Instant::now());
            }
        }
    }
}

/// Resolves at `deadline`; never without one.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn monitor_event(kind: &'static str, data: Value) -> Captured {
    Captured { category: "monitor", kind, data, source_event: String::new(), truncated: false }
}

struct Monitor<'a> {
    client: CdpClient,
    telemetry: &'a Telemetry,
    /// Attached targets by CDP session.
    targets: HashMap<String, Target>,
    /// The domains enabled in each session.
    enabled: HashMap<String, HashSet<&'static str>>,
    requests: Requests,
    /// Tabs opened blank, reported once they navigate.
    opening: HashSet<String>,
    /// The id of the screenshot command awaiting its answer.
    screenshot_pending: Option<u64>,
    /// When the next screenshot is asked for: `SCREENSHOT_EVERY` after the last one was
    /// reported, so reported screenshots are that far apart however long Chromium takes
    /// to answer (a fixed ticker let a slow answer and a quick one come 8 s apart).
    next_screenshot: tokio::time::Instant,
    /// Pages coming to rest (network idle, layout settled).
    settling: Settling,
}

/// Blank tabs remembered at most while they wait for an address.
const MAX_OPENING_TABS: usize = 256;

/// Chromium's own interface in a headful browser (the omnibox popup, the tab strip's
/// WebUI): pages, but not the user's.
fn is_browser_ui(info: &Value) -> bool {
    let url = info["url"].as_str().unwrap_or_default();
    url.starts_with("chrome-untrusted://")
        || (url.starts_with("chrome://")
            && url
                .trim_start_matches("chrome://")
                .split('/')
                .next()
                .is_some_and(|host| host.ends_with(".top-chrome")))
}

/// Whether a target already has an address worth reporting.
fn has_address(info: &Value) -> bool {
    !matches!(info["url"].as_str(), None | Some("" | "about:blank"))
}

impl Monitor<'_> {
    /// Asks the first page attached for a screenshot (one at a time); its answer comes
    /// with the other incoming messages. With no page yet, it looks again in a second.
    async fn request_screenshot(&mut self) -> Result<(), String> {
        self.next_screenshot = tokio::time::Instant::now() + NO_PAGE_RETRY;
        let page = self
            .targets
            .iter()
            .find(|(_, target)| target.target_type == "page")
            .map(|(session, _)| session.clone());
        if let Some(session) = page {
            let id = self
                .client
                .send(&session, "Page.captureScreenshot", json!({ "format": "png" }))
                .await?;
            self.screenshot_pending = Some(id);
        }
        Ok(())
    }

    fn report_screenshot(&self, answer: &Value) {
        let png = answer["data"].as_str().unwrap_or_default();
        let (data, truncated) = if png.len() > MAX_SCREENSHOT_BASE64 {
            (json!({}), true)
        } else {
            (json!({ "png": png }), false)
        };
        self.telemetry.record(Captured {
            category: "screenshot",
            kind: "monitor_screenshot",
            data,
            source_event: "Page.captureScreenshot".into(),
            truncated,
        });
    }

    fn report_tab(&self, capture: &TelemetryCapture, info: &Value) {
        let params = json!({ "targetInfo": info });
        if let Some(captured) =
            cdp_events::from_browser_event(capture, "Target.targetCreated", &params, None)
        {
            self.telemetry.record(captured);
        }
    }

    async fn watch(
        &mut self, capture: &mut watch::Receiver<TelemetryCapture>,
        browser: &mut watch::Receiver<BrowserState>, url: &str, shutdown: &CancellationToken,
    ) -> Ended {
        let mut current = *capture.borrow_and_update();
        // Waited for: Chromium reports the pages already open before it answers, and
        // their domains are enabled before capture counts as running.
        let setup = [
            ("Target.setDiscoverTargets", json!({ "discover": true })),
            (
                "Target.setAutoAttach",
                json!({ "autoAttach": true, "waitForDebuggerOnStart": false, "flatten": true }),
            ),
        ];
        for (method, params) in setup {
            if self.client.call("", method, params).await.is_err() {
                return Ended::Lost;
            }
        }
        for incoming in self.client.take_queued() {
            if let Incoming::Event(event) = incoming
                && self
                    .handle(&current, &event.session, &event.method, &event.params)
                    .await
                    .is_err()
            {
                return Ended::Lost;
            }
        }
        self.telemetry.applied(Some(current));
        loop {
            let screenshot_due = current.screenshot && self.screenshot_pending.is_none();
            tokio::select! {
                () = shutdown.cancelled() => return Ended::Shutdown,
                () = tokio::time::sleep_until(self.next_screenshot), if screenshot_due => {
                    if self.request_screenshot().await.is_err() {
                        return Ended::Lost;
                    }
                }
                changed = capture.changed() => {
                    if changed.is_err() {
                        return Ended::Shutdown;
                    }
                    current = *capture.borrow_and_update();
                    if !any_cdp_category(&current) {
                        return Ended::CaptureOff;
                    }
                    let sessions: Vec<String> = self.targets.keys().cloned().collect();
                    for session in sessions {
                        if self.enable(&session, &current).await.is_err() {
                            return Ended::Lost;
                        }
                    }
                    self.telemetry.applied(Some(current));
                }
                changed = browser.changed() => {
                    let gone = changed.is_err() || {
                        let state = browser.borrow_and_update();
                        state.devtools != DevtoolsState::Ready || state.browser_ws_url != url
                    };
                    if gone {
                        return Ended::Lost;
                    }
                }
                () = until(self.settling.next_deadline()) => self.report_settled(&current),
                incoming = self.client.next() => match incoming {
                    Err(_) => return Ended::Lost,
                    Ok(Incoming::Answer { id, result }) => {
                        if self.screenshot_pending == Some(id) {
                            self.screenshot_pending = None;
                            self.next_screenshot = tokio::time::Instant::now() + SCREENSHOT_EVERY;
                            if let Ok(answer) = result {
                                self.report_screenshot(&answer);
                            }
                        }
                    }
                    Ok(Incoming::Event(event)) => {
                        if self.handle(&current, &event.session, &event.method, &event.params).await.is_err() {
                            return Ended::Lost;
                        }
                    }
                },
            }
        }
    }

    /// Enables in `session` the domains `capture` needs that are not enabled yet.
    async fn enable(&mut self, session: &str, capture: &TelemetryCapture) -> Result<(), String> {
        let enabled = self.enabled.entry(session.to_owned()).or_default();
        for (method, params) in domains(capture) {
            if enabled.insert(method) {
                self.client.send(session, method, params).await?;
            }
        }
        Ok(())
    }

    async fn handle(
        &mut self, capture: &TelemetryCapture, session: &str, method: &str, params: &Value,
    ) -> Result<(), String> {
        if session.is_empty() {
            return self.handle_browser_event(capture, method, params).await;
        }
        let Some(target) = self.targets.get_mut(session) else {
            return Ok(());
        };
        if let Some(captured) = cdp_events::from_target_event(
            capture,
            method,
            params,
            session,
            target,
            &mut self.requests,
        ) {
            self.telemetry.record(captured);
        }
        self.settling.observe(session, method, params, target.nav_seq, tokio::time::Instant::now());
        Ok(())
    }

    /// The settle events now due, of the categories captured.
    fn report_settled(&mut self, capture: &TelemetryCapture) {
        for settled in self.settling.due(tokio::time::Instant::now()) {
            let Some(target) = self.targets.get(&settled.session) else {
                continue;
            };
            if let Some(captured) =
                cdp_events::settled_event(capture, settled.kind, &settled.session, target)
            {
                self.telemetry.record(captured);
            }
        }
    }

    async fn handle_browser_event(
        &mut self, capture: &TelemetryCapture, method: &str, params: &Value,
    ) -> Result<(), String> {
        match method {
            "Target.attachedToTarget" if is_browser_ui(&params["targetInfo"]) => {}
            "Target.attachedToTarget" => {
                let info = &params["targetInfo"];
                let session = params["sessionId"].as_str().unwrap_or_default().to_owned();
                self.targets.insert(
                    session.clone(),
                    Target {
                        target_id: info["targetId"].as_str().unwrap_or_default().to_owned(),
                        target_type: info["type"].as_str().unwrap_or_default().to_owned(),
                        url: info["url"].as_str().unwrap_or_default().to_owned(),
                        ..Target::default()
                    },
                );
                self.enable(&session, capture).await?;
            }
            "Target.detachedFromTarget" => {
                let session = params["sessionId"].as_str().unwrap_or_default();
                self.targets.remove(session);
                self.enabled.remove(session);
                self.settling.forget(session);
            }
            "Target.targetInfoChanged" => {
                let info = &params["targetInfo"];
                for target in self.targets.values_mut() {
                    if info["targetId"].as_str() == Some(target.target_id.as_str()) {
                        target.url = info["url"].as_str().unwrap_or_default().to_owned();
                    }
                }
                // A tab opened blank reports where it goes once it knows.
                let target_id = info["targetId"].as_str().unwrap_or_default();
                if has_address(info) && self.opening.remove(target_id) {
                    self.report_tab(capture, info);
                }
            }
            "Target.targetCreated" if is_browser_ui(&params["targetInfo"]) => {}
            "Target.targetCreated" if params["targetInfo"]["type"] == "page" => {
                let info = &params["targetInfo"];
                if has_address(info) {
                    self.report_tab(capture, info);
                } else if let Some(target_id) = info["targetId"].as_str()
                    && self.opening.len() < MAX_OPENING_TABS
                {
                    self.opening.insert(target_id.to_owned());
                }
            }
            "Target.targetDestroyed" => {
                self.opening.remove(params["targetId"].as_str().unwrap_or_default());
            }
            _ => {
                let target_id = params["targetId"].as_str();
                let known = self
                    .targets
                    .values()
                    .find(|target| Some(target.target_id.as_str()) == target_id);
                if let Some(captured) =
                    cdp_events::from_browser_event(capture, method, params, known)
                {
                    self.telemetry.record(captured);
                }
            }
        }
        Ok(())
    }
}
