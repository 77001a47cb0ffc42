//! ZIP archives in and out of the VM root: extraction checks every entry against the
//! limits and the root's confinement in a staging directory before anything lands.

use std::ffi::OsString;
use std::io::{Read, Seek, Write};
use std::path::{Component, Path, PathBuf};

use cap_std::fs::{Dir, DirBuilder, DirBuilderExt, MetadataExt, OpenOptions, OpenOptionsExt};

use super::{
    Clear, FsError, MAX_PATH_BYTES, STAGING_PREFIX, VmFs, classify, is_root, normalized_api_path,
    random_suffix, relative,
};

/// Limits for archives extracted into the VM (zip bombs, absurd entry counts).
#[derive(Clone, Copy, Debug)]
pub struct ZipLimits {
    pub max_entries: u64,
    pub max_expanded_bytes: u64,
    /// Largest allowed expanded/compressed ratio of an entry of at least
    /// `RATIO_CHECK_MIN_BYTES` expanded bytes.
    pub max_ratio: u64,
}

/// Small entries may compress extremely well without being a bomb.
const RATIO_CHECK_MIN_BYTES: u64 = 1024 * 1024;

impl VmFs {
    /// Extracts `archive` at `api_dest`. Everything is checked and extracted into a
    /// staging directory beneath the root first; only a fully valid archive is then moved
    /// into place, merging into an existing directory (files of the same name replaced).
    pub fn extract_zip<R: Read + Seek>(
        &self, archive: R, api_dest: &str, limits: ZipLimits,
    ) -> Result<(u64, u64), FsError> {
        let dest = relative(api_dest)?;
        self.keep_clear(&dest, true, Clear::Inside, api_dest)?;
        match self.root.metadata(&dest) {
            Ok(metadata) if !metadata.is_dir() => {
                return Err(FsError::Conflict(format!("{api_dest} exists and is not a directory")));
            }
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(classify(error, api_dest));
            }
            _ => {}
        }
        let staging_name = PathBuf::from(format!("{STAGING_PREFIX}{}", random_suffix()));
        self.root.create_dir(&staging_name).map_err(|e| classify(e, "staging directory"))?;
        let outcome = (|| {
            let staging =
                self.root.open_dir(&staging_name).map_err(|e| classify(e, "staging directory"))?;
            let counts = extract_into(&staging, archive, limits)?;
            self.place(&staging_name, &dest, api_dest)?;
            Ok(counts)
        })();
        let _ = self.root.remove_dir_all(&staging_name);
        outcome
    }

    /// Moves the staged tree into `dest`, merging with what is there: directories merge,
    /// files replace files of the same name (atomically, by rename). Whether every entry
    /// fits is checked before anything moves: a file where a directory is (or the other
    /// way round) is a conflict that changes nothing.
    fn place(&self, staged: &Path, dest: &Path, api_dest: &str) -> Result<(), FsError> {
        if self.root.symlink_metadata(dest).is_ok() {
            self.check_placement(staged, dest, api_dest)?;
        }
        self.move_staged(staged, dest, api_dest)
    }

    /// The names in a staged directory, each with whether it is a directory; read as the
    /// caller goes, since moving entries out changes the directory.
    fn staged_entries<'a>(
        &self, staged: &Path, api_dest: &'a str,
    ) -> Result<impl Iterator<Item = Result<(OsString, bool), FsError>> + 'a, FsError> {
        let entries = self.root.read_dir(staged).map_err(|e| classify(e, api_dest))?;
        Ok(entries.map(move |entry| {
            let entry = entry.map_err(|e| classify(e, api_dest))?;
            let is_dir = entry.file_type().map_err(|e| classify(e, api_dest))?.is_dir();
            Ok((entry.file_name(), is_dir))
        }))
    }

    fn check_placement(&self, staged: &Path, dest: &Path, api_dest: &str) -> Result<(), FsError> {
        for entry in self.staged_entries(staged, api_dest)? {
            let (name, staged_is_dir) = entry?;
            if let Ok(existing) = self.root.symlink_metadata(dest.join(&name)) {
                match (existing.is_dir(), staged_is_dir) {
                    (true, true) => {
                        self.check_placement(&staged.join(&name), &dest.join(&name), api_dest)?
                    }
                    (false, false) => {}
                    _ => {
                        let at = normalized_api_path(&dest.join(&name));
                        return Err(FsError::Conflict(format!(
                            "the archive has a {} where {at} is a {}",
                            if staged_is_dir { "directory" } else { "file" },
                            if existing.is_dir() { "directory" } else { "file" },
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    fn move_staged(&self, staged: &Path, dest: &Path, api_dest: &str) -> Result<(), FsError> {
        if self.root.symlink_metadata(dest).is_err() {
            if is_root(dest) {
                return Err(FsError::Invalid("the root always exists".into()));
            }
            if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
                self.ensure_directory(parent, api_dest)?;
            }
            return self.root.rename(staged, &self.root, dest).map_err(|e| classify(e, api_dest));
        }
        for entry in self.staged_entries(staged, api_dest)? {
            let (name, is_dir) = entry?;
            let (from, to) = (staged.join(&name), dest.join(&name));
            let both_dirs =
                is_dir && self.root.symlink_metadata(&to).is_ok_and(|existing| existing.is_dir());
            if both_dirs {
                self.move_staged(&from, &to, api_dest)?;
            } else {
                self.root.rename(&from, &self.root, &to).map_err(|e| classify(e, api_dest))?;
            }
        }
        Ok(())
    }

    /// Writes a ZIP archive of the directory `api_path` to `out`.
    pub fn zip_directory<W: Write + Seek>(&self, api_path: &str, out: W) -> Result<W, FsError> {
        let path = relative(api_path)?;
        let dir = self.root.open_dir(&path).map_err(|e| classify(e, api_path))?;
        let mut writer = zip::ZipWriter::new(out);
        add_to_zip(&dir, Path::new(""), &mut writer).map_err(|e| classify(e, api_path))?;
        writer.finish().map_err(|e| FsError::Io { context: api_path.to_owned(), source: e.into() })
    }
}

/// Whether a symlink at `link` (relative to the extraction directory) pointing to
/// `target` stays inside that directory. `..` may only lead the target: after a normal
/// component it could climb out of a directory that is itself a symlink (`s/..`).
pub(super) fn symlink_stays_inside(link: &Path, target: &str) -> bool {
    if target.starts_with('/') || target.is_empty() {
        return false;
    }
    let mut depth: i64 = link.parent().map(|p| p.components().count() as i64).unwrap_or(0);
    let mut descended = false;
    for component in Path::new(target).components() {
        match component {
            Component::Normal(_) => {
                depth += 1;
                descended = true;
            }
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 || descended {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// `a/./b/../c` → `a/c`. Exact for archive entries: none may lie beneath a symlink.
fn lexically_normal(path: &Path) -> PathBuf {
    let mut normal = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => normal.push(part),
            Component::ParentDir => {
                normal.pop();
            }
            _ => {}
        }
    }
    normal
}

/// Whether `name` lies beneath one of the symlinks the archive created: such an entry
/// would be written wherever the link points, not where its name says.
fn beneath_a_symlink(name: &Path, symlinks: &std::collections::HashSet<PathBuf>) -> bool {
    name.ancestors().skip(1).any(|ancestor| symlinks.contains(ancestor))
}

fn corrupt(error: impl std::fmt::Display) -> FsError {
    FsError::Invalid(format!("not a readable ZIP archive: {error}"))
}

fn extract_into<R: Read + Seek>(
    staging: &Dir, archive: R, limits: ZipLimits,
) -> Result<(u64, u64), FsError> {
    let mut archive = archive;
    // The zip crate reads the whole central directory up front; a hostile archive can
    // declare millions of entries, so their count is checked before that.
    if let Some(declared) = declared_entry_count(&mut archive)
        && declared > limits.max_entries
    {
        return Err(entry_limit(declared, limits));
    }
    let mut archive = zip::ZipArchive::new(archive).map_err(corrupt)?;
    let entries = archive.len() as u64;
    if entries > limits.max_entries {
        return Err(entry_limit(entries, limits));
    }
    let mut total: u64 = 0;
    let mut files = 0;
    let mut symlinks = std::collections::HashSet::new();
    for index in 0..archive.len() {
        let mut entry = archive.by_index(index).map_err(corrupt)?;
        let raw_name = entry.name().map(|n| n.into_owned()).unwrap_or_default();
        // `enclosed_name` would quietly make an absolute name relative; refuse it instead.
        if raw_name.starts_with(['/', '\\']) || raw_name.get(1..2) == Some(":") {
            return Err(FsError::InvalidPath(format!(
                "archive entry {raw_name:?} has an absolute path"
            )));
        }
        let name = entry.enclosed_name().map(|name| lexically_normal(&name)).ok_or_else(|| {
            FsError::InvalidPath(format!(
                "archive entry {raw_name:?} would land outside the destination"
            ))
        })?;
        if name.as_os_str().is_empty() {
            continue;
        }
        if beneath_a_symlink(&name, &symlinks) {
            return Err(FsError::InvalidPath(format!(
                "archive entry {raw_name:?} lies beneath a symlink of the same archive"
            )));
        }
        let declared = entry.size();
        if declared > limits.max_expanded_bytes.saturating_sub(total) {
            return Err(expanded_limit(limits));
        }
        if entry.is_dir() {
            let mut builder = DirBuilder::new();
            builder.recursive(true).mode(0o755);
            staging.create_dir_with(&name, &builder).map_err(|e| classify(e, &raw_name))?;
            continue;
        }
        if let Some(parent) = name.parent().filter(|p| !p.as_os_str().is_empty()) {
            let mut builder = DirBuilder::new();
            builder.recursive(true).mode(0o755);
            staging.create_dir_with(parent, &builder).map_err(|e| classify(e, &raw_name))?;
        }
        if entry.is_symlink() {
            let mut target = String::new();
            entry
                .by_ref()
                .take(MAX_PATH_BYTES as u64)
                .read_to_string(&mut target)
                .map_err(corrupt)?;
            if !symlink_stays_inside(&name, &target) {
                return Err(FsError::InvalidPath(format!(
                    "archive entry {raw_name:?} is a symlink to {target:?}, outside the destination"
                )));
            }
            staging.symlink(&target, &name).map_err(|e| classify(e, &raw_name))?;
            symlinks.insert(name);
            continue;
        }
        let compressed = entry.compressed_size().max(1);
        if declared >= RATIO_CHECK_MIN_BYTES && declared / compressed > limits.max_ratio {
            return Err(ratio_limit(&raw_name, limits));
        }
        // Never setuid/setgid/sticky from an archive; the owner can always read and write.
        let mode = entry.unix_mode().map(|m| m & 0o777).unwrap_or(0o644) | 0o600;
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(true).mode(mode);
        let file = staging.open_with(&name, &options).map_err(|e| classify(e, &raw_name))?;
        let mut file = std::io::BufWriter::with_capacity(256 * 1024, file.into_std());
        // Declared sizes can lie: count what really comes out, one byte past the limit.
        let allowance = limits.max_expanded_bytes - total;
        let written =
            std::io::copy(&mut entry.by_ref().take(allowance + 1), &mut file).map_err(corrupt)?;
        if written > allowance {
            return Err(expanded_limit(limits));
        }
        if written >= RATIO_CHECK_MIN_BYTES && written / compressed > limits.max_ratio {
            return Err(ratio_limit(&raw_name, limits));
        }
        let file = file.into_inner().map_err(|e| classify(e.into_error(), &raw_name))?;
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))
            .map_err(|e| classify(e, &raw_name))?;
        total += written;
        files += 1;
    }
    Ok((files, total))
}

fn entry_limit(entries: u64, limits: ZipLimits) -> FsError {
    FsError::Invalid(format!(
        "the archive has {entries} entries; the limit is {}",
        limits.max_entries
    ))
}

/// The entry count an archive declares in its end-of-central-directory record (ZIP64
/// aware), read without parsing the directory. `None` if the record is not found (the
/// zip crate then reports the archive as unreadable).
fn declared_entry_count<R: Read + Seek>(archive: &mut R) -> Option<u64> {
    const EOCD: &[u8] = b"PK\x05\x06";
    const ZIP64_LOCATOR: &[u8] = b"PK\x06\x07";
    const ZIP64_EOCD: &[u8] = b"PK\x06\x06";
    let length = archive.seek(std::io::SeekFrom::End(0)).ok()?;
    // The record is 22 bytes plus a comment of at most 65535, plus room for the locator.
    let tail_length = length.min(22 + 65_535 + 20);
    archive.seek(std::io::SeekFrom::Start(length - tail_length)).ok()?;
    let mut tail = vec![0; tail_length as usize];
    archive.read_exact(&mut tail).ok()?;
    let at = tail.windows(4).rposition(|window| window == EOCD)?;
    let count = u16::from_le_bytes([*tail.get(at + 10)?, *tail.get(at + 11)?]);
    if count != u16::MAX {
        return Some(count.into());
    }
    let locator = tail.get(at.checked_sub(20)?..at)?;
    if &locator[..4] != ZIP64_LOCATOR {
        return None;
    }
    let record_offset = u64::from_le_bytes(locator[8..16].try_into().ok()?);
    archive.seek(std::io::SeekFrom::Start(record_offset)).ok()?;
    let mut record = [0u8; 40];
    archive.read_exact(&mut record).ok()?;
    if &record[..4] != ZIP64_EOCD {
        return None;
    }
    Some(u64::from_le_bytes(record[32..40].try_into().ok()?))
}

fn expanded_limit(limits: ZipLimits) -> FsError {
    FsError::Invalid(format!(
        "the archive expands to more than {} bytes, the limit",
        limits.max_expanded_bytes
    ))
}

fn ratio_limit(name: &str, limits: ZipLimits) -> FsError {
    FsError::Invalid(format!(
        "archive entry {name:?} compresses more than {}:1, the limit (zip bomb?)",
        limits.max_ratio
    ))
}

fn add_to_zip<W: Write + Seek>(
    dir: &Dir, prefix: &Path, writer: &mut zip::ZipWriter<W>,
) -> std::io::Result<()> {
    let mut entries: Vec<_> = dir.entries()?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        let archived = prefix.join(&name);
        let archived_name = archived.to_string_lossy().into_owned();
        let file_type = entry.file_type()?;
        let mode = entry.metadata()?.mode() & 0o777;
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated)
            .large_file(true)
            .unix_permissions(mode);
        if file_type.is_symlink() {
            let target = dir.read_link_contents(&name)?;
            writer
                .add_symlink(archived_name, target.to_string_lossy(), options)
                .map_err(std::io::Error::other)?;
        } else if file_type.is_dir() {
            writer
                .add_directory(format!("{archived_name}/"), options)
                .map_err(std::io::Error::other)?;
            add_to_zip(&dir.open_dir(&name)?, &archived, writer)?;
        } else {
            writer.start_file(archived_name, options).map_err(std::io::Error::other)?;
            std::io::copy(&mut dir.open(&name)?, writer)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlink_targets_are_judged_from_the_link() {
        assert!(symlink_stays_inside(Path::new("a/link"), "../b"));
        assert!(!symlink_stays_inside(Path::new("a/link"), "../../b"));
        assert!(!symlink_stays_inside(Path::new("link"), "/etc/passwd"));
        // `s/..` climbs out of wherever `s` points.
        assert!(!symlink_stays_inside(Path::new("a/link"), "s/.."));
        assert!(symlink_stays_inside(Path::new("a/link"), "b/c"));
        let links = [PathBuf::from("a")].into_iter().collect();
        assert!(beneath_a_symlink(Path::new("a/a/l"), &links));
        assert!(!beneath_a_symlink(Path::new("a"), &links));
        assert!(!beneath_a_symlink(Path::new("b/a"), &links));
    }

    #[test]
    fn the_declared_entry_count_is_read_without_parsing_the_directory() {
        let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        for name in ["a", "b", "c"] {
            writer.start_file(name, zip::write::SimpleFileOptions::default()).expect("entry");
            writer.write_all(b"x").expect("data");
        }
        let mut archive = writer.finish().expect("finish");
        assert_eq!(declared_entry_count(&mut archive), Some(3));
        assert_eq!(declared_entry_count(&mut std::io::Cursor::new(b"not a zip".to_vec())), None);
    }
}
