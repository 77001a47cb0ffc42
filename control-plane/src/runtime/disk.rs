//! A disk quota per browser VM: the VM's home (its root, as the filesystem API names it)
//! lives on a file system of their own, an ext4 image of the quota's size,
//! sparse (it takes on the host only what the VM wrote) and loop-mounted on the host.
//! A VM that fills it gets ENOSPC inside; the host's disk, which also holds the
//! database, keeps its space. The image is this service's file (0600 in the browser's
//! directory): the VM changes it only through the kernel's file system, never as bytes.

use std::path::{Path, PathBuf};
use std::process::Stdio;

/// The image, in the browser's directory.
const IMAGE_FILE: &str = "disk.img";
/// Bytes per inode: a browser's profile has many small files, a download few large ones.
const BYTES_PER_INODE: &str = "16384";

#[derive(Clone, Debug)]
pub struct VmDisks {
    mkfs: PathBuf,
    mount: PathBuf,
    pub size_bytes: u64,
}

impl VmDisks {
    /// Quota'd VM disks of `size_bytes`, or why this host cannot make them.
    pub fn detect(size_bytes: u64) -> Result<Self, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("mounting a file system per VM needs root".into());
        }
        let find = |name: &str| {
            ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
                .iter()
                .map(|dir| Path::new(dir).join(name))
                .find(|path| path.is_file())
                .ok_or_else(|| format!("{name} is not installed (Debian: e2fsprogs, mount)"))
        };
        if !Path::new("/dev/loop-control").exists() {
            return Err("this host has no loop devices (/dev/loop-control)".into());
        }
        Ok(Self { mkfs: find("mkfs.ext4")?, mount: find("mount")?, size_bytes })
    }

    /// Makes the VM's file system and mounts it on `mount_point` (an empty directory).
    pub async fn create(&self, browser_dir: &Path, mount_point: &Path) -> std::io::Result<()> {
        let image = browser_dir.join(IMAGE_FILE);
        let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&image)?;
        std::fs::set_permissions(&image, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        file.set_len(self.size_bytes)?;
        drop(file);
        // No journal (the file system dies with its VM), no blocks reserved for root.
        let mut mkfs = tokio::process::Command::new(&self.mkfs);
        mkfs.args(["-q", "-F", "-O", "^has_journal", "-m", "0"])
            .args(["-i", BYTES_PER_INODE, "-E", "lazy_itable_init=1,nodiscard"])
            .arg(&image);
        run(mkfs, "making the VM's file system").await?;
        std::fs::create_dir_all(mount_point)?;
        let mut mount = tokio::process::Command::new(&self.mount);
        mount
            // `noinit_itable`: the image is a new sparse file, its inode tables read as
            // zeros already; the kernel's background zeroing would only write gigabytes
            // of them while the browser starts.
            .args(["-t", "ext4", "-o", "loop,nosuid,nodev,noatime,noinit_itable"])
            .arg(&image)
            .arg(mount_point);
        run(mount, "mounting the VM's disk").await?;
        // mkfs leaves lost+found, which the VM has no use for.
        let _ = std::fs::remove_dir(mount_point.join("lost+found"));
        Ok(())
    }
}

/// Runs `command` to its end; its error output says why it failed.
async fn run(mut command: tokio::process::Command, what: &str) -> std::io::Result<()> {
    let done =
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).output().await?;
    if done.status.success() {
        return Ok(());
    }
    Err(std::io::Error::other(format!(
        "{what} failed: {}",
        String::from_utf8_lossy(&done.stderr).trim()
    )))
}

/// Unmounts whatever is mounted on `mount_point` (detached: a process still holding a
/// file cannot keep the directory) and removes the image of `browser_dir`.
pub fn remove(browser_dir: &Path, mount_point: &Path) {
    if is_mount_point(mount_point)
        && let Err(error) = nix::mount::umount2(mount_point, nix::mount::MntFlags::MNT_DETACH)
    {
        tracing::warn!(mount_point = %mount_point.display(), %error, "could not unmount a VM's disk");
    }
    match std::fs::remove_file(browser_dir.join(IMAGE_FILE)) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            tracing::warn!(browser_dir = %browser_dir.display(), %error, "could not remove a VM's disk image");
        }
        _ => {}
    }
}

/// Whether a file system is mounted on `path` (its device differs from its parent's).
fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(own), Some(Ok(parent))) =
        (std::fs::symlink_metadata(path), path.parent().map(std::fs::symlink_metadata))
    else {
        return false;
    };
    own.is_dir() && own.dev() != parent.dev()
}
