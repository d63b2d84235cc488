-- The work API lists a tenant's dead letters newest first, a page at a time, and the
-- dashboard counts those of the last hour. Without an index of its own that read went
-- through the idempotency index over every row of the tenant, completed history included.
-- The partial index below holds the live dead letters only (rows in play: an operator
-- replays or discards them), in the list's order, so a page reads its own rows.
-- A plain SET: SET LOCAL would end with the transaction the autocommit block commits.
SET lock_timeout = '2s';
-- A concurrent build blocks no reader nor writer: it may take its time.
SET statement_timeout = '1h';
-- A failed concurrent build leaves an INVALID index of this name: drop it first.
DROP INDEX CONCURRENTLY IF EXISTS ix_work_items_dead_letters;
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_work_items_dead_letters
    ON work_items (org_id, created_at DESC, id) WHERE status = 'FAILED' AND deleted_at IS NULL;
RESET statement_timeout;
RESET lock_timeout;
