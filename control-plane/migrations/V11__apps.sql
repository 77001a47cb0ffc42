-- Apps as code: deployments (an uploaded or fetched source, built into a runnable app),
-- the app versions a successful build published, and invocations of their actions.
-- `document` columns hold JSON owned by the apps module; `sealed` a deployment's
-- environment variable values, encrypted (AES-256-GCM) with the server's key.
CREATE TABLE deployments (
    id          TEXT PRIMARY KEY,
    org_id      TEXT NOT NULL REFERENCES organizations(id),
    status      TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL,
    document    TEXT NOT NULL,
    sealed      BYTEA
);

CREATE INDEX deployments_org ON deployments (org_id, created_at);

-- One row per app a running deployment defines; an organization has one app of a name
-- per version. (`deployment_id` has no foreign key: a deployment's delete removes its
-- rows first, and a build that publishes meanwhile removes its own once it finds the
-- deployment gone.)
CREATE TABLE app_versions (
    id             TEXT PRIMARY KEY,
    org_id         TEXT NOT NULL REFERENCES organizations(id),
    app_name       TEXT NOT NULL,
    version        TEXT NOT NULL,
    deployment_id  TEXT NOT NULL,
    actions        TEXT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL
);

CREATE UNIQUE INDEX app_versions_name ON app_versions (org_id, app_name, version);

CREATE TABLE invocations (
    id             TEXT PRIMARY KEY,
    org_id         TEXT NOT NULL REFERENCES organizations(id),
    deployment_id  TEXT NOT NULL,
    app_name       TEXT NOT NULL,
    action_name    TEXT NOT NULL,
    version        TEXT NOT NULL,
    status         TEXT NOT NULL,
    started_at     TIMESTAMPTZ NOT NULL,
    finished_at    TIMESTAMPTZ,
    document       TEXT NOT NULL
);

CREATE INDEX invocations_org ON invocations (org_id, started_at);
