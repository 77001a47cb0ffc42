-- An organization's own cap on its concurrent browsers (on-demand and pool
-- reservations together), below the server's; NULL: none but the server's.
ALTER TABLE organizations ADD COLUMN default_project_max_concurrent_sessions BIGINT;
