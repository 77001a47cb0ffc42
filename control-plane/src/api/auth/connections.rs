//! `/auth/connections`: managed auth (see `crate::managed_auth` for the workflow).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::sse::{Event, Sse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use utoipa::ToSchema;

use super::connection_settings::{
    ConnectionBrowserRequest, Target, UpdateAuthConnectionRequest, allowed_domains_problems,
    checked_credential, checked_references, chosen_proxy, chosen_telemetry, domain_problem,
    interval_problem, url_problem,
};
use crate::api::error::{ApiError, ErrorBody, OrNotFound};
use crate::api::extract::{JsonBody, PathParam, QueryParams};
use crate::api::org::Org;
use crate::api::paging::list_query;
use crate::api::state::AppState;
use crate::error::ServiceError;
use crate::ids;
use crate::managed_auth::{
    AuthStatus, DEFAULT_HEALTH_CHECK_INTERVAL, Document, FlowStep, FlowType, SettingsChange,
    state_event,
};
use crate::profiles::name_problem;
use crate::sessions::ResourceReference;
use crate::store::{AuthConnectionRecord, StoreError};

/// Between heartbeats of an events stream.
const SSE_HEARTBEAT: Duration = Duration::from_secs(5);
/// Longest submitted value.
const MAX_FIELD_VALUE: usize = 4096;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateAuthConnectionRequest {
    /// The site's domain, optionally with a port (`example.com`, `127.0.0.1:8080`).
    #[schema(schema_with = crate::api::openapi::host_and_port)]
    pub domain: String,
    /// Created if the organization has no profile of that name.
    #[schema(schema_with = crate::api::openapi::display_name)]
    pub profile_name: String,
    /// The login page; without it the domain's home page and its login link are tried.
    #[schema(schema_with = crate::api::openapi::login_url)]
    pub login_url: Option<String>,
    /// Further domains the login may pass through or end on (`*.example.com` allowed).
    #[schema(schema_with = crate::api::openapi::allowed_domains)]
    pub allowed_domains: Option<Vec<String>>,
    /// What logins fill in: `{name}`, `{provider, path}` or `{provider, auto: true}`.
    #[schema(schema_with = crate::api::openapi::credential_reference)]
    pub credential: Option<super::connection_settings::CredentialReference>,
    /// Seconds between health checks; default 3600, from the server's minimum
    /// (`--min-health-check-interval`, default 300) to 86400.
    #[schema(minimum = 300, maximum = 86400)]
    pub health_check_interval: Option<i64>,
    /// Whether health checks run. Default true.
    pub health_checks: Option<bool>,
    /// Whether a health check that finds the profile logged out logs in again with the
    /// saved values. Default true.
    pub auto_reauth: Option<bool>,
    pub browser: Option<ConnectionBrowserRequest>,
    /// Deprecated form of `browser.telemetry`.
    pub browser_telemetry: Option<crate::telemetry::settings::TelemetryRequest>,
    /// Deprecated form of `browser.proxy`.
    pub proxy: Option<ResourceReference>,
    /// Keep the submitted values (encrypted; never one-time codes) to log in again by
    /// itself. Default true.
    pub save_credentials: Option<bool>,
    /// Whether login flows record their browser as a replay. Default false.
    pub record_session: Option<bool>,
}

/// `view` for this caller: a key whose policy does not let it log in through the
/// connection (`auth_connections:use`) gets no URL that carries a token (the hosted
/// login page and the live view let their holder submit values and drive the browser).
pub(in crate::api) async fn view_for(
    org: &Org, record: &AuthConnectionRecord,
) -> Result<Value, ApiError> {
    let mut body = view(org, record)?;
    if !org.allows("auth_connections", "use", &record.id).await?
        && let Some(fields) = body.as_object_mut()
    {
        fields.remove("hosted_url");
        fields.remove("live_view_url");
    }
    Ok(body)
}

/// An auth connection as the SDKs read it (`ManagedAuth`).
pub(in crate::api) fn view(
    state: &AppState, record: &AuthConnectionRecord,
) -> Result<Value, ApiError> {
    let document = Document::parse(record)?;
    let has_credentials = record.credentials.is_some() || document.credential.is_some();
    let reauth_reason = match &document.credential {
        Some(credential) if credential.provider.is_some() => "external_credential",
        _ if has_credentials => "has_credential",
        _ => "no_credential",
    };
    let mut body = json!({
        "id": record.id,
        "domain": record.domain,
        "profile_name": record.profile_name,
        "status": document.status,
        "save_credentials": document.save_credentials,
        "allowed_domains": document.allowed_domains,
        "login_url": document.login_url,
        "health_check_interval": document.health_check_interval,
        "health_checks": document.health_checks,
        "auto_reauth": document.auto_reauth,
        "browser": {
            "stealth": document.stealth,
            "region": state.settings.region,
            "proxy": match &document.proxy_id {
                Some(id) => json!({"id": id}),
                None => json!({"mode": "direct"}),
            },
            "telemetry": document
                .browser_telemetry
                .as_ref()
                .and_then(|request| crate::telemetry::settings::on_create(Some(request)).ok())
                .and_then(|resolved| resolved.settings)
                .map(|settings| settings.view()),
        },
        "proxy_id": document.proxy_id,
        "last_auth_at": document.last_auth_at,
        "post_login_url": document.post_login_url,
        "created_at": record.created_at,
        "next_health_check_at": document.health_checks.then_some(document.next_health_check_at),
        "can_reauth": has_credentials,
        // Values of the SDK's enum: login values saved by a successful login count as the
        // connection's credential.
        "can_reauth_reason": reauth_reason,
        "record_session": document.record_session,
    });
    if let Some(credential) = &document.credential {
        body["credential"] = credential.view();
    }
    if let Some(flow) = &document.flow {
        body["flow_type"] = json!(flow.flow_type);
        body["flow_status"] = json!(flow.status);
        body["flow_step"] = json!(flow.step);
        body["error_code"] = json!(flow.error_code);
        body["error_message"] = json!(flow.error_message);
        body["website_error"] = json!(flow.website_error);
        if flow.in_progress() {
            body["flow_expires_at"] = json!(flow.expires_at);
            let (hosted_url, live_view_url) = flow_urls(state, record, flow.expires_at);
            body["hosted_url"] = json!(hosted_url);
            body["live_view_url"] = json!(live_view_url);
            if flow.step == FlowStep::AwaitingInput {
                body["discovered_fields"] = json!(flow.discovered_fields);
            }
        }
    }
    Ok(body)
}

/// A flow's two pages, each with a token of its own valid until the flow expires: the
/// hosted login page, and the live view of the flow's browser (it runs headful), where a
/// person can complete what the automation cannot.
fn flow_urls(
    state: &AppState, record: &AuthConnectionRecord, expires_at: DateTime<Utc>,
) -> (String, String) {
    let base = state.settings.public_url.trim_end_matches('/');
    let (id, org_id) = (&record.id, &record.org_id);
    let hosted = state.tokens.issue_hosted_login(id, org_id, expires_at);
    let live_view = state.tokens.issue_flow_live_view(id, org_id, expires_at);
    (
        format!("{base}/auth/connections/{id}/hosted?jwt={hosted}"),
        format!("{base}{}", live_view_path(id, &live_view)),
    )
}

pub(super) fn live_view_path(connection_id: &str, token: &str) -> String {
    format!("/auth/connections/{connection_id}/live?jwt={token}")
}

pub(in crate::api) async fn find(org: &Org, id: &str) -> Result<AuthConnectionRecord, ApiError> {
    let found = org.store.auth_connection(&org.id, id).await?;
    found.or_not_found("auth connection", id)
}

/// Create an auth connection: a profile kept logged in to a domain. Its workflow starts
/// at once (first health check after `health_check_interval`); log in with `login`.
#[utoipa::path(post, path = "/auth/connections", request_body = CreateAuthConnectionRequest,
    responses((status = 200, body = Object),
        (status = 404, description = "A referenced proxy, credential or credential provider does not exist", body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn create(
    org: Org, JsonBody(request): JsonBody<CreateAuthConnectionRequest>,
) -> Result<Json<Value>, ApiError> {
    let profile = Some(request.profile_name.as_str());
    let (browser, telemetry) = (request.browser.as_ref(), request.browser_telemetry.as_ref());
    let (credential, proxy) = (request.credential.as_ref(), request.proxy.as_ref());
    let mut problems =
        checked_references(&org, profile, credential, browser, telemetry, proxy).await?;
    problems.extend(domain_problem("domain", &request.domain, false));
    problems.extend(name_problem(&request.profile_name).map(|p| format!("profile_name: {p}")));
    if let Some(login_url) = &request.login_url {
        problems.extend(url_problem("login_url", login_url));
    }
    let allowed_domains = request.allowed_domains.unwrap_or_default();
    problems.extend(allowed_domains_problems(&allowed_domains));
    let interval = request
        .health_check_interval
        .unwrap_or(DEFAULT_HEALTH_CHECK_INTERVAL.max(org.managed_auth.min_health_check_interval));
    problems.extend(interval_problem(&org, interval));
    if !problems.is_empty() {
        return Err(ApiError::invalid_fields(problems));
    }
    let browser_telemetry = super::connection_settings::chosen_telemetry(
        &org,
        request.browser.as_ref(),
        request.browser_telemetry,
    )
    .await?
    .flatten();
    let (browser_proxy, stealth) = match request.browser {
        Some(browser) => (browser.proxy, browser.stealth),
        None => (None, None),
    };
    let proxy_id = chosen_proxy(&org, &org.id, browser_proxy, request.proxy).await?.flatten();
    let credential = match request.credential {
        Some(reference) => {
            let target = super::connection_settings::Target {
                domain: &request.domain,
                allowed_domains: &allowed_domains,
            };
            Some(
                super::connection_settings::checked_credential(&org, &org.id, reference, target)
                    .await?,
            )
        }
        None => None,
    };
    let profile = match org.store.profile(&org.id, &request.profile_name).await? {
        Some(profile) => profile,
        None => match org.profiles.create(&org.id, Some(request.profile_name.clone())).await {
            Ok(profile) => profile,
            // Created concurrently: use that one.
            Err(ServiceError::Conflict(_)) => {
                org.store.profile(&org.id, &request.profile_name).await?.ok_or_else(|| {
                    ApiError::Conflict("the profile is being changed; retry".into())
                })?
            }
            Err(error) => return Err(error.into()),
        },
    };
    let now = Utc::now();
    let document = Document {
        profile_id: profile.id,
        login_url: request.login_url,
        allowed_domains,
        health_check_interval: interval,
        proxy_id,
        save_credentials: request.save_credentials.unwrap_or(true),
        health_checks: request.health_checks.unwrap_or(true),
        auto_reauth: request.auto_reauth.unwrap_or(true),
        stealth: stealth.unwrap_or(true),
        status: AuthStatus::NeedsAuth,
        last_auth_at: None,
        post_login_url: None,
        next_health_check_at: now + chrono::Duration::seconds(interval),
        flow: None,
        credential,
        record_session: request.record_session.unwrap_or(false),
        timeline: Vec::new(),
        browser_telemetry,
    };
    let record = AuthConnectionRecord {
        id: ids::new_id("auth"),
        org_id: org.id.clone(),
        domain: request.domain.to_ascii_lowercase(),
        profile_name: request.profile_name,
        created_at: now,
        document: serde_json::to_string(&document)
            .map_err(|error| ApiError::Internal(error.into()))?,
        credentials: None,
    };
    match org.store.insert_auth_connection(&record).await {
        Ok(()) => {}
        Err(StoreError::Conflict(_)) => {
            return Err(ApiError::Conflict(format!(
                "profile {:?} already has an auth connection for {}",
                record.profile_name, record.domain
            )));
        }
        Err(error) => return Err(error.into()),
    }
    org.managed_auth.spawn(record.clone());
    Ok(Json(view_for(&org, &record).await?))
}

list_query! {
    /// Unknown parameters are refused: a filter this server does not apply must not look
    /// applied.
    pub struct ListQuery {
        pub domain: Option<String>,
        pub profile_name: Option<String>,
        /// Only connections whose id, domain or profile name contains this text
        /// (case-insensitive).
        pub query: Option<String>,
    }
}

/// List the organization's auth connections, oldest first (paged with `limit`/`offset`).
#[utoipa::path(get, path = "/auth/connections", params(ListQuery),
    responses((status = 200, body = Vec<Object>)))]
pub async fn list(
    org: Org, paging: crate::api::paging::Paging, QueryParams(query): QueryParams<ListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let mut connections = org.store.list_auth_connections(Some(&org.id)).await?;
    if let Some(domain) = &query.domain {
        connections.retain(|c| c.domain.eq_ignore_ascii_case(domain));
    }
    if let Some(profile_name) = &query.profile_name {
        connections.retain(|c| &c.profile_name == profile_name);
    }
    if let Some(text) = query.query.as_deref().filter(|text| !text.is_empty()) {
        let text = text.to_lowercase();
        connections.retain(|c| {
            [&c.id, &c.domain, &c.profile_name]
                .iter()
                .any(|field| field.to_lowercase().contains(&text))
        });
    }
    let (headers, page) = crate::api::page_of(paging, connections, query.limit, query.offset)?;
    let mut body = Vec::with_capacity(page.len());
    for record in &page {
        body.push(view_for(&org, record).await?);
    }
    Ok((headers, Json(body)))
}

/// Get an auth connection, with its current flow.
#[utoipa::path(get, path = "/auth/connections/{id}", responses((status = 200, body = Object)))]
pub async fn retrieve(org: Org, PathParam(id): PathParam<String>) -> Result<Json<Value>, ApiError> {
    let record = find(&org, &id).await?;
    Ok(Json(view_for(&org, &record).await?))
}

/// Delete an auth connection (seed 4.13): the record goes, its workflow stops, and a
/// login flow in progress is canceled (followers get CANCELED; its browser ends).
/// Answers once that is done. The profile stays.
#[utoipa::path(delete, path = "/auth/connections/{id}", responses((status = 204)))]
pub async fn delete(org: Org, PathParam(id): PathParam<String>) -> Result<StatusCode, ApiError> {
    if !org.store.delete_auth_connection(&org.id, &id).await? {
        return Err(ApiError::not_found("auth connection", &id));
    }
    // The caller may go away; the cancellation must not be cut short.
    let managed_auth = org.managed_auth.clone();
    tokio::spawn(async move { managed_auth.stop(&id).await })
        .await
        .map_err(|error| ApiError::Internal(anyhow::anyhow!("stop task failed: {error}")))?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    /// Not supported by this server per flow: set the proxy on the connection.
    pub proxy: Option<ResourceReference>,
    /// Records this login's browser as a replay, or not, whatever the connection's
    /// `record_session`.
    pub record_session: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct LoginResponse {
    pub id: String,
    /// LOGIN or REAUTH.
    #[schema(value_type = String)]
    pub flow_type: FlowType,
    pub flow_expires_at: DateTime<Utc>,
    /// A page of this server showing the flow, where a person can enter the values.
    pub hosted_url: String,
    /// The live view of the flow's browser, where a person can complete what the
    /// automation cannot (an unexpected challenge).
    pub live_view_url: String,
}

/// Start a login flow: a browser with the profile opens the login page and its fields
/// are discovered (follow with `events`, answer with `submit`). 409 while one is in
/// progress.
#[utoipa::path(post, path = "/auth/connections/{id}/login", request_body = LoginRequest,
    responses((status = 200, body = LoginResponse),
        (status = 429, description = "The organization has its most live browsers", body = ErrorBody),
        (status = 409, body = ErrorBody)))]
pub async fn login(
    org: Org, PathParam(id): PathParam<String>, JsonBody(request): JsonBody<LoginRequest>,
) -> Result<Json<LoginResponse>, ApiError> {
    if request.proxy.is_some() {
        return Err(ApiError::invalid_field(
            "proxy: a login flow uses its connection's proxy; set it when creating the connection",
        ));
    }
    find(&org, &id).await?;
    org.managed_auth.login(&id, request.record_session).await?;
    let record = find(&org, &id).await?;
    let document = Document::parse(&record)?;
    let flow = document
        .flow
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("the started flow is not recorded")))?;
    let (hosted_url, live_view_url) = flow_urls(&org, &record, flow.expires_at);
    Ok(Json(LoginResponse {
        id: record.id.clone(),
        flow_type: flow.flow_type,
        flow_expires_at: flow.expires_at,
        hosted_url,
        live_view_url,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// Discovered field name → value; at least one (here or in `field_values`).
    #[schema(schema_with = crate::api::openapi::submitted_fields)]
    pub fields: Option<BTreeMap<String, String>>,
    /// Today's SDK's name for `fields` (merged with them).
    pub field_values: Option<BTreeMap<String, String>>,
    /// The flows of this server ask for fields only: choices, sign-in and MFA options
    /// and SSO buttons are never offered, so these are a 400.
    pub mfa_option_id: Option<String>,
    pub sso_button_selector: Option<String>,
    pub selected_choice_id: Option<String>,
    pub sign_in_option_id: Option<String>,
    pub sso_provider: Option<String>,
    /// Accepted and ignored: a flow has one interaction at a time.
    pub interaction_id: Option<String>,
}

pub(super) fn check_values(fields: &BTreeMap<String, String>) -> Result<(), ApiError> {
    if fields.is_empty() {
        return Err(ApiError::invalid_field("fields must name at least one field"));
    }
    for (name, value) in fields {
        if value.len() > MAX_FIELD_VALUE || value.contains('\0') {
            return Err(ApiError::invalid_field(format!(
                "fields.{name}: at most {MAX_FIELD_VALUE} bytes, without NUL characters"
            )));
        }
    }
    Ok(())
}

/// Submit values for the discovered fields. Answers `accepted` once the flow took them;
/// the outcome follows in the events (SUCCESS, or AWAITING_INPUT with `website_error`).
#[utoipa::path(post, path = "/auth/connections/{id}/submit", request_body = SubmitRequest,
    responses((status = 200, body = Object), (status = 409, body = ErrorBody)))]
pub async fn submit(
    org: Org, PathParam(id): PathParam<String>, JsonBody(request): JsonBody<SubmitRequest>,
) -> Result<Json<Value>, ApiError> {
    let offered_never = [
        ("mfa_option_id", request.mfa_option_id.is_some()),
        ("sso_button_selector", request.sso_button_selector.is_some()),
        ("selected_choice_id", request.selected_choice_id.is_some()),
        ("sign_in_option_id", request.sign_in_option_id.is_some()),
        ("sso_provider", request.sso_provider.is_some()),
    ];
    let given: Vec<&str> =
        offered_never.iter().filter(|(_, given)| *given).map(|(name, _)| *name).collect();
    if !given.is_empty() {
        return Err(ApiError::invalid_field(format!(
            "{}: this flow offers no choices or options, only the fields in discovered_fields \
             (give a credential with sso_provider to sign in through SSO)",
            given.join(", ")
        )));
    }
    let mut fields = request.fields.unwrap_or_default();
    fields.extend(request.field_values.unwrap_or_default());
    check_values(&fields)?;
    find(&org, &id).await?;
    org.managed_auth.submit(&id, fields).await?;
    Ok(Json(json!({"accepted": true})))
}

/// Follow the connection's login flow: server-sent `managed_auth_state` events for every
/// state change (the current state first), `sse_heartbeat` events every 5 s; the stream
/// ends after a flow's final state.
#[utoipa::path(get, path = "/auth/connections/{id}/events",
    responses((status = 200, content_type = "text/event-stream", body = String)))]
pub async fn events(
    org: Org, PathParam(id): PathParam<String>,
) -> Result<impl IntoResponse, ApiError> {
    // Subscribed before reading the state, so no change falls in between.
    let mut changes = org.managed_auth.subscribe(&id).or_not_found("auth connection", &id)?;
    let record = find(&org, &id).await?;
    let current = state_event(&Document::parse(&record)?, None);
    let (sender, receiver) = mpsc::channel::<Result<Event, Infallible>>(16);
    tokio::spawn(async move {
        let send = |value: &Value| {
            let name = value["event"].as_str().unwrap_or("message").to_owned();
            Event::default().event(name).json_data(value).ok().map(Ok)
        };
        let finished = |value: &Value| value["flow_status"] != "IN_PROGRESS";
        if let Some(current) = &current {
            let Some(event) = send(current) else { return };
            if sender.send(event).await.is_err() || finished(current) {
                return;
            }
        }
        let mut heartbeat = tokio::time::interval(SSE_HEARTBEAT);
        heartbeat.tick().await;
        loop {
            let value = tokio::select! {
                () = sender.closed() => return,
                _ = heartbeat.tick() => json!({"event": "sse_heartbeat", "timestamp": Utc::now()}),
                change = changes.recv() => match change {
                    Ok(value) => value,
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            };
            let Some(event) = send(&value) else { return };
            if sender.send(event).await.is_err() {
                return;
            }
            if value["event"] == "managed_auth_state" && finished(&value) {
                return;
            }
        }
    });
    Ok(Sse::new(ReceiverStream::new(receiver)))
}

/// Change an auth connection's settings. A flow in progress goes on; later flows and
/// health checks follow the new settings.
#[utoipa::path(patch, path = "/auth/connections/{id}", request_body = UpdateAuthConnectionRequest,
    responses((status = 200, body = Object),
        (status = 404, description = "No such connection, or a referenced proxy, credential or credential provider does not exist", body = ErrorBody),
        (status = 409, description = "The credential is for another site", body = ErrorBody)))]
pub async fn update(
    org: Org, PathParam(id): PathParam<String>,
    JsonBody(request): JsonBody<UpdateAuthConnectionRequest>,
) -> Result<Json<Value>, ApiError> {
    let record = find(&org, &id).await?;
    let (browser, telemetry) = (request.browser.as_ref(), request.browser_telemetry.as_ref());
    let credential = request.credential.as_ref().and_then(Option::as_ref);
    let proxy = request.proxy.as_ref();
    let mut problems =
        checked_references(&org, None, credential, browser, telemetry, proxy).await?;
    if let Some(domains) = &request.allowed_domains {
        problems.extend(allowed_domains_problems(domains));
    }
    if let Some(interval) = request.health_check_interval {
        problems.extend(interval_problem(&org, interval));
    }
    let login_url = request.login_url.map(|url| (!url.is_empty()).then_some(url));
    if let Some(Some(url)) = &login_url {
        problems.extend(url_problem("login_url", url));
    }
    if !problems.is_empty() {
        return Err(ApiError::invalid_fields(problems));
    }
    let browser_telemetry =
        chosen_telemetry(&org, request.browser.as_ref(), request.browser_telemetry).await?;
    let (browser_proxy, stealth) = match request.browser {
        Some(browser) => (browser.proxy, browser.stealth),
        None => (None, None),
    };
    let proxy_id = chosen_proxy(&org, &org.id, browser_proxy, request.proxy).await?;
    let credential = match request.credential {
        Some(Some(reference)) => {
            let document = Document::parse(&record)?;
            let allowed = request.allowed_domains.as_deref().unwrap_or(&document.allowed_domains);
            let target = Target { domain: &record.domain, allowed_domains: allowed };
            Some(Some(checked_credential(&org, &org.id, reference, target).await?))
        }
        Some(None) => Some(None),
        None => None,
    };
    let change = SettingsChange {
        login_url,
        allowed_domains: request.allowed_domains,
        health_check_interval: request.health_check_interval,
        health_checks: request.health_checks,
        auto_reauth: request.auto_reauth,
        save_credentials: request.save_credentials,
        stealth,
        proxy_id,
        credential,
        record_session: request.record_session,
        browser_telemetry,
    };
    org.managed_auth.update(&record.id, change).await?;
    let updated = find(&org, &record.id).await?;
    Ok(Json(view_for(&org, &updated).await?))
}
