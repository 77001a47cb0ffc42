//! Browser sessions: `POST/GET/DELETE /browsers`, `GET/PATCH/DELETE
//! /browsers/{id_or_name}`.

pub mod cdp;
mod cdp_passthrough;
pub mod computer;
pub mod curl;
pub mod fs;
pub mod fs_upload;
pub mod fs_watch;
pub mod inspector;
pub mod keep_alive;
pub mod live_view;
pub mod logs;
pub mod playwright;
pub mod processes;
pub mod replays;
pub mod telemetry;
pub mod view;
pub mod webmcp;

use std::collections::BTreeMap;

use axum::Json;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

pub use self::view::{BrowserSession, Persistence, PoolRef, browser_view, browser_views};
use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, PathParam, QueryParams, TaggedQuery};
use super::org::Org;
use super::state::AppState;
use crate::api::paging::list_query;
use crate::egress::HostAllowlist;
use crate::sessions::labels::{self, LocationRequest};
use crate::sessions::update::LocationChange;
use crate::sessions::{
    BrowserConfig, NetworkConfig, ProfileReference, ResourceReference, SessionUpdate, Viewport,
    ViewportChange, viewport_problems,
};
use crate::store::{SessionFilter, SessionRecord, SessionStatus};
use crate::telemetry::settings::{self as telemetry_settings, TelemetryRequest};

/// Fields of `POST /browsers`, as the Kernel SDKs send them. Unknown fields are refused
/// so that a typo is not silently ignored.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBrowserRequest {
    /// Launch Chromium with `--headless=new` and no display. Default false.
    pub headless: Option<bool>,
    /// Reduce automation fingerprints. Default false.
    pub stealth: Option<bool>,
    /// Seconds without API calls and without an open CDP connection after which the
    /// session is deleted. Default 60, minimum 10, maximum 259200.
    #[schema(minimum = 10, maximum = 259200)]
    pub timeout_seconds: Option<i64>,
    /// Deprecated: creating with the id of a live session returns that session.
    pub persistence: Option<Persistence>,
    pub viewport: Option<Viewport>,
    /// Start Chromium in kiosk mode (no address bar or tabs).
    pub kiosk_mode: Option<bool>,
    /// GPU acceleration; this server has none, so only `false` is accepted.
    #[schema(schema_with = super::openapi::only_false)]
    pub gpu: Option<bool>,
    /// An unfinished invocation of the organization the browser belongs to (it ends with
    /// it); an action's own key implies its invocation.
    pub invocation_id: Option<String>,
    /// Extensions of the organization's library to load, each by id or by name.
    pub extensions: Option<Vec<ResourceReference>>,
    /// Proxy to route the browser's traffic through.
    pub proxy_id: Option<String>,
    /// Profile to start from, by id or name; with `save_changes` the browser's state is
    /// saved back into it when the session ends.
    pub profile: Option<ProfileReference>,
    /// `allowed_hosts`: the only destinations the browser may reach.
    pub network: Option<NetworkConfig>,
    /// `1GiB` … `16GiB` (default 1GiB headless, 8GiB headful): the browser's session
    /// ends, with a reason, when its VM uses more.
    pub memory: Option<String>,
    /// Chromium enterprise policies for this browser (e.g. `URLBlocklist`); policies for
    /// proxies, extensions and DevTools are this server's.
    #[schema(value_type = Option<Object>)]
    pub chrome_policy: Option<serde_json::Map<String, serde_json::Value>>,
    /// Unique among the organization's live sessions (409 otherwise); the session can be
    /// addressed by it wherever its id is accepted.
    #[schema(schema_with = super::openapi::session_name)]
    pub name: Option<String>,
    /// Up to 50 key/value pairs; `GET /browsers?tags[key]=value` filters on them.
    #[schema(schema_with = super::openapi::tags)]
    pub tags: Option<BTreeMap<String, String>>,
    /// Opened in the browser's first tab before the answer (best effort: a page that
    /// fails to load does not fail the create). Must be allowed by `network`.
    #[schema(schema_with = super::openapi::http_url)]
    pub start_url: Option<String>,
    /// Timezone (IANA) and locale (BCP 47) the browser's pages see.
    pub location: Option<LocationRequest>,
    /// The server's own region (`--region`) or omitted; others are refused.
    pub region: Option<String>,
    /// `{"id"}` or `{"name"}` of a proxy, or `{"mode": "direct" | "default"}` (both mean
    /// no proxy here: this server has no default stealth proxy).
    pub proxy: Option<ProxySelection>,
    /// Telemetry capture: `{"enabled": true}` or per-category settings; omitted, `{}` or
    /// `enabled: false` capture nothing.
    pub telemetry: Option<TelemetryRequest>,
    /// Not supported by this server (a 400 names it).
    #[schema(value_type = Option<Vec<Object>>)]
    pub vaults: Option<serde_json::Value>,
    /// Not supported by this server (it has no GPU browsers; a 400 names it).
    pub video_memory: Option<String>,
}

/// Today's SDK's `proxy`: exactly one of `id`, `name` or `mode`.
#[derive(Clone, Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProxySelection {
    #[schema(value_type = String, min_length = 1)]
    pub id: Option<String>,
    #[schema(value_type = String, min_length = 1)]
    pub name: Option<String>,
    /// `direct` or `default`.
    #[schema(value_type = String, pattern = "^(direct|default)$")]
    pub mode: Option<String>,
}

impl ProxySelection {
    /// The proxy (id or name) it selects, `None` for no proxy.
    pub fn proxy(&self, field: &str) -> Result<Option<String>, String> {
        match (&self.id, &self.name, self.mode.as_deref()) {
            (Some(key), None, None) | (None, Some(key), None) if !key.is_empty() => {
                Ok(Some(key.clone()))
            }
            (None, None, Some("direct" | "default")) => Ok(None),
            (None, None, Some(mode)) => {
                Err(format!("{field}.mode must be direct or default, got {mode:?}"))
            }
            _ => Err(format!("{field} must have exactly one of id, name or mode")),
        }
    }
}

/// A problem for each field of today's SDK this server cannot honour that is set.
pub fn unsupported(fields: &[(&str, bool)]) -> Vec<String> {
    fields
        .iter()
        .filter(|(_, set)| *set)
        .map(|(field, _)| format!("{field} is not supported by this server"))
        .collect()
}

impl CreateBrowserRequest {
    /// The browser's configuration, and the problems of the fields only this route has.
    fn into_config(self, region: &str) -> (BrowserConfig, Option<String>, Vec<String>) {
        let mut problems = unsupported(&[
            ("vaults", self.vaults.is_some()),
            ("video_memory", self.video_memory.is_some()),
        ]);
        if self.gpu == Some(true) {
            problems.push("gpu: this server has no GPU browsers".into());
        }
        if let Some(asked) = self.region.as_deref().filter(|asked| *asked != region) {
            problems.push(format!("region: this server serves {region:?} only, not {asked:?}"));
        }
        let mut proxy_id = self.proxy_id;
        if let Some(selection) = &self.proxy {
            if proxy_id.is_some() {
                problems.push("proxy cannot be combined with proxy_id".into());
            }
            match selection.proxy("proxy") {
                Ok(selected) => proxy_id = proxy_id.or(selected),
                Err(problem) => problems.push(problem),
            }
        }
        let config = BrowserConfig {
            headless: self.headless,
            stealth: self.stealth,
            kiosk_mode: self.kiosk_mode,
            timeout_seconds: self.timeout_seconds,
            viewport: self.viewport,
            extensions: self.extensions,
            proxy_id,
            profile: self.profile,
            network: self.network,
            memory: self.memory,
            chrome_policy: self.chrome_policy,
            start_url: self.start_url,
            location: self.location,
            telemetry: self.telemetry,
        };
        (config, self.persistence.map(|p| p.id), problems)
    }
}

/// The problems of a name and tags given on create or acquire.
pub fn label_problems(name: Option<&str>, tags: Option<&BTreeMap<String, String>>) -> Vec<String> {
    let mut problems: Vec<String> =
        name.and_then(|name| labels::name_problem("name", name)).into_iter().collect();
    if let Some(tags) = tags {
        problems.extend(labels::tag_problems("tags", tags));
    }
    problems
}

/// Create a browser session. Answers once Chromium's DevTools endpoint is ready.
#[utoipa::path(post, path = "/browsers", request_body = CreateBrowserRequest,
    responses((status = 200, body = BrowserSession),
        (status = 429, description = "The organization has its most live browsers", body = ErrorBody),
        (status = 404, description = "A referenced profile, proxy or extension does not exist", body = ErrorBody),
        (status = 409, description = "A referenced proxy cannot be used now, or the name is taken", body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn create(
    org: Org, JsonBody(request): JsonBody<CreateBrowserRequest>,
) -> Result<Json<BrowserSession>, ApiError> {
    let (name, tags) = (request.name.clone(), request.tags.clone());
    let invocation_id = match (&org.invocation_id, &request.invocation_id) {
        (Some(own), _) => Some(own.clone()),
        (None, Some(given)) => {
            if !org.apps.is_unfinished(&org.id, given).await? {
                return Err(ApiError::NotFound(format!(
                    "invocation {given} not found, or it has finished"
                )));
            }
            Some(given.clone())
        }
        (None, None) => None,
    };
    let (config, persistent_id, mut problems) = request.into_config(&org.settings.region);
    org.require(&crate::sessions::referenced(&config)).await?;
    problems.extend(label_problems(name.as_deref(), tags.as_ref()));
    let mut spec = org.sessions.spec(&org.id, &config, persistent_id.as_deref(), problems).await?;
    spec.name = name;
    spec.tags = tags.unwrap_or_default();
    spec.invocation_id = invocation_id.clone();
    let session = org.sessions.create(&org.id, spec).await?;
    if let Some(invocation_id) = &invocation_id {
        // The invocation may have ended while the browser started, after its browsers
        // were ended: this one ends too.
        org.apps.keep_only_while_running(&org.id, invocation_id, &session).await?;
    }
    Ok(Json(browser_view(&org, &session).await?))
}

list_query! {
    /// Unknown parameters are refused: a filter this server does not apply must not look
    /// applied. `tags[key]=value` pairs (deepObject style) filter too, all of them at once.
    pub struct ListQuery {
        /// Case-insensitive search in the session's id and name, its profile's id and name,
        /// its proxy's id and its pool's name.
        pub query: Option<String>,
        /// `active` (default), `deleted` or `all`.
        #[param(pattern = "^(active|deleted|all)$")]
        pub status: Option<String>,
        /// Deprecated: same as `status=all`.
        pub include_deleted: Option<bool>,
        /// Only sessions of this region (every session is in the server's `--region`).
        pub region: Option<String>,
    }
}

/// Sessions read from the store at a time while filtering.
const FILTER_SCAN_BATCH: u32 = 500;

/// List the organization's browser sessions, newest first. Pages with `limit`/`offset`
/// and answers `X-Has-More` and `X-Next-Offset` in the convention of the calling SDK's
/// generation (`api::paging`).
#[utoipa::path(get, path = "/browsers", params(ListQuery),
    responses((status = 200, body = Vec<BrowserSession>)))]
pub async fn list(
    org: Org, paging: super::paging::Paging,
    TaggedQuery { params: query, tags }: TaggedQuery<ListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let filter = match (query.status.as_deref(), query.include_deleted) {
        (Some("active") | None, Some(true)) | (Some("all"), _) => SessionFilter::All,
        (Some("active") | None, _) => SessionFilter::Live,
        (Some("deleted"), _) => SessionFilter::Ended,
        (Some(other), _) => {
            return Err(ApiError::invalid_field(format!(
                "status must be one of active, deleted, all; got {other:?}"
            )));
        }
    };
    let limit = super::list_limit(query.limit)?;
    let offset = query.offset.unwrap_or(0);
    let mut sessions =
        if query.region.as_deref().is_some_and(|region| region != org.settings.region) {
            Vec::new()
        } else if query.query.is_none() && tags.is_empty() {
            org.store.list_sessions(&org.id, filter, limit + 1, offset).await?
        } else {
            // Matches before `offset` are counted, not kept: memory stays one page.
            let mut search = Search::new(query.query.as_deref(), tags);
            let mut page = Vec::new();
            let mut skipped = 0;
            let mut scanned = 0;
            'scan: loop {
                let batch =
                    org.store.list_sessions(&org.id, filter, FILTER_SCAN_BATCH, scanned).await?;
                scanned = scanned.saturating_add(FILTER_SCAN_BATCH);
                let exhausted = batch.len() < FILTER_SCAN_BATCH as usize;
                for session in batch {
                    if !search.matches(&org, &session).await? {
                        continue;
                    }
                    if skipped < offset {
                        skipped += 1;
                    } else {
                        page.push(session);
                        if page.len() > limit as usize {
                            break 'scan;
                        }
                    }
                }
                if exhausted {
                    break;
                }
            }
            page
        };
    let has_more = sessions.len() > limit as usize;
    sessions.truncate(limit as usize);
    let headers = super::page_headers(paging, offset, sessions.len(), has_more);
    Ok((headers, Json(browser_views(&org, &sessions).await?)))
}

/// The `query` and `tags` filters of a listing, with the names of the profiles and
/// pools seen so far.
struct Search {
    needle: Option<String>,
    tags: BTreeMap<String, String>,
    names: std::collections::HashMap<String, Option<String>>,
}

impl Search {
    fn new(query: Option<&str>, tags: BTreeMap<String, String>) -> Self {
        Self { needle: query.map(str::to_lowercase), tags, names: Default::default() }
    }

    async fn matches(
        &mut self, state: &AppState, session: &SessionRecord,
    ) -> Result<bool, ApiError> {
        let tagged =
            self.tags.iter().all(|(key, value)| session.vm_settings.tags.get(key) == Some(value));
        let Some(needle) = self.needle.clone() else {
            return Ok(tagged);
        };
        if !tagged {
            return Ok(false);
        }
        let mut haystack: Vec<String> = [
            Some(&session.id),
            session.name.as_ref(),
            session.proxy_id.as_ref(),
            session.profile.as_ref().map(|p| &p.id),
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
        if let Some(profile) = &session.profile {
            haystack.extend(self.name_of(state, &session.org_id, &profile.id, false).await?);
        }
        if let Some(pool_id) = &session.pool_id {
            haystack.extend(self.name_of(state, &session.org_id, pool_id, true).await?);
        }
        Ok(haystack.iter().any(|text| text.to_lowercase().contains(&needle)))
    }

    /// The name of a profile or pool (looked up once).
    async fn name_of(
        &mut self, state: &AppState, org_id: &str, id: &str, pool: bool,
    ) -> Result<Option<String>, ApiError> {
        if let Some(name) = self.names.get(id) {
            return Ok(name.clone());
        }
        let name = if pool {
            state.store.pool(org_id, id).await?.and_then(|p| p.name)
        } else {
            state.store.profile(org_id, id).await?.and_then(|p| p.name)
        };
        self.names.insert(id.to_owned(), name.clone());
        Ok(name)
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RetrieveQuery {
    /// Also answer a session that has ended (with `deleted_at`).
    pub include_deleted: Option<bool>,
}

/// Get a browser session by id or name.
#[utoipa::path(get, path = "/browsers/{id}", params(RetrieveQuery),
    responses((status = 200, body = BrowserSession)))]
pub async fn retrieve(
    org: Org, PathParam(id_or_name): PathParam<String>,
    QueryParams(query): QueryParams<RetrieveQuery>,
) -> Result<Json<BrowserSession>, ApiError> {
    let session = if query.include_deleted == Some(true) {
        org.session(&id_or_name).await?
    } else {
        org.sessions.live(&org.id, &id_or_name).await?
    };
    Ok(Json(browser_view(&org, &session).await?))
}

/// Fields of `PATCH /browsers/{id_or_name}`; absent fields are left as they are. Fields
/// of today's SDK this server cannot change on a running browser are refused by name.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateBrowserRequest {
    /// A new name (unique among live sessions); `null` removes it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    #[schema(schema_with = super::openapi::new_session_name)]
    pub name: Option<Option<String>>,
    /// Replaces every tag; `{}` or `null` removes them all.
    #[serde(default, deserialize_with = "present")]
    #[schema(schema_with = super::openapi::tags)]
    pub tags: Option<Option<BTreeMap<String, String>>>,
    /// Opened in the browser's first tab before the answer (best effort); `""` leaves
    /// the page as it is.
    #[schema(schema_with = super::openapi::new_start_url)]
    pub start_url: Option<String>,
    pub network: Option<NetworkUpdate>,
    /// A new screen and window size, applied live (headful browsers, not pool browsers).
    pub viewport: Option<ViewportUpdate>,
    /// A new timezone or locale: Chromium restarts cleanly (cookies and storage kept)
    /// and reopens its pages, after the other changes; open CDP connections end.
    pub location: Option<LocationUpdate>,
    /// The proxy to switch to, live: new requests use it at once and open connections
    /// through the old route are closed. `mode` `direct` or `default` goes direct.
    pub proxy: Option<ProxySelection>,
    /// Deprecated form of `proxy`: a proxy id or name; `""` or `null` goes direct.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub proxy_id: Option<Option<String>>,
    /// A profile to load into a browser that has none (409 otherwise): Chromium
    /// restarts with its state and restores its last session; with `save_changes` the
    /// browser's state is saved into it when the session ends.
    pub profile: Option<ProfileReference>,
    /// Enables, disables or changes categories live; omitted or `{}` leaves them.
    pub telemetry: Option<TelemetryRequest>,
    /// Not supported by this server (a 400 names it).
    pub disable_default_proxy: Option<bool>,
}

/// Per field: absent leaves it, a string sets it, `null` returns to the default.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LocationUpdate {
    /// IANA timezone, such as `Europe/Berlin`.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub timezone: Option<Option<String>>,
    /// BCP 47 locale, such as `de-DE`.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    #[schema(pattern = "^[A-Za-z]{2,3}(?:[-_][A-Za-z]{4})?(?:[-_](?:[A-Za-z]{2}|[0-9]{3}))?$")]
    pub locale: Option<Option<String>>,
}

impl LocationUpdate {
    /// The change, with every value checked as on create.
    fn change(self) -> Result<LocationChange, Vec<String>> {
        let checked = labels::location(&LocationRequest {
            timezone: self.timezone.clone().flatten(),
            locale: self.locale.clone().flatten(),
        })?;
        Ok(LocationChange {
            timezone: self.timezone.map(|set| set.and(checked.timezone)),
            locale: self.locale.map(|set| set.and(checked.locale)),
        })
    }
}

/// The viewport a running browser is resized to: its screen (what recordings and
/// screenshots show) and Chromium's window. A browser can grow up to the larger of its
/// size at creation and the server's `--max-resized-viewport`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ViewportUpdate {
    #[schema(minimum = 100, maximum = 7680)]
    pub width: i64,
    #[schema(minimum = 100, maximum = 7680)]
    pub height: i64,
    /// Recorded as the session's refresh rate; unchanged when absent.
    #[schema(minimum = 1, maximum = 240)]
    pub refresh_rate: Option<i64>,
    /// While a recording runs the resize is refused (409) unless this is true: the
    /// recordings are then stopped and go on at the new size as new replays.
    pub force: Option<bool>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkUpdate {
    /// Replaces the browser's allowlist (same entries as on create); `null` removes it.
    /// A browser created without one cannot be given one.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<String>>)]
    pub allowed_hosts: Option<Option<Vec<String>>>,
    /// Not supported by this server (a 400 names it).
    pub expected_allowlist_revision: Option<String>,
}

/// A field that is present, `null` or not: `Some(None)` for `null`.
pub(super) fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

impl UpdateBrowserRequest {
    /// The update, or every problem of the request at once.
    fn into_update(self, session: &SessionRecord) -> Result<SessionUpdate, ApiError> {
        let mut problems =
            unsupported(&[("disable_default_proxy", self.disable_default_proxy.is_some())]);
        let network = self.network.unwrap_or_default();
        if network.expected_allowlist_revision.is_some() {
            problems
                .push("network.expected_allowlist_revision is not supported by this server".into());
        }
        let allowed_hosts = match network.allowed_hosts {
            None => None,
            Some(None) => Some(None),
            Some(Some(hosts)) => match HostAllowlist::parse(&hosts) {
                Ok(allowed) => Some(Some(allowed)),
                Err(problem) => {
                    problems.push(format!("network.{problem}"));
                    None
                }
            },
        };
        let mut proxy = self.proxy_id.map(|proxy_id| proxy_id.filter(|id| !id.is_empty()));
        if let Some(selection) = &self.proxy {
            if proxy.is_some() {
                problems.push("proxy cannot be combined with proxy_id".into());
            }
            match selection.proxy("proxy") {
                Ok(selected) => proxy = Some(selected),
                Err(problem) => problems.push(problem),
            }
        }
        let name = self.name.map(|name| name.filter(|name| !name.is_empty()));
        if let Some(Some(name)) = &name {
            problems.extend(labels::name_problem("name", name));
        }
        let tags = self.tags.map(Option::unwrap_or_default);
        if let Some(tags) = &tags {
            problems.extend(labels::tag_problems("tags", tags));
        }
        let start_url = self.start_url.filter(|url| !url.is_empty());
        if let Some(url) = &start_url {
            // Checked against the allowlist the browser will have after this update.
            let current = session
                .vm_settings
                .allowed_hosts
                .as_deref()
                .map(HostAllowlist::parse)
                .and_then(Result::ok);
            let effective = match &allowed_hosts {
                Some(new) => new.as_ref(),
                None => current.as_ref(),
            };
            problems.extend(labels::start_url_problem(url, effective));
        }
        let viewport = self.viewport.and_then(|viewport| {
            let mut wrong =
                viewport_problems(viewport.width, viewport.height, viewport.refresh_rate);
            if session.headless {
                wrong.push(
                    "viewport: changing a headless browser's viewport is not supported by this \
                     server"
                        .into(),
                );
            }
            if !wrong.is_empty() {
                problems.extend(wrong);
                return None;
            }
            Some(ViewportChange {
                width: viewport.width as u32,
                height: viewport.height as u32,
                refresh_rate: viewport.refresh_rate,
                force: viewport.force.unwrap_or(false),
            })
        });
        let location = self
            .location
            .and_then(|location| location.change().map_err(|wrong| problems.extend(wrong)).ok());
        let profile = self.profile.and_then(|reference| {
            let by = ResourceReference { id: reference.id, name: reference.name };
            let key = by.key().map(str::to_owned);
            if key.is_none() {
                problems.push("profile must have exactly one of id or name".into());
            }
            key.map(|key| (key, reference.save_changes.unwrap_or(false)))
        });
        if let Err(wrong) = telemetry_settings::on_update(
            session.vm_settings.telemetry.as_ref(),
            self.telemetry.as_ref(),
        ) {
            problems.extend(wrong);
        }
        if !problems.is_empty() {
            return Err(ApiError::invalid_fields(problems));
        }
        Ok(SessionUpdate {
            telemetry: self.telemetry,
            location,
            profile,
            name,
            tags,
            allowed_hosts,
            proxy,
            viewport,
            start_url,
        })
    }
}

/// What an update refers to, as `sessions::referenced` for a create.
fn update_references(update: &SessionUpdate) -> Vec<(&'static str, String, &'static str)> {
    let mut referenced = Vec::new();
    if let Some(Some(proxy)) = &update.proxy {
        referenced.push(("proxies", proxy.clone(), "read"));
    }
    if let Some((profile, save_changes)) = &update.profile {
        referenced.push(("profiles", profile.clone(), if *save_changes { "write" } else { "use" }));
    }
    if let Some(destination) = update.telemetry.as_ref().and_then(TelemetryRequest::destination) {
        referenced.push(("telemetry_destinations", destination, "read"));
    }
    referenced
}

/// Update a running browser: its name and tags, its proxy or `network.allowed_hosts`
/// (new requests follow them at once; open connections they no longer allow, or that
/// went another way, are closed), or open `start_url`.
#[utoipa::path(patch, path = "/browsers/{id}", request_body = UpdateBrowserRequest,
    responses((status = 200, body = BrowserSession), (status = 409, body = ErrorBody)))]
pub async fn update(
    org: Org, PathParam(id_or_name): PathParam<String>,
    JsonBody(request): JsonBody<UpdateBrowserRequest>,
) -> Result<Json<BrowserSession>, ApiError> {
    let session = org.sessions.live(&org.id, &id_or_name).await?;
    let update = request.into_update(&session)?;
    org.require(&update_references(&update)).await?;
    let session = org.sessions.update(&session, update).await?;
    Ok(Json(browser_view(&org, &session).await?))
}

/// Delete a browser session: Chromium, its display and its agent are stopped and reaped
/// before the answer.
#[utoipa::path(delete, path = "/browsers/{id}", responses((status = 204)))]
pub async fn delete(
    org: Org, PathParam(id_or_name): PathParam<String>,
) -> Result<StatusCode, ApiError> {
    let session = org.sessions.live(&org.id, &id_or_name).await?;
    end_requested(&org, &session).await
}

async fn end_requested(state: &AppState, session: &SessionRecord) -> Result<StatusCode, ApiError> {
    if state.sessions.end(session, "deleted by the API").await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        // Ended concurrently (another delete or the inactivity timeout).
        Err(ApiError::not_found("browser session", &session.id))
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeletePersistentQuery {
    /// The `persistence.id` the session was created with.
    #[param(required = true, min_length = 1)]
    pub persistent_id: Option<String>,
}

/// Deprecated (use `DELETE /browsers/{id}`): delete the live session that has this
/// persistent id. Answers a `Deprecation` header.
#[utoipa::path(delete, path = "/browsers", params(DeletePersistentQuery),
    responses((status = 204), (status = 404, body = ErrorBody)))]
#[deprecated]
pub async fn delete_by_persistent_id(
    org: Org, QueryParams(query): QueryParams<DeletePersistentQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let deprecation =
        [("deprecation", "true"), ("link", "</browsers/{id}>; rel=\"successor-version\"")];
    let persistent_id = query
        .persistent_id
        .filter(|id| !id.is_empty())
        .ok_or_else(|| ApiError::invalid_field("persistent_id: the query parameter is required"))?;
    let result = async {
        let session = org
            .store
            .live_session_by_persistent_id(&org.id, &persistent_id)
            .await?
            .filter(|s| s.status != SessionStatus::Ended)
            .ok_or_else(|| {
                ApiError::NotFound(format!(
                    "no live browser session with persistent id {persistent_id}"
                ))
            })?;
        end_requested(&org, &session).await
    }
    .await;
    Ok((deprecation, result))
}
