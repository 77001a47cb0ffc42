//! The login flow's steps: find the form, wait for (or supply) values, submit them and
//! judge the page that follows, then save the profile on success.

use std::time::Duration;

use chrono::Utc;

use super::{PAGE_SETTLE_TIMEOUT, Workflow};
use crate::credentials::LoginValues;
use crate::credentials::onepassword::ItemLookup;
use crate::error::{ServiceError, ServiceResult};
use crate::managed_auth::document::strip_query;
use crate::managed_auth::page::{Assessment, DiscoveredField};
use crate::managed_auth::vault::Credentials;
use crate::managed_auth::{AuthStatus, FlowStatus, FlowStep, FlowType};

/// How long a submission may take to leave the login page.
const SUBMIT_NAVIGATION_WAIT: Duration = Duration::from_secs(10);
/// Steps of one flow filled from a credential (password, one-time code, a further
/// check) before the flow waits for a person: a site that keeps asking is not retried.
const MAX_AUTOMATIC_STEPS: u32 = 4;

/// The value a field gets without a person: a one-time code from the credential's TOTP
/// seed; else the credential's value of the same name, or of the field's kind (password,
/// email, user name); else a value saved from an earlier login under the field's name.
fn value_for(
    field: &DiscoveredField, credential: &LoginValues, saved: &Credentials,
) -> Option<String> {
    if field.is_one_time() {
        return credential.totp.as_ref().map(|totp| totp.code.clone());
    }
    let value = |key: &str| {
        credential
            .values
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(key))
            .map(|(_, value)| value.clone())
    };
    let hint = format!("{} {}", field.name, field.label).to_lowercase();
    let by_kind = || match field.kind.as_str() {
        "password" => value("password"),
        "email" => value("email").or_else(|| value("username")),
        _ if ["user", "login", "email", "account"].iter().any(|word| hint.contains(word)) => {
            value("username").or_else(|| value("email"))
        }
        _ => None,
    };
    value(&field.name).or_else(by_kind).or_else(|| saved.get(&field.name).cloned())
}

impl Workflow {
    /// The discovered fields paired with the submitted values, or why not.
    pub(super) fn check_submission(
        &self, fields: &Credentials,
    ) -> ServiceResult<Vec<(DiscoveredField, String)>> {
        let Some(flow) = self.document.flow_in_progress() else {
            return Err(ServiceError::Conflict(
                "no login flow is in progress; start one with login".into(),
            ));
        };
        if flow.expires_at <= Utc::now() {
            return Err(ServiceError::Conflict("the login flow has expired".into()));
        }
        if flow.step != FlowStep::AwaitingInput {
            return Err(ServiceError::Conflict(format!(
                "the login flow is not waiting for input (step {:?})",
                flow.step
            )));
        }
        let discovered = flow.discovered_fields.clone().unwrap_or_default();
        let mut problems = Vec::new();
        for name in fields.keys() {
            if !discovered.iter().any(|field| &field.name == name) {
                problems.push(format!("fields.{name}: not a field of this login form"));
            }
        }
        for field in &discovered {
            if (field.required || field.kind == "password") && !fields.contains_key(&field.name) {
                problems.push(format!("fields.{}: required", field.name));
            }
        }
        if !problems.is_empty() {
            return Err(ServiceError::Invalid(problems));
        }
        Ok(discovered
            .into_iter()
            .filter_map(|field| fields.get(&field.name).map(|value| (field.clone(), value.clone())))
            .collect())
    }

    /// Opens (or, after a restart, re-attaches to) the flow's browser and finds the login
    /// form: then waits for input, or submits saved values, or finishes.
    pub(super) async fn discover(&mut self) {
        if let Some(flow) = self.flow_mut() {
            flow.step = FlowStep::Discovering;
            flow.discovered_fields = None;
        }
        self.save().await;
        let reused = self.flow_mut().and_then(|flow| flow.session_id.clone());
        if let Err(error) = self.open_browser(reused.as_deref(), true).await {
            return self.fail("browser_failed", &format!("{error:#}")).await;
        }
        if let Some(session_id) = self.browser.as_ref().map(|b| b.session.id.clone())
            && let Some(flow) = self.flow_mut()
        {
            flow.session_id = Some(session_id);
        }
        self.record_flow_browser().await;
        let target = self.login_target();
        let assessment = match self.load(&target).await {
            Ok(assessment) => assessment,
            Err(error) => return self.fail("navigation_failed", &format!("{error:#}")).await,
        };
        let assessment = if assessment.fields.is_empty() && self.document.login_url.is_none() {
            match self.follow_login_link().await {
                Ok(Some(found)) => found,
                Ok(None) => assessment,
                Err(error) => return self.fail("navigation_failed", &format!("{error:#}")).await,
            }
        } else {
            assessment
        };
        // A credential for an SSO provider signs in through the provider's button on
        // the login form.
        let sso_provider = match &self.document.credential {
            Some(_) if !assessment.fields.is_empty() => {
                self.credential_values().await.ok().and_then(|v| v.sso_provider)
            }
            _ => None,
        };
        // Its values are for the identity provider: without the button, nothing is filled.
        let assessment = match sso_provider {
            Some(provider) => match self.follow_sso_button(&provider).await {
                Ok(Some(found)) => found,
                Ok(None) => {
                    let message = format!(
                        "the login page has no button or link for SSO provider {provider:?}, at {}",
                        strip_query(&assessment.url)
                    );
                    return self.fail("sso_button_not_found", &message).await;
                }
                Err(error) => return self.fail("navigation_failed", &format!("{error:#}")).await,
            },
            None => assessment,
        };
        if assessment.fields.is_empty() {
            if self.inside(&assessment.url) {
                // The profile is logged in already.
                return self.succeed(assessment.url).await;
            }
            return self
                .fail(
                    "login_form_not_found",
                    &format!("no login form on {}", strip_query(&assessment.url)),
                )
                .await;
        }
        Box::pin(self.await_input(&assessment.url, assessment.fields, None)).await;
    }

    /// With `record_session`, records the flow's browser as a replay (once per flow; it
    /// ends with the browser).
    async fn record_flow_browser(&mut self) {
        let Some(flow) = self.document.flow_in_progress() else {
            return;
        };
        let wanted = flow.record_session.unwrap_or(self.document.record_session);
        if !wanted || flow.replay_id.is_some() {
            return;
        }
        let Some(session) = self.browser.as_ref().map(|browser| browser.session.clone()) else {
            return;
        };
        let started = match self.sessions.agent(&session) {
            Ok(agent) => {
                let longest = (crate::managed_auth::FLOW_TTL.num_seconds() + 60) as u32;
                self.replays.start(&session, agent, 10, longest, false).await
            }
            Err(error) => Err(error),
        };
        match started {
            Ok(replay) => {
                if let Some(flow) = self.flow_mut() {
                    flow.replay_id = Some(replay.id);
                }
                self.save().await;
            }
            Err(error) => {
                tracing::warn!(connection_id = %self.id(), %error, "the flow's browser cannot be recorded")
            }
        }
    }

    async fn follow_sso_button(&mut self, provider: &str) -> anyhow::Result<Option<Assessment>> {
        let Some(browser) = &self.browser else {
            return Ok(None);
        };
        if !browser.page.follow_sso_button(provider).await? {
            return Ok(None);
        }
        browser.page.wait_for_new_document(SUBMIT_NAVIGATION_WAIT).await;
        Ok(Some(browser.page.settled(PAGE_SETTLE_TIMEOUT).await?))
    }

    async fn follow_login_link(&mut self) -> anyhow::Result<Option<Assessment>> {
        let Some(browser) = &self.browser else {
            return Ok(None);
        };
        if !browser.page.follow_login_link().await? {
            return Ok(None);
        }
        Ok(Some(browser.page.settled(PAGE_SETTLE_TIMEOUT).await?))
    }

    /// The flow's next form: filled and submitted by the flow itself when it can (a
    /// REAUTH flow submits saved values once; with a credential, every flow fills each
    /// step it can until the site rejects a submission), else AWAITING_INPUT with these
    /// fields. AWAITING_INPUT is announced only when a person must act: a step the flow
    /// fills itself goes from DISCOVERING straight to SUBMITTING.
    async fn await_input(
        &mut self, url: &str, fields: Vec<DiscoveredField>, website_error: Option<String>,
    ) {
        // A form outside the domain and allowed domains is never filled.
        if !self.inside(url) {
            let message =
                format!("the login form is outside the allowed domains, at {}", strip_query(url));
            return self.fail("left_allowed_domains", &message).await;
        }
        if let Some(flow) = self.flow_mut() {
            flow.discovered_fields = Some(fields.clone());
            flow.website_error = website_error.clone();
            flow.awaiting_url = Some(url.to_owned());
        }
        let values = match self.automatic_values(url, &fields, website_error.is_some()).await {
            Ok(values) => values,
            Err(error) => {
                if let Some(flow) = self.flow_mut() {
                    flow.error_message = Some(error);
                }
                None
            }
        };
        match values {
            Some(values) => {
                if let Some(flow) = self.flow_mut() {
                    flow.auto_submitted = true;
                    flow.auto_steps += 1;
                    flow.auto_filled = fields.iter().map(|field| field.selector.clone()).collect();
                }
                Box::pin(self.submit(values)).await;
            }
            None => {
                if let Some(flow) = self.flow_mut() {
                    flow.step = FlowStep::AwaitingInput;
                }
                self.save().await;
            }
        }
    }

    /// The values the flow fills `fields` with itself, if it may and has them all;
    /// `Err` says why the connection's credential cannot be used.
    async fn automatic_values(
        &self, url: &str, fields: &[DiscoveredField], site_refused: bool,
    ) -> Result<Option<Vec<(DiscoveredField, String)>>, String> {
        let has_credential = self.document.credential.is_some();
        let automatic = !site_refused
            && self.document.flow_in_progress().is_some_and(|flow| {
                if has_credential {
                    flow.auto_steps < MAX_AUTOMATIC_STEPS
                } else {
                    flow.flow_type == FlowType::Reauth && !flow.auto_submitted
                }
            });
        if !automatic {
            return Ok(None);
        }
        let credential = self.credential_values().await.map_err(|error| {
            tracing::warn!(connection_id = %self.id(), %error, "the connection's credential is unusable");
            format!("the connection's credential is unusable: {error}")
        })?;
        // The same form back without an error after filling it: the site did not take the
        // values, and sending them again could lock the account.
        let selectors: Vec<String> = fields.iter().map(|field| field.selector.clone()).collect();
        if self.document.flow_in_progress().is_some_and(|flow| flow.auto_filled == selectors) {
            return Ok(None);
        }
        // An SSO credential's values belong to the identity provider, not to the site.
        let on_site = crate::managed_auth::in_domains(url, &self.record.domain, &[]);
        let credential = if credential.sso_provider.is_some() && on_site {
            LoginValues::default()
        } else {
            credential
        };
        let saved = self.saved_credentials();
        Ok(fields
            .iter()
            .map(|field| value_for(field, &credential, &saved).map(|value| (field.clone(), value)))
            .collect())
    }

    /// The values of the connection's credential (none without one).
    pub(super) async fn credential_values(&self) -> ServiceResult<LoginValues> {
        let Some(reference) = &self.document.credential else {
            return Ok(LoginValues::default());
        };
        let org_id = &self.record.org_id;
        if let Some(name) = reference.credential_id.as_ref().or(reference.name.as_ref()) {
            return self.credentials.login_values(org_id, name).await;
        }
        let provider =
            reference.provider_id.as_deref().or(reference.provider.as_deref()).unwrap_or_default();
        let item = match &reference.path {
            Some(path) => ItemLookup::Path(path),
            None => ItemLookup::Domain(&self.record.domain),
        };
        self.credentials.onepassword.login_values(org_id, provider, item).await?.ok_or_else(|| {
            ServiceError::NotFound(format!(
                "credential provider {} has no item {}",
                reference.provider.as_deref().unwrap_or_default(),
                reference.path.clone().unwrap_or_else(|| format!("for {}", self.record.domain))
            ))
        })
    }

    fn saved_credentials(&self) -> Credentials {
        match &self.record.credentials {
            Some(sealed) => self.vault.open_sealed(sealed, &self.vault_owner()).unwrap_or_else(|error| {
                tracing::warn!(connection_id = %self.id(), %error, "saved credentials unusable");
                Credentials::new()
            }),
            None => Credentials::new(),
        }
    }

    /// Fills and submits the values, then reads the page: success, a site error (wait
    /// for input again), or a next step of the login (more fields).
    pub(super) async fn submit(&mut self, values: Vec<(DiscoveredField, String)>) {
        if let Some(flow) = self.flow_mut() {
            flow.step = FlowStep::Submitting;
            flow.website_error = None;
        }
        self.save().await;
        for (field, value) in &values {
            if !field.is_one_time() {
                self.submitted.insert(field.name.clone(), value.clone());
            }
        }
        let Some(browser) = &self.browser else {
            return self.fail("browser_failed", "the flow's browser is gone").await;
        };
        // The page may have moved on since the form was read (a redirect while values
        // were fetched): values are filled inside the allowed domains only.
        let before = browser.page.assess().await.map(|a| a.url);
        if let Some(url) = before.as_deref().filter(|url| !self.inside(url)) {
            let message =
                format!("the login form is outside the allowed domains, at {}", strip_query(url));
            return self.fail("left_allowed_domains", &message).await;
        }
        if let Err(error) = browser.page.fill_and_submit(&values).await {
            return self.fail("submit_failed", &format!("{error:#}")).await;
        }
        // Judge the result only once the submission has left the page (or, for a page
        // that answers without navigating, after a while).
        browser.page.wait_for_new_document(SUBMIT_NAVIGATION_WAIT).await;
        let assessment = match browser.page.settled(PAGE_SETTLE_TIMEOUT).await {
            Ok(assessment) => assessment,
            Err(error) => return self.fail("navigation_failed", &format!("{error:#}")).await,
        };
        tracing::debug!(connection_id = %self.id(), from = ?before, to = %assessment.url, "submitted");
        if let Some(error) = assessment.error.clone() {
            let fields = if assessment.fields.is_empty() {
                values.into_iter().map(|(field, _)| field).collect()
            } else {
                assessment.fields
            };
            return Box::pin(self.await_input(&assessment.url, fields, Some(error))).await;
        }
        if assessment.password_field || assessment.fields.iter().any(DiscoveredField::is_one_time) {
            return Box::pin(self.await_input(&assessment.url, assessment.fields, None)).await;
        }
        if self.inside(&assessment.url) {
            return self.succeed(assessment.url).await;
        }
        if !assessment.fields.is_empty() {
            return Box::pin(self.await_input(&assessment.url, assessment.fields, None)).await;
        }
        self.fail(
            "left_allowed_domains",
            &format!(
                "the login ended outside the allowed domains, at {}",
                strip_query(&assessment.url)
            ),
        )
        .await
    }

    /// While the flow waits for input, a person may log in through its live view: once
    /// the page has settled inside the allowed domains, without the fields the flow
    /// waits for and without a password or one-time field (as after a submission), the
    /// login has succeeded.
    pub(super) async fn watch_page(&mut self) {
        let Some(browser) = &self.browser else {
            return;
        };
        let awaited: Vec<String> = self
            .document
            .flow_in_progress()
            .and_then(|flow| flow.discovered_fields.as_ref())
            .map(|fields| fields.iter().map(|field| field.selector.clone()).collect())
            .unwrap_or_default();
        let logged_in = |assessment: &Assessment| {
            !assessment.password_field
                && assessment.error.is_none()
                && !assessment
                    .fields
                    .iter()
                    .any(|field| field.is_one_time() || awaited.contains(&field.selector))
        };
        // A quick look first: the settling below takes half a second at least.
        match browser.page.assess().await {
            Some(now) if logged_in(&now) && self.inside(&now.url) => {}
            _ => return,
        }
        let Ok(settled) = browser.page.settled(PAGE_SETTLE_TIMEOUT).await else {
            return;
        };
        if logged_in(&settled) && self.inside(&settled.url) {
            tracing::info!(connection_id = %self.id(), "logged in through the live view");
            self.succeed(settled.url).await;
        }
    }

    /// Logged in: save the profile (and the values), finish the flow.
    async fn succeed(&mut self, landed_at: String) {
        let Some(browser) = self.browser.take() else {
            return self.fail("browser_failed", "the flow's browser is gone").await;
        };
        let saved = match self.sessions.agent(&browser.session) {
            Ok(agent) => self.profiles.save_from(&self.document.profile_id, &agent).await,
            Err(error) => Err(anyhow::anyhow!("{error}")),
        };
        self.end_browser(browser).await;
        if let Err(error) = saved {
            return self
                .fail("profile_save_failed", &format!("the profile could not be saved: {error:#}"))
                .await;
        }
        // A connection with a credential logs in from it: it keeps no values of its own.
        if self.document.save_credentials
            && self.document.credential.is_none()
            && !self.submitted.is_empty()
        {
            let mut credentials = self.saved_credentials();
            credentials.extend(std::mem::take(&mut self.submitted));
            match self.vault.seal(&credentials, &self.vault_owner()) {
                Ok(sealed) => self.record.credentials = Some(sealed),
                Err(error) => {
                    tracing::error!(connection_id = %self.id(), %error, "could not seal credentials")
                }
            }
        }
        self.submitted.clear();
        let now = Utc::now();
        self.document.status = AuthStatus::Authenticated;
        self.document.last_auth_at = Some(now);
        self.document.post_login_url = Some(landed_at);
        self.document.next_health_check_at =
            now + chrono::Duration::seconds(self.document.health_check_interval);
        if let Some(flow) = self.flow_mut() {
            flow.status = FlowStatus::Success;
            flow.step = FlowStep::Completed;
            flow.discovered_fields = None;
            flow.website_error = None;
        }
        self.save().await;
        tracing::info!(connection_id = %self.id(), "login flow succeeded");
    }
}
