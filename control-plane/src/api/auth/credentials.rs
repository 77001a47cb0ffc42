//! `/credentials`: login values and a TOTP seed for a domain, which auth connections log
//! in with. Values and seeds are write-only; a current code is the only secret that leaves.

use std::collections::BTreeMap;

use axum::Json;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::connection_settings::domain_problem;
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{JsonBody, PathParam, QueryParams};
use crate::api::org::Org;
use crate::api::paging::list_query;
use crate::api::paging::{Paging, page_of};
use crate::credentials::totp::{GivenSettings, TotpAlgorithm};
use crate::credentials::{Credential as Stored, CredentialChange, NewCredential, TotpCode};

/// A credential as the SDKs read it: never its values or TOTP seed.
#[derive(Debug, Serialize, ToSchema)]
pub struct Credential {
    pub id: String,
    pub name: String,
    pub domain: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub has_values: bool,
    pub has_totp_secret: bool,
    pub sso_provider: Option<String>,
    /// SHA1, SHA256 or SHA512, while there is a TOTP seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub totp_algorithm: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub totp_digits: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub totp_period: Option<u32>,
    /// Names of the stored values (not in lists).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_keys: Option<Vec<String>>,
    /// The current code, only in the answer that set the seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub totp_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub totp_code_expires_at: Option<DateTime<Utc>>,
}

fn view(credential: Stored, code: Option<TotpCode>, with_keys: bool) -> Credential {
    let settings = credential.settings;
    Credential {
        id: credential.id,
        name: credential.name,
        domain: settings.domain,
        created_at: credential.created_at,
        updated_at: credential.updated_at,
        has_values: !settings.value_keys.is_empty(),
        has_totp_secret: settings.totp.is_some(),
        sso_provider: settings.sso_provider,
        totp_algorithm: settings.totp.map(|totp| totp.algorithm.as_str()),
        totp_digits: settings.totp.map(|totp| totp.digits),
        totp_period: settings.totp.map(|totp| totp.period),
        value_keys: with_keys.then_some(settings.value_keys),
        totp_code: code.as_ref().map(|code| code.code.clone()),
        totp_code_expires_at: code.map(|code| code.expires_at),
    }
}

/// A request struct whose last fields are the TOTP settings, as create and update take them.
macro_rules! with_totp_settings {
    ($(#[$meta:meta])* pub struct $name:ident { $($fields:tt)* }) => {
        $(#[$meta])*
        pub struct $name {
            $($fields)*
            /// SHA1 (default), SHA256 or SHA512; an otpauth URI's own parameter wins.
            #[schema(schema_with = crate::api::openapi::totp_algorithm)]
            pub totp_algorithm: Option<String>,
            /// 6 (default) to 8.
            #[schema(minimum = 6, maximum = 8)]
            pub totp_digits: Option<u32>,
            /// Seconds, 10 to 300 (default 30).
            #[schema(minimum = 10, maximum = 300)]
            pub totp_period: Option<u32>,
        }
    };
}

with_totp_settings!(
    /// (No `Debug`: it holds secrets.)
    #[derive(Deserialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    pub struct CreateCredentialRequest {
        /// Unique in the organization; 1 to 255 characters without control characters.
        #[schema(schema_with = crate::api::openapi::display_name)]
        pub name: String,
        /// The site's host name, optionally with a port (no scheme or path).
        #[schema(schema_with = crate::api::openapi::host_and_port)]
        pub domain: String,
        /// Field name → value (e.g. username, password). Write-only.
        pub values: BTreeMap<String, String>,
        /// Click this SSO provider's button on the site, then fill on its page.
        pub sso_provider: Option<String>,
        /// A 16 to 128 character base32 seed or an `otpauth://totp/…` URI. Write-only.
        pub totp_secret: Option<String>,
    }
);

fn given_settings(
    algorithm: Option<&str>, digits: Option<u32>, period: Option<u32>,
) -> Result<GivenSettings, ApiError> {
    Ok(GivenSettings {
        algorithm: algorithm
            .map(TotpAlgorithm::parse)
            .transpose()
            .map_err(ApiError::invalid_field)?,
        digits,
        period,
    })
}

/// Create a credential. The answer has the current TOTP code when a seed was given.
#[utoipa::path(post, path = "/credentials", request_body = CreateCredentialRequest,
    responses((status = 200, body = Credential), (status = 409, body = ErrorBody)))]
pub async fn create(
    org: Org, JsonBody(request): JsonBody<CreateCredentialRequest>,
) -> Result<Json<Credential>, ApiError> {
    if let Some(problem) = domain_problem("domain", &request.domain, false) {
        return Err(ApiError::invalid_field(problem));
    }
    let totp = given_settings(
        request.totp_algorithm.as_deref(),
        request.totp_digits,
        request.totp_period,
    )?;
    let (credential, code) = org
        .credentials
        .create(
            &org.id,
            NewCredential {
                name: request.name,
                domain: request.domain,
                values: request.values,
                sso_provider: request.sso_provider,
                totp_secret: request.totp_secret,
                totp,
            },
        )
        .await?;
    Ok(Json(view(credential, code, true)))
}

list_query! {
    /// `domain`, `query`, `limit` and `offset`.
    pub struct CredentialListQuery {
        /// Only those for this domain (case-insensitive).
        pub domain: Option<String>,
        /// Only those whose name or domain contains this text (case-insensitive), or whose id
        /// is this.
        pub query: Option<String>,
    }
}

/// List the organization's credentials, oldest first (paged).
#[utoipa::path(get, path = "/credentials", params(CredentialListQuery),
    responses((status = 200, body = Vec<Credential>)))]
pub async fn list(
    org: Org, paging: Paging, QueryParams(query): QueryParams<CredentialListQuery>,
) -> Result<impl IntoResponse, ApiError> {
    let mut credentials = org.credentials.list(&org.id).await?;
    if let Some(domain) = &query.domain {
        credentials.retain(|c| c.settings.domain.eq_ignore_ascii_case(domain));
    }
    if let Some(text) = query.query.as_deref().filter(|text| !text.is_empty()) {
        let lowered = text.to_lowercase();
        credentials.retain(|c| {
            c.id == text
                || c.name.to_lowercase().contains(&lowered)
                || c.settings.domain.contains(&lowered)
        });
    }
    let (headers, page) = page_of(paging, credentials, query.limit, query.offset)?;
    let body: Vec<Credential> = page.into_iter().map(|c| view(c, None, false)).collect();
    Ok((headers, Json(body)))
}

/// Get a credential by id or name.
#[utoipa::path(get, path = "/credentials/{id_or_name}",
    responses((status = 200, body = Credential)))]
pub async fn retrieve(
    org: Org, PathParam(id_or_name): PathParam<String>,
) -> Result<Json<Credential>, ApiError> {
    let credential = org.credentials.get(&org.id, &id_or_name).await?;
    Ok(Json(view(credential, None, true)))
}

with_totp_settings!(
    /// Fields of `PATCH /credentials/{id_or_name}`; absent fields stay as they are. (No
    /// `Debug`: it holds secrets.)
    #[derive(Default, Deserialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    pub struct UpdateCredentialRequest {
        #[schema(schema_with = crate::api::openapi::optional_display_name)]
        pub name: Option<String>,
        /// Merged into the stored values (after `remove_value_keys`).
        pub values: Option<BTreeMap<String, String>>,
        /// Stored values to remove.
        pub remove_value_keys: Option<Vec<String>>,
        /// `""` or `null` removes it.
        #[serde(default, deserialize_with = "crate::api::browsers::present")]
        #[schema(value_type = Option<String>)]
        pub sso_provider: Option<Option<String>>,
        /// A new seed or otpauth URI; `""` removes the seed and its settings.
        pub totp_secret: Option<String>,
    }
);

/// Update a credential. The answer has the current TOTP code when a seed was set.
#[utoipa::path(patch, path = "/credentials/{id_or_name}", request_body = UpdateCredentialRequest,
    responses((status = 200, body = Credential), (status = 409, body = ErrorBody)))]
pub async fn update(
    org: Org, PathParam(id_or_name): PathParam<String>,
    JsonBody(request): JsonBody<UpdateCredentialRequest>,
) -> Result<Json<Credential>, ApiError> {
    let totp = given_settings(
        request.totp_algorithm.as_deref(),
        request.totp_digits,
        request.totp_period,
    )?;
    let change = CredentialChange {
        name: request.name,
        values: request.values,
        remove_value_keys: request.remove_value_keys.unwrap_or_default(),
        sso_provider: request.sso_provider,
        totp_secret: request.totp_secret,
        totp,
    };
    let (credential, code) = org.credentials.update(&org.id, &id_or_name, change).await?;
    Ok(Json(view(credential, code, true)))
}

/// Delete a credential. Refused (409) while an auth connection logs in with it.
#[utoipa::path(delete, path = "/credentials/{id_or_name}",
    responses((status = 204), (status = 409, body = ErrorBody)))]
pub async fn delete(
    org: Org, PathParam(id_or_name): PathParam<String>,
) -> Result<StatusCode, ApiError> {
    let credential = org.credentials.get(&org.id, &id_or_name).await?;
    if let Some(connection) = org
        .managed_auth
        .connection_using_credential(&org.id, &credential.id, &credential.name)
        .await?
    {
        return Err(ApiError::Conflict(format!(
            "auth connection {connection} logs in with this credential; change or delete it first"
        )));
    }
    org.credentials.delete(&org.id, &credential.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The current code and when it expires.
#[derive(Debug, Serialize, ToSchema)]
pub struct TotpCodeResponse {
    pub code: String,
    pub expires_at: DateTime<Utc>,
}

/// The credential's current TOTP code (404 when it has no seed).
#[utoipa::path(get, path = "/credentials/{id_or_name}/totp-code",
    responses((status = 200, body = TotpCodeResponse),
        (status = 404, description = "No such credential, or it has no TOTP secret", body = ErrorBody)))]
pub async fn totp_code(
    org: Org, PathParam(id_or_name): PathParam<String>,
) -> Result<Json<TotpCodeResponse>, ApiError> {
    let code = org.credentials.totp_code(&org.id, &id_or_name).await?;
    Ok(Json(TotpCodeResponse { code: code.code, expires_at: code.expires_at }))
}
