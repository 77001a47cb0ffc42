-- Browser telemetry: each session's events in `seq` order (gaps are events dropped before
-- they were stored), the counter they draw their `seq` from, and the organizations' OTLP
-- destinations (header values sealed like credentials).
CREATE TABLE telemetry_events (
    session_id  TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    org_id      TEXT NOT NULL,
    ts_us       BIGINT NOT NULL,
    category    TEXT NOT NULL,
    event_type  TEXT NOT NULL,
    body        TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE INDEX telemetry_events_time ON telemetry_events (ts_us);
ALTER TABLE browser_sessions ADD COLUMN telemetry_seq BIGINT;

CREATE TABLE telemetry_destinations (
    id                    TEXT PRIMARY KEY,
    org_id                TEXT NOT NULL REFERENCES organizations(id),
    name                  TEXT NOT NULL,
    description           TEXT,
    endpoint              TEXT NOT NULL,
    header_names          TEXT NOT NULL,
    sealed_headers        BYTEA,
    created_at            TIMESTAMPTZ NOT NULL,
    updated_at            TIMESTAMPTZ NOT NULL,
    consecutive_failures  BIGINT NOT NULL DEFAULT 0,
    last_error            TEXT,
    last_error_at         TIMESTAMPTZ,
    last_export_at        TIMESTAMPTZ
);
CREATE UNIQUE INDEX telemetry_destinations_name ON telemetry_destinations (org_id, name);
