//! The agent's command line, as the agent sees its paths in its sandbox.

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::path::Path;

use super::agent_process::AgentFds;
use super::{
    EGRESS_SOCKET, EXIT_REASON_FILE, INPUTS_DIR, LocalRuntime, MAX_VM_TASKS, PROFILE_FILE,
    RECORDINGS_DIR, SCRATCH_DIR, VM_DISPLAY_NUMBER,
};
use crate::runtime::LaunchSpec;
use crate::runtime::sandbox;

impl LocalRuntime {
    /// The agent's command line; paths as the agent sees them.
    pub(super) fn agent_args(
        &self, spec: &LaunchSpec, inputs: &[(String, String)], dir: &Path, fds: &AgentFds,
    ) -> Vec<OsString> {
        let (agent_root, agent_run) = self.agent_paths(dir);
        let mut args: Vec<OsString> = Vec::new();
        // Option and value apart: the value (the VM root) identifies the agent's process.
        let mut arg = |name: &str, value: &dyn AsRef<std::ffi::OsStr>| {
            args.push(format!("--{name}").into());
            args.push(value.as_ref().to_owned());
        };
        arg("vm-root", &agent_root);
        // Sockets outside the VM, not a loopback port: pages (and anything else on this
        // host's network) cannot reach the agent.
        arg("listen-fd", &fds.listener.as_raw_fd().to_string());
        arg("devtools-handoff-fd", &fds.handoff.as_raw_fd().to_string());
        arg("secret-fd", &fds.secret.as_raw_fd().to_string());
        arg("scratch-dir", &agent_run.join(SCRATCH_DIR));
        arg("recordings-dir", &agent_run.join(RECORDINGS_DIR));
        arg("egress-socket", &agent_run.join(EGRESS_SOCKET));
        arg("exit-reason-file", &agent_run.join(EXIT_REASON_FILE));
        arg("width", &spec.width.to_string());
        arg("height", &spec.height.to_string());
        arg("max-width", &self.config.max_resized_viewport.width.to_string());
        arg("max-height", &self.config.max_resized_viewport.height.to_string());
        arg("idle-grace-seconds", &self.config.agent_idle_grace.as_secs().max(1).to_string());
        if let Some(idle) = self.config.freeze_idle_after {
            arg("freeze-idle-after-seconds", &idle.as_secs().max(1).to_string());
        }
        if let Some(sandbox) = &self.config.sandbox {
            arg("max-tasks", &MAX_VM_TASKS.to_string());
            // The VM's /tmp and network namespace are its own: no other X server there.
            arg("display-number", &VM_DISPLAY_NUMBER.to_string());
            if sandbox.tenant().is_some() {
                arg("tenant-uid", &sandbox::VM_TENANT_UID.to_string());
            }
        }
        if let Some(runtime) = &self.config.node_runtime {
            match self.config.sandbox {
                Some(_) => arg("node-runtime", &sandbox::VM_NODE_RUNTIME),
                None => arg("node-runtime", runtime),
            }
        }
        // The agent measures the VM's memory itself only where no control group holds
        // it: measuring walks every Chromium process's page tables, CPU the kernel's
        // own accounting spares (a group's overrun ends the VM from here, `exit_reason`).
        let kernel_enforced = self.config.sandbox.is_some() && self.config.limits.cgroups.is_ok();
        let agent_memory_limit =
            if kernel_enforced { 0 } else { spec.memory_limit_bytes.unwrap_or(0) };
        arg("memory-limit-bytes", &agent_memory_limit.to_string());
        arg("zip-max-entries", &self.config.zip_limits.max_entries.to_string());
        arg("zip-max-expanded-bytes", &self.config.zip_limits.max_expanded_bytes.to_string());
        arg("zip-max-ratio", &self.config.zip_limits.max_ratio.to_string());
        for (name, file) in inputs {
            let mut value = OsString::from(format!("{name}="));
            value.push(agent_run.join(INPUTS_DIR).join(file));
            arg("extension", &value);
        }
        if let Some(timezone) = &spec.timezone {
            arg("timezone", timezone);
        }
        if let Some(locale) = &spec.locale {
            arg("locale", locale);
        }
        if spec.profile_archive.is_some() {
            arg("profile-archive", &agent_run.join(INPUTS_DIR).join(PROFILE_FILE));
        }
        for (flag, on) in [
            // In a sandbox, every process the agent sees is the VM's.
            ("vm-pid-namespace", self.config.sandbox.is_some()),
            ("headless", spec.headless),
            ("kiosk", spec.kiosk),
            ("stealth", spec.stealth),
        ] {
            if on {
                args.push(format!("--{flag}").into());
            }
        }
        args
    }
}
