//! The documentation's links hold: every page is in the table of contents and every entry
//! there is a page; every relative link of a page (and of the repository's README) leads
//! to a page or file that exists, and every `#anchor` to a heading of it. mdBook builds
//! the same tree in CI; these checks make a broken link fail `cargo test` first.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{Event, Parser, Tag};

use super::*;

/// Every link target of a Markdown text.
fn links(markdown: &str) -> Vec<String> {
    Parser::new_ext(markdown, options())
        .filter_map(|event| match event {
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => Some(dest_url.into_string()),
            _ => None,
        })
        .collect()
}

/// The ids the book gives a page's headings.
fn anchors(markdown: &str) -> HashSet<String> {
    let html = render(markdown, "").0;
    html.split(" id=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(str::to_owned)
        .collect()
}

/// `a/b/../c.md` as `a/c.md`; `None` when it climbs out of the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

/// The broken links of one Markdown file at `file` (relative to `root`), where `exists`
/// says whether a path under `root` is there and `page` gives a Markdown page's text.
fn broken_links(
    file: &str, markdown: &str, exists: &dyn Fn(&Path) -> bool,
    page: &dyn Fn(&Path) -> Option<String>,
) -> Vec<String> {
    let folder = Path::new(file).parent().unwrap_or(Path::new(""));
    let mut broken = Vec::new();
    for link in links(markdown) {
        if is_external(&link) {
            continue;
        }
        let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
        let target =
            if path.is_empty() { Some(PathBuf::from(file)) } else { normalize(&folder.join(path)) };
        let Some(target) = target.filter(|target| exists(target)) else {
            broken.push(format!("{file}: {link} leads nowhere"));
            continue;
        };
        if !anchor.is_empty() {
            let known = page(&target).map(|text| anchors(&text)).unwrap_or_default();
            if !known.contains(anchor) {
                broken.push(format!("{file}: {link} names no heading of {}", target.display()));
            }
        }
    }
    broken
}

#[test]
fn every_link_of_the_documentation_leads_somewhere() {
    let exists = |path: &Path| PAGES.contains_key(path.to_string_lossy().as_ref());
    let page =
        |path: &Path| PAGES.get(path.to_string_lossy().as_ref()).map(|text| text.to_string());
    let mut broken = Vec::new();
    for (file, markdown) in PAGES.iter() {
        broken.extend(broken_links(file, markdown, &exists, &page));
    }
    broken.sort();
    assert!(broken.is_empty(), "broken links in docs/: {broken:#?}");
}

#[test]
fn the_readme_links_to_what_is_there() {
    let repository = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(repository.join("README.md")).unwrap_or_default();
    let exists = |path: &Path| repository.join(path).exists();
    let page = |path: &Path| std::fs::read_to_string(repository.join(path)).ok();
    let broken = broken_links("README.md", &readme, &exists, &page);
    assert!(broken.is_empty(), "broken links in README.md: {broken:#?}");
}

#[test]
fn the_table_of_contents_holds_every_page_and_only_pages() {
    let summary = PAGES.get(SUMMARY).copied().unwrap_or_default();
    let listed: HashSet<String> = links(summary).into_iter().collect();
    let unlisted: Vec<&&str> =
        PAGES.keys().filter(|file| **file != SUMMARY && !listed.contains(**file)).collect();
    assert!(unlisted.is_empty(), "pages missing from SUMMARY.md: {unlisted:?}");
    let missing: Vec<&String> =
        listed.iter().filter(|file| !PAGES.contains_key(file.as_str())).collect();
    assert!(missing.is_empty(), "SUMMARY.md lists pages that do not exist: {missing:?}");
}

#[test]
fn addresses_are_the_books() {
    assert_eq!(source_of(""), Some(INTRODUCTION));
    assert_eq!(source_of("index.html"), Some(INTRODUCTION));
    assert_eq!(source_of("api/browsers.html"), Some("api/browsers.md"));
    assert_eq!(source_of("organizations/"), Some("organizations/README.md"));
    assert_eq!(source_of("organizations/index.html"), Some("organizations/README.md"));
    assert_eq!(source_of("SUMMARY.html"), None);
    assert_eq!(source_of("api/browsers.md"), None);
    assert_eq!(source_of("../Cargo.html"), None);
    assert_eq!(
        page_address("../isolation.md#host-admission", ""),
        "../isolation.html#host-admission"
    );
    assert_eq!(page_address("organizations/README.md", "/docs/"), "/docs/organizations/index.html");
    assert_eq!(page_address("https://kernel.sh/x.md", "/docs/"), "https://kernel.sh/x.md");
    assert_eq!(
        heading_id("Isolation of browsers (read this first)"),
        "isolation-of-browsers-read-this-first"
    );
}

#[test]
fn a_page_renders_with_its_table_links_and_title() {
    let (html, title) = render(PAGES.get("api/browsers.md").copied().unwrap_or_default(), "");
    assert_eq!(title, "Browsers");
    assert!(html.contains("<table>"), "the routes table is rendered");
    assert!(html.contains("href=\"../isolation.html\""), "links lead to the pages");
    assert!(!html.contains(".md\""), "no link is left to a Markdown file");
}
