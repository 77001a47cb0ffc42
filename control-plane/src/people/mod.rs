//! People who sign in with the operator's OpenID Connect provider (`oidc`), as opposed
//! to programs with API keys. A person belongs to the organization a claim of their ID
//! token names and has the role another claim names; the role is a policy like a key's
//! (`role_policy`). After sign-in a person holds a session (`sessions`): a secret in an
//! HttpOnly cookie (`SESSION_COOKIE`), checked by the `Org` extractor like a key.

pub mod oidc;
pub mod sessions;

use serde::{Deserialize, Serialize};

use crate::access::policy::{KINDS, Policy, Statement};

/// The cookie that carries a signed-in session (a person's, or a key's in the console).
pub const SESSION_COOKIE: &str = "kernel_session";
/// The cookie that carries one sign-in's state between the redirect and the callback.
pub const SIGN_IN_COOKIE: &str = "kernel_sign_in";
/// Audience of the sign-in token (`crate::tokens`).
pub const SIGN_IN_AUDIENCE: &str = "oidc-sign-in";
/// How long a session lasts; the person signs in again after.
pub const SESSION_HOURS: i64 = 8;
/// How long the provider may take between the redirect and the callback.
pub const SIGN_IN_MINUTES: i64 = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything in the organization.
    Admin,
    /// Everything but the audit log, projects and the organization's limits; keys only
    /// within their own rights.
    Member,
    /// Reads everything but the audit log.
    Viewer,
}

impl Role {
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "admin" => Some(Self::Admin),
            "member" => Some(Self::Member),
            "viewer" => Some(Self::Viewer),
            _ => None,
        }
    }
}

/// The kinds of `access::policy::KINDS` about the organization itself: members and
/// viewers read projects and the organization, and the audit log is for admins. Every
/// other kind is work: members change it, viewers read it.
const ORGANIZATION_KINDS: [&str; 3] = ["projects", "organization", "audit_logs"];

fn work_kinds() -> impl Iterator<Item = &'static str> {
    KINDS.into_iter().filter(|kind| !ORGANIZATION_KINDS.contains(kind))
}

/// What a role may do, as a key's policy; `None`: anything in the organization.
pub fn role_policy(role: Role) -> Option<Policy> {
    let statement = |kind: &str, verb: &str| Statement {
        action: format!("{kind}:{verb}"),
        resource: "projects/*".into(),
    };
    let statements = match role {
        Role::Admin => return None,
        Role::Member => work_kinds()
            .map(|kind| statement(kind, "write"))
            .chain(["projects", "organization"].map(|kind| statement(kind, "read")))
            .collect(),
        Role::Viewer => work_kinds()
            .chain(["projects", "organization"])
            .map(|kind| statement(kind, "read"))
            .collect(),
    };
    Some(Policy { statements })
}

/// A person's session: who, in which organization, with which role.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SessionClaims {
    /// The provider's subject.
    pub sub: String,
    /// The provider's issuer.
    pub idp: String,
    pub org: String,
    pub role: Role,
    #[serde(default)]
    pub email: String,
    #[serde(default)]
    pub name: Option<String>,
}

/// One sign-in between the redirect to the provider and its callback.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SignInClaims {
    pub state: String,
    pub nonce: String,
    /// The PKCE verifier (the cookie is HttpOnly and goes to this server only).
    pub verifier: String,
    /// Where the person goes once signed in: a path of this server.
    pub return_to: String,
    pub aud: String,
    pub exp: i64,
}

/// A path of this server to return to, never another site (`//evil`, `https://…`).
pub fn safe_return_path(requested: Option<&str>) -> String {
    match requested {
        Some(path)
            if path.starts_with('/')
                && !path.starts_with("//")
                && !path.contains(['\\', '\r', '\n']) =>
        {
            path.to_owned()
        }
        _ => "/auth/context".to_owned(),
    }
}

/// The value of cookie `name` in a request's `Cookie` header, unless empty.
pub fn cookie<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> Option<&'a str> {
    let header = headers.get(axum::http::header::COOKIE)?.to_str().ok()?;
    header
        .split(';')
        .find_map(|pair| {
            let (key, value) = pair.trim().split_once('=')?;
            (key == name).then_some(value)
        })
        .filter(|value| !value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::policy::Required;

    fn allows(role: Role, kind: &'static str, verb: &'static str) -> bool {
        role_policy(role).is_none_or(|policy| {
            policy.allows(&Required { kind, verb, resource: format!("projects/proj_1/{kind}/x") })
        })
    }

    #[test]
    fn roles_allow_what_they_say() {
        assert!(allows(Role::Admin, "audit_logs", "read"));
        assert!(allows(Role::Member, "browsers", "write"));
        assert!(allows(Role::Member, "projects", "read"));
        assert!(!allows(Role::Member, "projects", "write"));
        assert!(!allows(Role::Member, "audit_logs", "read"));
        assert!(allows(Role::Viewer, "browsers", "read"));
        assert!(!allows(Role::Viewer, "browsers", "use"));
        assert!(!allows(Role::Viewer, "browsers", "write"));
        for role in [Role::Member, Role::Viewer] {
            let problems = role_policy(role).map(|p| p.problems()).unwrap_or_default();
            assert!(problems.is_empty(), "{problems:?}");
        }
    }

    #[test]
    fn only_paths_of_this_server_are_returned_to() {
        assert_eq!(safe_return_path(Some("/browsers")), "/browsers");
        for bad in ["//evil.test", "https://evil.test", "/\\evil", "evil"] {
            assert_eq!(safe_return_path(Some(bad)), "/auth/context");
        }
        assert_eq!(safe_return_path(None), "/auth/context");
    }

    #[test]
    fn cookies_are_found_by_name() {
        let headers = |value: &'static str| {
            let mut headers = axum::http::HeaderMap::new();
            headers.insert(axum::http::header::COOKIE, axum::http::HeaderValue::from_static(value));
            headers
        };
        assert_eq!(cookie(&headers("a=1; kernel_session=xyz"), SESSION_COOKIE), Some("xyz"));
        assert_eq!(cookie(&headers("kernel_sessionx=1"), SESSION_COOKIE), None);
    }
}
