CREATE TABLE organizations (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    created_at  TIMESTAMPTZ NOT NULL
);

-- Keys are `<prefix>_<key id>_<secret>`; only a SHA-256 of the secret is kept.
CREATE TABLE api_keys (
    id           TEXT PRIMARY KEY,
    org_id       TEXT NOT NULL REFERENCES organizations(id),
    secret_hash  BYTEA NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL
);

CREATE TABLE settings (
    key    TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);

CREATE TABLE browser_sessions (
    id                     TEXT PRIMARY KEY,
    org_id                 TEXT NOT NULL REFERENCES organizations(id),
    persistent_id          TEXT,
    headless               BOOLEAN NOT NULL,
    stealth                BOOLEAN NOT NULL,
    kiosk_mode             BOOLEAN NOT NULL,
    timeout_seconds        BIGINT NOT NULL,
    viewport_width         BIGINT NOT NULL,
    viewport_height        BIGINT NOT NULL,
    viewport_refresh_rate  BIGINT,
    status                 TEXT NOT NULL CHECK (status IN ('starting', 'running', 'ended')),
    created_at             TIMESTAMPTZ NOT NULL,
    ended_at               TIMESTAMPTZ,
    end_reason             TEXT,
    agent_endpoint         TEXT,
    agent_secret           TEXT,
    agent_pid              BIGINT,
    vm_root                TEXT
);

CREATE INDEX browser_sessions_org ON browser_sessions (org_id, created_at);
CREATE INDEX browser_sessions_live ON browser_sessions (status) WHERE status <> 'ended';
-- One live session per persistent id and organization; concurrent creates race here.
CREATE UNIQUE INDEX browser_sessions_persistent ON browser_sessions (org_id, persistent_id)
    WHERE persistent_id IS NOT NULL AND status <> 'ended';
