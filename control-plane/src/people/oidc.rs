//! The operator's OpenID Connect provider: its discovery document, its signing keys
//! (JWKS, read for every sign-in: a key it rotated out is not trusted a moment longer),
//! the authorization-code exchange with PKCE, and the checks an ID token must pass
//! (signature, issuer, audience, expiry, nonce) before anyone is signed in with it.

use std::time::Duration;

use base64::Engine;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::Digest;

/// `--oidc-*`: where the provider is and who we are to it. (No `Debug`: it holds the
/// client secret.)
#[derive(Clone)]
pub struct OidcSettings {
    /// The issuer URL; its discovery document is `<issuer>/.well-known/openid-configuration`.
    pub issuer: String,
    pub client_id: String,
    pub client_secret: String,
    /// The claim whose value names the person's organization.
    pub organization_claim: String,
    /// The claim whose value is the person's role: `admin`, `member` or `viewer`.
    pub role_claim: String,
}

/// What discovery tells us (the fields we use).
#[derive(Clone, Debug, Deserialize)]
struct Discovery {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
}

/// Clock skew tolerated on `exp`, `iat` and `nbf`.
const LEEWAY_SECONDS: u64 = 60;

pub struct OidcProvider {
    settings: OidcSettings,
    http: reqwest::Client,
    discovery: tokio::sync::OnceCell<Discovery>,
}

/// Why a sign-in failed, said to the person (never with a token or a secret in it).
#[derive(Debug, thiserror::Error)]
pub enum SignInError {
    #[error("the identity provider cannot be reached or answered badly: {0}")]
    Provider(String),
    #[error("the identity provider's token is not acceptable: {0}")]
    Token(String),
}

/// A PKCE verifier and its S256 challenge (RFC 7636).
pub fn pkce_challenge(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier))
}

/// Names the provider, never the client secret.
impl std::fmt::Debug for OidcProvider {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("OidcProvider")
            .field("issuer", &self.settings.issuer)
            .field("client_id", &self.settings.client_id)
            .finish_non_exhaustive()
    }
}

impl OidcProvider {
    pub fn new(settings: OidcSettings) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Self { settings, http, discovery: tokio::sync::OnceCell::new() })
    }

    pub fn settings(&self) -> &OidcSettings {
        &self.settings
    }

    async fn discovery(&self) -> Result<&Discovery, SignInError> {
        self.discovery
            .get_or_try_init(|| async {
                let url = format!(
                    "{}/.well-known/openid-configuration",
                    self.settings.issuer.trim_end_matches('/')
                );
                let discovery: Discovery = self.get_json(&url).await?;
                // The document must be the issuer's own (OpenID Connect Discovery 4.3).
                if discovery.issuer.trim_end_matches('/')
                    != self.settings.issuer.trim_end_matches('/')
                {
                    return Err(SignInError::Provider(format!(
                        "its discovery document names issuer {}, not {}",
                        discovery.issuer, self.settings.issuer
                    )));
                }
                Ok(discovery)
            })
            .await
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, SignInError> {
        let response = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|error| SignInError::Provider(format!("GET {url}: {error}")))?;
        if !response.status().is_success() {
            return Err(SignInError::Provider(format!("GET {url}: {}", response.status())));
        }
        response.json().await.map_err(|error| SignInError::Provider(format!("GET {url}: {error}")))
    }

    /// Where to send the person's browser to sign in.
    pub async fn authorization_url(
        &self, redirect_uri: &str, state: &str, nonce: &str, verifier: &str,
    ) -> Result<String, SignInError> {
        let discovery = self.discovery().await?;
        let mut url = url::Url::parse(&discovery.authorization_endpoint)
            .map_err(|error| SignInError::Provider(format!("authorization_endpoint: {error}")))?;
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &self.settings.client_id)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("scope", "openid email profile")
            .append_pair("state", state)
            .append_pair("nonce", nonce)
            .append_pair("code_challenge", &pkce_challenge(verifier))
            .append_pair("code_challenge_method", "S256");
        Ok(url.into())
    }

    /// Exchanges the authorization code for the person's verified ID token claims.
    pub async fn sign_in(
        &self, code: &str, redirect_uri: &str, verifier: &str, nonce: &str,
    ) -> Result<Map<String, Value>, SignInError> {
        #[derive(Deserialize)]
        struct TokenResponse {
            id_token: String,
        }
        let discovery = self.discovery().await?;
        let response = self
            .http
            .post(&discovery.token_endpoint)
            .basic_auth(&self.settings.client_id, Some(&self.settings.client_secret))
            .form(&[
                ("grant_type", "authorization_code"),
                ("code", code),
                ("redirect_uri", redirect_uri),
                ("code_verifier", verifier),
            ])
            .send()
            .await
            .map_err(|error| SignInError::Provider(format!("token endpoint: {error}")))?;
        if !response.status().is_success() {
            return Err(SignInError::Provider(format!(
                "the token endpoint refused the code: {}",
                response.status()
            )));
        }
        let tokens: TokenResponse = response
            .json()
            .await
            .map_err(|error| SignInError::Provider(format!("token endpoint: {error}")))?;
        self.verify_id_token(&tokens.id_token, nonce).await
    }

    /// The ID token's claims, once its signature (by a key of the provider's JWKS),
    /// issuer, audience, expiry and nonce are right.
    pub async fn verify_id_token(
        &self, token: &str, nonce: &str,
    ) -> Result<Map<String, Value>, SignInError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|error| SignInError::Token(format!("unreadable: {error}")))?;
        if !matches!(
            header.alg,
            Algorithm::RS256
                | Algorithm::RS384
                | Algorithm::RS512
                | Algorithm::ES256
                | Algorithm::PS256
        ) {
            return Err(SignInError::Token(format!(
                "signed with {:?}, which this server does not accept",
                header.alg
            )));
        }
        let key = self.key_for(header.kid.as_deref()).await?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[self.discovery().await?.issuer.as_str()]);
        validation.set_audience(&[self.settings.client_id.as_str()]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = LEEWAY_SECONDS;
        let claims = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation)
            .map_err(|error| SignInError::Token(error.to_string()))?
            .claims;
        if claims.get("nonce").and_then(Value::as_str) != Some(nonce) {
            return Err(SignInError::Token(
                "its nonce is not this sign-in's (a replayed token?)".into(),
            ));
        }
        Ok(claims)
    }

    /// The provider's key `kid`, from the keys it publishes now: fetched for every
    /// sign-in (people sign in rarely), so that a key it rotated out is refused at once.
    async fn key_for(&self, kid: Option<&str>) -> Result<DecodingKey, SignInError> {
        let set: JwkSet = self.get_json(&self.discovery().await?.jwks_uri).await?;
        let jwk = match kid {
            Some(kid) => set.find(kid),
            None if set.keys.len() == 1 => set.keys.first(),
            None => None,
        }
        .ok_or_else(|| {
            SignInError::Token(format!("it names key {kid:?}, which the provider does not publish"))
        })?;
        DecodingKey::from_jwk(jwk)
            .map_err(|error| SignInError::Provider(format!("its key {kid:?}: {error}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkce_challenge_is_rfc_7636s() {
        // RFC 7636, appendix B.
        assert_eq!(
            pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }
}
