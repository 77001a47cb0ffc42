//! Watching a directory of the VM for changes (`fs/watch`): inotify through the `notify`
//! crate, its events turned into the SDK's CREATE, WRITE, DELETE and RENAME with VM paths.

use std::path::{Path, PathBuf};

use browser_agent_proto::v1::WatchEvent;
use notify::event::{CreateKind, EventKind, ModifyKind, RemoveKind};
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::fs::{FsError, relative};

/// Events buffered for a slow reader before the watch gives up on it.
const BUFFERED_EVENTS: usize = 1024;

/// A running watch: events arrive on `events` while `watcher` lives.
pub struct Watch {
    pub watcher: notify::RecommendedWatcher,
    pub events: mpsc::Receiver<WatchEvent>,
}

/// Starts watching `api_path` (a directory inside `vm_root`).
pub fn start(vm_root: &Path, api_path: &str, recursive: bool) -> Result<Watch, FsError> {
    let resolved = |path: PathBuf| {
        path.canonicalize().map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => FsError::NotFound(api_path.to_owned()),
            _ => FsError::Io {
                context: format!("resolving {api_path}"),
                source,
            },
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
    let event_root = root.clone();
    let mut watcher = notify::recommended_watcher(move |result: notify::Result<notify::Event>| {
        let Ok(event) = result else { return };
        let mut found = translate(&event_root, &event);
        if recursive {
            found.extend(already_inside(&event_root, &found));
        }
        for event in found {
            // A reader that fell this far behind loses events rather than memory.
            let _ = sender.try_send(event);
        }
    })
    .map_err(|error| FsError::Invalid(format!("cannot watch {api_path}: {error}")))?;
    let mode = if recursive {
        RecursiveMode::Recursive
    } else {
        RecursiveMode::NonRecursive
    };
    watcher
        .watch(&target, mode)
        .map_err(|error| FsError::Invalid(format!("cannot watch {api_path}: {error}")))?;
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

/// Entries made in a new directory before the watch could be placed on it (inotify
/// watches a new directory only once it has seen it created), reported as created. An
/// entry the watch also saw is reported twice rather than not at all.
fn already_inside(root: &Path, events: &[WatchEvent]) -> Vec<WatchEvent> {
    const MOST: usize = 10_000;
    let mut found = Vec::new();
    let mut pending: Vec<PathBuf> = events
        .iter()
        .filter(|event| event.kind == "CREATE" && event.is_dir)
        .map(|event| root.join(event.path.trim_start_matches('/')))
        .collect();
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
