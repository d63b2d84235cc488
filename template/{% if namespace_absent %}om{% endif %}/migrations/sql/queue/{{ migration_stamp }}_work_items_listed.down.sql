-- Drops the items list's index: a page of the list sorts the tenant's rows again.
-- A concurrent drop waits for older transactions, blocking no one (docs/decisions/0052).
SET lock_timeout = '1h';
SET statement_timeout = '1h';
DROP INDEX CONCURRENTLY IF EXISTS ix_work_items_listed;
RESET statement_timeout;
RESET lock_timeout;
