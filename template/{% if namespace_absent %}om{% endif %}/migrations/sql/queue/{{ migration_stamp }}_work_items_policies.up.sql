-- The tenant policies of `work_items` and `work_schedules` as a CASE on the scope
-- (docs/decisions/0057). The same rows pass as under the OR they replace: every row under
-- the system scope (the nil UUID), else the scope's tenant's rows. PostgreSQL estimated the
-- OR to keep one row in two hundred, so a claim behind one tenant's backlog was planned as
-- a read of the whole table and a sort; it estimates the CASE at one in two.
--
-- ALTER POLICY changes the catalogue only, under the table's lock for that instant;
-- `lock_timeout` bounds the wait for it.
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '60s';
ALTER POLICY work_items_tenant ON work_items
    USING (CASE WHEN current_setting('app.org_id')::uuid = '00000000-0000-0000-0000-000000000000' THEN true ELSE org_id = current_setting('app.org_id')::uuid END)
    WITH CHECK (CASE WHEN current_setting('app.org_id')::uuid = '00000000-0000-0000-0000-000000000000' THEN true ELSE org_id = current_setting('app.org_id')::uuid END);
ALTER POLICY work_schedules_tenant ON work_schedules
    USING (CASE WHEN current_setting('app.org_id')::uuid = '00000000-0000-0000-0000-000000000000' THEN true ELSE org_id = current_setting('app.org_id')::uuid END)
    WITH CHECK (CASE WHEN current_setting('app.org_id')::uuid = '00000000-0000-0000-0000-000000000000' THEN true ELSE org_id = current_setting('app.org_id')::uuid END);
