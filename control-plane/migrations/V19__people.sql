-- People who sign in (OpenID Connect) act too: the audit log names them.
ALTER TABLE audit_log ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
ALTER TABLE audit_log ADD COLUMN email TEXT NOT NULL DEFAULT '';
