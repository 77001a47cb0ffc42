//! `/org/limits` and `/org/entitlements`: what the organization may use on this server
//! and how much of it it uses, reported as the server really enforces it.

use axum::Json;
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::api::error::ApiError;
use crate::api::extract::JsonBody;
use crate::api::org::Org;
use crate::managed_auth::{DEFAULT_HEALTH_CHECK_INTERVAL, MAX_HEALTH_CHECK_INTERVAL};
use crate::store::scope;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateOrgLimits {
    /// The organization's own cap on concurrent browsers (on demand and reserved by
    /// pools together), at most `max_concurrent_sessions`; 0 removes it, omitted leaves
    /// it unchanged.
    #[serde(default, deserialize_with = "present")]
    default_project_max_concurrent_sessions: Option<Option<i64>>,
}

/// Present (even as `null`) or not: `null` leaves the cap unchanged, as omitting does.
pub(in crate::api) fn present<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Option<i64>>, D::Error> {
    Ok(Some(Option::deserialize(deserializer)?))
}

async fn limits_view(org: &Org) -> Result<Value, ApiError> {
    let offer = &org.settings.offer;
    let on_demand = org.store.live_browser_count(&org.id).await? as i64;
    let reserved: i64 =
        org.store.list_pools(Some(&org.id)).await?.iter().map(|pool| pool.size).sum();
    let auth_connections = org.store.list_auth_connections(Some(&org.id)).await?.len();
    let cap = org.store.concurrency_cap(&org.id).await?;
    let max = offer.max_concurrent_browsers();
    let used = on_demand + reserved;
    let effective = cap.map_or(max, |cap| cap.min(max));
    Ok(json!({
        "max_concurrent_sessions": max,
        "default_project_max_concurrent_sessions": cap,
        "concurrent_sessions_used": used,
        "concurrent_sessions_available": (effective - used).max(0),
        "auth_connections_used": auth_connections,
        "max_auth_connections": null,
        "min_health_check_interval_seconds": offer.min_health_check_interval,
        "vaults_used": 0,
        "max_vaults": null,
    }))
}

/// The organization's concurrency limits and what it uses of them now.
#[utoipa::path(get, path = "/org/limits", responses((status = 200, description = "OrgLimits")))]
pub async fn limits(org: Org) -> Result<Json<Value>, ApiError> {
    Ok(Json(scope::organization_wide(limits_view(&org)).await?))
}

/// Set the organization's own cap on concurrent browsers (below the server's).
#[utoipa::path(patch, path = "/org/limits", request_body = UpdateOrgLimits,
    responses((status = 200, description = "OrgLimits")))]
pub async fn update_limits(
    org: Org, JsonBody(request): JsonBody<UpdateOrgLimits>,
) -> Result<Json<Value>, ApiError> {
    if let Some(Some(cap)) = request.default_project_max_concurrent_sessions {
        let max = org.settings.offer.max_concurrent_browsers();
        if !(0..=max).contains(&cap) {
            return Err(ApiError::invalid_field(format!(
                "default_project_max_concurrent_sessions: give 0 (no cap) to {max}, the organization's concurrency limit"
            )));
        }
        org.store.set_concurrency_cap(&org.id, (cap > 0).then_some(cap)).await?;
    }
    Ok(Json(scope::organization_wide(limits_view(&org)).await?))
}

/// What this server offers the organization: every feature it serves, on or off as
/// configured, and its limits.
#[utoipa::path(get, path = "/org/entitlements",
    responses((status = 200, description = "OrgEntitlements")))]
pub async fn entitlements(org: Org) -> Result<Json<Value>, ApiError> {
    let offer = &org.settings.offer;
    let on = |enabled: bool| json!({ "enabled": enabled });
    Ok(Json(json!({
        "features": {
            "browser_extensions": { "enabled": true, "max_stored_per_org": null },
            "browser_pools": on(offer.max_pooled_browsers > 0),
            // No reaper deletes replays: they are kept until deleted (0: no limit).
            "browser_replays": { "enabled": true, "retention_days": 0 },
            "credential_providers": on(offer.credential_providers),
            "credentials": on(true),
            "custom_proxies": on(true),
            "file_io": on(true),
            "gpu": on(false),
            "managed_auth": {
                "enabled": true,
                "health_check_interval_default_seconds":
                    DEFAULT_HEALTH_CHECK_INTERVAL.max(offer.min_health_check_interval),
                "health_check_interval_min_seconds": offer.min_health_check_interval,
                "health_check_interval_max_seconds": MAX_HEALTH_CHECK_INTERVAL,
                "max_connections": null,
            },
            "managed_proxies": on(offer.managed_proxies),
            "profiles": on(true),
            "proxy_bypass_hosts": on(true),
            "search": on(false),
            "vaults": on(false),
        },
        "limits": {
            "max_concurrent_browsers": offer.max_concurrent_browsers(),
            "max_concurrent_invocations": offer.max_running_invocations,
            "default_max_concurrent_invocations_per_app": offer.max_running_invocations,
            "max_vaults": null,
        },
        // A self-hosted server has no plans: everything it serves is on.
        "plan": {
            "id": "ENTERPRISE",
            "effective_id": "ENTERPRISE",
            "is_trialing": false,
            "status": null,
            "trial_ends_at": null,
        },
    })))
}
