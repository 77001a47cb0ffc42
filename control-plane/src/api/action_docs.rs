//! `docs/reference/api-key-actions.md`, written from the routes: every operation of the
//! OpenAPI document with the action an API key's policy must allow for it. A test fails when
//! the page and the code disagree.

use axum::http::Method;

use crate::access::actions;

/// The table of `docs/reference/api-key-actions.md`: every route of the OpenAPI document with the
/// action it needs, or that it needs no key.
fn documented_actions_table() -> String {
    let document = super::openapi::document();
    let mut rows = Vec::new();
    if let Some(paths) = document["paths"].as_object() {
        for (path, operations) in paths {
            let Some(operations) = operations.as_object() else {
                continue;
            };
            for (method, operation) in operations {
                let Ok(method) = method.to_uppercase().parse::<Method>() else {
                    continue;
                };
                let needs_key =
                    operation["security"].as_array().is_some_and(|schemes| !schemes.is_empty());
                let action = if !needs_key {
                    "none: a signed token in the URL, handed out by the API".to_owned()
                } else {
                    match actions::required(&method, path, path, "{project_id}") {
                        Some(required) => {
                            format!("`{}` on `{}`", required.action(), required.resource)
                        }
                        None => "any key".to_owned(),
                    }
                };
                rows.push(format!("| `{method} {path}` | {action} |"));
            }
        }
    }
    rows.sort();
    format!(
        "# What each route needs from an API key's policy\n\n\
         Generated from the routes (`control-plane/src/access/actions.rs`); a unit test \
         fails when this file and the code disagree. Rebuild it with \
         `UPDATE_DOCS=1 cargo test -p control-plane documented_actions`.\n\n\
         A key without a policy may do anything in its organization (or its project). \
         A key with one may only do what a statement allows. Actions are \
         `<kind>:<verb>`; `write` allows `use` and `read`, `use` allows `read`. \
         Resources are `projects/{{project_id}}/{{kind}}/{{id}}`; a list or a create names \
         the collection with the id `*`, which only a wildcard matches. Both accept `*` \
         wildcards, e.g. `browsers:*` on `projects/*/browsers/*`. A denied call is a 403 \
         naming the action and resource.\n\n\
         | Route | Needs |\n|---|---|\n{}\n",
        rows.join("\n")
    )
}

#[test]
fn documented_actions_match_the_routes() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/api-key-actions.md");
    let table = documented_actions_table();
    assert!(
        !table.contains("`*:write`"),
        "a route needs an action this table does not know:\n{table}"
    );
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(path, &table).expect("write the table");
    }
    let documented = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        documented == table,
        "docs/reference/api-key-actions.md is out of date: run UPDATE_DOCS=1 cargo test -p control-plane documented_actions"
    );
}
