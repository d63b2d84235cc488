-- The worker roster (docs/decisions/0049): one row per running worker process, upserted by
-- each beat of its heartbeat (`beat_at`, and `expires_at`: the beat plus the worker's
-- liveness TTL), deleted by its drain, and deleted by the sweep once long expired (a worker
-- killed without a drain). The queue summary lists the unexpired rows as the workers alive.
--
-- A worker serves every tenant, so a row has none (TenancyScope GLOBAL, no org_id), and
-- row-level security lets only the system scope read or write it: the heartbeat, the drain,
-- the sweep and the summary all open their session under it.
--
-- A new table, unseen by any other session until the revision commits: no statement here
-- waits on another session's lock, and `work_items` is not touched.
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '60s';

CREATE TABLE IF NOT EXISTS work_workers (
    -- `<host>:<pid>:<random>`, the `claimed_by` of the items the process holds.
    worker_id   text                     NOT NULL,
    worker      text                     NOT NULL,
    lane        text                     NOT NULL,
    -- The kinds it claims on the lane, space-separated.
    kinds       text                     NOT NULL,
    started_at  timestamp with time zone NOT NULL,
    beat_at     timestamp with time zone NOT NULL,
    expires_at  timestamp with time zone NOT NULL,
    CONSTRAINT pk_work_workers PRIMARY KEY (worker_id)
);

ALTER TABLE work_workers ENABLE ROW LEVEL SECURITY;
ALTER TABLE work_workers FORCE ROW LEVEL SECURITY;
CREATE POLICY work_workers_system ON work_workers
    USING (current_setting('app.org_id')::uuid = '00000000-0000-0000-0000-000000000000')
    WITH CHECK (current_setting('app.org_id')::uuid = '00000000-0000-0000-0000-000000000000');
