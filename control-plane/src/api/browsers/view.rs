//! A browser session as the Kernel SDKs read it, built from its record plus what it
//! refers to (its profile and pool, looked up once per answer).

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::api::error::ApiError;
use crate::api::org::Org;
use crate::api::resources::profiles::Profile;
use crate::api::state::AppState;
use crate::sessions::labels::LocationView;
use crate::sessions::{NetworkConfig, Viewport};
use crate::store::SessionRecord;

/// The seed's persistence of a session (`persistence: {id}`), as it was given.
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Persistence {
    #[schema(min_length = 1, max_length = 255)]
    pub id: String,
}

/// A browser session as the Kernel SDKs read it.
#[derive(Debug, Serialize, ToSchema)]
pub struct BrowserSession {
    pub session_id: String,
    /// WebSocket URL for Playwright `connect_over_cdp` / Puppeteer `connect`; carries a
    /// token valid for this session while it lives.
    pub cdp_ws_url: String,
    /// WebSocket URL for WebDriver BiDi clients (Selenium, Puppeteer with
    /// `protocol: 'webDriverBiDi'`); the same token as `cdp_ws_url`.
    pub webdriver_ws_url: String,
    /// Base of this session's own routes (`<base_url>/curl/raw`, `/computer/…`, …), which
    /// accept the token of `cdp_ws_url` as `?jwt=` instead of an API key.
    pub base_url: String,
    /// The live view: a page showing the browser's screen that the viewer can use (mouse,
    /// keyboard, paste), valid while the session lives. Headful sessions only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub browser_live_view_url: Option<String>,
    /// The same view, watch only: the viewer's input is ignored. Headful sessions only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub browser_live_view_read_only_url: Option<String>,
    /// The session inspector: its telemetry (timeline, console, network) beside its
    /// replays, without an API key, for 24 hours from this response. Live and ended
    /// sessions alike.
    pub inspector_url: String,
    pub created_at: DateTime<Utc>,
    pub headless: bool,
    pub stealth: bool,
    pub timeout_seconds: i64,
    pub kiosk_mode: bool,
    pub gpu: bool,
    /// The server's region (`--region`).
    pub region: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistence: Option<Persistence>,
    pub viewport: Viewport,
    /// Set once the session has ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<DateTime<Utc>>,
    /// Why the session ended, once it has (`include_deleted=true`): deleted by request,
    /// timed out, or ended by its VM (its memory limit, a crash), as the service saw it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<String>,
    /// The active telemetry configuration (`BrowserTelemetryConfig`), once enabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub telemetry: Option<serde_json::Value>,
    /// Unique among the organization's live sessions; usable wherever the id is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Omitted when the session has none.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// The URL the session was last asked to open (what was requested, not what loaded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_url: Option<String>,
    /// Timezone and locale the browser's pages see, with where each came from.
    pub location: LocationView,
    /// The proxy the browser's traffic goes through (kept if the proxy is deleted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_id: Option<String>,
    /// The pool the browser belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolRef>,
    /// The profile the browser started from (omitted if it has since been deleted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,
    /// Whether the browser's state is saved back into its profile when the session ends.
    /// Omitted when no profile is attached.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile_save_changes: Option<bool>,
    /// Omitted when the session has no network configuration.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub chrome_policy: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct PoolRef {
    pub id: String,
    pub name: Option<String>,
}

/// The profiles and pools the sessions of one answer refer to.
#[derive(Default)]
struct Referenced {
    profiles: HashMap<String, Profile>,
    pools: HashMap<String, PoolRef>,
}

/// The answer for each session, in order.
/// A caller whose policy lets it look at a browser but not drive it gets no URLs that
/// carry a token (`cdp_ws_url`, `webdriver_ws_url` are empty, no live view): a token
/// drives the browser.
pub async fn browser_views(
    org: &Org, sessions: &[SessionRecord],
) -> Result<Vec<BrowserSession>, ApiError> {
    let state: &AppState = org;
    let mut referenced = Referenced::default();
    for session in sessions {
        if let Some(profile) = &session.profile
            && !referenced.profiles.contains_key(&profile.id)
            && let Some(record) = state.store.profile(&session.org_id, &profile.id).await?
        {
            referenced.profiles.insert(profile.id.clone(), record.into());
        }
        if let Some(pool_id) = &session.pool_id
            && !referenced.pools.contains_key(pool_id)
        {
            let name = state.store.pool(&session.org_id, pool_id).await?.and_then(|pool| pool.name);
            referenced.pools.insert(pool_id.clone(), PoolRef { id: pool_id.clone(), name });
        }
    }
    let mut views = Vec::with_capacity(sessions.len());
    for session in sessions {
        let may_drive = org.allows("browsers", "use", &session.id).await?;
        views.push(view(state, session, &referenced, may_drive));
    }
    Ok(views)
}

/// The answer for one session.
pub async fn browser_view(org: &Org, session: &SessionRecord) -> Result<BrowserSession, ApiError> {
    let mut views = browser_views(org, std::slice::from_ref(session)).await?;
    views.pop().ok_or_else(|| ApiError::Internal(anyhow::anyhow!("no view of the session")))
}

fn view(
    state: &AppState, session: &SessionRecord, referenced: &Referenced, may_drive: bool,
) -> BrowserSession {
    let token = may_drive.then(|| {
        state.tokens.issue_cdp(&session.id, &session.org_id, session.pool_lease_id.as_deref())
    });
    let socket_url = |route: &str| match &token {
        Some(token) => {
            format!("{}/browsers/{}/{route}?jwt={token}", state.public_ws_url(), session.id)
        }
        None => String::new(),
    };
    let settings = &session.vm_settings;
    let live_view =
        super::live_view::urls(state, session).filter(|_| session.ended_at.is_none() && may_drive);
    BrowserSession {
        session_id: session.id.clone(),
        cdp_ws_url: socket_url("cdp"),
        webdriver_ws_url: socket_url("webdriver"),
        base_url: format!(
            "{}/browsers/{}",
            state.settings.public_url.trim_end_matches('/'),
            session.id
        ),
        browser_live_view_read_only_url: live_view.as_ref().map(|(_, read_only)| read_only.clone()),
        browser_live_view_url: live_view.map(|(interactive, _)| interactive),
        inspector_url: super::inspector::url(state, session),
        created_at: session.created_at,
        headless: session.headless,
        stealth: session.stealth,
        timeout_seconds: session.timeout_seconds,
        kiosk_mode: session.kiosk_mode,
        gpu: false,
        region: state.settings.region.clone(),
        persistence: session.persistent_id.clone().map(|id| Persistence { id }),
        viewport: Viewport {
            width: session.viewport_width,
            height: session.viewport_height,
            refresh_rate: session.viewport_refresh_rate,
        },
        deleted_at: session.ended_at,
        end_reason: session.end_reason.clone(),
        telemetry: settings.telemetry.as_ref().map(|t| t.view()),
        name: session.name.clone(),
        tags: settings.tags.clone(),
        start_url: settings.start_url.clone(),
        location: LocationView::of(settings.location.as_ref()),
        proxy_id: session.proxy_id.clone(),
        pool: session.pool_id.as_ref().and_then(|id| referenced.pools.get(id).cloned()),
        profile: session.profile.as_ref().and_then(|p| referenced.profiles.get(&p.id).cloned()),
        profile_save_changes: session.profile.as_ref().map(|p| p.save_changes),
        network: settings.allowed_hosts.clone().map(|allowed_hosts| NetworkConfig {
            allowed_hosts: Some(allowed_hosts),
            ..Default::default()
        }),
        memory: settings.memory.clone(),
        chrome_policy: settings.chrome_policy.clone(),
    }
}
