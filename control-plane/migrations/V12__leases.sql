-- Background work that must run once across control-plane replicas (pool reconcilers,
-- the inactivity reaper, workflows) runs on the replica holding its lease; a lease not
-- renewed by `expires_at` can be taken by another replica.
CREATE TABLE leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
);
