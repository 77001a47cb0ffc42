-- Credentials and credential providers of an organization, one table for both (`kind`).
-- `document` is the JSON of the record's public settings, owned by the credentials
-- module; `sealed` holds its secrets (login values and TOTP seed, or a provider's token),
-- encrypted (AES-256-GCM) with the server's key and bound to the record.
CREATE TABLE secrets (
    id            TEXT PRIMARY KEY,
    org_id        TEXT NOT NULL REFERENCES organizations(id),
    kind          TEXT NOT NULL,
    name          TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL,
    document      TEXT NOT NULL,
    sealed        BYTEA
);

CREATE UNIQUE INDEX secrets_name ON secrets (org_id, kind, name);
