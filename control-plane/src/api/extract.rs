//! A JSON body extractor whose failures are Error-shape 4xx answers that name the field
//! (axum's own `Json` rejects with plain-text bodies).

use axum::body::Bytes;
use axum::extract::multipart::{Field, Multipart, MultipartError};
use axum::extract::{FromRequest, Request};
use axum::http::HeaderMap;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use serde::de::DeserializeOwned;

use super::error::{ApiError, ErrorDetail};

pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let is_json = request
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(|value| {
                let mime = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
                mime == "application/json" || mime.ends_with("+json")
            });
        let body = Bytes::from_request(request, state).await.map_err(|rejection| {
            if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::PayloadTooLarge(format!(
                    "the request body is larger than {} bytes",
                    super::MAX_JSON_BODY_BYTES
                ))
            } else {
                ApiError::invalid_field(format!("could not read the request body: {rejection}"))
            }
        })?;
        // An empty body means "all defaults", whatever the content type says.
        let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &body };
        if is_json == Some(false) {
            return Err(ApiError::UnsupportedMediaType(
                "the request body must be JSON (content-type: application/json)".into(),
            ));
        }
        parse(body).map(JsonBody)
    }
}

pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|error| ApiError::invalid_field(format!("malformed JSON: {error}")))?;
    // Every body here is an object; serde would read a struct from an array by position.
    if value.is_array() {
        return Err(ApiError::invalid_field(
            "the request body must be a JSON object, not an array",
        ));
    }
    whole_numbers_as_integers(&mut value);
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        let message = if path == "." { inner.to_string() } else { format!("{path}: {inner}") };
        ApiError::invalid(vec![ErrorDetail::invalid_input(message)])
    })
}

/// JSON has one number type: `175.0` is the integer 175 to JSON Schema (and to
/// JavaScript clients), so integer fields take it.
fn whole_numbers_as_integers(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Number(number) => {
            let i64_range = -(2f64.powi(63))..2f64.powi(63);
            if let Some(float) = number.as_f64().filter(|_| number.is_f64())
                && float.fract() == 0.0
                && i64_range.contains(&float)
            {
                // Exact: every whole f64 in that range is an i64.
                *number = serde_json::Number::from(float as i64);
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(whole_numbers_as_integers),
        serde_json::Value::Object(fields) => {
            fields.values_mut().for_each(whole_numbers_as_integers)
        }
        _ => {}
    }
}

/// Query-string parameters; failures are Error-shape 400s naming the parameter.
pub struct QueryParams<T>(pub T);

/// Implements the extractor `$extractor<T>` of the query string alone, by `$parse`.
macro_rules! from_query {
    ($extractor:ident, $parse:expr) => {
        impl<S: Send + Sync, T: DeserializeOwned> axum::extract::FromRequestParts<S>
            for $extractor<T>
        {
            type Rejection = ApiError;

            async fn from_request_parts(
                parts: &mut axum::http::request::Parts, _state: &S,
            ) -> Result<Self, ApiError> {
                $parse(parts.uri.query().unwrap_or_default())
            }
        }
    };
}

from_query!(QueryParams, |query: &str| parse_query(query).map(QueryParams));

/// Deserializes a query string; a failure names the parameter.
fn parse_query<T: DeserializeOwned>(query: &str) -> Result<T, ApiError> {
    let deserializer =
        serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
    serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let path = error.path().to_string();
        ApiError::invalid_field(format!("query parameter {path}: {}", error.into_inner()))
    })
}

/// Path parameters; a segment that cannot be decoded is an Error-shape 400.
pub struct PathParam<T>(pub T);

impl<S, T> axum::extract::FromRequestParts<S> for PathParam<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts, state: &S,
    ) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| PathParam(value))
            .map_err(|rejection| {
                ApiError::invalid_field(format!("path: {}", rejection.body_text()))
            })
    }
}

/// A multipart/form-data body; anything else is an Error-shape 415.
pub struct MultipartBody(pub Multipart);

impl<S: Send + Sync> FromRequest<S> for MultipartBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        Multipart::from_request(request, state).await.map(MultipartBody).map_err(|rejection| {
            ApiError::UnsupportedMediaType(format!(
                "expected multipart/form-data: {}",
                rejection.body_text()
            ))
        })
    }
}

/// A request's declared body length (`Content-Length`), when it has a valid one.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse().ok())
}

/// A 413 before any of a body is read when its declared length is past `limit`. Upload
/// routes have no body limit of axum's: they count what streams in against it too.
pub fn refuse_declared_over(headers: &HeaderMap, limit: u64) -> Result<(), ApiError> {
    match declared_length(headers) {
        Some(length) if length > limit => Err(too_large(limit)),
        _ => Ok(()),
    }
}

pub fn too_large(limit: u64) -> ApiError {
    ApiError::PayloadTooLarge(format!("uploads are limited to {limit} bytes"))
}

/// A multipart part that could not be read.
pub fn unreadable_part(error: MultipartError) -> ApiError {
    ApiError::invalid_field(format!("the multipart body could not be read: {}", error.body_text()))
}

/// Reads a text part of at most `max_bytes`. Upload routes have no body limit, so an
/// unbounded text part could otherwise fill memory.
pub async fn capped_text(
    field: &mut Field<'_>, label: &str, max_bytes: usize,
) -> Result<String, ApiError> {
    let mut text = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(unreadable_part)? {
        text.extend_from_slice(&chunk);
        if text.len() > max_bytes {
            return Err(ApiError::invalid_field(format!(
                "{label} is longer than {max_bytes} bytes"
            )));
        }
    }
    String::from_utf8(text).map_err(|_| ApiError::invalid_field(format!("{label} is not UTF-8")))
}

/// Query-string parameters plus tag filters in the SDK's deepObject style
/// (`tags[team]=backend&tags[env]=staging`), which plain form decoding cannot express.
pub struct TaggedQuery<T> {
    pub params: T,
    pub tags: std::collections::BTreeMap<String, String>,
}

from_query!(TaggedQuery, tagged_query);

fn tagged_query<T: DeserializeOwned>(query: &str) -> Result<TaggedQuery<T>, ApiError> {
    let mut tags = std::collections::BTreeMap::new();
    let mut rest = Vec::new();
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        match name.strip_prefix("tags[").and_then(|key| key.strip_suffix(']')) {
            Some(key) => {
                tags.insert(key.to_owned(), value.into_owned());
            }
            None => rest.push((name, value)),
        }
    }
    let rest = form_urlencoded::Serializer::new(String::new()).extend_pairs(rest).finish();
    Ok(TaggedQuery { params: parse_query(&rest)?, tags })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Point {
        x: i64,
        scale: f64,
    }

    #[test]
    fn whole_numbers_are_integers_and_fractions_are_not() {
        let point: Point = parse(br#"{"x": 175.0, "scale": 2}"#).expect("whole numbers");
        assert_eq!(point, Point { x: 175, scale: 2.0 });
        assert!(parse::<Point>(br#"{"x": 175.5, "scale": 1}"#).is_err());
        assert!(parse::<Point>(br#"{"x": 1e300, "scale": 1}"#).is_err());
        assert!(parse::<Point>(b"{").is_err());
        assert!(parse::<Point>(b"[1, 2]").is_err());
    }
}
