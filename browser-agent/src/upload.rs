//! Client-streamed uploads, written to a spool file as they arrive so that no upload is
//! ever whole in memory. Each handler says what its messages mean and words the failures
//! its own way; the loop over the stream is this one.

use futures::{Stream, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tonic::Status;

/// What one upload message means to the spool.
pub enum Part<T> {
    /// Bytes to append to the spool.
    Data(Vec<u8>),
    /// The message that ends this spool, with what the handler took from it.
    Done(T),
    /// Nothing to append; the handler has taken what it needs from the message.
    Skip,
}

/// Why spooling stopped before its last message.
#[derive(Debug)]
pub enum SpoolError {
    /// The client's stream failed, or the handler refused a message.
    Refused(Status),
    /// The stream ended before the message that ends the spool.
    Ended,
    /// Writing to the spool failed.
    Write(std::io::Error),
}

impl SpoolError {
    /// The client's own errors as they are; an early end as an invalid argument saying
    /// `ended`; a failed write as `write` words it.
    pub fn into_status(
        self, ended: &'static str, write: impl FnOnce(std::io::Error) -> Status,
    ) -> Status {
        match self {
            SpoolError::Refused(status) => status,
            SpoolError::Ended => Status::invalid_argument(ended),
            SpoolError::Write(error) => write(error),
        }
    }
}

/// Appends the data of `chunks` to `out` until `part` finds the message that ends the
/// spool, and returns what it took from that message. `out` is left unflushed: handlers
/// word a failed flush differently from a failed write.
pub async fn spool<M, T>(
    chunks: &mut (impl Stream<Item = Result<M, Status>> + Unpin),
    out: &mut (impl AsyncWrite + Unpin), mut part: impl FnMut(M) -> Result<Part<T>, Status>,
) -> Result<T, SpoolError> {
    while let Some(message) = chunks.next().await {
        match part(message.map_err(SpoolError::Refused)?).map_err(SpoolError::Refused)? {
            Part::Data(data) => out.write_all(&data).await.map_err(SpoolError::Write)?,
            Part::Done(value) => return Ok(value),
            Part::Skip => {}
        }
    }
    Err(SpoolError::Ended)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages of a made-up upload: `Some(bytes)` is data, `None` ends it.
    fn part(message: Option<&'static [u8]>) -> Result<Part<&'static str>, Status> {
        Ok(match message {
            Some(b"skip") => Part::Skip,
            Some(b"refuse") => return Err(Status::invalid_argument("refused")),
            Some(data) => Part::Data(data.to_vec()),
            None => Part::Done("done"),
        })
    }

    async fn run(
        messages: Vec<Result<Option<&'static [u8]>, Status>>,
    ) -> (Result<&'static str, SpoolError>, Vec<u8>) {
        let mut chunks = futures::stream::iter(messages);
        let mut out = Vec::new();
        let result = spool(&mut chunks, &mut out, part).await;
        (result, out)
    }

    #[tokio::test]
    async fn data_is_spooled_until_the_message_that_ends_it() {
        let (result, out) = run(vec![
            Ok(Some(b"ab")),
            Ok(Some(b"skip")),
            Ok(Some(b"cd")),
            Ok(None),
            Ok(Some(b"after")),
        ])
        .await;
        assert_eq!(result.expect("spooled"), "done");
        assert_eq!(out, b"abcd");
    }

    #[tokio::test]
    async fn refusals_stream_errors_and_early_ends_stop_the_spool() {
        let (result, _) = run(vec![Ok(Some(b"ab")), Ok(Some(b"refuse"))]).await;
        assert!(matches!(result, Err(SpoolError::Refused(s)) if s.message() == "refused"));
        let (result, _) = run(vec![Err(Status::cancelled("gone"))]).await;
        assert!(matches!(result, Err(SpoolError::Refused(s)) if s.message() == "gone"));
        let (result, out) = run(vec![Ok(Some(b"ab"))]).await;
        assert!(matches!(result, Err(SpoolError::Ended)));
        assert_eq!(out, b"ab");
    }
}
