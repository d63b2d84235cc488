-- Drops the index of discarded rows: the purge reads the tenant's rows again (as before
-- the up file).
--
-- Waived for this file, with reasons:
-- require-concurrent-index-deletion: CONCURRENTLY cannot run inside the revision's
--   transaction; the index holds only discarded rows.
-- prefer-robust-stmts: alembic runs the revision in one transaction.
-- squawk-ignore-file require-concurrent-index-deletion, prefer-robust-stmts
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';

DROP INDEX ix_work_items_deleted;
