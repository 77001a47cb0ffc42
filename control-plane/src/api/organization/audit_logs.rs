//! `/audit-logs`: the organization's audit log (`crate::audit`), newest first: a page at
//! a time for people (`list`, at most 30 days, page tokens), or in chunks of JSON Lines
//! for archives (`export/chunk`, cursors, each chunk with its SHA-256 as the SDK's
//! `download` verifies).

use std::io::Write;

use axum::Json;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::IntoResponse;
use chrono::{DateTime, TimeDelta, Utc};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use utoipa::{IntoParams, ToSchema};

use crate::api::error::ApiError;
use crate::api::extract::QueryParams;
use crate::api::org::Org;
use crate::audit::{self, view};
use crate::store::{AuditQuery, AuditRecord};

/// The longest range one `list` searches.
const MAX_LIST_RANGE: TimeDelta = TimeDelta::days(30);
const DEFAULT_LIST_LIMIT: i64 = 50;
const MAX_LIST_LIMIT: i64 = 100;
const DEFAULT_CHUNK_ROWS: i64 = 5_000;
/// The SDK's `download` refuses chunks of more rows.
const MAX_CHUNK_ROWS: i64 = 50_000;

/// A read's query parameters: the filters both reads take, then its own (`$own`), the
/// end's description its own too.
macro_rules! audit_search {
    ($(#[$meta:meta])* $name:ident, end: $end:literal, { $($own:tt)* }) => {
        $(#[$meta])*
        #[derive(Debug, Deserialize, IntoParams)]
        #[into_params(parameter_in = Query)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            /// Records at or after this time (RFC 3339).
            start: DateTime<Utc>,
            #[doc = $end]
            end: DateTime<Utc>,
            /// `api_key`, `invocation_key` or `session_token`.
            auth_strategy: Option<String>,
            /// Methods to leave out, comma-separated.
            exclude_method: Option<String>,
            method: Option<String>,
            /// Text in the path, key id, client address or status.
            search: Option<String>,
            /// Key ids also matched, comma-separated.
            search_user_id: Option<String>,
            /// Only `api` has records.
            service: Option<String>,
            $($own)*
        }
    };
}

audit_search!(ListAuditLogs, end: "Records before this time (RFC 3339); at most 30 days after `start`.", {
    /// 1 to 100, default 50.
    #[param(minimum = 1, maximum = 100)]
    limit: Option<i64>,
    /// `X-Next-Page-Token` of the previous page.
    page_token: Option<String>,
});

#[derive(Clone, Copy, Debug, Default, Deserialize, ToSchema)]
pub enum ChunkFormat {
    #[serde(rename = "jsonl")]
    Jsonl,
    #[default]
    #[serde(rename = "jsonl.gz")]
    JsonlGz,
}

audit_search!(ExportChunk, end: "Records before this time (RFC 3339).", {
    /// `jsonl.gz` (default) or `jsonl`.
    #[param(inline)]
    format: Option<ChunkFormat>,
    /// Records in this chunk: 1 to 50000, default 5000.
    #[param(minimum = 1, maximum = 50000)]
    limit: Option<i64>,
    /// `X-Next-Cursor` of the previous chunk.
    cursor: Option<String>,
});

fn comma_list(text: Option<&str>) -> Vec<String> {
    text.unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_owned)
        .collect()
}

struct Filters<'a> {
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    auth_strategy: Option<&'a str>,
    exclude_method: Option<&'a str>,
    method: Option<&'a str>,
    search: Option<&'a str>,
    search_user_id: Option<&'a str>,
    token: Option<&'a str>,
    token_name: &'static str,
}

/// The `Filters` of a search's parameters (`ListAuditLogs` or `ExportChunk`), whose
/// position in the records is parameter `$token`.
macro_rules! filters_of {
    ($params:ident, $token:ident) => {
        Filters {
            start: $params.start,
            end: $params.end,
            auth_strategy: $params.auth_strategy.as_deref(),
            exclude_method: $params.exclude_method.as_deref(),
            method: $params.method.as_deref(),
            search: $params.search.as_deref(),
            search_user_id: $params.search_user_id.as_deref(),
            token: $params.$token.as_deref(),
            token_name: stringify!($token),
        }
    };
}

/// `limit`, or `default`; 1 to `max`.
fn checked_limit(limit: Option<i64>, default: i64, max: i64) -> Result<i64, ApiError> {
    let limit = limit.unwrap_or(default);
    if !(1..=max).contains(&limit) {
        return Err(ApiError::invalid_field(format!("limit must be between 1 and {max}")));
    }
    Ok(limit)
}

/// The store query for `filters`, `limit` + 1 records (to learn whether there are more).
fn query(org: &Org, filters: Filters<'_>, limit: i64) -> Result<AuditQuery, ApiError> {
    if filters.end <= filters.start {
        return Err(ApiError::invalid_field("end must be after start"));
    }
    let before = match filters.token {
        Some(token) => Some(audit::parse_cursor(token).ok_or_else(|| {
            ApiError::invalid_field(format!("{}: not one this server gave", filters.token_name))
        })?),
        None => None,
    };
    Ok(AuditQuery {
        org_id: org.id.clone(),
        since_us: filters.start.timestamp_micros(),
        until_us: filters.end.timestamp_micros(),
        before,
        method: filters.method.unwrap_or_default().to_uppercase(),
        exclude_methods: comma_list(filters.exclude_method)
            .into_iter()
            .map(|method| method.to_uppercase())
            .collect(),
        auth_strategy: filters.auth_strategy.unwrap_or_default().to_owned(),
        search: filters.search.unwrap_or_default().to_owned(),
        search_key_ids: comma_list(filters.search_user_id)
            .into_iter()
            .map(|id| id.to_lowercase())
            .collect(),
        limit: limit + 1,
    })
}

/// Reads a page: the records, and whether more follow.
async fn read(
    org: &Org, service: Option<&str>, query: AuditQuery,
) -> Result<(Vec<AuditRecord>, bool), ApiError> {
    if service.is_some_and(|service| !service.is_empty() && service != view::SERVICE) {
        return Ok((Vec::new(), false));
    }
    let wanted = (query.limit - 1) as usize;
    let mut records = org.audit.read(&query).await?;
    let has_more = records.len() > wanted;
    records.truncate(wanted);
    Ok((records, has_more))
}

fn header_value(text: &str) -> HeaderValue {
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The organization's audit records in a time range (at most 30 days), newest first;
/// `X-Next-Page-Token` pages to older ones.
#[utoipa::path(get, path = "/audit-logs", params(ListAuditLogs),
    responses((status = 200, description = "[AuditLogEntry]")))]
pub async fn list(
    org: Org, QueryParams(params): QueryParams<ListAuditLogs>,
) -> Result<impl IntoResponse, ApiError> {
    if params.end - params.start > MAX_LIST_RANGE {
        return Err(ApiError::invalid_field(
            "a search covers at most 30 days: narrow start and end (or use export/chunk)",
        ));
    }
    let limit = checked_limit(params.limit, DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)?;
    let store_query = query(&org, filters_of!(params, page_token), limit)?;
    let (records, has_more) = read(&org, params.service.as_deref(), store_query).await?;
    let mut headers = HeaderMap::new();
    headers.insert("x-has-more", HeaderValue::from_static(if has_more { "true" } else { "false" }));
    if has_more && let Some(last) = records.last() {
        headers.insert("x-next-page-token", header_value(&audit::cursor_after(last)));
    }
    let body: Vec<Value> = records.iter().map(view::entry).collect();
    Ok((headers, Json(body)))
}

/// One chunk of the organization's audit records in a time range, newest first, as JSON
/// Lines (gzip-compressed unless `format=jsonl`), with `X-Row-Count`, `X-Has-More`,
/// `X-Next-Cursor` and `X-Content-Sha256` (of the body as sent).
#[utoipa::path(get, path = "/audit-logs/export/chunk", params(ExportChunk),
    responses((status = 200, description = "JSON Lines, gzip-compressed unless format=jsonl", content((Vec<u8> = "application/gzip"), (String = "application/x-ndjson")))))]
pub async fn export_chunk(
    org: Org, QueryParams(params): QueryParams<ExportChunk>,
) -> Result<impl IntoResponse, ApiError> {
    let limit = checked_limit(params.limit, DEFAULT_CHUNK_ROWS, MAX_CHUNK_ROWS)?;
    let store_query = query(&org, filters_of!(params, cursor), limit)?;
    let (records, has_more) = read(&org, params.service.as_deref(), store_query).await?;
    let mut lines = Vec::new();
    for record in &records {
        lines.extend_from_slice(view::entry(record).to_string().as_bytes());
        lines.push(b'\n');
    }
    let format = params.format.unwrap_or_default();
    let (body, content_type) = match format {
        ChunkFormat::Jsonl => (lines, "application/x-ndjson"),
        ChunkFormat::JsonlGz => {
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            encoder
                .write_all(&lines)
                .and_then(|()| encoder.finish())
                .map(|gz| (gz, "application/gzip"))
                .map_err(|error| ApiError::Internal(anyhow::anyhow!("gzip: {error}")))?
        }
    };
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert("x-row-count", header_value(&records.len().to_string()));
    headers.insert("x-has-more", HeaderValue::from_static(if has_more { "true" } else { "false" }));
    if has_more && let Some(last) = records.last() {
        headers.insert("x-next-cursor", header_value(&audit::cursor_after(last)));
    }
    headers.insert("x-content-sha256", header_value(&hex::encode(Sha256::digest(&body))));
    Ok((headers, body))
}
