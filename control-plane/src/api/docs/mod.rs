//! The documentation at `/docs`: the Markdown of the repository's `docs/` tree, compiled
//! into the binary (`build.rs`) and rendered here with pulldown-cmark, the Markdown parser
//! mdBook uses too, so a server answers its own documentation with no network and no files
//! beside it. Pages keep mdBook's addresses (`api/browsers.md` is `api/browsers.html`, a
//! folder's `README.md` its `index.html`), so links work the same in both. The pages are
//! ours and public: no key is needed, and nothing a tenant wrote is ever rendered here.

use std::collections::HashMap;
use std::sync::LazyLock;

use axum::Router;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS,
};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use pulldown_cmark::{CowStr, Event, HeadingLevel, Options, Parser, Tag, TagEnd, html};

use super::error::ApiError;
use super::extract::PathParam;
use super::state::AppState;

mod source {
    include!(concat!(env!("OUT_DIR"), "/docs_pages.rs"));
}

/// The table of contents, shown beside every page.
const SUMMARY: &str = "SUMMARY.md";
/// The page `/docs/` answers.
const INTRODUCTION: &str = "introduction.md";
const STYLE: &str = include_str!("style.css");
/// Our pages only: no script at all, style and images from here.
const POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self' data:; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/docs", get(|| async { Redirect::permanent("/docs/") }))
        .route("/docs/", get(|| async { page_response(INTRODUCTION) }))
        .route("/docs/style.css", get(style))
        .route("/docs/{*path}", get(page))
}

/// Source files by path under `docs/`.
static PAGES: LazyLock<HashMap<&'static str, &'static str>> =
    LazyLock::new(|| source::PAGES.iter().copied().collect());

/// The navigation, rendered once: SUMMARY.md with its links made absolute.
static NAVIGATION: LazyLock<String> = LazyLock::new(|| {
    let summary = PAGES.get(SUMMARY).copied().unwrap_or_default();
    // The "# Summary" title is mdBook's marker, not a part of the navigation.
    let summary = summary.trim_start().strip_prefix("# Summary").unwrap_or(summary);
    render(summary, "/docs/").0
});

async fn page(PathParam(path): PathParam<String>) -> Result<Response, ApiError> {
    let source = source_of(&path)
        .ok_or_else(|| ApiError::NotFound(format!("the documentation has no page {path:?}")))?;
    Ok(page_response(source))
}

async fn style() -> Response {
    (
        [
            (CONTENT_TYPE, "text/css; charset=utf-8"),
            (CACHE_CONTROL, "no-cache"),
            (X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        STYLE,
    )
        .into_response()
}

/// The Markdown file an address of the book names: `a/b.html` is `a/b.md`, `a/` and
/// `a/index.html` are `a/README.md`.
fn source_of(address: &str) -> Option<&'static str> {
    let address = address.trim_start_matches('/');
    let stem = if address.is_empty() || address.ends_with('/') {
        format!("{address}index")
    } else {
        address.strip_suffix(".html")?.to_owned()
    };
    let file = match stem.strip_suffix("index") {
        Some(folder) if folder.is_empty() || folder.ends_with('/') => {
            if folder.is_empty() {
                INTRODUCTION.to_owned()
            } else {
                format!("{folder}README.md")
            }
        }
        _ => format!("{stem}.md"),
    };
    PAGES.get_key_value(file.as_str()).filter(|(file, _)| **file != SUMMARY).map(|(file, _)| *file)
}

fn page_response(file: &'static str) -> Response {
    let markdown = PAGES.get(file).copied().unwrap_or_default();
    let (body, title) = render(markdown, "");
    // Relative links resolve against the page's own folder; the style is at the root.
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · Self-hosted browser service</title>\
         <link rel=\"stylesheet\" href=\"/docs/style.css\"></head><body>\
         <nav>{navigation}</nav><main>{body}</main></body></html>",
        title = escape(&title),
        navigation = *NAVIGATION,
    );
    (
        [
            (CONTENT_SECURITY_POLICY, POLICY),
            (CACHE_CONTROL, "no-cache"),
            (X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (CONTENT_TYPE, "text/html; charset=utf-8"),
        ],
        html,
    )
        .into_response()
}

/// Renders Markdown as the book does: tables, heading ids as mdBook makes them, and links
/// to `.md` files turned into the pages' addresses (prefixed with `base` when not empty).
/// Answers the HTML and the text of the first heading.
fn render(markdown: &str, base: &str) -> (String, String) {
    let mut events: Vec<Event> = Parser::new_ext(markdown, options()).collect();
    let mut title = String::new();
    let mut ids: HashMap<String, usize> = HashMap::new();
    for index in 0..events.len() {
        match &events[index] {
            Event::Start(Tag::Heading { level, .. }) => {
                let level = *level;
                let text = heading_text(&events[index + 1..]);
                if title.is_empty() && level == HeadingLevel::H1 {
                    title = text.clone();
                }
                let id = unique_id(&mut ids, heading_id(&text));
                if let Event::Start(Tag::Heading { id: slot, .. }) = &mut events[index] {
                    *slot = Some(CowStr::from(id));
                }
            }
            Event::Start(Tag::Link { dest_url, .. }) => {
                let address = page_address(dest_url, base);
                if let Event::Start(Tag::Link { dest_url, .. }) = &mut events[index] {
                    *dest_url = CowStr::from(address);
                }
            }
            _ => {}
        }
    }
    let mut out = String::new();
    html::push_html(&mut out, events.into_iter());
    (out, title)
}

fn options() -> Options {
    Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_HEADING_ATTRIBUTES
}

/// The text of a heading whose events follow.
fn heading_text(events: &[Event]) -> String {
    let mut text = String::new();
    for event in events {
        match event {
            Event::End(TagEnd::Heading(_)) => break,
            Event::Text(part) | Event::Code(part) => text.push_str(part),
            _ => {}
        }
    }
    text
}

/// mdBook's heading ids: lower case, spaces as `-`, only letters, digits, `-` and `_`.
pub(crate) fn heading_id(text: &str) -> String {
    text.trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_ascii_lowercase())
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The second heading of the same text gets `-1`, the third `-2`, as in mdBook.
fn unique_id(seen: &mut HashMap<String, usize>, id: String) -> String {
    let count = seen.entry(id.clone()).or_insert(0);
    let unique = if *count == 0 { id } else { format!("{id}-{count}") };
    *count += 1;
    unique
}

/// A link's address in the book: relative `.md` links become the pages' `.html` (a
/// folder's `README.md` its `index.html`); other links are left as they are.
fn page_address(link: &str, base: &str) -> String {
    if is_external(link) || link.starts_with('#') {
        return link.to_owned();
    }
    let (path, anchor) = match link.split_once('#') {
        Some((path, anchor)) => (path, format!("#{anchor}")),
        None => (link, String::new()),
    };
    let Some(stem) = path.strip_suffix(".md") else {
        return link.to_owned();
    };
    let stem = match stem.strip_suffix("README") {
        Some(folder) if folder.is_empty() || folder.ends_with('/') => format!("{folder}index"),
        _ => stem.to_owned(),
    };
    format!("{base}{stem}.html{anchor}")
}

fn is_external(link: &str) -> bool {
    link.contains("://") || link.starts_with("mailto:")
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod links;
