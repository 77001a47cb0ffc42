//! Scoped keys' policies: allow-lists of `action` on `resource`, both with `*` wildcards.
//!
//! An action is `<kind>:<verb>`, the verbs ordered `read` < `use` < `write`: a statement
//! that allows a verb allows the lesser ones on the same kind (whoever may drive a
//! browser may look at it; whoever may change a pool may acquire from it). A resource is
//! `projects/{project_id}/{kind}/{id}`, with `*` as the id of a whole collection (a list,
//! a create): only a wildcard in a statement matches that `*`, so a key allowed one
//! browser cannot list or create browsers.

use serde::{Deserialize, Serialize};

/// Everything a key is allowed; an ordinary key has none and may do anything in its
/// organization.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    pub statements: Vec<Statement>,
}

/// A field a statement does not know (`effect: deny`, say) is refused, never ignored:
/// ignoring it could allow what its author meant to deny.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    pub action: String,
    pub resource: String,
}

/// The kinds of resource actions name, as in the routes (`crate::access::actions`).
pub const KINDS: [&str; 16] = [
    "browsers",
    "browser_pools",
    "extensions",
    "profiles",
    "proxies",
    "credentials",
    "credential_providers",
    "auth_connections",
    "deployments",
    "apps",
    "invocations",
    "telemetry_destinations",
    "api_keys",
    "projects",
    "organization",
    "audit_logs",
];

/// Ordered: each verb allows the ones before it.
pub const VERBS: [&str; 3] = ["read", "use", "write"];

/// At most this many statements in one policy.
pub const MAX_STATEMENTS: usize = 100;
/// Longest action or resource pattern (matching costs pattern × text).
pub const MAX_PATTERN_CHARS: usize = 512;

/// What one request needs: `verb` on `kind`, on `resource`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Required {
    pub kind: &'static str,
    pub verb: &'static str,
    pub resource: String,
}

impl Required {
    pub fn action(&self) -> String {
        format!("{}:{}", self.kind, self.verb)
    }
}

impl Policy {
    /// Whether a statement allows `required`.
    pub fn allows(&self, required: &Required) -> bool {
        let rank = verb_rank(required.verb);
        self.statements.iter().any(|statement| {
            glob_matches(&statement.resource, &required.resource)
                && VERBS[rank..].iter().any(|verb| {
                    glob_matches(&statement.action, &format!("{}:{verb}", required.kind))
                })
        })
    }

    /// Whether everything `other` allows, this allows too: each of `other`'s statements is
    /// within one of ours (its wildcards taken as what they could stand for).
    pub fn covers(&self, other: &Policy) -> bool {
        other.statements.iter().all(|theirs| {
            self.statements.iter().any(|ours| {
                glob_matches(&ours.resource, &theirs.resource)
                    && action_covers(&ours.action, &theirs.action)
            })
        })
    }

    /// The problems that make this policy unusable, one per line of a 400.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.statements.is_empty() {
            problems.push("policy.statements: give at least one statement".to_owned());
        }
        if self.statements.len() > MAX_STATEMENTS {
            problems.push(format!("policy.statements: at most {MAX_STATEMENTS} statements"));
        }
        for (index, statement) in self.statements.iter().enumerate() {
            if let Err(problem) = check_action(&statement.action) {
                problems.push(format!("policy.statements[{index}].action: {problem}"));
            }
            if let Err(problem) = check_resource(&statement.resource) {
                problems.push(format!("policy.statements[{index}].resource: {problem}"));
            }
        }
        problems
    }
}

fn verb_rank(verb: &str) -> usize {
    VERBS.iter().position(|known| *known == verb).unwrap_or(0)
}

/// Whether action pattern `ours` allows everything action pattern `theirs` does, with
/// the verb order: `browsers:write` covers `browsers:use`.
fn action_covers(ours: &str, theirs: &str) -> bool {
    if glob_matches(ours, theirs) {
        return true;
    }
    // A concrete verb of theirs is also covered by a greater verb of ours.
    let Some((kind, verb)) = theirs.split_once(':') else {
        return false;
    };
    if !VERBS.contains(&verb) {
        return false;
    }
    VERBS[verb_rank(verb)..].iter().any(|greater| glob_matches(ours, &format!("{kind}:{greater}")))
}

fn check_action(action: &str) -> Result<(), String> {
    if action.len() > MAX_PATTERN_CHARS {
        return Err(format!("at most {MAX_PATTERN_CHARS} characters"));
    }
    if action == "*" {
        return Ok(());
    }
    let Some((kind, verb)) = action.split_once(':') else {
        return Err(format!(
            "{action:?} is not `<kind>:<verb>` (for example `browsers:use`) or `*`"
        ));
    };
    let kind_known = KINDS.iter().any(|known| glob_matches(kind, known));
    if !kind_known || kind.is_empty() {
        return Err(format!("{action:?} names no known kind; the kinds are {}", KINDS.join(", ")));
    }
    if verb.is_empty() || !VERBS.iter().any(|known| glob_matches(verb, known)) {
        return Err(format!("{action:?} names no known verb; the verbs are {}", VERBS.join(", ")));
    }
    Ok(())
}

fn check_resource(resource: &str) -> Result<(), String> {
    if resource.len() > MAX_PATTERN_CHARS {
        return Err(format!("at most {MAX_PATTERN_CHARS} characters"));
    }
    if resource == "*" || resource.starts_with("projects/") {
        Ok(())
    } else {
        Err(format!(
            "{resource:?} is not `projects/{{project_id}}/{{kind}}/{{id}}` (wildcards allowed) or `*`"
        ))
    }
}

/// Whether `text` matches `pattern`, where `*` in the pattern stands for any run of
/// characters (`/` included) and every other character for itself.
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let (pattern, text) = (pattern.as_bytes(), text.as_bytes());
    let (mut p, mut t) = (0, 0);
    // Where the last `*` was, and the text position it has absorbed up to.
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((star_p, star_t)) = star {
            p = star_p + 1;
            t = star_t + 1;
            star = Some((star_p, star_t + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(statements: &[(&str, &str)]) -> Policy {
        Policy {
            statements: statements
                .iter()
                .map(|(action, resource)| Statement {
                    action: (*action).into(),
                    resource: (*resource).into(),
                })
                .collect(),
        }
    }

    fn required(kind: &'static str, verb: &'static str, resource: &str) -> Required {
        Required { kind, verb, resource: resource.into() }
    }

    #[test]
    fn globs_match_runs_of_any_characters() {
        assert!(glob_matches("*", ""));
        assert!(glob_matches("*", "projects/p/browsers/b"));
        assert!(glob_matches("projects/*/browsers/*", "projects/p1/browsers/abc"));
        assert!(!glob_matches("projects/*/browsers/*", "projects/p1/proxies/abc"));
        assert!(glob_matches("browsers:*", "browsers:use"));
        assert!(!glob_matches("browsers:*", "browser_pools:use"));
        assert!(glob_matches("a*b*c", "aXXbYYc"));
        assert!(!glob_matches("a*b*c", "aXXbYY"));
        assert!(glob_matches("exact", "exact"));
        assert!(!glob_matches("exact", "exactly"));
    }

    #[test]
    fn a_verb_allows_the_lesser_verbs_of_its_kind() {
        let use_browsers = policy(&[("browsers:use", "projects/p/browsers/*")]);
        assert!(use_browsers.allows(&required("browsers", "use", "projects/p/browsers/b1")));
        assert!(use_browsers.allows(&required("browsers", "read", "projects/p/browsers/b1")));
        assert!(use_browsers.allows(&required("browsers", "use", "projects/p/browsers/*")));
        assert!(!use_browsers.allows(&required(
            "browser_pools",
            "read",
            "projects/p/browser_pools/*"
        )));
        assert!(!use_browsers.allows(&required("browsers", "use", "projects/q/browsers/b1")));
        let read_only = policy(&[("browsers:read", "*")]);
        assert!(!read_only.allows(&required("browsers", "use", "projects/p/browsers/b1")));
    }

    #[test]
    fn a_collection_needs_a_wildcard() {
        let one = policy(&[("browsers:use", "projects/p/browsers/b1")]);
        assert!(one.allows(&required("browsers", "use", "projects/p/browsers/b1")));
        assert!(!one.allows(&required("browsers", "use", "projects/p/browsers/*")));
    }

    #[test]
    fn covers_only_what_is_within() {
        let broad = policy(&[("browsers:*", "projects/p/*")]);
        assert!(broad.covers(&policy(&[("browsers:use", "projects/p/browsers/*")])));
        assert!(broad.covers(&policy(&[("browsers:*", "projects/p/browsers/b")])));
        assert!(!broad.covers(&policy(&[("*", "projects/p/*")])));
        assert!(!broad.covers(&policy(&[("browsers:use", "*")])));
        assert!(!broad.covers(&policy(&[("browsers:use", "projects/*/browsers/*")])));
        let write = policy(&[("browser_pools:write", "*")]);
        assert!(write.covers(&policy(&[("browser_pools:read", "*")])));
        assert!(!write.covers(&policy(&[("browser_pools:*", "*")])));
        assert!(!policy(&[("brow*:use", "*")]).covers(&policy(&[("b*:use", "*")])));
    }

    #[test]
    fn problems_name_the_bad_statement() {
        assert!(policy(&[("browsers:use", "projects/p/browsers/*")]).problems().is_empty());
        assert!(policy(&[("*", "*")]).problems().is_empty());
        assert!(policy(&[("brow*:*", "*")]).problems().is_empty());
        let problems = policy(&[("browser:use", "*"), ("browsers:drive", "x")]).problems();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("statements[0].action"));
        assert!(problems[1].contains("statements[1].action"));
        assert!(problems[2].contains("statements[1].resource"));
        assert_eq!(policy(&[]).problems().len(), 1);
    }
}
