-- The audit log: every state-changing call and every refused one, per organization.
-- Paths are kept without their query (where signed tokens travel); no body, no secret.
CREATE TABLE audit_log (
    id             TEXT PRIMARY KEY,
    org_id         TEXT NOT NULL,
    ts_us          BIGINT NOT NULL,
    method         TEXT NOT NULL,
    path           TEXT NOT NULL,
    route          TEXT NOT NULL,
    status         BIGINT NOT NULL,
    duration_ms    BIGINT NOT NULL,
    client_ip      TEXT NOT NULL,
    user_agent     TEXT NOT NULL,
    domain         TEXT NOT NULL,
    auth_strategy  TEXT NOT NULL,
    api_key_id     TEXT NOT NULL,
    action         TEXT NOT NULL,
    resource       TEXT NOT NULL,
    outcome        TEXT NOT NULL,
    request_id     TEXT NOT NULL
);
CREATE INDEX audit_log_org_time ON audit_log (org_id, ts_us, id);
CREATE INDEX audit_log_time ON audit_log (ts_us);
