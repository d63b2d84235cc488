-- Back to the claim paths revision's autovacuum settings: a vacuum after 1 % of the rows
-- died, index cleanup and throttling as the cluster decides.
--
-- Waived for this file, with reasons:
-- prefer-robust-stmts: alembic runs the revision in one transaction, so a failure part way
--   rolls the whole file back; storage parameters set twice are set alike.
-- squawk-ignore-file prefer-robust-stmts
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '60s';

ALTER TABLE work_items RESET (
    vacuum_index_cleanup,
    autovacuum_vacuum_threshold,
    autovacuum_vacuum_cost_delay
);
ALTER TABLE work_items SET (autovacuum_vacuum_scale_factor = 0.01);
