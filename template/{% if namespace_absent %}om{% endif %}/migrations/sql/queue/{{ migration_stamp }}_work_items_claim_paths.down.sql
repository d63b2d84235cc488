-- Back to the first revision's indexes and storage parameters, without the notifications.
--
-- Waived for this file, with reasons:
-- require-concurrent-index-creation: see the up file.
-- prefer-robust-stmts: alembic runs the revision in one transaction.
-- squawk-ignore-file require-concurrent-index-creation, prefer-robust-stmts
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '600s';

DROP TRIGGER work_items_notify ON work_items;
DROP FUNCTION work_items_notify();

ALTER TABLE work_items RESET (
    fillfactor,
    autovacuum_vacuum_scale_factor,
    autovacuum_vacuum_insert_scale_factor,
    autovacuum_analyze_scale_factor
);

DROP INDEX ix_work_items_completed;
CREATE INDEX ix_work_items_org_id_status_completed_at
    ON work_items (org_id, status, completed_at);

DROP INDEX ix_work_items_claimed;
CREATE INDEX ix_work_items_status_lease_expires_at
    ON work_items (status, lease_expires_at);

DROP INDEX ix_work_items_claimable;
CREATE INDEX ix_work_items_lane_status_available_at
    ON work_items (lane, status, available_at);
