//! Agent errors as gRPC statuses, and recordings as the wire describes them.

use tonic::Status;

use crate::capture::CaptureError;
use crate::input::InputError;
use crate::processes::ProcessError;
use crate::recording::{Progress, RecordingError, RecordingInfo};
use crate::screen::ScreenError;
use browser_agent_proto::v1::RecordingState;

impl From<ProcessError> for Status {
    fn from(error: ProcessError) -> Self {
        let message = error.to_string();
        match error {
            ProcessError::Invalid(_) => Status::invalid_argument(message),
            ProcessError::TooMany => Status::resource_exhausted(message),
            ProcessError::NotFound(_) => Status::not_found(message),
            ProcessError::Conflict(_) => Status::failed_precondition(message),
            ProcessError::Failed(_) => Status::internal(message),
        }
    }
}

/// Errors that are either the caller's (`Invalid`) or the agent's (`Failed`).
macro_rules! invalid_or_failed {
    ($($error:ident),+) => {$(
        impl From<$error> for Status {
            fn from(error: $error) -> Self {
                match error {
                    $error::Invalid(message) => Status::invalid_argument(message),
                    $error::Failed(message) => Status::internal(message),
                }
            }
        }
    )+};
}
invalid_or_failed!(ScreenError, InputError, CaptureError);

impl From<RecordingError> for Status {
    fn from(error: RecordingError) -> Self {
        let message = error.to_string();
        match error {
            RecordingError::Invalid(_) => Status::invalid_argument(message),
            RecordingError::Headless
            | RecordingError::NoSound
            | RecordingError::StillRunning(_) => Status::failed_precondition(message),
            RecordingError::NotFound(_) => Status::not_found(message),
            RecordingError::Exists(_) => Status::already_exists(message),
            RecordingError::TooMany => Status::resource_exhausted(message),
            RecordingError::Failed(_) => Status::internal(message),
        }
    }
}

pub(super) fn unix_ms(at: std::time::SystemTime) -> i64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map(|since| since.as_millis() as i64)
        .unwrap_or_default()
}

pub(super) fn recording_info(info: RecordingInfo) -> browser_agent_proto::v1::RecordingInfo {
    let mut message = browser_agent_proto::v1::RecordingInfo {
        recording_id: info.id,
        started_at_unix_ms: unix_ms(info.started_at),
        ..Default::default()
    };
    let state = match info.progress {
        Progress::Recording => RecordingState::Recording,
        Progress::Finalizing => RecordingState::Finalizing,
        Progress::Finished { at, bytes, frames } => {
            message.finished_at_unix_ms = unix_ms(at);
            message.size_bytes = bytes;
            message.frames = frames;
            RecordingState::Finished
        }
        Progress::Failed { at, message: error } => {
            message.finished_at_unix_ms = unix_ms(at);
            message.error = error;
            RecordingState::Failed
        }
    };
    message.set_state(state);
    message
}
