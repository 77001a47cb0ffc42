//! The sandbox of a local browser VM: bubblewrap (Debian `bubblewrap`) starts the agent,
//! and with it Xvfb, Chromium and the encoder, in new user, mount, PID, IPC, UTS, cgroup
//! and network namespaces, as the unprivileged VM user (host user `browser-vm` when the
//! control plane runs as root; otherwise the control plane's own user). When it runs as
//! root, the VM has two users: the agent is its uid 0 (host `browser-vm`, a few
//! capabilities) and tenant code its uid 1000 (host `browser-tenant`, none), mapped by
//! `map_users` while bubblewrap waits. The VM's home is `/home/kernel`, which is the VM's
//! root as the filesystem API names it; it sees read-only system directories, its own
//! `/tmp`, `/dev/shm` and run directory (egress socket, uploads, recordings), and nothing
//! else of the host. Its only network is its own loopback: traffic leaves through the
//! egress socket. Media a VM wrote is processed in a sandbox of its own (`tool_command`).

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::Digest;

/// The VM's root inside the sandbox.
pub const VM_HOME: &str = "/home/kernel";
/// The VM's run directory inside the sandbox.
pub const VM_RUN: &str = "/run/vm";
/// The agent's binary inside the sandbox.
const VM_AGENT: &str = "/opt/browser-agent/browser-agent";
/// The Node.js runtime of Playwright executors inside the sandbox.
pub const VM_NODE_RUNTIME: &str = "/opt/browser-agent/node";

/// System directories a VM reads (when the host has them). Fontconfig's cache saves
/// every Chromium start a scan of the fonts.
const SYSTEM_DIRS: &[&str] = &["/usr", "/var/cache/fontconfig"];
/// What a VM sees of the host's `/etc`: enough for fonts, TLS roots, time zones, name
/// lookups, Chromium's defaults and the dynamic linker; not the host's users, keys or
/// services' configuration. Its `passwd` and `group` are its own (`write_identity`).
const ETC_ENTRIES: &[&str] = &[
    "alternatives",
    "ca-certificates",
    "chromium.d",
    "fonts",
    "host.conf",
    "hosts",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "mime.types",
    "nsswitch.conf",
    "ssl",
    "X11",
    "xdg",
];
/// The directories that hold what a sandbox mounts.
const MOUNT_PARENTS: &[&str] = &[
    "/etc",
    "/etc/chromium",
    "/etc/chromium/policies",
    "/home",
    "/opt",
    "/opt/browser-agent",
    "/run",
    "/var",
    "/var/cache",
];
/// Where Chromium reads enterprise policies that the VM's `chrome_policy` is written to.
pub const POLICY_DIR: &str = "/etc/chromium/policies/managed";

/// Where VM directories live when the data directory's parents do not let the VM user
/// through.
const FALLBACK_VM_BASE: &str = "/var/lib/browser-vms";

/// Where the VMs' directories, the agent binary they start and the Node.js runtime
/// they run Playwright code with are.
#[derive(Clone, Debug)]
pub struct VmPlacement {
    pub browsers_dir: PathBuf,
    /// Deployments' directories and their runs (`crate::apps`).
    pub apps_dir: PathBuf,
    pub agent_binary: PathBuf,
    pub node_runtime: Option<PathBuf>,
}

/// Whether every parent of `path` lets others pass through (o+x).
fn traversable_parents(path: &Path) -> bool {
    path.ancestors().skip(1).all(|dir| {
        std::fs::metadata(dir).is_ok_and(|metadata| {
            std::os::unix::fs::PermissionsExt::mode(&metadata.permissions()) & 0o001 != 0
        })
    })
}

/// The host user browser VMs run as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmUser {
    pub uid: u32,
    pub gid: u32,
}

#[derive(Clone, Debug)]
pub struct Sandbox {
    bwrap: PathBuf,
    /// Who the sandbox runs as on the host when this service is root; `None` when it is
    /// not (its own user then, already unprivileged).
    user: Option<VmUser>,
    /// The host user tenant code in a browser VM runs as, apart from the agent (root
    /// only: mapping two users into a VM takes a privileged writer of its `uid_map`).
    tenant: Option<VmUser>,
}

/// Inside a browser VM whose tenant code runs apart: the agent (and Xvfb, PulseAudio,
/// the encoders) is the VM's uid 0, with only the capabilities it needs to start tenant
/// processes and act on their files (`AGENT_CAPABILITIES`); Chromium and everything a
/// user starts is uid 1000, with none. Each is its own host user.
pub const VM_AGENT_UID: u32 = 0;
pub const VM_TENANT_UID: u32 = 1000;
const AGENT_CAPABILITIES: &[&str] = &[
    "CAP_SETUID",
    "CAP_SETGID",
    "CAP_KILL",
    "CAP_CHOWN",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_SYS_PTRACE",
];

/// Whether unprivileged users may create user namespaces here (what bubblewrap needs).
pub fn user_namespaces_allowed() -> bool {
    let sysctl = |name: &str| {
        std::fs::read_to_string(name).ok().and_then(|value| value.trim().parse::<u64>().ok())
    };
    // Debian kernels can also switch them off for unprivileged users.
    sysctl("/proc/sys/user/max_user_namespaces").is_some_and(|max| max > 0)
        && sysctl("/proc/sys/kernel/unprivileged_userns_clone") != Some(0)
}

impl Sandbox {
    /// Checks that this host can sandbox browsers: `Err` says what is missing.
    pub fn prepare(user_name: &str, tenant_name: &str) -> Result<Self, String> {
        let bwrap = find_in_path("bwrap").ok_or(
            "bubblewrap (`bwrap`) is not installed: install Debian's `bubblewrap` package",
        )?;
        if !user_namespaces_allowed() {
            return Err("this kernel does not let unprivileged users create user namespaces \
                 (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone)"
                .into());
        }
        let (user, tenant) = if nix::unistd::geteuid().is_root() {
            let user = host_user(user_name, "--vm-user")?;
            let tenant = host_user(tenant_name, "--vm-tenant-user")?;
            if user == tenant {
                return Err(format!(
                    "the VM user and the VM tenant user must differ (both {user_name:?})"
                ));
            }
            (Some(user), Some(tenant))
        } else {
            (None, None)
        };
        Ok(Self { bwrap, user, tenant })
    }

    pub fn user(&self) -> Option<VmUser> {
        self.user
    }

    /// The host user of tenant code, when it runs apart from the agent.
    pub fn tenant(&self) -> Option<VmUser> {
        self.tenant
    }

    /// Maps the VM's two users into the user namespace of the sandbox whose first
    /// process is `pid` (held by bubblewrap until told it is done): the agent's host
    /// user as uid 0, the tenant's as uid 1000. Only root may write two ranges.
    pub fn map_users(&self, pid: i64) -> std::io::Result<()> {
        let (Some(agent), Some(tenant)) = (self.user, self.tenant) else {
            return Ok(());
        };
        let map = |agent_id: u32, tenant_id: u32| {
            format!("{VM_AGENT_UID} {agent_id} 1\n{VM_TENANT_UID} {tenant_id} 1\n")
        };
        std::fs::write(format!("/proc/{pid}/uid_map"), map(agent.uid, tenant.uid))?;
        std::fs::write(format!("/proc/{pid}/gid_map"), map(agent.gid, tenant.gid))
    }

    /// Puts the VMs' directories and the agent binary where the VM user can reach them
    /// (bubblewrap mounts them by path, as that user): under the data directory when its
    /// parents let the user through, else under `/var/lib/browser-vms/<data directory's
    /// hash>`. The directories it passes through are made traversable (0711): listing and
    /// reading stay ours.
    pub fn place(
        &self, data_dir: &Path, agent_binary: &Path, node_runtime: Option<&Path>,
    ) -> Result<VmPlacement, String> {
        let Some(user) = self.user else {
            return Ok(VmPlacement {
                browsers_dir: data_dir.join("browsers"),
                apps_dir: data_dir.join("apps"),
                agent_binary: agent_binary.to_owned(),
                node_runtime: node_runtime.map(Path::to_owned),
            });
        };
        let base = if traversable_parents(data_dir) {
            data_dir.to_owned()
        } else {
            let hash = hex::encode(sha2::Sha256::digest(data_dir.as_os_str().as_encoded_bytes()));
            let base = Path::new(FALLBACK_VM_BASE).join(&hash[..16]);
            tracing::info!(
                data_dir = %data_dir.display(),
                vm_dirs = %base.display(),
                "the VM user cannot pass through the data directory's parents; VM directories live elsewhere"
            );
            base
        };
        let fail = |what: &str, error: std::io::Error| format!("{what}: {error}");
        let agent_dir = base.join("agent");
        let browsers_dir = base.join("browsers");
        let apps_dir = base.join("apps");
        let fallback = (base != data_dir).then(|| PathBuf::from(FALLBACK_VM_BASE));
        for dir in fallback.iter().chain([&base, &browsers_dir, &apps_dir, &agent_dir]) {
            std::fs::create_dir_all(dir).map_err(|e| fail(&dir.display().to_string(), e))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
                .map_err(|e| fail(&dir.display().to_string(), e))?;
        }
        if !traversable_parents(&browsers_dir) {
            return Err(format!(
                "the VM user {} cannot reach {}",
                user.uid,
                browsers_dir.display()
            ));
        }
        // The binary may sit in a directory only we can enter (a build under /root): the
        // VM starts a link to it, or a copy across file systems.
        let staged = agent_dir.join("browser-agent");
        let _ = std::fs::remove_file(&staged);
        if std::fs::hard_link(agent_binary, &staged).is_err() {
            std::fs::copy(agent_binary, &staged)
                .map_err(|e| fail(&format!("copying {}", agent_binary.display()), e))?;
        }
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| fail(&staged.display().to_string(), e))?;
        let node_runtime = match node_runtime {
            Some(runtime) => Some(
                stage_node_runtime(runtime, &agent_dir)
                    .map_err(|e| fail(&format!("staging {}", runtime.display()), e))?,
            ),
            None => None,
        };
        Ok(VmPlacement { browsers_dir, apps_dir, agent_binary: staged, node_runtime })
    }

    /// The command that starts `agent` (with `agent_args`, which name paths inside the
    /// VM) in a sandbox over `root` and `run`; `info` receives bubblewrap's JSON with
    /// the host pid of the sandbox's PID 1. The VM's memory-backed `/tmp` and `/dev/shm`
    /// hold at most `memory_bytes` each (what they hold counts in its memory too).
    /// With a tenant user, the sandbox waits on `userns_block` until `map_users` is done.
    pub fn command(
        &self, (agent, node_runtime): (&Path, Option<&Path>), agent_args: Vec<OsString>,
        (root, run): (&Path, &Path), memory_bytes: u64, (info, userns_block): (&OwnedFd, &OwnedFd),
    ) -> tokio::process::Command {
        let mut command = self.system(run, memory_bytes);
        let mut bind = |option: &str, source: &Path, target: &str| {
            command.arg(option).arg(source).arg(target);
        };
        bind("--bind", root, VM_HOME);
        bind("--bind", run, VM_RUN);
        bind("--ro-bind", agent, VM_AGENT);
        if let Some(runtime) = node_runtime {
            bind("--ro-bind", runtime, VM_NODE_RUNTIME);
        }
        bind("--ro-bind", &run.join("policies"), POLICY_DIR);
        command.args(["--dir", "/tmp/.X11-unix"]).args(["--chdir", VM_HOME]);
        // With two users the agent is the VM's uid 0; with one, everything is uid 1000.
        let uid = if self.tenant.is_some() {
            command.arg("--userns-block-fd").arg(userns_block.as_raw_fd().to_string());
            keep_fd(&mut command, userns_block.as_raw_fd());
            for capability in AGENT_CAPABILITIES {
                command.args(["--cap-add", capability]);
            }
            VM_AGENT_UID
        } else {
            VM_TENANT_UID
        };
        self.finish(command, Some(info), VM_AGENT.as_ref(), agent_args, uid)
    }

    /// The command that runs `program` (a path inside) in an app sandbox: the app's
    /// directory at `APP_DIR` (writable while it is built, read-only when its actions
    /// run), its run directory at `APP_RUN` (its egress socket, result file and the
    /// service's scripts), the API socket at `APP_API_SOCKET`, the agent binary (which
    /// starts first and opens the ways out, `browser-agent app-sandbox`), and nothing else
    /// of the host but its system directories. The program's environment is the run
    /// directory's `APP_ENV_FILE`, applied inside: bubblewrap, on the host, runs with the
    /// service's minimal one (an app's `LD_PRELOAD` must never reach it). The run ends
    /// past `limits`.
    pub fn app_command(
        &self, agent: &Path, app: AppMounts<'_>, limits: AppLimits, info: &OwnedFd,
        program: (&str, Vec<OsString>),
    ) -> tokio::process::Command {
        let memory_bytes = limits.tmpfs_bytes;
        let mut command = self.system(app.run, memory_bytes);
        let mut bind = |option: &str, source: &Path, target: &str| {
            command.arg(option).arg(source).arg(target);
        };
        let app_bind = if app.app_writable { "--bind" } else { "--ro-bind" };
        bind(app_bind, app.app, APP_DIR);
        bind("--bind", app.run, APP_RUN);
        bind("--bind", app.api_socket, APP_API_SOCKET);
        bind("--ro-bind", agent, VM_AGENT);
        if let Some(cache) = app.cache {
            bind("--bind", cache, APP_CACHE);
        }
        // Its `typescript` compiles TypeScript apps as they load.
        if let Some(runtime) = app.node_runtime {
            bind("--ro-bind", runtime, VM_NODE_RUNTIME);
        }
        command
            .args(["--dir", "/tmp/home"])
            .args(["--chdir", APP_DIR])
            // Unlike a browser, which outlives a restart of the service, an app's run
            // belongs to the process that waits for its result.
            .arg("--die-with-parent");
        let (name, args) = program;
        let mut sandbox_args: Vec<OsString> = vec![
            "app-sandbox".into(),
            "--egress-socket".into(),
            Path::new(APP_RUN).join(APP_EGRESS_SOCKET).into(),
            "--api-socket".into(),
            APP_API_SOCKET.into(),
            "--api-port".into(),
            app.api_port.to_string().into(),
            "--env-file".into(),
            Path::new(APP_RUN).join(APP_ENV_FILE).into(),
            "--memory-limit-bytes".into(),
            limits.memory_bytes.to_string().into(),
            "--exit-reason-file".into(),
            Path::new(APP_RUN).join(APP_EXIT_REASON_FILE).into(),
            "--max-tasks".into(),
            limits.max_tasks.to_string().into(),
            "--".into(),
            name.into(),
        ];
        sandbox_args.extend(args);
        self.finish(command, Some(info), VM_AGENT.as_ref(), sandbox_args, VM_TENANT_UID)
    }

    /// The command that runs a media tool (`program` with `args`, on its stdin and
    /// stdout) on data a VM wrote: as the VM user, in namespaces of its own, seeing the
    /// host's system directories, read-only, `tool` if it lives elsewhere, and a
    /// memory-backed `/tmp` of at most `tmp_bytes`; nothing of the data directory, no
    /// network.
    pub fn tool_command(
        &self, program: &str, args: &[String], tmp_bytes: u64, tool: &Path,
    ) -> tokio::process::Command {
        let mut command = self.base(tmp_bytes);
        if tool.is_absolute() && !SYSTEM_DIRS.iter().any(|dir| tool.starts_with(dir)) {
            command.arg("--ro-bind").arg(tool).arg(tool);
        }
        let args = args.iter().map(OsString::from).collect();
        self.finish(command, None, program.as_ref(), args, VM_TENANT_UID)
    }

    /// A bubblewrap command that shows the host's system directories, read-only, the
    /// VM's own identity (from `run`), and memory-backed `/tmp` and `/dev/shm` of at most
    /// `memory_bytes` each.
    fn system(&self, run: &Path, memory_bytes: u64) -> tokio::process::Command {
        let mut command = self.base(memory_bytes);
        let mut bind = |option: &str, source: &Path, target: &str| {
            command.arg(option).arg(source).arg(target);
        };
        bind("--ro-bind", &run.join(IDENTITY_DIR).join("passwd"), "/etc/passwd");
        for file in ["group", "hostname"] {
            bind("--ro-bind", &run.join(IDENTITY_DIR).join(file), &format!("/etc/{file}"));
        }
        command
    }

    /// A bubblewrap command that shows the host's system directories, read-only, and
    /// memory-backed `/tmp` and `/dev/shm` of at most `memory_bytes` each.
    fn base(&self, memory_bytes: u64) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.bwrap);
        // Made first, 0755: bubblewrap 0.8 makes the parents of a bind's target 0700,
        // which only the VM's uid 0 could pass through.
        for dir in MOUNT_PARENTS {
            command.args(["--dir", dir]);
        }
        command
            .args(["--proc", "/proc", "--dev", "/dev"])
            .args(["--perms", "1777", "--size", &memory_bytes.to_string(), "--tmpfs", "/tmp"])
            .args(["--perms", "1777", "--size", &memory_bytes.to_string()])
            .args(["--tmpfs", "/dev/shm"]);
        let mut bind = |option: &str, source: &Path, target: &str| {
            command.arg(option).arg(source).arg(target);
        };
        for dir in SYSTEM_DIRS {
            if Path::new(dir).exists() {
                bind("--ro-bind", Path::new(dir), dir);
            }
        }
        for entry in ETC_ENTRIES {
            let path = Path::new("/etc").join(entry);
            if path.exists() {
                bind("--ro-bind", &path, &path.to_string_lossy());
            }
        }
        for (link, target) in [
            ("/bin", "usr/bin"),
            ("/sbin", "usr/sbin"),
            ("/lib", "usr/lib"),
            ("/lib64", "usr/lib64"),
        ] {
            command.arg("--symlink").arg(target).arg(link);
        }
        command
    }

    /// Namespaces, the VM user (`uid` inside), and `program`.
    fn finish(
        &self, mut command: tokio::process::Command, info: Option<&OwnedFd>, program: &Path,
        args: Vec<OsString>, uid: u32,
    ) -> tokio::process::Command {
        command
            // Each namespace named: `--unshare-all` only tries the cgroup one.
            .args(["--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-net"])
            .args(["--unshare-uts", "--unshare-cgroup"])
            .args(["--uid", &uid.to_string(), "--gid", &uid.to_string()])
            .args(["--hostname", VM_HOSTNAME]);
        if let Some(info) = info {
            command.arg("--info-fd").arg(info.as_raw_fd().to_string());
        }
        command.arg("--").arg(program).args(args);
        // Nothing of the service's environment (database URLs, keys) enters the VM.
        command
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", VM_HOME)
            .env("LANG", "C.UTF-8");
        if let Ok(filter) = std::env::var("RUST_LOG") {
            command.env("RUST_LOG", filter);
        }
        if let Some(user) = self.user {
            command.uid(user.uid).gid(user.gid);
        }
        if let Some(info) = info {
            keep_fd(&mut command, info.as_raw_fd());
        }
        command
    }
}

/// Lets `command`'s process, and no other, inherit descriptor `fd`.
pub fn keep_fd(command: &mut tokio::process::Command, fd: std::os::fd::RawFd) {
    // SAFETY: fcntl is async-signal-safe; it only changes the child's descriptor.
    unsafe {
        command.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A host user, which must exist and not be root.
fn host_user(name: &str, flag: &str) -> Result<VmUser, String> {
    let user = nix::unistd::User::from_name(name)
        .map_err(|error| format!("looking up the user {name:?}: {error}"))?
        .ok_or_else(|| {
            format!(
                "the user {name:?} does not exist: create it with `useradd --system \
                 --no-create-home --shell /usr/sbin/nologin {name}` (deploy/install-deps.sh \
                 does) or name another with {flag}"
            )
        })?;
    if user.uid.is_root() {
        return Err(format!("the user {name:?} is root"));
    }
    Ok(VmUser { uid: user.uid.as_raw(), gid: user.gid.as_raw() })
}

/// Where an app sandbox's directories come from on the host.
pub struct AppMounts<'a> {
    /// The deployment's directory: its source and installed dependencies.
    pub app: &'a Path,
    pub app_writable: bool,
    /// This run's own directory (egress socket, result, scripts).
    pub run: &'a Path,
    /// The control plane's API socket for app sandboxes.
    pub api_socket: &'a Path,
    /// The loopback port the API is reached on inside.
    pub api_port: u16,
    /// The organization's package cache (builds only).
    pub cache: Option<&'a Path>,
    /// The service's Node.js runtime (`browser-agent/node`).
    pub node_runtime: Option<&'a Path>,
}

/// What an app run may use.
#[derive(Clone, Copy, Debug)]
pub struct AppLimits {
    /// Size of its memory-backed `/tmp` and `/dev/shm`, each.
    pub tmpfs_bytes: u64,
    /// Its processes' memory (proportional set size) plus what those directories hold.
    pub memory_bytes: u64,
    /// Processes and threads.
    pub max_tasks: u64,
}

/// The file of an app run's environment, in its run directory (a JSON array of pairs).
pub const APP_ENV_FILE: &str = "env.json";
/// Where an app run says why it was ended (its memory limit), in its run directory.
pub const APP_EXIT_REASON_FILE: &str = "exit-reason";

/// An app's directory inside its sandbox.
pub const APP_DIR: &str = "/app";
/// An app sandbox's run directory inside.
pub const APP_RUN: &str = "/run/app";
/// The package cache inside a build's sandbox.
pub const APP_CACHE: &str = "/run/cache";
/// The egress socket's name in an app sandbox's run directory.
pub const APP_EGRESS_SOCKET: &str = "egress.sock";
const APP_API_SOCKET: &str = "/run/api.sock";

/// A copy of the Node.js runtime (hard links where the file system allows) the VM user
/// can read, in `agent_dir`, named by a digest of the runtime's lock file and scripts so
/// that an unchanged runtime is staged once; older copies are removed.
fn stage_node_runtime(runtime: &Path, agent_dir: &Path) -> std::io::Result<PathBuf> {
    let mut digest = sha2::Sha256::new();
    let mut entries: Vec<_> = std::fs::read_dir(runtime)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.is_file())
        .collect();
    entries.sort();
    for path in entries {
        digest.update(path.as_os_str().as_encoded_bytes());
        digest.update(std::fs::read(&path)?);
    }
    let name = format!("node-{}", &hex::encode(digest.finalize())[..16]);
    let staged = agent_dir.join(&name);
    if staged.is_dir() {
        return Ok(staged);
    }
    for entry in std::fs::read_dir(agent_dir)?.filter_map(Result::ok) {
        if entry.file_name().to_string_lossy().starts_with("node-") {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let partial = agent_dir.join(format!("{name}.partial"));
    let _ = std::fs::remove_dir_all(&partial);
    copy_tree(runtime, &partial)?;
    std::fs::rename(&partial, &staged)?;
    Ok(staged)
}

/// Copies a directory tree readable by all (directories 0755, files 0644 or 0755),
/// linking files instead where it can. Symbolic links are copied as links.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir(to)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755))?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&source, &target)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&source)?, &target)?;
        } else {
            let mode = entry.metadata()?.permissions().mode();
            let readable = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
            if mode & 0o777 == readable && std::fs::hard_link(&source, &target).is_ok() {
                continue;
            }
            std::fs::copy(&source, &target)?;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(readable))?;
        }
    }
    Ok(())
}

/// Where `write_identity` puts the VM's own `passwd` and `group`, in its run directory.
pub const IDENTITY_DIR: &str = "identity";
/// The VM's host name (its own UTS namespace, and `/etc/hostname`).
const VM_HOSTNAME: &str = "browser-vm";

/// The VM's users as its programs look them up: `kernel` (uid 1000), nothing of the host;
/// and its host name.
pub fn write_identity(run: &Path) -> std::io::Result<()> {
    let dir = run.join(IDENTITY_DIR);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("passwd"),
        "root:x:0:0:root:/root:/usr/sbin/nologin\n\
         kernel:x:1000:1000:kernel:/home/kernel:/bin/sh\n\
         nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    )?;
    std::fs::write(dir.join("hostname"), format!("{VM_HOSTNAME}\n"))?;
    std::fs::write(dir.join("group"), "root:x:0:\nkernel:x:1000:\nnogroup:x:65534:\n")
}

/// The host pid of the sandbox's PID 1, from bubblewrap's `--info-fd` JSON.
pub fn child_pid(info: &str) -> Option<i64> {
    serde_json::from_str::<serde_json::Value>(info).ok()?.get("child-pid")?.as_i64()
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_child_pid() {
        assert_eq!(child_pid("{\n    \"child-pid\": 4242\n}"), Some(4242));
        assert_eq!(child_pid("{}"), None);
    }
}
