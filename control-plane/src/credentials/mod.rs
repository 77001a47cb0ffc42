//! Credentials (login values and a TOTP seed for a domain) and credential providers (an
//! external password manager, 1Password through its Connect server), which managed auth
//! fills login forms from.
//!
//! Secrets are write-only: values, seeds and tokens are sealed with the server's key
//! (`managed_auth::vault`), bound to their record, and no view of a record carries them.
//! Only a TOTP code leaves, when asked for.

pub mod onepassword;
mod secrets;
pub mod totp;

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{ServiceError, ServiceResult};
use crate::ids;
use crate::managed_auth::vault::Vault;
use crate::store::{SecretKind, SecretRecord, Store};
use onepassword::OnePassword;
use secrets::{Secrets, document_of, settings_of};
use totp::{GivenSettings, TotpSettings};

const MAX_VALUES: usize = 50;
const MAX_VALUE_KEY_CHARS: usize = 100;
const MAX_VALUE_BYTES: usize = 4096;
const MAX_SSO_PROVIDER_CHARS: usize = 100;
const SETTINGS_NEED_SEED: &str = "totp_algorithm, totp_digits and totp_period need totp_secret";

/// A credential's public settings (the record's document).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CredentialSettings {
    pub domain: String,
    pub sso_provider: Option<String>,
    pub value_keys: Vec<String>,
    /// Present while the credential has a TOTP seed.
    pub totp: Option<TotpSettings>,
}

/// What is sealed.
#[derive(Default, Serialize, Deserialize)]
struct CredentialSecrets {
    values: BTreeMap<String, String>,
    totp_seed: Option<String>,
}

/// A credential as its owner may see it.
#[derive(Clone, Debug)]
pub struct Credential {
    pub id: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub settings: CredentialSettings,
}

/// A current one-time code and when it stops being current.
#[derive(Clone, Debug)]
pub struct TotpCode {
    pub code: String,
    pub expires_at: DateTime<Utc>,
}

/// What a login fills a form with: the values, and a code when there is a seed. (No
/// `Debug`: it holds secrets.)
#[derive(Clone, Default)]
pub struct LoginValues {
    pub values: BTreeMap<String, String>,
    pub totp: Option<TotpCode>,
    pub sso_provider: Option<String>,
}

pub struct NewCredential {
    pub name: String,
    pub domain: String,
    pub values: BTreeMap<String, String>,
    pub sso_provider: Option<String>,
    pub totp_secret: Option<String>,
    pub totp: GivenSettings,
}

#[derive(Default)]
pub struct CredentialChange {
    pub name: Option<String>,
    pub values: Option<BTreeMap<String, String>>,
    pub remove_value_keys: Vec<String>,
    /// `Some(None)` (or an empty string) removes it.
    pub sso_provider: Option<Option<String>>,
    /// An empty string removes the seed and its settings.
    pub totp_secret: Option<String>,
    pub totp: GivenSettings,
}

pub struct CredentialService {
    records: Secrets,
    vault: Arc<Vault>,
    pub onepassword: OnePassword,
}

impl CredentialService {
    pub fn new(store: Arc<dyn Store>, vault: Arc<Vault>, onepassword: OnePassword) -> Self {
        Self { records: Secrets::new(store, SecretKind::Credential), vault, onepassword }
    }

    pub async fn create(
        &self, org_id: &str, new: NewCredential,
    ) -> ServiceResult<(Credential, Option<TotpCode>)> {
        let mut problems = Vec::new();
        problems.extend(name_problem(&new.name));
        problems.extend(values_problems(&new.values));
        let sso_provider = sso_provider(new.sso_provider, &mut problems);
        problems.extend(totp::check_given(&new.totp).err());
        let seed = match new.totp_secret.as_deref().filter(|s| !s.trim().is_empty()) {
            Some(text) => match totp::parse_seed(text, new.totp, TotpSettings::default()) {
                Ok(parsed) => Some(parsed),
                Err(problem) => {
                    problems.push(problem);
                    None
                }
            },
            None if new.totp.any() => {
                problems.push(SETTINGS_NEED_SEED.into());
                None
            }
            None => None,
        };
        if !problems.is_empty() {
            return Err(ServiceError::Invalid(problems));
        }
        let now = Utc::now();
        let id = ids::new_id("cred");
        let settings = CredentialSettings {
            domain: new.domain.to_ascii_lowercase(),
            sso_provider,
            value_keys: new.values.keys().cloned().collect(),
            totp: seed.as_ref().map(|(_, settings)| *settings),
        };
        let secrets =
            CredentialSecrets { values: new.values, totp_seed: seed.map(|(seed, _)| seed) };
        let record = SecretRecord {
            sealed: Some(self.vault.seal(&secrets, &self.records.owner(org_id, &id))?),
            id,
            org_id: org_id.to_owned(),
            kind: SecretKind::Credential,
            name: new.name,
            created_at: now,
            updated_at: now,
            document: document_of(&settings)?,
        };
        self.records.insert(&record).await?;
        let code = current_code(&secrets, &settings, now)?;
        Ok((credential(&record, settings), code))
    }

    pub async fn update(
        &self, org_id: &str, id_or_name: &str, change: CredentialChange,
    ) -> ServiceResult<(Credential, Option<TotpCode>)> {
        let mut record = self.records.record(org_id, id_or_name).await?;
        let mut settings: CredentialSettings = settings_of(&record)?;
        let mut secrets = self.secrets(&record)?;
        let mut problems = Vec::new();
        if let Some(name) = &change.name {
            problems.extend(name_problem(name));
        }
        if let Some(values) = &change.values {
            problems.extend(values_problems(values));
        }
        let given = change.totp;
        problems.extend(totp::check_given(&given).err());
        let mut new_seed = false;
        match change.totp_secret.as_deref() {
            Some(text) if text.trim().is_empty() && given.any() => {
                problems.push("TOTP settings cannot be given while removing the secret".into())
            }
            Some(text) if text.trim().is_empty() => {
                secrets.totp_seed = None;
                settings.totp = None;
            }
            Some(text) => {
                let base = settings.totp.unwrap_or_default();
                match totp::parse_seed(text, given, base) {
                    Ok((seed, parsed)) => {
                        secrets.totp_seed = Some(seed);
                        settings.totp = Some(parsed);
                        new_seed = true;
                    }
                    Err(problem) => problems.push(problem),
                }
            }
            // New settings for the stored seed.
            None if given.any() => match settings.totp {
                Some(current) => {
                    settings.totp = Some(TotpSettings {
                        algorithm: given.algorithm.unwrap_or(current.algorithm),
                        digits: given.digits.unwrap_or(current.digits),
                        period: given.period.unwrap_or(current.period),
                    })
                }
                None => problems.push(SETTINGS_NEED_SEED.into()),
            },
            None => {}
        }
        if let Some(provider) = change.sso_provider {
            settings.sso_provider = sso_provider(provider, &mut problems);
        }
        for key in &change.remove_value_keys {
            secrets.values.remove(key);
        }
        if let Some(values) = change.values {
            secrets.values.extend(values);
        }
        if secrets.values.len() > MAX_VALUES {
            problems.push(format!("a credential holds at most {MAX_VALUES} values"));
        }
        if !problems.is_empty() {
            return Err(ServiceError::Invalid(problems));
        }
        settings.value_keys = secrets.values.keys().cloned().collect();
        if let Some(name) = change.name {
            record.name = name;
        }
        let now = Utc::now();
        let read_at = record.updated_at;
        record.updated_at = now;
        record.document = document_of(&settings)?;
        record.sealed = Some(self.vault.seal(&secrets, &self.records.owner(org_id, &record.id))?);
        self.records.write_changed(&record, read_at).await?;
        let code = if new_seed { current_code(&secrets, &settings, now)? } else { None };
        Ok((credential(&record, settings), code))
    }

    pub async fn get(&self, org_id: &str, id_or_name: &str) -> ServiceResult<Credential> {
        let record = self.records.record(org_id, id_or_name).await?;
        let settings: CredentialSettings = settings_of(&record)?;
        Ok(credential(&record, settings))
    }

    /// Oldest first.
    pub async fn list(&self, org_id: &str) -> ServiceResult<Vec<Credential>> {
        self.records.list(org_id, |record| Ok(credential(record, settings_of(record)?))).await
    }

    pub async fn delete(&self, org_id: &str, id: &str) -> ServiceResult<()> {
        self.records.delete(org_id, id).await
    }

    pub async fn totp_code(&self, org_id: &str, id_or_name: &str) -> ServiceResult<TotpCode> {
        let record = self.records.record(org_id, id_or_name).await?;
        let settings: CredentialSettings = settings_of(&record)?;
        current_code(&self.secrets(&record)?, &settings, Utc::now())?.ok_or_else(|| {
            ServiceError::NotFound(format!("credential {id_or_name} has no TOTP secret"))
        })
    }

    /// What a login fills in from a stored credential.
    pub async fn login_values(&self, org_id: &str, id_or_name: &str) -> ServiceResult<LoginValues> {
        let record = self.records.record(org_id, id_or_name).await?;
        let settings: CredentialSettings = settings_of(&record)?;
        let secrets = self.secrets(&record)?;
        Ok(LoginValues {
            totp: current_code(&secrets, &settings, Utc::now())?,
            values: secrets.values,
            sso_provider: settings.sso_provider,
        })
    }

    fn secrets(&self, record: &SecretRecord) -> ServiceResult<CredentialSecrets> {
        match &record.sealed {
            Some(sealed) => Ok(self
                .vault
                .open_sealed(sealed, &self.records.owner(&record.org_id, &record.id))?),
            None => Ok(CredentialSecrets::default()),
        }
    }
}

fn credential(record: &SecretRecord, settings: CredentialSettings) -> Credential {
    Credential {
        id: record.id.clone(),
        name: record.name.clone(),
        created_at: record.created_at,
        updated_at: record.updated_at,
        settings,
    }
}

fn current_code(
    secrets: &CredentialSecrets, settings: &CredentialSettings, at: DateTime<Utc>,
) -> ServiceResult<Option<TotpCode>> {
    let (Some(seed), Some(totp)) = (&secrets.totp_seed, &settings.totp) else {
        return Ok(None);
    };
    let (code, expires_at) = totp::code_at(seed, totp, at).map_err(anyhow::Error::msg)?;
    Ok(Some(TotpCode { code, expires_at }))
}

pub fn name_problem(name: &str) -> Option<String> {
    crate::profiles::name_problem(name)
}

fn values_problems(values: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    if values.len() > MAX_VALUES {
        problems.push(format!("values: at most {MAX_VALUES} fields"));
    }
    for (key, value) in values {
        if key.is_empty()
            || key.chars().count() > MAX_VALUE_KEY_CHARS
            || key.chars().any(char::is_control)
        {
            problems.push(format!(
                "values: field names must be 1 to {MAX_VALUE_KEY_CHARS} characters without control characters"
            ));
        }
        if value.len() > MAX_VALUE_BYTES {
            problems.push(format!("values.{key}: at most {MAX_VALUE_BYTES} bytes"));
        }
    }
    problems
}

/// A trimmed SSO provider name, `None` for none or an empty one.
fn sso_provider(given: Option<String>, problems: &mut Vec<String>) -> Option<String> {
    let provider = given?.trim().to_ascii_lowercase();
    if provider.is_empty() {
        return None;
    }
    if provider.chars().count() > MAX_SSO_PROVIDER_CHARS
        || !provider
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' '))
    {
        problems.push(format!(
            "sso_provider must be a provider's name such as google, github or microsoft, got {provider:?}"
        ));
    }
    Some(provider)
}
