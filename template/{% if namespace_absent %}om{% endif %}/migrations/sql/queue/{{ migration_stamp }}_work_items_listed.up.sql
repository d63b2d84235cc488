-- The work API lists a tenant's items newest first, a page at a time, with or without a
-- status. Without an index in that order the list sorted every row the retention keeps
-- (a page took 86 times as long at 1,000,000 completed rows as at 1,000: docs/performance.md,
-- "The work API's reads"). This index holds the tenant's live rows in the list's order, so a
-- page reads its own entries; its cost is an entry per row version written (docs/decisions/0050).
-- A plain SET: SET LOCAL would end with the transaction the autocommit block commits.
-- A concurrent build waits for every transaction older than it (a lock wait) and blocks no
-- reader or writer meanwhile: under a 2 s lock_timeout it never finished while an older
-- release's workers ran statements of several seconds (docs/decisions/0052).
SET lock_timeout = '1h';
SET statement_timeout = '1h';
-- A failed concurrent build leaves an INVALID index of this name: drop it first.
DROP INDEX CONCURRENTLY IF EXISTS ix_work_items_listed;
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_work_items_listed
    ON work_items (org_id, created_at DESC, id) WHERE deleted_at IS NULL;
RESET statement_timeout;
RESET lock_timeout;
