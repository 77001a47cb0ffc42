//! browser-agent: one per browser VM. Starts and supervises Xvfb and Chromium, serves the
//! `browser_agent.v1` gRPC contract to its control plane, and exits (reaping everything it
//! started) on Shutdown, on SIGTERM, or when no control plane has called for the grace period.

mod actions;
mod app_sandbox;
mod auth;
mod capture;
mod cdp;
mod cdp_client;
mod chromium;
mod curl;
mod damage;
mod desktop;
mod devtools_handoff;
mod dir_watch;
mod display;
mod extensions;
mod freezer;
mod fs;
mod identity;
mod input;
mod keyboard;
mod live;
mod logs;
mod memory;
mod motion;
mod playwright;
mod process;
mod processes;
mod profile;
mod proxy;
mod recording;
mod screen;
mod service;
mod service_logs;
mod sound;
mod tabs;
mod telemetry;
mod upload;
mod webdriver;
mod webmcp;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use browser_agent_proto::v1::browser_agent_server::BrowserAgentServer;
use clap::Parser;
use futures::StreamExt;
use tokio::sync::watch;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_util::sync::CancellationToken;

use crate::chromium::{BrowserState, LaunchConfig};

#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Directory that is this browser VM's filesystem root; Chromium's profile lives inside.
    #[arg(long, env = "BROWSER_AGENT_VM_ROOT")]
    vm_root: PathBuf,
    /// Address of the gRPC server. Port 0 picks a free port (see --addr-file).
    #[arg(long, env = "BROWSER_AGENT_LISTEN", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Listen on this Unix socket instead of TCP (mode 0600: only the agent's user and
    /// root can connect). The control plane of a local VM uses it; nothing on the
    /// loopback network reaches the agent then.
    #[arg(long, env = "BROWSER_AGENT_LISTEN_SOCKET", conflicts_with = "listen")]
    listen_socket: Option<PathBuf>,
    /// Serve gRPC on this inherited, listening Unix socket: a local VM's control plane
    /// binds it in a directory of its own, outside the VM, before the sandbox starts, so
    /// nothing inside can redirect what the control plane connects to.
    #[arg(long, conflicts_with_all = ["listen", "listen_socket"])]
    listen_fd: Option<i32>,
    /// Serve DevTools hand-offs (`devtools_handoff`) on this inherited, listening Unix
    /// socket (as --listen-fd); otherwise beside --listen-socket, if given.
    #[arg(long)]
    devtools_handoff_fd: Option<i32>,
    /// Serve gRPC over TLS with this certificate chain (PEM), for a control plane that
    /// reaches the agent across a network (--listen); with --tls-key.
    #[arg(
        long,
        env = "BROWSER_AGENT_TLS_CERT",
        requires = "tls_key",
        conflicts_with = "listen_socket"
    )]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "BROWSER_AGENT_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Once listening, the bound address (`host:port`, or `unix:<path>` for a socket) is
    /// written to this file (atomically).
    #[arg(long, env = "BROWSER_AGENT_ADDR_FILE")]
    addr_file: Option<PathBuf>,
    /// The credential every gRPC call must present. Read from the environment so it does
    /// not show in the process list.
    #[arg(
        long,
        env = "BROWSER_AGENT_SECRET",
        hide_env_values = true,
        required_unless_present_any = ["secret_sha256", "secret_fd"],
        conflicts_with_all = ["secret_sha256", "secret_fd"]
    )]
    secret: Option<String>,
    /// Read the secret from this inherited descriptor (a pipe) instead: nothing of it
    /// stays in the agent's environment, which its children would inherit.
    #[arg(long, conflicts_with = "secret_sha256")]
    secret_fd: Option<i32>,
    /// Instead of the secret, its SHA-256 (hex): what a pod spec, readable by whoever may
    /// read pods, can carry without giving the browser away.
    #[arg(long, env = "BROWSER_AGENT_SECRET_SHA256")]
    secret_sha256: Option<String>,
    #[arg(long, default_value_t = 1920)]
    width: u32,
    #[arg(long, default_value_t = 1080)]
    height: u32,
    /// The largest screen the browser can be resized to while it runs: Xvfb keeps a
    /// framebuffer of max(width, this) x max(height, --max-height) for its whole life.
    #[arg(long, default_value_t = 0)]
    max_width: u32,
    #[arg(long, default_value_t = 0)]
    max_height: u32,
    /// Run Chromium with --headless=new and no X display.
    #[arg(long)]
    headless: bool,
    #[arg(long)]
    kiosk: bool,
    #[arg(long)]
    stealth: bool,
    /// IANA timezone the browser's pages see (the VM's default, UTC, otherwise).
    #[arg(long)]
    timezone: Option<String>,
    /// BCP 47 locale of the browser's UI, `navigator.language` and `Intl`.
    #[arg(long)]
    locale: Option<String>,
    /// Shut down after this many seconds without a call from a control plane.
    #[arg(long, env = "BROWSER_AGENT_IDLE_GRACE_SECONDS", default_value_t = 300)]
    idle_grace_seconds: u64,
    /// Stop the VM's processes (all but the agent) after this many seconds without a
    /// call, a command or a recording; the next call continues them first (0: never).
    #[arg(long, default_value_t = 0)]
    freeze_idle_after_seconds: u64,
    /// The Chromium binary (Debian's, not its launcher script: see the control plane's
    /// `--chromium`).
    #[arg(long, env = "BROWSER_AGENT_CHROMIUM", default_value = "/usr/lib/chromium/chromium")]
    chromium_path: String,
    #[arg(long, env = "BROWSER_AGENT_XVFB", default_value = "Xvfb")]
    xvfb_path: String,
    /// The X display to start Xvfb on, for a VM whose `/tmp` and network namespace are
    /// its own (a sandbox's): Chromium then starts while Xvfb is still getting ready.
    /// Without it, Xvfb picks a free display, and Chromium starts once Xvfb serves.
    #[arg(long)]
    display_number: Option<u32>,
    /// The PulseAudio daemon that gives a headful VM its own sound (a null sink).
    #[arg(long, env = "BROWSER_AGENT_PULSEAUDIO", default_value = "pulseaudio")]
    pulseaudio_path: String,
    /// Where uploads wait before extraction; outside the VM root. Default: the system's
    /// temporary directory.
    #[arg(long, env = "BROWSER_AGENT_SCRATCH_DIR")]
    scratch_dir: Option<PathBuf>,
    /// Where screen recordings are written; outside the VM root. Default: `recordings`
    /// in the scratch directory.
    #[arg(long, env = "BROWSER_AGENT_RECORDINGS_DIR")]
    recordings_dir: Option<PathBuf>,
    /// The ffmpeg that encodes recordings.
    #[arg(long, env = "BROWSER_AGENT_FFMPEG", default_value = "ffmpeg")]
    ffmpeg_path: String,
    /// The VM's way out: a Unix socket where the control plane's egress proxy listens.
    /// Chromium's traffic goes there through a forwarder on the VM's loopback; without
    /// it Chromium connects directly (development only: nothing judges the destinations).
    #[arg(long, env = "BROWSER_AGENT_EGRESS_SOCKET")]
    egress_socket: Option<PathBuf>,
    /// End the VM when its processes together use more memory (proportional set size)
    /// than this many bytes; 0 for no limit.
    #[arg(long, default_value_t = 0)]
    memory_limit_bytes: u64,
    /// Every process this agent sees belongs to its VM (it runs in the VM's own PID
    /// namespace), which the memory limit then counts whole.
    #[arg(long)]
    vm_pid_namespace: bool,
    /// Most tasks (processes and threads) the VM may run, with --vm-pid-namespace: the
    /// kernel counts them per user namespace, so the limit is this VM's alone.
    #[arg(long, default_value_t = 0)]
    max_tasks: u64,
    /// Tenant code runs apart from the agent, as this uid (the control plane mapped it
    /// into the VM's user namespace beside the agent's uid 0); see `identity`.
    #[arg(long)]
    tenant_uid: Option<u32>,
    /// When the agent ends the VM on its own (memory limit), it writes why to this file.
    #[arg(long)]
    exit_reason_file: Option<PathBuf>,
    /// An extension to load from the start, as NAME=PATH of its ZIP archive (repeatable).
    #[arg(long = "extension", value_name = "NAME=ZIP")]
    extensions: Vec<String>,
    /// A stored profile (ZIP of Chromium user data) that Chromium starts from, and starts
    /// from again after each reset.
    #[arg(long)]
    profile_archive: Option<PathBuf>,
    /// The Node.js runtime Playwright code runs in (`browser-agent/node` with its
    /// `node_modules`); without it the Playwright RPCs are UNAVAILABLE.
    #[arg(long)]
    node_runtime: Option<PathBuf>,
    /// upload_zip: most entries an archive may have.
    #[arg(long, default_value_t = 100_000)]
    zip_max_entries: u64,
    /// upload_zip: most bytes an archive may expand to.
    #[arg(long, default_value_t = 4 * 1024 * 1024 * 1024)]
    zip_max_expanded_bytes: u64,
    /// upload_zip: largest expanded/compressed ratio of an entry of 1 MiB or more.
    #[arg(long, default_value_t = 200)]
    zip_max_ratio: u64,
}

/// Screens larger than this are refused: Xvfb would allocate the framebuffer up front.
const MAX_SCREEN_SIDE: u32 = 7680;

fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("app-sandbox") {
        let code = app_sandbox::main(std::env::args().skip(1))?;
        std::process::exit(code);
    }
    let mut args = Args::parse();
    if let Some(fd) = args.secret_fd.take() {
        args.secret = Some(read_secret(fd)?);
    }
    identity::become_agent(args.tenant_uid, args.max_tasks)
        .context("taking the agent's identity")?;
    let scratch_dir = args.scratch_dir.clone().unwrap_or_else(std::env::temp_dir);
    service_logs::init(scratch_dir.join("service-logs"))
        .with_context(|| format!("creating {}", scratch_dir.display()))?;
    {
        use tracing_subscriber::fmt::writer::MakeWriterExt;
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info".into()),
            )
            // To the agent's log file on the host, and to its own log in the VM.
            .with_writer(std::io::stderr.and(|| service_logs::Writer("agent")))
            // Colours only on a terminal: agents log to files.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
    // The VM's own default, whatever its starter's (the control plane keeps its files
    // private): files the fs API and the browser create are 0644, directories 0755.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    anyhow::ensure!(
        (1..=MAX_SCREEN_SIDE).contains(&args.width) && (1..=MAX_SCREEN_SIDE).contains(&args.height),
        "screen size must be between 1 and {MAX_SCREEN_SIDE} on each side"
    );
    let screen_limit = (
        args.width.max(args.max_width.min(MAX_SCREEN_SIDE)),
        args.height.max(args.max_height.min(MAX_SCREEN_SIDE)),
    );
    std::fs::create_dir_all(&args.vm_root)
        .with_context(|| format!("creating {}", args.vm_root.display()))?;
    // Before anything is started: everything started inherits it. Outside a user
    // namespace of its own the count would be the host user's, so only in a sandbox.
    if args.vm_pid_namespace && args.max_tasks > 0 {
        nix::sys::resource::setrlimit(
            nix::sys::resource::Resource::RLIMIT_NPROC,
            args.max_tasks,
            args.max_tasks,
        )
        .context("limiting the VM's tasks")?;
    }

    // The display starts before any other thread exists: the clipboard (arboard) finds it
    // only through $DISPLAY, and the environment can be changed safely only while
    // single-threaded. The sound server starts alongside it. Both get ready in the
    // background (`settle`) while Chromium starts: on this host's two cores, Xvfb's
    // ~25 ms of getting ready (its keymap compiled) overlap Chromium's first ~90 ms, in
    // which it does not talk to X yet.
    // Without sound the browser works, silently: recordings with audio are refused.
    let sound = (!args.headless)
        .then(|| sound::SoundServer::spawn(&args.pulseaudio_path, &scratch_dir.join("pulse")))
        .and_then(|spawned| {
            spawned
                .inspect_err(
                    |error| tracing::warn!(%error, "no sound server: the browser has no sound"),
                )
                .ok()
        });
    let display = if args.headless {
        None
    } else {
        let display = display::Display::start(
            &args.xvfb_path,
            screen_limit.0,
            screen_limit.1,
            args.display_number,
        )?;
        // SAFETY: no other thread exists yet (the async runtime is built below).
        unsafe {
            std::env::set_var("DISPLAY", &display.name);
        }
        Some(display)
    };
    if let Some(sound) = &sound {
        // SAFETY: still single-threaded. Chromium and ffmpeg find the VM's sound here
        // (a client before the daemon is ready finds no one, as without sound).
        unsafe { std::env::set_var("PULSE_SERVER", sound.address()) };
    }
    // The size asked for, which `settle` gives the screen, within the larger framebuffer.
    let size = (args.width, args.height);
    let screen = match &display {
        Some(display) => screen::Screen::new(Some(display.name.clone()), size, screen_limit),
        None => screen::Screen::new(None, size, size),
    };
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(serve(
        args,
        display,
        sound,
        std::sync::Arc::new(screen),
    ))
}

/// Waits until the display and the sound server serve, then binds the typing keys and
/// sizes the screen. Blocking (X round trips). The keys are bound before Chromium reads
/// the keyboard map (it connects ~90 ms after its start, this takes ~30), and a client
/// connected before gets the change as a `MappingNotify` anyway (`keyboard`).
fn settle(
    display: Option<display::Starting>, sound: Option<sound::SoundServer>, screen: &screen::Screen,
) -> anyhow::Result<(Option<display::Display>, keyboard::Layout, Option<sound::SoundServer>)> {
    let sound = sound.and_then(|sound| {
        sound
            .ready()
            .inspect_err(
                |error| tracing::warn!(%error, "no sound server: the browser has no sound"),
            )
            .ok()
    });
    let Some(display) = display else {
        return Ok((None, keyboard::Layout::default(), sound));
    };
    let display = display.ready()?;
    let layout = keyboard::prepare(&display.name).context("preparing the keyboard map")?;
    let (width, height) = screen.size();
    if (width, height) != screen.limit() {
        screen.resize(width, height).context("sizing the screen")?;
    }
    Ok((Some(display), layout, sound))
}

/// The secret, from an inherited descriptor that is closed once read.
fn read_secret(fd: i32) -> anyhow::Result<String> {
    use std::io::Read;
    // SAFETY: the starter handed this descriptor to us for this use alone.
    let pipe = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let mut secret = String::new();
    pipe.take(4096).read_to_string(&mut secret).context("reading the secret from --secret-fd")?;
    let secret = secret.trim().to_owned();
    anyhow::ensure!(!secret.is_empty(), "--secret-fd gave no secret");
    Ok(secret)
}

/// An inherited, listening Unix socket.
fn inherited_listener(fd: i32) -> anyhow::Result<tokio::net::UnixListener> {
    // SAFETY: the starter handed this descriptor to us for this use alone.
    let listener =
        unsafe { <std::os::unix::net::UnixListener as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    listener.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(listener)
        .with_context(|| format!("descriptor {fd} is not a listening Unix socket"))
}

/// Where the gRPC server listens.
enum Listener {
    Tcp(tokio::net::TcpListener),
    /// With the socket's path, when this agent bound it.
    Unix(tokio::net::UnixListener, Option<PathBuf>),
}

impl Listener {
    async fn bind(args: &Args) -> anyhow::Result<Self> {
        if let Some(fd) = args.listen_fd {
            return Ok(Self::Unix(inherited_listener(fd)?, None));
        }
        let Some(path) = &args.listen_socket else {
            let listener = tokio::net::TcpListener::bind(args.listen)
                .await
                .with_context(|| format!("binding {}", args.listen))?;
            return Ok(Self::Tcp(listener));
        };
        // A socket left by a previous agent of this VM would refuse the bind.
        match std::fs::remove_file(path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(error).with_context(|| format!("removing {}", path.display()));
            }
            _ => {}
        }
        let short = browser_agent_proto::unix_socket::short_path(path)?;
        let listener = tokio::net::UnixListener::bind(&short.path)
            .with_context(|| format!("binding {}", path.display()))?;
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        Ok(Self::Unix(listener, Some(path.clone())))
    }

    /// What the control plane connects to.
    fn address(&self) -> String {
        match self {
            Self::Tcp(listener) => {
                listener.local_addr().map(|address| address.to_string()).unwrap_or_default()
            }
            Self::Unix(_, Some(path)) => format!("unix:{}", path.display()),
            Self::Unix(_, None) => "unix:(inherited socket)".to_owned(),
        }
    }
}

async fn serve(
    args: Args, display: Option<display::Starting>, sound: Option<sound::SoundServer>,
    screen: std::sync::Arc<screen::Screen>,
) -> anyhow::Result<()> {
    let display_name = display.as_ref().map(|d| d.name.clone());
    let settling = {
        let screen = screen.clone();
        tokio::task::spawn_blocking(move || settle(display, sound, &screen))
    };
    let shutdown = CancellationToken::new();
    let authenticator = match (&args.secret, &args.secret_sha256) {
        (Some(secret), _) => auth::Authenticator::new(secret),
        (None, Some(digest)) => auth::Authenticator::from_sha256(digest)
            .context("--secret-sha256 must be 64 hexadecimal digits")?,
        (None, None) => anyhow::bail!("give --secret or --secret-sha256"),
    };
    let (state_tx, state_rx) = watch::channel(BrowserState::initial());

    // Listen first, so the control plane can connect while the browser starts.
    let listener = Listener::bind(&args).await?;
    if let Some(addr_file) = &args.addr_file {
        let partial = addr_file.with_extension("partial");
        std::fs::write(&partial, listener.address())?;
        std::fs::rename(&partial, addr_file)?;
    }
    tracing::info!(address = listener.address(), "browser agent listening");

    // The filesystem API may not change the extensions; only the extensions API does.
    let vm_fs = std::sync::Arc::new(fs::VmFs::open(&args.vm_root)?);
    let api_fs = std::sync::Arc::new(
        fs::VmFs::open_protecting(&args.vm_root, extensions::EXTENSIONS_DIR)
            .map_err(|error| anyhow::anyhow!("{error}"))?,
    );
    let zip_limits = fs::ZipLimits {
        max_entries: args.zip_max_entries,
        max_expanded_bytes: args.zip_max_expanded_bytes,
        max_ratio: args.zip_max_ratio.max(1),
    };
    let (extensions, extension_set) =
        extensions::Extensions::new(vm_fs.clone(), &args.vm_root, zip_limits);
    let extensions = std::sync::Arc::new(extensions);
    // Extensions asked for at creation are in place before Chromium's first start.
    if !args.extensions.is_empty() {
        let (extensions, requested) = (extensions.clone(), args.extensions.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let mut batch = Vec::new();
            for spec in &requested {
                let (name, path) = spec
                    .split_once('=')
                    .with_context(|| format!("--extension must be NAME=ZIP, got {spec:?}"))?;
                let archive =
                    std::fs::File::open(path).with_context(|| format!("opening {path}"))?;
                batch.push((name.to_owned(), archive));
            }
            extensions.install(batch).map_err(|error| anyhow::anyhow!("{error}"))?;
            Ok(())
        })
        .await??;
    }
    let proxy = match &args.egress_socket {
        Some(socket) => {
            let local = proxy::start(socket.clone(), shutdown.clone())
                .await
                .context("starting the egress forwarder")?;
            Some(format!("http://{local}"))
        }
        None => None,
    };
    let processes = std::sync::Arc::new(processes::Processes::new(
        args.vm_root.clone(),
        display_name.clone(),
        proxy.clone(),
    ));
    let node_runtime = playwright::NodeRuntime::new(
        args.node_runtime.clone(),
        processes.clone(),
        state_rx.clone(),
    );
    let executors = std::sync::Arc::new(playwright::Executors::new(node_runtime.clone()));
    let repl = std::sync::Arc::new(playwright::Repl::new(node_runtime));
    let webdriver = std::sync::Arc::new(webdriver::WebDriver::new(processes.clone()));
    let (resets, resets_rx) = watch::channel(0u64);
    let (stop_chromium, stop_chromium_rx) = watch::channel(false);
    let (relaunches, relaunches_rx) = watch::channel(chromium::Relaunch {
        generation: 0,
        timezone: args.timezone.clone(),
        locale: args.locale.clone(),
        profile_seed: args.profile_archive.clone(),
    });
    let supervisor = {
        let config = LaunchConfig {
            proxy,
            chromium_path: args.chromium_path.clone(),
            vm_root: args.vm_root.clone(),
            user_data_dir: args.vm_root.join(chromium::USER_DATA_DIR),
            display: display_name.clone(),
            screen: screen.clone(),
            kiosk: args.kiosk,
            stealth: args.stealth,
            timezone: args.timezone.clone(),
            locale: args.locale.clone(),
            profile_seed: args.profile_archive.clone(),
        };
        tokio::spawn(chromium::supervise(
            config,
            extension_set,
            resets_rx,
            relaunches_rx,
            stop_chromium_rx,
            state_tx,
            shutdown.clone(),
        ))
    };

    tokio::spawn(watchdog(
        authenticator.clone(),
        Duration::from_secs(args.idle_grace_seconds),
        shutdown.clone(),
    ));
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let vm_processes = if args.vm_pid_namespace {
        memory::VmProcesses::PidNamespace
    } else {
        memory::VmProcesses::Descendants
    };
    if args.memory_limit_bytes > 0 {
        tokio::spawn(memory::enforce_limit(
            args.memory_limit_bytes,
            vm_processes,
            args.exit_reason_file.clone(),
            shutdown.clone(),
        ));
    }

    let scratch_dir = args.scratch_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&scratch_dir)
        .with_context(|| format!("creating {}", scratch_dir.display()))?;
    // Chromium is starting; what uses the display and the sound waits until they serve.
    let (display, keyboard_layout, sound) = settling.await??;
    let input = match &display_name {
        Some(name) => Some(input::Input::start(name, keyboard_layout, screen.clone())?),
        None => None,
    };
    let recordings = std::sync::Arc::new(recording::Recordings::new(
        display_name.clone(),
        screen.clone(),
        args.recordings_dir.clone().unwrap_or_else(|| scratch_dir.join("recordings")),
        args.ffmpeg_path.clone(),
        sound.is_some(),
    ));
    let freezer = {
        let (processes, recordings) = (processes.clone(), recordings.clone());
        freezer::Freezer::new(
            (args.freeze_idle_after_seconds > 0)
                .then(|| Duration::from_secs(args.freeze_idle_after_seconds)),
            Box::new(move || freezer::vm_processes(vm_processes)),
            Box::new(move || {
                if processes.running() > 0 {
                    Some("a command runs")
                } else if recordings.any_running() {
                    Some("a recording runs")
                } else {
                    None
                }
            }),
        )
    };
    tokio::spawn(freezer.clone().run(shutdown.clone()));
    let telemetry = std::sync::Arc::new(telemetry::Telemetry::default());
    tokio::spawn(telemetry::monitor::run(telemetry.clone(), state_rx.clone(), shutdown.clone()));
    tokio::spawn(telemetry::watch_crashes(telemetry.clone(), state_rx.clone()));
    let service = service::AgentService {
        telemetry,
        webmcp_numbering: webmcp::Numbering::default(),
        webmcp_custom: webmcp::CustomTools::default(),
        desktop: input.as_ref().map(|_| std::sync::Arc::new(desktop::Desktop::default())),
        recordings,
        resets,
        relaunches,
        processes,
        executors: executors.clone(),
        repl: repl.clone(),
        webdriver: webdriver.clone(),
        stop_chromium,
        live: display_name.clone().filter(|_| input.is_some()).map(|display| {
            let audio =
                sound.is_some().then(|| live::audio::LiveAudio::new(args.ffmpeg_path.clone()));
            std::sync::Arc::new(live::LiveView::new(display, screen.clone(), audio))
        }),
        input,
        fs: api_fs,
        zip_limits,
        extensions,
        scratch_dir,
        display: display_name,
        screen,
        vm_root: args.vm_root.clone(),
        browser: state_rx.clone(),
        shutdown: shutdown.clone(),
    };
    let handoff_state = state_rx;
    let server = BrowserAgentServer::new(service)
        .max_decoding_message_size(cdp::MAX_CDP_MESSAGE_BYTES)
        .max_encoding_message_size(cdp::MAX_CDP_MESSAGE_BYTES);
    let check = authenticator.clone();
    let mut builder = tonic::transport::Server::builder();
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        let read = |path: &PathBuf| {
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))
        };
        let identity = tonic::transport::Identity::from_pem(read(cert)?, read(key)?);
        builder = builder
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .context("the TLS certificate or key is unusable")?;
    }
    let served = builder.layer(freezer::FreezerLayer(freezer.clone())).add_service(
        tonic::service::interceptor::InterceptedService::new(server, move |request| {
            check.check(request)
        }),
    );
    let served = match listener {
        Listener::Tcp(listener) => {
            served
                .serve_with_incoming_shutdown(
                    // Small gRPC messages must not wait for Nagle's algorithm.
                    TcpListenerStream::new(listener).map(|stream| {
                        stream.inspect(|stream| {
                            let _ = stream.set_nodelay(true);
                        })
                    }),
                    shutdown.clone().cancelled_owned(),
                )
                .await
        }
        Listener::Unix(listener, path) => {
            let handoff = match (args.devtools_handoff_fd, path) {
                (Some(fd), _) => Some(inherited_listener(fd)?),
                // Beside the agent's socket, where only the control plane looks.
                (None, Some(path)) => {
                    let handoff = path
                        .with_file_name(browser_agent_proto::unix_socket::DEVTOOLS_HANDOFF_FILE);
                    Some(
                        devtools_handoff::bind(&handoff)
                            .with_context(|| format!("binding {}", handoff.display()))?,
                    )
                }
                (None, None) => None,
            };
            if let Some(handoff) = handoff {
                devtools_handoff::serve(
                    handoff,
                    authenticator.clone(),
                    freezer.clone(),
                    handoff_state,
                    shutdown.clone(),
                );
            }
            served
                .serve_with_incoming_shutdown(
                    UnixListenerStream::new(listener),
                    shutdown.clone().cancelled_owned(),
                )
                .await
        }
    };

    // Whatever ended the server, nothing we started may outlive us.
    shutdown.cancel();
    executors.reset().await;
    repl.reset().await;
    webdriver.stop().await;
    let _ = supervisor.await;
    if let Some(display) = display {
        display.stop().await;
    }
    if let Some(sound) = sound {
        sound.stop().await;
    }
    tracing::info!("browser agent stopped");
    served.context("gRPC server failed")
}

async fn watchdog(auth: auth::Authenticator, grace: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if auth.silent_for() > grace {
            tracing::warn!(
                ?grace,
                "no control plane called within the grace period; shutting down"
            );
            shutdown.cancel();
            return;
        }
    }
}

async fn cancel_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
    shutdown.cancel();
}
