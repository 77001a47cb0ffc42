-- Proxies of an organization. `config` is the JSON object given at creation (the custom
-- type's password included: it is used, never returned). Deleting is soft: sessions
-- that reference a deleted proxy keep their reference and their route.
CREATE TABLE proxies (
    id            TEXT PRIMARY KEY,
    org_id        TEXT NOT NULL REFERENCES organizations(id),
    name          TEXT,
    type          TEXT NOT NULL,
    protocol      TEXT NOT NULL,
    bypass_hosts  TEXT NOT NULL,
    config        TEXT NOT NULL,
    status        TEXT,
    last_checked  TIMESTAMPTZ,
    ip_address    TEXT,
    check_error   TEXT,
    created_at    TIMESTAMPTZ NOT NULL,
    deleted_at    TIMESTAMPTZ
);

CREATE INDEX proxies_org ON proxies (org_id, created_at) WHERE deleted_at IS NULL;

-- Browser pools. `config` is the JSON of the pool's browser configuration.
CREATE TABLE browser_pools (
    id          TEXT PRIMARY KEY,
    org_id      TEXT NOT NULL REFERENCES organizations(id),
    name        TEXT,
    size        BIGINT NOT NULL,
    config      TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    deleted_at  TIMESTAMPTZ
);

CREATE UNIQUE INDEX browser_pools_name ON browser_pools (org_id, name)
    WHERE name IS NOT NULL AND deleted_at IS NULL;

-- A pool's browsers are sessions with its pool_id; pool_lease is idle, leased or
-- resetting (being cleaned for the next lessee).
ALTER TABLE browser_sessions ADD COLUMN proxy_id TEXT;
ALTER TABLE browser_sessions ADD COLUMN pool_id TEXT;
ALTER TABLE browser_sessions ADD COLUMN pool_lease TEXT;

CREATE INDEX browser_sessions_pool ON browser_sessions (pool_id, pool_lease, created_at)
    WHERE pool_id IS NOT NULL AND status <> 'ended';
