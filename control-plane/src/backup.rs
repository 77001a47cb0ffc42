//! `control-plane backup` and `restore`: one tar archive holding what a SQLite deployment
//! cannot be rebuilt without, taken while the service runs.
//!
//! - the database, as one consistent snapshot (`VACUUM INTO`: SQLite copies a single
//!   read transaction, so concurrent writes are either wholly in it or not at all);
//! - the blobs (profiles, extensions, replays), copied after the snapshot, so every blob
//!   the snapshot names is there unless its resource was deleted meanwhile;
//! - the keys kept as files: `credential.key` (without it, saved logins, credentials and
//!   providers' tokens cannot be decrypted) and `bootstrap-api-key`.
//!
//! Live browsers' directories, build caches and logs are not kept: a restored service
//! starts with no browser running (their sessions read as ended at its first start) and
//! apps' builds must be deployed again. The archive holds secrets: it is written 0600,
//! under a temporary name of its own beside `output` until it is complete, and its
//! manifest comes last, so an archive cut short is refused. A restore goes only into a data
//! directory without a database, accepts only the entries a backup writes (regular files
//! and directories under known names, nothing that climbs out), and leaves nothing behind
//! when it fails.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

/// The archive's description of itself, its last entry.
const MANIFEST: &str = "backup.json";
const DATABASE: &str = "control-plane.db";
const BLOBS: &str = "blobs";
/// Files of the data directory a restore needs besides the database and blobs.
const KEY_FILES: [&str; 2] = ["credential.key", "bootstrap-api-key"];
const FORMAT: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    format: u32,
    /// The control plane's version that wrote it.
    version: String,
    created_at: chrono::DateTime<chrono::Utc>,
    blobs: usize,
    /// Whether `credential.key` is in it (not when the key was given by
    /// `--credential-key`, which the operator keeps).
    credential_key: bool,
}

/// What a backup wrote, for the command to print.
#[derive(Debug)]
pub struct BackupSummary {
    pub blobs: usize,
    pub credential_key: bool,
    pub bytes: u64,
}

/// Writes the archive of the deployment whose state is in `data_dir` (and, for SQLite at
/// another place, `database_url`) to `output`.
pub async fn backup(
    data_dir: &Path, database_url: Option<&str>, output: &Path,
) -> anyhow::Result<BackupSummary> {
    let database = sqlite_path(data_dir, database_url)?;
    if !database.is_file() {
        bail!("no database at {}: nothing to back up", database.display());
    }
    let (data_dir, output) = (data_dir.to_owned(), output.to_owned());
    tokio::task::spawn_blocking(move || write_archive(&data_dir, &database, &output)).await?
}

/// Unpacks an archive `backup` wrote into `data_dir`, which must hold no database yet.
/// Sessions that were live at the backup are ended: their VMs are not in it (and may
/// still run under the service the backup was taken from, which a restored service must
/// never reach for).
pub async fn restore(input: &Path, data_dir: &Path) -> anyhow::Result<()> {
    let (input, target) = (input.to_owned(), data_dir.to_owned());
    let staging = tokio::task::spawn_blocking(move || unpack_archive(&input, &target)).await??;
    let database = staging.path().join(DATABASE);
    {
        // The service's own store: the same migrations a start would apply, then the end
        // of every live session, written before anything is moved into place.
        let store = crate::store::open(database.to_str(), staging.path()).await?;
        let now = chrono::Utc::now();
        for session in store.live_sessions().await? {
            store.end_session(&session.id, now, RESTORED_REASON).await?;
        }
    }
    let target = data_dir.to_owned();
    tokio::task::spawn_blocking(move || move_into_place(staging, &target)).await?
}

/// Why a session live at the backup is ended in the restored service.
const RESTORED_REASON: &str = "restored from a backup, which holds no running browser";

fn sqlite_path(data_dir: &Path, database_url: Option<&str>) -> anyhow::Result<PathBuf> {
    match database_url {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => bail!(
            "this deployment's database is PostgreSQL: back it up with pg_dump (or your \
             provider's snapshots), and the data directory's blobs and credential.key with it"
        ),
        Some(url) => Ok(PathBuf::from(url.strip_prefix("sqlite://").unwrap_or(url))),
        None => Ok(data_dir.join(DATABASE)),
    }
}

fn write_archive(data_dir: &Path, database: &Path, output: &Path) -> anyhow::Result<BackupSummary> {
    if output.is_dir() {
        bail!("{} is a directory: name the archive's file", output.display());
    }
    let folder = match output.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    // A file of this run's own (0600, a name no other run takes), removed unless it is
    // complete and renamed to `output`.
    let partial = tempfile::Builder::new()
        .prefix(".backup-")
        .suffix(".partial")
        .tempfile_in(folder)
        .with_context(|| format!("creating the archive in {}", folder.display()))?;
    let scratch = tempfile::Builder::new()
        .prefix(".backup-")
        .tempdir_in(folder)
        .context("a scratch directory beside the archive")?;
    let file = partial.as_file().try_clone()?;
    let summary = write_archive_to(data_dir, database, file, scratch.path())?;
    partial
        .persist(output)
        .with_context(|| format!("moving the archive to {}", output.display()))?;
    Ok(summary)
}

fn write_archive_to(
    data_dir: &Path, database: &Path, file: File, scratch: &Path,
) -> anyhow::Result<BackupSummary> {
    let mut archive = tar::Builder::new(BufWriter::new(file));
    archive.follow_symlinks(false);

    // The snapshot first: the blobs copied after it cover everything it names.
    let snapshot = scratch.join(DATABASE);
    snapshot_database(database, &snapshot)?;
    archive.append_path_with_name(&snapshot, DATABASE)?;

    // Key files are read through any link (a key on a secrets mount) and stored as the
    // regular files a restore accepts.
    let mut credential_key = false;
    for name in KEY_FILES {
        let added = append_if_present(&mut archive, &data_dir.join(name), Path::new(name))?;
        credential_key |= added && name == KEY_FILES[0];
    }
    let mut blobs = 0;
    for relative in regular_files(&data_dir.join(BLOBS))? {
        let path = data_dir.join(BLOBS).join(&relative);
        // A blob gone since the listing went with the resource that named it.
        blobs +=
            usize::from(append_if_present(&mut archive, &path, &Path::new(BLOBS).join(&relative))?);
    }
    // The manifest last: an archive cut short anywhere has none, and is refused.
    let manifest = Manifest {
        format: FORMAT,
        version: env!("CARGO_PKG_VERSION").to_owned(),
        created_at: chrono::Utc::now(),
        blobs,
        credential_key,
    };
    append_bytes(&mut archive, MANIFEST, &serde_json::to_vec_pretty(&manifest)?)?;
    let mut writer = archive.into_inner()?;
    writer.flush()?;
    let file = writer.into_inner().map_err(|error| error.into_error())?;
    file.sync_all()?;
    Ok(BackupSummary { blobs, credential_key, bytes: file.metadata()?.len() })
}

/// Adds the file at `path` (read through any link) as a regular file of mode 0600 under
/// `name`; false when there is no such file.
fn append_if_present(
    archive: &mut tar::Builder<BufWriter<File>>, path: &Path, name: &Path,
) -> anyhow::Result<bool> {
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
    };
    let mut header = tar::Header::new_gnu();
    header.set_metadata(&file.metadata()?);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o600);
    archive.append_data(&mut header, name, &mut file)?;
    Ok(true)
}

/// A consistent copy of a live SQLite database.
fn snapshot_database(database: &Path, snapshot: &Path) -> anyhow::Result<()> {
    let connection = rusqlite::Connection::open_with_flags(
        database,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("opening {}", database.display()))?;
    connection.busy_timeout(std::time::Duration::from_secs(30))?;
    let target = snapshot.to_str().context("the scratch directory's path is not UTF-8")?;
    connection.execute("VACUUM INTO ?1", [target]).context("taking the database's snapshot")?;
    std::fs::set_permissions(snapshot, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// Every regular file under `root`, relative to it; links and the store's unfinished
/// uploads are left out.
fn regular_files(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let entries = match std::fs::read_dir(root.join(&relative)) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(error.into()),
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            if relative.as_os_str().is_empty() && name == ".incoming" {
                continue;
            }
            let file_type = entry.file_type()?;
            if file_type.is_dir() {
                pending.push(relative.join(&name));
            } else if file_type.is_file() {
                found.push(relative.join(&name));
            }
        }
    }
    found.sort();
    Ok(found)
}

fn append_bytes(
    archive: &mut tar::Builder<BufWriter<File>>, name: &str, bytes: &[u8],
) -> anyhow::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o600);
    header.set_mtime(chrono::Utc::now().timestamp().max(0) as u64);
    header.set_cksum();
    archive.append_data(&mut header, name, bytes)?;
    Ok(())
}

/// Unpacks the archive into a staging directory inside `data_dir`, which is removed when
/// the returned handle drops (so a failure leaves nothing).
fn unpack_archive(input: &Path, data_dir: &Path) -> anyhow::Result<tempfile::TempDir> {
    // The database or any file SQLite keeps beside one (a `-wal` journal left there would
    // be replayed into the restored database at its first open).
    if let Ok(entries) = std::fs::read_dir(data_dir) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(DATABASE) {
                bail!(
                    "{} already holds a database ({}): restore into a new data directory",
                    data_dir.display(),
                    entry.file_name().to_string_lossy()
                );
            }
        }
    }
    private_dir(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    let staging = tempfile::Builder::new().prefix(".restore-").tempdir_in(data_dir)?;
    let manifest = unpack_into(input, staging.path())?;
    if manifest.credential_key && !staging.path().join(KEY_FILES[0]).is_file() {
        bail!("the archive says it holds credential.key, but it does not");
    }
    Ok(staging)
}

/// Moves what was unpacked (and checked) into the data directory: the database (with any
/// journal SQLite left beside it) last, so that a directory without one may be restored
/// into again.
fn move_into_place(staging: tempfile::TempDir, data_dir: &Path) -> anyhow::Result<()> {
    let mut names: Vec<String> =
        [BLOBS, KEY_FILES[0], KEY_FILES[1]].iter().map(|name| name.to_string()).collect();
    for entry in std::fs::read_dir(staging.path())? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with(DATABASE) && name != DATABASE {
            names.push(name);
        }
    }
    names.push(DATABASE.to_owned());
    names.retain(|name| staging.path().join(name).exists());
    if let Some(taken) = names.iter().find(|name| data_dir.join(name).exists()) {
        bail!(
            "{} is in the way: restore into a new data directory",
            data_dir.join(taken).display()
        );
    }
    for (index, name) in names.iter().enumerate() {
        if let Err(error) = std::fs::rename(staging.path().join(name), data_dir.join(name)) {
            // Back where they came from, so nothing of a failed restore stays.
            for moved in &names[..index] {
                let _ = std::fs::rename(data_dir.join(moved), staging.path().join(moved));
            }
            return Err(error).with_context(|| format!("moving {name} into place"));
        }
    }
    Ok(())
}

/// Unpacks the archive's known entries into `dir`; anything else refuses the whole
/// archive.
fn unpack_into(input: &Path, dir: &Path) -> anyhow::Result<Manifest> {
    let file = File::open(input).with_context(|| format!("opening {}", input.display()))?;
    let mut archive = tar::Archive::new(std::io::BufReader::new(file));
    let mut manifest = None;
    let mut blobs = 0;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let kind = entry.header().entry_type();
        if !allowed(&path) {
            bail!("the archive holds {}, which no backup writes", path.display());
        }
        let target = dir.join(&path);
        if kind.is_dir() {
            private_dir(&target)?;
            continue;
        }
        if !kind.is_file() {
            bail!("{} in the archive is not a regular file", path.display());
        }
        if let Some(parent) = target.parent() {
            private_dir(parent)?;
        }
        if path == Path::new(MANIFEST) {
            let mut text = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut text)?;
            let read: Manifest =
                serde_json::from_slice(&text).context("the archive's backup.json")?;
            if read.format != FORMAT {
                bail!("the archive is of format {}; this version reads {FORMAT}", read.format);
            }
            manifest = Some(read);
            continue;
        }
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&target)
            .with_context(|| format!("writing {}", target.display()))?;
        std::io::copy(&mut entry, &mut out)?;
        out.sync_all()?;
        blobs += usize::from(path.starts_with(BLOBS));
    }
    let manifest: Manifest =
        manifest.context("the archive has no backup.json: it is not a backup")?;
    if blobs != manifest.blobs {
        bail!("the archive holds {blobs} blobs where its backup.json counts {}", manifest.blobs);
    }
    if !dir.join(DATABASE).is_file() {
        bail!("the archive holds no database");
    }
    Ok(manifest)
}

/// A directory (and its missing parents) only this service's user may enter.
fn private_dir(path: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path)
}

/// The names a backup writes: its manifest, the database, the key files, and paths under
/// `blobs/` that do not climb out of it.
fn allowed(path: &Path) -> bool {
    let mut components = path.components();
    let Some(Component::Normal(first)) = components.next() else {
        return false;
    };
    let rest_is_plain = components.all(|component| matches!(component, Component::Normal(_)));
    if first == BLOBS {
        return rest_is_plain;
    }
    let single = path.components().count() == 1;
    single && [MANIFEST, DATABASE, KEY_FILES[0], KEY_FILES[1]].iter().any(|name| first == *name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_a_backup_writes_is_restored() {
        for good in ["backup.json", "control-plane.db", "credential.key", "blobs/a/b.zip", "blobs"]
        {
            assert!(allowed(Path::new(good)), "{good}");
        }
        for bad in [
            "../x",
            "/etc/passwd",
            "blobs/../../x",
            "browsers/s1/root",
            "control-plane.db/x",
            "replica-id",
            "",
        ] {
            assert!(!allowed(Path::new(bad)), "{bad}");
        }
    }
}
