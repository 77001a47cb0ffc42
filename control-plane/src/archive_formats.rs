//! A profile's stored ZIP re-packed, as it is streamed, into the formats today's SDK asks
//! for: a tar archive, or a tar archive compressed with zstd.

use std::io::{self, BufWriter, Read, Seek, Write};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;

/// A requested download format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TarFormat {
    Tar,
    TarZstd,
}

/// Compression level of `tar.zst` downloads: zstd's default, fast and well compressed.
const ZSTD_LEVEL: i32 = 3;

/// Writes the entries of the ZIP `source` into a tar archive (zstd-compressed for
/// `TarZstd`) on `out`. Directories, files (with their modes and times) and symlinks
/// are kept; the entries' names are taken as they are, ZIPs of profiles being ours.
pub fn zip_to_tar(source: impl Read + Seek, out: impl Write, format: TarFormat) -> io::Result<()> {
    let mut zip = zip::ZipArchive::new(source).map_err(io::Error::other)?;
    let mut out = match format {
        TarFormat::Tar => write_entries(&mut zip, out)?,
        TarFormat::TarZstd => {
            let encoder = zstd::Encoder::new(out, ZSTD_LEVEL)?;
            write_entries(&mut zip, encoder)?.finish()?
        }
    };
    out.flush()
}

fn write_entries<R: Read + Seek, W: Write>(zip: &mut zip::ZipArchive<R>, out: W) -> io::Result<W> {
    let mut tar = tar::Builder::new(out);
    for index in 0..zip.len() {
        let mut entry = zip.by_index(index).map_err(io::Error::other)?;
        let name = entry.name().map_err(io::Error::other)?.into_owned();
        let mode = entry.unix_mode().unwrap_or(if entry.is_dir() { 0o755 } else { 0o644 });
        let mut header = tar::Header::new_gnu();
        header.set_mode(mode & 0o7777);
        if let Some(time) = entry.last_modified().and_then(|t| time_of(&t)) {
            header.set_mtime(time);
        }
        if entry.is_dir() {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            tar.append_data(&mut header, &name, io::empty())?;
        } else if entry.is_symlink() {
            let mut target = String::new();
            entry.read_to_string(&mut target)?;
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            tar.append_link(&mut header, &name, target)?;
        } else {
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(entry.size());
            tar.append_data(&mut header, &name, &mut entry)?;
        }
    }
    tar.into_inner()
}

/// Seconds since the epoch of a ZIP entry's (local, second-precision) time.
fn time_of(time: &zip::DateTime) -> Option<u64> {
    let date = chrono::NaiveDate::from_ymd_opt(
        time.year().into(),
        time.month().into(),
        time.day().into(),
    )?;
    let moment =
        date.and_hms_opt(time.hour().into(), time.minute().into(), time.second().into())?;
    u64::try_from(moment.and_utc().timestamp()).ok()
}

/// A writer whose bytes go, in chunks, to a channel a response body reads.
pub struct ChannelWriter(BufWriter<ChunkSender>);

impl ChannelWriter {
    pub fn new(sender: mpsc::Sender<io::Result<Bytes>>) -> Self {
        Self(BufWriter::with_capacity(64 * 1024, ChunkSender(sender)))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

pub struct ChunkSender(mpsc::Sender<io::Result<Bytes>>);

/// How long a download may keep its converting thread waiting for the client to read.
const STALLED_CLIENT: Duration = Duration::from_secs(60);

impl Write for ChunkSender {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut chunk = Ok(Bytes::copy_from_slice(buf));
        let started = Instant::now();
        loop {
            match self.0.try_send(chunk) {
                Ok(()) => return Ok(buf.len()),
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "the download was abandoned",
                    ));
                }
                Err(mpsc::error::TrySendError::Full(_)) if started.elapsed() > STALLED_CLIENT => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client stopped reading the download",
                    ));
                }
                Err(mpsc::error::TrySendError::Full(returned)) => {
                    chunk = returned;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_zip() -> Vec<u8> {
        let mut buffer = io::Cursor::new(Vec::new());
        let mut zip = zip::ZipWriter::new(&mut buffer);
        let options = zip::write::SimpleFileOptions::default().unix_permissions(0o600);
        zip.add_directory("Default/", options).expect("dir");
        zip.start_file("Default/Cookies", options).expect("file");
        zip.write_all(b"cookie jar").expect("write");
        zip.finish().expect("finish");
        buffer.into_inner()
    }

    fn entries(tar_bytes: &[u8]) -> Vec<(String, Vec<u8>, u32)> {
        let mut archive = tar::Archive::new(tar_bytes);
        archive
            .entries()
            .expect("entries")
            .map(|entry| {
                let mut entry = entry.expect("entry");
                let name = entry.path().expect("path").display().to_string();
                let mode = entry.header().mode().expect("mode");
                let mut data = Vec::new();
                entry.read_to_end(&mut data).expect("data");
                (name, data, mode)
            })
            .collect()
    }

    #[test]
    fn a_zip_becomes_the_same_tar_plain_or_compressed() {
        let zip = sample_zip();
        let mut plain = Vec::new();
        zip_to_tar(io::Cursor::new(&zip), &mut plain, TarFormat::Tar).expect("tar");
        let expected = vec![
            ("Default/".to_owned(), Vec::new(), 0o600),
            ("Default/Cookies".to_owned(), b"cookie jar".to_vec(), 0o600),
        ];
        assert_eq!(entries(&plain), expected);
        let mut compressed = Vec::new();
        zip_to_tar(io::Cursor::new(&zip), &mut compressed, TarFormat::TarZstd).expect("tar.zst");
        assert_eq!(&compressed[..4], &[0x28, 0xb5, 0x2f, 0xfd]);
        let decompressed = zstd::decode_all(compressed.as_slice()).expect("zstd");
        assert_eq!(entries(&decompressed), expected);
    }
}
