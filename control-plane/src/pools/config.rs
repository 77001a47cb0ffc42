//! A pool's configuration: its own fields and the configuration of its browsers, stored
//! as JSON in the pool's record and answered as `browser_pool_config`.

use serde::{Deserialize, Serialize};

use crate::error::{ServiceError, ServiceResult};
use crate::ids::name_problem;
use crate::sessions::BrowserConfig;
use crate::store::PoolRecord;

pub const MAX_POOL_SIZE: i64 = 100;
/// Percent of the pool's size launched per minute while filling.
pub const DEFAULT_FILL_RATE: i64 = 10;
pub const MAX_FILL_RATE: i64 = 10_000;
/// The inactivity timeout of acquired browsers.
pub const DEFAULT_POOL_TIMEOUT_SECONDS: i64 = 600;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolConfig {
    /// Browsers kept in the pool (idle + leased); 0 only before a create sets it.
    #[serde(default)]
    pub size: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default = "default_fill_rate")]
    pub fill_rate_per_minute: i64,
    /// The browsers' configuration; its `timeout_seconds` is the inactivity timeout of
    /// acquired browsers.
    #[serde(flatten)]
    pub browser: BrowserConfig,
}

fn default_fill_rate() -> i64 {
    DEFAULT_FILL_RATE
}

/// What a create starts from: no size yet (required), the default fill rate.
impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            size: 0,
            name: None,
            fill_rate_per_minute: DEFAULT_FILL_RATE,
            browser: BrowserConfig::default(),
        }
    }
}

/// What a create or an update sets; absent fields keep their current value.
#[derive(Clone, Debug, Default)]
pub struct PoolChanges {
    pub size: Option<i64>,
    pub name: Option<String>,
    pub fill_rate_per_minute: Option<i64>,
    pub browser: BrowserConfig,
}

impl PoolConfig {
    pub fn stored(record: &PoolRecord) -> ServiceResult<Self> {
        serde_json::from_value(record.config.clone()).map_err(|error| {
            ServiceError::internal(format!("pool {}: unreadable configuration: {error}", record.id))
        })
    }

    pub fn to_stored(&self) -> ServiceResult<serde_json::Value> {
        serde_json::to_value(self).map_err(ServiceError::internal)
    }

    /// This configuration with `changes` applied (and the defaults where still unset).
    pub fn changed(self, changes: PoolChanges) -> Self {
        let PoolChanges { size, name, fill_rate_per_minute, browser } = changes;
        let base = self.browser;
        Self {
            size: size.unwrap_or(self.size),
            name: name.or(self.name),
            fill_rate_per_minute: fill_rate_per_minute.unwrap_or(self.fill_rate_per_minute),
            browser: BrowserConfig {
                headless: browser.headless.or(base.headless),
                stealth: browser.stealth.or(base.stealth),
                kiosk_mode: browser.kiosk_mode.or(base.kiosk_mode),
                timeout_seconds: browser
                    .timeout_seconds
                    .or(base.timeout_seconds)
                    .or(Some(DEFAULT_POOL_TIMEOUT_SECONDS)),
                viewport: browser.viewport.or(base.viewport),
                extensions: browser.extensions.or(base.extensions),
                proxy_id: browser.proxy_id.or(base.proxy_id),
                profile: browser.profile.or(base.profile),
                network: browser.network.or(base.network),
                memory: browser.memory.or(base.memory),
                chrome_policy: browser.chrome_policy.or(base.chrome_policy),
                start_url: browser.start_url.or(base.start_url),
                location: browser.location.or(base.location),
                telemetry: browser.telemetry.or(base.telemetry),
            },
        }
    }

    /// The problems of the pool's own fields (the browsers' are checked as a create
    /// would check them).
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        match self.size {
            0 => problems.push("size is required".into()),
            size if !(1..=MAX_POOL_SIZE).contains(&size) => {
                problems.push(format!("size must be between 1 and {MAX_POOL_SIZE}, got {size}"))
            }
            _ => {}
        }
        let fill = self.fill_rate_per_minute;
        if !(1..=MAX_FILL_RATE).contains(&fill) {
            problems.push(format!(
                "fill_rate_per_minute must be between 1 and {MAX_FILL_RATE} (percent of size per minute), got {fill}"
            ));
        }
        if let Some(problem) = self.name.as_deref().and_then(|name| name_problem("name", name)) {
            problems.push(problem);
        }
        problems
    }

    /// Launches per minute the pool may make: its fill rate (percent of its size per
    /// minute), at least one.
    pub fn launches_per_minute(&self) -> f64 {
        ((self.size * self.fill_rate_per_minute) as f64 / 100.0).ceil().max(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_gets_the_defaults_and_an_update_keeps_what_it_does_not_set() {
        let created =
            PoolConfig::default().changed(PoolChanges { size: Some(3), ..Default::default() });
        assert_eq!(created.fill_rate_per_minute, DEFAULT_FILL_RATE);
        assert_eq!(created.browser.timeout_seconds, Some(DEFAULT_POOL_TIMEOUT_SECONDS));
        assert!(created.problems().is_empty());
        let updated = created.clone().changed(PoolChanges {
            name: Some("warm".into()),
            browser: BrowserConfig { headless: Some(true), ..Default::default() },
            ..Default::default()
        });
        assert_eq!(updated.size, 3);
        assert_eq!(updated.name.as_deref(), Some("warm"));
        assert_eq!(updated.browser.headless, Some(true));
    }

    #[test]
    fn stored_configurations_read_back_as_they_were_written() {
        let stored = serde_json::json!({
            "size": 2, "name": "p", "fill_rate_per_minute": 50, "timeout_seconds": 600,
            "headless": true, "viewport": {"width": 800, "height": 600},
        });
        let config: PoolConfig = serde_json::from_value(stored.clone()).expect("readable");
        assert_eq!(config.size, 2);
        assert_eq!(config.browser.headless, Some(true));
        assert_eq!(serde_json::to_value(&config).expect("writable"), stored);
    }

    #[test]
    fn size_and_fill_rate_are_bounded() {
        let config = PoolConfig { size: 101, fill_rate_per_minute: 0, ..Default::default() };
        let problems = config.problems();
        assert_eq!(problems.len(), 2, "{problems:?}");
    }
}
