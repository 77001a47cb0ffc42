-- The replica that serves a session (its launch, its egress, the watch on its agent),
-- and when the session was last used through any replica (its inactivity timeout).
ALTER TABLE browser_sessions ADD COLUMN owner TEXT;
ALTER TABLE browser_sessions ADD COLUMN last_active_at TIMESTAMPTZ;

-- Where each replica answers the others (requests for the work only one replica runs).
CREATE TABLE replicas (
    id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    joined_at TIMESTAMPTZ NOT NULL
);
