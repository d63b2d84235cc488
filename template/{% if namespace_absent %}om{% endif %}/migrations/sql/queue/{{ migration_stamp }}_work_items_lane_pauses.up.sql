-- Paused lanes (docs/decisions/0040): one row per lane no claim may take items from until it
-- is resumed. Every claim statement excludes the lanes listed here, whatever tenant an item
-- is of, so the table is shared by every tenant (TenancyScope GLOBAL, no org_id).
--
-- A pause is a system-wide act: row-level security lets every session of the queue role
-- read the table (the claim reads it, under the system scope or a tenant's), and only the
-- system scope write it (the operator's pause and resume open their session under it), so
-- a tenant's session can neither pause nor resume a lane every tenant shares.
--
-- A new table, unseen by any other session until the revision commits: no statement here
-- waits on another session's lock, and `work_items` is not touched.
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '60s';

CREATE TABLE IF NOT EXISTS work_lane_pauses (
    lane       text                     NOT NULL,
    paused_at  timestamp with time zone NOT NULL,
    paused_by  text                     NOT NULL,
    reason     text,
    CONSTRAINT pk_work_lane_pauses PRIMARY KEY (lane)
);

ALTER TABLE work_lane_pauses ENABLE ROW LEVEL SECURITY;
ALTER TABLE work_lane_pauses FORCE ROW LEVEL SECURITY;
CREATE POLICY work_lane_pauses_read ON work_lane_pauses FOR SELECT USING (true);
CREATE POLICY work_lane_pauses_system ON work_lane_pauses
    USING (current_setting('app.org_id')::uuid = '00000000-0000-0000-0000-000000000000')
    WITH CHECK (current_setting('app.org_id')::uuid = '00000000-0000-0000-0000-000000000000');
