//! Watching a directory of the VM for changes (`fs/watch`): inotify through the `notify`
//! crate, its events turned into the SDK's CREATE, WRITE, DELETE and RENAME with VM paths.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use browser_agent_proto::v1::WatchEvent;
use notify::event::{CreateKind, EventKind, ModifyKind, RemoveKind};
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::fs::{FsError, relative};

/// Events buffered for a slow reader before the watch gives up on it.
const BUFFERED_EVENTS: usize = 1024;

/// A running watch: events arrive on `events` while `watcher` lives.
pub struct Watch {
    pub watcher: Arc<Mutex<notify::RecommendedWatcher>>,
    pub events: mpsc::Receiver<WatchEvent>,
}

/// Starts watching `api_path` (a directory inside `vm_root`).
pub fn start(vm_root: &Path, api_path: &str, recursive: bool) -> Result<Watch, FsError> {
    let resolved = |path: PathBuf| {
        path.canonicalize().map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => FsError::NotFound(api_path.to_owned()),
            _ => FsError::Io { context: format!("resolving {api_path}"), source },
        })
    };
    let root = resolved(vm_root.to_path_buf())?;
    let target = resolved(root.join(relative(api_path)?))?;
    // A symlink may not lead the watch out of the VM's files.
    if !target.starts_with(&root) || !target.is_dir() {
        return Err(FsError::Invalid(format!(
            "{api_path} is not a directory of the browser's filesystem"
        )));
    }
    let (sender, events) = mpsc::channel(BUFFERED_EVENTS);
    let (new_directories, created) = std::sync::mpsc::channel::<Vec<PathBuf>>();
    let event_root = root.clone();
    let handler_sender = sender.clone();
    let watcher = notify::recommended_watcher(move |result: notify::Result<notify::Event>| {
        let Ok(event) = result else { return };
        let found = translate(&event_root, &event);
        let directories: Vec<PathBuf> = found
            .iter()
            .filter(|event| recursive && event.kind == "CREATE" && event.is_dir)
            .map(|event| event_root.join(event.path.trim_start_matches('/')))
            .collect();
        for event in found {
            // A reader that fell this far behind loses events rather than memory.
            let _ = handler_sender.try_send(event);
        }
        if !directories.is_empty() {
            let _ = new_directories.send(directories);
        }
    })
    .map_err(|error| FsError::Invalid(format!("cannot watch {api_path}: {error}")))?;
    let watcher = Arc::new(Mutex::new(watcher));
    let mode = if recursive { RecursiveMode::Recursive } else { RecursiveMode::NonRecursive };
    watcher
        .lock()
        .map_err(|_| FsError::Invalid(format!("cannot watch {api_path}")))?
        .watch(&target, mode)
        .map_err(|error| FsError::Invalid(format!("cannot watch {api_path}: {error}")))?;
    if recursive {
        let (weak, root) = (Arc::downgrade(&watcher), root.clone());
        std::thread::Builder::new()
            .name("dir-watch".into())
            .spawn(move || report_contents_of_new_directories(weak, &root, created, sender))
            .map_err(|source| FsError::Io { context: "starting a watch".into(), source })?;
    }
    Ok(Watch { watcher, events })
}

/// The SDK's events for one notify event (none for kinds it has no name for).
fn translate(root: &Path, event: &notify::Event) -> Vec<WatchEvent> {
    let kind = match event.kind {
        EventKind::Create(_) => "CREATE",
        EventKind::Modify(ModifyKind::Name(_)) => "RENAME",
        EventKind::Modify(ModifyKind::Data(_)) | EventKind::Modify(ModifyKind::Any) => "WRITE",
        EventKind::Remove(_) => "DELETE",
        _ => return Vec::new(),
    };
    event
        .paths
        .iter()
        .filter_map(|path| {
            let inside = path.strip_prefix(root).ok()?;
            Some(WatchEvent {
                kind: kind.to_owned(),
                path: vm_path(inside),
                name: path
                    .file_name()
                    .map(|name| name.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                is_dir: path.is_dir()
                    || matches!(
                        event.kind,
                        EventKind::Create(CreateKind::Folder)
                            | EventKind::Remove(RemoveKind::Folder)
                    ),
            })
        })
        .collect()
}

/// Reports, as created, what new directories held before the watch reached them: inotify
/// watches a new directory only once it has seen it created, and notify places that watch
/// after its event handler has run, so the listing waits for notify's event loop to answer
/// a no-op request (it does once the watches of the events handled so far are in place).
/// An entry the watch also saw is reported twice rather than not at all. Ends with the
/// watcher (its event handler holds the other end of `created`).
fn report_contents_of_new_directories(
    watcher: Weak<Mutex<notify::RecommendedWatcher>>, root: &Path,
    created: std::sync::mpsc::Receiver<Vec<PathBuf>>, sender: mpsc::Sender<WatchEvent>,
) {
    for directories in created {
        let Some(watcher) = watcher.upgrade() else {
            return;
        };
        if let Ok(mut watcher) = watcher.lock() {
            let _ = watcher.configure(notify::Config::default());
        }
        drop(watcher);
        for event in already_inside(root, directories) {
            let _ = sender.try_send(event);
        }
    }
}

/// Everything inside `directories`, as CREATE events.
fn already_inside(root: &Path, mut pending: Vec<PathBuf>) -> Vec<WatchEvent> {
    const MOST: usize = 10_000;
    let mut found = Vec::new();
    while let Some(directory) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&directory) else {
            continue;
        };
        for entry in entries.flatten() {
            if found.len() >= MOST {
                return found;
            }
            let path = entry.path();
            let is_dir = entry.file_type().is_ok_and(|kind| kind.is_dir());
            let Ok(inside) = path.strip_prefix(root) else {
                continue;
            };
            found.push(WatchEvent {
                kind: "CREATE".to_owned(),
                path: vm_path(inside),
                name: entry.file_name().to_string_lossy().into_owned(),
                is_dir,
            });
            if is_dir {
                pending.push(path);
            }
        }
    }
    found
}

fn vm_path(inside: &Path) -> String {
    format!("/{}", PathBuf::from(inside).display())
}
