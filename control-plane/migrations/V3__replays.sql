-- Screen recordings of browser sessions. While recording, the video is on the browser's
-- agent; once finished it is copied to the blob store under `blob_key`, so it outlives
-- the browser. status: recording → stopping (being finalized and copied) → finished
-- (with a video) or lost (failure says why).
CREATE TABLE replays (
    id                    TEXT PRIMARY KEY,
    org_id                TEXT NOT NULL REFERENCES organizations(id),
    session_id            TEXT NOT NULL REFERENCES browser_sessions(id),
    framerate             BIGINT NOT NULL,
    max_duration_seconds  BIGINT NOT NULL,
    status                TEXT NOT NULL,
    started_at            TIMESTAMPTZ NOT NULL,
    finished_at           TIMESTAMPTZ,
    size_bytes            BIGINT,
    blob_key              TEXT,
    failure               TEXT
);

CREATE INDEX replays_session ON replays (session_id, started_at);
CREATE INDEX replays_unfinished ON replays (status) WHERE status IN ('recording', 'stopping');
