//! Identifiers and secrets.

use rand::RngExt;
use rand::distr::Alphanumeric;

const ID_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// A random lowercase identifier such as `kz3v0m6d2q8h1c7b5n4x9r0t`. Session ids carry no
/// prefix (as the SDKs expect); other resources use `<prefix>_<random>`.
pub fn random_lowercase(length: usize) -> String {
    let mut rng = rand::rng();
    (0..length)
        .map(|_| ID_ALPHABET[rng.random_range(0..ID_ALPHABET.len())] as char)
        .collect()
}

pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_lowercase(20))
}

pub fn new_session_id() -> String {
    random_lowercase(24)
}

/// A 256-bit-strength secret of letters and digits.
pub fn new_secret(length: usize) -> String {
    rand::rng()
        .sample_iter(&Alphanumeric)
        .take(length)
        .map(char::from)
        .collect()
}
