//! Everything a request handler may use: the services (`crate::app`) and the settings
//! only the HTTP layer has.

use std::ops::Deref;
use std::sync::Arc;

use crate::app::Services;
use crate::tokens::Tokens;

/// What only the HTTP layer is configured with.
#[derive(Clone, Debug)]
pub struct HttpSettings {
    /// Base of the URLs we hand out, without a trailing slash (e.g. `http://127.0.0.1:8080`).
    pub public_url: String,
    /// Largest body of `write_file` and `upload_zip`.
    pub max_upload_bytes: u64,
    /// Largest extension archive.
    pub max_extension_bytes: u64,
    /// What proxy checks fetch.
    pub proxy_check_url: String,
    /// The region every browser and pool reports (`--region`).
    pub region: String,
    /// Where `GET /extensions/from_chrome_store` downloads from.
    pub chrome_web_store: Arc<crate::chrome_store::ChromeWebStore>,
    pub metrics: MetricsSettings,
    /// What the server offers each organization (`/org/limits`, `/org/entitlements`).
    pub offer: Offer,
    /// The OpenID Connect provider people sign in with (`--oidc-issuer`), if any.
    pub oidc: Option<Arc<crate::people::oidc::OidcProvider>>,
    /// The organization whose admins operate the host (`--operator-org`).
    pub operator_org: crate::store::Organization,
}

/// What this server offers every organization, from its configuration.
#[derive(Clone, Debug, Default)]
pub struct Offer {
    /// Live browsers outside pools, per organization (`--max-live-browsers`).
    pub max_live_browsers: i64,
    /// Browsers all pools of one organization may reserve (`--max-pooled-browsers`).
    pub max_pooled_browsers: i64,
    /// Invocations one organization may run at once (`--max-running-invocations`).
    pub max_running_invocations: i64,
    pub min_health_check_interval: i64,
    /// A 1Password Connect server is configured (`--onepassword-connect-url`).
    pub credential_providers: bool,
    /// Upstream proxies of the managed types are configured (`--proxy-upstreams`).
    pub managed_proxies: bool,
}

impl Offer {
    /// Most browsers the organization may run at once: on demand and reserved by pools.
    pub fn max_concurrent_browsers(&self) -> i64 {
        self.max_live_browsers + self.max_pooled_browsers
    }
}

/// Who may read `GET /metrics` on the API's address, and what capacity it reports.
#[derive(Clone, Debug)]
pub struct MetricsSettings {
    /// `None`: the API's address serves no metrics.
    pub token: Option<String>,
    pub capacity: crate::metrics::Capacity,
}

#[derive(Clone)]
pub struct AppState {
    pub services: Services,
    /// Signs and checks the tokens in `cdp_ws_url` and `replay_view_url`.
    pub tokens: Arc<Tokens>,
    pub settings: Arc<HttpSettings>,
    /// Live `fs/watch` watches (in this process).
    pub watches: Arc<super::browsers::fs_watch::registry::Watches>,
    /// Forwards requests to the replica that runs workflows.
    pub forwarder: reqwest::Client,
}

impl AppState {
    pub fn new(services: Services, tokens: Tokens, settings: HttpSettings) -> Self {
        Self {
            services,
            tokens: Arc::new(tokens),
            settings: Arc::new(settings),
            watches: Arc::default(),
            forwarder: forwarding_client(),
        }
    }

    /// `ws://…` or `wss://…` form of the public URL.
    pub fn public_ws_url(&self) -> String {
        let public_url = &self.settings.public_url;
        if let Some(rest) = public_url.strip_prefix("https://") {
            format!("wss://{rest}")
        } else if let Some(rest) = public_url.strip_prefix("http://") {
            format!("ws://{rest}")
        } else {
            public_url.clone()
        }
    }
}

/// Handlers reach the services as `state.sessions`, `state.store`, …
impl Deref for AppState {
    type Target = Services;

    fn deref(&self) -> &Services {
        &self.services
    }
}

/// The client requests forwarded to another replica go through (`super::forward`): no
/// overall timeout (streams last), a short one to connect.
fn forwarding_client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(3))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap_or_default()
}
