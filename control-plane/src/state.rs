//! Everything a request handler may use, built once at start.

use std::sync::Arc;

use crate::auth::KeyCache;
use crate::blobs::BlobStore;
use crate::managed_auth::ManagedAuth;
use crate::pools::PoolSignals;
use crate::profiles::Profiles;
use crate::proxies::ProxyUpstreams;
use crate::replays::Replays;
use crate::sessions::Sessions;
use crate::store::Store;
use crate::tokens::Tokens;

#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub key_cache: Arc<KeyCache>,
    pub sessions: Arc<Sessions>,
    pub replays: Arc<Replays>,
    pub profiles: Arc<Profiles>,
    pub managed_auth: Arc<ManagedAuth>,
    pub tokens: Arc<Tokens>,
    /// Base of the URLs we hand out, without a trailing slash (e.g. `http://127.0.0.1:8080`).
    pub public_url: String,
    /// Largest body of `write_file` and `upload_zip`.
    pub max_upload_bytes: u64,
    pub blobs: Arc<dyn BlobStore>,
    /// Largest extension archive.
    pub max_extension_bytes: u64,
    pub proxy_upstreams: Arc<ProxyUpstreams>,
    /// What proxy checks fetch.
    pub proxy_check_url: String,
    pub pools: Arc<PoolSignals>,
    /// Most browsers all pools of one organization may hold together.
    pub max_pooled_browsers: i64,
}

impl AppState {
    /// `ws://…` or `wss://…` form of the public URL.
    pub fn public_ws_url(&self) -> String {
        if let Some(rest) = self.public_url.strip_prefix("https://") {
            format!("wss://{rest}")
        } else if let Some(rest) = self.public_url.strip_prefix("http://") {
            format!("ws://{rest}")
        } else {
            self.public_url.clone()
        }
    }
}
