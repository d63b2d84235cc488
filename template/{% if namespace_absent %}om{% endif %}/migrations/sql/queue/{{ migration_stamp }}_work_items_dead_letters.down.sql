-- Drops the dead letters' index: their list reads the tenant's rows again.
SET lock_timeout = '2s';
SET statement_timeout = '1h';
DROP INDEX CONCURRENTLY IF EXISTS ix_work_items_dead_letters;
RESET statement_timeout;
RESET lock_timeout;
