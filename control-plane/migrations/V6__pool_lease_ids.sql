-- Each lease of a pool browser has an id; the CDP URLs handed to a lessee name it, so they
-- stop working when the lease ends.
ALTER TABLE browser_sessions ADD COLUMN pool_lease_id TEXT;
