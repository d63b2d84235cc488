-- Nothing to undo: a validated check cannot be made NOT VALID again, and the previous
-- revision's down file drops it. The rows the up file made dead letters stay dead letters.
SELECT 1;
