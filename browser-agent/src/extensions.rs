//! Unpacked browser extensions under `/home/kernel/extensions/<name>` in the VM root, and
//! the set Chromium is launched with. Unpacking follows the archive rules of `fs`
//! (confinement, limits, staging); `unpack` blocks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::chromium::ExtensionSet;
use crate::fs::{FsError, VmFs, ZipLimits};

pub const EXTENSIONS_DIR: &str = "/home/kernel/extensions";
const MAX_NAME_BYTES: usize = 255;

pub struct Extensions {
    fs: Arc<VmFs>,
    vm_root: PathBuf,
    limits: ZipLimits,
    /// Name → directory (on this host) holding the extension's manifest.json, and the
    /// version of that set.
    loaded: Mutex<(u64, BTreeMap<String, PathBuf>)>,
    set: watch::Sender<ExtensionSet>,
}

impl Extensions {
    /// Also answers the channel the Chromium supervisor watches.
    pub fn new(
        fs: Arc<VmFs>,
        vm_root: &Path,
        limits: ZipLimits,
    ) -> (Self, watch::Receiver<ExtensionSet>) {
        let (set, watched) = watch::channel((0, Vec::new()));
        let extensions = Self {
            fs,
            vm_root: vm_root.to_owned(),
            limits,
            loaded: Mutex::default(),
            set,
        };
        (extensions, watched)
    }

    /// Unpacks `archive` as extension `name`, replacing an extension of that name, and
    /// answers the directory holding its manifest. Does not load it yet.
    pub fn unpack(&self, name: &str, archive: std::fs::File) -> Result<PathBuf, FsError> {
        let valid = (1..=MAX_NAME_BYTES).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            && name != "."
            && name != "..";
        if !valid {
            return Err(FsError::Invalid(format!(
                "extension name must match ^[A-Za-z0-9._-]{{1,255}}$, got {name:?}"
            )));
        }
        let api_dir = format!("{EXTENSIONS_DIR}/{name}");
        match self.fs.delete(&api_dir, true) {
            Ok(()) | Err(FsError::NotFound(_)) => {}
            Err(error) => return Err(error),
        }
        self.fs
            .extract_zip(std::io::BufReader::new(archive), &api_dir, self.limits)?;
        match self.manifest_dir(&api_dir) {
            Some(api_manifest_dir) => {
                Ok(self.vm_root.join(api_manifest_dir.trim_start_matches('/')))
            }
            None => {
                let _ = self.fs.delete(&api_dir, true);
                Err(FsError::Invalid(format!(
                    "extension {name}: no manifest.json at the archive's root or in a single top-level folder"
                )))
            }
        }
    }

    /// `dir` itself or its single subdirectory, whichever holds manifest.json.
    fn manifest_dir(&self, dir: &str) -> Option<String> {
        if self
            .fs
            .stat(&format!("{dir}/manifest.json"))
            .is_ok_and(|info| !info.is_dir)
        {
            return Some(dir.to_owned());
        }
        match self.fs.list(dir).ok()?.as_slice() {
            [only] if only.is_dir => {
                let inner = format!("{dir}/{}", only.name);
                self.fs
                    .stat(&format!("{inner}/manifest.json"))
                    .is_ok_and(|info| !info.is_dir)
                    .then_some(inner)
            }
            _ => None,
        }
    }

    /// Adds unpacked extensions to the loaded set; Chromium restarts with all of them.
    /// Answers the names now loaded and the set's version: the restart is done once
    /// Chromium runs with that version (or a later one).
    pub fn load(&self, unpacked: Vec<(String, PathBuf)>) -> (Vec<String>, u64) {
        let Ok(mut loaded) = self.loaded.lock() else {
            return (Vec::new(), 0);
        };
        let (version, extensions) = &mut *loaded;
        extensions.extend(unpacked);
        *version += 1;
        self.set
            .send_replace((*version, extensions.values().cloned().collect()));
        (extensions.keys().cloned().collect(), *version)
    }
}
