//! Loading extensions into the running browser: the upload spooled outside the VM root,
//! installed, and Chromium restarted with them.

use std::io::Seek;

use browser_agent_proto::v1::{
    ExtensionUploadChunk, LoadExtensionsResponse, extension_upload_chunk,
};
use tokio::io::AsyncWriteExt;
use tonic::{Status, Streaming};

use super::browser::restarted;
use super::{AgentService, blocking, scratch_failed};
use crate::upload::{Part, spool};

impl AgentService {
    /// Installs the extensions of an upload (slots of ZIP data, each named) and waits
    /// until Chromium runs with them.
    pub(super) async fn load_extensions_from(
        &self, mut chunks: Streaming<ExtensionUploadChunk>,
    ) -> Result<LoadExtensionsResponse, Status> {
        use extension_upload_chunk::Kind;
        let scratch = |error: std::io::Error| Status::internal(format!("scratch file: {error}"));
        // Slot → its archive (waiting outside the VM root) and its name, in arrival order.
        let mut archives: Vec<(String, std::fs::File)> = Vec::new();
        let mut names: std::collections::HashMap<String, String> = Default::default();
        let mut current: Option<tokio::fs::File> = None;
        loop {
            let in_slot = current.is_some();
            // One slot's data at a time: `Some` begins the next slot, `None` is the commit.
            let part = |chunk: ExtensionUploadChunk| match chunk.kind {
                Some(Kind::BeginSlot(slot)) => Ok(Part::Done(Some(slot))),
                Some(Kind::Data(_)) if !in_slot => {
                    Err(Status::invalid_argument("data before begin_slot"))
                }
                Some(Kind::Data(data)) => Ok(Part::Data(data)),
                Some(Kind::Name(named)) => {
                    names.insert(named.slot, named.name);
                    Ok(Part::Skip)
                }
                Some(Kind::Commit(_)) => Ok(Part::Done(None)),
                None => Ok(Part::Skip),
            };
            let next = match current.as_mut() {
                Some(out) => spool(&mut chunks, out, part).await,
                // Before the first slot, data has nowhere to go and `part` refuses it.
                None => spool(&mut chunks, &mut tokio::io::sink(), part).await,
            }
            .map_err(|error| error.into_status("the upload ended without commit", scratch))?;
            if let Some(mut previous) = current.take() {
                previous.flush().await.map_err(scratch)?;
            }
            let Some(slot) = next else { break };
            let file = tempfile::tempfile_in(&self.scratch_dir).map_err(scratch)?;
            current = Some(tokio::fs::File::from_std(file.try_clone().map_err(scratch)?));
            archives.push((slot, file));
        }
        if archives.is_empty() {
            return Err(Status::invalid_argument("no extensions were sent"));
        }
        let mut batch = Vec::new();
        for (slot, archive) in archives {
            let name = names.remove(&slot).ok_or_else(|| {
                Status::invalid_argument(format!("the extension in slot {slot} has no name"))
            })?;
            batch.push((name, archive));
        }
        if let Some(name) = names.into_values().next() {
            return Err(Status::invalid_argument(format!("extension {name} has no zip_file")));
        }

        if batch.len() > crate::extensions::MAX_LOADED {
            return Err(Status::invalid_argument("too many extensions in one call"));
        }
        let extensions = self.extensions.clone();
        let browser = self.browser.clone();
        let (loaded, version) = blocking(move || {
            let mut archives = Vec::new();
            for (name, mut archive) in batch {
                archive.rewind().map_err(scratch_failed)?;
                archives.push((name, archive));
            }
            extensions.install(archives)
        })
        .await?;
        // Done once Chromium runs with this set or a later one (a concurrent load may
        // have restarted it with ours included). Open CDP connections end with the restart.
        restarted(
            browser,
            |s| s.extensions_version >= version,
            "Chromium did not come back with the extensions",
        )
        .await?;
        Ok(LoadExtensionsResponse { loaded })
    }
}
