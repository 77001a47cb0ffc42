//! Log streams (`/browsers/{id}/logs/stream`): a file of the VM read line by line and,
//! with `follow`, followed like `tail -f` (appends as they come, a truncated file from its
//! start again).

use std::io::{Read, Seek, SeekFrom};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// A stream starts this far from the end of a longer file (at a line start).
pub const MAX_BACKLOG: u64 = 1024 * 1024;
/// Longer lines are cut into pieces of this size.
const MAX_LINE: usize = 64 * 1024;
/// How often a followed file is looked at for more.
const POLL: Duration = Duration::from_millis(100);

/// A line, and when it was read (milliseconds since the epoch).
pub type Line = (String, i64);

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as i64)
}

/// Sends the file's lines (its last `MAX_BACKLOG` bytes first) to the returned receiver,
/// then, with `follow`, what is appended, until the receiver is dropped or `shutdown`.
/// Reads on a blocking thread of its own.
pub fn follow_file(
    mut file: std::fs::File, follow: bool, shutdown: CancellationToken,
) -> mpsc::Receiver<Line> {
    let (sender, receiver) = mpsc::channel(256);
    tokio::task::spawn_blocking(move || {
        let length = file.metadata().map(|m| m.len()).unwrap_or(0);
        let mut offset = length.saturating_sub(MAX_BACKLOG);
        // Started mid-file: the partial first line is skipped.
        let mut skip_partial = offset > 0;
        let mut pending: Vec<u8> = Vec::new();
        let mut buffer = vec![0u8; 64 * 1024];
        if file.seek(SeekFrom::Start(offset)).is_err() {
            return;
        }
        loop {
            if shutdown.is_cancelled() || sender.is_closed() {
                return;
            }
            let read = match file.read(&mut buffer) {
                Ok(read) => read,
                Err(_) => return,
            };
            if read > 0 {
                offset += read as u64;
                pending.extend_from_slice(&buffer[..read]);
                while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = pending.drain(..=end).collect();
                    if std::mem::take(&mut skip_partial) {
                        continue;
                    }
                    if !send(&sender, &line[..line.len() - 1]) {
                        return;
                    }
                }
                if pending.len() >= MAX_LINE {
                    let piece: Vec<u8> = pending.drain(..MAX_LINE).collect();
                    if !send(&sender, &piece) {
                        return;
                    }
                }
                continue;
            }
            // At the end.
            if !follow {
                if !pending.is_empty() && !skip_partial {
                    send(&sender, &pending);
                }
                return;
            }
            // Truncated (rotated in place, rewritten): from its start again.
            if file.metadata().is_ok_and(|m| m.len() < offset) {
                offset = 0;
                pending.clear();
                skip_partial = false;
                if file.seek(SeekFrom::Start(0)).is_err() {
                    return;
                }
            }
            std::thread::sleep(POLL);
        }
    });
    receiver
}

/// False once the receiver is gone.
fn send(sender: &mpsc::Sender<Line>, line: &[u8]) -> bool {
    let text = String::from_utf8_lossy(line);
    let text = text.strip_suffix('\r').unwrap_or(&text).to_owned();
    sender.blocking_send((text, now_ms())).is_ok()
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    async fn next(receiver: &mut mpsc::Receiver<Line>) -> Option<String> {
        tokio::time::timeout(Duration::from_secs(2), receiver.recv())
            .await
            .ok()
            .flatten()
            .map(|(line, _)| line)
    }

    #[tokio::test]
    async fn lines_then_appends_then_a_truncated_file_from_its_start() {
        let mut file = tempfile::NamedTempFile::new().expect("file");
        file.write_all(b"one\ntwo\npartial").expect("write");
        let mut lines = follow_file(file.reopen().expect("reopen"), true, CancellationToken::new());
        assert_eq!(next(&mut lines).await.as_deref(), Some("one"));
        assert_eq!(next(&mut lines).await.as_deref(), Some("two"));
        file.write_all(b" line\nthree\n").expect("append");
        assert_eq!(next(&mut lines).await.as_deref(), Some("partial line"));
        assert_eq!(next(&mut lines).await.as_deref(), Some("three"));
        file.as_file().set_len(0).expect("truncate");
        file.as_file_mut().seek(SeekFrom::Start(0)).expect("rewind");
        tokio::time::sleep(POLL * 3).await;
        writeln!(file.as_file(), "again").expect("write");
        assert_eq!(next(&mut lines).await.as_deref(), Some("again"));
    }

    #[tokio::test]
    async fn without_follow_the_stream_ends_with_the_file() {
        let mut file = tempfile::NamedTempFile::new().expect("file");
        file.write_all(b"a\nb").expect("write");
        let mut lines =
            follow_file(file.reopen().expect("reopen"), false, CancellationToken::new());
        assert_eq!(next(&mut lines).await.as_deref(), Some("a"));
        assert_eq!(next(&mut lines).await.as_deref(), Some("b"));
        assert_eq!(lines.recv().await, None);
    }
}
