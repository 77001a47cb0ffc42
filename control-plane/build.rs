//! Compiles the documentation (`../docs`, Markdown) into the binary, so that `/docs` is
//! served with no network and no files beside the binary: writes `docs_pages.rs`, a list
//! of every `.md` file's path (relative to `docs/`) and its text.

use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let docs = manifest.join("../docs");
    // A directory makes cargo look at every file under it.
    println!("cargo:rerun-if-changed={}", docs.display());
    let mut pages = Vec::new();
    collect(&docs, &docs, &mut pages);
    pages.sort();
    let entries: String = pages
        .iter()
        .map(|(relative, absolute)| format!("    ({relative:?}, include_str!({absolute:?})),\n"))
        .collect();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("docs_pages.rs");
    let code = format!("pub static PAGES: &[(&str, &str)] = &[\n{entries}];\n");
    if let Err(error) = std::fs::write(&out, code) {
        panic!("cannot write {}: {error}", out.display());
    }
}

fn collect(root: &Path, dir: &Path, pages: &mut Vec<(String, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(root, &path, pages);
        } else if path.extension().is_some_and(|extension| extension == "md") {
            let relative = path.strip_prefix(root).unwrap_or(&path);
            pages.push((
                relative.to_string_lossy().into_owned(),
                path.canonicalize().unwrap_or(path.clone()).to_string_lossy().into_owned(),
            ));
        }
    }
}
