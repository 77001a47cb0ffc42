//! Changing a running session: its name, tags, proxy and network allowlist, and opening
//! a URL in it (`start_url` on create, acquire and update).

use std::collections::BTreeMap;
use std::time::Duration;

use super::Sessions;
use crate::agent::AgentError;
use crate::agent::page::Page;
use crate::egress::HostAllowlist;
use crate::error::{ServiceError, ServiceResult};
use crate::replicas::Signal;
use crate::store::{
    PoolLease, SessionLocation, SessionProfile, SessionRecord, SessionStatus, StoreError,
};
use crate::telemetry::TelemetrySettings;
use crate::telemetry::settings::{self as telemetry, TelemetryRequest};

/// How long opening a start URL may hold the answer. Navigation is best effort, as the
/// SDK documents: a page that does not load in time does not fail the call.
const START_URL_WAIT: Duration = Duration::from_secs(15);

/// What to change; `None` leaves a field as it is. Every value is already validated.
#[derive(Debug, Default)]
pub struct SessionUpdate {
    /// `Some(None)` removes the name.
    pub name: Option<Option<String>>,
    /// Replaces every tag (an empty map removes them all).
    pub tags: Option<BTreeMap<String, String>>,
    /// `Some(None)` removes the allowlist.
    pub allowed_hosts: Option<Option<HostAllowlist>>,
    /// The proxy (id or name) to switch to; `Some(None)` goes direct.
    pub proxy: Option<Option<String>>,
    /// A new screen and window size, applied live.
    pub viewport: Option<ViewportChange>,
    /// A new timezone or locale (validated), applied by a clean restart of Chromium.
    pub location: Option<LocationChange>,
    /// A profile (id or name, and `save_changes`) to load into a browser that has none.
    pub profile: Option<(String, bool)>,
    /// Opened in the browser's first tab once the rest is applied.
    pub start_url: Option<String>,
    /// Telemetry categories and export to change (checked against the current ones).
    pub telemetry: Option<TelemetryRequest>,
}

/// A validated `location` of an update: per field, `None` leaves it as it is and
/// `Some(None)` returns it to the default.
#[derive(Debug, Default)]
pub struct LocationChange {
    pub timezone: Option<Option<String>>,
    pub locale: Option<Option<String>>,
}

impl LocationChange {
    /// The location a session has after this change.
    fn applied_to(&self, current: Option<&SessionLocation>) -> Option<SessionLocation> {
        let current = current.cloned().unwrap_or_default();
        let location = SessionLocation {
            timezone: self.timezone.clone().unwrap_or(current.timezone),
            locale: self.locale.clone().unwrap_or(current.locale),
        };
        (location != SessionLocation::default()).then_some(location)
    }
}

/// A validated `viewport` of an update.
#[derive(Debug)]
pub struct ViewportChange {
    pub width: u32,
    pub height: u32,
    /// Kept as it was when `None`.
    pub refresh_rate: Option<i64>,
    /// Stop running recordings and record the new size as new replays, rather than
    /// refuse the change while one runs.
    pub force: bool,
}

impl Sessions {
    /// Applies the update to a running session and answers it as it is now. Updates are
    /// serialized and start from the stored record, so none undoes another. A pool
    /// browser changes only while leased (its lessee's changes end with the lease).
    pub async fn update(
        &self, session: &SessionRecord, update: SessionUpdate,
    ) -> ServiceResult<SessionRecord> {
        if session.pool_id.is_some() && update.proxy.is_some() {
            return Err(ServiceError::Conflict(
                "proxy: a pool browser uses its pool's proxy (change the pool's proxy_id)".into(),
            ));
        }
        let adds_egress_rules =
            matches!(update.proxy, Some(Some(_))) || matches!(update.allowed_hosts, Some(Some(_)));
        if let (true, Err(why)) = (adds_egress_rules, self.runtime.capabilities().egress_rules) {
            return Err(ServiceError::Invalid(vec![why]));
        }
        if session.pool_id.is_some() {
            // What a pool's reset could not take back stays the pool's.
            for (field, changed) in [
                ("viewport", update.viewport.is_some()),
                ("location", update.location.is_some()),
                ("profile", update.profile.is_some()),
            ] {
                if changed {
                    return Err(ServiceError::Conflict(format!(
                        "{field}: a pool browser has its pool's {field} (change the pool)"
                    )));
                }
            }
        }
        let profile = match &update.profile {
            Some((key, save_changes)) => {
                Some(self.profile_to_load(session, key, *save_changes).await?)
            }
            None => None,
        };
        // Resolved (the custom proxy's host looked up) before anything changes.
        let proxy = match &update.proxy {
            Some(Some(key)) => Some(Some(self.resolve_proxy(&session.org_id, key).await?)),
            Some(None) => Some(None),
            None => None,
        };
        let serialized = self.settings_lock.lock().await;
        let session = &self.current(session).await?;
        if session.status != SessionStatus::Running {
            return Err(ServiceError::Conflict(
                "the browser is still starting; change it once it runs".into(),
            ));
        }
        if session.pool_id.is_some() && session.pool_lease != Some(PoolLease::Leased) {
            return Err(ServiceError::Conflict(
                "a pool browser can be changed only while it is leased".into(),
            ));
        }
        let mut updated = session.clone();
        if let Some(name) = update.name {
            updated.name = name;
        }
        if let Some(tags) = update.tags {
            updated.vm_settings.tags = tags;
        }
        if let Some(allowed_hosts) = &update.allowed_hosts {
            // Only an allowlist the browser has can be changed: one created without (or
            // whose list was removed) cannot be given one, as the SDK documents.
            if session.vm_settings.allowed_hosts.is_none() && allowed_hosts.is_some() {
                return Err(ServiceError::invalid(
                    "network.allowed_hosts: a browser without an allowlist cannot be given one \
                     (create it with network.allowed_hosts)",
                ));
            }
            updated.vm_settings.allowed_hosts = allowed_hosts.as_ref().map(|a| a.hosts().to_vec());
        }
        if let Some(url) = &update.start_url {
            updated.vm_settings.start_url = Some(url.clone());
        }
        if update.telemetry.is_some() {
            updated.vm_settings.telemetry =
                self.telemetry_update(session, update.telemetry.as_ref()).await?;
        }
        if let Some(proxy) = &proxy {
            updated.proxy_id = proxy.as_ref().map(|(id, _)| id.clone());
        }
        if let Some(location) = &update.location {
            updated.vm_settings.location =
                location.applied_to(session.vm_settings.location.as_ref());
        }
        // First, as the one change that can still be refused (too large, recording).
        if let Some(viewport) = &update.viewport {
            self.resize(session, viewport).await?;
            updated.viewport_width = i64::from(viewport.width);
            updated.viewport_height = i64::from(viewport.height);
            updated.viewport_refresh_rate = viewport.refresh_rate.or(session.viewport_refresh_rate);
            self.store
                .set_session_viewport(
                    &session.id,
                    updated.viewport_width,
                    updated.viewport_height,
                    updated.viewport_refresh_rate,
                )
                .await?;
            self.changed(&session.id).await;
        }
        // The viewport is stored above; these are what `store_settings` writes.
        let settings =
            |s: &SessionRecord| (s.name.clone(), s.proxy_id.clone(), s.vm_settings.clone());
        if settings(&updated) != settings(session) {
            self.store_settings(&updated).await?;
            if updated.vm_settings.telemetry != session.vm_settings.telemetry {
                self.telemetry.settings_changed();
            }
        }
        // Applied where the VM's egress is served: here, or by the replica that serves it.
        let egress_changed = Signal::EgressChanged {
            org_id: session.org_id.clone(),
            session_id: session.id.clone(),
            allowlist: update.allowed_hosts.is_some(),
            proxy: proxy.is_some(),
        };
        if let Some(allowed_hosts) = update.allowed_hosts {
            self.runtime.set_allowed_hosts(&session.id, allowed_hosts);
        }
        if let Some(proxy) = proxy {
            self.runtime.set_upstream(&session.id, proxy.map(|(_, route)| route));
        }
        if !self.replica.owns(session)
            && matches!(egress_changed, Signal::EgressChanged { allowlist, proxy, .. } if allowlist || proxy)
        {
            self.replica.publish(egress_changed).await;
        }
        // Both restart Chromium; they come last, as the SDK documents, the location
        // first so that a profile loaded with it starts in it.
        if updated.vm_settings.location != session.vm_settings.location {
            let location = updated.vm_settings.location.clone().unwrap_or_default();
            self.agent(session)?
                .relaunch(location.timezone.as_deref(), location.locale.as_deref())
                .await?;
        }
        if let Some((profile, archive)) = profile {
            self.load_profile(session, &profile, archive).await?;
            updated.profile = Some(profile);
        }
        // Navigation may take a while; other updates need not wait for it.
        drop(serialized);
        if let Some(url) = &update.start_url {
            self.open_url(&updated, url).await;
        }
        Ok(updated)
    }

    /// The profile a browser without one is to load, and its stored state (`None` while
    /// it has none).
    async fn profile_to_load(
        &self, session: &SessionRecord, key: &str, save_changes: bool,
    ) -> ServiceResult<(SessionProfile, Option<std::path::PathBuf>)> {
        if let Some(loaded) = &session.profile {
            return Err(ServiceError::Conflict(format!(
                "profile: this browser already has profile {} loaded",
                loaded.id
            )));
        }
        let profile = self.store.profile(&session.org_id, key).await?.ok_or_else(|| {
            ServiceError::NotFound(format!("profile: no profile {key:?} in this organization"))
        })?;
        let archive = self.profiles.launch_archive(&profile);
        Ok((SessionProfile { id: profile.id, save_changes }, archive))
    }

    /// Loads the profile's state into the browser (Chromium restarts with it) and
    /// records the profile as the session's, to be saved at its end with
    /// `save_changes`. A profile without state yet has nothing to load: the browser
    /// goes on as it is, and its state becomes the profile's.
    async fn load_profile(
        &self, session: &SessionRecord, profile: &SessionProfile,
        archive: Option<std::path::PathBuf>,
    ) -> ServiceResult<()> {
        if let Some(archive) = archive {
            let file = tokio::fs::File::open(&archive).await.map_err(|error| {
                ServiceError::Internal(anyhow::anyhow!("opening the profile's state: {error}"))
            })?;
            self.agent(session)?.load_profile(file).await?;
        }
        if !self.store.set_session_profile(&session.id, profile).await? {
            return Err(ServiceError::Conflict(
                "profile: this browser ended or was given a profile meanwhile".into(),
            ));
        }
        if let Err(error) = self.store.mark_profile_used(&profile.id, chrono::Utc::now()).await {
            tracing::warn!(%error, profile_id = %profile.id, "could not record the profile's use");
        }
        self.changed(&session.id).await;
        Ok(())
    }

    /// Resizes the browser's screen and window. While a recording runs this is refused,
    /// unless `force`: the recordings then end and go on as new replays at the new size.
    async fn resize(
        &self, session: &SessionRecord, viewport: &ViewportChange,
    ) -> ServiceResult<()> {
        let agent = self.agent(session)?;
        let resize = async {
            agent.resize_screen(viewport.width, viewport.height).await.map_err(
                |error| match error {
                    AgentError::InvalidArgument(message) => {
                        ServiceError::invalid(format!("viewport: {message}"))
                    }
                    other => other.into(),
                },
            )
        };
        if viewport.force {
            return self.replays.split_around(session, &agent, resize).await;
        }
        if let Some(replay) = self.replays.recording(session).await?.first() {
            return Err(ServiceError::Conflict(format!(
                "viewport: replay {} is recording; stop it first, or set viewport.force to \
                 end it and record the new size as a new replay",
                replay.id
            )));
        }
        resize.await
    }

    /// Runs `change` on the stored record of a live session (not a cached copy) and stores
    /// what it returns, serialized with every other update.
    /// A session's telemetry settings after `request`, its destination looked up.
    async fn telemetry_update(
        &self, session: &SessionRecord, request: Option<&TelemetryRequest>,
    ) -> ServiceResult<Option<TelemetrySettings>> {
        let current = session.vm_settings.telemetry.as_ref();
        let resolved = telemetry::on_update(current, request).map_err(ServiceError::Invalid)?;
        let Some(mut settings) = resolved.settings else {
            return Ok(None);
        };
        match resolved.export {
            None => {}
            Some(None) => settings.destination = None,
            Some(Some(reference)) => {
                let key = reference.id.or(reference.name).unwrap_or_default();
                settings.destination =
                    Some(self.telemetry_destination(&session.org_id, &key).await?);
            }
        }
        if !settings.storage && settings.destination.is_none() {
            return Err(ServiceError::invalid(
                "telemetry.export.otlp: a browser that does not store its telemetry must keep exporting it",
            ));
        }
        Ok(Some(settings))
    }

    pub async fn change_settings(
        &self, session: &SessionRecord,
        change: impl FnOnce(&SessionRecord) -> ServiceResult<SessionRecord>,
    ) -> ServiceResult<SessionRecord> {
        let _serialized = self.settings_lock.lock().await;
        let current = self.current(session).await?;
        let changed = change(&current)?;
        if changed != current {
            self.store_settings(&changed).await?;
        }
        Ok(changed)
    }

    /// The stored record of a live session.
    async fn current(&self, session: &SessionRecord) -> ServiceResult<SessionRecord> {
        match self.store.session(&session.org_id, &session.id).await? {
            Some(current) if current.status != SessionStatus::Ended => Ok(current),
            _ => Err(ServiceError::NotFound(format!("browser session {} not found", session.id))),
        }
    }

    /// Stores a live session's name and settings, and drops its cached copy.
    async fn store_settings(&self, session: &SessionRecord) -> ServiceResult<()> {
        let stored = self
            .store
            .set_session_settings(
                &session.id,
                session.name.as_deref(),
                session.proxy_id.as_deref(),
                &session.vm_settings,
            )
            .await
            .map_err(|error| match error {
                StoreError::Conflict(_) => name_taken(session.name.as_deref().unwrap_or_default()),
                other => other.into(),
            })?;
        if !stored {
            return Err(ServiceError::NotFound(format!(
                "browser session {} not found",
                session.id
            )));
        }
        self.changed(&session.id).await;
        Ok(())
    }

    /// Opens the URL in the browser's first tab, waiting (a bounded time) for it to
    /// commit. Best effort: a failure is logged, not answered.
    pub async fn open_url(&self, session: &SessionRecord, url: &str) {
        let open = async {
            let agent = self.agent(session)?;
            let page = Page::attach(&agent).await?;
            page.navigate(url).await
        };
        // The whole of it bounded: attaching too, whatever the agent does.
        let opened = tokio::time::timeout(START_URL_WAIT, open)
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("it did not load within {START_URL_WAIT:?}")));
        if let Err(error) = opened {
            tracing::info!(session_id = %session.id, error = format!("{error:#}"), "start_url did not open");
        }
    }
}

/// The answer to a name another live session of the organization has.
pub fn name_taken(name: &str) -> ServiceError {
    ServiceError::Conflict(format!("name: another live browser session is named {name:?}"))
}
