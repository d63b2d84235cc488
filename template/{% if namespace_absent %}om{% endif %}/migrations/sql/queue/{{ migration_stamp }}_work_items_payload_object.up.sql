-- A row that can still run holds a JSON object as its payload. Every enqueue writes one (the
-- manager validates the payload against its kind's model), and a row holding anything else
-- (an array, a number, null) cannot be read as a work item: before this check one such row,
-- written around the manager, made every claim of its lane fail. The worker now dead-letters
-- any row it cannot read at claim; the table refuses what it can refuse.
--
-- The check allows any JSON on a row that cannot run again (`COMPLETED`, `FAILED`), so:
-- * a row that broke the rule before this revision is kept for an operator to read, not
--   rewritten nor deleted: the UPDATE below makes every such row that could still run
--   (`AVAILABLE`, `CLAIMED`; no worker can hold one, since none could read it) a dead letter,
--   its payload as it was, `last_error` naming the column and why;
-- * a check that allowed no such row at all would have to be added NOT VALID over them, and a
--   NOT VALID check still applies to every UPDATE: the claim's own UPDATE of such a row would
--   fail, and the lane would stop again.
-- `<worker> dead-letters list` names these rows; the revision `<stamp>_audit_owed` records
-- their audit entry as owed, and the sweep writes it.
--
-- The UPDATE runs first, under the row locks a plain UPDATE takes (claims and enqueues go on
-- while it scans); the check is then added NOT VALID: the ACCESS EXCLUSIVE lock ALTER TABLE
-- takes lasts until this transaction commits, right after, and no row is scanned under it.
-- The next revision (`<stamp>_payload_checked`) validates the check in a transaction of its
-- own, under a lock that lets claims and enqueues go on.
--
-- Waived for this file, with reasons:
-- prefer-robust-stmts: alembic runs the revision in one transaction, so a failure part way
--   rolls the whole file back; `IF NOT EXISTS` would only hide a schema that drifted.
-- squawk-ignore-file prefer-robust-stmts
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '600s';
-- The system scope: the table's policy is forced, for its owner too.
SELECT set_config('app.org_id', '00000000-0000-0000-0000-000000000000', true);

UPDATE work_items
SET status = 'FAILED',
    claimed_by = NULL,
    claim_token = NULL,
    claimed_at = NULL,
    lease_expires_at = NULL,
    last_error = 'unreadable row: payload: a JSON ' || jsonb_typeof(payload)
        || ', not an object (made a dead letter by a migration)',
    updated_at = statement_timestamp(),
    updated_by = '00000000-0000-0000-0000-000000000000'
WHERE status IN ('AVAILABLE', 'CLAIMED') AND jsonb_typeof(payload) <> 'object';

ALTER TABLE work_items
    ADD CONSTRAINT ck_work_items_payload
    CHECK (jsonb_typeof(payload) = 'object' OR status IN ('COMPLETED', 'FAILED'))
    NOT VALID;
