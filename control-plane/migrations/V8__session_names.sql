-- A browser session's name: unique among the organization's live sessions, so that it
-- addresses the session wherever an id does. Ended sessions free their names.
ALTER TABLE browser_sessions ADD COLUMN name TEXT;
CREATE UNIQUE INDEX browser_sessions_live_name ON browser_sessions (org_id, name)
    WHERE name IS NOT NULL AND status <> 'ended';
