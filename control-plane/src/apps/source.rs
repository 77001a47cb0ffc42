//! A deployment's source on this host: an uploaded ZIP unpacked (with limits, and never
//! outside its directory), and what kind of app it is.

use std::io::{Read, Seek};
use std::path::{Component, Path};

/// Most entries an app's archive may have.
const MAX_ENTRIES: usize = 20_000;
/// Most bytes an app's archive may expand to.
const MAX_EXPANDED_BYTES: u64 = 512 * 1024 * 1024;

/// The language an app's entrypoint is written in, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Python,
    /// JavaScript or TypeScript, run by Node.js.
    Node,
}

impl Language {
    pub fn of(entrypoint: &str) -> Option<Self> {
        let extension = Path::new(entrypoint).extension()?.to_str()?;
        match extension {
            "py" => Some(Self::Python),
            "js" | "mjs" | "cjs" | "ts" | "mts" | "cts" => Some(Self::Node),
            _ => None,
        }
    }
}

/// Checks a relative path inside an app: `Err` says what is wrong with it.
pub fn check_relative_path(what: &str, path: &str) -> Result<(), String> {
    let relative = Path::new(path);
    let plain = !path.is_empty()
        && path.len() <= 1024
        && relative
            .components()
            .all(|component| matches!(component, Component::Normal(_) | Component::CurDir));
    if plain {
        Ok(())
    } else {
        Err(format!(
            "{what} must be a relative path inside the app (no `..`, not absolute), got {path:?}"
        ))
    }
}

/// Unpacks the ZIP `archive` into the empty directory `into`. Links, and names that would
/// land outside `into`, are refused; so are archives past the limits. A ZIP of a
/// directory (one folder holding everything) is unpacked with that folder as the root,
/// as `zip -r app.zip app/` makes them.
pub fn unpack_zip(archive: impl Read + Seek, into: &Path) -> Result<(), String> {
    let mut zip =
        zip::ZipArchive::new(archive).map_err(|error| format!("not a ZIP archive: {error}"))?;
    if zip.len() > MAX_ENTRIES {
        return Err(format!("the archive has more than {MAX_ENTRIES} entries"));
    }
    let names: Vec<String> =
        zip.file_names().filter_map(Result::ok).map(|name| name.into_owned()).collect();
    let root = common_folder(&names);
    let mut expanded = 0u64;
    for index in 0..zip.len() {
        let mut entry =
            zip.by_index(index).map_err(|error| format!("reading the archive: {error}"))?;
        let raw_name = entry.name().map(|name| name.into_owned()).unwrap_or_default();
        if entry.is_symlink() {
            return Err(format!("the archive holds a link ({raw_name}): links are not accepted"));
        }
        let Some(name) = entry.enclosed_name() else {
            return Err(format!("the archive entry {raw_name:?} would land outside the app"));
        };
        let name = match &root {
            Some(root) => match name.strip_prefix(root) {
                Ok(rest) => rest.to_owned(),
                Err(_) => name,
            },
            None => name,
        };
        if name.as_os_str().is_empty() {
            continue;
        }
        let target = into.join(&name);
        if entry.is_dir() {
            std::fs::create_dir_all(&target).map_err(|error| format!("unpacking: {error}"))?;
            continue;
        }
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|error| format!("unpacking: {error}"))?;
        }
        let mut file =
            std::fs::File::create(&target).map_err(|error| format!("unpacking: {error}"))?;
        let budget = MAX_EXPANDED_BYTES - expanded;
        let copied = std::io::copy(&mut (&mut entry).take(budget + 1), &mut file)
            .map_err(|error| format!("unpacking {}: {error}", name.display()))?;
        expanded += copied;
        if copied > budget {
            return Err(format!(
                "the archive expands to more than {} MiB",
                MAX_EXPANDED_BYTES >> 20
            ));
        }
        if let Some(mode) = entry.unix_mode() {
            let executable = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
            let _ = std::fs::set_permissions(
                &target,
                std::os::unix::fs::PermissionsExt::from_mode(executable),
            );
        }
    }
    Ok(())
}

/// The one top-level folder every entry is in, if there is one and no file sits at the
/// top (macOS's `__MACOSX` folder aside).
fn common_folder(names: &[String]) -> Option<std::path::PathBuf> {
    let mut folder: Option<&str> = None;
    for name in names {
        if name.starts_with("__MACOSX/") {
            continue;
        }
        let (first, rest) = name.split_once('/')?;
        if rest.is_empty() && !name.ends_with('/') {
            return None;
        }
        match folder {
            Some(seen) if seen != first => return None,
            _ => folder = Some(first),
        }
    }
    folder.map(Into::into)
}

/// Gives `dir` and everything in it to `owner` (the VM user builds in it).
pub fn chown_tree(dir: &Path, owner: (u32, u32)) -> std::io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(owner.0), Some(owner.1))?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            chown_tree(&entry.path(), owner)?;
        } else {
            std::os::unix::fs::lchown(entry.path(), Some(owner.0), Some(owner.1))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn zip_of(entries: &[(&str, &str)]) -> std::io::Cursor<Vec<u8>> {
        let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        for (name, contents) in entries {
            writer.start_file(*name, zip::write::SimpleFileOptions::default()).expect("entry");
            writer.write_all(contents.as_bytes()).expect("write");
        }
        let mut cursor = writer.finish().expect("zip");
        cursor.set_position(0);
        cursor
    }

    #[test]
    fn unpacks_flat_and_single_folder_archives_and_refuses_escapes() {
        let dir = tempfile::tempdir().expect("dir");
        let flat = dir.path().join("flat");
        std::fs::create_dir(&flat).expect("dir");
        unpack_zip(zip_of(&[("main.py", "x"), ("lib/a.py", "y")]), &flat).expect("unpacks");
        assert!(flat.join("main.py").is_file() && flat.join("lib/a.py").is_file());
        let folder = dir.path().join("folder");
        std::fs::create_dir(&folder).expect("dir");
        unpack_zip(zip_of(&[("app/main.py", "x"), ("app/req.txt", "y")]), &folder)
            .expect("unpacks");
        assert!(folder.join("main.py").is_file());
        let escape = dir.path().join("escape");
        std::fs::create_dir(&escape).expect("dir");
        assert!(unpack_zip(zip_of(&[("../evil.py", "x")]), &escape).is_err());
        assert!(!dir.path().join("evil.py").exists());
        assert!(unpack_zip(std::io::Cursor::new(b"nope".to_vec()), &escape).is_err());
    }

    #[test]
    fn languages_and_paths() {
        assert_eq!(Language::of("main.py"), Some(Language::Python));
        assert_eq!(Language::of("src/index.ts"), Some(Language::Node));
        assert_eq!(Language::of("main.rb"), None);
        assert!(check_relative_path("p", "src/main.py").is_ok());
        assert!(check_relative_path("p", "../main.py").is_err());
        assert!(check_relative_path("p", "/etc/passwd").is_err());
        assert!(check_relative_path("p", "").is_err());
    }
}
