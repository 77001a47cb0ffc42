//! Signed tokens (HS256 JWTs) in the URLs we hand out. Each kind has its own audience, so
//! a token of one kind is never accepted as another.
//! - `cdp_ws_url`: names one session of one organization. No expiry: it is honoured only
//!   while that session lives (checked against the store on every connection), and
//!   session ids are never reused.
//! - `browser_live_view_url`: names one session of one organization (and lease), and
//!   whether input is allowed. No expiry, like `cdp_ws_url`: honoured only while that
//!   session (and lease) lives.
//! - `replay_view_url`: names one replay of one session and organization, and expires
//!   (`REPLAY_VIEW_TTL`): anyone holding the URL can watch the video until then.
//! - `inspector_url`: names one session of one organization, and expires like a
//!   `replay_view_url`: anyone holding it can read the session's telemetry (and watch
//!   its replays) in the inspector page until then.
//! - an invocation's API key (`ik_<JWT>`, in the action's `KERNEL_API_KEY`): names one
//!   invocation of one organization, and expires with the invocation's time limit; it is
//!   honoured only while the invocation has not finished (checked on every request).

use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::store::{Store, StoreResult};

const SIGNING_KEY_SETTING: &str = "cdp_token_signing_key";
const CDP_AUDIENCE: &str = "cdp";
const REPLAY_VIEW_AUDIENCE: &str = "replay-view";
const HOSTED_LOGIN_AUDIENCE: &str = "hosted-login";
const LIVE_VIEW_AUDIENCE: &str = "live-view";
const FLOW_LIVE_VIEW_AUDIENCE: &str = "login-live-view";
const INVOCATION_AUDIENCE: &str = "invocation";
const INSPECTOR_AUDIENCE: &str = "inspector";
/// What starts an invocation's API key, so that it is told from a JWT of another kind.
const INVOCATION_KEY_PREFIX: &str = "ik_";
/// How long a `replay_view_url` works after it was issued (every response that carries
/// one issues a fresh one).
pub const REPLAY_VIEW_TTL: chrono::Duration = chrono::Duration::hours(24);

/// A `cdp_ws_url`'s or a live view's token: one session of one organization, for as long
/// as the session lives. Each kind has its own audience.
#[derive(Debug, Serialize, Deserialize)]
pub struct SessionClaims {
    /// Session id.
    pub sub: String,
    pub org: String,
    pub aud: String,
    pub iat: i64,
    /// For a leased pool browser: the lease the token was issued for; it is refused
    /// once that lease ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// Live view only: watch only, the viewer's input is ignored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ReplayViewClaims {
    /// Replay id.
    pub sub: String,
    pub org: String,
    /// Session id.
    pub sid: String,
    pub aud: String,
    pub iat: i64,
    pub exp: i64,
}

/// A token for one resource of one organization, until it expires: an `inspector_url`
/// (a session's telemetry and replays), a login flow's `hosted_url` and `live_view_url`
/// (an auth connection; they expire with the flow). Each kind has its own audience.
#[derive(Debug, Serialize, Deserialize)]
pub struct ScopedClaims {
    /// Session id (inspector) or auth connection id (login flows).
    pub sub: String,
    pub org: String,
    pub aud: String,
    pub iat: i64,
    pub exp: i64,
}

/// An invocation's API key.
#[derive(Debug, Serialize, Deserialize)]
pub struct InvocationClaims {
    /// Invocation id.
    pub sub: String,
    pub org: String,
    /// The API key that started the invocation: its action acts with that key's rights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub aud: String,
    pub iat: i64,
    pub exp: i64,
}

pub struct Tokens {
    encoding: EncodingKey,
    decoding: DecodingKey,
    cdp: Validation,
    replay_view: Validation,
    hosted_login: Validation,
    live_view: Validation,
    flow_live_view: Validation,
    invocation: Validation,
    inspector: Validation,
    /// What a request forwarded by another replica carries to show it was: derived from
    /// the key all replicas share, unknown to clients.
    forwarding_proof: String,
}

impl Tokens {
    /// Loads the signing key shared by all replicas, creating it on first start.
    pub async fn load(store: &dyn Store) -> StoreResult<Self> {
        let candidate = crate::ids::new_secret(64);
        let key = store.setting_or_insert(SIGNING_KEY_SETTING, &candidate).await?;
        Ok(Self::from_secret(key.as_bytes()))
    }

    pub fn from_secret(secret: &[u8]) -> Self {
        let mut cdp = Validation::new(Algorithm::HS256);
        cdp.set_audience(&[CDP_AUDIENCE]);
        cdp.set_required_spec_claims(&["sub", "aud"]);
        cdp.validate_exp = false;
        let mut replay_view = Validation::new(Algorithm::HS256);
        replay_view.set_audience(&[REPLAY_VIEW_AUDIENCE]);
        replay_view.set_required_spec_claims(&["sub", "aud", "exp"]);
        replay_view.leeway = 0;
        let mut hosted_login = replay_view.clone();
        hosted_login.set_audience(&[HOSTED_LOGIN_AUDIENCE]);
        let mut live_view = cdp.clone();
        live_view.set_audience(&[LIVE_VIEW_AUDIENCE]);
        let mut flow_live_view = replay_view.clone();
        flow_live_view.set_audience(&[FLOW_LIVE_VIEW_AUDIENCE]);
        let mut invocation = replay_view.clone();
        invocation.set_audience(&[INVOCATION_AUDIENCE]);
        let mut inspector = replay_view.clone();
        inspector.set_audience(&[INSPECTOR_AUDIENCE]);
        let forwarding_proof = {
            use sha2::Digest;
            let mut digest = sha2::Sha256::new();
            digest.update(b"forwarded between replicas\0");
            digest.update(secret);
            hex::encode(digest.finalize())
        };
        Self {
            forwarding_proof,
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            cdp,
            replay_view,
            hosted_login,
            live_view,
            flow_live_view,
            invocation,
            inspector,
        }
    }

    /// The header value a replica forwarding a request sets.
    pub fn forwarding_proof(&self) -> &str {
        &self.forwarding_proof
    }

    /// Whether a request was forwarded by a replica (not sent by a client as if it were).
    pub fn is_forwarded(&self, presented: &[u8]) -> bool {
        subtle::ConstantTimeEq::ct_eq(presented, self.forwarding_proof.as_bytes()).into()
    }

    /// Signs claims of a kind defined elsewhere (`crate::people`), told apart from every
    /// other kind by their `aud`.
    pub fn issue_claims(&self, claims: &impl Serialize) -> String {
        self.sign(claims)
    }

    /// Verifies a token of another module's kind: `audience`, unexpired (`exp`).
    pub fn verify_claims<T: serde::de::DeserializeOwned>(
        &self, token: &str, audience: &str,
    ) -> Option<T> {
        let mut validation = self.replay_view.clone();
        validation.set_audience(&[audience]);
        validation.set_required_spec_claims(&["aud", "exp"]);
        self.decode(&validation, token)
    }

    /// The claims of a genuine token that `validation` accepts (its audience, unexpired),
    /// or `None`.
    fn decode<T: serde::de::DeserializeOwned>(
        &self, validation: &Validation, token: &str,
    ) -> Option<T> {
        jsonwebtoken::decode::<T>(token, &self.decoding, validation).ok().map(|data| data.claims)
    }

    fn sign(&self, claims: &impl Serialize) -> String {
        // HS256 encoding of a small struct cannot fail.
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &self.encoding)
            .unwrap_or_default()
    }

    pub fn issue_cdp(&self, session_id: &str, org_id: &str, lease: Option<&str>) -> String {
        self.sign(&SessionClaims {
            sub: session_id.to_owned(),
            org: org_id.to_owned(),
            aud: CDP_AUDIENCE.to_owned(),
            iat: Utc::now().timestamp(),
            lease: lease.map(str::to_owned),
            read_only: false,
        })
    }

    /// The claims of a genuine CDP token, or `None`.
    pub fn verify_cdp(&self, token: &str) -> Option<SessionClaims> {
        self.decode(&self.cdp, token)
    }

    pub fn issue_live_view(
        &self, session_id: &str, org_id: &str, lease: Option<&str>, read_only: bool,
    ) -> String {
        self.sign(&SessionClaims {
            sub: session_id.to_owned(),
            org: org_id.to_owned(),
            aud: LIVE_VIEW_AUDIENCE.to_owned(),
            iat: Utc::now().timestamp(),
            lease: lease.map(str::to_owned),
            read_only,
        })
    }

    /// The claims of a genuine live-view token, or `None`.
    pub fn verify_live_view(&self, token: &str) -> Option<SessionClaims> {
        self.decode(&self.live_view, token)
    }

    pub fn issue_replay_view(
        &self, replay_id: &str, session_id: &str, org_id: &str, expires_at: DateTime<Utc>,
    ) -> String {
        self.sign(&ReplayViewClaims {
            sub: replay_id.to_owned(),
            org: org_id.to_owned(),
            sid: session_id.to_owned(),
            aud: REPLAY_VIEW_AUDIENCE.to_owned(),
            iat: Utc::now().timestamp(),
            exp: expires_at.timestamp(),
        })
    }

    pub fn issue_hosted_login(
        &self, connection_id: &str, org_id: &str, expires_at: DateTime<Utc>,
    ) -> String {
        self.issue_scoped(HOSTED_LOGIN_AUDIENCE, connection_id, org_id, expires_at)
    }

    /// A login flow's `live_view_url`: its browser, for one auth connection of one
    /// organization, until the flow expires. Apart from `hosted_url`'s token: a link to
    /// the form does not give control of the browser.
    pub fn issue_flow_live_view(
        &self, connection_id: &str, org_id: &str, expires_at: DateTime<Utc>,
    ) -> String {
        self.issue_scoped(FLOW_LIVE_VIEW_AUDIENCE, connection_id, org_id, expires_at)
    }

    /// A token of `audience` for `subject` of one organization, until `expires_at`.
    fn issue_scoped(
        &self, audience: &str, subject: &str, org_id: &str, expires_at: DateTime<Utc>,
    ) -> String {
        self.sign(&ScopedClaims {
            sub: subject.to_owned(),
            org: org_id.to_owned(),
            aud: audience.to_owned(),
            iat: Utc::now().timestamp(),
            exp: expires_at.timestamp(),
        })
    }

    pub fn verify_flow_live_view(&self, token: &str) -> Option<ScopedClaims> {
        self.decode(&self.flow_live_view, token)
    }

    /// The claims of a genuine, unexpired hosted-login token, or `None`.
    pub fn verify_hosted_login(&self, token: &str) -> Option<ScopedClaims> {
        self.decode(&self.hosted_login, token)
    }

    /// An API key for the action of one invocation, valid until `expires`.
    pub fn issue_invocation_key(
        &self, invocation_id: &str, org_id: &str, key_id: Option<&str>, expires: DateTime<Utc>,
    ) -> String {
        let token = self.sign(&InvocationClaims {
            sub: invocation_id.to_owned(),
            org: org_id.to_owned(),
            key: key_id.map(str::to_owned),
            aud: INVOCATION_AUDIENCE.to_owned(),
            iat: Utc::now().timestamp(),
            exp: expires.timestamp(),
        });
        format!("{INVOCATION_KEY_PREFIX}{token}")
    }

    /// The claims of a genuine, unexpired invocation key, or `None`.
    pub fn verify_invocation_key(&self, key: &str) -> Option<InvocationClaims> {
        let token = key.strip_prefix(INVOCATION_KEY_PREFIX)?;
        self.decode(&self.invocation, token)
    }

    pub fn issue_inspector(
        &self, session_id: &str, org_id: &str, expires_at: DateTime<Utc>,
    ) -> String {
        self.issue_scoped(INSPECTOR_AUDIENCE, session_id, org_id, expires_at)
    }

    /// The claims of a genuine, unexpired inspector token, or `None`.
    pub fn verify_inspector(&self, token: &str) -> Option<ScopedClaims> {
        self.decode(&self.inspector, token)
    }

    /// The claims of a genuine, unexpired replay-view token, or `None`.
    pub fn verify_replay_view(&self, token: &str) -> Option<ReplayViewClaims> {
        self.decode(&self.replay_view, token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_verifies_only_with_its_key_and_untouched() {
        let tokens = Tokens::from_secret(b"one key");
        let token = tokens.issue_cdp("session1", "org_a", None);
        let claims = tokens.verify_cdp(&token);
        assert_eq!(claims.map(|c| (c.sub, c.org)), Some(("session1".into(), "org_a".into())));
        assert!(Tokens::from_secret(b"another key").verify_cdp(&token).is_none());
        let mut tampered = token.clone();
        tampered.insert(token.len() / 2, 'x');
        assert!(tokens.verify_cdp(&tampered).is_none());
    }

    #[test]
    fn replay_view_tokens_expire_and_are_not_cdp_tokens() {
        let tokens = Tokens::from_secret(b"one key");
        let later = Utc::now() + chrono::Duration::minutes(5);
        let view = tokens.issue_replay_view("rpl_1", "session1", "org_a", later);
        let claims = tokens.verify_replay_view(&view);
        assert_eq!(
            claims.map(|c| (c.sub, c.sid, c.org)),
            Some(("rpl_1".into(), "session1".into(), "org_a".into()))
        );
        let expired = tokens.issue_replay_view(
            "rpl_1",
            "session1",
            "org_a",
            Utc::now() - chrono::Duration::seconds(1),
        );
        assert!(tokens.verify_replay_view(&expired).is_none());
        // Neither kind passes as the other.
        assert!(tokens.verify_cdp(&view).is_none());
        let cdp = tokens.issue_cdp("session1", "org_a", None);
        assert!(tokens.verify_replay_view(&cdp).is_none());
    }

    #[test]
    fn live_view_tokens_carry_their_mode_and_are_no_other_kind() {
        let tokens = Tokens::from_secret(b"one key");
        let view = tokens.issue_live_view("session1", "org_a", Some("lease1"), true);
        let claims = tokens.verify_live_view(&view).expect("valid");
        assert_eq!(
            (claims.sub.as_str(), claims.org.as_str(), claims.lease.as_deref()),
            ("session1", "org_a", Some("lease1"))
        );
        assert!(claims.read_only);
        assert!(tokens.verify_cdp(&view).is_none(), "not a CDP token");
        let cdp = tokens.issue_cdp("session1", "org_a", None);
        assert!(tokens.verify_live_view(&cdp).is_none(), "CDP tokens do not open it");
    }
}
