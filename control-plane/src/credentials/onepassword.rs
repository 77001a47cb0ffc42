//! Credential providers of type `onepassword`: 1Password vaults read through a 1Password
//! Connect server the operator runs (`--onepassword-connect-url`), with each provider's
//! token. Only the documented Connect REST API is used: list vaults, list a vault's items,
//! get an item with its fields (https://developer.1password.com/docs/connect/api-reference).
//!
//! The server URL is the operator's, never a tenant's: a tenant cannot make the control
//! plane call an address of its choosing. Item lists are cached per provider for its
//! `cache_ttl_seconds`; item fields are read fresh for every login.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::LoginValues;
use super::secrets::{Secrets, document_of, settings_of};
use super::totp::{self, GivenSettings, TotpSettings};
use crate::error::{ServiceError, ServiceResult};
use crate::ids;
use crate::managed_auth::vault::Vault;
use crate::store::{SecretKind, SecretRecord, Store};

pub const PROVIDER_TYPES: [&str; 1] = ["onepassword"];
pub const DEFAULT_CACHE_TTL_SECONDS: u32 = 300;
const MAX_CACHE_TTL_SECONDS: u32 = 86_400;
const MAX_TOKEN_BYTES: usize = 8192;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// A provider's public settings (the record's document).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProviderSettings {
    pub provider_type: String,
    pub enabled: bool,
    /// Lower is asked first.
    pub priority: i64,
    pub cache_ttl_seconds: u32,
}

#[derive(Clone, Debug)]
pub struct Provider {
    pub id: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub settings: ProviderSettings,
}

/// A login item of a provider.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ProviderItem {
    pub id: String,
    /// `Vault/Title`: how an auth connection names it.
    pub path: String,
    pub title: String,
    pub vault_id: String,
    pub vault_name: String,
    pub urls: Vec<String>,
}

/// A vault as the Connect server lists it (its other fields are ignored).
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VaultSummary {
    pub id: String,
    pub name: String,
}

/// Whether a provider's token works.
#[derive(Clone, Debug)]
pub struct TestResult {
    pub success: bool,
    pub vaults: Vec<VaultSummary>,
    pub error: Option<String>,
}

pub struct NewProvider {
    pub name: String,
    pub token: String,
    pub provider_type: String,
    pub cache_ttl_seconds: Option<u32>,
}

#[derive(Default)]
pub struct ProviderChange {
    pub name: Option<String>,
    pub token: Option<String>,
    pub cache_ttl_seconds: Option<u32>,
    pub enabled: Option<bool>,
    pub priority: Option<i64>,
}

pub struct OnePassword {
    records: Secrets,
    vault: Arc<Vault>,
    connect_url: Option<String>,
    http: reqwest::Client,
    /// Provider id → when its items were read, and them.
    cache: Mutex<HashMap<String, (Instant, Vec<ProviderItem>)>>,
}

impl OnePassword {
    pub fn new(store: Arc<dyn Store>, vault: Arc<Vault>, connect_url: Option<String>) -> Self {
        Self {
            records: Secrets::new(store, SecretKind::CredentialProvider),
            vault,
            connect_url: connect_url.map(|url| url.trim_end_matches('/').to_owned()),
            http: reqwest::Client::builder().timeout(REQUEST_TIMEOUT).build().unwrap_or_default(),
            cache: Mutex::default(),
        }
    }

    pub async fn create(&self, org_id: &str, new: NewProvider) -> ServiceResult<Provider> {
        let name = new.name.trim().to_owned();
        let mut problems = Vec::new();
        problems.extend(super::name_problem(&name));
        problems.extend(token_problem(&new.token));
        if !PROVIDER_TYPES.contains(&new.provider_type.as_str()) {
            problems.push(format!(
                "provider_type must be one of {}, got {:?}",
                PROVIDER_TYPES.join(", "),
                new.provider_type
            ));
        } else if self.connect_url.is_none() {
            problems.push(
                "provider_type onepassword needs a 1Password Connect server, which this \
                 server's operator has not configured (--onepassword-connect-url)"
                    .into(),
            );
        }
        let ttl = new.cache_ttl_seconds.unwrap_or(DEFAULT_CACHE_TTL_SECONDS);
        problems.extend(ttl_problem(ttl));
        if !problems.is_empty() {
            return Err(ServiceError::Invalid(problems));
        }
        let now = Utc::now();
        let id = ids::new_id("cp");
        let settings = ProviderSettings {
            provider_type: new.provider_type,
            enabled: true,
            priority: 0,
            cache_ttl_seconds: ttl,
        };
        let record = SecretRecord {
            sealed: Some(self.vault.seal(&new.token, &self.records.owner(org_id, &id))?),
            id,
            org_id: org_id.to_owned(),
            kind: SecretKind::CredentialProvider,
            name,
            created_at: now,
            updated_at: now,
            document: document_of(&settings)?,
        };
        self.records.insert(&record).await?;
        Ok(provider(&record, settings))
    }

    pub async fn update(
        &self, org_id: &str, id: &str, change: ProviderChange,
    ) -> ServiceResult<Provider> {
        let mut record = self.records.record(org_id, id).await?;
        let mut settings: ProviderSettings = settings_of(&record)?;
        let mut problems = Vec::new();
        let name = change.name.map(|name| name.trim().to_owned());
        if let Some(name) = &name {
            problems.extend(super::name_problem(name));
        }
        if let Some(token) = &change.token {
            problems.extend(token_problem(token));
        }
        if let Some(ttl) = change.cache_ttl_seconds {
            problems.extend(ttl_problem(ttl));
        }
        if !problems.is_empty() {
            return Err(ServiceError::Invalid(problems));
        }
        if let Some(name) = name {
            record.name = name;
        }
        if let Some(token) = &change.token {
            record.sealed = Some(self.vault.seal(token, &self.records.owner(org_id, &record.id))?);
        }
        settings.cache_ttl_seconds = change.cache_ttl_seconds.unwrap_or(settings.cache_ttl_seconds);
        settings.enabled = change.enabled.unwrap_or(settings.enabled);
        settings.priority = change.priority.unwrap_or(settings.priority);
        let read_at = record.updated_at;
        record.updated_at = Utc::now();
        record.document = document_of(&settings)?;
        self.records.write_changed(&record, read_at).await?;
        self.forget(&record.id);
        Ok(provider(&record, settings))
    }

    pub async fn get(&self, org_id: &str, id: &str) -> ServiceResult<Provider> {
        let record = self.records.record(org_id, id).await?;
        Ok(provider(&record, settings_of(&record)?))
    }

    /// Oldest first.
    pub async fn list(&self, org_id: &str) -> ServiceResult<Vec<Provider>> {
        self.records.list(org_id, |record| Ok(provider(record, settings_of(record)?))).await
    }

    pub async fn delete(&self, org_id: &str, id: &str) -> ServiceResult<()> {
        let record = self.records.record(org_id, id).await?;
        self.records.delete(org_id, &record.id).await?;
        self.forget(&record.id);
        Ok(())
    }

    /// The provider's login items, from the cache while it is fresh.
    pub async fn items(&self, org_id: &str, id: &str) -> ServiceResult<Vec<ProviderItem>> {
        let record = self.records.record(org_id, id).await?;
        let settings: ProviderSettings = settings_of(&record)?;
        self.cached_items(&record, &settings)
            .await
            .map_err(|error| ServiceError::Unavailable(format!("1Password: {error}")))
    }

    /// Reads the provider's vaults with its token, uncached.
    pub async fn test(&self, org_id: &str, id: &str) -> ServiceResult<TestResult> {
        let record = self.records.record(org_id, id).await?;
        let token = self.token(&record)?;
        Ok(match self.vaults(&token).await {
            Ok(vaults) => TestResult { success: true, vaults, error: None },
            Err(error) => TestResult { success: false, vaults: Vec::new(), error: Some(error) },
        })
    }

    /// The values of a provider's login item: the one at `Vault/Title`, or (`by_domain`)
    /// the first whose URLs are on that host. `None` when it has no such item.
    pub async fn login_values(
        &self, org_id: &str, provider_id_or_name: &str, item: ItemLookup<'_>,
    ) -> ServiceResult<Option<LoginValues>> {
        let record = self.records.record(org_id, provider_id_or_name).await?;
        let settings: ProviderSettings = settings_of(&record)?;
        if !settings.enabled {
            return Err(ServiceError::Conflict(format!(
                "credential provider {} is disabled",
                record.name
            )));
        }
        let unavailable = |error: String| ServiceError::Unavailable(format!("1Password: {error}"));
        let items = self.cached_items(&record, &settings).await.map_err(unavailable)?;
        let found = items.iter().find(|candidate| match item {
            ItemLookup::Path(path) => candidate.path.eq_ignore_ascii_case(path),
            ItemLookup::Domain(domain) => candidate.urls.iter().any(|url| on_host(url, domain)),
        });
        let Some(found) = found else {
            return Ok(None);
        };
        let token = self.token(&record)?;
        let full: FullItem = self
            .get_json(&token, &format!("/v1/vaults/{}/items/{}", found.vault_id, found.id))
            .await
            .map_err(unavailable)?;
        Ok(Some(login_values_of(full)))
    }

    async fn cached_items(
        &self, record: &SecretRecord, settings: &ProviderSettings,
    ) -> Result<Vec<ProviderItem>, String> {
        let ttl = Duration::from_secs(u64::from(settings.cache_ttl_seconds));
        if let Ok(cache) = self.cache.lock()
            && let Some((read_at, items)) = cache.get(&record.id)
            && read_at.elapsed() < ttl
        {
            return Ok(items.clone());
        }
        let token = self.token(record).map_err(|error| error.to_string())?;
        let mut items = Vec::new();
        for vault in self.vaults(&token).await? {
            let summaries: Vec<ItemSummary> =
                self.get_json(&token, &format!("/v1/vaults/{}/items", vault.id)).await?;
            items.extend(
                summaries
                    .into_iter()
                    .filter(|item| item.category.as_deref().is_none_or(|c| c == "LOGIN"))
                    .map(|item| ProviderItem {
                        path: format!("{}/{}", vault.name, item.title),
                        id: item.id,
                        title: item.title,
                        vault_id: vault.id.clone(),
                        vault_name: vault.name.clone(),
                        urls: item.urls.into_iter().map(|url| url.href).collect(),
                    }),
            );
        }
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(record.id.clone(), (Instant::now(), items.clone()));
        }
        Ok(items)
    }

    async fn vaults(&self, token: &str) -> Result<Vec<VaultSummary>, String> {
        self.get_json(token, "/v1/vaults").await
    }

    /// A GET of the Connect API; the error is the server's message (never the token).
    async fn get_json<T: serde::de::DeserializeOwned>(
        &self, token: &str, path: &str,
    ) -> Result<T, String> {
        let base = self
            .connect_url
            .as_deref()
            .ok_or("no 1Password Connect server is configured (--onepassword-connect-url)")?;
        let response =
            self.http.get(format!("{base}{path}")).bearer_auth(token).send().await.map_err(
                |error| format!("the Connect server cannot be reached: {}", error.without_url()),
            )?;
        let status = response.status();
        if !status.is_success() {
            let message = response
                .json::<ConnectError>()
                .await
                .map(|error| error.message)
                .unwrap_or_default();
            return Err(format!("the Connect server answered {status}: {message}"));
        }
        response.json().await.map_err(|error| {
            format!("unreadable answer from the Connect server: {}", error.without_url())
        })
    }

    fn token(&self, record: &SecretRecord) -> ServiceResult<String> {
        let sealed = record
            .sealed
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("credential provider {} has no token", record.id))?;
        Ok(self.vault.open_sealed(sealed, &self.records.owner(&record.org_id, &record.id))?)
    }

    fn forget(&self, id: &str) {
        if let Ok(mut cache) = self.cache.lock() {
            cache.remove(id);
        }
    }
}

/// Which item of a provider a login uses.
#[derive(Clone, Copy, Debug)]
pub enum ItemLookup<'a> {
    /// `Vault/Title`.
    Path(&'a str),
    /// The first item with a URL on this host (optionally with a port).
    Domain(&'a str),
}

/// Whether `url` is on `domain` (a host, optionally with a port) or one of its subdomains.
fn on_host(url: &str, domain: &str) -> bool {
    let Ok(parsed) = url::Url::parse(url) else {
        return false;
    };
    let Some(host) = parsed.host_str() else {
        return false;
    };
    let host_and_port = match parsed.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    };
    let domain = domain.to_ascii_lowercase();
    [host.to_owned(), host_and_port]
        .iter()
        .any(|candidate| *candidate == domain || candidate.ends_with(&format!(".{domain}")))
}

#[derive(Deserialize)]
struct ConnectError {
    #[serde(default)]
    message: String,
}

#[derive(Deserialize)]
struct ItemSummary {
    id: String,
    #[serde(default)]
    title: String,
    category: Option<String>,
    #[serde(default)]
    urls: Vec<ItemUrl>,
}

#[derive(Deserialize)]
struct ItemUrl {
    href: String,
}

#[derive(Deserialize)]
struct FullItem {
    #[serde(default)]
    fields: Vec<ItemField>,
}

#[derive(Deserialize)]
struct ItemField {
    #[serde(rename = "type", default)]
    kind: String,
    purpose: Option<String>,
    label: Option<String>,
    value: Option<String>,
}

/// Username and password by their purpose, a one-time password field as the TOTP seed,
/// other fields by their label.
fn login_values_of(item: FullItem) -> LoginValues {
    let mut values = BTreeMap::new();
    let mut totp_code = None;
    for field in item.fields {
        let Some(value) = field.value.filter(|value| !value.is_empty()) else {
            continue;
        };
        match (field.purpose.as_deref(), field.kind.as_str()) {
            (Some("USERNAME"), _) => {
                values.insert("username".to_owned(), value);
            }
            (Some("PASSWORD"), _) => {
                values.insert("password".to_owned(), value);
            }
            (_, "OTP") => {
                totp_code =
                    totp::parse_seed(&value, GivenSettings::default(), TotpSettings::default())
                        .ok()
                        .and_then(|(seed, settings)| {
                            totp::code_at(&seed, &settings, Utc::now()).ok()
                        })
                        .map(|(code, expires_at)| super::TotpCode { code, expires_at });
            }
            (Some("NOTES"), _) => {}
            _ => {
                if let Some(label) = field.label.filter(|label| !label.is_empty()) {
                    values.entry(label.to_lowercase()).or_insert(value);
                }
            }
        }
    }
    LoginValues { values, totp: totp_code, sso_provider: None }
}

fn provider(record: &SecretRecord, settings: ProviderSettings) -> Provider {
    Provider {
        id: record.id.clone(),
        name: record.name.clone(),
        created_at: record.created_at,
        updated_at: record.updated_at,
        settings,
    }
}

fn token_problem(token: &str) -> Option<String> {
    (token.trim().is_empty()
        || token.len() > MAX_TOKEN_BYTES
        || token.chars().any(char::is_control))
    .then(|| format!("token must be 1 to {MAX_TOKEN_BYTES} bytes without control characters"))
}

fn ttl_problem(ttl: u32) -> Option<String> {
    (ttl > MAX_CACHE_TTL_SECONDS)
        .then(|| format!("cache_ttl_seconds must be 0 to {MAX_CACHE_TTL_SECONDS}"))
}
