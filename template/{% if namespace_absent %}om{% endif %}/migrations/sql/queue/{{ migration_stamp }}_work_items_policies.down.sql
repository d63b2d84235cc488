-- The tenant policies of `work_items` and `work_schedules` back to the OR of the first
-- revisions: the same rows pass.
SET LOCAL lock_timeout = '2s';
SET LOCAL statement_timeout = '60s';
ALTER POLICY work_items_tenant ON work_items
    USING (org_id = current_setting('app.org_id')::uuid OR current_setting('app.org_id')::uuid = '00000000-0000-0000-0000-000000000000')
    WITH CHECK (org_id = current_setting('app.org_id')::uuid OR current_setting('app.org_id')::uuid = '00000000-0000-0000-0000-000000000000');
ALTER POLICY work_schedules_tenant ON work_schedules
    USING (org_id = current_setting('app.org_id')::uuid OR current_setting('app.org_id')::uuid = '00000000-0000-0000-0000-000000000000')
    WITH CHECK (org_id = current_setting('app.org_id')::uuid OR current_setting('app.org_id')::uuid = '00000000-0000-0000-0000-000000000000');
