//! `browser-agent app-sandbox`: the first program of an app sandbox (a deployment's build
//! or an invocation's action), started by the control plane inside bubblewrap with no
//! network but its own loopback. It opens the sandbox's two ways out on that loopback:
//! - an HTTP proxy port that passes every connection to the egress socket, where the
//!   control plane's egress proxy judges the destination (package registries for a
//!   build, whatever the organization's policy allows for an action);
//! - the API's port (the port of the control plane's public URL, so that the URLs it
//!   hands out, such as `cdp_ws_url`, work inside too), passed to the API socket.
//!
//! It then runs the command with exactly the environment of its `--env-file` (written by
//! the control plane into the run directory: bubblewrap itself, on the host, never gets
//! the app's variables) plus the proxy, within the run's limits (tasks, memory), and exits
//! with its status.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(about = "run a command in an app sandbox with its ways out opened")]
struct AppSandboxArgs {
    /// The control plane's egress proxy.
    #[arg(long)]
    egress_socket: PathBuf,
    /// The control plane's API.
    #[arg(long)]
    api_socket: PathBuf,
    /// The loopback port the API is reached on inside.
    #[arg(long)]
    api_port: u16,
    /// The command's whole environment: a JSON array of [name, value] pairs.
    #[arg(long)]
    env_file: PathBuf,
    /// End the run when its processes use more memory than this (proportional set size,
    /// plus what its memory-backed directories hold); 0 for no limit.
    #[arg(long, default_value_t = 0)]
    memory_limit_bytes: u64,
    /// When the memory limit ends the run, why is written here.
    #[arg(long)]
    exit_reason_file: Option<PathBuf>,
    /// Most tasks (processes and threads) the run may have; the kernel counts them per
    /// user namespace, so this run's alone.
    #[arg(long, default_value_t = 0)]
    max_tasks: u64,
    /// The program and its arguments.
    #[arg(required = true, last = true)]
    command: Vec<String>,
}

/// Runs `browser-agent app-sandbox <args>`; returns the exit code to leave with.
pub fn main(args: impl Iterator<Item = String>) -> anyhow::Result<i32> {
    let args = AppSandboxArgs::parse_from(args);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: AppSandboxArgs) -> anyhow::Result<i32> {
    let environment: Vec<(String, String)> = serde_json::from_slice(
        &std::fs::read(&args.env_file).context("reading the environment file")?,
    )
    .context("the environment file is not a JSON array of pairs")?;
    if args.max_tasks > 0 {
        nix::sys::resource::setrlimit(
            nix::sys::resource::Resource::RLIMIT_NPROC,
            args.max_tasks,
            args.max_tasks,
        )
        .context("limiting tasks")?;
    }
    let shutdown = CancellationToken::new();
    let proxy = crate::proxy::start(args.egress_socket, shutdown.clone())
        .await
        .context("opening the proxy port")?;
    let api = SocketAddr::from(([127, 0, 0, 1], args.api_port));
    crate::proxy::forward_loopback(api, args.api_socket, shutdown.clone())
        .await
        .with_context(|| format!("opening the API port {api}"))?;
    let proxy_url = format!("http://{proxy}");
    let (program, program_args) = args.command.split_first().context("no command to run")?;
    let mut command = tokio::process::Command::new(program);
    command.args(program_args).env_clear().envs(environment).kill_on_drop(true);
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        command.env(name, &proxy_url);
    }
    // npm reads its own settings before the variables above. What goes direct (the
    // sandbox's own loopback, where the API is) is the caller's `NO_PROXY`.
    command.env("npm_config_proxy", &proxy_url).env("npm_config_https_proxy", &proxy_url);
    let mut child = command.spawn().with_context(|| format!("starting {program}"))?;
    if args.memory_limit_bytes > 0 {
        tokio::spawn(crate::memory::enforce_limit(
            args.memory_limit_bytes,
            crate::memory::VmProcesses::PidNamespace,
            args.exit_reason_file.clone(),
            shutdown.clone(),
        ));
    }
    let status = tokio::select! {
        status = child.wait() => status.with_context(|| format!("waiting for {program}"))?,
        // Past its memory limit: this process ends, and with it (the PID namespace's
        // first program) everything the run started.
        () = shutdown.cancelled() => return Ok(137),
    };
    shutdown.cancel();
    Ok(status.code().unwrap_or_else(|| {
        128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
    }))
}
