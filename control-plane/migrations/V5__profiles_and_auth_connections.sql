-- Browser profiles. The stored state (a ZIP of Chromium user data) is the blob
-- `profiles/<id>.zip`, present once a session saved it (size_bytes and updated_at set).
CREATE TABLE profiles (
    id            TEXT PRIMARY KEY,
    org_id        TEXT NOT NULL REFERENCES organizations(id),
    name          TEXT,
    created_at    TIMESTAMPTZ NOT NULL,
    updated_at    TIMESTAMPTZ,
    last_used_at  TIMESTAMPTZ,
    size_bytes    BIGINT
);

CREATE UNIQUE INDEX profiles_name ON profiles (org_id, name) WHERE name IS NOT NULL;

-- The profile a session was started with, and whether it saves its state back on end.
ALTER TABLE browser_sessions ADD COLUMN profile_id TEXT;
ALTER TABLE browser_sessions ADD COLUMN profile_save_changes BOOLEAN;

-- Auth connections (managed auth). `document` is the JSON of the connection's settings and
-- its workflow's durable state (flow, health-check schedule), owned by the auth module.
-- `credentials` are the saved login values, encrypted (AES-256-GCM) with the server's key.
CREATE TABLE auth_connections (
    id            TEXT PRIMARY KEY,
    org_id        TEXT NOT NULL REFERENCES organizations(id),
    domain        TEXT NOT NULL,
    profile_name  TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL,
    document      TEXT NOT NULL,
    credentials   BYTEA
);

CREATE UNIQUE INDEX auth_connections_target ON auth_connections (org_id, profile_name, domain);
