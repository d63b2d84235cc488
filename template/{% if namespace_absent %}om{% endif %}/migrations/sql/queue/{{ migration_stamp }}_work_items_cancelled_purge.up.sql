-- The sweep deletes a tenant's cancelled items past `RETENTION` on every pass
-- (docs/decisions/0038); the partial index below holds the cancelled rows only, oldest
-- cancel first, so that statement never reads the completed history. Built CONCURRENTLY, in
-- run_sql_file's autocommit block (docs/updating.md, "Revisions on a big table").
-- A plain SET: SET LOCAL would end with the transaction the autocommit block commits.
SET lock_timeout = '2s';
-- A concurrent build blocks no reader nor writer: it may take its time.
SET statement_timeout = '1h';
-- A failed concurrent build leaves an INVALID index of this name: drop it first.
DROP INDEX CONCURRENTLY IF EXISTS ix_work_items_cancelled;
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_work_items_cancelled
    ON work_items (org_id, updated_at) WHERE status = 'CANCELLED';
RESET statement_timeout;
RESET lock_timeout;
