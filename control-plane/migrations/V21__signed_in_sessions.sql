-- Sessions of people and of API keys signed in to the console (an HttpOnly cookie holds
-- the secret; only its SHA-256 is kept here, so that signing out, or an operator
-- deleting rows, ends a session on every replica at once).
CREATE TABLE signed_in_sessions (
    secret_hash  TEXT PRIMARY KEY,
    org_id       TEXT NOT NULL REFERENCES organizations(id),
    principal    TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    expires_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX signed_in_sessions_expiry ON signed_in_sessions (expires_at);
