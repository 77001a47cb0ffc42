//! Keeps keep-alive connections usable after every answer, errors included. A handler that
//! answers without reading the request's body (an unknown route, a 405, a refused key, a
//! session that is not there) leaves the rest of the body on the connection; hyper then
//! closes the connection after the answer without saying so, and a client that reuses it
//! (an SDK with retries off) fails. Small bodies are therefore read before the handler
//! runs; when a larger one is left unread, the answer says `Connection: close`.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::{Body, BodyDataStream, Bytes};
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::http::header::{CONNECTION, TRANSFER_ENCODING};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};

use crate::api::error::ApiError;
use crate::api::extract::declared_length;

/// Bodies up to this size are read before the handler runs.
const READ_AHEAD_BYTES: u64 = 64 * 1024;

pub async fn keep_connections_usable(request: Request, next: Next) -> Response {
    let declared = declared_length(request.headers());
    let chunked = request.headers().contains_key(TRANSFER_ENCODING);
    match declared {
        Some(0) | None if !chunked => return next.run(request).await,
        Some(length) if length <= READ_AHEAD_BYTES => {
            let (parts, body) = request.into_parts();
            return match axum::body::to_bytes(body, length as usize).await {
                Ok(bytes) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
                Err(error) => closing(
                    ApiError::invalid_field(format!("could not read the request body: {error}"))
                        .into_response(),
                ),
            };
        }
        _ => {}
    }
    let finished = Arc::new(AtomicBool::new(false));
    let (parts, body) = request.into_parts();
    let tracked = TrackEnd { inner: body.into_data_stream(), finished: finished.clone() };
    let response = next.run(Request::from_parts(parts, Body::from_stream(tracked))).await;
    if finished.load(Ordering::Acquire) { response } else { closing(response) }
}

fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A request body that notes when it has been read to its end.
struct TrackEnd {
    inner: BodyDataStream,
    finished: Arc<AtomicBool>,
}

impl Stream for TrackEnd {
    type Item = Result<Bytes, axum::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.inner.poll_next_unpin(cx);
        if let Poll::Ready(None) = polled {
            self.finished.store(true, Ordering::Release);
        }
        polled
    }
}
