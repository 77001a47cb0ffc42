//! The modules of each crate import in one direction only: no circle of `use crate::…`,
//! `super::…` and `self::…` references between files, and no Rust file over 800 lines.
//!
//! A file is a node. It depends on the file of every module it names (the longest prefix of
//! a path that is a module), except its own descendants: a parent composes its children
//! (declares them, mounts their routes), which is the tree, not a circle. Comments and
//! string literals are left out, so a doc comment naming a path is no dependency.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The crates checked, each with its root file (the module `crate`).
const CRATES: [(&str, &str); 2] = [("control-plane", "lib.rs"), ("browser-agent", "main.rs")];

const MAX_LINES: usize = 800;

type Module = Vec<String>;

#[test]
fn no_module_imports_in_a_circle() {
    let mut report = Vec::new();
    for (krate, root) in CRATES {
        let graph = dependency_graph(&source_dir(krate), root);
        for circle in circles(&graph) {
            // Each file of the circle with the files of the circle it names.
            let edges: Vec<String> = circle
                .iter()
                .map(|module| {
                    let named: Vec<String> = graph[module]
                        .iter()
                        .filter(|target| circle.contains(target))
                        .map(display)
                        .collect();
                    format!("  {} → {}", display(module), named.join(", "))
                })
                .collect();
            report.push(format!("{krate}:\n{}", edges.join("\n")));
        }
    }
    assert!(report.is_empty(), "import circles:\n{}", report.join("\n"));
}

#[test]
fn no_rust_file_is_over_800_lines() {
    let mut long = Vec::new();
    for krate in ["control-plane", "browser-agent", "proto", "tests"] {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(krate);
        for file in rust_files(&dir) {
            let lines = std::fs::read_to_string(&file).unwrap_or_default().lines().count();
            if lines > MAX_LINES {
                long.push(format!("{} ({lines} lines)", file.display()));
            }
        }
    }
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:#?}");
}

/// Writes a source file of a planted crate (its folders made as needed).
fn write_source(root: &Path, name: &str, text: &str) {
    let path = root.join(name);
    std::fs::create_dir_all(path.parent().unwrap_or(root)).ok();
    std::fs::write(path, text).unwrap_or_else(|error| panic!("write {name}: {error}"));
}

/// The circles of a planted crate rooted at `lib.rs`, by module path.
fn planted_circles(root: &Path) -> Vec<Vec<String>> {
    circles(&dependency_graph(root, "lib.rs"))
        .into_iter()
        .map(|circle| circle.iter().map(display).collect())
        .collect()
}

#[test]
fn the_check_finds_a_planted_circle() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("temp dir: {error}"));
    let write = |name: &str, text: &str| write_source(dir.path(), name, text);
    write("lib.rs", "mod a; mod b; mod c; mod d;");
    write("a/mod.rs", "mod inner; use crate::b::Thing; // crate::d::X is a comment\n");
    write("a/inner.rs", "pub fn f() -> &'static str { \"see crate::d::Y\" }");
    write("b.rs", "use crate::{c::{self, Other}, d};\nmod tests { use super::*; }");
    write("c.rs", "pub(super) fn g() { super::a::inner::f(); }\npub(in crate::b) fn i() {}");
    write("d.rs", "pub struct X; fn h() { crate::a::inner::f(); }");
    let found = planted_circles(dir.path());
    // a → b → c → a::inner is no circle (a's child is not a); d → a::inner neither. A
    // comment or a sentence in a string naming `crate::d` adds nothing, and `super` in b's inline
    // module is b itself.
    assert!(found.is_empty(), "{found:?}");
    write("a/inner.rs", "pub fn f() { crate::b::g() }");
    let found = planted_circles(dir.path());
    assert_eq!(found, vec![vec!["a::inner", "b", "c", "d"]]);
}

#[test]
fn the_check_sees_through_reexports_and_paths_in_attributes() {
    let dir = tempfile::tempdir().unwrap_or_else(|error| panic!("temp dir: {error}"));
    let write = |name: &str, text: &str| write_source(dir.path(), name, text);
    let found = || planted_circles(dir.path());
    write("lib.rs", "mod e; mod f; mod g;");
    // `crate::e::Thing` is `e/inner.rs`'s, re-exported by `e`.
    write("e/mod.rs", "mod inner;\npub use inner::{Thing, Other as Renamed};");
    write("e/inner.rs", "pub struct Thing; pub struct Other; fn k() { crate::f::h() }");
    write("f.rs", "pub fn h() {} fn uses(_: crate::e::Thing) {}");
    assert_eq!(found(), vec![vec!["e::inner", "f"]]);
    write("f.rs", "pub fn h() {} fn uses(_: crate::e::Renamed) {}");
    assert_eq!(found(), vec![vec!["e::inner", "f"]], "through an alias too");
    write("f.rs", "pub fn h() {}");
    assert!(found().is_empty());
    // A path in an attribute's string is a dependency; a byte raw string with quotes in it
    // does not hide the code after it.
    write(
        "g.rs",
        "const B: &[u8] = br#\"a\"b\"#;\n#[serde(deserialize_with = \"crate::e::inner::k\")]\nstruct S;\nfn m() { crate::f::h() }",
    );
    write("f.rs", "pub fn h() { crate::g::n() }");
    write("e/inner.rs", "pub struct Thing; pub struct Other; pub fn k() { crate::g::n() }");
    // g names e::inner only in the attribute, and f only after the byte string.
    assert_eq!(found(), vec![vec!["e::inner", "f", "g"]]);
}

fn source_dir(krate: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(krate).join("src")
}

fn display(module: &Module) -> String {
    if module.is_empty() { "crate".to_owned() } else { module.join("::") }
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|name| name != "target" && name != "node_modules") {
                files.extend(rust_files(&path));
            }
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The module a file is: `a/b.rs` and `a/b/mod.rs` are `a::b`, the root is `crate`.
fn file_module(src: &Path, file: &Path, root: &str) -> Option<Module> {
    let relative = file.strip_prefix(src).ok()?;
    let mut parts: Module =
        relative.iter().map(|part| part.to_string_lossy().into_owned()).collect();
    let last = parts.pop()?;
    if parts.is_empty() && last == root {
        return Some(parts);
    }
    if parts.is_empty() && (last == "main.rs" || last == "lib.rs" || last == "build.rs") {
        return None; // another crate root of the same package (a binary beside the library)
    }
    if last != "mod.rs" {
        parts.push(last.strip_suffix(".rs")?.to_owned());
    }
    Some(parts)
}

/// Every file's module and the files' modules it depends on.
fn dependency_graph(src: &Path, root: &str) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut texts = BTreeMap::new();
    for file in rust_files(src) {
        if let Some(module) = file_module(src, &file, root) {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            texts.insert(module, code_only(&text));
        }
    }
    // Modules declared inline (`mod tests { … }`) belong to their file.
    let mut file_of: BTreeMap<Module, Module> =
        texts.keys().map(|module| (module.clone(), module.clone())).collect();
    let mut references = BTreeMap::new();
    let mut written_reexports = Vec::new();
    for (module, code) in &texts {
        let scanned = scan(code, module);
        for inner in scanned.inline {
            file_of.entry(inner).or_insert_with(|| module.clone());
        }
        references.insert(module.clone(), scanned.paths);
        written_reexports.extend(scanned.reexports);
    }
    // A re-exported name is a dependency on the file that defines it, not on the module
    // that re-exports it (`crate::store::PoolsStore` is `store/pools.rs`).
    let mut reexports: BTreeMap<Module, BTreeMap<String, Module>> = BTreeMap::new();
    for (here, name, path) in written_reexports {
        let target = match path.first().map(String::as_str) {
            Some("crate" | "super" | "self") => absolute(&path, &here),
            Some(first) => {
                let mut child = here.clone();
                child.push(first.to_owned());
                // A bare path is a child module's, or another crate's (not ours).
                file_of.contains_key(&child).then(|| {
                    let mut full = here.clone();
                    full.extend(path.iter().cloned());
                    full
                })
            }
            None => None,
        };
        if let Some(target) = target {
            reexports.entry(here).or_default().insert(name, target);
        }
    }
    let resolve = |path: &Module| -> Option<Module> {
        let mut path = path.clone();
        for _ in 0..8 {
            let length =
                (0..=path.len()).rev().find(|length| file_of.contains_key(&path[..*length]))?;
            let redirected = path
                .get(length)
                .and_then(|name| reexports.get(&path[..length]).and_then(|names| names.get(name)));
            match redirected {
                Some(target) if *target != path[..=length] => {
                    let mut next = target.clone();
                    next.extend(path[length + 1..].iter().cloned());
                    path = next;
                }
                _ => return file_of.get(&path[..length]).cloned(),
            }
        }
        None
    };
    let mut graph = BTreeMap::new();
    for (module, paths) in references {
        let mut targets = BTreeSet::new();
        for path in paths {
            let Some(target) = resolve(&path) else {
                continue;
            };
            let descendant = target.len() > module.len() && target.starts_with(&module);
            if target != module && !descendant {
                targets.insert(target);
            }
        }
        graph.insert(module, targets);
    }
    graph
}

/// The text with comments, string and character literals blanked (lines kept).
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && raw_string_end(&chars, i).is_some()
        {
            i = raw_string_end(&chars, i).unwrap_or(i + 1);
            out.push_str("\"\"");
        } else if c == '"' {
            let start = i + 1;
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            let content: String = chars[start..i.min(chars.len())].iter().collect();
            i += 1;
            // A path in a string is a dependency (serde's `deserialize_with = "crate::…"`).
            if is_module_path(&content) {
                out.push_str(&format!(" {content} "));
            } else {
                out.push_str("\"\"");
            }
        } else if c == '\'' && is_char_literal(&chars, i) {
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_module_path(text: &str) -> bool {
    let mut parts = text.split("::");
    matches!(parts.next(), Some("crate" | "super" | "self"))
        && text.contains("::")
        && parts.all(|part| is_ident(part) && part.chars().all(|c| c.is_alphanumeric() || c == '_'))
}

/// Where a raw string starting at `start` (`r"…"`, `r#"…"#`) ends, if it is one.
fn raw_string_end(chars: &[char], start: usize) -> Option<usize> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    if start > 0 && ident(chars[start - 1]) {
        // `br"…"` and `cr"…"` are raw strings too; `for"` or `xbr"` are not.
        let prefixed =
            matches!(chars[start - 1], 'b' | 'c') && (start < 2 || !ident(chars[start - 2]));
        if !prefixed {
            return None; // the end of an identifier such as `for`
        }
    }
    let mut i = start + 1;
    let mut hashes = 0;
    while chars.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    if chars.get(i) != Some(&'"') {
        return None;
    }
    i += 1;
    while i < chars.len() {
        if chars[i] == '"' && (0..hashes).all(|k| chars.get(i + 1 + k) == Some(&'#')) {
            return Some(i + 1 + hashes);
        }
        i += 1;
    }
    Some(chars.len())
}

/// `'x'` or `'\n'`, not a lifetime `'a`.
fn is_char_literal(chars: &[char], start: usize) -> bool {
    match chars.get(start + 1) {
        Some('\\') => true,
        Some(_) => chars.get(start + 2) == Some(&'\''),
        None => false,
    }
}

/// The inline modules a file declares and every `crate`/`super`/`self` path it names, both
/// resolved to absolute module paths.
fn scan(code: &str, module: &Module) -> Scanned {
    let tokens = tokenize(code);
    let mut inline = Vec::new();
    let mut paths = Vec::new();
    let mut reexports = Vec::new();
    // The inline modules we are in, each with the brace depth it closes at.
    let mut scopes: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let here = || {
            let mut current = module.clone();
            current.extend(scopes.iter().map(|(name, _)| name.clone()));
            current
        };
        match tokens[i].as_str() {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if scopes.last().is_some_and(|(_, closes)| *closes == depth) {
                    scopes.pop();
                }
            }
            "mod" if tokens.get(i + 2).is_some_and(|token| token == "{") => {
                let name = tokens[i + 1].clone();
                let mut declared = here();
                declared.push(name.clone());
                inline.push(declared);
                scopes.push((name, depth));
            }
            "use" => {
                let end = (i..tokens.len()).find(|&j| tokens[j] == ";").unwrap_or(tokens.len());
                let mut expanded = Vec::new();
                use_tree(&tokens[i + 1..end], Vec::new(), &mut expanded);
                // `pub use` (or `pub(crate) use`): the names it makes this module answer for.
                let public = i >= 1 && (tokens[i - 1] == "pub" || tokens[i - 1] == ")");
                for used in expanded {
                    paths.extend(absolute(&used.path, &here()));
                    let name = used.alias.clone().or_else(|| used.path.last().cloned());
                    if let (true, false, Some(name)) = (public, used.glob, name) {
                        reexports.push((here(), name, used.path));
                    }
                }
                i = end;
                continue;
            }
            // `pub(crate)`, `pub(super)`, `pub(in crate::a)` say who may see, not what is used.
            "crate" | "super" | "self" | "in"
                if i >= 2 && tokens[i - 1] == "(" && tokens[i - 2] == "pub" =>
            {
                i = (i..tokens.len()).find(|&j| tokens[j] == ")").unwrap_or(tokens.len());
                continue;
            }
            "crate" | "super" | "self" => {
                let mut path = vec![tokens[i].clone()];
                let mut j = i + 1;
                while tokens.get(j).is_some_and(|token| token == "::")
                    && tokens.get(j + 1).is_some_and(|token| is_ident(token))
                {
                    path.push(tokens[j + 1].clone());
                    j += 2;
                }
                paths.extend(absolute(&path, &here()));
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Scanned { inline, paths, reexports }
}

/// What a file declares and names.
struct Scanned {
    /// Its inline modules (`mod tests { … }`).
    inline: Vec<Module>,
    /// Every `crate`/`super`/`self` path, absolute.
    paths: Vec<Module>,
    /// Its `pub use`s: (the module, the name it re-exports, the path as written).
    reexports: Vec<(Module, String, Vec<String>)>,
}

fn is_ident(token: &str) -> bool {
    token.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Identifiers, `::` and single punctuation characters.
fn tokenize(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(chars[start..i].iter().collect());
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push("::".to_owned());
            i += 2;
        } else {
            if !c.is_whitespace() {
                tokens.push(c.to_string());
            }
            i += 1;
        }
    }
    tokens
}

/// One path a `use` tree names: the path, the name it is known by here (`as` renames it),
/// and whether it is a glob (`*`).
struct UsePath {
    path: Vec<String>,
    alias: Option<String>,
    glob: bool,
}

/// Expands a `use` tree (`a::{b, c::d as e, self, f::*}`) into its paths.
fn use_tree(tokens: &[String], prefix: Vec<String>, out: &mut Vec<UsePath>) {
    let mut path = prefix;
    let (mut alias, mut glob) = (None, false);
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i].as_str() {
            "::" => {}
            "{" => {
                let close = matching_brace(tokens, i);
                for part in split_top_level(&tokens[i + 1..close]) {
                    use_tree(part, path.clone(), out);
                }
                return;
            }
            "as" => {
                alias = tokens.get(i + 1).cloned();
                break;
            }
            "*" => {
                glob = true;
                break;
            }
            "self" if !path.is_empty() => {}
            token if is_ident(token) => path.push(token.to_owned()),
            _ => {}
        }
        i += 1;
    }
    out.push(UsePath { path, alias, glob });
}

fn matching_brace(tokens: &[String], open: usize) -> usize {
    let mut depth = 0;
    for (offset, token) in tokens[open..].iter().enumerate() {
        match token.as_str() {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if depth == 0 {
                    return open + offset;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

fn split_top_level(tokens: &[String]) -> Vec<&[String]> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, token) in tokens.iter().enumerate() {
        match token.as_str() {
            "{" => depth += 1,
            "}" => depth -= 1,
            "," if depth == 0 => {
                parts.push(&tokens[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&tokens[start..]);
    parts.into_iter().filter(|part| !part.is_empty()).collect()
}

/// A path written in module `here` as an absolute module path, when it starts at `crate`,
/// `super` or `self` (other paths name other crates or local items).
fn absolute(path: &[String], here: &Module) -> Option<Module> {
    let (first, rest) = path.split_first()?;
    let mut base = match first.as_str() {
        "crate" => Vec::new(),
        "self" => here.clone(),
        "super" => here[..here.len().checked_sub(1)?].to_vec(),
        _ => return None,
    };
    let mut rest = rest;
    while let Some(("super", tail)) = rest.split_first().map(|(head, tail)| (head.as_str(), tail)) {
        base.pop();
        rest = tail;
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
fn circles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct State<'a> {
        graph: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    fn visit<'a>(state: &mut State<'a>, node: &'a Module) {
        let number = state.index.len();
        state.index.insert(node, number);
        state.low.insert(node, number);
        state.stack.push(node);
        state.on_stack.insert(node);
        let graph = state.graph;
        for next in graph.get(node).into_iter().flatten() {
            let Some((next, _)) = graph.get_key_value(next) else {
                continue;
            };
            if !state.index.contains_key(next) {
                visit(state, next);
                let low = state.low[node].min(state.low[next]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(next) {
                let low = state.low[node].min(state.index[next]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack.remove(member);
                component.push(member.clone());
                if member == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                state.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node) {
            visit(&mut state, node);
        }
    }
    state.found.sort();
    state.found
}
