//! The settings of an auth connection that today's SDK sends on create and changes with
//! PATCH (`auth.connections.update`): checked here, applied by the connection's
//! workflow, which owns its record.

use crate::telemetry::settings::{self as telemetry, TelemetryRequest};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::api::browsers::ProxySelection;
use crate::api::error::ApiError;
use crate::api::org::Org;
use crate::api::state::AppState;
use crate::error::ServiceError;
use crate::managed_auth::{CredentialRef, MAX_HEALTH_CHECK_INTERVAL, in_domains};
use crate::sessions::ResourceReference;

/// What a connection's settings refer to, as (kind, id or name, verb): a key with a
/// policy must be allowed each (`Org::require`). The profile is logged into, so changed.
pub fn references(
    profile_name: Option<&str>, credential: Option<&CredentialReference>,
    browser: Option<&ConnectionBrowserRequest>, browser_telemetry: Option<&TelemetryRequest>,
    proxy: Option<&ResourceReference>,
) -> Vec<(&'static str, String, &'static str)> {
    let mut referenced = Vec::new();
    let destinations = browser
        .and_then(|browser| browser.telemetry.as_ref())
        .into_iter()
        .chain(browser_telemetry)
        .filter_map(TelemetryRequest::destination);
    for destination in destinations {
        referenced.push(("telemetry_destinations", destination, "read"));
    }
    if let Some(profile) = profile_name {
        referenced.push(("profiles", profile.to_owned(), "write"));
    }
    if let Some(credential) = credential {
        if let Some(name) = &credential.name {
            referenced.push(("credentials", name.clone(), "use"));
        }
        if let Some(provider) = &credential.provider {
            referenced.push(("credential_providers", provider.clone(), "use"));
        }
    }
    let proxies = browser
        .and_then(|browser| browser.proxy.as_ref())
        .and_then(|selection| selection.proxy("browser.proxy").ok().flatten())
        .into_iter()
        .chain(proxy.and_then(|reference| reference.key().map(str::to_owned)));
    for proxy in proxies {
        referenced.push(("proxies", proxy, "read"));
    }
    referenced
}

/// The connection's browsers (its logins and health checks).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectionBrowserRequest {
    /// Their proxy: `{id}` or `{name}` of one of the organization's proxies, or
    /// `{mode: "direct" | "default"}` for none.
    pub proxy: Option<ProxySelection>,
    /// Only this server's region (`--region`); another is a 400.
    pub region: Option<String>,
    /// Whether they run in stealth mode. Default true.
    pub stealth: Option<bool>,
    /// The telemetry of the connection's browsers (logins, health checks), as on
    /// `POST /browsers`; `{}` turns it off.
    pub telemetry: Option<TelemetryRequest>,
}

/// `PATCH /auth/connections/{id}`: absent fields are left as they are.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateAuthConnectionRequest {
    /// Replaces the further domains the login may pass through or end on.
    #[schema(schema_with = crate::api::openapi::allowed_domains)]
    pub allowed_domains: Option<Vec<String>>,
    /// Whether a health check that finds the profile logged out logs in again with the
    /// saved values (otherwise the connection turns NEEDS_AUTH).
    pub auto_reauth: Option<bool>,
    pub browser: Option<ConnectionBrowserRequest>,
    /// Deprecated form of `browser.telemetry`.
    pub browser_telemetry: Option<TelemetryRequest>,
    /// A new credential to log in with; `null` removes it.
    #[serde(default, deserialize_with = "crate::api::browsers::present")]
    #[schema(schema_with = crate::api::openapi::credential_reference)]
    pub credential: Option<Option<CredentialReference>>,
    /// Seconds between health checks, from the server's minimum
    /// (`--min-health-check-interval`, default 300) to 86400; the next check moves to one
    /// new interval from now.
    #[schema(minimum = 300, maximum = 86400)]
    pub health_check_interval: Option<i64>,
    /// Whether health checks run at all.
    pub health_checks: Option<bool>,
    /// The login page; `""` clears it (the domain's home page is tried).
    #[schema(schema_with = crate::api::openapi::new_login_url)]
    pub login_url: Option<String>,
    /// Deprecated form of `browser.proxy`.
    pub proxy: Option<ResourceReference>,
    /// Whether login flows record their browser as a replay (listed in the timeline).
    pub record_session: Option<bool>,
    /// Whether a successful login saves its values; existing saved values stay until the
    /// next successful login.
    pub save_credentials: Option<bool>,
}

/// Where a connection's logins take their values from: `{name}` (a credential, by name
/// or id), `{provider, path}` (a provider's item, `Vault/Item`) or `{provider, auto:
/// true}` (the provider's item with a URL on the connection's domain).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialReference {
    pub name: Option<String>,
    pub provider: Option<String>,
    pub path: Option<String>,
    pub auto: Option<bool>,
}

/// The site a connection logs in to: its domain and allowed domains.
pub struct Target<'a> {
    pub domain: &'a str,
    pub allowed_domains: &'a [String],
}

/// The credential a request names, checked to exist in the organization (404 when it
/// does not, as for a proxy) and, for a stored credential, to be for the connection's
/// site (409 when it is for another).
pub async fn checked_credential(
    state: &AppState, org_id: &str, reference: CredentialReference, target: Target<'_>,
) -> Result<CredentialRef, ApiError> {
    let invalid = |message: &str| ApiError::invalid_field(format!("credential: {message}"));
    let not_found = |kind: &'static str, id: String| {
        move |error: ServiceError| match error {
            ServiceError::NotFound(_) => ApiError::not_found(kind, &id),
            other => other.into(),
        }
    };
    // The shape first (a 400), then whether what it names exists (a 404).
    match reference {
        CredentialReference { name: Some(name), provider: None, path: None, auto: None } => {
            let found = state
                .credentials
                .get(org_id, &name)
                .await
                .map_err(not_found("credential", name.clone()))?;
            // A credential is for its domain: it is not given to another site.
            let domain = &found.settings.domain;
            if !in_domains(&format!("http://{domain}/"), target.domain, target.allowed_domains) {
                return Err(ApiError::Conflict(format!(
                    "credential: credential {name:?} is for {domain}, not for {} or its allowed domains",
                    target.domain
                )));
            }
            Ok(CredentialRef {
                name: Some(name),
                credential_id: Some(found.id),
                ..CredentialRef::default()
            })
        }
        CredentialReference { name: None, provider: Some(provider), path, auto } => {
            let path = match (path, auto) {
                (Some(path), None) => {
                    let well_formed = path
                        .split_once('/')
                        .is_some_and(|(vault, item)| !vault.is_empty() && !item.is_empty());
                    if !well_formed {
                        return Err(invalid("path must be Vault/Item"));
                    }
                    Some(path)
                }
                (None, Some(true)) => None,
                _ => {
                    return Err(invalid(
                        "with provider, give either path (Vault/Item) or auto: true",
                    ));
                }
            };
            let found = state
                .credentials
                .onepassword
                .get(org_id, &provider)
                .await
                .map_err(not_found("credential provider", provider.clone()))?;
            Ok(CredentialRef {
                auto: path.is_none().then_some(true),
                path,
                provider: Some(provider),
                provider_id: Some(found.id),
                ..CredentialRef::default()
            })
        }
        _ => Err(invalid(
            "give {name} for a stored credential, {provider, path} or {provider, auto: true}",
        )),
    }
}

/// The proxy a connection's browsers are to use, if the request says: `Some(None)` for
/// none. `browser.proxy` and the deprecated `proxy` cannot be combined.
pub async fn chosen_proxy(
    state: &AppState, org_id: &str, browser_proxy: Option<ProxySelection>,
    deprecated: Option<ResourceReference>,
) -> Result<Option<Option<String>>, ApiError> {
    let reference = match (browser_proxy, deprecated) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid_field("browser.proxy cannot be combined with proxy"));
        }
        (None, None) => return Ok(None),
        (None, Some(reference)) => reference,
        (Some(selection), None) => {
            // Checked for exactly one of id, name or mode.
            if selection.proxy("browser.proxy").map_err(ApiError::invalid_field)?.is_none() {
                return Ok(Some(None));
            }
            ResourceReference { id: selection.id, name: selection.name }
        }
    };
    Ok(Some(Some(resolve_proxy(state, org_id, reference).await?)))
}

/// The telemetry a connection's browsers start with, from `browser.telemetry` or the
/// deprecated `browser_telemetry` (`Some(None)`: none, as `{}` asks); its destination must
/// be the organization's.
pub async fn chosen_telemetry(
    org: &Org, browser: Option<&ConnectionBrowserRequest>,
    browser_telemetry: Option<TelemetryRequest>,
) -> Result<Option<Option<TelemetryRequest>>, ApiError> {
    let Some(request) = browser.and_then(|b| b.telemetry.clone()).or(browser_telemetry) else {
        return Ok(None);
    };
    let resolved = telemetry::on_create(Some(&request)).map_err(ApiError::invalid_fields)?;
    if let Some(Some(reference)) = &resolved.export {
        let key = reference.id.clone().or(reference.name.clone()).unwrap_or_default();
        if org.store.destination(&org.id, &key).await?.is_none() {
            return Err(ApiError::NotFound(format!(
                "browser.telemetry.export.otlp.destination: no destination {key:?} in this organization"
            )));
        }
    }
    Ok(Some(resolved.settings.map(|_| request)))
}

/// What create and update check first: every resource the settings refer to must exist
/// and be the caller's to use (else the 404 or 403 is the answer); then the settings'
/// problems, for the caller to add its own to.
pub async fn checked_references(
    org: &Org, profile_name: Option<&str>, credential: Option<&CredentialReference>,
    browser: Option<&ConnectionBrowserRequest>, browser_telemetry: Option<&TelemetryRequest>,
    proxy: Option<&ResourceReference>,
) -> Result<Vec<String>, ApiError> {
    org.require(&references(profile_name, credential, browser, browser_telemetry, proxy)).await?;
    Ok(settings_problems(org, browser, browser_telemetry))
}

/// What is wrong with the settings both create and update take.
pub fn settings_problems(
    state: &AppState, browser: Option<&ConnectionBrowserRequest>,
    browser_telemetry: Option<&TelemetryRequest>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let given = browser.and_then(|b| b.telemetry.as_ref());
    if given.is_some() && browser_telemetry.is_some() {
        problems.push("browser_telemetry: give browser.telemetry only (browser_telemetry is its deprecated form)".into());
    }
    if let Some(Err(wrong)) = given.or(browser_telemetry).map(|t| telemetry::on_create(Some(t))) {
        problems.extend(wrong.into_iter().map(|p| format!("browser.{p}")));
    }
    if let Some(asked) =
        browser.and_then(|b| b.region.as_deref()).filter(|asked| *asked != state.settings.region)
    {
        problems.push(format!(
            "browser.region: this server serves {:?} only, not {asked:?}",
            state.settings.region
        ));
    }
    problems
}

/// What is wrong with `allowed_domains`.
pub fn allowed_domains_problems(domains: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    if domains.len() > MAX_ALLOWED_DOMAINS {
        problems.push(format!("allowed_domains: at most {MAX_ALLOWED_DOMAINS}"));
    }
    problems.extend(domains.iter().enumerate().filter_map(|(index, domain)| {
        domain_problem(&format!("allowed_domains[{index}]"), domain, true)
    }));
    problems
}

/// What is wrong with a health check interval.
pub fn interval_problem(state: &AppState, interval: i64) -> Option<String> {
    let minimum = state.managed_auth.min_health_check_interval;
    (!(minimum..=MAX_HEALTH_CHECK_INTERVAL).contains(&interval)).then(|| {
        format!(
            "health_check_interval must be between {minimum} and {MAX_HEALTH_CHECK_INTERVAL} seconds, got {interval}"
        )
    })
}

/// Most `allowed_domains` a connection may have.
pub(in crate::api) const MAX_ALLOWED_DOMAINS: usize = 50;
const MAX_URL_LENGTH: usize = 2048;

pub(in crate::api) fn domain_problem(field: &str, domain: &str, wildcard: bool) -> Option<String> {
    let bare = if wildcard { domain.strip_prefix("*.").unwrap_or(domain) } else { domain };
    let valid = !bare.is_empty()
        && bare.len() <= 253
        && bare
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
        && url::Url::parse(&format!("http://{bare}/"))
            .is_ok_and(|url| url.host_str().is_some() && url.path() == "/");
    (!valid).then(|| format!("{field} must be a host name, optionally with a port (no scheme or path), got {domain:?}"))
}

pub(in crate::api) fn url_problem(field: &str, value: &str) -> Option<String> {
    let valid = value.len() <= MAX_URL_LENGTH
        && url::Url::parse(value)
            .is_ok_and(|url| matches!(url.scheme(), "http" | "https") && url.host_str().is_some());
    (!valid).then(|| {
        format!("{field} must be an http or https URL of at most {MAX_URL_LENGTH} characters")
    })
}

pub(in crate::api) async fn resolve_proxy(
    state: &AppState, org_id: &str, reference: ResourceReference,
) -> Result<String, ApiError> {
    let proxies = state.store.list_proxies(org_id).await?;
    let found = match (&reference.id, &reference.name) {
        (Some(id), None) => proxies.iter().find(|p| &p.id == id),
        (None, Some(name)) => proxies.iter().find(|p| p.name.as_deref() == Some(name.as_str())),
        _ => {
            return Err(ApiError::invalid_field("proxy must have exactly one of id or name"));
        }
    };
    let proxy = found
        .ok_or_else(|| ApiError::NotFound("proxy: no such proxy in this organization".into()))?;
    crate::proxies::connectable_route(proxy, &state.proxy_upstreams, &state.egress)
        .await
        .map_err(|reason| ApiError::invalid_field(format!("proxy: {reason}")))?;
    Ok(proxy.id.clone())
}
