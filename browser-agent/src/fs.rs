//! Filesystem work confined to the VM root. The API's `/` is the root; every path is
//! resolved beneath it by cap-std (openat2 `RESOLVE_BENEATH` where the kernel has it), so
//! neither `..` nor a symlink can reach outside, also when files change concurrently.
//! All functions here block; the gRPC layer runs them on blocking threads.

use std::io::{Read, Seek, Write};
use std::path::{Component, Path, PathBuf};

use browser_agent_proto::v1::FileInfo;
use cap_std::fs::{Dir, DirBuilder, OpenOptions, Permissions};
use cap_std::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use tonic::Status;

/// Permission bits the API may set: never setuid or setgid (the agent runs as root and
/// the VM root is on the host's filesystem); the sticky bit is fine.
pub const ALLOWED_MODE_BITS: u32 = 0o1777;
/// Longest API path accepted.
pub const MAX_PATH_BYTES: usize = 4096;
/// Hidden directory names used while extracting and writing; never part of user data.
const STAGING_PREFIX: &str = ".agent-staging-";

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

#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// Relative paths, escapes from the root, malformed names.
    #[error("{0}")]
    InvalidPath(String),
    #[error("{0} does not exist")]
    NotFound(String),
    /// The destination exists and cannot be replaced.
    #[error("{0}")]
    Conflict(String),
    /// Valid path, wrong kind of thing or a limit: not a directory, a zip bomb, …
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

impl From<FsError> for Status {
    fn from(error: FsError) -> Self {
        let message = error.to_string();
        match error {
            FsError::InvalidPath(_) | FsError::Invalid(_) => Status::invalid_argument(message),
            FsError::NotFound(_) => Status::not_found(message),
            FsError::Conflict(_) => Status::already_exists(message),
            FsError::PermissionDenied(_) => Status::permission_denied(message),
            FsError::Io { .. } => Status::internal(message),
        }
    }
}

/// Maps an I/O error on `path` to what the caller did wrong, if anything.
fn classify(error: std::io::Error, path: &str) -> FsError {
    use std::io::ErrorKind;
    // cap-std reports an attempted escape as PermissionDenied with this text.
    if error.kind() == ErrorKind::PermissionDenied
        && error.to_string().contains("outside of the filesystem")
    {
        return FsError::InvalidPath(format!("{path} resolves outside the browser's filesystem"));
    }
    match error.kind() {
        ErrorKind::NotFound => FsError::NotFound(path.to_owned()),
        ErrorKind::AlreadyExists => FsError::Conflict(format!("{path} already exists")),
        ErrorKind::DirectoryNotEmpty => {
            FsError::Conflict(format!("{path} is a non-empty directory"))
        }
        ErrorKind::NotADirectory => {
            FsError::Invalid(format!("a component of {path} is not a directory"))
        }
        ErrorKind::IsADirectory => FsError::Invalid(format!("{path} is a directory")),
        ErrorKind::PermissionDenied => {
            FsError::PermissionDenied(format!("permission denied: {path}"))
        }
        ErrorKind::InvalidInput | ErrorKind::InvalidFilename => {
            FsError::Invalid(format!("{path}: {error}"))
        }
        _ if error.raw_os_error() == Some(libc::ELOOP) => {
            FsError::InvalidPath(format!("{path}: too many levels of symbolic links"))
        }
        _ => FsError::Io {
            context: path.to_owned(),
            source: error,
        },
    }
}

/// Turns an API path (`/a/b`) into a path relative to the root (`a/b`; `.` for `/`).
/// `..` is resolved lexically and may not climb above the root.
pub fn relative(api_path: &str) -> Result<PathBuf, FsError> {
    if api_path.len() > MAX_PATH_BYTES {
        return Err(FsError::InvalidPath(format!(
            "paths are limited to {MAX_PATH_BYTES} bytes"
        )));
    }
    if api_path.contains('\0') {
        return Err(FsError::InvalidPath(
            "paths cannot contain NUL bytes".into(),
        ));
    }
    let Some(rest) = api_path.strip_prefix('/') else {
        return Err(FsError::InvalidPath(format!(
            "path must be absolute (start with /): {api_path:?}"
        )));
    };
    let mut relative = PathBuf::new();
    for component in Path::new(rest).components() {
        match component {
            Component::Normal(part) => relative.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if !relative.pop() {
                    return Err(FsError::InvalidPath(format!(
                        "{api_path} escapes the browser's filesystem"
                    )));
                }
            }
            Component::RootDir | Component::Prefix(_) => {}
        }
    }
    if relative.as_os_str().is_empty() {
        relative.push(".");
    }
    Ok(relative)
}

fn is_root(relative: &Path) -> bool {
    relative == Path::new(".")
}

pub struct VmFs {
    root: Dir,
}

impl VmFs {
    pub fn open(root: &Path) -> std::io::Result<Self> {
        Ok(Self {
            root: Dir::open_ambient_dir(root, cap_std::ambient_authority())?,
        })
    }

    /// Creates `path` and its parents unless it is already a directory. Checking first
    /// lets an escaping symlink be reported as such, not as "already exists".
    fn ensure_directory(&self, path: &Path, api_path: &str) -> Result<(), FsError> {
        match self.root.metadata(path) {
            Ok(metadata) if metadata.is_dir() => Ok(()),
            Ok(_) => Err(FsError::Conflict(format!(
                "a component of {api_path} is not a directory"
            ))),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => self
                .root
                .create_dir_all(path)
                .map_err(|e| classify(e, api_path)),
            Err(error) => Err(classify(error, api_path)),
        }
    }

    pub fn stat(&self, api_path: &str) -> Result<FileInfo, FsError> {
        let path = relative(api_path)?;
        let metadata = self
            .root
            .metadata(&path)
            .map_err(|e| classify(e, api_path))?;
        Ok(file_info(&path, &metadata))
    }

    pub fn list(&self, api_path: &str) -> Result<Vec<FileInfo>, FsError> {
        let path = relative(api_path)?;
        let entries = self
            .root
            .read_dir(&path)
            .map_err(|e| classify(e, api_path))?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| classify(e, api_path))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(STAGING_PREFIX) {
                continue;
            }
            let child = if is_root(&path) {
                PathBuf::from(&name)
            } else {
                path.join(&name)
            };
            // Follows symlinks (beneath the root); a dangling one is listed as itself.
            let metadata = match self.root.metadata(&child) {
                Ok(metadata) => metadata,
                Err(_) => entry.metadata().map_err(|e| classify(e, api_path))?,
            };
            files.push(file_info(&child, &metadata));
        }
        files.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(files)
    }

    pub fn open_for_reading(&self, api_path: &str) -> Result<std::fs::File, FsError> {
        let path = relative(api_path)?;
        if self
            .root
            .metadata(&path)
            .map_err(|e| classify(e, api_path))?
            .is_dir()
        {
            return Err(FsError::Invalid(format!("{api_path} is a directory")));
        }
        Ok(self
            .root
            .open(&path)
            .map_err(|e| classify(e, api_path))?
            .into_std())
    }

    /// Opens a hidden temporary file next to `api_path` (creating parent directories);
    /// `commit_write` moves it into place. Nothing appears at `api_path` before that.
    pub fn begin_write(&self, api_path: &str, mode: u32) -> Result<PendingWrite, FsError> {
        let path = relative(api_path)?;
        if is_root(&path) {
            return Err(FsError::Invalid("cannot write to /".into()));
        }
        if let Ok(metadata) = self.root.metadata(&path)
            && metadata.is_dir()
        {
            return Err(FsError::Conflict(format!("{api_path} is a directory")));
        }
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        self.ensure_directory(parent, api_path)?;
        let temporary = parent.join(format!("{STAGING_PREFIX}{}", random_suffix()));
        let mut options = OpenOptions::new();
        options
            .write(true)
            .create_new(true)
            .mode(mode & ALLOWED_MODE_BITS);
        let file = self
            .root
            .open_with(&temporary, &options)
            .map_err(|e| classify(e, api_path))?;
        // The umask must not weaken the requested mode.
        file.set_permissions(Permissions::from_mode(mode & ALLOWED_MODE_BITS))
            .map_err(|e| classify(e, api_path))?;
        Ok(PendingWrite {
            file: file.into_std(),
            root: self.root.try_clone().map_err(|e| classify(e, api_path))?,
            temporary,
            target: path,
            api_path: api_path.to_owned(),
            committed: false,
        })
    }

    pub fn commit_write(&self, mut pending: PendingWrite) -> Result<(), FsError> {
        let api_path = pending.api_path.clone();
        pending
            .file
            .sync_all()
            .map_err(|e| classify(e, &api_path))?;
        self.root
            .rename(&pending.temporary, &self.root, &pending.target)
            .map_err(|e| classify(e, &api_path))?;
        pending.committed = true;
        Ok(())
    }

    pub fn create_directory(&self, api_path: &str, mode: u32) -> Result<(), FsError> {
        let path = relative(api_path)?;
        match self.root.metadata(&path) {
            Ok(metadata) if metadata.is_dir() => {}
            Ok(_) => {
                return Err(FsError::Conflict(format!(
                    "{api_path} exists and is not a directory"
                )));
            }
            Err(_) => {
                let mut builder = DirBuilder::new();
                builder.recursive(true).mode(mode & ALLOWED_MODE_BITS);
                self.root
                    .create_dir_with(&path, &builder)
                    .map_err(|e| classify(e, api_path))?;
            }
        }
        self.root
            .set_permissions(&path, Permissions::from_mode(mode & ALLOWED_MODE_BITS))
            .map_err(|e| classify(e, api_path))
    }

    pub fn delete(&self, api_path: &str, directory: bool) -> Result<(), FsError> {
        let path = relative(api_path)?;
        if is_root(&path) {
            return Err(FsError::Invalid("cannot delete /".into()));
        }
        let metadata = self
            .root
            .symlink_metadata(&path)
            .map_err(|e| classify(e, api_path))?;
        match (directory, metadata.is_dir()) {
            (true, true) => self.root.remove_dir_all(&path),
            (false, false) => self.root.remove_file(&path),
            (true, false) => {
                return Err(FsError::Invalid(format!(
                    "{api_path} is not a directory; use delete_file"
                )));
            }
            (false, true) => {
                return Err(FsError::Invalid(format!(
                    "{api_path} is a directory; use delete_directory"
                )));
            }
        }
        .map_err(|e| classify(e, api_path))
    }

    pub fn set_permissions(
        &self,
        api_path: &str,
        mode: u32,
        owner: &str,
        group: &str,
    ) -> Result<(), FsError> {
        let path = relative(api_path)?;
        // Resolve the owner and group first: an unknown name must change nothing.
        let uid = (!owner.is_empty()).then(|| user_id(owner)).transpose()?;
        let gid = (!group.is_empty()).then(|| group_id(group)).transpose()?;
        self.root
            .set_permissions(&path, Permissions::from_mode(mode & ALLOWED_MODE_BITS))
            .map_err(|e| classify(e, api_path))?;
        if uid.is_none() && gid.is_none() {
            return Ok(());
        }
        // chown through a descriptor opened beneath the root, never by path.
        let result = if self
            .root
            .metadata(&path)
            .map_err(|e| classify(e, api_path))?
            .is_dir()
        {
            let dir = self
                .root
                .open_dir(&path)
                .map_err(|e| classify(e, api_path))?;
            std::os::unix::fs::fchown(&dir, uid, gid)
        } else {
            let file = self.root.open(&path).map_err(|e| classify(e, api_path))?;
            std::os::unix::fs::fchown(&file, uid, gid)
        };
        result.map_err(|e| classify(e, api_path))
    }

    /// Moves a file or directory. A missing parent of the destination is created. An
    /// existing destination is replaced when POSIX rename can replace it (a file, or an
    /// empty directory by a directory); otherwise it is a conflict. Across filesystems
    /// the source is copied, then deleted.
    pub fn move_path(&self, api_src: &str, api_dest: &str) -> Result<(), FsError> {
        let src = relative(api_src)?;
        let dest = relative(api_dest)?;
        if is_root(&src) || is_root(&dest) {
            return Err(FsError::Invalid("cannot move / or move onto /".into()));
        }
        let metadata = self
            .root
            .symlink_metadata(&src)
            .map_err(|e| classify(e, api_src))?;
        if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
            self.ensure_directory(parent, api_dest)?;
        }
        match self.root.rename(&src, &self.root, &dest) {
            Ok(()) => Ok(()),
            Err(error) if error.raw_os_error() == Some(libc::EXDEV) => {
                copy_recursively(&self.root, &src, &dest, metadata.is_dir())
                    .map_err(|e| classify(e, api_dest))?;
                if metadata.is_dir() {
                    self.root.remove_dir_all(&src)
                } else {
                    self.root.remove_file(&src)
                }
                .map_err(|e| classify(e, api_src))
            }
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => Err(FsError::Invalid(
                format!("cannot move {api_src} into itself"),
            )),
            Err(error) => Err(match classify(error, api_dest) {
                FsError::Invalid(_) => FsError::Conflict(format!(
                    "{api_dest} exists and cannot be replaced by {api_src}"
                )),
                other => other,
            }),
        }
    }

    /// Extracts `archive` at `api_dest`. Everything is checked and extracted into a
    /// staging directory beneath the root first; only a fully valid archive is then moved
    /// into place, merging into an existing directory (files of the same name replaced).
    pub fn extract_zip<R: Read + Seek>(
        &self,
        archive: R,
        api_dest: &str,
        limits: ZipLimits,
    ) -> Result<(u64, u64), FsError> {
        let dest = relative(api_dest)?;
        match self.root.metadata(&dest) {
            Ok(metadata) if !metadata.is_dir() => {
                return Err(FsError::Conflict(format!(
                    "{api_dest} exists and is not a directory"
                )));
            }
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(classify(error, api_dest));
            }
            _ => {}
        }
        let staging_name = PathBuf::from(format!("{STAGING_PREFIX}{}", random_suffix()));
        self.root
            .create_dir(&staging_name)
            .map_err(|e| classify(e, "staging directory"))?;
        let outcome = (|| {
            let staging = self
                .root
                .open_dir(&staging_name)
                .map_err(|e| classify(e, "staging directory"))?;
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

    fn check_placement(&self, staged: &Path, dest: &Path, api_dest: &str) -> Result<(), FsError> {
        for entry in self
            .root
            .read_dir(staged)
            .map_err(|e| classify(e, api_dest))?
        {
            let entry = entry.map_err(|e| classify(e, api_dest))?;
            let name = entry.file_name();
            let staged_is_dir = entry
                .file_type()
                .map_err(|e| classify(e, api_dest))?
                .is_dir();
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
                            if existing.is_dir() {
                                "directory"
                            } else {
                                "file"
                            },
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
            return self
                .root
                .rename(staged, &self.root, dest)
                .map_err(|e| classify(e, api_dest));
        }
        for entry in self
            .root
            .read_dir(staged)
            .map_err(|e| classify(e, api_dest))?
        {
            let entry = entry.map_err(|e| classify(e, api_dest))?;
            let name = entry.file_name();
            let (from, to) = (staged.join(&name), dest.join(&name));
            let both_dirs = entry
                .file_type()
                .map_err(|e| classify(e, api_dest))?
                .is_dir()
                && self
                    .root
                    .symlink_metadata(&to)
                    .is_ok_and(|existing| existing.is_dir());
            if both_dirs {
                self.move_staged(&from, &to, api_dest)?;
            } else {
                self.root
                    .rename(&from, &self.root, &to)
                    .map_err(|e| classify(e, api_dest))?;
            }
        }
        Ok(())
    }

    /// Writes a ZIP archive of the directory `api_path` to `out`.
    pub fn zip_directory<W: Write + Seek>(&self, api_path: &str, out: W) -> Result<W, FsError> {
        let path = relative(api_path)?;
        let dir = self
            .root
            .open_dir(&path)
            .map_err(|e| classify(e, api_path))?;
        let mut writer = zip::ZipWriter::new(out);
        add_to_zip(&dir, Path::new(""), &mut writer).map_err(|e| classify(e, api_path))?;
        writer.finish().map_err(|e| FsError::Io {
            context: api_path.to_owned(),
            source: e.into(),
        })
    }
}

/// A file being written; until committed it is a hidden temporary file, which is removed
/// when the write is dropped (failed upload, cancelled call) without a commit.
pub struct PendingWrite {
    pub file: std::fs::File,
    root: Dir,
    temporary: PathBuf,
    target: PathBuf,
    api_path: String,
    committed: bool,
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        if !self.committed {
            let _ = self.root.remove_file(&self.temporary);
        }
    }
}

fn file_info(path: &Path, metadata: &cap_std::fs::Metadata) -> FileInfo {
    let name = if is_root(path) {
        "/".to_owned()
    } else {
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let mod_time_unix_nanos = metadata.mtime() * 1_000_000_000 + metadata.mtime_nsec();
    FileInfo {
        name,
        path: normalized_api_path(path),
        size_bytes: if metadata.is_dir() { 0 } else { metadata.len() },
        is_dir: metadata.is_dir(),
        mode: metadata.mode(),
        mod_time_unix_nanos,
    }
}

fn normalized_api_path(relative: &Path) -> String {
    if is_root(relative) {
        "/".to_owned()
    } else {
        format!("/{}", relative.display())
    }
}

fn random_suffix() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

fn user_id(owner: &str) -> Result<u32, FsError> {
    if let Ok(uid) = owner.parse() {
        return Ok(uid);
    }
    match nix::unistd::User::from_name(owner) {
        Ok(Some(user)) => Ok(user.uid.as_raw()),
        _ => Err(FsError::Invalid(format!("owner: no such user {owner:?}"))),
    }
}

fn group_id(group: &str) -> Result<u32, FsError> {
    if let Ok(gid) = group.parse() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(group)) => Ok(group.gid.as_raw()),
        _ => Err(FsError::Invalid(format!("group: no such group {group:?}"))),
    }
}

fn copy_recursively(root: &Dir, from: &Path, to: &Path, is_dir: bool) -> std::io::Result<()> {
    if !is_dir {
        return root.copy(from, root, to).map(|_| ());
    }
    root.create_dir_all(to)?;
    for entry in root.read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        copy_recursively(
            root,
            &from.join(&name),
            &to.join(&name),
            entry.file_type()?.is_dir(),
        )?;
    }
    Ok(())
}

/// Whether a symlink at `link` (relative to the extraction directory) pointing to
/// `target` stays inside that directory. `..` may only lead the target: after a normal
/// component it could climb out of a directory that is itself a symlink (`s/..`).
fn symlink_stays_inside(link: &Path, target: &str) -> bool {
    if target.starts_with('/') || target.is_empty() {
        return false;
    }
    let mut depth: i64 = link
        .parent()
        .map(|p| p.components().count() as i64)
        .unwrap_or(0);
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
    name.ancestors()
        .skip(1)
        .any(|ancestor| symlinks.contains(ancestor))
}

fn corrupt(error: impl std::fmt::Display) -> FsError {
    FsError::Invalid(format!("not a readable ZIP archive: {error}"))
}

fn extract_into<R: Read + Seek>(
    staging: &Dir,
    archive: R,
    limits: ZipLimits,
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
        let name = entry
            .enclosed_name()
            .map(|name| lexically_normal(&name))
            .ok_or_else(|| {
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
            staging
                .create_dir_with(&name, &builder)
                .map_err(|e| classify(e, &raw_name))?;
            continue;
        }
        if let Some(parent) = name.parent().filter(|p| !p.as_os_str().is_empty()) {
            let mut builder = DirBuilder::new();
            builder.recursive(true).mode(0o755);
            staging
                .create_dir_with(parent, &builder)
                .map_err(|e| classify(e, &raw_name))?;
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
            staging
                .symlink(&target, &name)
                .map_err(|e| classify(e, &raw_name))?;
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
        let file = staging
            .open_with(&name, &options)
            .map_err(|e| classify(e, &raw_name))?;
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
        let file = file
            .into_inner()
            .map_err(|e| classify(e.into_error(), &raw_name))?;
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
    archive
        .seek(std::io::SeekFrom::Start(length - tail_length))
        .ok()?;
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
    dir: &Dir,
    prefix: &Path,
    writer: &mut zip::ZipWriter<W>,
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
            writer
                .start_file(archived_name, options)
                .map_err(std::io::Error::other)?;
            std::io::copy(&mut dir.open(&name)?, writer)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_paths_map_beneath_the_root() {
        assert_eq!(relative("/").expect("root"), PathBuf::from("."));
        assert_eq!(
            relative("/a/./b/../c").expect("normal"),
            PathBuf::from("a/c")
        );
        assert!(matches!(relative("a/b"), Err(FsError::InvalidPath(_))));
        assert!(matches!(
            relative("/a/../../etc"),
            Err(FsError::InvalidPath(_))
        ));
        assert!(matches!(relative("/a\0b"), Err(FsError::InvalidPath(_))));
    }

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
            writer
                .start_file(name, zip::write::SimpleFileOptions::default())
                .expect("entry");
            writer.write_all(b"x").expect("data");
        }
        let mut archive = writer.finish().expect("finish");
        assert_eq!(declared_entry_count(&mut archive), Some(3));
        assert_eq!(
            declared_entry_count(&mut std::io::Cursor::new(b"not a zip".to_vec())),
            None
        );
    }

    #[test]
    fn nothing_outside_the_root_is_reachable() {
        let outside = tempfile::tempdir().expect("temp dir");
        std::fs::write(outside.path().join("secret"), "s").expect("write");
        let root = tempfile::tempdir().expect("temp dir");
        std::os::unix::fs::symlink(outside.path(), root.path().join("escape")).expect("symlink");
        let fs = VmFs::open(root.path()).expect("open root");
        assert!(matches!(
            fs.stat("/escape/secret"),
            Err(FsError::InvalidPath(_))
        ));
        assert!(matches!(fs.list("/escape"), Err(FsError::InvalidPath(_))));
        assert!(matches!(
            fs.open_for_reading("/escape/secret"),
            Err(FsError::InvalidPath(_))
        ));
        assert!(fs.begin_write("/escape/new", 0o644).is_err());
        assert!(fs.move_path("/escape/secret", "/stolen").is_err());
        assert!(outside.path().join("secret").exists());
    }
}
