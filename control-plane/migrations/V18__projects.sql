-- Projects scope every resource of an organization. Each organization gets its default
-- project (if it has none yet), which takes every row made before projects existed, so
-- that all of it stays reachable as it was.
ALTER TABLE projects ADD COLUMN max_concurrent_sessions BIGINT;
ALTER TABLE projects ADD COLUMN max_concurrent_invocations BIGINT;
ALTER TABLE projects ADD COLUMN deleted_at TIMESTAMPTZ;
-- A deleted project's name may be taken again.
DROP INDEX projects_name;
CREATE UNIQUE INDEX projects_live_name ON projects (org_id, name) WHERE deleted_at IS NULL;

INSERT INTO projects (id, org_id, name, status, is_default, created_at, updated_at)
    SELECT 'proj_' || o.id, o.id, 'default', 'active', TRUE, o.created_at, o.created_at
    FROM organizations o
    WHERE NOT EXISTS (SELECT 1 FROM projects p WHERE p.org_id = o.id AND p.is_default);
-- The cap organizations set (V17) is their default project's.
UPDATE projects SET max_concurrent_sessions = (SELECT o.default_project_max_concurrent_sessions
    FROM organizations o WHERE o.id = projects.org_id) WHERE is_default;

ALTER TABLE browser_sessions ADD COLUMN project_id TEXT;
UPDATE browser_sessions SET project_id = (SELECT p.id FROM projects p
    WHERE p.org_id = browser_sessions.org_id AND p.is_default);
ALTER TABLE browser_pools ADD COLUMN project_id TEXT;
UPDATE browser_pools SET project_id = (SELECT p.id FROM projects p
    WHERE p.org_id = browser_pools.org_id AND p.is_default);
ALTER TABLE profiles ADD COLUMN project_id TEXT;
UPDATE profiles SET project_id = (SELECT p.id FROM projects p
    WHERE p.org_id = profiles.org_id AND p.is_default);
ALTER TABLE extensions ADD COLUMN project_id TEXT;
UPDATE extensions SET project_id = (SELECT p.id FROM projects p
    WHERE p.org_id = extensions.org_id AND p.is_default);
ALTER TABLE proxies ADD COLUMN project_id TEXT;
UPDATE proxies SET project_id = (SELECT p.id FROM projects p
    WHERE p.org_id = proxies.org_id AND p.is_default);
ALTER TABLE auth_connections ADD COLUMN project_id TEXT;
UPDATE auth_connections SET project_id = (SELECT p.id FROM projects p
    WHERE p.org_id = auth_connections.org_id AND p.is_default);
ALTER TABLE secrets ADD COLUMN project_id TEXT;
UPDATE secrets SET project_id = (SELECT p.id FROM projects p
    WHERE p.org_id = secrets.org_id AND p.is_default);
ALTER TABLE deployments ADD COLUMN project_id TEXT;
UPDATE deployments SET project_id = (SELECT p.id FROM projects p
    WHERE p.org_id = deployments.org_id AND p.is_default);
ALTER TABLE app_versions ADD COLUMN project_id TEXT;
UPDATE app_versions SET project_id = (SELECT p.id FROM projects p
    WHERE p.org_id = app_versions.org_id AND p.is_default);
ALTER TABLE invocations ADD COLUMN project_id TEXT;
UPDATE invocations SET project_id = (SELECT p.id FROM projects p
    WHERE p.org_id = invocations.org_id AND p.is_default);
ALTER TABLE telemetry_destinations ADD COLUMN project_id TEXT;
UPDATE telemetry_destinations SET project_id = (SELECT p.id FROM projects p
    WHERE p.org_id = telemetry_destinations.org_id AND p.is_default);

-- Counting a project's live browsers for its limit.
CREATE INDEX browser_sessions_project_live ON browser_sessions (project_id) WHERE status <> 'ended';
