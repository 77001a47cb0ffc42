-- The replica that serves a session (its launch, its egress, the watch on its agent),
-- and when the session was last used through any replica (its inactivity timeout).
ALTER TABLE browser_sessions ADD COLUMN owner TEXT;
ALTER TABLE browser_sessions ADD COLUMN last_active_at TIMESTAMPTZ;
