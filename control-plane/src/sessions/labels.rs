//! What callers call a session by and what it shows: its name, tags, start URL, and the
//! location (timezone and locale) its pages see. Checked here, kept with the session.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::egress::HostAllowlist;
use crate::store::SessionLocation;

pub const MAX_NAME_CHARS: usize = 255;
pub const MAX_TAGS: usize = 50;
pub const MAX_TAG_KEY_CHARS: usize = 128;
pub const MAX_TAG_VALUE_CHARS: usize = 256;
pub const MAX_START_URL_BYTES: usize = 8 * 1024;
/// What pages see when the session sets no location.
pub const DEFAULT_TIMEZONE: &str = "UTC";
pub const DEFAULT_LOCALE: &str = "en-US";
/// Where the VM's (read-only, shared with the host) `/usr` keeps the timezone database.
const ZONEINFO: &str = "/usr/share/zoneinfo";

/// `location` as the SDK sends it: each field optional.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LocationRequest {
    /// IANA timezone, such as `Europe/Berlin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// BCP 47 locale, such as `de-DE` (`language[-Script][-REGION]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z]{2,3}(?:[-_][A-Za-z]{4})?(?:[-_](?:[A-Za-z]{2}|[0-9]{3}))?$")]
    pub locale: Option<String>,
}

/// `location` as answered: the effective values and whether each was set on the session
/// (`override`) or is the server's (`default`).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct LocationView {
    pub timezone: String,
    pub timezone_source: &'static str,
    pub locale: String,
    pub locale_source: &'static str,
}

impl LocationView {
    pub fn of(location: Option<&SessionLocation>) -> Self {
        let source = |set: bool| if set { "override" } else { "default" };
        let timezone = location.and_then(|l| l.timezone.clone());
        let locale = location.and_then(|l| l.locale.clone());
        Self {
            timezone_source: source(timezone.is_some()),
            locale_source: source(locale.is_some()),
            timezone: timezone.unwrap_or_else(|| DEFAULT_TIMEZONE.to_owned()),
            locale: locale.unwrap_or_else(|| DEFAULT_LOCALE.to_owned()),
        }
    }
}

fn has_control_characters(text: &str) -> bool {
    text.chars().any(char::is_control)
}

/// What is wrong with a session name (`field` names it in the message).
pub fn name_problem(field: &str, name: &str) -> Option<String> {
    if name.trim().is_empty() {
        Some(format!("{field} must not be empty"))
    } else if name.chars().count() > MAX_NAME_CHARS {
        Some(format!("{field}: at most {MAX_NAME_CHARS} characters"))
    } else if has_control_characters(name) {
        Some(format!("{field} must not contain control characters"))
    } else {
        None
    }
}

/// What is wrong with a set of tags.
pub fn tag_problems(field: &str, tags: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    if tags.len() > MAX_TAGS {
        problems.push(format!("{field}: at most {MAX_TAGS} pairs"));
    }
    for (key, value) in tags {
        if key.is_empty() || key.chars().count() > MAX_TAG_KEY_CHARS {
            problems.push(format!(
                "{field}: keys are 1 to {MAX_TAG_KEY_CHARS} characters, got {key:?}"
            ));
        } else if value.chars().count() > MAX_TAG_VALUE_CHARS {
            problems.push(format!(
                "{field}.{key}: values are at most {MAX_TAG_VALUE_CHARS} characters"
            ));
        } else if has_control_characters(key) || has_control_characters(value) {
            problems.push(format!("{field}.{key} must not contain control characters"));
        }
    }
    problems
}

/// What is wrong with a start URL: it must be http(s), and allowed by the session's
/// allowlist when it has one.
pub fn start_url_problem(url: &str, allowed: Option<&HostAllowlist>) -> Option<String> {
    if url.len() > MAX_START_URL_BYTES {
        return Some(format!("start_url: at most {} KiB", MAX_START_URL_BYTES / 1024));
    }
    let parsed = match url::Url::parse(url) {
        Ok(parsed) => parsed,
        Err(error) => return Some(format!("start_url: not a URL ({error})")),
    };
    if !matches!(parsed.scheme(), "http" | "https") {
        return Some(format!(
            "start_url must be an http or https URL, got scheme {:?}",
            parsed.scheme()
        ));
    }
    let host = parsed.host_str().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match allowed {
        Some(allowed) if !allowed.allows(host) => {
            Some(format!("start_url: {host} is not in network.allowed_hosts"))
        }
        _ => None,
    }
}

/// The location checked and canonicalized, or what is wrong with it.
pub fn location(request: &LocationRequest) -> Result<SessionLocation, Vec<String>> {
    let mut problems = Vec::new();
    let timezone = request.timezone.as_deref().and_then(|timezone| {
        let known = is_timezone_name(timezone) && Path::new(ZONEINFO).join(timezone).is_file();
        if !known {
            problems.push(format!("location.timezone: {timezone:?} is not an IANA timezone name"));
        }
        known.then(|| timezone.to_owned())
    });
    let locale = request.locale.as_deref().and_then(|locale| {
        let canonical = canonical_locale(locale);
        if canonical.is_none() {
            problems.push(format!(
                "location.locale: {locale:?} is not a BCP 47 locale (such as de-DE)"
            ));
        }
        canonical
    });
    if problems.is_empty() { Ok(SessionLocation { timezone, locale }) } else { Err(problems) }
}

/// Every timezone name `location` accepts here (the files of this host's zoneinfo
/// database), sorted.
pub fn timezone_names() -> Vec<String> {
    fn walk(dir: &Path, prefix: &str, names: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let Ok(file_name) = entry.file_name().into_string() else {
                continue;
            };
            let name = format!("{prefix}{file_name}");
            if !is_timezone_name(&name) {
                continue;
            }
            let path = entry.path();
            if path.is_dir() {
                walk(&path, &format!("{name}/"), names);
            } else if path.is_file() {
                names.push(name);
            }
        }
    }
    let mut names = Vec::new();
    walk(Path::new(ZONEINFO), "", &mut names);
    names.sort();
    names
}

/// `Area/City` style names only: no path tricks reach the zoneinfo lookup.
fn is_timezone_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.split('/').all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && part.chars().all(|c| c.is_ascii_alphanumeric() || "_+-".contains(c))
        })
}

/// `language[-Script][-REGION]` with the casing BCP 47 recommends (`zh-Hant-TW`), or
/// None when it is not of that form. `_` is accepted for `-`.
fn canonical_locale(locale: &str) -> Option<String> {
    let mut parts = locale.split(['-', '_']);
    let language = parts.next()?;
    if !(2..=3).contains(&language.len()) || !language.chars().all(|c| c.is_ascii_alphabetic()) {
        return None;
    }
    let mut canonical = vec![language.to_ascii_lowercase()];
    let (mut script_seen, mut region_seen) = (false, false);
    for part in parts {
        let letters = part.chars().all(|c| c.is_ascii_alphabetic());
        let digits = part.chars().all(|c| c.is_ascii_digit());
        if part.len() == 4 && letters && !script_seen && !region_seen {
            script_seen = true;
            let mut script = part.to_ascii_lowercase();
            script[..1].make_ascii_uppercase();
            canonical.push(script);
        } else if ((part.len() == 2 && letters) || (part.len() == 3 && digits)) && !region_seen {
            region_seen = true;
            canonical.push(part.to_ascii_uppercase());
        } else {
            return None;
        }
    }
    Some(canonical.join("-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locales_are_canonicalized_or_refused() {
        assert_eq!(canonical_locale("de-de").as_deref(), Some("de-DE"));
        assert_eq!(canonical_locale("zh_hant_tw").as_deref(), Some("zh-Hant-TW"));
        assert_eq!(canonical_locale("es-419").as_deref(), Some("es-419"));
        assert_eq!(canonical_locale("fr").as_deref(), Some("fr"));
        for bad in ["", "d", "deutsch", "de-DE-DE", "de--DE", "de-D3", "../x"] {
            assert_eq!(canonical_locale(bad), None, "{bad}");
        }
    }

    #[test]
    fn timezones_are_names_of_the_database() {
        let ok =
            location(&LocationRequest { timezone: Some("Europe/Berlin".into()), locale: None });
        assert!(ok.is_ok(), "{ok:?}");
        for bad in ["../../etc/passwd", "/etc/passwd", "Mars/Olympus", "", "Europe//Berlin"] {
            let refused = location(&LocationRequest { timezone: Some(bad.into()), locale: None });
            assert!(refused.is_err(), "{bad}");
        }
    }

    #[test]
    fn start_urls_are_web_urls_the_allowlist_admits() {
        assert_eq!(start_url_problem("https://example.com/x", None), None);
        assert!(start_url_problem("file:///etc/passwd", None).is_some());
        assert!(start_url_problem("not a url", None).is_some());
        let allowed = HostAllowlist::parse(&["example.com".to_owned()]).expect("valid");
        assert_eq!(start_url_problem("http://example.com/", Some(&allowed)), None);
        assert!(start_url_problem("http://other.org/", Some(&allowed)).is_some());
    }

    #[test]
    fn names_and_tags_are_bounded() {
        assert!(name_problem("name", "").is_some());
        assert!(name_problem("name", "a\nb").is_some());
        assert!(name_problem("name", &"x".repeat(256)).is_some());
        assert_eq!(name_problem("name", "checkout-bot"), None);
        let many: BTreeMap<String, String> =
            (0..51).map(|i| (format!("k{i}"), "v".to_owned())).collect();
        assert_eq!(tag_problems("tags", &many).len(), 1);
        let empty_key = BTreeMap::from([(String::new(), "v".to_owned())]);
        assert_eq!(tag_problems("tags", &empty_key).len(), 1);
    }
}
