-- An operator may cancel an item (docs/decisions/0038): a `CANCELLED` status, final. The
-- status check `ck_work_items_status` does not admit it, and a check cannot be altered, so a
-- second check that admits it is added beside the first; the next revision
-- (`<stamp>_cancelled_checked`) validates it, drops the old one and gives the new one the
-- old name.
--
-- NOT VALID: ALTER TABLE takes ACCESS EXCLUSIVE, and without NOT VALID it would scan every
-- row under it, stopping claims and enqueues for as long. Added NOT VALID, the lock lasts
-- until this transaction commits, right after, and no row is read under it; the check
-- applies to every write from then on. Until the old check is dropped, both apply, so no
-- row can be `CANCELLED` yet: the code that cancels ships with this release.
--
-- Waived for this file, with reasons:
-- prefer-robust-stmts: alembic runs the revision in one transaction, so a failure part way
--   rolls the whole file back; PostgreSQL has no ADD CONSTRAINT IF NOT EXISTS.
-- squawk-ignore-file prefer-robust-stmts
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '60s';

ALTER TABLE work_items
    ADD CONSTRAINT ck_work_items_status_cancelled
    CHECK (status IN ('AVAILABLE', 'CLAIMED', 'COMPLETED', 'FAILED', 'CANCELLED'))
    NOT VALID;
