-- Drops the index of the sweep's purge of cancelled items, CONCURRENTLY.
SET lock_timeout = '2s';
SET statement_timeout = '1h';
DROP INDEX CONCURRENTLY IF EXISTS ix_work_items_cancelled;
RESET statement_timeout;
RESET lock_timeout;
