//! Secrets at rest (saved login values, credentials, providers' tokens), encrypted with
//! AES-256-GCM.
//!
//! The key comes from configuration (`--credential-key`, base64 of 32 bytes), or is
//! generated once into `<data-dir>/credential.key` (mode 0600). It is never in the
//! database, so a copy of the database alone does not reveal any credential.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use anyhow::{Context, anyhow, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rand::RngExt;

const NONCE_BYTES: usize = 12;
const KEY_FILE: &str = "credential.key";

pub struct Vault {
    cipher: Aes256Gcm,
}

/// Field name → value.
pub type Credentials = BTreeMap<String, String>;

impl Vault {
    /// The configured key, else the data directory's key file (created on first use).
    pub fn open(configured: Option<&str>, data_dir: &Path) -> anyhow::Result<Self> {
        let encoded = match configured {
            Some(key) => key.trim().to_owned(),
            None => key_file(&data_dir.join(KEY_FILE))?,
        };
        let key = STANDARD.decode(&encoded).context("the credential key is not base64")?;
        if key.len() != 32 {
            bail!("the credential key must be 32 bytes (base64), got {}", key.len());
        }
        let cipher = Aes256Gcm::new_from_slice(&key).map_err(|_| anyhow!("bad key length"))?;
        Ok(Self { cipher })
    }

    /// Random nonce, then ciphertext with its tag. `owner` (the connection) is bound in as
    /// associated data: sealed values copied to another connection do not open there.
    pub fn seal<T: serde::Serialize>(&self, secret: &T, owner: &str) -> anyhow::Result<Vec<u8>> {
        let plaintext = serde_json::to_vec(secret)?;
        let mut nonce = [0u8; NONCE_BYTES];
        rand::rng().fill(&mut nonce);
        let ciphertext = self
            .cipher
            .encrypt(&Nonce::from(nonce), Payload { msg: &plaintext, aad: owner.as_bytes() })
            .map_err(|_| anyhow!("encryption failed"))?;
        Ok([nonce.as_slice(), &ciphertext].concat())
    }

    pub fn open_sealed<T: serde::de::DeserializeOwned>(
        &self, sealed: &[u8], owner: &str,
    ) -> anyhow::Result<T> {
        if sealed.len() < NONCE_BYTES {
            bail!("sealed credentials are too short");
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_BYTES);
        let nonce: [u8; NONCE_BYTES] = nonce.try_into()?;
        let plaintext = self
            .cipher
            .decrypt(&Nonce::from(nonce), Payload { msg: ciphertext, aad: owner.as_bytes() })
            .map_err(|_| anyhow!("the credentials do not decrypt with this server's key"))?;
        Ok(serde_json::from_slice(&plaintext)?)
    }
}

fn key_file(path: &Path) -> anyhow::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(key) => return Ok(key.trim().to_owned()),
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            return Err(error).with_context(|| format!("reading {}", path.display()));
        }
        Err(_) => {}
    }
    let mut key = [0u8; 32];
    rand::rng().fill(&mut key);
    let encoded = STANDARD.encode(key);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(encoded.as_bytes())?;
    file.sync_all()?;
    Ok(encoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_credentials_open_with_the_same_key_only() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let vault = Vault::open(None, dir.path())?;
        let credentials = Credentials::from([("password".to_owned(), "hunter2".to_owned())]);
        let sealed = vault.seal(&credentials, "org/auth_1")?;
        assert!(!sealed.windows(7).any(|w| w == b"hunter2"));
        // The key file is reused on the next start.
        let reopened = Vault::open(None, dir.path())?;
        assert_eq!(reopened.open_sealed::<Credentials>(&sealed, "org/auth_1")?, credentials);
        assert!(reopened.open_sealed::<Credentials>(&sealed, "org/auth_2").is_err());
        let other = Vault::open(Some(&STANDARD.encode([7u8; 32])), dir.path())?;
        assert!(other.open_sealed::<Credentials>(&sealed, "org/auth_1").is_err());
        let mut tampered = sealed.clone();
        tampered[NONCE_BYTES] ^= 1;
        assert!(vault.open_sealed::<Credentials>(&tampered, "org/auth_1").is_err());
        Ok(())
    }
}
