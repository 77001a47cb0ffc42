//! Extensions from the Chrome Web Store. The store's update service (the one Chromium
//! itself asks; its base URL is `--chrome-web-store-url`) answers an extension id with
//! the extension's CRX3 package: a header (magic `Cr24`, version 3, the length of a
//! signed protobuf header) followed by the ZIP of the unpacked extension. The header is
//! checked and stripped; what remains is the ZIP our extension library stores.

use std::time::Duration;

/// How long the whole download may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(60);
/// The Chromium version the update service is told we are (it picks the package for it).
const PRODUCT_VERSION: &str = "130.0.0.0";
/// Longest CRX3 header accepted (real ones are a few KiB: keys and signatures).
const MAX_HEADER_BYTES: u32 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("the Chrome Web Store has no extension {0}")]
    NotFound(String),
    #[error("the Chrome Web Store could not be reached: {0}")]
    Unavailable(String),
    #[error("the package is larger than {0} bytes")]
    TooLarge(u64),
    #[error("the store's answer is not an extension package: {0}")]
    NotAPackage(String),
}

/// A client of one store's update service.
#[derive(Debug)]
pub struct ChromeWebStore {
    client: reqwest::Client,
    base: url::Url,
    max_bytes: u64,
}

impl ChromeWebStore {
    pub fn new(base: url::Url, max_bytes: u64) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::limited(5))
            .build()?;
        Ok(Self { client, base, max_bytes })
    }

    /// The ZIP of the extension `id` (32 letters a–p) for `os` (`linux`, `mac`, `win`).
    pub async fn fetch_zip(&self, id: &str, os: &str) -> Result<Vec<u8>, FetchError> {
        let mut url = self
            .base
            .join("service/update2/crx")
            .map_err(|error| FetchError::Unavailable(error.to_string()))?;
        url.query_pairs_mut()
            .append_pair("response", "redirect")
            .append_pair("os", os)
            .append_pair("arch", "x64")
            .append_pair("prodversion", PRODUCT_VERSION)
            .append_pair("acceptformat", "crx3")
            .append_pair("x", &format!("id={id}&uc"));
        let mut response = self
            .client
            .get(url)
            .send()
            .await
            .map_err(|error| FetchError::Unavailable(error.without_url().to_string()))?;
        match response.status() {
            status if status.is_success() && status != reqwest::StatusCode::NO_CONTENT => {}
            // The update service answers an unknown id with no content or a 404.
            reqwest::StatusCode::NO_CONTENT | reqwest::StatusCode::NOT_FOUND => {
                return Err(FetchError::NotFound(id.to_owned()));
            }
            status => return Err(FetchError::Unavailable(format!("it answered {status}"))),
        }
        let mut package = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| FetchError::Unavailable(error.without_url().to_string()))?
        {
            if (package.len() + chunk.len()) as u64 > self.max_bytes {
                return Err(FetchError::TooLarge(self.max_bytes));
            }
            package.extend_from_slice(&chunk);
        }
        if package.is_empty() {
            return Err(FetchError::NotFound(id.to_owned()));
        }
        let zip_start = crx3_zip_offset(&package).map_err(FetchError::NotAPackage)?;
        package.drain(..zip_start);
        Ok(package)
    }
}

/// Where the ZIP starts in a CRX3 package, after its header is checked.
pub fn crx3_zip_offset(package: &[u8]) -> Result<usize, String> {
    let word = |at: usize| {
        package.get(at..at + 4).and_then(|bytes| bytes.try_into().ok()).map(u32::from_le_bytes)
    };
    if package.get(..4) != Some(b"Cr24".as_slice()) {
        return Err("it does not start with the CRX magic Cr24".into());
    }
    match word(4) {
        Some(3) => {}
        Some(version) => return Err(format!("CRX version {version}; only CRX3 is read")),
        None => return Err("the CRX header is cut short".into()),
    }
    let header_length = word(8).ok_or("the CRX header is cut short")?;
    if header_length > MAX_HEADER_BYTES {
        return Err(format!("a CRX header of {header_length} bytes"));
    }
    let zip_start = 12 + header_length as usize;
    if package.len() <= zip_start {
        return Err("the package ends inside its header".into());
    }
    Ok(zip_start)
}

/// The extension id a Chrome Web Store URL names (its path's last segment, 32 letters
/// a–p, as in `https://chromewebstore.google.com/detail/<name>/<id>`), or a bare id.
pub fn extension_id(url_or_id: &str) -> Option<String> {
    let is_id = |text: &str| text.len() == 32 && text.bytes().all(|b| (b'a'..=b'p').contains(&b));
    if is_id(url_or_id) {
        return Some(url_or_id.to_owned());
    }
    let url = url::Url::parse(url_or_id).ok()?;
    if !matches!(url.scheme(), "http" | "https") {
        return None;
    }
    url.path_segments()?
        .rfind(|segment| !segment.is_empty())
        .filter(|segment| is_id(segment))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crx3_header_is_checked_and_skipped() {
        let mut package = b"Cr24".to_vec();
        package.extend(3u32.to_le_bytes());
        package.extend(5u32.to_le_bytes());
        package.extend(b"head!PK\x03\x04");
        assert_eq!(crx3_zip_offset(&package), Ok(17));
        assert_eq!(&package[17..], b"PK\x03\x04");

        let mut version2 = package.clone();
        version2[4] = 2;
        assert!(crx3_zip_offset(&version2).unwrap_err().contains("version 2"));
        assert!(crx3_zip_offset(b"PK\x03\x04").is_err());
        assert!(crx3_zip_offset(&package[..15]).is_err());
        let mut huge = package.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(crx3_zip_offset(&huge).is_err());
    }

    #[test]
    fn extension_ids_come_from_store_urls() {
        let id = "cjpalhdlnbpafiamejdnhcphjbkeiagm";
        for url in [
            format!("https://chromewebstore.google.com/detail/ublock-origin/{id}"),
            format!("https://chrome.google.com/webstore/detail/ublock-origin/{id}?hl=en"),
            id.to_owned(),
        ] {
            assert_eq!(extension_id(&url).as_deref(), Some(id), "{url}");
        }
        for bad in [
            "https://chromewebstore.google.com/detail/ublock-origin",
            "https://chromewebstore.google.com/detail/cjpalhdlnbpafiamejdnhcphjbkeiagm/reviews",
            "ftp://x/cjpalhdlnbpafiamejdnhcphjbkeiagm",
            "cjpalhdlnbpafiamejdnhcphjbkeiagz",
        ] {
            assert_eq!(extension_id(bad), None, "{bad}");
        }
    }
}
