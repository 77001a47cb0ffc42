//! The one error type of the HTTP API, and the one place where service errors become HTTP. Every failure becomes the Error shape
//! `{code, message, details?}`; 5xx bodies are generic and the cause goes to the log.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::agent::AgentError;
use crate::error::ServiceError;
use crate::store::StoreError;

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// Machine-readable error code, such as `bad_request` or `not_found`.
    pub code: String,
    /// Human-readable description.
    pub message: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<ErrorDetail>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

impl ErrorDetail {
    /// A validation problem; the message names the field.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self { code: "invalid_input".into(), message: message.into() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{message}")]
    BadRequest { message: String, details: Vec<ErrorDetail> },
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    RangeNotSatisfiable(String),
    #[error("{0}")]
    PreconditionFailed(String),
    /// A limit of the organization; `Retry-After` says when to try again (the SDKs do).
    #[error("{message}")]
    TooManyRequests { message: String, retry_after: std::time::Duration },
    #[error("{0}")]
    AgentUnavailable(String),
    /// A service this server relies on (the Chrome Web Store) failed.
    #[error("{0}")]
    BadGateway(String),
    #[error("{0}")]
    Timeout(String),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl ApiError {
    /// A 400 with one `invalid_input` detail per problem.
    pub fn invalid(details: Vec<ErrorDetail>) -> Self {
        let message = match details.as_slice() {
            [only] => only.message.clone(),
            _ => "the request has invalid fields".into(),
        };
        Self::BadRequest { message, details }
    }

    pub fn invalid_field(message: impl Into<String>) -> Self {
        Self::invalid(vec![ErrorDetail::invalid_input(message)])
    }

    /// The same error with its message (and a 400's details) starting with `prefix`,
    /// such as the part of a request it is about. Internal errors are left as they are.
    pub fn prefixed(self, prefix: &str) -> Self {
        let with = |message: String| format!("{prefix}{message}");
        match self {
            Self::BadRequest { message, details } => Self::BadRequest {
                message: with(message),
                details: details
                    .into_iter()
                    .map(|detail| ErrorDetail { message: with(detail.message), ..detail })
                    .collect(),
            },
            Self::Unauthorized(m) => Self::Unauthorized(with(m)),
            Self::Forbidden(m) => Self::Forbidden(with(m)),
            Self::NotFound(m) => Self::NotFound(with(m)),
            Self::MethodNotAllowed(m) => Self::MethodNotAllowed(with(m)),
            Self::Conflict(m) => Self::Conflict(with(m)),
            Self::PayloadTooLarge(m) => Self::PayloadTooLarge(with(m)),
            Self::UnsupportedMediaType(m) => Self::UnsupportedMediaType(with(m)),
            Self::RangeNotSatisfiable(m) => Self::RangeNotSatisfiable(with(m)),
            Self::PreconditionFailed(m) => Self::PreconditionFailed(with(m)),
            Self::TooManyRequests { message, retry_after } => {
                Self::TooManyRequests { message: with(message), retry_after }
            }
            Self::AgentUnavailable(m) => Self::AgentUnavailable(with(m)),
            Self::BadGateway(m) => Self::BadGateway(with(m)),
            Self::Timeout(m) => Self::Timeout(with(m)),
            Self::Internal(error) => Self::Internal(error),
        }
    }

    /// A 400 naming every problem.
    pub fn invalid_fields(problems: Vec<String>) -> Self {
        Self::invalid(problems.into_iter().map(ErrorDetail::invalid_input).collect())
    }

    /// A 404 for a `kind` (`"proxy"`, `"browser session"`, …) the caller has none of by
    /// this id or name.
    pub fn not_found(kind: &str, id: &str) -> Self {
        Self::NotFound(format!("{kind} {id} not found"))
    }

    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BadRequest { .. } => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Self::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Self::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Self::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            Self::PreconditionFailed(_) => (StatusCode::PRECONDITION_FAILED, "precondition_failed"),
            Self::TooManyRequests { .. } => (StatusCode::TOO_MANY_REQUESTS, "limit_reached"),
            Self::RangeNotSatisfiable(_) => {
                (StatusCode::RANGE_NOT_SATISFIABLE, "range_not_satisfiable")
            }
            Self::AgentUnavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "agent_unavailable"),
            Self::BadGateway(_) => (StatusCode::BAD_GATEWAY, "bad_gateway"),
            Self::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
        }
    }
}

/// A lookup's `None` as the 404 of what was looked for.
pub trait OrNotFound<T> {
    fn or_not_found(self, kind: &str, id: &str) -> Result<T, ApiError>;
}

impl<T> OrNotFound<T> for Option<T> {
    fn or_not_found(self, kind: &str, id: &str) -> Result<T, ApiError> {
        self.ok_or_else(|| ApiError::not_found(kind, id))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let retry_after = match &self {
            Self::TooManyRequests { retry_after, .. } => Some(retry_after.as_secs().max(1)),
            _ => None,
        };
        let (message, details) = match self {
            Self::BadRequest { message, details } => (message, details),
            Self::Internal(error) => {
                tracing::error!(error = format!("{error:#}"), "internal error");
                ("internal server error".to_owned(), Vec::new())
            }
            other => {
                if status.is_server_error() {
                    tracing::warn!(error = %other, "request failed");
                }
                (other.to_string(), Vec::new())
            }
        };
        let mut response =
            (status, Json(ErrorBody { code: code.into(), message, details })).into_response();
        if let Some(seconds) = retry_after {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

impl From<ServiceError> for ApiError {
    fn from(error: ServiceError) -> Self {
        match error {
            ServiceError::Invalid(problems) => {
                Self::invalid(problems.into_iter().map(ErrorDetail::invalid_input).collect())
            }
            ServiceError::NotFound(message) => Self::NotFound(message),
            ServiceError::Conflict(message) => Self::Conflict(message),
            ServiceError::Forbidden(message) => Self::Forbidden(message),
            ServiceError::Unavailable(message) => Self::AgentUnavailable(message),
            ServiceError::Timeout(message) => Self::Timeout(message),
            ServiceError::LimitReached { message, retry_after } => {
                Self::TooManyRequests { message, retry_after }
            }
            ServiceError::Internal(error) => Self::Internal(error),
        }
    }
}

// Handlers that read the store or call an agent directly get the same mapping as the
// services give.
impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        ServiceError::from(error).into()
    }
}

impl From<AgentError> for ApiError {
    fn from(error: AgentError) -> Self {
        ServiceError::from(error).into()
    }
}
