//! Unpacked browser extensions under `/home/kernel/extensions/<name>` in the VM root, and
//! the set Chromium is launched with. Unpacking follows the archive rules of `fs`
//! (confinement, limits, staging). Blocking; run on blocking threads.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::fs::{FsError, VmFs, ZipLimits};

/// A version of the extension set and its directories of unpacked extensions.
pub type ExtensionSet = (u64, Vec<PathBuf>);

pub const EXTENSIONS_DIR: &str = "/home/kernel/extensions";
const MAX_NAME_BYTES: usize = 255;
/// Most extensions one browser runs with (they all go into one command-line argument).
pub const MAX_LOADED: usize = 50;

pub struct Extensions {
    fs: Arc<VmFs>,
    vm_root: PathBuf,
    limits: ZipLimits,
    /// The version of the loaded set, and name → directory (on this host) holding each
    /// extension's manifest.json. The lock also serializes installs.
    loaded: Mutex<(u64, BTreeMap<String, PathBuf>)>,
    set: watch::Sender<ExtensionSet>,
}

/// An archive unpacked into its hidden incoming directory, not yet in place.
struct Staged {
    name: String,
    incoming: String,
    /// "" or "/<folder>": where manifest.json is inside the extension's directory.
    manifest_subdirectory: String,
}

impl Extensions {
    /// Also answers the channel the Chromium supervisor watches.
    pub fn new(
        fs: Arc<VmFs>, vm_root: &Path, limits: ZipLimits,
    ) -> (Self, watch::Receiver<ExtensionSet>) {
        let (set, watched) = watch::channel((0, Vec::new()));
        let extensions =
            Self { fs, vm_root: vm_root.to_owned(), limits, loaded: Mutex::default(), set };
        (extensions, watched)
    }

    /// Unpacks a batch of extensions and adds them to the loaded set (Chromium restarts
    /// with all of them). Every archive is unpacked into a hidden incoming directory and
    /// checked first; only when all passed do they replace their namesakes, so a bad
    /// archive changes nothing. Answers the names now loaded and the set's version: the
    /// restart is done once Chromium runs with that version or a later one.
    pub fn install(
        &self, batch: Vec<(String, std::fs::File)>,
    ) -> Result<(Vec<String>, u64), FsError> {
        let mut loaded = self
            .loaded
            .lock()
            .map_err(|_| FsError::Invalid("the extension set is unavailable".into()))?;
        let (version, extensions) = &mut *loaded;
        let new_names = batch.iter().filter(|(name, _)| !extensions.contains_key(name)).count();
        if extensions.len() + new_names > MAX_LOADED {
            return Err(FsError::Invalid(format!(
                "a browser loads at most {MAX_LOADED} extensions"
            )));
        }
        let mut staged = Vec::new();
        if let Err(error) = self.stage_all(batch, &mut staged) {
            for entry in &staged {
                let _ = remove_if_present(&self.fs, &entry.incoming);
            }
            return Err(error);
        }
        for entry in staged {
            let dest = format!("{EXTENSIONS_DIR}/{}", entry.name);
            remove_if_present(&self.fs, &dest)?;
            self.fs.move_path(&entry.incoming, &dest)?;
            let manifest_dir = format!("{dest}{}", entry.manifest_subdirectory);
            extensions.insert(entry.name, self.vm_root.join(manifest_dir.trim_start_matches('/')));
        }
        *version += 1;
        self.set.send_replace((*version, extensions.values().cloned().collect()));
        Ok((extensions.keys().cloned().collect(), *version))
    }

    /// Unpacks each archive into its incoming directory, recording it in `staged` before
    /// extracting so the caller can clean up whatever a failure leaves.
    fn stage_all(
        &self, batch: Vec<(String, std::fs::File)>, staged: &mut Vec<Staged>,
    ) -> Result<(), FsError> {
        for (name, archive) in batch {
            check_name(&name)?;
            let incoming = format!("{EXTENSIONS_DIR}/.incoming-{name}");
            remove_if_present(&self.fs, &incoming)?;
            staged.push(Staged {
                name: name.clone(),
                incoming: incoming.clone(),
                manifest_subdirectory: String::new(),
            });
            self.fs.extract_zip(std::io::BufReader::new(archive), &incoming, self.limits)?;
            let inner = self.manifest_subdirectory(&incoming).ok_or_else(|| {
                FsError::Invalid(format!(
                    "extension {name}: no manifest.json at the archive's root or in a single top-level folder"
                ))
            })?;
            if let Some(entry) = staged.last_mut() {
                entry.manifest_subdirectory = inner;
            }
        }
        Ok(())
    }

    /// "" if `dir` holds manifest.json, "/<folder>" if its single subdirectory does.
    fn manifest_subdirectory(&self, dir: &str) -> Option<String> {
        let has_manifest = |dir: &str| {
            self.fs.stat(&format!("{dir}/manifest.json")).is_ok_and(|info| !info.is_dir)
        };
        if has_manifest(dir) {
            return Some(String::new());
        }
        match self.fs.list(dir).ok()?.as_slice() {
            [only] if only.is_dir && has_manifest(&format!("{dir}/{}", only.name)) => {
                Some(format!("/{}", only.name))
            }
            _ => None,
        }
    }
}

fn check_name(name: &str) -> Result<(), FsError> {
    let valid = (1..=MAX_NAME_BYTES).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name != "."
        && name != "..";
    if valid {
        Ok(())
    } else {
        Err(FsError::Invalid(format!(
            "extension name must match ^[A-Za-z0-9._-]{{1,255}}$ and not be . or .., got {name:?}"
        )))
    }
}

fn remove_if_present(fs: &VmFs, api_dir: &str) -> Result<(), FsError> {
    match fs.delete(api_dir, true) {
        Ok(()) | Err(FsError::NotFound(_)) => Ok(()),
        Err(error) => Err(error),
    }
}
