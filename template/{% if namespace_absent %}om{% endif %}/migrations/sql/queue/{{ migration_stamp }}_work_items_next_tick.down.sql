-- Drops the recorded next ticks: the work API shows the latest tick only.
--
-- Waived for this file, with reasons:
-- ban-drop-column: undoing the revision that added the column is the point of the file;
--   the code that writes and reads it goes with it.
-- squawk-ignore-file ban-drop-column
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '60s';
ALTER TABLE work_schedules DROP COLUMN IF EXISTS next_tick_at;
