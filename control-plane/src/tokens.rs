//! Signed tokens carried in `cdp_ws_url`. A token names one session of one organization;
//! it carries no expiry because it is only honoured while that session lives (checked
//! against the store on every connection), and session ids are never reused.

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::store::{Store, StoreResult};

const SIGNING_KEY_SETTING: &str = "cdp_token_signing_key";
const CDP_AUDIENCE: &str = "cdp";

#[derive(Debug, Serialize, Deserialize)]
pub struct CdpClaims {
    /// Session id.
    pub sub: String,
    pub org: String,
    pub aud: String,
    pub iat: i64,
}

pub struct CdpTokens {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl CdpTokens {
    /// Loads the signing key shared by all replicas, creating it on first start.
    pub async fn load(store: &dyn Store) -> StoreResult<Self> {
        let candidate = crate::ids::new_secret(64);
        let key = store
            .setting_or_insert(SIGNING_KEY_SETTING, &candidate)
            .await?;
        Ok(Self::from_secret(key.as_bytes()))
    }

    pub fn from_secret(secret: &[u8]) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_audience(&[CDP_AUDIENCE]);
        validation.set_required_spec_claims(&["sub", "aud"]);
        validation.validate_exp = false;
        Self {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            validation,
        }
    }

    pub fn issue(&self, session_id: &str, org_id: &str) -> String {
        let claims = CdpClaims {
            sub: session_id.to_owned(),
            org: org_id.to_owned(),
            aud: CDP_AUDIENCE.to_owned(),
            iat: chrono::Utc::now().timestamp(),
        };
        // HS256 encoding of a small struct cannot fail.
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &self.encoding)
            .unwrap_or_default()
    }

    /// The claims of a genuine token, or `None`.
    pub fn verify(&self, token: &str) -> Option<CdpClaims> {
        jsonwebtoken::decode::<CdpClaims>(token, &self.decoding, &self.validation)
            .ok()
            .map(|data| data.claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_verifies_only_with_its_key_and_untouched() {
        let tokens = CdpTokens::from_secret(b"one key");
        let token = tokens.issue("session1", "org_a");
        let claims = tokens.verify(&token);
        assert_eq!(
            claims.map(|c| (c.sub, c.org)),
            Some(("session1".into(), "org_a".into()))
        );
        assert!(
            CdpTokens::from_secret(b"another key")
                .verify(&token)
                .is_none()
        );
        let mut tampered = token.clone();
        tampered.insert(token.len() / 2, 'x');
        assert!(tokens.verify(&tampered).is_none());
    }
}
