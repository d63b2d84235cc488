-- No worker roster: the queue summary lists the workers holding items only.
--
-- Waived for this file, with reasons:
-- ban-drop-table: the table holds only the roster this revision introduced, rebuilt by the
--   next beat of every worker after a later upgrade; dropping it is what going down means.
-- squawk-ignore-file ban-drop-table
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '60s';

DROP TABLE IF EXISTS work_workers;
