//! The authenticated caller of a request: `Authorization: Bearer <api key>` resolved to
//! its organization, or a session token on one of that session's own routes
//! (`session_token`). Authorization happens here too, for every route at once: a key
//! with a policy passes only if the policy allows the action the route needs
//! (`crate::access::actions`), so no handler checks permissions itself. And the
//! request's project is settled here: the key's, or the one `X-Kernel-Project-Id` /
//! `X-Kernel-Project` names; the store then confines the request to it
//! (`crate::store::scope`).

use std::ops::Deref;

use axum::extract::{FromRequestParts, MatchedPath};
use axum::http::Method;
use axum::http::request::Parts;

use super::audit::{Actor, AuditSlot};
use super::error::{ApiError, OrNotFound};
use super::session_token::SessionCaller;
use super::state::AppState;
use crate::access::actions;
use crate::access::keys::Refused;
use crate::access::policy::{Policy, Required};
use crate::agent::AgentClient;
use crate::people::{self, SessionClaims, sessions};
use crate::store::{ApiKeyRecord, ProjectRecord, SessionRecord, scope};

/// The headers today's SDK sends to scope a call to a project, by id or by name.
const PROJECT_ID_HEADER: &str = "x-kernel-project-id";
const PROJECT_NAME_HEADER: &str = "x-kernel-project";

/// In a policy's resources, the project of a request confined to none: only a statement
/// with a wildcard there covers it.
const EVERY_PROJECT: &str = "*";

/// The caller's organization, from `Authorization: Bearer <key>`, with the services that
/// act for it. Handlers that take it are authenticated and authorized; everything they
/// touch is scoped to `id`.
#[derive(Clone)]
pub struct Org {
    pub id: String,
    /// Set when the caller is an action, with its invocation's short-lived key.
    pub invocation_id: Option<String>,
    pub caller: Caller,
    /// The project the request is confined to (see `crate::store::scope`); `None`: the
    /// whole organization, and what it makes goes to the default project.
    pub project: Option<ProjectRecord>,
    state: AppState,
}

/// Who is calling, and with which rights.
#[derive(Clone, Debug)]
pub enum Caller {
    /// An API key, or an action's invocation key acting with the rights of the key that
    /// started it (`key` is that key; `None` for invocations started before keys had
    /// policies, or by a session token).
    Key { key: Option<ApiKeyRecord>, invocation: bool },
    /// A browser's own token, on that browser's routes only (`session_token`).
    SessionToken,
    /// A person signed in with OpenID Connect (`crate::people`), with their role's
    /// policy (`None`: an admin, who may do anything in the organization).
    Person { person: Box<SessionClaims>, policy: Option<Policy> },
}

impl Caller {
    /// The key whose rights the call has, if any.
    pub fn key(&self) -> Option<&ApiKeyRecord> {
        match self {
            Self::Key { key, .. } => key.as_ref(),
            Self::SessionToken | Self::Person { .. } => None,
        }
    }

    /// The person calling, if a person signed in calls.
    pub fn person(&self) -> Option<&SessionClaims> {
        match self {
            Self::Person { person, .. } => Some(person),
            _ => None,
        }
    }

    pub fn policy(&self) -> Option<&Policy> {
        match self {
            Self::Person { policy, .. } => policy.as_ref(),
            _ => self.key().and_then(|key| key.policy.as_ref()),
        }
    }

    /// How the caller authenticated, as the audit log records it.
    fn strategy(&self) -> &'static str {
        match self {
            Self::Key { invocation: false, .. } => "api_key",
            Self::Key { invocation: true, .. } => "invocation_key",
            Self::SessionToken => "session_token",
            Self::Person { .. } => "oidc",
        }
    }
}

impl FromRequestParts<AppState> for Org {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let audit = parts.extensions.get::<AuditSlot>().cloned();
        let org = match Self::authenticate(parts, state).await {
            Ok(org) => org,
            Err((error, refused_key)) => {
                // A refused key of ours is recorded in its organization's audit log.
                if let (Some(audit), Some(key)) = (&audit, refused_key) {
                    let project = key.project_id.as_deref().unwrap_or(EVERY_PROJECT);
                    let required = required(parts, project);
                    audit.fill(actor(&key.org_id, "api_key", Some(&key), required));
                }
                return Err(error);
            }
        };
        let mut org = org;
        match org.settle_project(parts).await {
            Ok(project) => org.project = project,
            Err(error) => {
                // Refused (another project, an unknown one): recorded like any refusal.
                if let Some(audit) = &audit {
                    audit.fill(org.actor(required(parts, EVERY_PROJECT)));
                }
                return Err(error);
            }
        }
        if let Some(project) = &org.project {
            scope::confine(&project.id);
        }
        let required = required(parts, org.policy_project());
        if let Some(audit) = &audit {
            audit.fill(org.actor(required.clone()));
        }
        org.authorize(required.as_ref())?;
        org.refuse_organization_wide_to_bound(required.as_ref()).await?;
        org.refuse_changes_to_archived(parts)?;
        if let Some(slot) = parts.extensions.get::<super::telemetry_calls::CallerOrg>() {
            slot.set(&org.id);
        }
        Ok(org)
    }
}

/// What the request's route needs, in project `project_id`; `None` for a route open
/// to any key.
fn required(parts: &Parts, project_id: &str) -> Option<Required> {
    let template = parts
        .extensions
        .get::<MatchedPath>()
        .map(|matched| matched.as_str().to_owned())
        .unwrap_or_else(|| parts.uri.path().to_owned());
    actions::required(&parts.method, &template, parts.uri.path(), project_id)
}

/// The signed-in session whose cookie the request carries, if any (its organization
/// and principal). A request that changes anything with it must come from this server's
/// own pages (same origin): a cookie is sent by the browser whoever made the page that
/// asks (cross-site request forgery).
async fn signed_in(
    parts: &Parts, state: &AppState,
) -> Result<Option<(String, sessions::Principal)>, ApiError> {
    let Some(secret) = people::cookie(&parts.headers, people::SESSION_COOKIE) else {
        return Ok(None);
    };
    let session = sessions::resolve(&*state.store, secret).await?.ok_or_else(|| {
        ApiError::Unauthorized("your session ended or expired: sign in again (/console)".into())
    })?;
    let safe = matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS);
    if !safe && !same_origin(&parts.headers) {
        return Err(ApiError::Forbidden(
            "a signed-in session's changes must come from this server's own pages (same origin)"
                .into(),
        ));
    }
    Ok(Some(session))
}

/// Whether the browser says the request comes from a page of this origin: by
/// `Sec-Fetch-Site`, else by `Origin` against `Host`.
pub(super) fn same_origin(headers: &axum::http::HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    if let Some(site) = header("sec-fetch-site") {
        return site == "same-origin";
    }
    match (header("origin"), header("host")) {
        (Some(origin), Some(host)) => {
            origin.split_once("://").is_some_and(|(_, origin_host)| origin_host == host)
        }
        _ => false,
    }
}

fn actor(
    org_id: &str, auth_strategy: &'static str, key: Option<&ApiKeyRecord>,
    required: Option<Required>,
) -> Actor {
    let (action, resource) =
        required.map(|required| (required.action(), required.resource)).unwrap_or_default();
    Actor {
        org_id: org_id.to_owned(),
        auth_strategy,
        api_key_id: key.map(|key| key.id.clone()).unwrap_or_default(),
        user_id: String::new(),
        email: String::new(),
        action,
        resource,
    }
}

impl Org {
    /// The caller, or why not (with the refused key, when it is one of ours).
    async fn authenticate(
        parts: &mut Parts, state: &AppState,
    ) -> Result<Self, (ApiError, Option<ApiKeyRecord>)> {
        let unknown = |error: ApiError| (error, None);
        let org = |id: String, invocation_id: Option<String>, caller: Caller| Self {
            id,
            invocation_id,
            caller,
            project: None,
            state: state.clone(),
        };
        if let Some(caller) = parts.extensions.get::<SessionCaller>() {
            return Ok(org(caller.org.clone(), None, Caller::SessionToken));
        }
        if !parts.headers.contains_key(axum::http::header::AUTHORIZATION)
            && let Some((org_id, principal)) = signed_in(parts, state).await.map_err(unknown)?
        {
            return match principal {
                sessions::Principal::Person(person) => {
                    let policy = people::role_policy(person.role);
                    let person = Box::new(person);
                    Ok(org(org_id, None, Caller::Person { person, policy }))
                }
                sessions::Principal::Key { key_id } => {
                    let live = state
                        .api_keys
                        .live(&key_id)
                        .await
                        .map_err(|error| unknown(error.into()))?;
                    match live {
                        Ok(key) if key.org_id == org_id => {
                            Ok(org(org_id, None, Caller::Key { key: Some(key), invocation: false }))
                        }
                        _ => Err(unknown(ApiError::Unauthorized(
                            "the API key you signed in with is no longer valid: sign in again"
                                .into(),
                        ))),
                    }
                }
            };
        }
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .ok_or_else(|| {
                unknown(ApiError::Unauthorized(
                    "missing Authorization: Bearer <api key> header".into(),
                ))
            })?;
        let key = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .ok_or_else(|| {
                unknown(ApiError::Unauthorized(
                    "the Authorization header must be `Bearer <api key>`".into(),
                ))
            })?;
        let key = key.trim();
        if let Some(claims) = state.tokens.verify_invocation_key(key) {
            // Honoured only while its invocation runs, and its starter's key lives.
            let unfinished = state
                .apps
                .is_unfinished(&claims.org, &claims.sub)
                .await
                .map_err(|error| unknown(error.into()))?;
            if !unfinished {
                return Err(unknown(ApiError::Unauthorized(
                    "this invocation's API key expired with its invocation".into(),
                )));
            }
            let starter = match &claims.key {
                Some(key_id) => {
                    let live =
                        state.api_keys.live(key_id).await.map_err(|error| unknown(error.into()))?;
                    Some(live.map_err(|_| {
                        unknown(ApiError::Unauthorized(
                            "the API key that started this invocation is no longer valid".into(),
                        ))
                    })?)
                }
                None => None,
            };
            return Ok(org(
                claims.org,
                Some(claims.sub),
                Caller::Key { key: starter, invocation: true },
            ));
        }
        let checked =
            state.api_keys.authenticate(key).await.map_err(|error| unknown(error.into()))?;
        match checked {
            Ok(record) => Ok(org(
                record.org_id.clone(),
                None,
                Caller::Key { key: Some(record), invocation: false },
            )),
            Err(Refused::Invalid) => Err(unknown(ApiError::Unauthorized("invalid API key".into()))),
            Err(Refused::Deleted(record)) => {
                Err((ApiError::Unauthorized("invalid API key".into()), Some(*record)))
            }
            Err(Refused::Expired(record)) => {
                let at = record.expires_at.unwrap_or_default();
                Err((
                    ApiError::Unauthorized(format!(
                        "this API key expired at {}",
                        at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    )),
                    Some(*record),
                ))
            }
        }
    }

    /// Refuses the call (403, naming the action) if the caller's policy does not allow
    /// what the route needs. Keys without a policy may do anything in their organization.
    fn authorize(&self, required: Option<&Required>) -> Result<(), ApiError> {
        let (Some(policy), Some(required)) = (self.caller.policy(), required) else {
            return Ok(());
        };
        if policy.allows(required) {
            return Ok(());
        }
        Err(ApiError::Forbidden(format!(
            "this API key's policy does not allow {} on {}",
            required.action(),
            required.resource
        )))
    }
}

impl Org {
    /// The project the request acts in: the caller's own (a project-bound key, or an
    /// action's invocation in its app's project), else the one the headers name, else
    /// none. A header naming another project than the caller's own is refused.
    async fn settle_project(&self, parts: &Parts) -> Result<Option<ProjectRecord>, ApiError> {
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::trim)
                .filter(|value| !value.is_empty())
        };
        let mut named: Option<ProjectRecord> = None;
        for (name, value) in [
            (PROJECT_ID_HEADER, header(PROJECT_ID_HEADER)),
            (PROJECT_NAME_HEADER, header(PROJECT_NAME_HEADER)),
        ] {
            let Some(value) = value else { continue };
            let found = self
                .store
                .project(&self.id, value)
                .await?
                .ok_or_else(|| ApiError::not_found("project", value))?;
            if let Some(earlier) = &named
                && earlier.id != found.id
            {
                return Err(ApiError::invalid_field(format!(
                    "{PROJECT_ID_HEADER} and {PROJECT_NAME_HEADER} name different projects; \
                     give one ({name}: {value})"
                )));
            }
            named = Some(found);
        }
        let own = match self.own_project_id().await? {
            Some(own) => own,
            None => return Ok(named),
        };
        if let Some(named) = &named {
            if named.id != own {
                return Err(ApiError::Forbidden(format!(
                    "this caller is bound to project {own}: it cannot act in project {}",
                    named.name
                )));
            }
            return Ok(Some(named.clone()));
        }
        match self.store.project_by_id(&own).await? {
            Some(project) => Ok(Some(project)),
            None => Err(ApiError::Unauthorized(
                "the project this API key is bound to was deleted".into(),
            )),
        }
    }

    /// Who calls, for the audit log.
    fn actor(&self, required: Option<Required>) -> Actor {
        let mut actor = actor(&self.id, self.caller.strategy(), self.caller.key(), required);
        if let Some(person) = self.caller.person() {
            actor.user_id = person.sub.clone();
            actor.email = person.email.clone();
        }
        actor
    }

    /// The project the caller itself is bound to, if any: its key's, or, for an
    /// action's invocation, its app's.
    async fn own_project_id(&self) -> Result<Option<String>, ApiError> {
        if let Some(invocation_id) = &self.invocation_id {
            let invocation = self.store.invocation(&self.id, invocation_id).await?;
            if let Some(project_id) = invocation.and_then(|invocation| invocation.project_id) {
                return Ok(Some(project_id));
            }
        }
        Ok(self.caller.key().and_then(|key| key.project_id.clone()))
    }

    /// The project a policy's statements are checked against: the request's, else every
    /// project (so that only a wildcard covers a request not confined to one).
    fn policy_project(&self) -> &str {
        self.project.as_ref().map_or(EVERY_PROJECT, |project| project.id.as_str())
    }

    /// What spans every project (the audit log and its delivery, the organization's
    /// limits) is not for a caller bound to one project: 403.
    async fn refuse_organization_wide_to_bound(
        &self, required: Option<&Required>,
    ) -> Result<(), ApiError> {
        let Some(required) = required else {
            return Ok(());
        };
        let organization_wide = required.kind == "audit_logs"
            || (required.kind == "organization" && required.verb == "write");
        if !organization_wide {
            return Ok(());
        }
        match self.own_project_id().await? {
            Some(project_id) => Err(ApiError::Forbidden(format!(
                "this caller is bound to project {project_id}: {} is organization-wide, for organization-wide keys",
                if required.kind == "audit_logs" {
                    "the audit log"
                } else {
                    "the organization's limits"
                }
            ))),
            None => Ok(()),
        }
    }

    /// An archived project keeps what it has, readable and deletable; nothing in it is
    /// made or changed until it is active again (the project's own routes stay open).
    fn refuse_changes_to_archived(&self, parts: &Parts) -> Result<(), ApiError> {
        let Some(project) = self.project.as_ref().filter(|p| p.status == "archived") else {
            return Ok(());
        };
        let reads_or_deletes =
            matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS | Method::DELETE);
        if reads_or_deletes || parts.uri.path().starts_with("/org/") {
            return Ok(());
        }
        Err(ApiError::Conflict(format!(
            "project {} is archived: make it active again to change what it holds",
            project.name
        )))
    }

    /// Whether the caller's policy allows `verb` on the organization's `kind` `id`
    /// (always, for a caller without a policy).
    pub async fn allows(
        &self, kind: &'static str, verb: &'static str, id: &str,
    ) -> Result<bool, ApiError> {
        let Some(policy) = self.caller.policy() else {
            return Ok(true);
        };
        let project_id = self.policy_project();
        Ok(policy.allows(&crate::access::policy::Required {
            kind,
            verb,
            resource: format!("projects/{project_id}/{kind}/{id}"),
        }))
    }

    /// Refuses (403, naming the first one missing) unless the caller's policy allows
    /// each of `needed` (kind, id or name, verb): what a request refers to in its body.
    pub async fn require(
        &self, needed: &[(&'static str, String, &'static str)],
    ) -> Result<(), ApiError> {
        for (kind, id, verb) in needed {
            if !self.allows(kind, verb, id).await? {
                return Err(ApiError::Forbidden(format!(
                    "this API key's policy does not allow {kind}:{verb} on {kind} {id}, which the request refers to"
                )));
            }
        }
        Ok(())
    }

    /// One of the organization's browser sessions, live or ended.
    pub async fn session(&self, session_id: &str) -> Result<SessionRecord, ApiError> {
        let found = self.store.session(&self.id, session_id).await?;
        found.or_not_found("browser session", session_id)
    }

    /// The agent of one of the organization's live sessions.
    pub async fn agent(&self, session_id: &str) -> Result<AgentClient, ApiError> {
        Ok(self.session_and_agent(session_id).await?.1)
    }

    /// The live session `id_or_name` of this organization, and its agent.
    pub async fn session_and_agent(
        &self, id_or_name: &str,
    ) -> Result<(SessionRecord, AgentClient), ApiError> {
        let session = self.sessions.live(&self.id, id_or_name).await?;
        let agent = self.sessions.agent(&session)?;
        Ok((session, agent))
    }
}

/// Handlers reach the services as `org.sessions`, `org.store`, …
impl Deref for Org {
    type Target = AppState;

    fn deref(&self) -> &AppState {
        &self.state
    }
}
