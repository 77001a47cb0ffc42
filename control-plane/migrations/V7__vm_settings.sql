-- What a browser VM was created with beyond its launch options: network.allowed_hosts,
-- memory and chrome_policy (a JSON object; empty when none was given).
ALTER TABLE browser_sessions ADD COLUMN vm_settings TEXT;
