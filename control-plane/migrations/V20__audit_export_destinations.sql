-- Where an organization's audit log is delivered (S3, through a role it trusts us to
-- assume), and how far delivery got: the last record delivered (`cursor_ts_us`,
-- `cursor_id`), failures and when to try again.
CREATE TABLE audit_export_destinations (
    id                    TEXT PRIMARY KEY,
    org_id                TEXT NOT NULL REFERENCES organizations(id),
    bucket                TEXT NOT NULL,
    prefix                TEXT NOT NULL,
    region                TEXT NOT NULL,
    role_arn              TEXT NOT NULL,
    kms_key_id            TEXT,
    external_id           TEXT NOT NULL,
    status                TEXT NOT NULL,
    created_at            TIMESTAMPTZ NOT NULL,
    updated_at            TIMESTAMPTZ NOT NULL,
    cursor_ts_us          BIGINT NOT NULL,
    cursor_id             TEXT NOT NULL,
    consecutive_failures  BIGINT NOT NULL DEFAULT 0,
    last_error            TEXT,
    last_error_at         TIMESTAMPTZ,
    last_success_at       TIMESTAMPTZ,
    next_attempt_at       TIMESTAMPTZ
);
CREATE INDEX audit_export_destinations_org ON audit_export_destinations (org_id, created_at);
