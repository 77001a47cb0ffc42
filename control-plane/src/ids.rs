//! Identifiers, names and secrets.

use rand::RngExt;
use rand::distr::Alphanumeric;

const ID_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// A random lowercase identifier such as `kz3v0m6d2q8h1c7b5n4x9r0t`. Session ids carry no
/// prefix (as the SDKs expect); other resources use `<prefix>_<random>`.
pub fn random_lowercase(length: usize) -> String {
    let mut rng = rand::rng();
    (0..length).map(|_| ID_ALPHABET[rng.random_range(0..ID_ALPHABET.len())] as char).collect()
}

pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_lowercase(20))
}

pub fn new_session_id() -> String {
    random_lowercase(24)
}

/// A 256-bit-strength secret of letters and digits.
pub fn new_secret(length: usize) -> String {
    rand::rng().sample_iter(&Alphanumeric).take(length).map(char::from).collect()
}

/// Longest name of an extension or pool (extension names become directory names).
pub const MAX_NAME_BYTES: usize = 255;

/// Whether `name` matches `^[A-Za-z0-9._-]{1,255}$`.
pub fn valid_name(name: &str) -> bool {
    // `.` and `..` match the pattern but cannot name a directory.
    name != "."
        && name != ".."
        && (1..=MAX_NAME_BYTES).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

pub fn name_problem(field: &str, name: &str) -> Option<String> {
    (!valid_name(name))
        .then(|| format!("{field} must match ^[A-Za-z0-9._-]{{1,255}}$, got {name:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_documented_pattern() {
        for good in ["adblock", "My.Ext_1-2", &"a".repeat(255)] {
            assert!(valid_name(good), "{good}");
        }
        for bad in ["", ".", "..", "with space", "slash/name", "ünï", &"a".repeat(256)] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
