-- Every lane claimable again: the pauses go with their table.
--
-- Waived for this file, with reasons:
-- ban-drop-table: the table holds only the pauses this revision introduced; dropping it is
--   what going down means (a paused lane is claimable again after it).
-- squawk-ignore-file ban-drop-table
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '60s';

DROP TABLE IF EXISTS work_lane_pauses;
