-- The work queue: one row per work item, held by at most one worker at a time under a
-- lease and a claim token (Worker Roles: The Work Queue). Role QUEUE, scope ORG.
-- The table is new, so no statement here waits on another session's lock; the timeouts
-- only bound a migration that meets a surprise.
--
-- Waived for this file, with reasons:
-- prefer-robust-stmts: alembic runs every revision in its own transaction
--   (`transaction_per_migration`), so a failure part way rolls the whole file back and a
--   rerun starts clean; `IF NOT EXISTS` would only hide a half-built schema.
-- require-concurrent-index-creation: the indexes are built on the table created just
--   above, empty and unseen by any other session; CONCURRENTLY cannot run inside the
--   revision's transaction anyway.
-- squawk-ignore-file prefer-robust-stmts, require-concurrent-index-creation
SET LOCAL lock_timeout = '5s';
SET LOCAL statement_timeout = '60s';

CREATE TABLE work_items (
    id                uuid                     NOT NULL,
    org_id            uuid                     NOT NULL,
    kind              text                     NOT NULL,
    lane              text                     NOT NULL,
    payload           jsonb                    NOT NULL,
    status            text                     NOT NULL,
    -- Claims spent and claims allowed: a handful per item, never near 2^31.
    -- squawk-ignore prefer-bigint-over-int
    attempts          integer                  NOT NULL,
    -- squawk-ignore prefer-bigint-over-int
    max_attempts      integer                  NOT NULL,
    available_at      timestamp with time zone NOT NULL,
    claimed_by        text,
    -- Minted by every claim; every later write on the row is conditional on it.
    claim_token       uuid,
    claimed_at        timestamp with time zone,
    lease_expires_at  timestamp with time zone,
    last_error        text,
    note              text,
    idempotency_key   text,
    request_id        uuid,
    traceparent       text,
    completed_at      timestamp with time zone,
    created_at        timestamp with time zone NOT NULL,
    updated_at        timestamp with time zone NOT NULL,
    created_by        uuid                     NOT NULL,
    updated_by        uuid                     NOT NULL,
    deleted_at        timestamp with time zone,
    CONSTRAINT pk_work_items PRIMARY KEY (id),
    CONSTRAINT ck_work_items_status
        CHECK (status IN ('AVAILABLE', 'CLAIMED', 'COMPLETED', 'FAILED')),
    CONSTRAINT ck_work_items_attempts CHECK (attempts >= 0),
    CONSTRAINT ck_work_items_max_attempts CHECK (max_attempts >= 1)
);

-- Idempotency is per tenant: two tenants may use one key without meeting, and a retried
-- enqueue or a relay that runs twice meets the first insert (NULL keys never collide).
CREATE UNIQUE INDEX ix_work_items_org_id_idempotency_key
    ON work_items (org_id, idempotency_key);

-- The claim: due items of a lane, oldest first.
CREATE INDEX ix_work_items_lane_status_available_at
    ON work_items (lane, status, available_at);

-- The sweep: claimed items whose lease passed.
CREATE INDEX ix_work_items_status_lease_expires_at
    ON work_items (status, lease_expires_at);

-- The retention sweep: a tenant's completed items, oldest first.
CREATE INDEX ix_work_items_org_id_status_completed_at
    ON work_items (org_id, status, completed_at);

ALTER TABLE work_items ENABLE ROW LEVEL SECURITY;
ALTER TABLE work_items FORCE ROW LEVEL SECURITY;
CREATE POLICY work_items_tenant ON work_items
    USING (org_id = current_setting('app.org_id')::uuid OR current_setting('app.org_id')::uuid = '00000000-0000-0000-0000-000000000000')
    WITH CHECK (org_id = current_setting('app.org_id')::uuid OR current_setting('app.org_id')::uuid = '00000000-0000-0000-0000-000000000000');
