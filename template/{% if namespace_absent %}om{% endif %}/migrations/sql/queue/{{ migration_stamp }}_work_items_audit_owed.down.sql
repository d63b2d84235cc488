-- Drops the record of owed audit entries: a dead letter whose entry was still owed stays
-- without one (as before the up file).
--
-- Waived for this file, with reasons:
-- ban-drop-column: the columns are the queue's own bookkeeping, read by nothing but this
--   namespace, and go together with the code that reads them.
-- require-concurrent-index-deletion: CONCURRENTLY cannot run inside the revision's
--   transaction; the index holds only the dead letters whose entry is owed.
-- prefer-robust-stmts: alembic runs the revision in one transaction.
-- squawk-ignore-file ban-drop-column, require-concurrent-index-deletion, prefer-robust-stmts
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';

DROP INDEX ix_work_items_audit_owed;
ALTER TABLE work_items
    DROP COLUMN audit_owed_reason,
    DROP COLUMN audit_owed_token;
