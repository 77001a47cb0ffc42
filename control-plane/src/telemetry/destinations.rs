//! The organizations' OTLP destinations (`/telemetry/destinations`): where sessions
//! export their events. Header values (ingestion keys) are sealed like credentials and
//! never read back: a destination shows its header names with empty values.

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::Utc;
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::ToSchema;

use crate::egress::{EgressError, EgressPolicy};
use crate::error::{ServiceError, ServiceResult};
use crate::ids;
use crate::managed_auth::vault::Vault;
use crate::store::{DestinationRecord, Store, StoreError};

const MAX_HEADER_BYTES: usize = 8192;
const MAX_DESCRIPTION_BYTES: usize = 1024;
const ID_PREFIX: &str = "otlpdst";

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDestination {
    /// Base endpoint of the OTLP/HTTP collector, without a signal path (`/v1/logs` is
    /// appended).
    pub endpoint: String,
    /// Unique within the organization; usable in place of the id.
    pub name: String,
    pub description: Option<String>,
    /// Sent with each export (typically an ingestion key); never read back.
    pub headers: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateDestination {
    pub endpoint: Option<String>,
    pub name: Option<String>,
    pub description: Option<String>,
    /// Edits headers key by key: a string sets one, `null` deletes it.
    pub headers: Option<BTreeMap<String, Option<String>>>,
}

pub struct Destinations {
    store: Arc<dyn Store>,
    vault: Arc<Vault>,
    egress: Arc<EgressPolicy>,
}

/// `Authorization`, `X-Honeycomb-Team`: each dash-separated part capitalized.
fn canonical(name: &str) -> String {
    name.split('-')
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => {
                    first.to_ascii_uppercase().to_string() + &chars.as_str().to_ascii_lowercase()
                }
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}

fn header_problems(headers: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut size = 0;
    for (name, value) in headers {
        size += name.len() + value.len();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            problems.push(format!("headers: {name:?} is not a valid header name"));
        }
        if http::HeaderValue::from_str(value).is_err() {
            problems.push(format!("headers: the value of {name:?} is not a valid header value"));
        }
    }
    if size > MAX_HEADER_BYTES {
        problems
            .push(format!("headers: names and values together exceed {MAX_HEADER_BYTES} bytes"));
    }
    problems
}

/// Names canonicalized; two spellings of one name are refused.
fn canonical_headers(
    headers: BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    let mut canonicalized = BTreeMap::new();
    for (name, value) in headers {
        if canonicalized.insert(canonical(&name), value).is_some() {
            return Err(format!("headers: {name:?} is given twice (names are case-insensitive)"));
        }
    }
    Ok(canonicalized)
}

fn endpoint_problem(endpoint: &str) -> Option<String> {
    let Ok(url) = url::Url::parse(endpoint) else {
        return Some(format!("endpoint: {endpoint:?} is not a URL"));
    };
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Some("endpoint must be an http or https URL".into());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Some("endpoint must carry no query string or fragment".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Some("endpoint must carry no credentials (use headers)".into());
    }
    let path = url.path().trim_end_matches('/');
    if ["/v1/logs", "/v1/traces", "/v1/metrics"].iter().any(|signal| path.ends_with(signal)) {
        return Some(
            "endpoint must not carry a signal path such as /v1/logs: give the base endpoint".into(),
        );
    }
    None
}

fn name_problem(name: &str) -> Option<String> {
    if let Some(problem) = ids::name_problem("name", name) {
        return Some(problem);
    }
    name.starts_with(&format!("{ID_PREFIX}_"))
        .then(|| "name cannot be shaped like a destination id".into())
}

impl Destinations {
    pub fn new(store: Arc<dyn Store>, vault: Arc<Vault>, egress: Arc<EgressPolicy>) -> Self {
        Self { store, vault, egress }
    }

    /// The endpoint's host must be one tenants may reach (the egress policy): one that
    /// resolves only to refused addresses is 403; one that does not resolve yet is judged
    /// again at each delivery, like a custom proxy's host.
    async fn check_reachable(&self, endpoint: &str) -> ServiceResult<()> {
        let url = url::Url::parse(endpoint)
            .map_err(|_| ServiceError::invalid("endpoint is not a URL"))?;
        let host = url.host_str().unwrap_or_default();
        let port = url.port_or_known_default().unwrap_or(443);
        match self.egress.resolve(&format!("{host}:{port}")).await {
            Err(EgressError::Refused(why)) => Err(ServiceError::Forbidden(format!(
                "endpoint: {why} (the operator allows more with --egress-allow)"
            ))),
            _ => Ok(()),
        }
    }

    fn seal(
        &self, id: &str, headers: &BTreeMap<String, String>,
    ) -> ServiceResult<(String, Option<Vec<u8>>)> {
        let names: Vec<&String> = headers.keys().collect();
        let sealed = if headers.is_empty() {
            None
        } else {
            Some(self.vault.seal(headers, id).map_err(ServiceError::Internal)?)
        };
        Ok((json!(names).to_string(), sealed))
    }

    pub async fn create(&self, org_id: &str, request: CreateDestination) -> ServiceResult<Value> {
        let mut problems: Vec<String> =
            [endpoint_problem(&request.endpoint), name_problem(&request.name)]
                .into_iter()
                .flatten()
                .collect();
        if request.description.as_ref().is_some_and(|d| d.len() > MAX_DESCRIPTION_BYTES) {
            problems.push(format!("description: at most {MAX_DESCRIPTION_BYTES} bytes"));
        }
        let headers = request.headers.unwrap_or_default();
        problems.extend(header_problems(&headers));
        let headers = match canonical_headers(headers) {
            Ok(headers) => headers,
            Err(problem) => {
                problems.push(problem);
                BTreeMap::new()
            }
        };
        if !problems.is_empty() {
            return Err(ServiceError::Invalid(problems));
        }
        self.check_reachable(&request.endpoint).await?;
        let id = ids::new_id(ID_PREFIX);
        let (header_names, sealed_headers) = self.seal(&id, &headers)?;
        let now = Utc::now();
        let record = DestinationRecord {
            id,
            org_id: org_id.to_owned(),
            name: request.name.clone(),
            description: request.description,
            endpoint: request.endpoint.trim_end_matches('/').to_owned(),
            header_names,
            sealed_headers,
            created_at: now,
            updated_at: now,
            consecutive_failures: 0,
            last_error: None,
            last_error_at: None,
            last_export_at: None,
        };
        match self.store.insert_destination(&record).await {
            Err(StoreError::Conflict(_)) => Err(ServiceError::Conflict(format!(
                "a destination named {:?} already exists",
                request.name
            ))),
            other => other.map_err(ServiceError::from),
        }?;
        Ok(view(&record))
    }

    pub async fn get(&self, org_id: &str, key: &str) -> ServiceResult<DestinationRecord> {
        self.store
            .destination(org_id, key)
            .await?
            .ok_or_else(|| ServiceError::NotFound(format!("no telemetry destination {key:?}")))
    }

    pub async fn list(&self, org_id: &str) -> ServiceResult<Vec<DestinationRecord>> {
        Ok(self.store.list_destinations(org_id).await?)
    }

    pub async fn update(
        &self, org_id: &str, key: &str, request: UpdateDestination,
    ) -> ServiceResult<Value> {
        let mut record = self.get(org_id, key).await?;
        let mut problems: Vec<String> = [
            request.endpoint.as_deref().and_then(endpoint_problem),
            request.name.as_deref().and_then(name_problem),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut headers: BTreeMap<String, String> = match &record.sealed_headers {
            Some(sealed) => {
                self.vault.open_sealed(sealed, &record.id).map_err(ServiceError::Internal)?
            }
            None => BTreeMap::new(),
        };
        if let Some(changes) = request.headers {
            let mut seen = std::collections::BTreeSet::new();
            for (name, value) in changes {
                let name_canonical = canonical(&name);
                if !seen.insert(name_canonical.clone()) {
                    problems.push(format!(
                        "headers: {name:?} is given twice (names are case-insensitive)"
                    ));
                }
                match value {
                    Some(value) => {
                        problems.extend(header_problems(&BTreeMap::from([(
                            name.clone(),
                            value.clone(),
                        )])));
                        headers.insert(name_canonical, value);
                    }
                    None => {
                        headers.remove(&name_canonical);
                    }
                }
            }
            if headers.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>() > MAX_HEADER_BYTES {
                problems.push(format!(
                    "headers: names and values together exceed {MAX_HEADER_BYTES} bytes"
                ));
            }
        }
        if !problems.is_empty() {
            return Err(ServiceError::Invalid(problems));
        }
        if let Some(endpoint) = request.endpoint {
            self.check_reachable(&endpoint).await?;
            record.endpoint = endpoint.trim_end_matches('/').to_owned();
        }
        if let Some(name) = request.name {
            record.name = name;
        }
        if let Some(description) = request.description {
            record.description = Some(description);
        }
        (record.header_names, record.sealed_headers) = self.seal(&record.id, &headers)?;
        record.updated_at = Utc::now();
        match self.store.update_destination(&record).await {
            Err(StoreError::Conflict(_)) => {
                return Err(ServiceError::Conflict(format!(
                    "a destination named {:?} already exists",
                    record.name
                )));
            }
            other => other?,
        };
        Ok(view(&record))
    }

    pub async fn delete(&self, org_id: &str, key: &str) -> ServiceResult<()> {
        let record = self.get(org_id, key).await?;
        self.store.delete_destination(org_id, &record.id).await?;
        Ok(())
    }
}

/// `OtlpDestination`: header names with empty values.
pub fn view(record: &DestinationRecord) -> Value {
    let names: Vec<String> = serde_json::from_str(&record.header_names).unwrap_or_default();
    let headers: serde_json::Map<String, Value> =
        names.into_iter().map(|name| (name, json!(""))).collect();
    json!({
        "id": record.id,
        "name": record.name,
        "description": record.description,
        "endpoint": record.endpoint,
        "headers": headers,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "consecutive_failures": record.consecutive_failures,
        "last_error": record.last_error,
        "last_error_at": record.last_error_at,
        "last_export_at": record.last_export_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_are_canonical_and_duplicates_refused() {
        assert_eq!(canonical("x-honeycomb-team"), "X-Honeycomb-Team");
        assert_eq!(canonical("AUTHORIZATION"), "Authorization");
        let twice = BTreeMap::from([
            ("authorization".into(), "a".into()),
            ("Authorization".into(), "b".into()),
        ]);
        assert!(canonical_headers(twice).is_err());
    }

    #[test]
    fn endpoints_are_base_urls() {
        assert!(endpoint_problem("https://api.honeycomb.io").is_none());
        assert!(endpoint_problem("https://otlp.example/otlp/").is_none());
        assert!(endpoint_problem("https://api.honeycomb.io/v1/logs").is_some());
        assert!(endpoint_problem("https://a.example?x=1").is_some());
        assert!(endpoint_problem("ftp://a.example").is_some());
        assert!(endpoint_problem("not a url").is_some());
    }
}
