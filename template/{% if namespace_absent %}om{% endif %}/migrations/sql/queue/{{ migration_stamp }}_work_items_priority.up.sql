-- Priorities and a fair share per tenant (docs/decisions/0036, 0037).
--
-- * `priority`: a constant default, so adding it rewrites nothing (PostgreSQL 11 and
--   later keep the default in the catalog); 0 keeps the order items had before.
-- * `ix_work_items_claim_order` replaces `ix_work_items_claimable`: the claim reads, per
--   lane and kind, the tenants holding available items (a skip scan over `org_id`) and
--   each tenant's items in claim order: `available_at` less a head start of 600 s per
--   priority level, as UTC `timestamp` (`timezone('UTC', ...)` is immutable, so an index
--   may hold it; `timestamptz - interval` is not). Built CONCURRENTLY beside the old one,
--   which is dropped CONCURRENTLY once the new one is valid: claims and enqueues go on.
--
-- Waived for this file, with reasons:
-- prefer-bigint-over-smallint: a priority runs from -10 to 10 (the engine refuses others at
--   enqueue); two bytes keep the claim index's entries small.
-- squawk-ignore-file prefer-bigint-over-smallint
--
-- A plain SET: SET LOCAL would end with the transaction the autocommit block commits.
SET lock_timeout = '2s';
SET statement_timeout = '60s';
ALTER TABLE work_items ADD COLUMN IF NOT EXISTS priority smallint NOT NULL DEFAULT 0;
-- A concurrent build blocks no reader nor writer: it may take its time.
SET statement_timeout = '1h';
-- A failed concurrent build leaves an INVALID index of this name: drop it first.
DROP INDEX CONCURRENTLY IF EXISTS ix_work_items_claim_order;
CREATE INDEX CONCURRENTLY IF NOT EXISTS ix_work_items_claim_order
    ON work_items (
        lane, kind, org_id,
        (timezone('UTC', available_at) - priority * interval '600 seconds'),
        id
    ) WHERE status = 'AVAILABLE';
DROP INDEX CONCURRENTLY IF EXISTS ix_work_items_claimable;
RESET statement_timeout;
RESET lock_timeout;
