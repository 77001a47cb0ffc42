//! `GET /extensions/from_chrome_store`: an extension of the Chrome Web Store, as the ZIP
//! of its unpacked files (what the SDK's `download_from_chrome_store` returns). The
//! package is also kept in the organization's library under the extension's id, so
//! browsers can load it by that name; an extension already stored under it stays.

use axum::body::Body;
use axum::response::Response;
use serde::Deserialize;
use utoipa::IntoParams;

use super::extensions::store_archive;
use crate::api::error::{ApiError, ErrorBody};
use crate::api::extract::QueryParams;
use crate::api::org::Org;
use crate::chrome_store::{FetchError, extension_id};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct FromChromeStoreQuery {
    /// The extension's Chrome Web Store URL
    /// (`https://chromewebstore.google.com/detail/<name>/<id>`) or its 32-letter id.
    // The host part is `openapi::HOST` spelled out (the attribute takes a literal only);
    // a test in `openapi` keeps the two equal.
    #[param(
        pattern = r#"^[a-p]{32}$|^https?://(?:(?:[A-Za-z0-9-]+\.)*[A-Za-z][A-Za-z0-9-]*|(?:(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9]))(?::[0-9]{1,4})?(?:/[!"$-.0-9:->@-~]*)*/[a-p]{32}/?(?:[?#][!-~]*)?$"#
    )]
    pub url: String,
    /// The package's operating system: `linux` (default), `mac` or `win`.
    #[param(pattern = "^(linux|mac|win)$")]
    pub os: Option<String>,
}

/// Download an extension from the Chrome Web Store (through `--chrome-web-store-url`):
/// its CRX3 package's header is checked and stripped, and the ZIP inside is answered and
/// kept in the library under the extension's id.
#[utoipa::path(get, path = "/extensions/from_chrome_store", params(FromChromeStoreQuery),
    responses((status = 200, description = "The unpacked extension as a ZIP", content_type = "application/zip", body = Vec<u8>),
        (status = 404, description = "The store has no such extension", body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 502, description = "The store could not be reached, or answered no package", body = ErrorBody)))]
pub async fn from_chrome_store(
    org: Org, QueryParams(query): QueryParams<FromChromeStoreQuery>,
) -> Result<Response, ApiError> {
    let id = extension_id(&query.url).ok_or_else(|| {
        ApiError::invalid_field(
            "url: not a Chrome Web Store extension URL (…/detail/<name>/<id>) or extension id",
        )
    })?;
    let os = query.os.unwrap_or_else(|| "linux".into());
    if !matches!(os.as_str(), "linux" | "mac" | "win") {
        return Err(ApiError::invalid_field(format!("os must be linux, mac or win, got {os:?}")));
    }
    let zip =
        org.settings.chrome_web_store.fetch_zip(&id, &os).await.map_err(|error| match error {
            FetchError::NotFound(_) => ApiError::NotFound(error.to_string()),
            FetchError::TooLarge(_) => ApiError::PayloadTooLarge(error.to_string()),
            FetchError::Unavailable(_) | FetchError::NotAPackage(_) => {
                ApiError::BadGateway(error.to_string())
            }
        })?;

    // Kept in the library unless an extension of that name is there already.
    if org.store.extension(&org.id, &id).await?.is_none() {
        let temporary = org.blobs.incoming().map_err(|error| ApiError::Internal(error.into()))?;
        tokio::fs::write(temporary.path(), &zip)
            .await
            .map_err(|error| ApiError::Internal(error.into()))?;
        let stored =
            store_archive(org.clone(), Some(id.clone()), temporary, zip.len() as u64).await;
        match stored {
            // Stored meanwhile by a concurrent download: the same package.
            Ok(_) | Err(ApiError::Conflict(_)) => {}
            // Not an extension (no manifest): the store's answer was not what it says.
            Err(ApiError::BadRequest { message, .. }) => {
                return Err(ApiError::BadGateway(format!(
                    "the store's package is not an extension: {message}"
                )));
            }
            Err(other) => return Err(other),
        }
    }
    let length = zip.len() as i64;
    Ok(crate::api::zip_attachment(&format!("{id}.zip"), Some(length), Body::from(zip)))
}
