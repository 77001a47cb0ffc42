//! Filesystem work confined to the VM root. The API's `/` is the root; every path is
//! resolved beneath it by cap-std (openat2 `RESOLVE_BENEATH` where the kernel has it), so
//! neither `..` nor a symlink can reach outside, also when files change concurrently.
//! All functions here block; the gRPC layer runs them on blocking threads.

mod archive;

use std::path::{Component, Path, PathBuf};

use browser_agent_proto::v1::FileInfo;
use cap_std::fs::{Dir, DirBuilder, OpenOptions, Permissions};
use cap_std::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use tonic::Status;

pub use archive::ZipLimits;

/// Permission bits the API may set: never setuid or setgid (the agent runs as root and
/// the VM root is on the host's filesystem); the sticky bit is fine.
pub const ALLOWED_MODE_BITS: u32 = 0o1777;
/// Longest API path accepted.
pub const MAX_PATH_BYTES: usize = 4096;
/// Hidden directory names used while extracting and writing; never part of user data.
const STAGING_PREFIX: &str = ".agent-staging-";

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
    Io { context: String, source: std::io::Error },
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
        _ => FsError::Io { context: path.to_owned(), source: error },
    }
}

/// Turns an API path (`/a/b`) into a path relative to the root (`a/b`; `.` for `/`).
/// `..` is resolved lexically and may not climb above the root.
pub fn relative(api_path: &str) -> Result<PathBuf, FsError> {
    if api_path.len() > MAX_PATH_BYTES {
        return Err(FsError::InvalidPath(format!("paths are limited to {MAX_PATH_BYTES} bytes")));
    }
    if api_path.contains('\0') {
        return Err(FsError::InvalidPath("paths cannot contain NUL bytes".into()));
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
    /// A directory (relative to the root) this handle may not change: the extensions,
    /// which only the extensions API manages (a pool's reset keeps them).
    protected: Option<PathBuf>,
}

/// How a path must stay clear of the protected directory.
#[derive(Clone, Copy)]
enum Clear {
    /// Not inside it (writes, new directories, destinations).
    Inside,
    /// Neither inside it nor containing it (deletes and moved sources).
    Overlap,
}

impl VmFs {
    pub fn open(root: &Path) -> std::io::Result<Self> {
        Ok(Self {
            root: Dir::open_ambient_dir(root, cap_std::ambient_authority())?,
            protected: None,
        })
    }

    /// A handle for the filesystem API: it refuses to change `protected` (an API path).
    pub fn open_protecting(root: &Path, protected: &str) -> Result<Self, FsError> {
        let mut fs = Self::open(root).map_err(|e| classify(e, "/"))?;
        fs.protected = Some(relative(protected)?);
        Ok(fs)
    }

    /// Where `path` really is beneath the root: its longest existing part with every
    /// symbolic link resolved (they all stay inside the root), the rest as given. The
    /// last component is resolved only with `follow_last`, as the operation would.
    fn real_location(&self, path: &Path, follow_last: bool) -> std::io::Result<PathBuf> {
        let (mut existing, mut rest) = match (follow_last, path.file_name()) {
            (false, Some(name)) => (path.parent().unwrap_or(Path::new("")), vec![name]),
            _ => (path, Vec::new()),
        };
        loop {
            if existing.as_os_str().is_empty() || is_root(existing) {
                break;
            }
            match self.root.canonicalize(existing) {
                Ok(real) => {
                    // `.` for the root itself: depths are counted in normal components.
                    let real: PathBuf = real
                        .components()
                        .filter(|c| !matches!(c, std::path::Component::CurDir))
                        .collect();
                    return Ok(rest.iter().rev().fold(real, |real, name| real.join(name)));
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    rest.extend(existing.file_name());
                    existing = existing.parent().unwrap_or(Path::new(""));
                }
                Err(error) => return Err(error),
            }
        }
        Ok(rest.iter().rev().fold(PathBuf::new(), |real, name| real.join(name)))
    }

    fn keep_clear(
        &self, path: &Path, follow_last: bool, clear: Clear, api_path: &str,
    ) -> Result<(), FsError> {
        if self.protected.is_none() {
            return Ok(());
        }
        let real = self.real_location(path, follow_last).map_err(|e| classify(e, api_path))?;
        self.keep_clear_of(&real, clear, api_path)
    }

    /// `keep_clear` for a location already resolved by `real_location`.
    fn keep_clear_of(&self, real: &Path, clear: Clear, api_path: &str) -> Result<(), FsError> {
        let Some(protected) = &self.protected else {
            return Ok(());
        };
        let touches = real.starts_with(protected)
            || matches!(clear, Clear::Overlap) && protected.starts_with(real);
        if touches {
            return Err(FsError::Invalid(format!(
                "{api_path}: /{} is managed by the extensions API, not the filesystem API",
                protected.display()
            )));
        }
        Ok(())
    }

    /// Creates `path` and its parents unless it is already a directory. Checking first
    /// lets an escaping symlink be reported as such, not as "already exists".
    fn ensure_directory(&self, path: &Path, api_path: &str) -> Result<(), FsError> {
        match self.root.metadata(path) {
            Ok(metadata) if metadata.is_dir() => Ok(()),
            Ok(_) => {
                Err(FsError::Conflict(format!("a component of {api_path} is not a directory")))
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                self.root.create_dir_all(path).map_err(|e| classify(e, api_path))
            }
            Err(error) => Err(classify(error, api_path)),
        }
    }

    pub fn stat(&self, api_path: &str) -> Result<FileInfo, FsError> {
        let path = relative(api_path)?;
        let metadata = self.root.metadata(&path).map_err(|e| classify(e, api_path))?;
        Ok(file_info(&path, &metadata))
    }

    pub fn list(&self, api_path: &str) -> Result<Vec<FileInfo>, FsError> {
        let path = relative(api_path)?;
        let entries = self.root.read_dir(&path).map_err(|e| classify(e, api_path))?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| classify(e, api_path))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(STAGING_PREFIX) {
                continue;
            }
            let child = if is_root(&path) { PathBuf::from(&name) } else { path.join(&name) };
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
        if self.root.metadata(&path).map_err(|e| classify(e, api_path))?.is_dir() {
            return Err(FsError::Invalid(format!("{api_path} is a directory")));
        }
        Ok(self.root.open(&path).map_err(|e| classify(e, api_path))?.into_std())
    }

    /// Opens a hidden temporary file next to `api_path` (creating parent directories);
    /// `commit_write` moves it into place. Nothing appears at `api_path` before that.
    pub fn begin_write(&self, api_path: &str, mode: u32) -> Result<PendingWrite, FsError> {
        let path = relative(api_path)?;
        if is_root(&path) {
            return Err(FsError::Invalid("cannot write to /".into()));
        }
        self.keep_clear(&path, false, Clear::Inside, api_path)?;
        if let Ok(metadata) = self.root.metadata(&path)
            && metadata.is_dir()
        {
            return Err(FsError::Conflict(format!("{api_path} is a directory")));
        }
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        self.ensure_directory(parent, api_path)?;
        let temporary = parent.join(format!("{STAGING_PREFIX}{}", random_suffix()));
        let mut options = OpenOptions::new();
        options.write(true).create_new(true).mode(mode & ALLOWED_MODE_BITS);
        let file = self.root.open_with(&temporary, &options).map_err(|e| classify(e, api_path))?;
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
        pending.file.sync_all().map_err(|e| classify(e, &api_path))?;
        self.root
            .rename(&pending.temporary, &self.root, &pending.target)
            .map_err(|e| classify(e, &api_path))?;
        pending.committed = true;
        Ok(())
    }

    pub fn create_directory(&self, api_path: &str, mode: u32) -> Result<(), FsError> {
        let path = relative(api_path)?;
        self.keep_clear(&path, true, Clear::Inside, api_path)?;
        match self.root.metadata(&path) {
            Ok(metadata) if metadata.is_dir() => {}
            Ok(_) => {
                return Err(FsError::Conflict(format!("{api_path} exists and is not a directory")));
            }
            Err(_) => {
                let mut builder = DirBuilder::new();
                builder.recursive(true).mode(mode & ALLOWED_MODE_BITS);
                self.root.create_dir_with(&path, &builder).map_err(|e| classify(e, api_path))?;
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
        self.keep_clear(&path, false, Clear::Overlap, api_path)?;
        let metadata = self.root.symlink_metadata(&path).map_err(|e| classify(e, api_path))?;
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
        &self, api_path: &str, mode: u32, owner: &str, group: &str,
    ) -> Result<(), FsError> {
        let path = relative(api_path)?;
        self.keep_clear(&path, true, Clear::Inside, api_path)?;
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
        let result = if self.root.metadata(&path).map_err(|e| classify(e, api_path))?.is_dir() {
            let dir = self.root.open_dir(&path).map_err(|e| classify(e, api_path))?;
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
        let metadata = self.root.symlink_metadata(&src).map_err(|e| classify(e, api_src))?;
        self.keep_clear(&src, false, Clear::Overlap, api_src)?;
        // Judged where it really lands: the destination's directories may be links
        // themselves (inside the root) that put it elsewhere than its path says.
        let landing = self.real_location(&dest, false).map_err(|e| classify(e, api_dest))?;
        self.keep_clear_of(&landing, Clear::Inside, api_dest)?;
        if let Some(link) = self
            .link_escaping_after_move(&src, &landing, metadata.is_dir())
            .map_err(|e| classify(e, api_src))?
        {
            return Err(FsError::Invalid(format!(
                "moving {api_src} to {api_dest} would leave the link /{} pointing outside the \
                 browser's filesystem",
                link.display()
            )));
        }
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
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                Err(FsError::Invalid(format!("cannot move {api_src} into itself")))
            }
            Err(error) => Err(match classify(error, api_dest) {
                FsError::Invalid(_) => FsError::Conflict(format!(
                    "{api_dest} exists and cannot be replaced by {api_src}"
                )),
                other => other,
            }),
        }
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
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
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
    if is_root(relative) { "/".to_owned() } else { format!("/{}", relative.display()) }
}

fn random_suffix() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

fn user_id(owner: &str) -> Result<u32, FsError> {
    numeric_or_named(owner, "owner", "user", |name| {
        Some(nix::unistd::User::from_name(name).ok()??.uid.as_raw())
    })
}

fn group_id(group: &str) -> Result<u32, FsError> {
    numeric_or_named(group, "group", "group", |name| {
        Some(nix::unistd::Group::from_name(name).ok()??.gid.as_raw())
    })
}

/// A numeric id as given, or the id of the user or group of that name.
fn numeric_or_named(
    value: &str, field: &str, kind: &str, by_name: impl FnOnce(&str) -> Option<u32>,
) -> Result<u32, FsError> {
    if let Ok(id) = value.parse() {
        return Ok(id);
    }
    by_name(value).ok_or_else(|| FsError::Invalid(format!("{field}: no such {kind} {value:?}")))
}

impl VmFs {
    /// A symbolic link of the tree at `from` that, moved to `to`, would resolve outside
    /// the VM root (where it ends up). A relative link that stays inside at its depth can
    /// point out from a shallower one, so links are judged again wherever they move.
    fn link_escaping_after_move(
        &self, from: &Path, to: &Path, is_dir: bool,
    ) -> std::io::Result<Option<PathBuf>> {
        if !is_dir {
            if !self.root.symlink_metadata(from)?.is_symlink() {
                return Ok(None);
            }
            let target = self.root.read_link_contents(from)?;
            let inside = archive::symlink_stays_inside(to, &target.to_string_lossy());
            return Ok((!inside).then(|| to.to_owned()));
        }
        for entry in self.root.read_dir(from)? {
            let entry = entry?;
            let name = entry.file_name();
            let escaping = self.link_escaping_after_move(
                &from.join(&name),
                &to.join(&name),
                entry.file_type()?.is_dir(),
            )?;
            if escaping.is_some() {
                return Ok(escaping);
            }
        }
        Ok(None)
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
        copy_recursively(root, &from.join(&name), &to.join(&name), entry.file_type()?.is_dir())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_paths_map_beneath_the_root() {
        assert_eq!(relative("/").expect("root"), PathBuf::from("."));
        assert_eq!(relative("/a/./b/../c").expect("normal"), PathBuf::from("a/c"));
        assert!(matches!(relative("a/b"), Err(FsError::InvalidPath(_))));
        assert!(matches!(relative("/a/../../etc"), Err(FsError::InvalidPath(_))));
        assert!(matches!(relative("/a\0b"), Err(FsError::InvalidPath(_))));
    }

    #[test]
    fn a_move_never_lifts_a_link_to_where_it_points_outside() {
        let root = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(root.path().join("a/b/c")).expect("dirs");
        // Inside at its depth: a/b/c/../../../secret is <root>/secret.
        std::os::unix::fs::symlink("../../../secret", root.path().join("a/b/c/l"))
            .expect("symlink");
        let fs = VmFs::open(root.path()).expect("open root");
        for (from, to) in [("/a/b/c/l", "/l"), ("/a/b", "/x"), ("/a/b/c", "/d/c")] {
            assert!(
                matches!(fs.move_path(from, to), Err(FsError::Invalid(ref why)) if why.contains("outside")),
                "{from} → {to}"
            );
        }
        assert!(root.path().join("a/b/c/l").is_symlink(), "refused moves change nothing");
        // The same depth (or deeper) keeps it inside.
        fs.move_path("/a", "/y").expect("same depth");
        fs.move_path("/y/b/c/l", "/z/z/z/l").expect("same depth");
        assert!(root.path().join("z/z/z/l").is_symlink());
    }

    #[test]
    fn a_link_is_judged_where_it_really_lands() {
        let root = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(root.path().join("a/b")).expect("dirs");
        std::fs::create_dir_all(root.path().join("c/d/e")).expect("dirs");
        // Both stay inside where they are: a/b/up is the root, c/d/e/l is <root>/secret.
        std::os::unix::fs::symlink("../..", root.path().join("a/b/up")).expect("symlink");
        std::os::unix::fs::symlink("../../../secret", root.path().join("c/d/e/l"))
            .expect("symlink");
        let fs = VmFs::open(root.path()).expect("open root");
        // a/b/up/f/g/l reads as depth 5, but really is f/g/l, from where ../../.. is out.
        assert!(matches!(
            fs.move_path("/c/d/e/l", "/a/b/up/f/g/l"),
            Err(FsError::Invalid(ref why)) if why.contains("outside")
        ));
        assert!(root.path().join("c/d/e/l").is_symlink());
        fs.move_path("/c/d/e/l", "/a/b/up/f/g/h/l").expect("really at depth 3");
    }

    #[test]
    fn the_api_handle_cannot_change_the_extensions() {
        let root = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(root.path().join("home/kernel/extensions/ext")).expect("dirs");
        std::fs::write(root.path().join("home/kernel/extensions/ext/bg.js"), "ok").expect("write");
        std::os::unix::fs::symlink("home/kernel/extensions", root.path().join("x"))
            .expect("symlink");
        let fs = VmFs::open_protecting(root.path(), "/home/kernel/extensions").expect("open");
        let refused = |outcome: Result<(), FsError>| matches!(outcome, Err(FsError::Invalid(ref why)) if why.contains("extensions API"));
        assert!(fs.begin_write("/home/kernel/extensions/ext/bg.js", 0o644).is_err());
        assert!(fs.begin_write("/x/ext/evil.js", 0o644).is_err(), "through a link too");
        assert!(refused(fs.create_directory("/x/new", 0o755)));
        assert!(refused(fs.delete("/home/kernel/extensions/ext", true)));
        assert!(refused(fs.delete("/home", true)), "nor what contains them");
        assert!(refused(fs.move_path("/home/kernel/extensions/ext", "/ext")));
        assert!(refused(fs.move_path("/home/kernel", "/elsewhere")));
        assert!(refused(fs.set_permissions("/x/ext/bg.js", 0o777, "", "")));
        assert_eq!(
            std::fs::read_to_string(root.path().join("home/kernel/extensions/ext/bg.js"))
                .expect("read"),
            "ok"
        );
        // Beside them, everything works as usual.
        fs.create_directory("/home/kernel/downloads", 0o755).expect("beside");
        let pending = fs.begin_write("/home/kernel/notes.txt", 0o644).expect("beside");
        fs.commit_write(pending).expect("commit");
        // The extensions API's own handle is not protected.
        let own = VmFs::open(root.path()).expect("open");
        own.delete("/home/kernel/extensions/ext", true).expect("own handle");
    }

    #[test]
    fn nothing_outside_the_root_is_reachable() {
        let outside = tempfile::tempdir().expect("temp dir");
        std::fs::write(outside.path().join("secret"), "s").expect("write");
        let root = tempfile::tempdir().expect("temp dir");
        std::os::unix::fs::symlink(outside.path(), root.path().join("escape")).expect("symlink");
        let fs = VmFs::open(root.path()).expect("open root");
        assert!(matches!(fs.stat("/escape/secret"), Err(FsError::InvalidPath(_))));
        assert!(matches!(fs.list("/escape"), Err(FsError::InvalidPath(_))));
        assert!(matches!(fs.open_for_reading("/escape/secret"), Err(FsError::InvalidPath(_))));
        assert!(fs.begin_write("/escape/new", 0o644).is_err());
        assert!(fs.move_path("/escape/secret", "/stolen").is_err());
        assert!(outside.path().join("secret").exists());
    }
}
