-- An organization's extension library. The archive itself lives in the blob store
-- under `blob_key`.
CREATE TABLE extensions (
    id            TEXT PRIMARY KEY,
    org_id        TEXT NOT NULL REFERENCES organizations(id),
    name          TEXT,
    size_bytes    BIGINT NOT NULL,
    blob_key      TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL,
    last_used_at  TIMESTAMPTZ
);

CREATE UNIQUE INDEX extensions_name ON extensions (org_id, name) WHERE name IS NOT NULL;
CREATE INDEX extensions_org ON extensions (org_id, created_at);
