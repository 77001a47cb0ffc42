//! `/org/credential_providers`: external password managers (1Password, through the
//! operator's Connect server) that auth connections take login values from. Tokens are
//! write-only.

use axum::Json;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{JsonBody, PathParam, QueryParams};
use crate::api::org::Org;
use crate::api::paging::{NamedListQuery, Paging};
use crate::credentials::onepassword::{
    NewProvider, Provider, ProviderChange, ProviderItem, VaultSummary,
};
use crate::error::ServiceError;

/// A credential provider as the SDKs read it: never its token.
#[derive(Debug, Serialize, ToSchema)]
pub struct CredentialProvider {
    pub id: String,
    pub name: String,
    /// `onepassword`.
    pub provider_type: String,
    pub enabled: bool,
    /// Lower is asked first.
    pub priority: i64,
    /// How long its item list is reused.
    pub cache_ttl_seconds: u32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<Provider> for CredentialProvider {
    fn from(provider: Provider) -> Self {
        Self {
            id: provider.id,
            name: provider.name,
            provider_type: provider.settings.provider_type,
            enabled: provider.settings.enabled,
            priority: provider.settings.priority,
            cache_ttl_seconds: provider.settings.cache_ttl_seconds,
            created_at: provider.created_at,
            updated_at: provider.updated_at,
        }
    }
}

/// (No `Debug`: it holds the token.)
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateCredentialProviderRequest {
    /// Unique in the organization (trimmed).
    pub name: String,
    /// The provider's access token (for 1Password, a Connect server token). Write-only.
    pub token: String,
    /// `onepassword`.
    pub provider_type: String,
    /// How long the provider's item list is reused, 0 to 86400 seconds (default 300).
    pub cache_ttl_seconds: Option<u32>,
}

/// Add a credential provider.
#[utoipa::path(post, path = "/org/credential_providers",
    request_body = CreateCredentialProviderRequest,
    responses((status = 200, body = CredentialProvider), (status = 409, body = ErrorBody)))]
pub async fn create(
    org: Org, JsonBody(request): JsonBody<CreateCredentialProviderRequest>,
) -> Result<Json<CredentialProvider>, ApiError> {
    let provider = org
        .credentials
        .onepassword
        .create(
            &org.id,
            NewProvider {
                name: request.name,
                token: request.token,
                provider_type: request.provider_type,
                cache_ttl_seconds: request.cache_ttl_seconds,
            },
        )
        .await?;
    Ok(Json(provider.into()))
}

/// List the organization's credential providers, oldest first (paged with
/// `limit`/`offset`; the seed-era SDK reads one plain array).
#[utoipa::path(get, path = "/org/credential_providers", params(NamedListQuery),
    responses((status = 200, body = Vec<CredentialProvider>)))]
pub async fn list(
    org: Org, paging: Paging, QueryParams(query): QueryParams<NamedListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let providers = org.credentials.onepassword.list(&org.id).await?;
    let (headers, page) = query.page_or_all(paging, providers, |p| (&p.id, Some(&p.name)))?;
    let body: Vec<CredentialProvider> = page.into_iter().map(CredentialProvider::from).collect();
    Ok((headers, Json(body)))
}

/// Get a credential provider.
#[utoipa::path(get, path = "/org/credential_providers/{id}",
    responses((status = 200, body = CredentialProvider)))]
pub async fn retrieve(
    org: Org, PathParam(id): PathParam<String>,
) -> Result<Json<CredentialProvider>, ApiError> {
    Ok(Json(org.credentials.onepassword.get(&org.id, &id).await?.into()))
}

/// (No `Debug`: it holds the token.)
#[derive(Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateCredentialProviderRequest {
    pub name: Option<String>,
    /// A new token (rotation). Write-only.
    pub token: Option<String>,
    pub cache_ttl_seconds: Option<u32>,
    pub enabled: Option<bool>,
    pub priority: Option<i64>,
}

/// Update a credential provider; its cached item list is dropped.
#[utoipa::path(patch, path = "/org/credential_providers/{id}",
    request_body = UpdateCredentialProviderRequest,
    responses((status = 200, body = CredentialProvider), (status = 409, body = ErrorBody)))]
pub async fn update(
    org: Org, PathParam(id): PathParam<String>,
    JsonBody(request): JsonBody<UpdateCredentialProviderRequest>,
) -> Result<Json<CredentialProvider>, ApiError> {
    let change = ProviderChange {
        name: request.name,
        token: request.token,
        cache_ttl_seconds: request.cache_ttl_seconds,
        enabled: request.enabled,
        priority: request.priority,
    };
    let provider = org.credentials.onepassword.update(&org.id, &id, change).await?;
    Ok(Json(provider.into()))
}

/// Delete a credential provider. Refused (409) while an auth connection logs in with its
/// items.
#[utoipa::path(delete, path = "/org/credential_providers/{id}",
    responses((status = 204), (status = 409, body = ErrorBody)))]
pub async fn delete(org: Org, PathParam(id): PathParam<String>) -> Result<StatusCode, ApiError> {
    let provider = org.credentials.onepassword.get(&org.id, &id).await?;
    if let Some(connection) =
        org.managed_auth.connection_using_provider(&org.id, &provider.id, &provider.name).await?
    {
        return Err(ApiError::Conflict(format!(
            "auth connection {connection} logs in with this provider's items; change or delete it first"
        )));
    }
    org.credentials.onepassword.delete(&org.id, &provider.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The provider's login items.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProviderItems {
    pub items: Vec<ProviderItem>,
}

/// A provider that cannot be read is a bad gateway, not this server's failure.
fn from_provider(error: ServiceError) -> ApiError {
    match error {
        ServiceError::Unavailable(message) => ApiError::BadGateway(message),
        other => other.into(),
    }
}

/// List the provider's login items (from its cache while fresh).
#[utoipa::path(get, path = "/org/credential_providers/{id}/items",
    responses((status = 200, body = ProviderItems), (status = 502, body = ErrorBody)))]
pub async fn items(
    org: Org, PathParam(id): PathParam<String>,
) -> Result<Json<ProviderItems>, ApiError> {
    let items = org.credentials.onepassword.items(&org.id, &id).await.map_err(from_provider)?;
    Ok(Json(ProviderItems { items }))
}

/// Whether the provider's token works, and the vaults it reaches.
#[derive(Debug, Serialize, ToSchema)]
pub struct TestResult {
    pub success: bool,
    pub vaults: Vec<VaultSummary>,
    /// The provider's error when it failed.
    pub error: Option<String>,
}

/// Test the provider's token against its server.
#[utoipa::path(post, path = "/org/credential_providers/{id}/test",
    responses((status = 200, body = TestResult)))]
pub async fn test(
    org: Org, PathParam(id): PathParam<String>,
) -> Result<Json<TestResult>, ApiError> {
    let result = org.credentials.onepassword.test(&org.id, &id).await?;
    Ok(Json(TestResult { success: result.success, vaults: result.vaults, error: result.error }))
}
