//! Chromium's user data as a portable archive: seeded into a new browser from its stored
//! profile, and exported when the session ends so the control plane can store it.
//!
//! Only state worth keeping travels: caches, crash dumps, metrics and the singleton
//! lock files are left out, and symlinks are never followed or archived.

use std::fs::File;
use std::io::{Seek, Write};
use std::path::Path;

use zip::write::SimpleFileOptions;

/// Directory and file names (at any depth) that are not part of a profile's state.
const LEFT_OUT: &[&str] = &[
    "Cache",
    "Code Cache",
    "GPUCache",
    "GrShaderCache",
    "GraphiteDawnCache",
    "DawnGraphiteCache",
    "DawnWebGPUCache",
    "ShaderCache",
    "Crashpad",
    "Crash Reports",
    "BrowserMetrics",
    "component_crx_cache",
    "extensions_crx_cache",
    "optimization_guide_model_store",
    "Safe Browsing",
    "SingletonLock",
    "SingletonSocket",
    "SingletonCookie",
    "DevToolsActivePort",
];

/// Whether an archive can be unpacked by `seed`: a readable ZIP whose every entry stays
/// inside its directory.
pub fn check(archive: &Path) -> anyhow::Result<()> {
    let mut zip = zip::ZipArchive::new(File::open(archive)?)?;
    for index in 0..zip.len() {
        let entry = zip.by_index(index)?;
        if entry.enclosed_name().is_none() {
            anyhow::bail!("entry {:?} leaves its directory", entry.name());
        }
    }
    Ok(())
}

/// Unpacks a stored profile into an empty user-data directory. The archive comes from
/// our own export; `enclosed_name` still keeps every entry inside `dir`.
pub fn seed(archive: &Path, dir: &Path) -> anyhow::Result<()> {
    let mut zip = zip::ZipArchive::new(File::open(archive)?)?;
    std::fs::create_dir_all(dir)?;
    for index in 0..zip.len() {
        let mut entry = zip.by_index(index)?;
        let Some(relative) = entry.enclosed_name() else {
            anyhow::bail!("profile archive entry {:?} leaves its directory", entry.name());
        };
        let path = dir.join(relative);
        if entry.is_dir() {
            std::fs::create_dir_all(&path)?;
        } else if entry.is_file() {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            let mut out = File::create(&path)?;
            std::io::copy(&mut entry, &mut out)?;
        }
    }
    Ok(())
}

/// Writes the profile in `dir` as a ZIP archive to `out`.
pub fn export<W: Write + Seek>(dir: &Path, out: W) -> anyhow::Result<W> {
    let mut zip = zip::ZipWriter::new(out);
    add(dir, "", &mut zip)?;
    Ok(zip.finish()?)
}

fn add<W: Write + Seek>(
    dir: &Path, prefix: &str, zip: &mut zip::ZipWriter<W>,
) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if LEFT_OUT.contains(&name) {
            continue;
        }
        let kind = entry.file_type()?;
        let archived = format!("{prefix}{name}");
        if kind.is_dir() {
            zip.add_directory(format!("{archived}/"), SimpleFileOptions::default())?;
            add(&entry.path(), &format!("{archived}/"), zip)?;
        } else if kind.is_file() {
            zip.start_file(
                archived,
                SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated),
            )?;
            std::io::copy(&mut File::open(entry.path())?, zip)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_then_seed_round_trips_state_and_leaves_caches_out() -> anyhow::Result<()> {
        let source = tempfile::tempdir()?;
        std::fs::create_dir_all(source.path().join("Default/Local Storage/leveldb"))?;
        std::fs::write(source.path().join("Default/Cookies"), b"cookie jar")?;
        std::fs::write(source.path().join("Default/Local Storage/leveldb/000003.log"), b"ls")?;
        std::fs::create_dir_all(source.path().join("Default/Cache/Cache_Data"))?;
        std::fs::write(source.path().join("Default/Cache/Cache_Data/data_0"), b"cached")?;
        std::os::unix::fs::symlink("/etc/passwd", source.path().join("Default/link"))?;

        let archive = tempfile::NamedTempFile::new()?;
        export(source.path(), archive.reopen()?)?;
        let target = tempfile::tempdir()?;
        seed(archive.path(), target.path())?;

        assert_eq!(std::fs::read(target.path().join("Default/Cookies"))?, b"cookie jar");
        assert_eq!(
            std::fs::read(target.path().join("Default/Local Storage/leveldb/000003.log"))?,
            b"ls"
        );
        assert!(!target.path().join("Default/Cache").exists());
        assert!(!target.path().join("Default/link").exists());
        Ok(())
    }
}
