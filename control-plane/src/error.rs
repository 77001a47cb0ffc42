//! The one error type of the services. It says what went wrong in the domain's terms; the
//! HTTP layer maps it to a status and the Error shape in one place (`api::error`).

use crate::agent::AgentError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The caller's input is wrong; one message per problem, each naming its field.
    #[error("{}", invalid_summary(.0))]
    Invalid(Vec<String>),
    /// The resource does not exist for this organization (foreign ones neither).
    #[error("{0}")]
    NotFound(String),
    /// The resource's current state does not allow the operation (or a name is taken).
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Forbidden(String),
    /// A browser's agent (or the browser itself) cannot be reached now.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Timeout(String),
    /// The organization is at one of its limits; it may try again after `retry_after`.
    #[error("{message}")]
    LimitReached { message: String, retry_after: std::time::Duration },
    /// A bug or a broken dependency; the details go to the log, never to the caller.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

pub type ServiceResult<T> = Result<T, ServiceError>;

fn invalid_summary(problems: &[String]) -> String {
    match problems {
        [only] => only.clone(),
        _ => "the request has invalid fields".into(),
    }
}

impl ServiceError {
    /// One invalid field; the message names it.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::Invalid(vec![message.into()])
    }

    pub fn internal(message: impl std::fmt::Display) -> Self {
        Self::Internal(anyhow::anyhow!("{message}"))
    }
}

impl From<StoreError> for ServiceError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Conflict(message) => Self::Conflict(message),
            StoreError::Backend(message) => Self::internal(format!("store: {message}")),
            StoreError::Busy(message) => Self::LimitReached {
                message: format!("the service is busy ({message}); retry"),
                retry_after: std::time::Duration::from_secs(1),
            },
        }
    }
}

impl From<AgentError> for ServiceError {
    fn from(error: AgentError) -> Self {
        match error {
            AgentError::Unavailable(message) => Self::Unavailable(message),
            AgentError::Timeout(message) => Self::Timeout(message),
            AgentError::InvalidArgument(message) => Self::invalid(message),
            AgentError::NotFound(message) => Self::NotFound(message),
            AgentError::Conflict(message) => Self::Conflict(message),
            AgentError::Forbidden(message) => Self::Forbidden(message),
            AgentError::Internal(message) => Self::internal(format!("agent: {message}")),
        }
    }
}

/// Runs `work` to its end in a task of its own and answers its outcome. For operations
/// that must not stop halfway when their caller goes away (a client disconnects, a
/// request times out): ending a browser, launching one, finishing a recording.
pub async fn run_to_completion<T: Send + 'static>(
    work: impl Future<Output = ServiceResult<T>> + Send + 'static,
) -> ServiceResult<T> {
    tokio::spawn(work)
        .await
        .map_err(|error| ServiceError::internal(format!("task failed: {error}")))?
}
