//! The services, wired together once: by `serve` over the real runtime and store, and by
//! tests over a fake runtime. The HTTP layer receives them in its `AppState`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::access::keys::ApiKeys;
use crate::agent::AgentClients;
use crate::apps::Apps;
use crate::audit::AuditLog;
use crate::audit::export::AuditExport;
use crate::audit::s3::S3Writer;
use crate::blobs::BlobStore;
use crate::credentials::CredentialService;
use crate::credentials::onepassword::OnePassword;
use crate::egress::EgressPolicy;
use crate::managed_auth::ManagedAuth;
use crate::managed_auth::vault::Vault;
use crate::pools::Pools;
use crate::profiles::Profiles;
use crate::proxies::ProxyUpstreams;
use crate::replays::Replays;
use crate::replicas::{Replica, WORKFLOWS};
use crate::runtime::Runtime;
use crate::sessions::{Sessions, SessionsDeps};
use crate::store::Store;
use crate::telemetry::destinations::Destinations;
use crate::telemetry::{Exporter, Telemetry};

/// What the services are configured with.
pub struct ServiceSettings {
    /// Remuxes recordings salvaged from crashed agents.
    pub media: crate::replays::VmMedia,
    pub proxy_upstreams: Arc<ProxyUpstreams>,
    /// What custom proxies may point at.
    pub egress: Arc<EgressPolicy>,
    /// Most browsers all pools of one organization may hold together.
    pub max_pooled_browsers: i64,
    /// What one organization may have live outside its pools.
    pub live_limits: crate::sessions::LiveLimits,
    /// What the whole deployment may hold at once.
    pub host_limits: crate::sessions::HostLimits,
    pub vault: Vault,
    /// The 1Password Connect server credential providers of type onepassword use.
    pub onepassword_connect_url: Option<String>,
    /// Shortest health-check interval an organization may ask for.
    pub min_health_check_interval: i64,
    /// Where apps' builds and actions run; `None` without the VM sandbox.
    pub app_runner: Option<crate::apps::runner::AppRunner>,
    /// Most invocations one organization may run at once.
    pub max_running_invocations: usize,
    /// This process among the replicas sharing the store; the same across its restarts.
    pub replica_id: String,
    /// Where the other replicas reach this one.
    pub replica_address: String,
    /// How long audit records are kept.
    pub audit_retention: Duration,
    /// Where audit logs are delivered from (STS, S3, this server's AWS identity).
    pub aws: crate::audit::s3::AwsSettings,
    /// How old an audit record must be before it is delivered.
    pub audit_export_delay: Duration,
}

#[derive(Clone)]
pub struct Services {
    pub store: Arc<dyn Store>,
    /// API keys: checked on every call, managed over `/org/api_keys`.
    pub api_keys: Arc<ApiKeys>,
    /// Who did what (`crate::audit`).
    pub audit: Arc<AuditLog>,
    /// Delivers audit logs to their export destinations (`crate::audit::export`).
    pub audit_export: Arc<AuditExport>,
    pub blobs: Arc<dyn BlobStore>,
    pub runtime: Arc<dyn Runtime>,
    pub agents: Arc<AgentClients>,
    pub replays: Arc<Replays>,
    pub profiles: Arc<Profiles>,
    pub sessions: Arc<Sessions>,
    pub pools: Arc<Pools>,
    pub managed_auth: Arc<ManagedAuth>,
    pub credentials: Arc<CredentialService>,
    pub apps: Arc<Apps>,
    pub proxy_upstreams: Arc<ProxyUpstreams>,
    pub egress: Arc<EgressPolicy>,
    /// This process among the replicas sharing the store.
    pub replica: Arc<Replica>,
    /// Browsers' telemetry: recorded, stored, exported.
    pub telemetry: Arc<Telemetry>,
    pub telemetry_destinations: Arc<Destinations>,
}

impl Services {
    pub fn new(
        store: Arc<dyn Store>, blobs: Arc<dyn BlobStore>, runtime: Arc<dyn Runtime>,
        settings: ServiceSettings,
    ) -> Self {
        let agents = Arc::new(AgentClients::default());
        let replica = Replica::new(store.clone(), settings.replica_id, settings.replica_address);
        let replays = Arc::new(Replays::new(
            store.clone(),
            blobs.clone(),
            runtime.clone(),
            agents.clone(),
            settings.media,
        ));
        let profiles = Arc::new(Profiles::new(store.clone(), blobs.clone()));
        let vault = Arc::new(settings.vault);
        let exporter = Exporter::new(store.clone(), vault.clone(), settings.egress.clone());
        let telemetry = Telemetry::new(
            store.clone(),
            agents.clone(),
            replica.clone(),
            exporter,
            runtime.proxy_failures(),
        );
        let telemetry_destinations =
            Arc::new(Destinations::new(store.clone(), vault.clone(), settings.egress.clone()));
        let sessions = Arc::new(Sessions::new(SessionsDeps {
            store: store.clone(),
            runtime: runtime.clone(),
            agents: agents.clone(),
            replays: replays.clone(),
            profiles: profiles.clone(),
            blobs: blobs.clone(),
            proxy_upstreams: settings.proxy_upstreams.clone(),
            egress: settings.egress.clone(),
            live_limits: settings.live_limits,
            host_limits: settings.host_limits,
            replica: replica.clone(),
            telemetry: telemetry.clone(),
        }));
        let pools = Arc::new(Pools::new(
            store.clone(),
            sessions.clone(),
            replays.clone(),
            settings.max_pooled_browsers,
        ));
        let credentials = Arc::new(CredentialService::new(
            store.clone(),
            vault.clone(),
            OnePassword::new(store.clone(), vault.clone(), settings.onepassword_connect_url),
        ));
        let apps = Arc::new(Apps::new(
            store.clone(),
            vault.clone(),
            sessions.clone(),
            settings.app_runner,
            settings.max_running_invocations,
        ));
        let managed_auth = Arc::new(ManagedAuth::new(
            vault,
            settings.min_health_check_interval,
            store.clone(),
            sessions.clone(),
            profiles.clone(),
            credentials.clone(),
            replays.clone(),
        ));
        let audit_export = Arc::new(AuditExport::new(
            store.clone(),
            S3Writer::new(settings.aws),
            settings.audit_export_delay,
        ));
        Self {
            audit_export,
            api_keys: Arc::new(ApiKeys::new(store.clone())),
            audit: Arc::new(AuditLog::new(store.clone(), settings.audit_retention)),
            store,
            blobs,
            runtime,
            agents,
            replays,
            profiles,
            sessions,
            pools,
            managed_auth,
            credentials,
            apps,
            proxy_upstreams: settings.proxy_upstreams,
            egress: settings.egress,
            replica,
            telemetry,
            telemetry_destinations,
        }
    }

    /// Picks up what a previous process left (sessions, recordings, workflows) and starts
    /// the background loops. `heartbeat` is how often agents are called.
    pub async fn start(&self, heartbeat: Duration) -> anyhow::Result<()> {
        self.replica.join().await.context("joining the control-plane replicas")?;
        self.pools.listen_for_resets();
        self.telemetry.start();
        self.audit.start();
        self.audit_export.start(&self.replica);
        self.sessions.start_background(heartbeat).await.context("adopting browser sessions")?;
        self.pools.start_reconciler();
        crate::memory::start_trimming();
        self.replays.resume().await.context("resuming replays")?;
        // Workflows run on one replica: at once if no other runs them (as after a
        // restart), else once the one that does is gone.
        let mut workflows = self.replica.duty(WORKFLOWS);
        workflows.settled().await;
        if workflows.is_held() {
            self.resume_workflows().await?;
        }
        let this = self.clone();
        tokio::spawn(async move {
            if !workflows.is_held() {
                workflows.held().await;
                if let Err(error) = this.resume_workflows().await {
                    tracing::error!(
                        error = format!("{error:#}"),
                        "could not take the workflows over"
                    );
                }
            }
            workflows.lost().await;
            if !this.replica.is_shared() {
                // Alone on its store (SQLite): nobody else can have taken them.
                tracing::warn!("could not renew the workflows duty; no other replica can run them");
                return;
            }
            // Another replica may run them now: two would each act on every connection
            // and invocation. A supervisor starts this one again.
            tracing::error!("this replica lost the workflows duty while running them; exiting");
            std::process::exit(70);
        });
        Ok(())
    }

    async fn resume_workflows(&self) -> anyhow::Result<()> {
        tracing::info!("running managed-auth workflows and apps on this replica");
        self.managed_auth.resume_all().await.context("resuming auth connection workflows")?;
        self.apps.resume().await.context("resuming deployments and invocations")
    }
}
