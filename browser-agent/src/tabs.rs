//! The pages (tabs) of a running Chromium, through its DevTools HTTP endpoints: which
//! it shows, and opening them again in a Chromium that replaced it (a relaunch).

use std::time::Duration;

/// The URLs of the pages (tabs) Chromium shows; none if it cannot tell.
pub async fn open_pages(devtools_port: u16) -> Vec<String> {
    let listed = async {
        let targets: Vec<serde_json::Value> = reqwest::Client::new()
            .get(format!("http://127.0.0.1:{devtools_port}/json/list"))
            .timeout(Duration::from_secs(2))
            .send()
            .await?
            .json()
            .await?;
        Ok::<_, reqwest::Error>(targets)
    };
    let targets = listed.await.unwrap_or_else(|error| {
        tracing::warn!(%error, "could not list Chromium's pages; it restarts without them");
        Vec::new()
    });
    // Listed most recently used first: the tabs are opened in the reverse order.
    let mut pages: Vec<String> = targets
        .iter()
        .filter(|target| target["type"] == "page")
        .filter_map(|target| target["url"].as_str())
        .filter(|url| url.starts_with("http://") || url.starts_with("https://"))
        .map(str::to_owned)
        .collect();
    pages.reverse();
    pages
}

/// Opens `urls` in tabs of a Chromium that just started, in place of its first tab.
/// Best effort: a page that cannot be opened is logged, not fatal.
pub async fn reopen_pages(devtools_port: u16, urls: &[String]) {
    if urls.is_empty() {
        return;
    }
    let base = format!("http://127.0.0.1:{devtools_port}/json");
    let client = reqwest::Client::new();
    let initial: Vec<serde_json::Value> = match client.get(format!("{base}/list")).send().await {
        Ok(response) => response.json().await.unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    for url in urls {
        // PUT /json/new, not a command-line URL: headless Chromium takes one at most.
        // The whole query is the URL, escaped (a `#` or `&` in it must survive).
        let escaped: String = url::form_urlencoded::byte_serialize(url.as_bytes()).collect();
        let opened = client
            .put(format!("{base}/new?{escaped}"))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status);
        if let Err(error) = opened {
            tracing::warn!(%error, "could not reopen a page after the restart");
        }
    }
    for target in initial.iter().filter(|target| target["type"] == "page") {
        if let Some(id) = target["id"].as_str() {
            let _ = client.get(format!("{base}/close/{id}")).send().await;
        }
    }
}

/// The URL of each page, by target id; none if Chromium cannot tell.
pub async fn page_urls(devtools_port: u16) -> std::collections::HashMap<String, String> {
    if devtools_port == 0 {
        return Default::default();
    }
    let listed = async {
        reqwest::Client::new()
            .get(format!("http://127.0.0.1:{devtools_port}/json/list"))
            .timeout(Duration::from_secs(2))
            .send()
            .await?
            .json::<Vec<serde_json::Value>>()
            .await
    };
    listed
        .await
        .unwrap_or_default()
        .iter()
        .filter(|target| target["type"] == "page")
        .filter_map(|target| {
            Some((target["id"].as_str()?.to_owned(), target["url"].as_str()?.to_owned()))
        })
        .collect()
}

/// Closes a page (best effort: one already closed is fine).
pub async fn close(devtools_port: u16, target_id: &str) {
    if devtools_port == 0 {
        return;
    }
    let escaped: String = url::form_urlencoded::byte_serialize(target_id.as_bytes()).collect();
    let _ = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{devtools_port}/json/close/{escaped}"))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
}
