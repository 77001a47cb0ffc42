//! Runs the server: store, bootstrap key, runtime, the services (`crate::app`), HTTP.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::serve::ListenerExt;

use crate::api::state::{AppState, HttpSettings, MetricsSettings};
use crate::app::{ServiceSettings, Services};
use crate::apps::runner::AppRunner;
use crate::blobs::LocalBlobStore;
use crate::chrome_store::ChromeWebStore;
use crate::config::{Isolation, RuntimeKind, ServeConfig};
use crate::egress::EgressPolicy;
use crate::managed_auth::vault::Vault;
use crate::metrics::Capacity;
use crate::proxies::ProxyUpstreams;
use crate::runtime::cgroups::VmCgroups;
use crate::runtime::disk::VmDisks;
use crate::runtime::kubernetes::{KubernetesRuntime, KubernetesRuntimeConfig, PodTemplate};
use crate::runtime::{KernelLimits, LocalRuntime, LocalRuntimeConfig, Runtime, Sandbox, ZipLimits};
use crate::sessions::standby::{Standby, StandbySizes};
use crate::sessions::{HostLimits, LiveLimits};
use crate::store::Store;
use crate::tokens::Tokens;
use crate::{access, api, store};

pub const BOOTSTRAP_KEY_FILE: &str = "bootstrap-api-key";
const BOOTSTRAP_ORGANIZATION: &str = "default";

pub async fn serve(config: ServeConfig) -> anyhow::Result<()> {
    // The data directory holds the database (with the token signing key), the credential
    // key, agent secrets and every organization's profiles: no other user of this host
    // may read any of it, also what older versions left readable.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let data_dir = &config.storage.data_dir;
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating the data dir {}", data_dir.display()))?;
    let data_dir = data_dir.canonicalize()?;
    // A directory owned by someone else (a shared volume) cannot be changed; say so
    // rather than refuse to start: its files are still created 0600.
    if let Err(error) = std::fs::set_permissions(&data_dir, std::fs::Permissions::from_mode(0o700))
    {
        tracing::warn!(dir = %data_dir.display(), %error, "could not make the data directory private (0700)");
    }
    let store = store::open(config.storage.database_url.as_deref(), &data_dir).await?;
    let blobs = Arc::new(LocalBlobStore::open(&data_dir.join("blobs"))?);
    bootstrap_api_key(store.as_ref(), &data_dir).await?;

    let agent_binary = match &config.agent_binary {
        Some(path) => path.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("locating the browser-agent binary")?
            .join("browser-agent"),
    };
    let mut node_runtime = node_runtime(config.node_runtime.clone());
    let agent_idle_grace = Duration::from_secs(config.agent_idle_grace_seconds.max(1));
    let freeze_idle_after = (config.freeze_idle_after_seconds > 0)
        .then(|| Duration::from_secs(config.freeze_idle_after_seconds));
    let mut browsers_dir = data_dir.join("browsers");
    let mut apps_dir = data_dir.join("apps");
    let mut agent_binary = agent_binary;
    let sandbox = match (config.isolation, config.runtime) {
        (Isolation::Sandbox, runtime) => {
            let placed =
                Sandbox::prepare(&config.vm_user, &config.vm_tenant_user).and_then(|sandbox| {
                    let placement =
                        sandbox.place(&data_dir, &agent_binary, node_runtime.as_deref())?;
                    Ok((sandbox, placement))
                });
            match (placed, runtime) {
                (Ok((sandbox, placement)), _) => {
                    browsers_dir = placement.browsers_dir;
                    apps_dir = placement.apps_dir;
                    agent_binary = placement.agent_binary;
                    node_runtime = placement.node_runtime;
                    Some(sandbox)
                }
                (Err(reason), RuntimeKind::Local) => anyhow::bail!(
                    "browsers cannot be sandboxed on this host: {reason}. (--isolation none \
                     runs them without a sandbox: unsafe, for development only)"
                ),
                // Browsers are pods; only apps' actions would run here, so they do not.
                (Err(reason), RuntimeKind::Kubernetes) => {
                    tracing::warn!(
                        %reason,
                        "apps cannot run on this control plane: their actions need a sandbox"
                    );
                    None
                }
            }
        }
        (Isolation::None, RuntimeKind::Kubernetes) => {
            tracing::warn!("--isolation none: apps cannot run (their actions need a sandbox)");
            None
        }
        (Isolation::None, RuntimeKind::Local) => {
            tracing::warn!(
                "--isolation none: browsers run WITHOUT A SANDBOX, as this service's user on \
                 this host; pages can read its files and reach its network. Development only"
            );
            None
        }
    };
    let egress = EgressPolicy::new(config.egress_allow.clone());
    // Bound before the services start: apps reach the API at its port.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let bound = listener.local_addr()?;
    let public_url = config
        .public_url
        .clone()
        .unwrap_or_else(|| format!("http://{bound}"))
        .trim_end_matches('/')
        .to_owned();
    let replica_id = match &config.replica_id {
        Some(id) => id.clone(),
        None => replica_id(&data_dir)?,
    };
    anyhow::ensure!(
        config.metrics_token.as_deref() != Some(""),
        "--metrics-token is empty: give a token, or leave it unset"
    );
    // It names a file (the apps' API socket) and appears in logs and metrics.
    anyhow::ensure!(
        !replica_id.is_empty()
            && replica_id.len() <= 64
            && replica_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')),
        "the replica id {replica_id:?} must be 1 to 64 letters, digits, '-', '_' or '.'"
    );
    let internal_url = match &config.internal_url {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None if bound.ip().is_unspecified() => format!("http://127.0.0.1:{}", bound.port()),
        None => format!("http://{bound}"),
    };
    // One per replica: replicas on one host may share the data directory.
    let app_api_socket = apps_dir.join(format!("api-{replica_id}.sock"));
    // Recordings of crashed agents are remuxed in sandboxes of their own.
    let media_sandbox = sandbox.clone();
    let limits = kernel_limits(sandbox.is_some(), &config);
    let app_runner = sandbox.clone().map(|sandbox| AppRunner {
        sandbox,
        agent_binary: agent_binary.clone(),
        node_runtime: node_runtime.clone(),
        apps_dir: apps_dir.clone(),
        api_socket: app_api_socket.clone(),
        api_port: app_api_port(&public_url, bound.port()),
        egress: egress.clone(),
        cgroups: limits.cgroups.clone().ok(),
        cpu_weight: config.vm_cpu_weight,
    });
    let zip_limits = ZipLimits {
        max_entries: config.zip_max_entries,
        max_expanded_bytes: config.zip_max_expanded_bytes,
        max_ratio: config.zip_max_ratio,
    };
    let runtime: Arc<dyn Runtime> = match config.runtime {
        RuntimeKind::Local => Arc::new(LocalRuntime::new(LocalRuntimeConfig {
            limits,
            sandbox,
            egress: egress.clone(),
            browsers_dir,
            agent_binary,
            node_runtime,
            chromium: config.chromium.clone(),
            xvfb: config.xvfb.clone(),
            ffmpeg: config.ffmpeg.clone(),
            max_resized_viewport: config.max_resized_viewport,
            agent_idle_grace,
            freeze_idle_after,
            zip_limits,
        })),
        RuntimeKind::Kubernetes => {
            let template = config
                .kubernetes_pod_template
                .as_deref()
                .context("--runtime kubernetes needs --kubernetes-pod-template")?;
            let tls = match &config.agent_tls_ca {
                Some(path) => {
                    let ca = std::fs::read(path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    crate::agent::use_agent_tls(ca, &config.agent_tls_server_name);
                    true
                }
                None => false,
            };
            let runtime_config = KubernetesRuntimeConfig {
                template: PodTemplate::load(template, tls)?,
                tls,
                agent_port: config.kubernetes_agent_port,
                start_timeout: Duration::from_secs(config.kubernetes_start_timeout_seconds),
                agent_idle_grace,
                freeze_idle_after,
                zip_limits,
                max_resized_viewport: config.max_resized_viewport,
                disk_bytes: (config.vm_disk_gib > 0).then_some(config.vm_disk_gib << 30),
            };
            Arc::new(
                KubernetesRuntime::connect(config.kubernetes_namespace.as_deref(), runtime_config)
                    .await?,
            )
        }
    };
    let proxy_upstreams = match &config.proxy_upstreams {
        Some(path) => ProxyUpstreams::load(path)
            .with_context(|| format!("reading proxy upstreams from {}", path.display()))?,
        None => ProxyUpstreams::default(),
    };
    let offer = api::state::Offer {
        max_live_browsers: i64::from(config.max_live_browsers),
        max_pooled_browsers: config.max_pooled_browsers,
        max_running_invocations: config.max_running_invocations as i64,
        min_health_check_interval: config.min_health_check_interval,
        credential_providers: config.onepassword_connect_url.is_some(),
        managed_proxies: !proxy_upstreams.is_empty(),
    };
    // Enforced as configured; unset, from this host's memory where the VMs run on this
    // host, and not at all on Kubernetes (its scheduler places pods on the cluster's
    // nodes, whose room this process cannot see).
    let capacity_browsers = config.capacity_browsers.unwrap_or_else(browsers_host_memory_fits);
    let host_limits = HostLimits {
        browsers: match (config.capacity_browsers, config.runtime) {
            (None, RuntimeKind::Kubernetes) => u64::MAX,
            _ => capacity_browsers,
        },
        min_available_memory: match config.runtime {
            RuntimeKind::Local => Some(config.min_available_memory_mib << 20),
            RuntimeKind::Kubernetes => None,
        },
        queue_wait: Duration::from_secs(config.admission_wait_seconds),
    };
    let services = Services::new(
        store.clone(),
        blobs.clone(),
        runtime,
        ServiceSettings {
            media: crate::replays::VmMedia::new(&config.ffmpeg, media_sandbox),
            proxy_upstreams: Arc::new(proxy_upstreams),
            egress: Arc::new(egress),
            max_pooled_browsers: config.max_pooled_browsers,
            live_limits: LiveLimits {
                browsers: config.max_live_browsers,
                memory_gib: config.max_live_memory_gib,
            },
            host_limits,
            vault: Vault::open(config.credential_key.as_deref(), &data_dir)
                .context("opening the credential key")?,
            onepassword_connect_url: config.onepassword_connect_url.clone(),
            min_health_check_interval: config.min_health_check_interval,
            app_runner,
            max_running_invocations: config.max_running_invocations as usize,
            replica_id,
            replica_address: internal_url,
            audit_retention: Duration::from_secs(config.audit_log_retention_days * 86_400),
            aws: crate::audit::s3::AwsSettings::from_environment(
                config.audit_export_sts_endpoint.clone(),
                config.audit_export_s3_endpoint.clone(),
                config.audit_export_principal_arn.clone(),
            ),
            audit_export_delay: Duration::from_secs(config.audit_export_delay_seconds),
        },
    );
    let default_sizes = default_standby(capacity_browsers);
    let headful_standby = config.standby_browsers.unwrap_or(default_sizes.headful);
    let standby = Standby::configure(
        store.as_ref(),
        StandbySizes {
            headful: headful_standby,
            // Said for headful browsers only, it holds for both kinds.
            headless: config.standby_headless_browsers.unwrap_or(match config.standby_browsers {
                Some(headful) => headful,
                None => default_sizes.headless,
            }),
        },
    )
    .await
    .context("configuring the standby browsers")?;
    services.sessions.use_standby(standby);
    // Several heartbeats fit in one grace period, so one lost call does not stop an agent.
    services.runtime.isolation().log();
    services.start(agent_idle_grace / 4).await?;

    let replica = services.replica.clone();
    let state = AppState::new(
        services,
        Tokens::load(store.as_ref()).await?,
        HttpSettings {
            public_url: public_url.clone(),
            max_upload_bytes: config.max_upload_bytes,
            max_extension_bytes: config.max_extension_bytes,
            proxy_check_url: config.proxy_check_url.clone(),
            region: config.region.clone(),
            chrome_web_store: Arc::new(ChromeWebStore::new(
                config.chrome_web_store_url.clone(),
                config.max_extension_bytes,
            )?),
            metrics: MetricsSettings {
                token: config.metrics_token.clone(),
                capacity: Capacity { browsers: capacity_browsers },
            },
            offer,
            oidc: oidc_provider(&config)?,
            operator_org: store.ensure_organization(&config.operator_org).await?,
        },
    );
    // Tests and scripts read this line to learn the chosen port.
    println!("listening on {public_url}");
    tracing::info!(%bound, %public_url, "control plane listening");
    // Small answers (a click's 200) must not wait for Nagle's algorithm.
    let listener = listener.tap_io(|stream| {
        let _ = stream.set_nodelay(true);
    });
    if let Some(address) = config.metrics_listen {
        serve_metrics(address, state.clone()).await?;
    }
    let api = api::router(state.clone());
    let router = api.clone().merge(crate::mcp::routes(state, api));
    serve_app_sandboxes(&app_api_socket, router.clone())?;
    // The peer's address is what the audit log records as the caller's.
    let service = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
    axum::serve(listener, service).with_graceful_shutdown(shutdown_signal()).await?;
    // The other replicas adopt this one's browsers at once.
    replica.leave().await;
    // Browsers keep running: a restarted control plane re-adopts them.
    Ok(())
}

/// What the kernel can enforce per VM on this host: nothing without a sandbox.
fn kernel_limits(sandboxed: bool, config: &ServeConfig) -> KernelLimits {
    if !sandboxed {
        return KernelLimits::none("browsers are not sandboxed (--isolation none)");
    }
    let disks = match config.vm_disk_gib {
        0 => Err("turned off (--vm-disk-gib 0)".to_owned()),
        gib => VmDisks::detect(gib << 30),
    };
    KernelLimits { cgroups: VmCgroups::detect(), disks, cpu_weight: config.vm_cpu_weight }
}

/// The loopback port apps reach the API at inside their sandbox: the public URL's, when
/// that is a loopback address (so that the URLs the API hands out work inside too),
/// else the port this server listens on. Ports below 1024 cannot be opened by the
/// sandbox's unprivileged user: 8080 then.
fn app_api_port(public_url: &str, bound_port: u16) -> u16 {
    let port = app_api_port_wanted(public_url, bound_port);
    if port < 1024 { 8080 } else { port }
}

fn app_api_port_wanted(public_url: &str, bound_port: u16) -> u16 {
    let Ok(url) = url::Url::parse(public_url) else {
        return bound_port;
    };
    let loopback = match url.host() {
        Some(url::Host::Ipv4(address)) => address.is_loopback(),
        Some(url::Host::Ipv6(address)) => address.is_loopback(),
        Some(url::Host::Domain(name)) => name == "localhost",
        None => false,
    };
    match url.port_or_known_default() {
        Some(port) if loopback => port,
        _ => bound_port,
    }
}

/// Serves the API on the socket app sandboxes reach it by (their key is checked like
/// any other). The socket is open to the VM user; the directory it is in lets others
/// through without listing it.
fn serve_app_sandboxes(socket: &Path, router: axum::Router) -> anyhow::Result<()> {
    let Some(dir) = socket.parent() else {
        return Ok(());
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let _ = std::fs::remove_file(socket);
    let short = browser_agent_proto::unix_socket::short_path(socket)?;
    let listener = tokio::net::UnixListener::bind(&short.path)
        .with_context(|| format!("binding {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666))?;
    tokio::spawn(async move {
        let _short = short;
        if let Err(error) = axum::serve(listener, router).await {
            tracing::error!(%error, "the apps' API socket stopped");
        }
    });
    Ok(())
}

/// The replica id kept in the data directory, generated on the first start.
fn replica_id(data_dir: &Path) -> anyhow::Result<String> {
    let path = data_dir.join("replica-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_owned()),
        _ => {
            let id = format!("rep_{}", crate::ids::new_secret(12));
            write_private_file(&path, &id)
                .with_context(|| format!("writing {}", path.display()))?;
            Ok(id)
        }
    }
}

/// Serves `GET /metrics` without a token on the operator's address.
async fn serve_metrics(address: std::net::SocketAddr, state: AppState) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .with_context(|| format!("binding the metrics address {address}"))?;
    tracing::info!(address = %listener.local_addr()?, "serving /metrics");
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, api::metrics::operator_router(state)).await {
            tracing::error!(%error, "the metrics listener stopped");
        }
    });
    Ok(())
}

/// The default capacity: one browser per GiB of this host's memory (at least one).
fn browsers_host_memory_fits() -> u64 {
    (crate::metrics::meminfo_kib("MemTotal").unwrap_or(0) >> 20).max(1)
}

/// Standby browsers of each kind kept unless the operator says: a new user's first
/// `POST /browsers` is answered at once, on a host with room for them, and so are ten at
/// once (what the public benchmark asks) on a host of 20 browsers or more. Idle, they
/// are frozen (no CPU) and cost only their memory. Headful: one per 16 browsers of
/// capacity, 1…4. Headless (the kind programs ask for): one per 2, 1…10. None on a host
/// sized for fewer than 4.
fn default_standby(capacity_browsers: u64) -> StandbySizes {
    if capacity_browsers < 4 {
        return StandbySizes::default();
    }
    StandbySizes {
        headful: (capacity_browsers / 16).clamp(1, 4) as u32,
        headless: (capacity_browsers / 2).clamp(1, 10) as u32,
    }
}

/// The Node.js runtime for Playwright executors, if it is installed (checked here, so a
/// missing `npm ci` is reported once at start rather than on every call).
fn node_runtime(configured: Option<std::path::PathBuf>) -> Option<std::path::PathBuf> {
    let dir = configured
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../browser-agent/node"));
    let installed = dir.join("executor.mjs").is_file()
        && dir.join("node_modules/playwright-core/package.json").is_file();
    if !installed {
        tracing::warn!(
            dir = %dir.display(),
            "no Node.js runtime with playwright-core there (run `npm ci` in it, as \
             deploy/install-deps.sh does): /playwright routes answer 503"
        );
        return None;
    }
    dir.canonicalize().ok()
}

/// On the first start with an empty store, creates organization `default` and a key for
/// it, prints the key once and writes it to `<data-dir>/bootstrap-api-key` (mode 0600).
async fn bootstrap_api_key(store: &dyn Store, data_dir: &Path) -> anyhow::Result<()> {
    if store.api_key_count().await? > 0 {
        return Ok(());
    }
    let key = access::keys::create_bootstrap_key(store, BOOTSTRAP_ORGANIZATION, None, None).await?;
    let path = data_dir.join(BOOTSTRAP_KEY_FILE);
    write_private_file(&path, &key)?;
    println!("created organization `{BOOTSTRAP_ORGANIZATION}` with API key: {key}");
    println!("(also written to {})", path.display());
    Ok(())
}

fn write_private_file(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents.as_bytes())?;
    file.write_all(b"\n")
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}

/// The OpenID Connect provider of `--oidc-issuer`, if one is configured.
fn oidc_provider(
    config: &ServeConfig,
) -> anyhow::Result<Option<Arc<crate::people::oidc::OidcProvider>>> {
    let (Some(issuer), Some(client_id), Some(client_secret)) =
        (&config.oidc_issuer, &config.oidc_client_id, &config.oidc_client_secret)
    else {
        return Ok(None);
    };
    let provider = crate::people::oidc::OidcProvider::new(crate::people::oidc::OidcSettings {
        issuer: issuer.clone(),
        client_id: client_id.clone(),
        client_secret: client_secret.clone(),
        organization_claim: config.oidc_organization_claim.clone(),
        role_claim: config.oidc_role_claim.clone(),
    })?;
    Ok(Some(Arc::new(provider)))
}

#[cfg(test)]
mod tests {
    use super::default_standby;

    #[test]
    fn the_default_standby_grows_with_the_host_and_is_off_on_a_small_one() {
        let sizes = |capacity| {
            let sizes = default_standby(capacity);
            (sizes.headful, sizes.headless)
        };
        assert_eq!(sizes(1), (0, 0));
        assert_eq!(sizes(3), (0, 0));
        assert_eq!(sizes(4), (1, 2));
        assert_eq!(sizes(23), (1, 10));
        assert_eq!(sizes(48), (3, 10));
        assert_eq!(sizes(1_000), (4, 10));
    }
}
