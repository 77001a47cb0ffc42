//! The configuration reference (`docs/reference/flags.md`), written from the clap
//! definitions in `config.rs` so that the documentation cannot drift from the flags: a test
//! fails when they differ, and `UPDATE_DOCS=1 cargo test -p control-plane config_reference`
//! rewrites the page.

use clap::{Arg, Command, CommandFactory};

use crate::config::Cli;

/// Every subcommand's flags, each as a row `| flag | env | default | meaning |`.
pub fn markdown() -> String {
    let mut page = String::from(
        "# Flags\n\n\
         Generated from the command line's own definitions (`control-plane <command> --help`\n\
         says the same); a test fails when a flag is missing here. A flag with a variable in\n\
         the env column can be set by that variable instead. See\n\
         [Configuration](../configuration.md) for how the pieces fit together.\n",
    );
    let cli = Cli::command();
    for (path, command) in leaf_commands(&cli, "control-plane") {
        page.push_str(&format!("\n## `{path}`\n\n"));
        if let Some(about) = command.get_about() {
            page.push_str(&format!("{about}\n\n"));
        }
        page.push_str("| flag | env | default | meaning |\n|---|---|---|---|\n");
        for arg in command.get_arguments().filter(|arg| is_documented(arg)) {
            page.push_str(&row(arg));
        }
    }
    page
}

/// The commands that take flags (`serve`, `api-keys create`), with their full invocation.
fn leaf_commands<'a>(command: &'a Command, path: &str) -> Vec<(String, &'a Command)> {
    let mut leaves = Vec::new();
    for sub in command.get_subcommands() {
        let sub_path = format!("{path} {}", sub.get_name());
        if sub.has_subcommands() {
            leaves.extend(leaf_commands(sub, &sub_path));
        } else {
            leaves.push((sub_path, sub));
        }
    }
    leaves
}

/// clap's own `--help` and `--version` are not configuration.
fn is_documented(arg: &Arg) -> bool {
    arg.get_long().is_some() && !matches!(arg.get_id().as_str(), "help" | "version")
}

fn row(arg: &Arg) -> String {
    let flag = format!("`--{}`", arg.get_long().unwrap_or_default());
    let env = arg
        .get_env()
        .map(|env| format!("`{}`", env.to_string_lossy()))
        .unwrap_or_else(|| "none".to_owned());
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|value| format!("`{}`", value.to_string_lossy()))
        .collect();
    let default = if arg.is_required_set() {
        "required".to_owned()
    } else if defaults.is_empty() {
        // Optional flags whose default is computed say so in their meaning.
        "unset".to_owned()
    } else {
        defaults.join(", ").replace("``", "empty")
    };
    let help =
        arg.get_long_help().or(arg.get_help()).map(|help| help.to_string()).unwrap_or_default();
    // A table cell is one line: paragraphs are joined, and a literal `|` is escaped.
    let meaning = help.split_whitespace().collect::<Vec<_>>().join(" ");
    let meaning = meaning.replace('|', "\\|");
    format!("| {flag} | {env} | {default} | {meaning} |\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reference_matches_the_flags() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/flags.md");
        let page = markdown();
        let undocumented: Vec<&str> = page
            .lines()
            .filter(|line| line.starts_with("| `--") && line.ends_with("|  |"))
            .collect();
        assert!(
            undocumented.is_empty(),
            "flags without a doc comment in config.rs: {undocumented:#?}"
        );
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(path, &page).expect("write the flags reference");
        }
        let documented = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            documented == page,
            "docs/reference/flags.md is out of date: run \
             UPDATE_DOCS=1 cargo test -p control-plane config_reference"
        );
    }
}
