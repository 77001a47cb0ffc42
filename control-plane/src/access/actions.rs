//! Which action each route needs: the one table of the API's permissions, checked for
//! every authenticated request by the `Org` extractor (`crate::api::org`), never by a
//! handler. `docs/reference/api-key-actions.md` lists it route by route; a unit test in
//! `crate::api::action_docs` keeps that list equal to what this code decides for every route.
//!
//! The rules: the route's first segments name the kind (`/browsers` → `browsers`,
//! `/org/api_keys` → `api_keys`, …); reading (`GET`) needs `read` and changing needs
//! `write`, except where a route operates a resource rather than changing its
//! configuration, which needs `use`: everything a browser does beyond being looked at
//! (its CDP and live view, computer control, files, processes, Playwright, …), acquiring
//! from and releasing to a pool, logging in through an auth connection and reading a
//! credential's TOTP code.

use axum::http::Method;

use super::policy::Required;

/// Routes every authenticated caller may use whatever its policy: who am I (and, for
/// the console, what may I do), and the MCP server (`crate::mcp::PATH`), whose tools are
/// each authorized by the REST routes they call.
const OPEN_TO_ANY_KEY: [&str; 3] = ["/auth/context", "/console/me", "/mcp"];

/// The first path segments of each kind's routes, longest first where one is a prefix
/// of another.
const KIND_PREFIXES: [(&str, &str); 19] = [
    ("/browser_pools", "browser_pools"),
    ("/console/thumbnails", "browsers"),
    ("/browsers", "browsers"),
    ("/inspector", "browsers"),
    ("/replays", "browsers"),
    ("/extensions", "extensions"),
    ("/profiles", "profiles"),
    ("/proxies", "proxies"),
    ("/credentials", "credentials"),
    ("/org/credential_providers", "credential_providers"),
    ("/auth/connections", "auth_connections"),
    ("/deployments", "deployments"),
    ("/apps", "apps"),
    ("/invocations", "invocations"),
    ("/telemetry/destinations", "telemetry_destinations"),
    ("/org/api_keys", "api_keys"),
    ("/org/projects", "projects"),
    ("/org", "organization"),
    ("/audit-logs", "audit_logs"),
];

/// A browser's routes that only look at it (reading is `browsers:read`); all its other
/// routes drive it (`browsers:use`).
fn browser_route_only_reads(method: &Method, template: &str) -> bool {
    *method == Method::GET
        && (matches!(template, "/browsers" | "/browsers/{id}")
            || template.starts_with("/browsers/{id}/replays")
            || template.starts_with("/browsers/{id}/telemetry/")
            || template.starts_with("/inspector")
            || template.starts_with("/console/thumbnails")
            || template.starts_with("/replays/"))
}

/// Routes of other kinds that operate a resource (`use`).
const USE_ROUTES: [(&str, &str); 5] = [
    ("POST", "/browser_pools/{id_or_name}/acquire"),
    ("POST", "/browser_pools/{id_or_name}/release"),
    ("POST", "/auth/connections/{id}/login"),
    ("POST", "/auth/connections/{id}/submit"),
    ("GET", "/credentials/{id_or_name}/totp-code"),
];

/// What a request on route `template` (as routed, `{param}`s unfilled) at `path` (as
/// sent) needs; `None` for a route open to any key. Its resource is in `project_id`.
/// Routes this table does not know need `*` (only an unrestricted key passes).
pub fn required(method: &Method, template: &str, path: &str, project_id: &str) -> Option<Required> {
    if OPEN_TO_ANY_KEY.contains(&template) {
        return None;
    }
    let Some((prefix, kind)) = KIND_PREFIXES.iter().find(|(prefix, _)| is_under(template, prefix))
    else {
        return Some(Required { kind: "*", verb: "write", resource: "*".into() });
    };
    let verb = if *kind == "browsers" {
        if browser_route_only_reads(method, template) { "read" } else { "use" }
    } else if USE_ROUTES
        .iter()
        .any(|(use_method, route)| *use_method == method.as_str() && *route == template)
    {
        "use"
    } else if *method == Method::GET || *method == Method::HEAD {
        "read"
    } else {
        "write"
    };
    let id = resource_id(template, path, prefix).unwrap_or_else(|| "*".to_owned());
    Some(Required { kind, verb, resource: format!("projects/{project_id}/{kind}/{id}") })
}

fn is_under(template: &str, prefix: &str) -> bool {
    template.strip_prefix(prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The id the request names right after its kind's prefix (`/browsers/{id}/…` → the
/// browser's id), as sent; `None` for the whole collection.
fn resource_id(template: &str, path: &str, prefix: &str) -> Option<String> {
    let depth = prefix.split('/').count();
    let template_segment = template.split('/').nth(depth)?;
    if !(template_segment.starts_with('{') && template_segment.ends_with('}')) {
        return None;
    }
    let segment = path.split('/').nth(depth)?;
    let decoded = percent_encoding::percent_decode_str(segment).decode_utf8_lossy();
    Some(decoded.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs(method: Method, template: &str, path: &str) -> Option<(String, String)> {
        required(&method, template, path, "proj_1").map(|r| (r.action(), r.resource))
    }

    #[test]
    fn browsers_are_read_or_used() {
        assert_eq!(
            needs(Method::GET, "/browsers", "/browsers"),
            Some(("browsers:read".into(), "projects/proj_1/browsers/*".into()))
        );
        assert_eq!(
            needs(Method::POST, "/browsers", "/browsers"),
            Some(("browsers:use".into(), "projects/proj_1/browsers/*".into()))
        );
        assert_eq!(
            needs(Method::GET, "/browsers/{id}/cdp", "/browsers/abc/cdp"),
            Some(("browsers:use".into(), "projects/proj_1/browsers/abc".into()))
        );
        assert_eq!(
            needs(Method::GET, "/browsers/{id}/telemetry/events", "/browsers/abc/telemetry/events"),
            Some(("browsers:read".into(), "projects/proj_1/browsers/abc".into()))
        );
    }

    #[test]
    fn other_kinds_are_read_written_or_used() {
        assert_eq!(
            needs(
                Method::POST,
                "/browser_pools/{id_or_name}/acquire",
                "/browser_pools/p%201/acquire"
            ),
            Some(("browser_pools:use".into(), "projects/proj_1/browser_pools/p 1".into()))
        );
        assert_eq!(
            needs(Method::PATCH, "/browser_pools/{id_or_name}", "/browser_pools/x"),
            Some(("browser_pools:write".into(), "projects/proj_1/browser_pools/x".into()))
        );
        assert_eq!(
            needs(Method::GET, "/org/api_keys", "/org/api_keys"),
            Some(("api_keys:read".into(), "projects/proj_1/api_keys/*".into()))
        );
        assert_eq!(
            needs(Method::POST, "/org/api_keys/{id}/rotate", "/org/api_keys/k/rotate"),
            Some(("api_keys:write".into(), "projects/proj_1/api_keys/k".into()))
        );
        assert_eq!(needs(Method::GET, "/auth/context", "/auth/context"), None);
        assert_eq!(
            needs(Method::GET, "/somewhere/new", "/somewhere/new").map(|(action, _)| action),
            Some("*:write".into())
        );
    }
}
