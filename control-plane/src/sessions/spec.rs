//! What a browser should be: the configuration callers give (`BrowserConfig`, also what
//! pools store and managed auth builds), its validation, and its resolution against the
//! organization's extensions, proxies and profiles into a `BrowserSpec` ready to launch.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::telemetry::TelemetrySettings;
use crate::telemetry::settings::{self as telemetry, TelemetryRequest};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::Sessions;
use super::labels::{self, LocationRequest};
use crate::egress::HostAllowlist;
use crate::error::{ServiceError, ServiceResult};
use crate::proxies::{self, ProxyRoute};
use crate::store::{SessionLocation, SessionProfile, VmSettings};

pub const DEFAULT_TIMEOUT_SECONDS: i64 = 60;
pub const MIN_TIMEOUT_SECONDS: i64 = 10;
pub const MAX_TIMEOUT_SECONDS: i64 = 259_200;
pub const DEFAULT_VIEWPORT: (i64, i64) = (1920, 1080);
/// Xvfb allocates the whole framebuffer up front; 8K is plenty.
pub const MAX_VIEWPORT_SIDE: i64 = 7680;
pub const MIN_VIEWPORT_SIDE: i64 = 100;
pub const MAX_PERSISTENT_ID_LENGTH: usize = 255;
/// Most extensions one browser may load.
pub const MAX_EXTENSIONS: usize = 20;

/// A browser's configuration as callers give it: every field optional (defaults apply),
/// extensions, proxy and profile by reference. Serialized as pools store it (absent
/// fields are left out, so a stored configuration reads back as it was given).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BrowserConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headless: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stealth: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kiosk_mode: Option<bool>,
    /// Inactivity timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub viewport: Option<Viewport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Vec<ResourceReference>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfig>,
    /// `1GiB` … `16GiB`: the VM ends past it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// Chromium enterprise policies for this browser.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chrome_policy: Option<serde_json::Map<String, serde_json::Value>>,
    /// Opened in the browser's first tab before the browser is handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_url: Option<String>,
    /// Timezone and locale the browser's pages see.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<LocationRequest>,
    /// What the browser's telemetry captures and where it goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<TelemetryRequest>,
}

/// `network` of a browser or pool, as the SDK sends it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkConfig {
    /// The only destinations the browser may reach (hostnames, `*.` wildcards, public IP
    /// addresses and CIDR ranges); others are refused with 403 and
    /// `X-Kernel-Proxy-Error: network_policy_denied`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_hosts: Option<Vec<String>>,
    /// Not supported by this server (a 400 names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_hosts: Option<Vec<String>>,
    /// Not supported by this server (a 400 names it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub proxy_routes: Option<Vec<serde_json::Value>>,
}

/// The memory sizes the SDK offers, and their bytes.
pub const MEMORY_SIZES: [(&str, u64); 7] = [
    ("1GiB", 1 << 30),
    ("2GiB", 2 << 30),
    ("4GiB", 4 << 30),
    ("6GiB", 6 << 30),
    ("8GiB", 8 << 30),
    ("12GiB", 12 << 30),
    ("16GiB", 16 << 30),
];
/// The bytes of a `memory` size (0 for one this server does not know).
pub fn memory_bytes(size: &str) -> u64 {
    MEMORY_SIZES.iter().find(|(name, _)| *name == size).map_or(0, |(_, bytes)| *bytes)
}

/// As the SDK documents: headless browsers get 1GiB, headful ones 8GiB.
const DEFAULT_MEMORY: (&str, &str) = ("1GiB", "8GiB");

/// The `memory` a browser of this kind gets when the caller does not say.
pub fn default_memory(headless: bool) -> &'static str {
    let (headless_default, headful_default) = DEFAULT_MEMORY;
    if headless { headless_default } else { headful_default }
}
pub const HEADLESS_MEMORY: &[&str] = &["1GiB", "2GiB", "4GiB"];
pub const HEADFUL_MEMORY: &[&str] = &["8GiB", "16GiB"];
/// Largest `chrome_policy`, serialized.
const MAX_CHROME_POLICY_BYTES: usize = 64 * 1024;
/// Policies this server manages itself (proxy, extensions, DevTools): a browser's
/// `chrome_policy` may not set them, as the SDK documents.
const MANAGED_POLICY_PREFIXES: [&str; 5] =
    ["Proxy", "Extension", "RemoteDebugging", "DeveloperTools", "CommandLineFlag"];

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Viewport {
    #[schema(minimum = 100, maximum = 7680)]
    pub width: i64,
    #[schema(minimum = 100, maximum = 7680)]
    pub height: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 240)]
    pub refresh_rate: Option<i64>,
}

/// What is wrong with a viewport (on create and on update).
pub fn viewport_problems(width: i64, height: i64, refresh_rate: Option<i64>) -> Vec<String> {
    let mut problems = Vec::new();
    for (field, value) in [("viewport.width", width), ("viewport.height", height)] {
        if !(MIN_VIEWPORT_SIDE..=MAX_VIEWPORT_SIDE).contains(&value) {
            problems.push(format!(
                "{field} must be between {MIN_VIEWPORT_SIDE} and {MAX_VIEWPORT_SIDE}, got {value}"
            ));
        }
    }
    if let Some(rate) = refresh_rate
        && !(1..=240).contains(&rate)
    {
        problems.push(format!("viewport.refresh_rate must be between 1 and 240, got {rate}"));
    }
    problems
}

/// A resource of the organization, by id or by name (exactly one). Its wire shape is
/// part of the API, hence the schema.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, min_length = 1)]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String, min_length = 1)]
    pub name: Option<String>,
}

impl ResourceReference {
    /// The id or the name, when exactly one of them is given and not empty.
    pub fn key(&self) -> Option<&str> {
        match (&self.id, &self.name) {
            (Some(key), None) | (None, Some(key)) if !key.is_empty() => Some(key),
            _ => None,
        }
    }
}

/// The profile a browser starts from; with `save_changes` its state is saved back into
/// the profile when the session ends.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProfileReference {
    /// `null` counts as absent (exactly one of `id` and `name` is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, min_length = 1)]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, min_length = 1)]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub save_changes: Option<bool>,
}

/// A browser ready to launch: validated, with defaults applied and every reference
/// resolved to what the runtime needs.
#[derive(Clone, Debug)]
pub struct BrowserSpec {
    pub persistent_id: Option<String>,
    pub headless: bool,
    pub stealth: bool,
    pub kiosk_mode: bool,
    pub timeout_seconds: i64,
    pub viewport_width: i64,
    pub viewport_height: i64,
    pub viewport_refresh_rate: Option<i64>,
    /// Library extensions to load from the start.
    pub extensions: Vec<LibraryExtension>,
    /// The proxy all traffic goes through: its id and where it routes.
    pub proxy: Option<(String, ProxyRoute)>,
    /// The pool the browser is created for (it starts idle there).
    pub pool_id: Option<String>,
    /// Its project: a pool's browsers are in the pool's. `None`: the creating request's.
    pub project_id: Option<String>,
    /// The profile to start from (and the archive of its stored state, if it has one).
    pub profile: Option<(SessionProfile, Option<PathBuf>)>,
    pub allowed_hosts: Option<HostAllowlist>,
    /// `memory` as given or defaulted (`8GiB`), and its bytes.
    pub memory: (String, u64),
    pub chrome_policy: Option<serde_json::Map<String, serde_json::Value>>,
    /// Unique among the organization's live sessions (checked when stored).
    pub name: Option<String>,
    pub tags: BTreeMap<String, String>,
    pub start_url: Option<String>,
    pub location: Option<SessionLocation>,
    /// The invocation whose action created the browser (it ends with the invocation).
    pub invocation_id: Option<String>,
    /// Telemetry capture and export; `None`: not enabled.
    pub telemetry: Option<TelemetrySettings>,
}

impl BrowserSpec {
    /// What the session record keeps of the VM's settings and the caller's labels.
    pub fn vm_settings(&self) -> VmSettings {
        VmSettings {
            allowed_hosts: self.allowed_hosts.as_ref().map(|a| a.hosts().to_vec()),
            memory: Some(self.memory.0.clone()),
            chrome_policy: self.chrome_policy.clone(),
            tags: self.tags.clone(),
            start_url: self.start_url.clone(),
            location: self.location.clone(),
            invocation_id: self.invocation_id.clone(),
            telemetry: self.telemetry.clone(),
        }
    }
}

/// An extension of the organization's library, resolved for loading.
#[derive(Clone, Debug)]
pub struct LibraryExtension {
    pub id: String,
    /// Its directory name in the browser: the extension's name, or its id.
    pub name: String,
    pub archive: PathBuf,
}

/// What `config` refers to, as (kind, id or name as given, verb needed): a key with a
/// policy must be allowed each before anything is looked up (`Org::require`). A
/// configuration with problems refers to nothing: it is refused anyway.
pub fn referenced(config: &BrowserConfig) -> Vec<(&'static str, String, &'static str)> {
    let Ok((_, references)) = validate(config, None) else {
        return Vec::new();
    };
    let mut referenced = Vec::new();
    if let Some(destination) = references.telemetry_destination {
        referenced.push(("telemetry_destinations", destination, "read"));
    }
    for extension in references.extensions {
        referenced.push(("extensions", extension, "read"));
    }
    if let Some(proxy) = references.proxy_id {
        referenced.push(("proxies", proxy, "read"));
    }
    // A profile saved into is changed; one only loaded is used.
    if let Some((profile, save_changes)) = references.profile {
        referenced.push(("profiles", profile, if save_changes { "write" } else { "use" }));
    }
    referenced
}

/// What a configuration refers to by id or name, not yet looked up.
struct References {
    /// The OTLP destination (id or name) telemetry is exported to.
    telemetry_destination: Option<String>,
    extensions: Vec<String>,
    proxy_id: Option<String>,
    /// Profile id or name, and save_changes.
    profile: Option<(String, bool)>,
}

/// Every problem of the configuration (each message names its field), or the spec with
/// its references still to resolve.
fn validate(
    config: &BrowserConfig, persistent_id: Option<&str>,
) -> Result<(BrowserSpec, References), Vec<String>> {
    let mut problems = Vec::new();
    let timeout_seconds = config.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    if !(MIN_TIMEOUT_SECONDS..=MAX_TIMEOUT_SECONDS).contains(&timeout_seconds) {
        problems.push(format!(
            "timeout_seconds must be between {MIN_TIMEOUT_SECONDS} and {MAX_TIMEOUT_SECONDS}, got {timeout_seconds}"
        ));
    }
    let (width, height, refresh_rate) = match &config.viewport {
        Some(viewport) => (viewport.width, viewport.height, viewport.refresh_rate),
        None => (DEFAULT_VIEWPORT.0, DEFAULT_VIEWPORT.1, None),
    };
    problems.extend(viewport_problems(width, height, refresh_rate));
    if let Some(id) = persistent_id
        && (id.is_empty() || id.len() > MAX_PERSISTENT_ID_LENGTH)
    {
        problems.push(format!("persistence.id must be 1 to {MAX_PERSISTENT_ID_LENGTH} characters"));
    }
    let requested = config.extensions.as_deref().unwrap_or_default();
    if requested.len() > MAX_EXTENSIONS {
        problems.push(format!("extensions: at most {MAX_EXTENSIONS} per browser"));
    }
    let mut extensions = Vec::new();
    for (index, reference) in requested.iter().enumerate() {
        match reference.key() {
            Some(key) => extensions.push(key.to_owned()),
            None => {
                problems.push(format!("extensions[{index}] must have exactly one of id or name"))
            }
        }
    }
    let profile = match &config.profile {
        None => None,
        Some(reference) => {
            let by = ResourceReference { id: reference.id.clone(), name: reference.name.clone() };
            match by.key() {
                Some(key) => Some((key.to_owned(), reference.save_changes.unwrap_or(false))),
                None => {
                    problems.push("profile must have exactly one of id or name".into());
                    None
                }
            }
        }
    };
    let network = config.network.clone().unwrap_or_default();
    if network.private_hosts.is_some() {
        problems.push("network.private_hosts is not supported by this server".into());
    }
    if network.proxy_routes.is_some() {
        problems.push("network.proxy_routes is not supported by this server (use proxy_id)".into());
    }
    let allowed_hosts = match network.allowed_hosts.as_deref().map(HostAllowlist::parse) {
        Some(Err(problem)) => {
            problems.push(format!("network.{problem}"));
            None
        }
        Some(Ok(allowed)) => Some(allowed),
        None => None,
    };
    let headless = config.headless.unwrap_or(false);
    let memory = config.memory.clone().unwrap_or_else(|| default_memory(headless).to_owned());
    // The sizes the SDK offers each kind of browser.
    let (offered, kind) =
        if headless { (HEADLESS_MEMORY, "headless") } else { (HEADFUL_MEMORY, "headful") };
    let memory_bytes = if offered.contains(&memory.as_str()) {
        memory_bytes(&memory)
    } else {
        problems.push(format!(
            "memory of a {kind} browser must be one of {}, got {memory:?}",
            offered.join(", ")
        ));
        0
    };
    if let Some(policy) = &config.chrome_policy {
        problems.extend(chrome_policy_problems(policy));
    }
    if let Some(problem) = config
        .start_url
        .as_deref()
        .and_then(|url| labels::start_url_problem(url, allowed_hosts.as_ref()))
    {
        problems.push(problem);
    }
    let location = match config.location.as_ref().map(labels::location) {
        Some(Ok(location)) => Some(location),
        Some(Err(more)) => {
            problems.extend(more);
            None
        }
        None => None,
    };
    let (telemetry, telemetry_destination) = match telemetry::on_create(config.telemetry.as_ref()) {
        Ok(resolved) => (resolved.settings, resolved.export.flatten()),
        Err(more) => {
            problems.extend(more);
            (None, None)
        }
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    let spec = BrowserSpec {
        telemetry,
        allowed_hosts,
        memory: (memory, memory_bytes),
        chrome_policy: config.chrome_policy.clone(),
        persistent_id: persistent_id.map(str::to_owned),
        headless,
        stealth: config.stealth.unwrap_or(false),
        kiosk_mode: config.kiosk_mode.unwrap_or(false),
        timeout_seconds,
        viewport_width: width,
        viewport_height: height,
        viewport_refresh_rate: refresh_rate,
        extensions: Vec::new(),
        proxy: None,
        pool_id: None,
        project_id: None,
        profile: None,
        name: None,
        tags: BTreeMap::new(),
        start_url: config.start_url.clone(),
        location,
        invocation_id: None,
    };
    let references = References {
        telemetry_destination: telemetry_destination.and_then(|d| d.id.or(d.name)),
        extensions,
        proxy_id: config.proxy_id.clone(),
        profile,
    };
    Ok((spec, references))
}

/// What is wrong with a `chrome_policy`: names must be policy names, and the policies
/// this server manages itself are not the caller's.
fn chrome_policy_problems(policy: &serde_json::Map<String, serde_json::Value>) -> Vec<String> {
    let mut problems = Vec::new();
    if serde_json::to_vec(policy).map_or(0, |bytes| bytes.len()) > MAX_CHROME_POLICY_BYTES {
        problems.push(format!("chrome_policy: at most {} KiB", MAX_CHROME_POLICY_BYTES / 1024));
    }
    for name in policy.keys() {
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric()) {
            problems.push(format!("chrome_policy: {name:?} is not a policy name"));
        } else if MANAGED_POLICY_PREFIXES.iter().any(|prefix| name.starts_with(prefix)) {
            problems.push(format!(
                "chrome_policy.{name}: managed by this server (proxy, extensions and DevTools \
                 policies cannot be set)"
            ));
        }
    }
    problems
}

impl Sessions {
    /// The configuration validated (all problems at once, plus `more_problems` the caller
    /// found in fields of its own) and resolved: extensions, proxy and profile must be
    /// the organization's (a 400 otherwise, as for any invalid field).
    pub async fn spec(
        &self, org_id: &str, config: &BrowserConfig, persistent_id: Option<&str>,
        more_problems: Vec<String>,
    ) -> ServiceResult<BrowserSpec> {
        let mut more_problems = more_problems;
        let capabilities = self.runtime.capabilities();
        if let (Some(_), Err(why)) = (&config.chrome_policy, &capabilities.chrome_policy) {
            more_problems.push(why.clone());
        }
        let network = config.network.as_ref();
        let egress_rules = config.proxy_id.is_some()
            || network.is_some_and(|network| network.allowed_hosts.is_some());
        if let (true, Err(why)) = (egress_rules, &capabilities.egress_rules) {
            more_problems.push(why.clone());
        }
        let (mut spec, references) = match validate(config, persistent_id) {
            Ok(valid) if more_problems.is_empty() => valid,
            Ok(_) => return Err(ServiceError::Invalid(more_problems)),
            Err(mut problems) => {
                problems.extend(more_problems);
                return Err(ServiceError::Invalid(problems));
            }
        };
        spec.extensions = self.resolve_extensions(org_id, &references.extensions).await?;
        if let (Some(key), Some(settings)) =
            (&references.telemetry_destination, &mut spec.telemetry)
        {
            settings.destination = Some(self.telemetry_destination(org_id, key).await?);
        }
        if let Some(proxy) = references.proxy_id {
            spec.proxy = Some(self.resolve_proxy(org_id, &proxy).await?);
        }
        if let Some((key, save_changes)) = references.profile {
            let profile = self.store.profile(org_id, &key).await?.ok_or_else(|| {
                // A reference to nothing is a 404, like the resource's own routes answer.
                ServiceError::NotFound(format!("profile: no profile {key:?} in this organization"))
            })?;
            let archive = self.profiles.launch_archive(&profile);
            spec.profile = Some((SessionProfile { id: profile.id, save_changes }, archive));
        }
        Ok(spec)
    }

    /// The id of the organization's OTLP destination, by id or name.
    pub(super) async fn telemetry_destination(
        &self, org_id: &str, key: &str,
    ) -> ServiceResult<String> {
        let destination = self.store.destination(org_id, key).await?.ok_or_else(|| {
            ServiceError::NotFound(format!(
                "telemetry.export.otlp.destination: no destination {key:?} in this organization"
            ))
        })?;
        Ok(destination.id)
    }

    /// The id of the organization's (not deleted) proxy, by id or name, and where it
    /// sends traffic.
    pub(super) async fn resolve_proxy(
        &self, org_id: &str, id_or_name: &str,
    ) -> ServiceResult<(String, ProxyRoute)> {
        let proxy = match self.store.proxy(org_id, id_or_name).await {
            Ok(Some(proxy)) => proxy,
            Ok(None) => {
                return Err(ServiceError::NotFound(format!(
                    "proxy_id: proxy {id_or_name} not found"
                )));
            }
            Err(crate::store::StoreError::Conflict(message)) => {
                return Err(ServiceError::Conflict(format!("proxy: {message}")));
            }
            Err(error) => return Err(error.into()),
        };
        // The proxy exists but cannot be used now (its host does not resolve, its type is
        // no longer served): a conflict with its state, not bad input of this request.
        let route = proxies::connectable_route(&proxy, &self.proxy_upstreams, &self.egress)
            .await
            .map_err(|reason| ServiceError::Conflict(format!("proxy_id: {reason}")))?;
        Ok((proxy.id, route))
    }

    /// Finds the referenced library extensions of the organization.
    async fn resolve_extensions(
        &self, org_id: &str, references: &[String],
    ) -> ServiceResult<Vec<LibraryExtension>> {
        let mut resolved: Vec<LibraryExtension> = Vec::new();
        let mut problems = Vec::new();
        for (index, reference) in references.iter().enumerate() {
            let Some(record) = self.store.extension(org_id, reference).await? else {
                problems.push(format!(
                    "extensions[{index}]: no extension {reference:?} in this organization"
                ));
                continue;
            };
            let Some(archive) = self.blobs.local_path(&record.blob_key) else {
                return Err(ServiceError::internal("the blob store is not local"));
            };
            if resolved.iter().all(|known| known.id != record.id) {
                resolved.push(LibraryExtension {
                    name: record.name.clone().unwrap_or_else(|| record.id.clone()),
                    id: record.id,
                    archive,
                });
            }
        }
        if problems.is_empty() {
            Ok(resolved)
        } else {
            Err(ServiceError::NotFound(problems.join("; ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_sdk_documentation() {
        let (spec, _) = validate(&BrowserConfig::default(), None).expect("defaults are valid");
        assert_eq!(spec.memory, ("8GiB".to_owned(), 8 << 30));
        let headless = BrowserConfig { headless: Some(true), ..Default::default() };
        let (spec_headless, _) = validate(&headless, None).expect("valid");
        assert_eq!(spec_headless.memory.0, "1GiB");
        assert_eq!(spec.timeout_seconds, 60);
        assert_eq!((spec.viewport_width, spec.viewport_height), (1920, 1080));
        assert!(!spec.headless);
    }

    #[test]
    fn every_invalid_field_is_reported() {
        let config = BrowserConfig {
            timeout_seconds: Some(5),
            viewport: Some(Viewport { width: 0, height: 99_999, refresh_rate: None }),
            ..Default::default()
        };
        let Err(problems) = validate(&config, None) else {
            panic!("expected a validation error");
        };
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("timeout_seconds"));
        assert!(problems[1].starts_with("viewport.width"));
        assert!(problems[2].starts_with("viewport.height"));
    }

    #[test]
    fn vm_settings_are_checked() {
        let config: BrowserConfig = serde_json::from_value(serde_json::json!({
            "memory": "3GiB",
            "network": {"allowed_hosts": ["127.0.0.1"], "private_hosts": ["a.internal"]},
            "chrome_policy": {"ProxyMode": "direct", "bad name": 1, "URLBlocklist": ["x"]},
        }))
        .expect("parses");
        let Err(problems) = validate(&config, None) else {
            panic!("expected a validation error");
        };
        let text = problems.join("\n");
        for needle in [
            "network.private_hosts is not supported",
            "network.allowed_hosts[0]",
            "memory of a headful browser must be one of 8GiB, 16GiB",
            "chrome_policy.ProxyMode",
            "\"bad name\" is not a policy name",
        ] {
            assert!(text.contains(needle), "{needle} not in {text}");
        }
        assert!(!text.contains("URLBlocklist"));
    }

    #[test]
    fn a_stored_configuration_reads_back_as_given() {
        let given = serde_json::json!({
            "headless": true,
            "viewport": {"width": 800, "height": 600},
            "extensions": [{"name": "ext"}],
            "profile": {"id": "pro_1", "save_changes": true},
        });
        let config: BrowserConfig = serde_json::from_value(given.clone()).expect("valid");
        assert_eq!(serde_json::to_value(&config).expect("serializes"), given);
    }
}
