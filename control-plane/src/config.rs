//! Command line and environment configuration (`control-plane --help` lists it all).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "control-plane", version, about = "Kernel-compatible browser service")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the API server.
    Serve(Box<ServeConfig>),
    /// Manage API keys.
    #[command(subcommand, name = "api-keys")]
    ApiKeys(ApiKeysCommand),
    /// Write a backup of a running or stopped SQLite deployment (database snapshot,
    /// blobs, credential key) to one tar archive; see docs/operating/backups-and-upgrades.md.
    Backup {
        /// Where to write the archive (it holds secrets: written with mode 0600).
        #[arg(long)]
        output: PathBuf,
        #[command(flatten)]
        storage: StorageConfig,
    },
    /// Restore a backup into a data directory that holds no database yet.
    Restore {
        /// The archive `backup` wrote.
        #[arg(long)]
        input: PathBuf,
        /// The data directory to restore into (created if missing).
        #[arg(long)]
        data_dir: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
pub enum ApiKeysCommand {
    /// Create an API key (and the organization, if new); prints only the key.
    Create {
        /// Organization name.
        #[arg(long)]
        org: String,
        /// Restrict the key: a policy as JSON, `{"statements": [{"action": "browsers:use",
        /// "resource": "projects/*/browsers/*"}]}` (see docs/reference/api-key-actions.md).
        #[arg(long)]
        policy: Option<String>,
        /// Bind the key to this project of the organization (by id or name); a name that
        /// names none makes that project.
        #[arg(long)]
        project: Option<String>,
        #[command(flatten)]
        storage: StorageConfig,
    },
}

#[derive(Args, Debug, Clone)]
pub struct StorageConfig {
    /// Directory for the SQLite database, browser VM roots and the bootstrap key.
    #[arg(long, env = "CONTROL_PLANE_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,
    /// `postgres://user:password@host/db` selects PostgreSQL; default: SQLite file
    /// `<data-dir>/control-plane.db`.
    #[arg(long, env = "CONTROL_PLANE_DATABASE_URL")]
    pub database_url: Option<String>,
}

#[derive(Args, Debug, Clone)]
pub struct ServeConfig {
    /// Address to listen on. Port 0 picks a free port (the chosen URL is printed).
    #[arg(long, env = "CONTROL_PLANE_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub storage: StorageConfig,
    /// Base URL clients use to reach this server, used in returned URLs such as
    /// `cdp_ws_url`. Default: `http://<listen address>`.
    #[arg(long, env = "CONTROL_PLANE_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Base URL the other control-plane replicas reach this one at (requests for the
    /// work one replica runs: managed-auth flows, apps). Default: `http://<listen
    /// address>`, with 127.0.0.1 for an unspecified address: set it when replicas run on
    /// several hosts.
    #[arg(long, env = "CONTROL_PLANE_INTERNAL_URL")]
    pub internal_url: Option<String>,
    /// The browser-agent binary. Default: `browser-agent` next to this binary.
    #[arg(long, env = "CONTROL_PLANE_AGENT_BINARY")]
    pub agent_binary: Option<PathBuf>,
    /// The Node.js runtime Playwright code runs in inside each VM: a directory with
    /// `executor.mjs` and its `node_modules` (`npm ci` in `browser-agent/node`, which
    /// deploy/install-deps.sh runs). Default: `browser-agent/node` of the source tree
    /// this binary was built from. Without `playwright-core` installed there, the
    /// Playwright routes answer 503.
    #[arg(long, env = "CONTROL_PLANE_NODE_RUNTIME")]
    pub node_runtime: Option<PathBuf>,
    /// The Chromium executable every browser VM runs. Default: Debian's binary itself,
    /// not its launcher script (`/usr/bin/chromium`), whose shell spends ~20 ms of every
    /// start; of the flags that script adds, the agent passes the ones pages and the
    /// network notice (`--disable-pings`, `--media-router=0`).
    #[arg(long, env = "CONTROL_PLANE_CHROMIUM", default_value = "/usr/lib/chromium/chromium")]
    pub chromium: String,
    /// The Xvfb executable that gives each headful browser VM its X screen.
    #[arg(long, env = "CONTROL_PLANE_XVFB", default_value = "Xvfb")]
    pub xvfb: String,
    /// The ffmpeg that agents encode recordings with (and that salvages the recordings
    /// of crashed agents).
    #[arg(long, env = "CONTROL_PLANE_FFMPEG", default_value = "ffmpeg")]
    pub ffmpeg: String,
    /// Agents shut themselves down after this many seconds without hearing from a
    /// control plane (so a control plane that never comes back orphans nothing for long).
    #[arg(long, env = "CONTROL_PLANE_AGENT_IDLE_GRACE_SECONDS", default_value_t = 300)]
    pub agent_idle_grace_seconds: u64,
    /// Stop an idle browser's processes (no CPU) after this many seconds without a CDP,
    /// live-view or WebDriver client, an API call, a command or a recording; the next
    /// connection or call continues them before it is served. 0: never.
    #[arg(long, env = "CONTROL_PLANE_FREEZE_IDLE_AFTER_SECONDS", default_value_t = 30)]
    pub freeze_idle_after_seconds: u64,
    /// Largest request body of `fs/write_file` and `fs/upload_zip` (413 beyond).
    #[arg(long, env = "CONTROL_PLANE_MAX_UPLOAD_BYTES", default_value_t = 1024 * 1024 * 1024)]
    pub max_upload_bytes: u64,
    /// upload_zip: most entries an archive may have (400 beyond).
    #[arg(long, env = "CONTROL_PLANE_ZIP_MAX_ENTRIES", default_value_t = 100_000)]
    pub zip_max_entries: u64,
    /// upload_zip: most bytes an archive may expand to (400 beyond).
    #[arg(long, env = "CONTROL_PLANE_ZIP_MAX_EXPANDED_BYTES", default_value_t = 4 * 1024 * 1024 * 1024)]
    pub zip_max_expanded_bytes: u64,
    /// upload_zip: largest expanded/compressed ratio of an entry of 1 MiB or more (400
    /// beyond: a zip bomb).
    #[arg(long, env = "CONTROL_PLANE_ZIP_MAX_RATIO", default_value_t = 200)]
    pub zip_max_ratio: u64,
    /// Largest viewport (`WIDTHxHEIGHT`) a running browser can be resized to with PATCH
    /// `/browsers/{id}` (a browser created larger can always return to its own size).
    /// Each headful browser's X server keeps a framebuffer of this size for its life:
    /// about 8 MiB at 1920x1080.
    #[arg(long, env = "CONTROL_PLANE_MAX_RESIZED_VIEWPORT", default_value = "1920x1080")]
    pub max_resized_viewport: ScreenSize,
    /// JSON file mapping proxy types (datacenter, isp, residential, mobile) and optionally
    /// countries to upstream proxy URLs: `{"datacenter": {"default": "http://u:p@host:port"}}`.
    /// Types it does not name are refused; `custom` proxies always work.
    #[arg(long, env = "CONTROL_PLANE_PROXY_UPSTREAMS")]
    pub proxy_upstreams: Option<PathBuf>,
    /// What `POST /proxies/{id}/check` fetches through the proxy (http://).
    #[arg(long, env = "CONTROL_PLANE_PROXY_CHECK_URL", default_value = "http://example.com/")]
    pub proxy_check_url: String,
    /// The region this server reports in every browser and pool (`region`), and the only
    /// one `POST /browsers` accepts. Set it to where the server runs.
    #[arg(long, env = "CONTROL_PLANE_REGION", default_value = "us-east")]
    pub region: String,
    /// Base URL of the Chrome Web Store's update service, which
    /// `GET /extensions/from_chrome_store` downloads packages from (a mirror, or a store
    /// of your own, works too).
    #[arg(
        long,
        env = "CONTROL_PLANE_CHROME_WEB_STORE_URL",
        default_value = "https://clients2.google.com/"
    )]
    pub chrome_web_store_url: url::Url,
    /// Non-public destinations tenants may nevertheless reach (custom proxies), as CIDR,
    /// IP address or host:port; repeat the flag or separate with commas. By default
    /// loopback, link-local (cloud metadata) and private addresses are refused.
    #[arg(long, env = "CONTROL_PLANE_EGRESS_ALLOW", value_delimiter = ',')]
    pub egress_allow: Vec<crate::egress::Allowance>,
    /// How browsers are kept apart from the host and each other: `sandbox` (each in a
    /// bubblewrap sandbox of its own, as an unprivileged user, with no network but its
    /// egress proxy), or `none`, which is UNSAFE: browsers then run as this service's
    /// user on the host (for development on hosts without user namespaces).
    #[arg(long, env = "CONTROL_PLANE_ISOLATION", value_enum, default_value_t = Isolation::Sandbox)]
    pub isolation: Isolation,
    /// Where browser VMs run: `local` (a sandboxed agent process each on this host) or
    /// `kubernetes` (a pod each, made from --kubernetes-pod-template, through the API
    /// server of the in-cluster service account or of `KUBECONFIG`).
    #[arg(long, env = "CONTROL_PLANE_RUNTIME", value_enum, default_value_t = RuntimeKind::Local)]
    pub runtime: RuntimeKind,
    /// The Pod manifest (YAML) every browser pod is made from (see deploy/kubernetes).
    #[arg(
        long,
        env = "CONTROL_PLANE_KUBERNETES_POD_TEMPLATE",
        required_if_eq("runtime", "kubernetes")
    )]
    pub kubernetes_pod_template: Option<std::path::PathBuf>,
    /// The namespace of browser pods (default: the service account's, or KUBECONFIG's).
    #[arg(long, env = "CONTROL_PLANE_KUBERNETES_NAMESPACE")]
    pub kubernetes_namespace: Option<String>,
    /// The port browser agents listen on in their pods.
    #[arg(long, env = "CONTROL_PLANE_KUBERNETES_AGENT_PORT", default_value_t = 50051)]
    pub kubernetes_agent_port: u16,
    /// How long a browser pod may take to be scheduled and run (image pulls included).
    #[arg(long, env = "CONTROL_PLANE_KUBERNETES_START_TIMEOUT_SECONDS", default_value_t = 120,
        value_parser = clap::value_parser!(u64).range(5..=3600))]
    pub kubernetes_start_timeout_seconds: u64,
    /// The CA certificate (PEM) that signed the browser agents' TLS certificates: agents
    /// in pods are then reached over TLS and must present a certificate for
    /// --agent-tls-server-name (see deploy/kubernetes). Without it, gRPC to agents in pods
    /// is not encrypted (the per-agent secret still authenticates every call).
    #[arg(long, env = "CONTROL_PLANE_AGENT_TLS_CA")]
    pub agent_tls_ca: Option<std::path::PathBuf>,
    /// The name agents' certificates carry (a DNS subject alternative name).
    #[arg(long, env = "CONTROL_PLANE_AGENT_TLS_SERVER_NAME", default_value = "browser-agent")]
    pub agent_tls_server_name: String,
    /// The host user browser sandboxes run as when this service runs as root.
    #[arg(long, env = "CONTROL_PLANE_VM_USER", default_value = "browser-vm")]
    pub vm_user: String,
    /// The host user code a tenant runs in a browser VM (Chromium, processes, Playwright)
    /// runs as, apart from the VM's agent, when this service runs as root.
    #[arg(long, env = "CONTROL_PLANE_VM_TENANT_USER", default_value = "browser-tenant")]
    pub vm_tenant_user: String,
    /// Size of each sandboxed VM's home (GiB): a sparse, loop-mounted file system of its
    /// own, so that a VM cannot fill the host's disk; 0 leaves homes on the host's disk.
    #[arg(long, env = "CONTROL_PLANE_VM_DISK_GIB", default_value_t = 8)]
    pub vm_disk_gib: u64,
    /// Each sandboxed VM's CPU weight (1…10000, cgroup v2's scale; with cgroup v1,
    /// `cpu.shares` of weight × 10.24): equal by default, so one VM's busy processes
    /// cannot starve the others.
    #[arg(long, env = "CONTROL_PLANE_VM_CPU_WEIGHT", default_value_t = 100,
          value_parser = clap::value_parser!(u64).range(1..=10000))]
    pub vm_cpu_weight: u64,
    /// Most live browsers one organization may have outside its pools (browsers it
    /// creates, login flows of its auth connections); 429 with `Retry-After` beyond.
    #[arg(long, env = "CONTROL_PLANE_MAX_LIVE_BROWSERS", default_value_t = 20)]
    pub max_live_browsers: u32,
    /// Most memory (GiB, the sum of their `memory`) the live browsers of one organization
    /// outside its pools may have together; 429 with `Retry-After` beyond.
    #[arg(long, env = "CONTROL_PLANE_MAX_LIVE_MEMORY_GIB", default_value_t = 160)]
    pub max_live_memory_gib: u32,
    /// Headful browsers started ahead of any request (the default configuration), which
    /// `POST /browsers` hands over instead of starting one; each is replaced at once.
    /// Counted in capacity. The same on every replica. Default: sized from the host
    /// (`default_standby`): one on a host with room for at least 4 browsers; `0` turns
    /// it off.
    #[arg(long, env = "CONTROL_PLANE_STANDBY_BROWSERS",
        value_parser = clap::value_parser!(u32).range(0..=100))]
    pub standby_browsers: Option<u32>,
    /// Headless browsers kept the same way, for creates with `headless: true`. Default:
    /// as `--standby-browsers`.
    #[arg(long, env = "CONTROL_PLANE_STANDBY_HEADLESS_BROWSERS",
        value_parser = clap::value_parser!(u32).range(0..=100))]
    pub standby_headless_browsers: Option<u32>,
    /// Most browsers the pools of one organization may hold together (sum of sizes).
    #[arg(long, env = "CONTROL_PLANE_MAX_POOLED_BROWSERS", default_value_t = 50)]
    pub max_pooled_browsers: i64,
    /// Largest extension archive accepted by `POST /extensions` (413 beyond).
    #[arg(long, env = "CONTROL_PLANE_MAX_EXTENSION_BYTES", default_value_t = 100 * 1024 * 1024)]
    pub max_extension_bytes: u64,
    /// Key that encrypts the login values auth connections save (base64 of 32 bytes).
    /// Default: a key generated once into `<data-dir>/credential.key`. Replicas sharing
    /// a database must share it.
    #[arg(long, env = "CONTROL_PLANE_CREDENTIAL_KEY", hide_env_values = true)]
    pub credential_key: Option<String>,
    /// The 1Password Connect server (e.g. http://connect.internal:8080) that credential
    /// providers of type `onepassword` read vaults through, each with its own token.
    /// Without it, such providers cannot be created.
    #[arg(long, env = "CONTROL_PLANE_ONEPASSWORD_CONNECT_URL")]
    pub onepassword_connect_url: Option<String>,
    /// Shortest `health_check_interval` an auth connection may ask for, in seconds.
    #[arg(long, env = "CONTROL_PLANE_MIN_HEALTH_CHECK_INTERVAL", default_value_t = 300,
        value_parser = clap::value_parser!(i64).range(1..=86_400))]
    pub min_health_check_interval: i64,
    /// Most invocations of apps' actions one organization may run at once; past it,
    /// `POST /invocations` answers 429 with Retry-After.
    #[arg(long, env = "CONTROL_PLANE_MAX_RUNNING_INVOCATIONS", default_value_t = 8,
        value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub max_running_invocations: u64,
    /// STS's URL for audit-log export (default: the destination region's,
    /// `https://sts.<region>.amazonaws.com`). This server's AWS identity comes from
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`.
    #[arg(long, env = "CONTROL_PLANE_AUDIT_EXPORT_STS_ENDPOINT")]
    pub audit_export_sts_endpoint: Option<String>,
    /// An S3-compatible endpoint for audit-log export, addressed path-style (default:
    /// AWS S3, virtual-hosted).
    #[arg(long, env = "CONTROL_PLANE_AUDIT_EXPORT_S3_ENDPOINT")]
    pub audit_export_s3_endpoint: Option<String>,
    /// The ARN of this server's AWS identity, which customers' roles trust
    /// (`kernel_role_arn` of export destinations).
    #[arg(long, env = "CONTROL_PLANE_AUDIT_EXPORT_PRINCIPAL_ARN", default_value = "")]
    pub audit_export_principal_arn: String,
    /// How old (seconds) an audit record must be before it is exported: longer than
    /// any call takes, so that a slow call's record lands before delivery passes its time.
    #[arg(long, env = "CONTROL_PLANE_AUDIT_EXPORT_DELAY_SECONDS", default_value_t = 600,
        value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub audit_export_delay_seconds: u64,
    /// Let people sign in with this OpenID Connect provider (its issuer URL; its
    /// discovery document is read on the first sign-in). Sign-in starts at
    /// `/auth/oidc/login`; register `<public url>/auth/oidc/callback` as redirect URI.
    #[arg(long, env = "CONTROL_PLANE_OIDC_ISSUER", requires_all = ["oidc_client_id", "oidc_client_secret"])]
    pub oidc_issuer: Option<String>,
    /// This server's client id at the provider.
    #[arg(long, env = "CONTROL_PLANE_OIDC_CLIENT_ID")]
    pub oidc_client_id: Option<String>,
    /// This server's client secret at the provider (never logged).
    #[arg(long, env = "CONTROL_PLANE_OIDC_CLIENT_SECRET", hide_env_values = true)]
    pub oidc_client_secret: Option<String>,
    /// The ID token claim whose value names the person's organization (created if new).
    #[arg(long, env = "CONTROL_PLANE_OIDC_ORGANIZATION_CLAIM", default_value = "org")]
    pub oidc_organization_claim: String,
    /// The ID token claim whose value is the person's role: `admin`, `member` or
    /// `viewer` (a string, or a list whose first known role counts). Without one, no
    /// sign-in.
    #[arg(long, env = "CONTROL_PLANE_OIDC_ROLE_CLAIM", default_value = "role")]
    pub oidc_role_claim: String,
    /// Days the audit log keeps each record (`GET /audit-logs`).
    #[arg(long, env = "CONTROL_PLANE_AUDIT_LOG_RETENTION_DAYS", default_value_t = 90,
        value_parser = clap::value_parser!(u64).range(1..=3650))]
    pub audit_log_retention_days: u64,
    /// Bearer token that `GET /metrics` (Prometheus) requires on the API's address.
    /// Without it (and without `--metrics-listen`), the API serves no metrics.
    #[arg(long, env = "CONTROL_PLANE_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    /// An operator-only address (e.g. 127.0.0.1:9464, or a cluster-internal one) that
    /// serves `GET /metrics` without a token, and nothing else.
    #[arg(long, env = "CONTROL_PLANE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// The organization whose admins (people with the admin role, keys without a
    /// restricting policy) operate this host: the console's host page (every
    /// organization's live VMs, replicas, recent errors) is theirs only.
    #[arg(long, env = "CONTROL_PLANE_OPERATOR_ORG", default_value = "default")]
    pub operator_org: String,
    /// How many browser VMs the deployment holds at once (every organization's, pools'
    /// and standby browsers together, across replicas), reported as
    /// `browser_service_capacity_browsers`. A create beyond it waits up to
    /// `--admission-wait-seconds` (an idle standby browser makes room for it), then gets
    /// 429 with `Retry-After`; pools fill below it, fairly between organizations.
    /// Default: one per GiB of this host's memory (on Kubernetes: reported so, not
    /// enforced).
    #[arg(long, env = "CONTROL_PLANE_CAPACITY_BROWSERS",
        value_parser = clap::value_parser!(u64).range(1..))]
    pub capacity_browsers: Option<u64>,
    /// How long a create waits for room on a full host before it gets 429.
    #[arg(long, env = "CONTROL_PLANE_ADMISSION_WAIT_SECONDS", default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(0..=300))]
    pub admission_wait_seconds: u64,
    /// Memory (MiB, the kernel's `MemAvailable`) this host must have free to start a
    /// browser VM: below it, creates wait and are refused as on a full host, and pools
    /// do not fill. Local runtime only.
    #[arg(
        long,
        env = "CONTROL_PLANE_MIN_AVAILABLE_MEMORY_MIB",
        default_value_t = 512,
        value_parser = clap::value_parser!(u64).range(0..=1 << 30)
    )]
    pub min_available_memory_mib: u64,
    /// This replica's name among the control planes sharing one PostgreSQL database:
    /// unique among those running, and best the same across restarts (a pod's name, a
    /// host name), so that a restarted replica takes its browsers back at once; others
    /// adopt them once it has been gone for a few seconds. Default: a name generated once
    /// into `<data-dir>/replica-id`.
    #[arg(long, env = "CONTROL_PLANE_REPLICA_ID")]
    pub replica_id: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeKind {
    Local,
    Kubernetes,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Isolation {
    Sandbox,
    /// Unsafe: for development only.
    None,
}

/// A screen size written `WIDTHxHEIGHT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScreenSize {
    pub width: u32,
    pub height: u32,
}

impl std::str::FromStr for ScreenSize {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let side = |side: Option<&str>| {
            side.and_then(|side| side.trim().parse::<u32>().ok())
                .filter(|side| (1..=7680).contains(side))
        };
        let mut sides = text.split(['x', 'X']);
        match (side(sides.next()), side(sides.next()), sides.next()) {
            (Some(width), Some(height), None) => Ok(Self { width, height }),
            _ => Err(format!("{text:?} is not WIDTHxHEIGHT with sides between 1 and 7680")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ScreenSize;

    #[test]
    fn screen_sizes_read_as_width_x_height() {
        assert_eq!("1920x1080".parse(), Ok(ScreenSize { width: 1920, height: 1080 }));
        for wrong in ["1920", "1920x", "x1080", "0x10", "10x10x10", "8000x100", "axb"] {
            assert!(wrong.parse::<ScreenSize>().is_err(), "{wrong}");
        }
    }
}
