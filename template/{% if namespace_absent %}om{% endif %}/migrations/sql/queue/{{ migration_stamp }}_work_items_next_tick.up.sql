-- The tick after the latest one handled, per tenant and schedule (docs/decisions/0051): the
-- worker that advances a schedule's row records it from its cron, so the work API shows the
-- next tick without importing any worker's schedules. Rows written before stay NULL until
-- their next tick is handled.
--
-- A nullable column without a default: PostgreSQL adds it to the catalogue only, rewriting
-- nothing, and `lock_timeout` bounds the wait for the table's lock.
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '60s';
ALTER TABLE work_schedules ADD COLUMN IF NOT EXISTS next_tick_at timestamp with time zone;
