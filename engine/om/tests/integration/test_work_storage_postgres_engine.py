"""The work queue on PostgreSQL beyond a host's own cases (engine-only: no host receives it).

The storage contract again over the two other paths a call takes: held connections behind
a connection pooler (each call one transaction with its tenant) and every statement in a
funnel session (a funnel without `engine`, or a busy held connection's fallback). Then the
table against the migrated schema, and replays of peers' failure reports: oban-bg/oban#532
(a stale failure cannot revive a dead item), riverqueue/river#1302 (a sweep paused after
its read cannot undo a completion) and oban-bg/oban#137 (a worker that crashes mid-item on
its last attempt runs it once, then the item is a dead letter). Then one row the worker
cannot read, between good ones, which must never stop the lane; the table's payload check;
and the migrations over a table that already holds such rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import secrets
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from uuid import UUID, uuid4

import asyncpg
import pytest
from sqlalchemy import MetaData, event, insert, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import QueuePool
from work_fixtures import (
    KIND,
    WORKER_APP,
    WorkBench,
    asyncpg_dsn,
    lift_payload_check,
    make_item,
    outcome,
    restore_payload_check,
    store_row,
    stored_row,
    token_of,
    use_probe_payload,
    work_bench,
)

from acme.infra.container import Infra
from acme.om import migrate
from acme.om.context import RequestContext
from acme.om.errors import Conflict, Invalid
from acme.om.migrations_support import MIGRATIONS_DIR
from acme.om.storage.funnel import StorageFunnel
from acme.om.storage.impl.sql import SqlStorageRoot
from acme.om.storage.roles import DatabaseRole
from acme.om.types import EMPTY_UUID
from acme.om.work.storage import NewItems, WorkStorageInterface
from acme.om.work.storage.impl import held_connections, postgres, postgres_statements
from acme.om.work.storage.impl.postgres import HELD_CONNECTIONS, PostgresWorkStorage
from acme.om.work.storage.tables.work_items import work_items
from acme.om.work.types.work_item import WorkStatus
from contracts.work_storage import LEASE_S, PAST_SHORT_S, SHORT_LEASE_S, WorkStorageContract

pytestmark = pytest.mark.integration


class TestPostgresWorkStoragePaths(WorkStorageContract):
    """The contract over PostgreSQL on the paths hosts' `TestPostgresWorkStorage` leaves out.

    Every case runs twice: on held connections as they run through a connection pooler
    (`held-in-transactions`: each call one transaction with the tenant set for it), and
    with every statement in a funnel session (`funnel`), the path a funnel without `engine`
    takes and the one a busy held connection falls back to.
    `store` lifts the table's payload check (as the owner) for a payload that is no JSON
    object, and the check is put back after the test by the migrations' own SQL.
    """

    @pytest.fixture(
        params=[(HELD_CONNECTIONS, False), (0, None)],
        ids=["held-in-transactions", "funnel"],
    )
    async def storage(
        self, request: pytest.FixtureRequest, pg_funnel: StorageFunnel, pg_owner_url: str
    ) -> AsyncIterator[PostgresWorkStorage]:
        self.funnel = pg_funnel
        self.owner_url = pg_owner_url
        held, session_scope = request.param
        yield PostgresWorkStorage(pg_funnel, held=held, session_scope=session_scope)
        await restore_payload_check(pg_owner_url)

    async def advance(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def store(self, storage: WorkStorageInterface, values: dict[str, Any]) -> None:
        if not isinstance(values["payload"], dict):
            await lift_payload_check(self.owner_url)
        await store_row(self.funnel, values)


# -- the table against the migrations ------------------------------------------------------------

_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid)
FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = (:schema || '.work_items')::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""
_CONSTRAINTS = """
SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = (:schema || '.work_items')::regclass ORDER BY conname
"""
_INDEXES = """
SELECT indexname, replace(indexdef, :schema || '.', '') FROM pg_indexes
WHERE schemaname = :schema AND tablename = 'work_items' ORDER BY indexname
"""


async def _catalog(conn: AsyncConnection, schema: str) -> list[list[tuple[object, ...]]]:
    return [
        [tuple(r) for r in await conn.execute(text(query), {"schema": schema})]
        for query in (_COLUMNS, _CONSTRAINTS, _INDEXES)
    ]


async def _table_against_migrations(owner_url: str) -> None:
    scratch = f"work_items_{uuid4().hex[:8]}"
    engine = create_async_engine(owner_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(f'CREATE SCHEMA "{scratch}"'))
            built = MetaData(naming_convention=work_items.metadata.naming_convention)
            work_items.to_metadata(built, schema=scratch)
            await conn.run_sync(built.create_all)
            migrated = await _catalog(conn, "public")
            from_table = await _catalog(conn, scratch)
            await conn.execute(text(f'DROP SCHEMA "{scratch}" CASCADE'))
    finally:
        await engine.dispose()
    assert migrated[0], "the migrations built no work_items table"
    assert from_table == migrated


def test_the_table_equals_the_migrated_schema(pg_owner_url: str) -> None:
    """`storage/tables/work_items.py` builds what the queue migration builds: columns with
    their types, nullability and defaults, constraints, and indexes (procrastinate's
    migration test); alembic's own comparison agrees."""
    asyncio.run(_table_against_migrations(pg_owner_url))
    assert migrate.check(pg_owner_url, [DatabaseRole.QUEUE]) == []


# The indexes a sweep statement may read: each holds only rows in play (or one row by id).
_PLAY_INDEXES = {
    "pk_work_items",
    "ix_work_items_claim_order",
    "ix_work_items_claimed",
    "ix_work_items_completed",
    "ix_work_items_audit_owed",
    "ix_work_items_deleted",
    "ix_work_items_cancelled",
    "ix_work_items_dead_letters",
}


def _reads_of_work_items(plan: dict[str, Any]) -> list[tuple[str, str | None]]:
    """Every scan of `plan` (EXPLAIN's JSON tree) that reads work_items or one of its
    indexes, as (node type, index name)."""
    found: list[tuple[str, str | None]] = []
    index = plan.get("Index Name") or ""
    reads_table = plan.get("Relation Name") == "work_items"
    if "Scan" in plan["Node Type"] and (
        reads_table or index.startswith(("ix_work_items", "work_items_", "pk_work_items"))
    ):
        found.append((plan["Node Type"], plan.get("Index Name")))
    for child in plan.get("Plans", []):
        found += _reads_of_work_items(child)
    return found


async def test_the_sweep_reads_the_rows_in_play_never_the_history(
    pg_funnel: StorageFunnel, pg_owner_url: str, lane: str
) -> None:
    """With thousands of completed rows and audited dead letters in a tenant, every
    statement of a sweep pass over the queue (requeue, the three purges, owed audits, the
    queue stats) and of the work API's dashboard (a tenant's counts, its dead letters, its
    last hour) reads through an index that holds only the rows in play: none scans the
    table or the tenant's whole history, so a pass costs what the backlog holds, not what
    the retention keeps (docs/operations.md, the table's indexes)."""
    storage = PostgresWorkStorage(pg_funnel)
    org = uuid4()
    done_at = datetime.now(UTC) - timedelta(hours=1)
    history = [
        stored_row(org, lane, status="COMPLETED", completed_at=done_at) for _ in range(4000)
    ] + [stored_row(org, lane, status="FAILED") for _ in range(1000)]
    async with _analyzed_with(pg_funnel, pg_owner_url, org, history) as owner:
        with _statements_sent(pg_funnel) as sent:
            await storage.requeue_stale(org, None, 100)
            await storage.purge_deleted(org, 3600.0)
            await storage.purge_completed(org, 7 * 86400.0, 1000)
            await storage.purge_cancelled(org, 7 * 86400.0, 1000)
            await storage.owed_audits(org, limit=100)
            await storage.queue_stats(EMPTY_UUID)
            # the work API's and dashboard's reads (docs/decisions/0046)
            await storage.queue_stats(org)
            await storage.list_items(org, status=WorkStatus.FAILED, limit=50)
            await storage.recent_outcomes(org, window_s=3600.0, buckets=12)
        statements: list[tuple[str, Any, str]] = []  # (SQL, parameters, the session's scope)
        scope = str(EMPTY_UUID)
        for statement, parameters in sent:
            if "set_config('app.org_id'" in statement:
                scope = str(parameters[0])
            elif "work_items" in statement:
                statements.append((statement, parameters, scope))

        assert len(statements) >= 5
        for statement, parameters, scoped_to in statements:
            async with owner.transaction():
                await owner.execute("SELECT set_config('app.org_id', $1, true)", scoped_to)
                explained = await owner.fetchval(
                    f"EXPLAIN (FORMAT JSON) {statement}", *(parameters or ())
                )
            (plan,) = json.loads(explained)
            reads = _reads_of_work_items(plan["Plan"])
            assert reads, statement
            # A bitmap heap scan names no index: the bitmap index scans under it do.
            wide = [
                r
                for r in reads
                if r[0] == "Seq Scan" or (r[0] != "Bitmap Heap Scan" and r[1] not in _PLAY_INDEXES)
            ]
            assert not wide, (statement, reads)


@contextlib.asynccontextmanager
async def _analyzed_with(
    funnel: StorageFunnel, owner_url: str, org: UUID, rows: list[dict[str, Any]]
) -> AsyncIterator[asyncpg.Connection]:
    """`rows` stored in tenant `org` and the table analyzed; yields the owner's connection,
    and removes the tenant's rows at the end (later tests start without them)."""
    async with funnel.session(DatabaseRole.QUEUE, org) as conn:
        await conn.execute(insert(work_items), rows)
    owner = await asyncpg.connect(asyncpg_dsn(owner_url))
    try:
        await owner.execute("ANALYZE work_items")
        yield owner
    finally:
        async with owner.transaction():
            await owner.execute("SELECT set_config('app.org_id', $1, true)", str(org))
            await owner.execute("DELETE FROM work_items WHERE org_id = $1", org)
        await owner.close()


@contextlib.contextmanager
def _statements_sent(funnel: StorageFunnel) -> Iterator[list[tuple[str, Any]]]:
    """Every (SQL, parameters) the queue role's engine sends inside the block, in order."""
    sent: list[tuple[str, Any]] = []

    def seen(*args: Any) -> None:
        sent.append((args[2], args[3]))

    engine = funnel.engine(DatabaseRole.QUEUE).sync_engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", seen)


async def test_the_sweeps_queue_stats_read_a_big_backlog_through_its_indexes(
    pg_funnel: StorageFunnel, pg_owner_url: str, lane: str
) -> None:
    """With a backlog as big as the rest of the table, the sweep's queue stats (the system
    scope, every pass of every worker) still read the rows in play through their partial
    indexes and compile no plan, under the settings their own transaction sets: left to
    itself the planner read the whole table, history included (docs/decisions/0058)."""
    storage = PostgresWorkStorage(pg_funnel)
    org = uuid4()
    done_at = datetime.now(UTC) - timedelta(hours=1)
    rows = [stored_row(org, lane, status="COMPLETED", completed_at=done_at) for _ in range(5000)]
    rows += [stored_row(org, lane) for _ in range(10_000)]
    async with _analyzed_with(pg_funnel, pg_owner_url, org, rows) as owner:
        with _statements_sent(pg_funnel) as sent:
            stats = await storage.queue_stats(EMPTY_UUID)
        assert sum(s.count for s in stats if s.lane == lane) == 10_000
        # The statement and what its transaction set before it, the tenant aside.
        (read, parameters) = next((sql, p) for sql, p in sent if "FROM work_items" in sql)
        settings = [sql for sql, _ in sent if "set_config(" in sql and "app.org_id" not in sql]
        async with owner.transaction():
            await owner.execute("SELECT set_config('app.org_id', $1, true)", str(EMPTY_UUID))
            for setting in settings:
                await owner.execute(setting)
            jit = await owner.fetchval("SHOW jit")
            explained = await owner.fetchval(f"EXPLAIN (FORMAT JSON) {read}", *parameters)
        (plan,) = json.loads(explained)
        reads = _reads_of_work_items(plan["Plan"])
        assert reads
        assert not [r for r in reads if r[0] == "Seq Scan"], reads
        assert jit == "off"


def _sorts_of_work_items(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every Sort node of `plan` with a read of work_items under it."""
    found = [plan] if plan["Node Type"] == "Sort" and _reads_of_work_items(plan) else []
    for child in plan.get("Plans", []):
        found += _sorts_of_work_items(child)
    return found


async def test_a_page_of_the_items_list_reads_an_index_in_the_lists_order(
    pg_funnel: StorageFunnel, pg_owner_url: str, lane: str
) -> None:
    """With thousands of completed rows in a tenant, a page of the work API's items list
    (newest first, with no status or with `COMPLETED`, and a page after a cursor) walks
    `ix_work_items_listed` in the list's order: no sort of the tenant's rows and no table
    scan, so a page costs its own entries, not the history (docs/decisions/0050)."""
    storage = PostgresWorkStorage(pg_funnel)
    org = uuid4()
    done_at = datetime.now(UTC) - timedelta(hours=1)
    history = [
        stored_row(org, lane, status="COMPLETED", completed_at=done_at) for _ in range(4000)
    ] + [stored_row(org, lane) for _ in range(10)]
    async with _analyzed_with(pg_funnel, pg_owner_url, org, history) as owner:
        with _statements_sent(pg_funnel) as sent:
            page = await storage.list_items(org, limit=50)
            await storage.list_items(org, status=WorkStatus.COMPLETED, limit=50)
            last = page[-1]
            await storage.list_items(org, after=(last.created_at, last.id), limit=50)
        statements = [(sql, parameters) for sql, parameters in sent if "FROM work_items" in sql]
        assert len(statements) == 3
        for statement, parameters in statements:
            async with owner.transaction():
                await owner.execute("SELECT set_config('app.org_id', $1, true)", str(org))
                explained = await owner.fetchval(
                    f"EXPLAIN (FORMAT JSON) {statement}", *(parameters or ())
                )
            (plan,) = json.loads(explained)
            reads = _reads_of_work_items(plan["Plan"])
            assert [index for _, index in reads] == ["ix_work_items_listed"], (statement, reads)
            assert _sorts_of_work_items(plan["Plan"]) == [], statement


@pytest.mark.parametrize("limit", [1, 10])
async def test_the_claim_reads_its_index_in_order_whatever_the_tenants_hold(
    pg_funnel: StorageFunnel, pg_owner_url: str, lane: str, limit: int
) -> None:
    """With 40 tenants holding due items of two priorities, future items and completed
    history, the fair claim of ten slots and of one (docs/decisions/0037) reads
    `work_items` only through `ix_work_items_claim_order` (the skip scan over tenants, or
    the next tenant's first item; each tenant's items) and the
    primary key (the UPDATE), never the table, as the sweep's reads above; and it has a
    plan that reads each tenant's items in index order with no sort of item rows, so a
    claim costs its tenants and its slots, not the backlog."""
    orgs = [uuid4() for _ in range(40)]
    done_at = datetime.now(UTC) - timedelta(hours=1)
    rows: list[dict[str, Any]] = []
    for n, org in enumerate(orgs):
        rows += [stored_row(org, lane, priority=n % 2 * 5) for _ in range(25)]
        rows += [stored_row(org, lane, available_at=done_at + timedelta(days=1))]
        rows += [stored_row(org, lane, status="COMPLETED", completed_at=done_at) for _ in range(50)]
    for org in orgs:
        async with pg_funnel.session(DatabaseRole.QUEUE, org) as conn:
            await conn.execute(insert(work_items), [r for r in rows if r["org_id"] == org])
    claim, values = postgres_statements.claim_for(lane, [KIND], "w1", LEASE_S, limit, uuid4())
    owner = await asyncpg.connect(asyncpg_dsn(pg_owner_url))
    try:
        await owner.execute("ANALYZE work_items")
        plans = []
        # As the planner likes, then without bitmap scans: the claim has a plan that reads
        # its index in order, with no sort of item rows, whatever it chooses on a database
        # full of other tests' tiny tenants (where reading all 3,000 rows of this table is
        # cheaper than the index for one slot, so that plan is set aside too).
        for setting in ("on", "off"):
            async with owner.transaction():
                await owner.execute("SELECT set_config('app.org_id', $1, true)", str(EMPTY_UUID))
                await owner.execute(f"SET LOCAL enable_bitmapscan = {setting}")
                if limit == 1:
                    await owner.execute(f"SET LOCAL enable_seqscan = {setting}")
                explained = await owner.fetchval(f"EXPLAIN (FORMAT JSON) {claim.numbered}", *values)
            plans.append(json.loads(explained)[0]["Plan"])
        # And the generic plan a held connection reuses, planned without the values.
        async with owner.transaction():
            await owner.execute("SELECT set_config('app.org_id', $1, true)", str(EMPTY_UUID))
            await owner.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            if limit == 1:
                await owner.execute("SET LOCAL enable_bitmapscan = off")
                await owner.execute("SET LOCAL enable_seqscan = off")
            await owner.execute(f"PREPARE generic_claim AS {claim.numbered}")
            literals = ", ".join(f"'{value}'" for value in values)
            explained = await owner.fetchval(
                f"EXPLAIN (FORMAT JSON) EXECUTE generic_claim({literals})"
            )
            await owner.execute("DEALLOCATE generic_claim")
        plans.append(json.loads(explained)[0]["Plan"])
        for plan in plans:
            reads = _reads_of_work_items(plan)
            # A bitmap heap scan names no index: the bitmap index scans under it do.
            named = {index for kind, index in reads if kind != "Bitmap Heap Scan"}
            assert named == {"ix_work_items_claim_order", "pk_work_items"}, reads
            assert not [r for r in reads if r[0] == "Seq Scan"], reads
        assert _sorts_of_work_items(plans[1]) == [], plans[1]
        assert _sorts_of_work_items(plans[2]) == [], plans[2]
    finally:
        async with owner.transaction():
            for org in orgs:
                await owner.execute("SELECT set_config('app.org_id', $1, true)", str(org))
                await owner.execute("DELETE FROM work_items WHERE org_id = $1", org)
        await owner.close()


async def test_the_tenant_policies_leave_the_planner_its_row_estimates(
    pg_funnel: StorageFunnel, pg_owner_url: str, pg_url: str, lane: str
) -> None:
    """Row-level security adds a table's tenant policy to every read of the application's
    role, and the planner weighs it as any filter. Written as an OR it was estimated to keep
    one row in two hundred, so one tenant's backlog looked too small to read in index order
    (docs/decisions/0057); as a CASE on the scope the planner keeps at least two in five of
    a tenant's 2,000 analyzed items, or schedule rows, under the system scope and its own."""
    org = uuid4()
    async with pg_funnel.session(DatabaseRole.QUEUE, org) as conn:
        await conn.execute(insert(work_items), [stored_row(org, lane) for _ in range(2_000)])
    owner = await asyncpg.connect(asyncpg_dsn(pg_owner_url))
    app = await asyncpg.connect(asyncpg_dsn(pg_url))
    reads = {
        "work_items": f"SELECT * FROM work_items WHERE lane = '{lane}'",
        "work_schedules": "SELECT * FROM work_schedules",
    }
    try:
        async with owner.transaction():
            await owner.execute("SELECT set_config('app.org_id', $1, true)", str(org))
            await owner.execute(
                "INSERT INTO work_schedules (org_id, schedule, tick_at, updated_at)"
                " SELECT $1, $2 || ':' || n, now(), now() FROM generate_series(1, 2000) n",
                org,
                lane,
            )
        await owner.execute("ANALYZE work_items, work_schedules")
        estimates = {}
        for scope in (EMPTY_UUID, org):
            await app.execute("SELECT set_config('app.org_id', $1, false)", str(scope))
            for table, read in reads.items():
                explained = await app.fetchval(f"EXPLAIN (FORMAT JSON) {read}")
                estimates[table, scope] = json.loads(explained)[0]["Plan"]["Plan Rows"]
        assert min(estimates.values()) >= 800, estimates
    finally:
        async with owner.transaction():
            await owner.execute("SELECT set_config('app.org_id', $1, true)", str(org))
            await owner.execute("DELETE FROM work_items WHERE org_id = $1", org)
            await owner.execute("DELETE FROM work_schedules WHERE org_id = $1", org)
        await owner.close()
        await app.close()


async def _plans_over(
    conn: asyncpg.Connection, sql: str, calls: list[list[Any]]
) -> tuple[tuple[int, int], list[list[Any]]]:
    """Run prepared `sql` once per argument list of `calls`, each in a transaction rolled
    back; `(generic plans, custom plans)` PostgreSQL made for it, and each call's rows."""
    prepared = await conn.prepare(sql)
    found = []
    for values in calls:
        tx = conn.transaction()
        await tx.start()
        try:
            found.append(list(await prepared.fetch(*values)))
        finally:
            await tx.rollback()
    query = "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1"
    plans = await conn.fetchrow(query, sql)
    assert plans is not None
    return (plans[0], plans[1]), found


@pytest.mark.parametrize("limit", [1, 10])
async def test_the_claim_reuses_its_cached_generic_plan_which_reads_only_indexes(
    pg_funnel: StorageFunnel, pg_owner_url: str, lane: str, limit: int
) -> None:
    """A held connection prepares the claim once; PostgreSQL plans it afresh on every call
    unless its cached generic plan costs no more than a custom one, and planning this
    statement costs more than running it (docs/decisions/0053). Behind 20,000 due items of
    one tenant the claim takes its generic plan from the sixth call on, and that plan reads
    `work_items` only through the claim index and the primary key, so a plan made once
    serves a table of any size."""
    org = uuid4()
    due_at = datetime.now(UTC) - timedelta(hours=1)
    async with pg_funnel.session(DatabaseRole.QUEUE, org) as conn:
        for start in range(0, 20_000, 5_000):
            rows = [
                stored_row(org, lane, available_at=due_at + timedelta(milliseconds=n))
                for n in range(start, start + 5_000)
            ]
            await conn.execute(insert(work_items), rows)
    claim, values = postgres_statements.claim_for(lane, [KIND], "w1", LEASE_S, limit, uuid4())
    owner = await asyncpg.connect(asyncpg_dsn(pg_owner_url))
    try:
        await owner.execute("VACUUM ANALYZE work_items")
        await owner.execute("SELECT set_config('app.org_id', $1, false)", str(EMPTY_UUID))
        plans, found = await _plans_over(owner, claim.numbered, [values] * 8)
        assert [len(rows) for rows in found] == [limit] * 8
        assert plans == (3, 5)
        await owner.execute("SET plan_cache_mode = force_generic_plan")
        await owner.execute(f"PREPARE generic_claim AS {claim.numbered}")
        literals = ", ".join(f"'{value}'" for value in values)
        explained = await owner.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE generic_claim({literals})")
        plan = json.loads(explained)[0]["Plan"]
        reads = _reads_of_work_items(plan)
        named = {index for kind, index in reads if kind != "Bitmap Heap Scan"}
        assert named == {"ix_work_items_claim_order", "pk_work_items"}, reads
        assert not [r for r in reads if r[0] == "Seq Scan"], reads
        assert _sorts_of_work_items(plan) == [], plan
    finally:
        async with owner.transaction():
            await owner.execute("SELECT set_config('app.org_id', $1, true)", str(org))
            await owner.execute("DELETE FROM work_items WHERE org_id = $1", org)
        await owner.close()


async def test_the_completion_of_one_item_reuses_its_cached_generic_plan(
    pg_funnel: StorageFunnel, pg_owner_url: str, pg_url: str, lane: str
) -> None:
    """A capacity-1 worker completes one item a statement. Its triples are padded to ten
    with NULL, the length the generic plan is priced for, so PostgreSQL keeps that plan
    from the sixth call on instead of planning a custom one at every bind (docs/decisions/
    0054). Behind claimed rows, as the application's role under the system scope: the row
    security it runs under is part of what the planner weighs."""
    org = uuid4()
    token = uuid4()
    until = datetime.now(UTC) + timedelta(minutes=5)
    held = {"status": WorkStatus.CLAIMED.value, "claimed_by": "w1", "claim_token": token}
    async with pg_funnel.session(DatabaseRole.QUEUE, org) as conn:
        rows = [stored_row(org, lane, **held, lease_expires_at=until) for _ in range(1_000)]
        await conn.execute(insert(work_items), [*rows, *(stored_row(org, lane) for _ in rows)])
    complete = postgres_statements.COMPLETE
    owner = await asyncpg.connect(asyncpg_dsn(pg_owner_url))
    app = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        await owner.execute("ANALYZE work_items")
        await app.execute("SELECT set_config('app.org_id', $1, false)", str(EMPTY_UUID))
        claims: list[tuple[UUID, UUID, UUID]] = [(org, row["id"], token) for row in rows[:8]]
        calls = [postgres_statements.complete_values([claim]) for claim in claims]
        plans, found = await _plans_over(app, complete.numbered, calls)
        assert [[row[0] for row in done] for done in found] == [[c[1]] for c in claims]
        assert plans == (3, 5)
    finally:
        async with owner.transaction():
            await owner.execute("SELECT set_config('app.org_id', $1, true)", str(org))
            await owner.execute("DELETE FROM work_items WHERE org_id = $1", org)
        await owner.close()
        await app.close()


async def _front_reads(owner: asyncpg.Connection, lane: str, limit: int, front: int) -> int:
    """How many of one fair claim's scans of `ix_work_items_claim_order` (`limit` slots on
    `lane`, rolled back) read at least `front` blocks: each a pass through a churned front."""
    claim = postgres_statements.claim_statement(1, limit)
    values = postgres_statements.claim_values(lane, [KIND], "w1", LEASE_S)
    tx = owner.transaction()
    await tx.start()
    try:
        await owner.execute("SELECT set_config('app.org_id', $1, true)", str(EMPTY_UUID))
        explained = await owner.fetchval(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {claim.numbered}", *values
        )
    finally:
        await tx.rollback()

    def passes(node: dict[str, Any]) -> int:
        blocks = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
        own = node.get("Index Name") == "ix_work_items_claim_order" and blocks >= front
        return int(own) + sum(passes(child) for child in node.get("Plans", []))

    return passes(json.loads(explained)[0]["Plan"])


async def test_a_claim_reads_a_churned_front_once_to_find_its_tenant_once_for_its_share(
    pg_funnel: StorageFunnel, pg_owner_url: str, lane: str
) -> None:
    """Behind a tenant's churned front (300 claimed rows whose dead index entries a held
    snapshot keeps, as before a vacuum; stored in random order, so each costs a block), a
    claim passes through it once in the skip scan and once for the tenant's share, however
    the random start falls (the tenant's id above any start: the wrap-round probe stays
    below the start); with a second tenant's one item, once more for the slots it left."""
    big = UUID(f"ffffffff-ffff-4fff-bfff-{secrets.token_hex(6)}")
    due_at = datetime.now(UTC) - timedelta(hours=1)
    rows = [
        stored_row(big, lane, available_at=due_at + timedelta(milliseconds=n)) for n in range(400)
    ]
    async with pg_funnel.session(DatabaseRole.QUEUE, big) as conn:
        await conn.execute(insert(work_items), random.sample(rows, len(rows)))
    owner = await asyncpg.connect(asyncpg_dsn(pg_owner_url))
    holder = await asyncpg.connect(asyncpg_dsn(pg_owner_url))
    held = holder.transaction(isolation="repeatable_read")
    small = uuid4()
    try:
        await held.start()
        await holder.fetchval("SELECT 1")
        async with owner.transaction():
            await owner.execute("SELECT set_config('app.org_id', $1, true)", str(big))
            await owner.execute(
                "UPDATE work_items SET status = 'COMPLETED', completed_at = now()"
                " WHERE id = ANY($1::uuid[])",
                [r["id"] for r in rows[:300]],
            )
        # A pass reads a block per dead entry, about 300; a tenant's live items, a handful.
        assert [await _front_reads(owner, lane, 10, 200) for _ in range(3)] == [2, 2, 2]
        async with pg_funnel.session(DatabaseRole.QUEUE, small) as conn:
            await conn.execute(insert(work_items), [stored_row(small, lane)])
        assert await _front_reads(owner, lane, 10, 200) == 3
    finally:
        await held.rollback()
        await holder.close()
        async with owner.transaction():
            for org in (big, small):
                await owner.execute("SELECT set_config('app.org_id', $1, true)", str(org))
                await owner.execute("DELETE FROM work_items WHERE org_id = $1", org)
        await owner.close()


# -- failure replays (peers' reports; the template's docs/guarantees.md §2) ----------------------


@pytest.fixture
async def bench(
    pg_funnel: StorageFunnel, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[WorkBench]:
    """A work manager over PostgreSQL, its tenancy and audit on the same database."""
    use_probe_payload(monkeypatch)
    infra = Infra.memory()
    yield work_bench(SqlStorageRoot(pg_funnel), infra, PostgresWorkStorage(pg_funnel))
    await infra.aclose()


@pytest.fixture
def lane() -> str:
    return f"lane_{uuid4().hex[:12]}"


async def test_a_session_on_a_connection_the_server_dropped_is_opened_once_more(
    pg_url: str, lane: str
) -> None:
    """Without a pool pre-ping (as the worker runs), a queue call whose pooled connection's
    backend was terminated fails once at the funnel's first statement, opens its session
    once more on a fresh connection, and returns what it should: one disconnect seen."""
    engine = create_async_engine(pg_url, pool_size=1, max_overflow=0)  # no pre-ping
    disconnects: list[bool] = []
    event.listen(
        engine.sync_engine, "handle_error", lambda ctx: disconnects.append(ctx.is_disconnect)
    )
    storage = PostgresWorkStorage(StorageFunnel(dict.fromkeys(DatabaseRole, engine)))
    org = uuid4()
    killer = await asyncpg.connect(asyncpg_dsn(pg_url))  # the same role may end its backends
    try:
        (created,) = await storage.create_items(org, [make_item(org, lane)])
        async with engine.connect() as conn:  # the one pooled connection
            pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        await _terminate(killer, pid)
        found = await storage.read_item(org, created.id)
        assert found is not None
        assert found.id == created.id
        assert disconnects == [True]
        claimed = await storage.claim_next(lane, [KIND], "w1", LEASE_S)
        assert [item.id for item in claimed] == [created.id]
        assert disconnects == [True]
    finally:
        await killer.close()
        await engine.dispose()


_GONE = "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $1"


async def _terminate(killer: asyncpg.Connection, pid: int) -> None:
    """End the backend `pid` through `killer` and wait (2 s at most) until it is gone."""
    assert await killer.fetchval("SELECT pg_terminate_backend($1)", pid)
    for _ in range(100):
        if await killer.fetchval(_GONE, pid):
            return
        await asyncio.sleep(0.02)


def _held_backend_pids(storage: PostgresWorkStorage) -> list[int]:
    """The server pids of the connections `storage` holds idle (its `HeldConnections`)."""
    assert storage._connections is not None
    return [conn.raw.get_server_pid() for conn in storage._connections._idle]


async def test_a_held_connection_the_server_dropped_hands_its_call_to_a_funnel_session(
    pg_url: str, lane: str
) -> None:
    """A claim and a completion whose held connection's backend was terminated while it sat
    idle run once each, on a funnel session, and the next call holds a fresh connection; a
    held connection is closed when the funnel is disposed of."""
    engine = create_async_engine(pg_url, pool_size=3, max_overflow=0)  # no pre-ping
    storage = PostgresWorkStorage(StorageFunnel(dict.fromkeys(DatabaseRole, engine)), held=1)
    org = uuid4()
    killer = await asyncpg.connect(asyncpg_dsn(pg_url))  # the same role may end its backends
    try:
        created = await storage.create_items(org, [make_item(org, lane) for _ in "ab"])
        (first,) = await storage.claim_next(lane, [KIND], "w1", LEASE_S)
        (pid,) = _held_backend_pids(storage)
        await _terminate(killer, pid)
        claimed = await storage.claim_next(lane, [KIND], "w1", LEASE_S)
        (second,) = [c for c in created if c.id != first.id]
        assert [item.id for item in claimed] == [second.id]
        assert _held_backend_pids(storage) == []
        held = [(org, i.id, i.claim_token) for i in claimed if i.claim_token is not None]
        assert await storage.complete_items(held) == {second.id}  # a fresh one, held
        (pid,) = _held_backend_pids(storage)
        await _terminate(killer, pid)
        assert await storage.complete_items(held) == set()  # fenced: already completed
        done = await storage.read_item(org, second.id)
        assert done is not None
        assert done.status is WorkStatus.COMPLETED
        assert done.attempts == 1  # claimed once: the dropped connection ran nothing
        await storage.complete_items(held)
        (pid,) = _held_backend_pids(storage)
    finally:
        await engine.dispose()
    try:
        for _ in range(100):
            if await killer.fetchval(_GONE, pid):
                break
            await asyncio.sleep(0.02)
        assert await killer.fetchval(_GONE, pid), "disposing of the funnel left a held one open"
    finally:
        await killer.close()


async def test_a_first_statement_asyncpg_cannot_send_runs_in_a_funnel_session(
    pg_url: str, lane: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim, a completion and an enqueue whose first statement asyncpg refuses to send
    (its connection in another operation's state: the server ended it and asyncpg has not
    seen the socket close yet) each run once in a funnel session, and the connection is
    closed (an item already stored is reported so: the unsent insert wrote nothing); any
    other `InternalClientError` is raised."""
    engine = create_async_engine(pg_url, pool_size=3, max_overflow=0)
    storage = PostgresWorkStorage(StorageFunnel(dict.fromkeys(DatabaseRole, engine)), held=1)
    org = uuid4()
    real_fetch = asyncpg.Connection.fetch
    refusing: list[str] = []

    async def refuse_once(self: asyncpg.Connection, query: str, *args: Any, **kw: Any) -> Any:
        if refusing:
            message = refusing.pop()
            raise asyncpg.InternalClientError(message)
        return await real_fetch(self, query, *args, **kw)

    try:
        item = make_item(org, lane)
        (created,) = await storage.create_items(org, [item])
        monkeypatch.setattr(asyncpg.Connection, "fetch", refuse_once)
        refusing.append("cannot switch to state 12; another operation (2) is in progress")
        (claimed,) = await storage.claim_next(lane, [KIND], "w1", LEASE_S)
        assert (claimed.id, claimed.attempts) == (created.id, 1)
        assert _held_backend_pids(storage) == []  # closed, not kept
        assert claimed.claim_token is not None
        await storage.complete_items([(org, uuid4(), uuid4())])  # holds one again
        refusing.append("cannot switch to state 12; another operation (2) is in progress")
        done = await storage.complete_items([(org, claimed.id, claimed.claim_token)])
        assert done == {claimed.id}
        refusing.append("cannot switch to state 12; another operation (2) is in progress")
        (again,) = await storage.create_items(org, [item])
        assert (again.id, again.created) == (item.id, False)
        assert not refusing
        refusing.append("something else went wrong")
        with pytest.raises(asyncpg.InternalClientError):
            await storage.claim_next(lane, [KIND], "w1", LEASE_S)
    finally:
        await engine.dispose()


@pytest.fixture
async def one_held(pg_url: str) -> AsyncIterator[PostgresWorkStorage]:
    """A storage holding at most one connection, over an engine of its own (no pre-ping)."""
    engine = create_async_engine(pg_url, pool_size=3, max_overflow=0)
    yield PostgresWorkStorage(StorageFunnel(dict.fromkeys(DatabaseRole, engine)), held=1)
    await engine.dispose()


@pytest.fixture
async def owner(pg_owner_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection as the table's owner role."""
    conn = await asyncpg.connect(asyncpg_dsn(pg_owner_url))
    yield conn
    await conn.close()


async def test_a_held_connection_whose_statement_the_server_refused_is_kept(
    one_held: PostgresWorkStorage, owner: asyncpg.Connection, pg_url: str, lane: str
) -> None:
    """A claim the server refuses (here: its role lost `UPDATE` on the table) raises the
    server's error, and its held connection is kept for the next call (the statement ran
    alone: no transaction is left open), not replaced by a new session on every poll."""
    storage, org, role = one_held, uuid4(), make_url(pg_url).username
    (created,) = await storage.create_items(org, [make_item(org, lane)])
    assert not await storage.claim_next(f"{lane}-idle", [KIND], "w1", LEASE_S)  # holds one
    (pid,) = _held_backend_pids(storage)
    await owner.execute(f'REVOKE UPDATE ON work_items FROM "{role}"')
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await storage.claim_next(lane, [KIND], "w1", LEASE_S)
    finally:
        await owner.execute(f'GRANT UPDATE ON work_items TO "{role}"')
    assert _held_backend_pids(storage) == [pid]
    claimed = await storage.claim_next(lane, [KIND], "w1", LEASE_S)
    assert [item.id for item in claimed] == [created.id]
    assert claimed[0].attempts == 1  # the refused claim took nothing
    assert _held_backend_pids(storage) == [pid]


async def test_a_claim_on_a_held_connection_that_waits_past_its_lease_is_cancelled(
    one_held: PostgresWorkStorage, owner: asyncpg.Connection, lane: str
) -> None:
    """A claim blocked longer than its lease (here on a lock the owner holds) is cancelled by
    the server after the lease (its `statement_timeout`): it raises, claims nothing (the
    statement ran alone, so nothing of it committed), and its held connection is kept."""
    storage, org = one_held, uuid4()
    (created,) = await storage.create_items(org, [make_item(org, lane)])
    assert not await storage.claim_next(f"{lane}-idle", [KIND], "w1", LEASE_S)  # holds one
    (pid,) = _held_backend_pids(storage)
    lock = owner.transaction()
    await lock.start()
    await owner.execute("LOCK TABLE work_items IN ACCESS EXCLUSIVE MODE")
    began = time.monotonic()
    try:
        with pytest.raises(asyncpg.QueryCanceledError):
            await storage.claim_next(lane, [KIND], "w1", 0.5)
        waited = time.monotonic() - began
    finally:
        await lock.rollback()
    assert 0.5 <= waited < 1.5
    assert _held_backend_pids(storage) == [pid]
    claimed = await storage.claim_next(lane, [KIND], "w1", LEASE_S)
    assert [item.id for item in claimed] == [created.id]
    assert claimed[0].attempts == 1  # the cancelled claim took nothing
    assert _held_backend_pids(storage) == [pid]


async def test_a_claim_with_a_lease_past_the_longest_statement_timeout_runs_held(
    one_held: PostgresWorkStorage, lane: str
) -> None:
    """A lease longer than PostgreSQL's longest `statement_timeout` (about 24.8 days) gives
    the claim that longest one: it runs on its held connection, which is kept, rather than
    failing to set the timeout and falling back to a session on every claim."""
    storage, org = one_held, uuid4()
    (created,) = await storage.create_items(org, [make_item(org, lane)])
    (pid,) = _held_backend_pids(storage)
    (claimed,) = await storage.claim_next(lane, [KIND], "w1", 30 * 86_400.0)
    assert claimed.id == created.id
    assert _held_backend_pids(storage) == [pid]


async def test_a_claim_on_a_held_connection_that_stops_answering_fails_and_is_closed(
    one_held: PostgresWorkStorage, lane: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim on a connection that does not answer (here: the server's own timeout is
    taken away, and the claim sleeps past its lease and the grace) raises `TimeoutError`
    after `lease + CLAIM_TIMEOUT_GRACE_S` and its held connection is closed: the next claim
    runs on a fresh one."""
    storage, org = one_held, uuid4()
    (created,) = await storage.create_items(org, [make_item(org, lane)])
    assert not await storage.claim_next(f"{lane}-idle", [KIND], "w1", LEASE_S)  # holds one
    (pid,) = _held_backend_pids(storage)
    monkeypatch.setattr(postgres, "CLAIM_TIMEOUT_GRACE_S", 0.3)
    scope_sql = held_connections._scope_sql
    monkeypatch.setattr(held_connections, "_scope_sql", lambda scope: scope_sql((scope[0], None)))
    silent = "SELECT * FROM work_items WHERE lane = $1 AND $2::text <> '' AND $3::float8 > 0"
    silent += " AND $4::uuid IS NOT NULL AND kind = $5 AND (SELECT count(*) FROM pg_sleep(3)) = 0"
    claim = dataclasses.replace(postgres_statements.claim_one_statement(1), numbered=silent)
    # Answers after 3 s, as a connection that stopped would.
    monkeypatch.setattr(postgres_statements, "claim_one_statement", lambda kinds: claim)
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        await storage.claim_next(lane, [KIND], "w1", 0.5)
    waited = time.monotonic() - began
    assert 0.8 <= waited < 2.0
    assert _held_backend_pids(storage) == []
    monkeypatch.undo()
    claimed = await storage.claim_next(lane, [KIND], "w1", LEASE_S)
    assert [item.id for item in claimed] == [created.id]
    assert _held_backend_pids(storage) not in ([], [pid])


async def test_an_enqueue_runs_on_a_held_connection_and_reuses_it(
    one_held: PostgresWorkStorage, lane: str
) -> None:
    """An enqueue holds a connection and the next one runs on the same backend; an item
    already stored (by id or by idempotency key) is reported as the stored row, read in the
    same transaction."""
    storage, org = one_held, uuid4()
    first = make_item(org, lane, key="k1")
    (created,) = await storage.create_items(org, [first])
    assert created.created
    (pid,) = _held_backend_pids(storage)
    again = make_item(org, lane, key="k1")
    fresh = make_item(org, lane)
    results = await storage.create_items(org, [first, again, fresh])
    assert [(r.id, r.created) for r in results] == [
        (first.id, False),
        (first.id, False),
        (fresh.id, True),
    ]
    assert all(r.row is not None and r.row.org_id == org for r in results)
    assert _held_backend_pids(storage) == [pid]


async def test_an_enqueue_refused_on_a_held_connection_raises_the_funnels_error(
    one_held: PostgresWorkStorage, owner: asyncpg.Connection, pg_url: str, lane: str
) -> None:
    """An enqueue the server refuses (here: its role lost `INSERT`) keeps its held
    connection and runs once more in a funnel session, so the caller sees SQLAlchemy's
    error, as from every other method; nothing is written."""
    storage, org, role = one_held, uuid4(), make_url(pg_url).username
    await storage.create_items(org, [make_item(org, lane)])
    (pid,) = _held_backend_pids(storage)
    refused = make_item(org, lane)
    await owner.execute(f'REVOKE INSERT ON work_items FROM "{role}"')
    try:
        with pytest.raises(DBAPIError) as raised:
            await storage.create_items(org, [refused])
    finally:
        await owner.execute(f'GRANT INSERT ON work_items TO "{role}"')
    assert isinstance(raised.value.orig, Exception)
    assert "permission denied" in str(raised.value)
    assert _held_backend_pids(storage) == [pid]
    assert await storage.read_item(org, refused.id) is None


async def test_an_enqueue_whose_held_connection_was_dropped_runs_once_in_a_session(
    one_held: PostgresWorkStorage, lane: str, pg_url: str
) -> None:
    """An enqueue whose held connection's backend was terminated while it sat idle writes
    its items once, through a funnel session."""
    storage, org = one_held, uuid4()
    await storage.create_items(org, [make_item(org, lane)])
    (pid,) = _held_backend_pids(storage)
    killer = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        await _terminate(killer, pid)
    finally:
        await killer.close()
    items = [make_item(org, lane) for _ in "ab"]
    results = await storage.create_items(org, items)
    assert [(r.id, r.created) for r in results] == [(i.id, True) for i in items]
    stored = await storage.read_items(org, [i.id for i in items])
    assert sorted(i.id for i in stored) == sorted(i.id for i in items)


async def test_an_enqueue_whose_insert_landed_before_its_connection_failed_is_reported_once(
    one_held: PostgresWorkStorage, lane: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held connection that fails right after its insert committed (here: the connection
    is terminated as the insert's answer arrives, so the storage never sees it) runs the
    enqueue once more in a funnel session, which finds the rows stored: each is written
    once and reported as created by this call."""
    storage, org = one_held, uuid4()
    await storage.create_items(org, [make_item(org, lane)])  # holds one
    real_fetch = asyncpg.Connection.fetch
    failed: list[str] = []

    async def insert_then_fail(self: asyncpg.Connection, query: str, *args: Any, **kw: Any) -> Any:
        result = await real_fetch(self, query, *args, **kw)
        if query.startswith("INSERT") and not failed:
            failed.append(query)
            self.terminate()
            raise ConnectionResetError("the connection failed before the insert's answer")
        return result

    monkeypatch.setattr(asyncpg.Connection, "fetch", insert_then_fail)
    items = [make_item(org, lane) for _ in "ab"]
    results = await storage.create_items(org, items)
    monkeypatch.undo()
    assert len(failed) == 1
    assert [(r.id, r.created) for r in results] == [(i.id, True) for i in items]
    stored = await storage.read_items(org, [i.id for i in items])
    assert sorted(i.id for i in stored) == sorted(i.id for i in items)


async def test_a_bulk_insert_that_landed_before_its_connection_failed_is_reported_once(
    one_held: PostgresWorkStorage, lane: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`create_new` as `create_items` above: its held connection fails right after the
    insert committed, the call runs once more in a funnel session, which skips the stored
    ids, and every id is reported inserted, each row written once."""
    storage, org = one_held, uuid4()
    await storage.create_items(org, [make_item(org, lane)])  # holds one
    real_fetch = asyncpg.Connection.fetch
    failed: list[str] = []

    async def insert_then_fail(self: asyncpg.Connection, query: str, *args: Any, **kw: Any) -> Any:
        result = await real_fetch(self, query, *args, **kw)
        if query.startswith("INSERT") and not failed:
            failed.append(query)
            self.terminate()
            raise ConnectionResetError("the connection failed before the insert's answer")
        return result

    monkeypatch.setattr(asyncpg.Connection, "fetch", insert_then_fail)
    batch = NewItems(
        kind=KIND,
        lane=lane,
        max_attempts=3,
        delay=0.0,
        created_at=datetime.now(UTC),
        actor=uuid4(),
        request_id=None,
        traceparent=None,
        ids=[uuid4(), uuid4()],
        payloads=[json.dumps({"record_id": str(uuid4())}) for _ in "ab"],
    )
    inserted = await storage.create_new(org, batch)
    monkeypatch.undo()
    assert len(failed) == 1
    assert inserted == set(batch.ids)
    stored = await storage.read_items(org, batch.ids)
    assert sorted(i.id for i in stored) == sorted(batch.ids)


async def test_a_held_connection_unused_for_its_idle_time_goes_back_to_the_pool(
    pg_url: str, lane: str
) -> None:
    """A held connection unused for `held_idle_s` is checked back in (the pool then has
    none checked out), and the next call holds one again."""
    engine = create_async_engine(pg_url, pool_size=3, max_overflow=0)
    storage = PostgresWorkStorage(
        StorageFunnel(dict.fromkeys(DatabaseRole, engine)), held=1, held_idle_s=0.2
    )
    org, pool = uuid4(), cast(QueuePool, engine.sync_engine.pool)
    try:
        await storage.create_items(org, [make_item(org, lane)])
        assert len(_held_backend_pids(storage)) == 1
        assert pool.checkedout() == 1
        for _ in range(100):
            await asyncio.sleep(0.05)
            if pool.checkedout() == 0:
                break
        assert pool.checkedout() == 0
        assert _held_backend_pids(storage) == []
        assert pool.checkedin() == 1  # given back, not closed
        await storage.claim_next(lane, [KIND], "w1", LEASE_S)
        assert len(_held_backend_pids(storage)) == 1
    finally:
        await engine.dispose()


async def test_an_idle_held_connection_goes_back_when_sessions_take_the_rest_of_the_pool(
    pg_url: str, lane: str
) -> None:
    """After an enqueue (its connection held, idle), as many concurrent sessions as the
    pool has connections: the one that finds the pool empty waits for the held connection
    to be given back (its reset), not for the held connection's idle time."""
    engine = create_async_engine(pg_url, pool_size=3, max_overflow=0, pool_timeout=5)
    funnel = StorageFunnel(dict.fromkeys(DatabaseRole, engine))
    storage = PostgresWorkStorage(funnel, held=1, held_idle_s=5.0)
    org = uuid4()

    async def session() -> float:
        began = time.monotonic()
        async with funnel.session(DatabaseRole.QUEUE, org) as conn:
            waited = time.monotonic() - began
            await conn.execute(text("SELECT pg_sleep(0.5)"))
        return waited

    try:
        await storage.create_items(org, [make_item(org, lane)])
        assert len(_held_backend_pids(storage)) == 1
        waits = await asyncio.gather(*(session() for _ in range(3)))
        assert max(waits) < 0.4  # not the 5 s idle time, nor the other sessions' 0.5 s
        assert _held_backend_pids(storage) == []
    finally:
        await engine.dispose()


async def test_a_held_connection_runs_under_its_calls_tenant_and_goes_back_without_it(
    pg_url: str, lane: str
) -> None:
    """One held connection serves two tenants and the system scope in turn, each statement
    under its caller's tenant (row-level security refuses a row of another tenant, so each
    enqueue landing proves its tenant was set); given back to the pool, its session has no
    tenant left for the next checkout."""
    engine = create_async_engine(pg_url, pool_size=3, max_overflow=0)
    storage = PostgresWorkStorage(
        StorageFunnel(dict.fromkeys(DatabaseRole, engine)), held=1, held_idle_s=0.2
    )
    first, second, pool = uuid4(), uuid4(), cast(QueuePool, engine.sync_engine.pool)
    try:
        await storage.create_items(first, [make_item(first, lane)])
        (pid,) = _held_backend_pids(storage)
        await storage.create_items(second, [make_item(second, lane)])
        claimed = await storage.claim_next(lane, [KIND], "w1", LEASE_S, limit=5)
        assert sorted(str(i.org_id) for i in claimed) == sorted(map(str, (first, second)))
        for item in claimed:
            assert item.claim_token is not None
            done = await storage.complete_items([(item.org_id, item.id, item.claim_token)])
            assert done == {item.id}
        assert _held_backend_pids(storage) == [pid]  # one connection did all of it
        for _ in range(100):
            await asyncio.sleep(0.05)
            if pool.checkedout() == 0:
                break
        assert _held_backend_pids(storage) == []
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            session = cast(asyncpg.Connection, raw.driver_connection)
            assert session.get_server_pid() == pid  # the pool hands out the one given back
            assert await session.fetchval("SELECT current_setting('app.org_id', true)") == ""
    finally:
        await engine.dispose()


async def test_a_held_connection_through_a_pooler_sets_the_tenant_for_each_call_alone(
    pg_url: str, lane: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held connection whose server process is not the one it was opened with (as through
    a connection pooler, which hands its clients a process id of its own) runs each call as
    one transaction with the tenant set for it alone: between calls its session carries no
    tenant, so a pooler that hands the server connection to another client hands no tenant
    with it; a connection straight to the server keeps its call's tenant on the session."""
    engine = create_async_engine(pg_url, pool_size=3, max_overflow=0)
    storage = PostgresWorkStorage(StorageFunnel(dict.fromkeys(DatabaseRole, engine)), held=1)
    org = uuid4()
    scope = "SELECT current_setting('app.org_id', true)"
    try:
        await storage.create_items(org, [make_item(org, lane)])
        assert storage._connections is not None
        (direct,) = storage._connections._idle
        assert direct.direct
        assert await direct.raw.fetchval(scope) == str(org)
    finally:
        await engine.dispose()
    real_pid = asyncpg.Connection.get_server_pid
    monkeypatch.setattr(asyncpg.Connection, "get_server_pid", lambda self: -real_pid(self))
    engine = create_async_engine(pg_url, pool_size=3, max_overflow=0)
    storage = PostgresWorkStorage(StorageFunnel(dict.fromkeys(DatabaseRole, engine)), held=1)
    try:
        (created,) = await storage.create_items(org, [make_item(org, lane)])
        assert storage._connections is not None
        (pooled,) = storage._connections._idle
        assert not pooled.direct
        assert await pooled.raw.fetchval(scope) in ("", None)
        claimed = await storage.claim_next(lane, [KIND], "w1", LEASE_S, limit=10)
        assert created.id in {item.id for item in claimed}
        assert await pooled.raw.fetchval(scope) in ("", None)
        assert await pooled.raw.fetchval("SHOW statement_timeout") == "0"
        held = [(org, i.id, i.claim_token) for i in claimed if i.claim_token is not None]
        assert await storage.complete_items(held) == {i.id for i in claimed}
        assert storage._connections._idle == [pooled]
    finally:
        await engine.dispose()


async def test_a_held_connection_goes_back_at_once_when_the_pool_has_none_other_to_give(
    pg_url: str, lane: str
) -> None:
    """A call on a held connection gives it back as it ends while every connection of the
    pool's size is checked out (itself included): a pool of one is never held, so a session
    opened right after an enqueue does not wait; a pool of two is held only while no
    session holds the other."""
    org = uuid4()
    engine = create_async_engine(pg_url, pool_size=1, max_overflow=0, pool_timeout=5)
    funnel = StorageFunnel(dict.fromkeys(DatabaseRole, engine))
    storage = PostgresWorkStorage(funnel, held=1)
    try:
        await storage.create_items(org, [make_item(org, lane)])
        assert _held_backend_pids(storage) == []
        began = time.monotonic()
        async with funnel.session(DatabaseRole.QUEUE, org):
            waited = time.monotonic() - began
        assert waited < 0.5  # not the held connection's idle time, nor the pool's timeout
    finally:
        await engine.dispose()
    engine = create_async_engine(pg_url, pool_size=2, max_overflow=1)
    funnel = StorageFunnel(dict.fromkeys(DatabaseRole, engine))
    storage = PostgresWorkStorage(funnel, held=1)
    try:
        async with funnel.session(DatabaseRole.QUEUE, org):
            await storage.create_items(org, [make_item(org, lane)])
            assert _held_backend_pids(storage) == []
        await storage.create_items(org, [make_item(org, lane)])
        assert len(_held_backend_pids(storage)) == 1  # the other is free again: held
    finally:
        await engine.dispose()


async def test_a_nul_character_is_refused_at_enqueue_and_made_storable_in_an_error(
    bench: WorkBench, lane: str
) -> None:
    """What the memory storage accepts and PostgreSQL cannot store is refused before the
    insert, naming PostgreSQL's reason, and a failure's text is stored with U+0000 and a
    lone surrogate escaped (`\\x00`, `\\ud800`), never refused by the driver."""
    ctx = await bench.member()
    nul = make_item(ctx.org_id, lane).model_copy(
        update={"payload": {"record_id": str(uuid4()), "note": "a\x00b"}}
    )
    with pytest.raises(Invalid, match=r"^payload\.note: holds a NUL .*, which PostgreSQL cannot"):
        await bench.work.enqueue(ctx, nul)
    assert await bench.work.list_items(ctx) == []
    await bench.work.enqueue(ctx, make_item(ctx.org_id, lane))
    claimed = await bench.work.claim(RequestContext.new(WORKER_APP), lane, [KIND], "w1", LEASE_S)
    assert claimed is not None
    failed = await bench.work.fail(*claimed, "ValueError: bad\x00byte \ud800")
    stored = (await bench.work.get(ctx, failed.id)).last_error
    assert stored == "ValueError: bad\\x00byte \\ud800"


async def test_oban_532_a_stale_failure_cannot_revive_a_dead_item(
    bench: WorkBench, lane: str
) -> None:
    """max_attempts=2. A claims and pauses; its lease passes and the sweep hands the item
    back; B claims and fails for the last time; A wakes and reports a failure. A's write
    changes nothing and the item stays dead."""
    ctx = await bench.member()
    item = await bench.work.enqueue(ctx, make_item(ctx.org_id, lane, max_attempts=2))
    claimed_a = await bench.work.claim(
        RequestContext.new(WORKER_APP), lane, [KIND], "a", SHORT_LEASE_S
    )
    assert claimed_a is not None
    a_ctx, a_item = claimed_a
    await asyncio.sleep(PAST_SHORT_S)
    assert await bench.work.requeue_stale(await bench.service(ctx.org_id)) == 1
    claimed_b = await bench.work.claim(RequestContext.new(WORKER_APP), lane, [KIND], "b", LEASE_S)
    assert claimed_b is not None
    b_ctx, b_item = claimed_b
    assert b_item.attempts == 2
    dead = await bench.work.fail(b_ctx, b_item, "b failed")
    assert dead.status is WorkStatus.FAILED

    with pytest.raises(Conflict):
        await bench.work.fail(a_ctx, a_item, "a failed late")

    row = await bench.work.get(ctx, item.id)
    assert (row.status, row.attempts, row.last_error) == (WorkStatus.FAILED, 2, "b failed")
    assert (
        await bench.work.claim(RequestContext.new(WORKER_APP), lane, [KIND], "c", LEASE_S) is None
    )


async def _wait_until_blocked_on_a_lock(funnel: StorageFunnel) -> None:
    """Return once some session of this role waits on a row lock of `work_items`."""
    query = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE wait_event_type = 'Lock' AND query ILIKE '%UPDATE work_items%'"
    )
    for _ in range(200):
        async with funnel.engine(DatabaseRole.QUEUE).connect() as conn:
            if await conn.scalar(query):
                return
        await asyncio.sleep(0.025)
    raise AssertionError("the sweep never reached the row lock")


async def test_river_1302_a_sweep_paused_after_its_read_leaves_a_completion_alone(
    pg_funnel: StorageFunnel, lane: str
) -> None:
    """The sweep reads the item as stale, then waits on the row while a completion with
    the still-valid token commits; resumed, its UPDATE re-checks status and token and moves
    nothing (riverqueue/river#1302, fixed by re-checking in the UPDATE)."""
    storage = PostgresWorkStorage(pg_funnel)
    org = uuid4()
    await storage.create_item(org, make_item(org, lane))
    (claimed,) = await storage.claim_next(lane, [KIND], "w1", LEASE_S)
    assert claimed.lease_expires_at is not None
    before = claimed.lease_expires_at + timedelta(seconds=60)

    async with pg_funnel.session(DatabaseRole.QUEUE, org) as conn:
        done = await storage._write_on(
            conn, org, outcome(claimed, WorkStatus.COMPLETED), token_of(claimed)
        )
        sweep = asyncio.create_task(storage.requeue_stale(org, before, 10))
        await _wait_until_blocked_on_a_lock(pg_funnel)
        assert not sweep.done()
    assert await sweep == []
    row = await storage.read_item(org, claimed.id)
    assert row == done
    assert row is not None
    assert row.status is WorkStatus.COMPLETED


_CRASHER = """
import asyncio, os, sys
from acme.om.storage.funnel import StorageFunnel
from acme.om.work.storage.impl.postgres import PostgresWorkStorage
from acme.om.work.types.work_item import WorkKind

async def main(url, lane, lease):
    funnel = StorageFunnel.from_url(url, pool_size=1)
    claimed = await PostgresWorkStorage(funnel).claim_next(lane, list(WorkKind), "crasher", lease)
    for item in claimed:
        print(item.id, flush=True)
        os._exit(1)
    await funnel.dispose()

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
"""


async def _run_crasher(pg_url: str, lane: str, lease: float) -> tuple[int, list[str]]:
    """One worker process: claims one item of `lane`, runs it (prints its id), and dies
    with `os._exit(1)` before it can complete it. Returns its exit code and what it ran."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CRASHER, pg_url, lane, str(lease), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await process.communicate()
    return await process.wait(), out.decode().split()


async def test_oban_137_a_crash_on_the_last_attempt_runs_once_then_dead_letters(
    bench: WorkBench, pg_url: str, lane: str
) -> None:
    """max_attempts=1: the worker dies mid-item, a supervisor restarts it, the sweep runs.
    The item ran once and is a dead letter: failed row, audit entry, counted."""
    ctx = await bench.member()
    item = await bench.work.enqueue(ctx, make_item(ctx.org_id, lane, max_attempts=1))

    runs: list[str] = []
    for _ in range(2):
        code, ran = await _run_crasher(pg_url, lane, SHORT_LEASE_S)
        runs += ran
        if ran:
            assert code == 1
    await asyncio.sleep(PAST_SHORT_S)
    assert await bench.work.requeue_stale(await bench.service(ctx.org_id)) == 1
    code, ran = await _run_crasher(pg_url, lane, SHORT_LEASE_S)
    runs += ran

    assert (code, runs) == (0, [str(item.id)])
    row = await bench.work.get(ctx, item.id)
    assert row.status is WorkStatus.FAILED
    entries = await bench.managers.audit.list_for(ctx, "work_item", item.id)
    assert [e.action for e in entries] == ["work.dead_lettered"]
    assert bench.count("work_dead_letters_total", kind=KIND.value, reason="lease") == 1


# -- one row the worker cannot read --------------------------------------------------------------


@pytest.fixture
async def payload_check_lifted(pg_owner_url: str) -> AsyncIterator[None]:
    """The table without `ck_work_items_payload` for one test, as a table that predates it
    (or whose check someone dropped) is; put back after by the migrations' own SQL, which
    also dead-letters what the test left runnable and breaking it."""
    await lift_payload_check(pg_owner_url)
    yield
    await restore_payload_check(pg_owner_url)


@pytest.mark.usefixtures("payload_check_lifted")
@pytest.mark.parametrize("payload", [[1, 2, 3], None], ids=["array", "null"])
async def test_one_unreadable_row_between_good_ones_never_stops_the_lane(
    bench: WorkBench, pg_funnel: StorageFunnel, lane: str, payload: object
) -> None:
    """The report: a `NOTIFY`-kind row, `AVAILABLE`, payload `[1,2,3]` (or `null`), with
    items enqueued before and after it. Every claim used to fail on it, and every item of the
    lane waited. Now the good items are claimed and completed, the bad row is a dead letter
    naming its column and why, counted, and its audit entry is written by the sweep, once."""
    ctx = await bench.member()
    before = [await bench.work.enqueue(ctx, make_item(ctx.org_id, lane)) for _ in range(2)]
    bad = stored_row(ctx.org_id, lane, payload=payload, available_at=datetime.now(UTC))
    await store_row(pg_funnel, bad)
    after = [await bench.work.enqueue(ctx, make_item(ctx.org_id, lane)) for _ in range(2)]
    good = {item.id for item in before + after}
    rctx = RequestContext.new(WORKER_APP)
    await bench.work.queue_stats(rctx)  # the gauge counts every tenant of the database
    owed_before = bench.count("work_dead_letters_unaudited", kind=KIND.value)

    claimed = await bench.work.claim_many(rctx, lane, [KIND], "w1", lease=LEASE_S, limit=10)

    assert {item.id for _, item in claimed} == good
    assert await bench.work.complete_many(claimed) == good
    listed = await bench.work.list_items(ctx, limit=10)
    assert {(i.id, i.status) for i in listed} == {(i, WorkStatus.COMPLETED) for i in good}
    (dead,) = listed.unreadable
    assert (dead.id, dead.status, dead.column) == (bad["id"], "FAILED", "payload")
    assert dead.problem == "payload: Input should be a valid dictionary"
    assert dead.values["last_error"] == f"unreadable row: {dead.problem}"
    assert dead.values["claim_token"] is None
    assert bench.count("work_dead_letters_total", kind=KIND.value, reason="unreadable") == 1
    assert await bench.work.claim_many(rctx, lane, [KIND], "w2", lease=LEASE_S, limit=10) == []

    await bench.work.queue_stats(rctx)
    assert bench.count("work_dead_letters_unaudited", kind=KIND.value) == owed_before + 1
    sweep = await bench.service(ctx.org_id)
    assert await bench.work.audit_dead_letters(sweep) == 1
    assert await bench.work.audit_dead_letters(sweep) == 0
    entries = await bench.managers.audit.list_for(ctx, "work_item", bad["id"])
    assert [(e.action, e.detail["reason"]) for e in entries] == [
        ("work.dead_lettered", "unreadable")
    ]
    await bench.work.queue_stats(rctx)
    assert bench.count("work_dead_letters_unaudited", kind=KIND.value) == owed_before


async def test_the_table_keeps_a_payload_that_is_no_object_off_runnable_rows(
    pg_funnel: StorageFunnel, lane: str
) -> None:
    """`ck_work_items_payload`: a row that can run holds a JSON object; a dead letter (or a
    completed row) may keep any JSON, and nothing makes it runnable again."""
    org = uuid4()
    for status in ("AVAILABLE", "CLAIMED"):
        with pytest.raises(IntegrityError, match="ck_work_items_payload"):
            await store_row(pg_funnel, stored_row(org, lane, payload=[1], status=status))
    dead = stored_row(org, lane, payload=[1], status="FAILED")
    await store_row(pg_funnel, dead)
    with pytest.raises(IntegrityError, match="ck_work_items_payload"):
        async with pg_funnel.session(DatabaseRole.QUEUE, org) as conn:
            await conn.execute(
                work_items.update()
                .where(work_items.c.id == dead["id"])
                .values(status=WorkStatus.AVAILABLE.value)
            )
    assert await PostgresWorkStorage(pg_funnel).revive_item(org, dead["id"]) is None


# -- the migrations over rows written before them ------------------------------------------------

ADMIN_ENV = "ACME_TEST_ADMIN_URL"
ADMIN_URL = os.environ.get(ADMIN_ENV, "postgresql://postgres@127.0.0.1:5432/postgres")
# The stamp of the queue revisions the template rendered: `<stamp>_work_items.py` is the first.
STAMP = next(MIGRATIONS_DIR.glob("versions/queue/*_work_items.py")).stem.removesuffix("_work_items")
NIL = "00000000-0000-0000-0000-000000000000"


@pytest.fixture
def scratch_url(pg_owner_url: str) -> Iterator[str]:
    """A database of its own (the migration test moves its schema up and down), owned by the
    owner role of `pg_owner_url`, dropped after the test."""
    name = f"work_migrations_{secrets.token_hex(4)}"
    owner = make_url(pg_owner_url)
    admin = asyncpg_dsn(ADMIN_URL)

    async def admin_run(statement: str) -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(admin_run(f'CREATE DATABASE "{name}" OWNER "{owner.username}"'))
    try:
        yield owner.set(database=name).render_as_string(False)
    finally:
        asyncio.run(admin_run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def _owner_fetch(url: str, sql: str) -> list[tuple[Any, ...]]:
    """`sql`'s rows, read as the owner in the system scope (the policy is forced for it too)."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        async with conn.transaction():
            await conn.execute(f"SELECT set_config('app.org_id', '{NIL}', true)")
            return [tuple(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()


async def _store_all(url: str, rows: list[dict[str, Any]]) -> None:
    funnel = StorageFunnel.from_url(url, pool_size=1)
    try:
        for row in rows:
            await store_row(funnel, row)
    finally:
        await funnel.dispose()


_STATE = """
SELECT id, status, jsonb_typeof(payload), last_error, audit_owed_reason,
       audit_owed_token IS NOT NULL
FROM work_items
"""


def test_the_migrations_keep_rows_written_before_the_check_as_dead_letters_owing_an_entry(
    scratch_url: str,
) -> None:
    """A queue at `<stamp>_claim_paths` holding rows that break the payload rule (due, held by
    nobody, already failed) beside a good one: upgraded to head, the runnable ones are dead
    letters, their payload kept and `last_error` saying why; every dead letter that could not
    have been audited owes its entry; the good row is untouched; the check is validated.
    Down to `<stamp>_claim_paths` and up again ends the same."""
    migrate.upgrade(scratch_url, [DatabaseRole.QUEUE], to=f"{STAMP}_claim_paths")
    org = uuid4()
    waiting = stored_row(org, "default", payload=[1, 2, 3])
    held = stored_row(org, "default", payload=None, status="CLAIMED", attempts=1)
    failed = stored_row(org, "default", payload=7, status="FAILED", attempts=3)
    good = stored_row(org, "default")
    before = [waiting, held, failed, good]
    for row in before:
        del row["priority"]  # a column of a later revision (`<stamp>_priority`)
    asyncio.run(_store_all(scratch_url, before))

    migrate.upgrade(scratch_url, [DatabaseRole.QUEUE])

    made = "unreadable row: payload: a JSON {}, not an object (made a dead letter by a migration)"
    expected = {
        waiting["id"]: ("FAILED", "array", made.format("array"), "unreadable", True),
        held["id"]: ("FAILED", "null", made.format("null"), "unreadable", True),
        failed["id"]: ("FAILED", "number", None, "unreadable", True),
        good["id"]: ("AVAILABLE", "object", None, None, False),
    }
    state = {r[0]: r[1:] for r in asyncio.run(_owner_fetch(scratch_url, _STATE))}
    assert state == expected
    checks = asyncio.run(
        _owner_fetch(
            scratch_url,
            "SELECT convalidated FROM pg_constraint WHERE conname = 'ck_work_items_payload'",
        )
    )
    assert checks == [(True,)]

    migrate.downgrade(scratch_url, DatabaseRole.QUEUE, f"{STAMP}_claim_paths")
    migrate.upgrade(scratch_url, [DatabaseRole.QUEUE])
    state = {r[0]: r[1:] for r in asyncio.run(_owner_fetch(scratch_url, _STATE))}
    assert state == expected


# -- lane pauses: system-wide, written in the system scope only (docs/decisions/0040) -----------


async def test_a_tenants_session_reads_the_pauses_and_can_neither_pause_nor_resume(
    pg_funnel: StorageFunnel, lane: str
) -> None:
    """Row-level security on `work_lane_pauses`: every session reads it (the claim does,
    whatever scope it runs under), only the system scope writes it, so a tenant's session
    cannot stop or start a lane every tenant shares."""
    storage = PostgresWorkStorage(pg_funnel)
    tenant = uuid4()
    await storage.pause_lane(EMPTY_UUID, lane, paused_by="alice", reason=None)

    seen = [p.lane for p in await storage.paused_lanes(tenant)]
    lifted = await storage.resume_lane(tenant, lane)
    with pytest.raises(DBAPIError, match="row-level security"):
        await storage.pause_lane(tenant, f"{lane}_b", paused_by="mallory", reason=None)
    still = [p.lane for p in await storage.paused_lanes(EMPTY_UUID)]
    await storage.resume_lane(EMPTY_UUID, lane)

    assert lane in seen
    assert lifted is None
    assert lane in still
    assert f"{lane}_b" not in still
