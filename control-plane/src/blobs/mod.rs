//! Large objects kept outside the database: extension archives now, recordings and
//! profiles later. Behind a trait so object storage can follow the local directory.

use std::path::{Path, PathBuf};

use async_trait::async_trait;

#[async_trait]
pub trait BlobStore: Send + Sync + 'static {
    /// A temporary file for an incoming blob, on the same filesystem as the store so that
    /// `put` can move it into place without copying.
    fn incoming(&self) -> std::io::Result<tempfile::NamedTempFile>;
    /// Stores the finished temporary file under `key` (replacing any blob there).
    async fn put(&self, key: &str, file: tempfile::NamedTempFile) -> std::io::Result<()>;
    async fn open(&self, key: &str) -> std::io::Result<tokio::fs::File>;
    async fn delete(&self, key: &str) -> std::io::Result<()>;
    /// Where the blob is on this host's filesystem, if it is (lets the local runtime hand
    /// archives to its agents without copying).
    fn local_path(&self, key: &str) -> Option<PathBuf>;
}

/// Blobs as files under a directory (default `<data-dir>/blobs`). Keys are relative paths
/// made by the control plane (never by users).
pub struct LocalBlobStore {
    root: PathBuf,
}

const INCOMING_DIR: &str = ".incoming";

impl LocalBlobStore {
    pub fn open(root: &Path) -> std::io::Result<Self> {
        let incoming = root.join(INCOMING_DIR);
        std::fs::create_dir_all(&incoming)?;
        // Leftovers of uploads that a crash interrupted.
        for entry in std::fs::read_dir(&incoming)?.flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
        Ok(Self { root: root.to_owned() })
    }

    fn path(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }
}

#[async_trait]
impl BlobStore for LocalBlobStore {
    fn incoming(&self) -> std::io::Result<tempfile::NamedTempFile> {
        tempfile::NamedTempFile::new_in(self.root.join(INCOMING_DIR))
    }

    async fn put(&self, key: &str, file: tempfile::NamedTempFile) -> std::io::Result<()> {
        let path = self.path(key);
        tokio::task::spawn_blocking(move || {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            file.as_file().sync_all()?;
            file.persist(&path).map(|_| ()).map_err(|error| error.error)
        })
        .await
        .map_err(std::io::Error::other)?
    }

    async fn open(&self, key: &str) -> std::io::Result<tokio::fs::File> {
        tokio::fs::File::open(self.path(key)).await
    }

    async fn delete(&self, key: &str) -> std::io::Result<()> {
        match tokio::fs::remove_file(self.path(key)).await {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    fn local_path(&self, key: &str) -> Option<PathBuf> {
        Some(self.path(key))
    }
}
