//! A browser's telemetry settings: the `telemetry` object of create, update, pools and
//! acquire as the SDK sends it, what a session keeps of it, and how it reads back
//! (`BrowserTelemetryConfig`). The rules are the SDK's: the operational categories
//! (control, connection, system, captcha) are on by default once capture is enabled; the
//! others are opt-in; `{}`, `null` or `enabled: false` start nothing.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

/// A category of events, as the SDK names it.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Control,
    Connection,
    System,
    Captcha,
    Console,
    Network,
    Page,
    Interaction,
    Screenshot,
    Platform,
    /// The CDP monitor's own health: flows whenever a CDP category is captured.
    Monitor,
}

/// The categories capture starts with.
pub const DEFAULT_CATEGORIES: [Category; 4] =
    [Category::Control, Category::Connection, Category::System, Category::Captcha];
/// The categories the CDP monitor in the VM captures.
pub const CDP_CATEGORIES: [Category; 4] =
    [Category::Console, Category::Network, Category::Page, Category::Interaction];

impl Category {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Control => "control",
            Self::Connection => "connection",
            Self::System => "system",
            Self::Captcha => "captcha",
            Self::Console => "console",
            Self::Network => "network",
            Self::Page => "page",
            Self::Interaction => "interaction",
            Self::Screenshot => "screenshot",
            Self::Platform => "platform",
            Self::Monitor => "monitor",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        serde_json::from_value(Value::String(text.to_owned())).ok()
    }
}

/// An optional object field: `null` or a JSON object, never an array (which serde would
/// otherwise read as the struct's fields in order).
fn object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let object: Option<serde_json::Map<String, Value>> = Deserialize::deserialize(deserializer)?;
    object
        .map(|object| {
            serde_json::from_value(Value::Object(object)).map_err(serde::de::Error::custom)
        })
        .transpose()
}

/// `{"enabled": …}` of one category.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CategoryRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CdpControlRequest {
    /// CDP methods left out of `cdp_command` events; omitted keeps the current list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excluded_methods: Option<Vec<String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ControlRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub cdp: Option<CdpControlRequest>,
}

/// Per-category settings, layered onto the defaults (create) or the current ones (update).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CategoriesRequest {
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub control: Option<ControlRequest>,
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub connection: Option<CategoryRequest>,
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub system: Option<CategoryRequest>,
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub captcha: Option<CategoryRequest>,
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub console: Option<CategoryRequest>,
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub network: Option<CategoryRequest>,
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub page: Option<CategoryRequest>,
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub interaction: Option<CategoryRequest>,
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub screenshot: Option<CategoryRequest>,
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub platform: Option<CategoryRequest>,
}

impl CategoriesRequest {
    /// Each category given, and whether it is to be on.
    fn given(&self) -> Vec<(Category, bool)> {
        let plain = [
            (Category::Connection, &self.connection),
            (Category::System, &self.system),
            (Category::Captcha, &self.captcha),
            (Category::Console, &self.console),
            (Category::Network, &self.network),
            (Category::Page, &self.page),
            (Category::Interaction, &self.interaction),
            (Category::Screenshot, &self.screenshot),
            (Category::Platform, &self.platform),
        ];
        let control = self
            .control
            .as_ref()
            .and_then(|control| control.enabled)
            .map(|enabled| (Category::Control, enabled));
        control
            .into_iter()
            .chain(plain.into_iter().filter_map(|(category, request)| {
                request.as_ref().and_then(|r| r.enabled).map(|enabled| (category, enabled))
            }))
            .collect()
    }

    fn is_empty(&self) -> bool {
        self.given().is_empty() && self.excluded_methods().is_none()
    }

    fn excluded_methods(&self) -> Option<&Vec<String>> {
        self.control.as_ref()?.cdp.as_ref()?.excluded_methods.as_ref()
    }
}

/// `{"id"}` or `{"name"}` of an OTLP destination.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DestinationReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OtlpExportRequest {
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub destination: Option<DestinationReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExportRequest {
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub otlp: Option<OtlpExportRequest>,
}

/// `telemetry` as the SDK sends it. Read from a JSON object only (serde would otherwise
/// take an array's items as the fields in order).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, try_from = "serde_json::Map<String, Value>")]
pub struct TelemetryRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub browser: Option<CategoriesRequest>,
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub export: Option<ExportRequest>,
    #[serde(default, deserialize_with = "object", skip_serializing_if = "Option::is_none")]
    pub storage: Option<CategoryRequest>,
}

impl TelemetryRequest {
    /// The OTLP destination (id or name) it exports to, if it names one.
    pub fn destination(&self) -> Option<String> {
        let reference = self.export.as_ref()?.otlp.as_ref()?.destination.as_ref()?;
        reference.id.clone().or_else(|| reference.name.clone())
    }
}

/// `TelemetryRequest`'s fields, as read from an object.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TelemetryFields {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default, deserialize_with = "object")]
    browser: Option<CategoriesRequest>,
    #[serde(default, deserialize_with = "object")]
    export: Option<ExportRequest>,
    #[serde(default, deserialize_with = "object")]
    storage: Option<CategoryRequest>,
}

impl TryFrom<serde_json::Map<String, Value>> for TelemetryRequest {
    type Error = String;

    fn try_from(object: serde_json::Map<String, Value>) -> Result<Self, String> {
        let fields: TelemetryFields = serde_path_to_error::deserialize(Value::Object(object))
            .map_err(|error| match error.path().to_string().as_str() {
                "." => error.inner().to_string(),
                path => format!("{path}: {}", error.inner()),
            })?;
        Ok(Self {
            enabled: fields.enabled,
            browser: fields.browser,
            export: fields.export,
            storage: fields.storage,
        })
    }
}

/// What a session keeps: the categories captured (none: capture stopped), the OTLP
/// destination its events go to, and whether they are stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TelemetrySettings {
    pub categories: BTreeSet<Category>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded_cdp_methods: Vec<String>,
    /// The destination's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    pub storage: bool,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        Self {
            categories: BTreeSet::new(),
            excluded_cdp_methods: Vec::new(),
            destination: None,
            storage: true,
        }
    }
}

impl TelemetrySettings {
    pub fn captures(&self, category: Category) -> bool {
        match category {
            Category::Monitor => self.captures_cdp(),
            other => self.categories.contains(&other),
        }
    }

    /// Whether any category of the CDP monitor in the VM is on.
    pub fn captures_cdp(&self) -> bool {
        CDP_CATEGORIES.iter().any(|c| self.categories.contains(c))
    }

    pub fn active(&self) -> bool {
        !self.categories.is_empty()
    }

    /// `BrowserTelemetryConfig`, as a browser (or pool) reads back.
    pub fn view(&self) -> Value {
        let category = |c: Category| json!({ "enabled": self.categories.contains(&c) });
        json!({
            "browser": {
                "control": {
                    "enabled": self.categories.contains(&Category::Control),
                    "cdp": { "excluded_methods": self.excluded_cdp_methods },
                },
                "connection": category(Category::Connection),
                "system": category(Category::System),
                "captcha": category(Category::Captcha),
                "console": category(Category::Console),
                "network": category(Category::Network),
                "page": category(Category::Page),
                "interaction": category(Category::Interaction),
                "screenshot": category(Category::Screenshot),
                "platform": category(Category::Platform),
            },
            "export": { "otlp": match &self.destination {
                Some(id) => json!({ "enabled": true, "destination": id }),
                None => json!({ "enabled": false }),
            }},
            "storage": { "enabled": self.storage },
        })
    }
}

/// What a request asks of the export: `None` leaves it, `Some(None)` stops it,
/// `Some(Some(reference))` exports to that destination (still to be looked up).
pub type ExportChange = Option<Option<DestinationReference>>;

/// The settings a request gives (destination not yet looked up), or every problem.
pub struct Resolved {
    pub settings: Option<TelemetrySettings>,
    pub export: ExportChange,
}

fn request_problems(request: &TelemetryRequest) -> (Vec<String>, ExportChange) {
    let mut problems = Vec::new();
    let browser_given = request.browser.as_ref().is_some_and(|b| !b.is_empty());
    if request.enabled == Some(false) && browser_given {
        problems.push(
            "telemetry: enabled=false cannot be combined with browser category settings".into(),
        );
    }
    let export = match request.export.as_ref().and_then(|e| e.otlp.as_ref()) {
        None => None,
        Some(otlp) => {
            match (&otlp.destination, otlp.enabled) {
                (Some(_), Some(false)) => {
                    problems.push("telemetry.export.otlp: enabled=false cannot be combined with a destination".into());
                    None
                }
                (Some(reference), _) => {
                    let ok = matches!((&reference.id, &reference.name), (Some(k), None) | (None, Some(k)) if !k.is_empty());
                    if !ok {
                        problems.push(
                            "telemetry.export.otlp.destination must have exactly one of id or name"
                                .into(),
                        );
                    }
                    Some(Some(reference.clone()))
                }
                (None, Some(false)) => Some(None),
                (None, _) => {
                    problems.push("telemetry.export.otlp: name a destination to export to".into());
                    None
                }
            }
        }
    };
    if let Some(methods) = request.browser.as_ref().and_then(|b| b.excluded_methods())
        && methods.len() > 256
    {
        problems.push("telemetry.browser.control.cdp.excluded_methods: at most 256".into());
    }
    (problems, export)
}

fn layered(
    mut categories: BTreeSet<Category>, browser: Option<&CategoriesRequest>,
) -> BTreeSet<Category> {
    for (category, enabled) in browser.map(CategoriesRequest::given).unwrap_or_default() {
        if enabled {
            categories.insert(category);
        } else {
            categories.remove(&category);
        }
    }
    categories
}

/// The settings of a new browser, `None` when capture does not start.
pub fn on_create(request: Option<&TelemetryRequest>) -> Result<Resolved, Vec<String>> {
    let Some(request) = request else {
        return Ok(Resolved { settings: None, export: None });
    };
    let (mut problems, export) = request_problems(request);
    let browser_given = request.browser.as_ref().is_some_and(|b| !b.is_empty());
    let starts = request.enabled == Some(true) || (request.enabled.is_none() && browser_given);
    let storage = request.storage.as_ref().and_then(|s| s.enabled).unwrap_or(true);
    let exports = matches!(export, Some(Some(_)));
    if !storage && !exports {
        problems.push(
            "telemetry.storage.enabled=false requires telemetry.export.otlp.destination".into(),
        );
    }
    let categories = if starts {
        layered(DEFAULT_CATEGORIES.into_iter().collect(), request.browser.as_ref())
    } else {
        BTreeSet::new()
    };
    if exports && categories.is_empty() {
        problems.push("telemetry.export.otlp requires telemetry capture to be enabled".into());
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let settings = (!categories.is_empty()).then(|| TelemetrySettings {
        categories,
        excluded_cdp_methods: excluded(request, &[]),
        destination: None,
        storage,
    });
    Ok(Resolved { settings, export })
}

/// A session's settings after an update; `current` is what it has (`None`: never
/// enabled).
pub fn on_update(
    current: Option<&TelemetrySettings>, request: Option<&TelemetryRequest>,
) -> Result<Resolved, Vec<String>> {
    let Some(request) = request.filter(|r| **r != TelemetryRequest::default()) else {
        return Ok(Resolved { settings: current.cloned(), export: None });
    };
    let (mut problems, export) = request_problems(request);
    if request.storage.is_some() {
        problems.push("telemetry.storage cannot be changed after the browser is created".into());
    }
    let base = current.cloned().unwrap_or_default();
    let categories = match request.enabled {
        Some(false) => BTreeSet::new(),
        Some(true) => layered(DEFAULT_CATEGORIES.into_iter().collect(), request.browser.as_ref()),
        None if base.active() => layered(base.categories.clone(), request.browser.as_ref()),
        None => layered(DEFAULT_CATEGORIES.into_iter().collect(), request.browser.as_ref()),
    };
    if matches!(export, Some(Some(_))) && categories.is_empty() {
        problems.push("telemetry.export.otlp requires telemetry capture to be enabled".into());
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let settings = TelemetrySettings {
        excluded_cdp_methods: excluded(request, &base.excluded_cdp_methods),
        categories,
        ..base
    };
    Ok(Resolved { settings: Some(settings), export })
}

fn excluded(request: &TelemetryRequest, current: &[String]) -> Vec<String> {
    request
        .browser
        .as_ref()
        .and_then(|b| b.excluded_methods())
        .cloned()
        .unwrap_or_else(|| current.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(value: Value) -> TelemetryRequest {
        serde_json::from_value(value).unwrap_or_else(|error| panic!("{error}"))
    }

    fn created(value: Value) -> Option<BTreeSet<Category>> {
        on_create(Some(&request(value)))
            .unwrap_or_else(|problems| panic!("{problems:?}"))
            .settings
            .map(|s| s.categories)
    }

    #[test]
    fn nothing_starts_without_asking() {
        assert_eq!(created(json!({})), None);
        assert_eq!(created(json!({"enabled": false})), None);
        assert!(on_create(None).is_ok_and(|r| r.settings.is_none()));
        let all_off = json!({"browser": {"control": {"enabled": false}, "connection": {"enabled": false},
            "system": {"enabled": false}, "captcha": {"enabled": false}}});
        assert_eq!(created(all_off), None);
    }

    #[test]
    fn enabled_captures_the_operational_categories_and_others_opt_in() {
        let defaults: BTreeSet<_> = DEFAULT_CATEGORIES.into_iter().collect();
        assert_eq!(created(json!({"enabled": true})), Some(defaults.clone()));
        let with_console = created(
            json!({"browser": {"console": {"enabled": true}, "system": {"enabled": false}}}),
        );
        let mut expected = defaults;
        expected.insert(Category::Console);
        expected.remove(&Category::System);
        assert_eq!(with_console, Some(expected));
    }

    #[test]
    fn updates_merge_unless_enabled_says_otherwise() {
        let current = on_create(Some(&request(json!({"browser": {"console": {"enabled": true}}}))))
            .ok()
            .and_then(|r| r.settings);
        let merged = on_update(
            current.as_ref(),
            Some(&request(json!({"browser": {"network": {"enabled": true}}}))),
        )
        .ok()
        .and_then(|r| r.settings)
        .map(|s| s.categories);
        assert!(
            merged
                .as_ref()
                .is_some_and(|c| c.contains(&Category::Console) && c.contains(&Category::Network))
        );
        let fresh = on_update(current.as_ref(), Some(&request(json!({"enabled": true}))))
            .ok()
            .and_then(|r| r.settings)
            .map(|s| s.categories);
        assert_eq!(fresh, Some(DEFAULT_CATEGORIES.into_iter().collect()));
        let stopped = on_update(current.as_ref(), Some(&request(json!({"enabled": false}))))
            .ok()
            .and_then(|r| r.settings);
        assert!(stopped.is_some_and(|s| !s.active()));
        let unchanged =
            on_update(current.as_ref(), Some(&request(json!({})))).ok().and_then(|r| r.settings);
        assert_eq!(unchanged, current);
    }

    #[test]
    fn contradictions_are_refused() {
        assert!(
            on_create(Some(&request(
                json!({"enabled": false, "browser": {"console": {"enabled": true}}})
            )))
            .is_err()
        );
        assert!(
            on_create(Some(&request(json!({"enabled": true, "storage": {"enabled": false}}))))
                .is_err()
        );
        assert!(
            on_create(Some(&request(json!({"export": {"otlp": {"destination": {"name": "x"}}}}))))
                .is_err()
        );
        assert!(
            serde_json::from_value::<TelemetryRequest>(json!({"browser": {"bogus": {}}})).is_err()
        );
    }
}
