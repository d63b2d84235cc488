-- Back to the claim index by age alone, without priorities.
--
-- Waived for this file, with reasons:
-- ban-drop-column: the column this revision added, dropped by its own downgrade; nothing
--   older reads it.
-- squawk-ignore-file ban-drop-column
SET lock_timeout = '2s';
SET statement_timeout = '1h';
DROP INDEX CONCURRENTLY IF EXISTS ix_work_items_claimable;
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_work_items_claimable
    ON work_items (lane, kind, available_at, id) WHERE status = 'AVAILABLE';
DROP INDEX CONCURRENTLY IF EXISTS ix_work_items_claim_order;
RESET statement_timeout;
ALTER TABLE work_items DROP COLUMN IF EXISTS priority;
RESET lock_timeout;
