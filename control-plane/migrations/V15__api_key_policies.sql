-- API keys managed over HTTP: a label, an optional project and policy (JSON), an expiry,
-- soft deletion, when each was last used, who made it (JSON) and the last characters of
-- the secret for the masked form. Keys made before have none of these.
ALTER TABLE api_keys ADD COLUMN name TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN project_id TEXT;
ALTER TABLE api_keys ADD COLUMN policy TEXT;
ALTER TABLE api_keys ADD COLUMN expires_at TIMESTAMPTZ;
ALTER TABLE api_keys ADD COLUMN deleted_at TIMESTAMPTZ;
ALTER TABLE api_keys ADD COLUMN last_used_at TIMESTAMPTZ;
ALTER TABLE api_keys ADD COLUMN created_by TEXT;
ALTER TABLE api_keys ADD COLUMN secret_tail TEXT NOT NULL DEFAULT '';
CREATE INDEX api_keys_org ON api_keys (org_id);

-- Each organization's projects; the default one holds everything made without a project.
CREATE TABLE projects (
    id          TEXT PRIMARY KEY,
    org_id      TEXT NOT NULL REFERENCES organizations(id),
    name        TEXT NOT NULL,
    status      TEXT NOT NULL,
    is_default  BOOLEAN NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL
);
CREATE UNIQUE INDEX projects_name ON projects (org_id, name);
CREATE UNIQUE INDEX projects_default ON projects (org_id) WHERE is_default;
