-- A dead letter's row (role QUEUE) and its audit entry (role AUDIT) cannot share a
-- transaction. The statement that makes a row a dead letter now also records the entry it
-- owes: `audit_owed_token`, the claim token the item died under (the entry's idempotency
-- key, `<item id>:dead_lettered:<token>`, is derived from it, so the entry is written once
-- however many processes write it), and `audit_owed_reason` (`attempts`, `lease`,
-- `unreadable`). Both are cleared once the entry is written; until then the sweep finds the
-- row through the partial index below and writes the entry.
--
-- Dead letters already in the table whose payload is not a JSON object could not have been
-- audited (no worker could read them, and the previous revisions made most of them): they are
-- recorded as owing their entry, each under a fresh token, and the sweep writes it. Every
-- other dead letter already in the table is taken as audited.
--
-- Adding nullable columns without a default changes no row and scans none (no rewrite, no
-- check to verify: the statements that write the two columns write them together).
--
-- Waived for this file, with reasons:
-- require-concurrent-index-creation: CONCURRENTLY cannot run inside the revision's
--   transaction; the index holds the few dead letters whose entry is owed, but its build
--   reads the table: on a table of millions of rows, build it CONCURRENTLY by hand first
--   (same name and definition), and `IF NOT EXISTS` below keeps it.
-- prefer-robust-stmts: alembic runs the revision in one transaction, so a failure part way
--   rolls the whole file back; `IF NOT EXISTS` on the columns would only hide a schema that
--   drifted.
-- squawk-ignore-file require-concurrent-index-creation, prefer-robust-stmts
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '600s';
-- The system scope: the table's policy is forced, for its owner too.
SELECT set_config('app.org_id', '00000000-0000-0000-0000-000000000000', true);

ALTER TABLE work_items
    ADD COLUMN audit_owed_token uuid,
    ADD COLUMN audit_owed_reason text;

CREATE INDEX IF NOT EXISTS ix_work_items_audit_owed
    ON work_items (org_id) WHERE audit_owed_token IS NOT NULL;

UPDATE work_items
SET audit_owed_token = gen_random_uuid(),
    audit_owed_reason = 'unreadable'
WHERE status = 'FAILED' AND deleted_at IS NULL AND jsonb_typeof(payload) <> 'object';
