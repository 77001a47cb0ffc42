//! Standby browsers: generic VMs started before anyone asks, so that `POST /browsers`
//! is answered by handing one over instead of starting a VM.
//!
//! They are the browsers of internal pools (one headful, one headless) of an
//! organization no API key can belong to, kept at the operator's size by the pool
//! reconciler like any pool. A create whose configuration such a browser can take on
//! without a new launch claims one: in one statement its record becomes the caller's
//! session (organization, settings, labels, creation time) and leaves the pool, which
//! the reconciler then refills. What a launch fixes (extensions, a profile, a policy,
//! stealth, kiosk, memory, headless or not, and a headless browser's viewport) must
//! match, else the create starts a VM as before; what can change on a running browser
//! (a headful viewport, location, egress, labels, timeout, start URL) is applied after
//! the claim. A standby browser has never served
//! anyone, and a claimed one ends with its session: it is never handed over twice.

use chrono::Utc;

use super::spec::default_memory;
use super::{BrowserConfig, BrowserSpec, DEFAULT_VIEWPORT};
use crate::pools::{MAX_FILL_RATE, PoolConfig};
use crate::store::{PoolRecord, Store, StoreError, StoreResult};

/// The organization that holds the standby browsers. API keys are refused for names in
/// parentheses (`api_keys`), so no caller can ever see or lease them.
pub const STANDBY_ORGANIZATION: &str = "(standby browsers)";

/// The inactivity timeout written into a standby pool's configuration: idle pool
/// browsers never time out, and a claim sets the caller's.
const STANDBY_TIMEOUT_SECONDS: i64 = 600;

/// How many standby browsers of each kind the operator wants (the same on every replica).
#[derive(Clone, Copy, Debug, Default)]
pub struct StandbySizes {
    pub headful: u32,
    pub headless: u32,
}

/// The standby pools, as configured at start.
#[derive(Clone, Debug)]
pub struct Standby {
    headful_pool: Option<String>,
    headless_pool: Option<String>,
}

impl Standby {
    /// Creates or resizes the standby pools to the configured sizes. A pool that exists
    /// and is not wanted any more is set to size 0: the reconciler then ends its idle
    /// browsers.
    pub async fn configure(store: &dyn Store, sizes: StandbySizes) -> StoreResult<Self> {
        let organization = store.ensure_organization(STANDBY_ORGANIZATION).await?;
        let mut pool_ids = [None, None];
        for (slot, (headless, size)) in
            pool_ids.iter_mut().zip([(false, sizes.headful), (true, sizes.headless)])
        {
            let pool = ensure_pool(store, &organization.id, headless, size).await?;
            *slot = pool.filter(|pool| pool.size > 0).map(|pool| pool.id);
        }
        let [headful_pool, headless_pool] = pool_ids;
        Ok(Self { headful_pool, headless_pool })
    }

    pub fn has_pool(&self, pool_id: &str) -> bool {
        self.pool_ids().any(|id| id == pool_id)
    }

    /// The standby pools there are.
    pub fn pool_ids(&self) -> impl Iterator<Item = &str> {
        [self.headful_pool.as_deref(), self.headless_pool.as_deref()].into_iter().flatten()
    }

    /// The standby pool whose browsers can become this session without a new launch,
    /// if any.
    pub fn pool_for(&self, spec: &BrowserSpec) -> Option<&str> {
        let takes_a_launch = spec.pool_id.is_some()
            || !spec.extensions.is_empty()
            || spec.profile.is_some()
            || spec.chrome_policy.is_some()
            || spec.stealth
            || spec.kiosk_mode
            || spec.memory.0 != default_memory(spec.headless)
            // A headless browser's window size is a launch flag: it cannot be resized.
            || (spec.headless
                && (spec.viewport_width, spec.viewport_height) != standby_viewport());
        if takes_a_launch {
            return None;
        }
        match spec.headless {
            false => self.headful_pool.as_deref(),
            true => self.headless_pool.as_deref(),
        }
    }
}

/// The viewport every standby browser starts with; a claim resizes to the caller's.
pub fn standby_viewport() -> (i64, i64) {
    DEFAULT_VIEWPORT
}

fn pool_name(headless: bool) -> &'static str {
    if headless { "standby-headless" } else { "standby-headful" }
}

/// The standby pool of this kind at `size`: created if missing (unless `size` is 0),
/// its size changed if it differs. Concurrent replicas starting together may both
/// create it: the one that loses reads the winner's.
async fn ensure_pool(
    store: &dyn Store, org_id: &str, headless: bool, size: u32,
) -> StoreResult<Option<PoolRecord>> {
    let name = pool_name(headless);
    let config = PoolConfig {
        size: i64::from(size),
        name: Some(name.to_owned()),
        // A claimed browser is replaced as soon as the host can start one.
        fill_rate_per_minute: MAX_FILL_RATE,
        browser: BrowserConfig {
            headless: Some(headless),
            timeout_seconds: Some(STANDBY_TIMEOUT_SECONDS),
            ..BrowserConfig::default()
        },
    };
    let stored =
        serde_json::to_value(&config).map_err(|error| StoreError::Backend(error.to_string()))?;
    loop {
        if let Some(mut pool) = store.pool(org_id, name).await? {
            if pool.size != config.size || pool.config != stored {
                pool.size = config.size;
                pool.config = stored.clone();
                store.update_pool(&pool).await?;
            }
            return Ok(Some(pool));
        }
        if size == 0 {
            return Ok(None);
        }
        let pool = PoolRecord {
            id: crate::ids::new_id("pool"),
            org_id: org_id.to_owned(),
            name: Some(name.to_owned()),
            size: config.size,
            config: stored.clone(),
            created_at: Utc::now(),
            project_id: None,
        };
        match store.insert_pool(&pool).await {
            Ok(()) => return Ok(Some(pool)),
            Err(StoreError::Conflict(_)) => continue,
            Err(error) => return Err(error),
        }
    }
}
