//! `POST /browsers/{id}/fs/upload`: several files in one multipart request, each with its
//! destination, as both SDKs send them: today's by index (`files[0][dest_path]`,
//! `files[0][file]`, …), the seed-era SDK by position (`files[][dest_path]`,
//! `files[][file]`: the n-th file goes to the n-th destination).

use std::collections::{BTreeMap, BTreeSet};

use axum::http::{HeaderMap, StatusCode};
use browser_agent_proto::v1::WriteFileTarget;
use futures::StreamExt;

use utoipa::ToSchema;

use super::fs::{MAX_PATH_BYTES, require_path, write_whole_file};
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::{
    MultipartBody, PathParam, capped_text, refuse_declared_over, unreadable_part,
};
use crate::api::org::Org;

/// Most files one upload may hold.
pub const MAX_UPLOAD_FILES: usize = 100;
/// The mode of uploaded files, as `write_file` gives them by default.
const UPLOADED_FILE_MODE: u32 = 0o644;

/// `files[<index>][<field>]` or `files[][<field>]` (index `None`: by position), the name
/// of an upload's part.
fn indexed_part(name: &str) -> Option<(Option<usize>, &str)> {
    let rest = name.strip_prefix("files[")?;
    let (index, rest) = rest.split_once("][")?;
    let index = match index {
        "" => None,
        index => Some(index.parse().ok()?),
    };
    Some((index, rest.strip_suffix(']')?))
}

/// Gives parts named by position the index of their turn, and refuses a mix of both
/// styles (their indices would collide).
#[derive(Default)]
struct Positions {
    destinations: usize,
    files: usize,
    indexed: bool,
    positional: bool,
}

impl Positions {
    fn index(&mut self, given: Option<usize>, part: &str) -> Result<usize, ApiError> {
        match given {
            Some(_) => self.indexed = true,
            None => self.positional = true,
        }
        if self.indexed && self.positional {
            return Err(ApiError::invalid_field(
                "files: parts are named either by index (files[0][file]) or by position \
                 (files[][file]), not both",
            ));
        }
        Ok(match (given, part) {
            (Some(index), _) => index,
            (None, "file") => post_increment(&mut self.files),
            (None, _) => post_increment(&mut self.destinations),
        })
    }
}

fn post_increment(counter: &mut usize) -> usize {
    *counter += 1;
    *counter - 1
}

/// The parts of `POST /browsers/{id}/fs/upload`, by position (described for the
/// OpenAPI document).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct UploadForm {
    /// Absolute path of the file in the browser's filesystem.
    #[schema(rename = "files[][dest_path]", pattern = "^/")]
    dest_path: String,
    #[schema(rename = "files[][file]", value_type = String, format = Binary)]
    file: Vec<u8>,
}

/// Upload files: each `files[i][file]` is written to its `files[i][dest_path]` (which must
/// come first in the body, as the SDKs send it), confined to the browser's filesystem
/// like `write_file`. Files are written in order, each whole or not at all; an error
/// names the failing file, and the files before it stay written.
#[utoipa::path(post, path = "/browsers/{id}/fs/upload",
    request_body(content = UploadForm, content_type = "multipart/form-data", description = "parts `files[][dest_path]` and `files[][file]`, paired by position (or `files[N][…]` by index)"),
    responses((status = 200, description = "Every file was written"),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn upload(
    org: Org, PathParam(id): PathParam<String>, headers: HeaderMap,
    MultipartBody(mut multipart): MultipartBody,
) -> Result<StatusCode, ApiError> {
    let limit = org.settings.max_upload_bytes;
    refuse_declared_over(&headers, limit)?;
    let agent = org.agent(&id).await?;
    let mut destinations = BTreeMap::new();
    let mut written = BTreeSet::new();
    let mut total = 0;
    let mut positions = Positions::default();
    while let Some(mut field) = multipart.next_field().await.map_err(unreadable_part)? {
        let name = field.name().unwrap_or_default().to_owned();
        let Some((given, part)) = indexed_part(&name) else {
            return Err(ApiError::invalid_field(format!(
                "unexpected multipart part {name:?} (expected files[i][dest_path] and files[i][file])"
            )));
        };
        let index = positions.index(given, part)?;
        if index >= MAX_UPLOAD_FILES {
            return Err(ApiError::invalid_field(format!(
                "files: at most {MAX_UPLOAD_FILES} files per upload"
            )));
        }
        match part {
            "dest_path" => {
                let label = format!("files[{index}][dest_path]");
                let path = capped_text(&mut field, &label, MAX_PATH_BYTES).await?;
                destinations.insert(index, require_path(&label, Some(path))?);
            }
            "file" => {
                let Some(path) = destinations.get(&index).cloned() else {
                    return Err(ApiError::invalid_field(format!(
                        "files[{index}][dest_path] must come before files[{index}][file]"
                    )));
                };
                if !written.insert(index) {
                    return Err(ApiError::invalid_field(format!(
                        "files[{index}][file] is given twice"
                    )));
                }
                let target = WriteFileTarget { path, mode: UPLOADED_FILE_MODE };
                let chunks = field.map(|chunk| chunk.map_err(unreadable_part));
                write_whole_file(agent.clone(), target, chunks, &mut total, limit)
                    .await
                    .map_err(|error| error.prefixed(&format!("files[{index}]: ")))?;
            }
            other => {
                return Err(ApiError::invalid_field(format!(
                    "unexpected multipart part files[{index}][{other}]"
                )));
            }
        }
    }
    if let Some(index) = destinations.keys().find(|index| !written.contains(index)) {
        return Err(ApiError::invalid_field(format!("files[{index}][file] is missing")));
    }
    if written.is_empty() {
        return Err(ApiError::invalid_field("files: at least one file is required"));
    }
    Ok(StatusCode::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_pair_by_index() {
        assert_eq!(indexed_part("files[0][dest_path]"), Some((Some(0), "dest_path")));
        assert_eq!(indexed_part("files[12][file]"), Some((Some(12), "file")));
        assert_eq!(indexed_part("files[][file]"), Some((None, "file")));
        assert_eq!(indexed_part("files[x][file]"), None);
        assert_eq!(indexed_part("file"), None);
        let mut positions = Positions::default();
        let turns: Vec<usize> = ["dest_path", "dest_path", "file", "file"]
            .iter()
            .map(|part| positions.index(None, part).expect("positional"))
            .collect();
        assert_eq!(turns, [0, 1, 0, 1]);
        assert!(positions.index(Some(0), "file").is_err());
    }
}
