"""The work queue on PostgreSQL (asyncpg): the claim as `FOR UPDATE SKIP LOCKED`, and the
enqueue, the claim and the completions on connections the storage holds while calls keep
coming (`HeldConnections`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, ClassVar
from uuid import UUID

import asyncpg
from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Float,
    Insert,
    Interval,
    TextClause,
    TextualSelect,
    Update,
    func,
    literal,
    select,
    text,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from acme.om.storage.funnel import StorageFunnel
from acme.om.storage.roles import DatabaseRole
from acme.om.types import EMPTY_UUID
from acme.om.work.storage import (
    UNREADABLE,
    WAKE_UP_CHANNEL,
    Created,
    NewItems,
    WakeUps,
)
from acme.om.work.storage.impl.held_connections import (
    HELD_IDLE_S,
    HeldConnection,
    HeldConnections,
    Unsent,
)
from acme.om.work.storage.impl.sql import (
    SqlWorkStorage,
    created_items,
    row_to_item,
    rows_read,
)
from acme.om.work.storage.tables.work_items import UtcDateTime, work_items
from acme.om.work.types.work_item import (
    UnreadableRow,
    WorkItem,
    WorkKind,
    WorkRows,
    WorkStatus,
)

t = work_items

# A wake-up connection silent this long is probed with `SELECT 1` (s), and counts as lost
# when the probe takes longer than `_PROBE_WITHIN` (s): a half-open connection never
# reports its own loss.
_PROBE_AFTER = 2.0
_PROBE_WITHIN = 2.0

# Every column an enqueue writes but `org_id` (bound once, not per row), with its PostgreSQL
# type, as the unnest insert binds them; `delay` is not a column: the database adds it to its
# clock for `available_at`.
_ARRAY_COLUMNS = {
    "id": "uuid",
    "kind": "text",
    "lane": "text",
    "payload": "text",
    "status": "text",
    "attempts": "integer",
    "max_attempts": "integer",
    "delay": "float8",
    "claimed_by": "text",
    "claim_token": "uuid",
    "claimed_at": "timestamptz",
    "lease_expires_at": "timestamptz",
    "last_error": "text",
    "note": "text",
    "idempotency_key": "text",
    "request_id": "uuid",
    "traceparent": "text",
    "completed_at": "timestamptz",
    "created_at": "timestamptz",
    "updated_at": "timestamptz",
    "created_by": "uuid",
    "updated_by": "uuid",
    "deleted_at": "timestamptz",
}

# What a fresh item (`_fresh`: every enqueue through the manager) leaves to the statement:
# the columns an item that never ran holds, written as SQL (over the row's other columns,
# named in braces), so the insert binds 11 columns instead of 23 (each costs its encoding
# in the driver, and an array its unnest in the server, a single enqueue as much as a batch).
_FRESH_FIXED = {
    "status": f"'{WorkStatus.AVAILABLE.value}'",
    "attempts": "0",
    "updated_at": "{created_at}",
    "updated_by": "{created_by}",
}
_FRESH_COLUMNS = {
    name: _ARRAY_COLUMNS[name]
    for name in (
        "id",
        "kind",
        "lane",
        "payload",
        "max_attempts",
        "delay",
        "idempotency_key",
        "request_id",
        "traceparent",
        "created_at",
        "created_by",
    )
}


def _fresh(item: WorkItem) -> bool:
    """Whether `item` holds what an item that never ran holds (available, no attempt spent,
    no claim, no error or note, never completed nor deleted, last changed when and by whom
    it was created): the insert then writes those columns in SQL (`_FRESH_FIXED`)."""
    return (
        item.status is WorkStatus.AVAILABLE
        and item.attempts == 0
        and item.claimed_by is None
        and item.claim_token is None
        and item.claimed_at is None
        and item.lease_expires_at is None
        and item.last_error is None
        and item.note is None
        and item.completed_at is None
        and item.deleted_at is None
        and item.updated_at == item.created_at
        and item.updated_by == item.created_by
    )


@dataclass(frozen=True, eq=False)
class _InsertForm:
    """One shape of the enqueue's insert: `bound` columns (name to PostgreSQL type) are
    parameters, `fixed` columns SQL over the bound ones (`{name}`). The insert binds one
    array per bound column and unnests them (`INSERT ... SELECT FROM unnest`: one prepared
    statement whatever the batch holds, as pgqueuer enqueues), or, for one item, one value
    per column (`INSERT ... VALUES`: nothing to build into arrays and unnest)."""

    bound: dict[str, str]
    fixed: dict[str, str]

    def sql(self, params: Sequence[str], *, one: bool = False) -> str:
        """The insert, `params[0]` the tenant's parameter (`$1`, or `:org_id` for
        SQLAlchemy) and `params[n]` the n-th bound column's (its array's, or with `one`
        its value's): duplicates (an id or an idempotency key already stored) are skipped,
        and each inserted row's `available_at` is the database's clock plus its `delay` in
        seconds."""
        names = list(self.bound)
        typed = zip(names, params[1:], self.bound.values(), strict=True)
        if one:
            source = {name: f"CAST({param} AS {sql_type})" for name, param, sql_type in typed}
        else:
            source = {name: f"u.{name}" for name in names}
        written = {"org_id": f"CAST({params[0]} AS uuid)"}
        written.update(
            (name, f"CAST({source[name]} AS jsonb)" if name == "payload" else source[name])
            for name in names
            if name != "delay"
        )
        written.update((name, sql.format_map(source)) for name, sql in self.fixed.items())
        delay = source["delay"]
        written["available_at"] = f"statement_timestamp() + make_interval(secs => {delay})"
        head = f"INSERT INTO work_items ({', '.join(written)}) "
        tail = " ON CONFLICT DO NOTHING RETURNING id, available_at"
        if one:
            return f"{head}VALUES ({', '.join(written.values())}){tail}"
        arrays = ", ".join(
            f"CAST({param} AS {sql_type}[])"
            for param, sql_type in zip(params[1:], self.bound.values(), strict=True)
        )
        return (
            f"{head}SELECT {', '.join(written.values())} "
            f"FROM unnest({arrays}) AS u({', '.join(names)}){tail}"
        )

    def values(self, org_id: UUID, items: Sequence[WorkItem], *, one: bool = False) -> list[Any]:
        """The insert's parameters: `org_id`, then per bound column the list of the items'
        values, or with `one` the value of `items[0]`, in order."""
        if one:
            (item,) = items
            return [org_id, *(_bound_value(item, name) for name in self.bound)]
        return [org_id, *([_bound_value(item, name) for item in items] for name in self.bound)]


def _bound_value(item: WorkItem, name: str) -> Any:
    """Column `name` of `item` as the insert binds it (the payload as JSON text)."""
    if name == "payload":
        return json.dumps(item.payload)
    if name == "status":
        return item.status.value
    return getattr(item, name)


_FULL_INSERT = _InsertForm(_ARRAY_COLUMNS, {})
_FRESH_INSERT = _InsertForm(_FRESH_COLUMNS, _FRESH_FIXED)


def _insert_form(items: Sequence[WorkItem]) -> _InsertForm:
    """The narrower insert when every item is fresh (`_fresh`), else the full one."""
    return _FRESH_INSERT if all(_fresh(item) for item in items) else _FULL_INSERT


# The bulk enqueue's parameters (`NewItems`), in order: one value each for the whole batch,
# then the two arrays (ids, payloads as JSON text).
_NEW_PARAMS = {
    "org_id": "uuid",
    "kind": "text",
    "lane": "text",
    "max_attempts": "integer",
    "request_id": "uuid",
    "traceparent": "text",
    "created_at": "timestamptz",
    "actor": "uuid",
    "delay": "float8",
    "ids": "uuid[]",
    "payloads": "text[]",
}


def _new_sql(params: Sequence[str]) -> str:
    """The bulk enqueue's insert, `params[n]` the parameter of the n-th `_NEW_PARAMS` entry:
    what the batch shares is bound once, only the ids and the payloads per row."""
    p = {
        name: f"CAST({param} AS {sql_type})"
        for (name, sql_type), param in zip(_NEW_PARAMS.items(), params, strict=True)
    }
    return (
        "INSERT INTO work_items (id, org_id, kind, lane, payload, status, attempts,"
        " max_attempts, request_id, traceparent, created_at, updated_at, created_by,"
        " updated_by, available_at)"
        f" SELECT u.id, {p['org_id']}, {p['kind']}, {p['lane']}, CAST(u.payload AS jsonb),"
        f" '{WorkStatus.AVAILABLE.value}', 0, {p['max_attempts']}, {p['request_id']},"
        f" {p['traceparent']}, {p['created_at']}, {p['created_at']}, {p['actor']},"
        f" {p['actor']}, statement_timestamp() + make_interval(secs => {p['delay']})"
        f" FROM unnest({p['ids']}, {p['payloads']}) AS u(id, payload)"
        " ON CONFLICT DO NOTHING RETURNING id"
    )


def _new_values(org_id: UUID, items: NewItems) -> list[Any]:
    """`items`' parameters for `_new_sql`, in `_NEW_PARAMS` order."""
    return [
        org_id,
        items.kind.value,
        items.lane,
        items.max_attempts,
        items.request_id,
        items.traceparent,
        items.created_at,
        items.actor,
        max(items.delay, 0.0),
        items.ids,
        items.payloads,
    ]


# Connections the storage holds at most for its busiest statements: the enqueue, the claim
# and the completions (two: in a worker a claim and a completion flush run at the same
# time; a third caller meanwhile takes a session from the funnel). The worker's pool
# reserves one connection for each of them.
HELD_CONNECTIONS = 2

# A claim on a held connection the server has not answered this long (s) past its
# `statement_timeout` (its lease) fails with `TimeoutError` and the connection is closed:
# the server cancels a statement at its timeout, so a claim still unanswered after it is
# on a connection that stopped answering.
CLAIM_TIMEOUT_GRACE_S = 1.0

# The enqueue's insert and its read of the rows it skipped, the claim, the completion and
# the dead letter of an unreadable row as asyncpg runs them on a held connection: the
# statements of `SqlWorkStorage.create_items`, `_claim_stmt`, `_complete_stmt` and
# `_unreadable_stmt` written out for PostgreSQL with numbered parameters, so each is
# prepared once per connection (asyncpg's statement cache) and never compiled again. The
# contract suite runs every case on both paths (docs/decisions/0021).
_COLUMNS = ", ".join(f"work_items.{column.name}" for column in t.c)
_RELEASED = (
    "claimed_by = NULL, claim_token = NULL, claimed_at = NULL, lease_expires_at = NULL,"
    f" updated_at = statement_timestamp(), updated_by = '{EMPTY_UUID}'"
)
_COMPLETE_SQL = (
    f"UPDATE work_items SET status = '{WorkStatus.COMPLETED.value}', {_RELEASED},"
    " completed_at = statement_timestamp()"
    " FROM unnest($1::uuid[], $2::uuid[]) AS held(id, claim_token)"
    " WHERE work_items.id = held.id AND work_items.claim_token = held.claim_token"
    f" AND work_items.org_id = $3 AND work_items.status = '{WorkStatus.CLAIMED.value}'"
    " AND work_items.lease_expires_at > statement_timestamp()"
    " RETURNING work_items.id"
)
_UNREADABLE_SQL = (
    f"UPDATE work_items SET status = '{WorkStatus.FAILED.value}', {_RELEASED},"
    " last_error = $4, audit_owed_token = $3, audit_owed_reason = 'unreadable'"
    " WHERE id = $1 AND org_id = $2 AND claim_token = $3"
    f" AND status = '{WorkStatus.CLAIMED.value}' AND lease_expires_at > statement_timestamp()"
    f" RETURNING {_COLUMNS}"
)


# A hand-back's wake-up, as the insert's trigger sends it (`SqlWorkStorage._announce`).
_ANNOUNCE = text("SELECT pg_notify(:channel, :note)")

# By form and whether it is the one-item (`VALUES`) form.
_INSERT_SQL = {
    (form, one): form.sql([f"${n}" for n in range(1, len(form.bound) + 2)], one=one)
    for form in (_FULL_INSERT, _FRESH_INSERT)
    for one in (False, True)
}
_NEW_SQL = _new_sql([f"${n}" for n in range(1, len(_NEW_PARAMS) + 1)])
# The stored rows holding the ids ($2) or idempotency keys ($3) of items the insert skipped.
_HOLDERS_SQL = (
    f"SELECT {_COLUMNS} FROM work_items WHERE org_id = $1"
    " AND (id = ANY($2::uuid[]) OR idempotency_key = ANY($3::text[]))"
)

# What asyncpg raises when the server refuses a statement or the connection fails (a
# backend terminated between two statements surfaces as `InternalClientError`).
_DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
)


def _claim_sql(kinds: int) -> str:
    """The claim for `kinds` kinds (`kind IN ($5, ...)`, one parameter each: for one kind
    the planner then reads `ix_work_items_claimable` in the claim's order and stops after
    `$2` rows, where `kind = ANY($5)` would sort every due row first). Parameters: lane,
    limit, worker id, lease in seconds, then the kinds."""
    listed = ", ".join(f"${n}" for n in range(5, 5 + kinds))
    return (
        "WITH picked AS (SELECT id FROM work_items"
        f" WHERE status = '{WorkStatus.AVAILABLE.value}' AND lane = $1 AND kind IN ({listed})"
        " AND available_at <= statement_timestamp() AND deleted_at IS NULL"
        " AND attempts < max_attempts"
        " ORDER BY available_at, id LIMIT $2 FOR UPDATE SKIP LOCKED)"
        f" UPDATE work_items SET status = '{WorkStatus.CLAIMED.value}',"
        " attempts = work_items.attempts + 1, claimed_by = $3,"
        " claim_token = gen_random_uuid(), claimed_at = statement_timestamp(),"
        " lease_expires_at = statement_timestamp() + make_interval(secs => $4),"
        f" note = NULL, updated_at = statement_timestamp(), updated_by = '{EMPTY_UUID}'"
        f" FROM picked WHERE work_items.id = picked.id RETURNING {_COLUMNS}"
    )


# The oldest snapshot of any other session of this database, in transaction ids. Every role
# sees `backend_xmin` of every backend in `pg_stat_activity` (the query text, the state and
# the times of other roles' sessions need `pg_read_all_stats`); the sweep's own backend is
# left out, its snapshot being the newest there is.
_OLDEST_SNAPSHOT = text(
    "SELECT current_database(), coalesce(max(age(backend_xmin)), 0) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND backend_xmin IS NOT NULL"
)


class PostgresWorkStorage(SqlWorkStorage):
    """`WorkStorageInterface` on PostgreSQL, under the table's row-level security policy.

    Times come from `statement_timestamp()`: the database's clock at the start of the
    statement that writes them, never the transaction's start nor the worker's clock,
    so every lease and availability is measured on one clock (the template's
    docs/guarantees.md, "7. The database clock decides").

    `create_items` (every enqueue), `claim_next` and `complete_items`, the statements run
    most, go through up to `held` connections the storage keeps checked out of the queue
    role's pool while calls keep coming (`HeldConnections`, given back after `held_idle_s`
    seconds unused), where the funnel exposes its engines; `held=0`, a funnel without
    `engine`, or every held connection busy: a funnel session, as every other method opens.
    On a held connection straight to the server each statement is its own transaction
    (autocommit) under the tenant the connection's session is set to; through a proxy, or
    with `session_scope=False`, each call is one transaction with the tenant set for it
    alone (`HeldConnections`, docs/decisions/0022).
    """

    backend: ClassVar[str] = "postgresql"

    def __init__(
        self,
        funnel: StorageFunnel,
        *,
        held: int = HELD_CONNECTIONS,
        held_idle_s: float = HELD_IDLE_S,
        session_scope: bool | None = None,
    ) -> None:
        super().__init__(funnel)
        engine = getattr(funnel, "engine", None)
        self._connections = (
            HeldConnections(
                engine(DatabaseRole.QUEUE), held, idle_s=held_idle_s, session_scope=session_scope
            )
            if engine is not None and held > 0
            else None
        )
        self._claim_sqls: dict[int, str] = {}

    async def create_items(self, org_id: UUID, items: Sequence[WorkItem]) -> list[Created]:
        """See `SqlWorkStorage.create_items`: the same insert and the same read of the rows
        it skipped (each its own transaction, under tenant `org_id`; at read committed the
        read sees what it would have seen in the insert's transaction), on a held
        connection when one is free.

        When the held connection fails anywhere (the server refused a statement, the
        connection dropped), the call runs once more in a funnel session, so the caller
        sees the funnel's own outcome and error. The insert skips an id already stored, so
        rows the held insert did write before its connection failed are not written twice;
        an item whose id the session then finds stored is reported as created (`created`
        True) when the held insert wrote it or may have (it was sent and no answer came:
        its rows are this call's unless the caller sent an id stored before the call)."""
        if self._connections is None or not items:
            return await super().create_items(org_id, items)
        written: set[UUID] = set()  # by the held insert, or maybe (sent, never answered)
        with contextlib.suppress(*_DRIVER_ERRORS, Unsent):
            async with self._connections.statements(org_id) as conn:
                if conn is not None:
                    return await _create_items_on(conn, org_id, items, written)
        results = await super().create_items(org_id, items)
        # An id the held insert wrote and the session found stored: that row is this call's.
        return [
            Created(r.id, True, r.row) if not r.created and r.id in written else r for r in results
        ]

    async def create_new(self, org_id: UUID, items: NewItems) -> set[UUID]:
        """See `WorkStorageInterface.create_new`: one statement binding the ids and the
        payloads as arrays and what the batch shares once (`_new_sql`), on a held
        connection when one is free, else in a funnel session.

        When the held connection fails, the call runs once more in a funnel session, as
        `create_items` does: the insert skips an id already stored, and an id the held
        insert wrote, or may have written (sent, never answered), counts as inserted."""
        if not items.ids:
            return set()
        written: set[UUID] = set()  # by the held insert, or maybe (sent, never answered)
        if self._connections is not None:
            with contextlib.suppress(*_DRIVER_ERRORS, Unsent):
                async with self._connections.statements(org_id) as conn:
                    if conn is not None:
                        written.update(items.ids)
                        try:
                            rows = await conn.fetch(_NEW_SQL, *_new_values(org_id, items))
                        except Unsent:
                            written.clear()  # never sent: nothing of it was written
                            raise
                        return {row[0] for row in rows}
        params = dict(zip(_NEW_PARAMS, _new_values(org_id, items), strict=True))
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            inserted = set((await conn.execute(self._new_statement, params)).scalars())
        return inserted | (written & set(items.ids))

    @cached_property
    def _new_statement(self) -> TextClause:
        """`_NEW_SQL` with SQLAlchemy's named parameters (the funnel session's path)."""
        return text(_new_sql([f":{name}" for name in _NEW_PARAMS]))

    async def claim_next(
        self,
        lane: str,
        kinds: Sequence[WorkKind],
        worker_id: str,
        lease: float,
        *,
        limit: int = 1,
    ) -> WorkRows:
        """See `SqlWorkStorage.claim_next`: the same statement, under the system scope, on a
        held connection when one is free; the dead letter of each unreadable row it claimed
        follows as a statement of its own, fenced on the claim's token (a process that
        stops in between leaves the row claimed until its lease ends; the next claim of it
        dead-letters it then).

        On a held connection the claim's statement is given `lease` seconds (a claim that
        takes longer hands out leases already spent) as the session's `statement_timeout`:
        past them the server cancels it, nothing is claimed, and it raises
        `asyncpg.QueryCanceledError` (the connection is kept), so a lock the claim waits on
        fails the claim instead of stalling every later one. A connection that stops
        answering is given `CLAIM_TIMEOUT_GRACE_S` more: then `TimeoutError`, and the
        connection is closed."""
        if self._connections is None or not kinds or limit < 1:
            return await super().claim_next(lane, kinds, worker_id, lease, limit=limit)
        sql = self._claim_sqls.get(len(kinds))
        if sql is None:
            sql = self._claim_sqls[len(kinds)] = _claim_sql(len(kinds))
        try:
            async with self._connections.statements(EMPTY_UUID, timeout_s=lease) as conn:
                if conn is None:
                    return await super().claim_next(lane, kinds, worker_id, lease, limit=limit)
                kind_values = [kind.value for kind in kinds]
                timeout_s = lease + CLAIM_TIMEOUT_GRACE_S
                rows = await conn.fetch(
                    sql, lane, limit, worker_id, lease, *kind_values, timeout_s=timeout_s
                )
                read = rows_read([dict(row) for row in rows])
                dead = [await _dead_letter_unreadable(conn, row) for row in read.unreadable]
        except Unsent:
            return await super().claim_next(lane, kinds, worker_id, lease, limit=limit)
        items = sorted(read, key=lambda i: (i.available_at, i.id))
        return WorkRows(items, [row for row in dead if row is not None])

    async def complete_items(self, org_id: UUID, claims: Sequence[tuple[UUID, UUID]]) -> set[UUID]:
        """See `SqlWorkStorage.complete_items`: the same statement, each row fenced on its
        own token (joined to the `(id, claim_token)` pairs), under tenant `org_id`, on a held
        connection when one is free."""
        if self._connections is None or not claims:
            return await super().complete_items(org_id, claims)
        ids = [item_id for item_id, _ in claims]
        tokens = [token for _, token in claims]
        try:
            async with self._connections.statements(org_id) as conn:
                if conn is None:
                    return await super().complete_items(org_id, claims)
                return {row[0] for row in await conn.fetch(_COMPLETE_SQL, ids, tokens, org_id)}
        except Unsent:
            return await super().complete_items(org_id, claims)

    def _now(self) -> ColumnElement[datetime]:
        return type_coerce(func.statement_timestamp(), UtcDateTime)

    async def _announce(self, conn: AsyncConnection, due: Iterable[tuple[str, str]]) -> None:
        """See `SqlWorkStorage._announce`: one `pg_notify` on `WAKE_UP_CHANNEL` per distinct
        `(lane, kind)`, with the payload the insert's trigger sends (`<lane> <kind>`),
        delivered by PostgreSQL when the transaction commits (never if it rolls back)."""
        for lane, kind in dict.fromkeys(due):
            await conn.execute(_ANNOUNCE, {"channel": WAKE_UP_CHANNEL, "note": f"{lane} {kind}"})

    def _after(self, seconds: float | ColumnElement[float]) -> ColumnElement[datetime]:
        if isinstance(seconds, ColumnElement):
            shift: ColumnElement[timedelta] = func.make_interval(
                0, 0, 0, 0, 0, 0, seconds, type_=Interval
            )
        else:
            shift = literal(timedelta(seconds=seconds))
        return type_coerce(func.statement_timestamp() + shift, UtcDateTime)

    def _seconds_since(self, moment: ColumnElement[datetime]) -> ColumnElement[float]:
        return func.date_part("epoch", func.statement_timestamp() - moment, type_=Float)

    async def oldest_snapshot_xid_age(self, org_id: UUID) -> tuple[str, int] | None:
        """See `WorkStorageInterface.oldest_snapshot_xid_age`: the database's name and
        `age(backend_xmin)` of the oldest snapshot another backend of it holds, in
        transaction ids (0 when none does). A `REPEATABLE READ` transaction or a session
        idle in a transaction keeps its snapshot, and vacuum cannot remove a `work_items`
        row version that died after it was taken."""
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            database, age = (await conn.execute(_OLDEST_SNAPSHOT)).one()
        return str(database), int(age)

    def wake_ups(self) -> WakeUps | None:
        """LISTEN on `WAKE_UP_CHANNEL` over a connection of its own from the queue role's
        pool (held while subscribed), fed by the table's insert trigger; None when the
        host's funnel does not expose its engines (docs/host-contract.md, Storage funnel).
        """
        engine = getattr(self._funnel, "engine", None)
        if engine is None:
            return None
        return _listen(engine(DatabaseRole.QUEUE))

    def _new_token(self) -> ColumnElement[UUID]:
        return func.gen_random_uuid()

    def _insert(self) -> Insert:
        return insert(t).on_conflict_do_nothing()

    async def _insert_rows(
        self, conn: AsyncConnection, org_id: UUID, items: Sequence[WorkItem]
    ) -> dict[UUID, datetime]:
        """The insert as one statement over column arrays (`INSERT ... SELECT FROM unnest`):
        one small prepared statement whatever the batch holds, instead of a VALUES list
        of 23 parameters a row (pgqueuer enqueues batches the same way)."""
        form = _insert_form(items)
        org, *arrays = form.values(org_id, items)
        params = {"org_id": org} | {f"a_{n}": a for n, a in zip(form.bound, arrays, strict=True)}
        result = await conn.execute(self._unnest_inserts[form], params)
        return {row.id: row.available_at for row in result}

    @cached_property
    def _unnest_inserts(self) -> dict[_InsertForm, TextualSelect]:
        """`_INSERT_SQL` with SQLAlchemy's named parameters (the funnel session's path)."""
        return {
            form: text(form.sql([":org_id", *(f":a_{name}" for name in form.bound)])).columns(
                t.c.id, t.c.available_at
            )
            for form in (_FULL_INSERT, _FRESH_INSERT)
        }

    def _claim_statement(
        self, claim: Update, candidates: ColumnElement[bool], limit: BindParameter[int]
    ) -> Update:
        """One statement: a CTE locks up to `limit` due rows, skipping locked ones, and the
        UPDATE claims exactly those (River's `JobGetAvailable`, Oban's `fetch_jobs`).

        `SKIP LOCKED` lets concurrent claimers pass each other's rows instead of waiting;
        the CTE fences the LIMIT, so the UPDATE never touches more rows than it picked.
        For one kind the order is the claim index's (`ix_work_items_claimable`), so the
        scan stops after `limit` rows.
        """
        picked = (
            select(t.c.id)
            .where(candidates)
            .order_by(t.c.available_at, t.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
            .cte("picked")
        )
        return claim.where(t.c.id == picked.c.id).returning(*t.c)


@asynccontextmanager
async def _listen(engine: AsyncEngine) -> AsyncIterator[AsyncIterator[tuple[str, str]]]:
    """Subscribe to `WAKE_UP_CHANNEL` on one pooled connection; see `wake_ups`."""
    notes: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue()

    def on_note(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        lane, _, kind = str(payload).partition(" ")
        notes.put_nowait((lane, kind))

    def on_lost(_conn: object) -> None:
        notes.put_nowait(None)

    async def received(raw: asyncpg.Connection) -> AsyncIterator[tuple[str, str]]:
        while True:
            try:
                async with asyncio.timeout(_PROBE_AFTER):
                    note = await notes.get()
            except TimeoutError:
                try:
                    async with asyncio.timeout(_PROBE_WITHIN):
                        await raw.execute("SELECT 1")
                except TimeoutError:
                    raw.terminate()  # closed at once: nothing more is sent on it
                    raise ConnectionError(
                        f"the wake-up connection did not answer within {_PROBE_WITHIN} s"
                    ) from None
                continue
            if note is None:
                raise ConnectionError("the wake-up connection was closed")
            yield note

    async with engine.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        if not isinstance(raw, asyncpg.Connection):
            raise TypeError(f"wake-ups need an asyncpg connection, got {type(raw).__name__}")
        raw.add_termination_listener(on_lost)
        await raw.add_listener(WAKE_UP_CHANNEL, on_note)
        try:
            yield received(raw)
        finally:
            if not raw.is_closed():
                raw.remove_termination_listener(on_lost)
                with contextlib.suppress(Exception):
                    await raw.remove_listener(WAKE_UP_CHANNEL, on_note)


async def _create_items_on(
    conn: HeldConnection, org_id: UUID, items: Sequence[WorkItem], written: set[UUID]
) -> list[Created]:
    """`SqlWorkStorage.create_items` on a held connection. `written` holds every item's id
    while the insert is on its way (it may have been written whatever becomes of the
    answer), then the ids the insert did write."""
    form, one = _insert_form(items), len(items) == 1
    values = form.values(org_id, items, one=one)
    written.update(item.id for item in items)
    try:
        rows = await conn.fetch(_INSERT_SQL[form, one], *values)
    except Unsent:
        written.clear()  # never sent: nothing of it was written
        raise
    available = {row[0]: row[1] for row in rows}
    written.intersection_update(available)
    missing = [item for item in items if item.id not in available]
    found: list[WorkItem] = []
    if missing:
        ids = [item.id for item in missing]
        keys = [item.idempotency_key for item in missing if item.idempotency_key is not None]
        holders = await conn.fetch(_HOLDERS_SQL, org_id, ids, keys)
        found = [row_to_item(dict(row)) for row in holders]
    return created_items(org_id, items, available, found)


async def _dead_letter_unreadable(conn: HeldConnection, row: UnreadableRow) -> UnreadableRow | None:
    """`SqlWorkStorage._dead_letter_unreadable` on a held connection, after the claim: the
    row as written, None when the fence no longer matched."""
    written = await conn.fetch(
        _UNREADABLE_SQL,
        row.id,
        row.org_id,
        row.values.get("claim_token"),
        f"{UNREADABLE}: {row.problem}"[:2000],
    )
    if not written:
        return None
    return UnreadableRow(row.id, row.org_id, row.column, row.reason, dict(written[0]))
