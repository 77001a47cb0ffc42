//! Signed-in sessions: a person after OpenID Connect, or an API key pasted into the
//! console's sign-in form. The browser holds only a random secret in an HttpOnly cookie
//! (`SESSION_COOKIE`); the store keeps its SHA-256 with the organization and the
//! principal, so that signing out ends the session everywhere at once (every replica
//! reads the same row) and a stolen cookie dies with it. A key's session acts with the
//! key's rights while the key lives: deleting the key, or its expiry, ends the session.

use chrono::Utc;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{SESSION_HOURS, SessionClaims};
use crate::store::{SignedInRecord, Store, StoreError, StoreResult};

/// Who a session is.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Principal {
    Person(SessionClaims),
    /// The key pasted at sign-in, by id (its secret is not kept).
    Key {
        key_id: String,
    },
}

fn hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Starts a session for `principal` in `org_id`; answers the secret for its cookie.
pub async fn start(store: &dyn Store, org_id: &str, principal: &Principal) -> StoreResult<String> {
    let secret = crate::ids::new_secret(32);
    let now = Utc::now();
    let principal = serde_json::to_string(principal)
        .map_err(|error| StoreError::Backend(format!("a session's principal: {error}")))?;
    store
        .insert_signed_in(&SignedInRecord {
            secret_hash: hash(&secret),
            org_id: org_id.to_owned(),
            principal,
            created_at: now,
            expires_at: now + chrono::Duration::hours(SESSION_HOURS),
        })
        .await?;
    Ok(secret)
}

/// The live session whose cookie holds `secret`: its organization and principal.
pub async fn resolve(store: &dyn Store, secret: &str) -> StoreResult<Option<(String, Principal)>> {
    let Some(record) = store.signed_in(&hash(secret), Utc::now()).await? else {
        return Ok(None);
    };
    // A row this version cannot read is no session (never an error for the caller).
    Ok(serde_json::from_str(&record.principal).ok().map(|principal| (record.org_id, principal)))
}

/// Ends the session whose cookie holds `secret`.
pub async fn end(store: &dyn Store, secret: &str) -> StoreResult<bool> {
    store.delete_signed_in(&hash(secret)).await
}
