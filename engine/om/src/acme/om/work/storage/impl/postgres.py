"""The work queue on PostgreSQL (asyncpg): the hot path's statements (`postgres_statements`,
each one text for both paths) on connections the storage holds while calls keep coming
(`HeldConnections`), else in a funnel session."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, ClassVar
from uuid import UUID

import asyncpg
from sqlalchemy import (
    ColumnElement,
    Float,
    Insert,
    Interval,
    func,
    literal,
    text,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from acme.om.storage.funnel import StorageFunnel
from acme.om.storage.roles import DatabaseRole
from acme.om.types import EMPTY_UUID
from acme.om.work.storage import (
    WAKE_UP_CHANNEL,
    Created,
    NewItems,
    OldestSnapshot,
    WakeUps,
)
from acme.om.work.storage.impl.held_connections import (
    HELD_IDLE_S,
    HeldConnection,
    HeldConnections,
    Unsent,
)
from acme.om.work.storage.impl.postgres_statements import (
    COMPLETE,
    HOLDERS,
    INSERTS,
    NEW,
    UNREADABLE_DEAD_LETTER,
    claim_for,
    complete_values,
    holders_values,
    insert_form,
    new_values,
    unreadable_values,
)
from acme.om.work.storage.impl.sql import SqlWorkStorage, created_items
from acme.om.work.storage.impl.sql_operator import row_to_item, rows_read
from acme.om.work.storage.tables.work_items import UtcDateTime, work_items
from acme.om.work.storage.tables.work_schedules import work_schedules
from acme.om.work.types.work_item import (
    UnreadableRow,
    WorkItem,
    WorkKind,
    WorkRows,
    claim_order,
)

t = work_items

# A wake-up connection silent this long is probed with `SELECT 1`, and counts as lost
# when the probe takes longer than `_PROBE_WITHIN_S`: a half-open connection never
# reports its own loss.
_PROBE_AFTER_S = 2.0
_PROBE_WITHIN_S = 2.0

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

# A hand-back's wake-up, as the insert's trigger sends it (`SqlWorkStorage._announce`).
_ANNOUNCE = text("SELECT pg_notify(:channel, :note)")

# What asyncpg raises when the server refuses a statement or the connection fails (a
# backend terminated between two statements surfaces as `InternalClientError`).
_DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
)


# The oldest snapshot of any other session of this database, in transaction ids. Every role
# sees `backend_xmin` of every backend in `pg_stat_activity` (the query text, the state and
# the times of other roles' sessions need `pg_read_all_stats`); the sweep's own backend is
# left out, its snapshot being the newest there is.
_OLDEST_SNAPSHOT = text(
    "SELECT current_database(), oldest.xid_age, oldest.xmin FROM (SELECT 1) AS one"
    " LEFT JOIN LATERAL (SELECT age(backend_xmin) AS xid_age, backend_xmin::text AS xmin"
    " FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    " AND backend_xmin IS NOT NULL ORDER BY age(backend_xmin) DESC LIMIT 1) AS oldest ON true"
)


class PostgresWorkStorage(SqlWorkStorage):
    """`WorkStorageInterface` on PostgreSQL, under the table's row-level security policy.

    Times come from `statement_timestamp()`, the database's clock (the template's
    docs/guarantees.md, "7. The database clock decides").

    `create_items`, `claim_next` and `complete_items` run on up to `held` connections kept
    out of the queue role's pool while calls come (`HeldConnections`, given back after
    `held_idle_s` seconds unused); `held=0`, a funnel without `engine`, or every held
    connection busy: a funnel session, as every other method opens (docs/decisions/0021,
    0022).
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
        payloads as arrays and what the batch shares once (`NEW`), on a held
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
                            rows = await conn.fetch(NEW.numbered, *new_values(org_id, items))
                        except Unsent:
                            written.clear()  # never sent: nothing of it was written
                            raise
                        return {row[0] for row in rows}
        params = NEW.params(new_values(org_id, items))
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            inserted = set((await conn.execute(NEW.named, params)).scalars())
        return inserted | (written & set(items.ids))

    async def claim_next(
        self,
        lane: str,
        kinds: Sequence[WorkKind],
        worker_id: str,
        lease: float,
        *,
        limit: int = 1,
    ) -> WorkRows:
        """See `SqlWorkStorage.claim_next`: the same statement (`claim_for`), under the
        system scope, on a held connection when one is free; the dead letter of each
        unreadable row it claimed follows as a statement of its own, fenced on the claim's
        token (a process that stops in between leaves the row claimed until its lease ends;
        the next claim of it dead-letters it then).

        On a held connection the claim's statement is given `lease` seconds (a claim that
        takes longer hands out leases already spent) as the session's `statement_timeout`:
        past them the server cancels it, nothing is claimed, and it raises
        `asyncpg.QueryCanceledError` (the connection is kept), so a lock the claim waits on
        fails the claim instead of stalling every later one. A connection that stops
        answering is given `CLAIM_TIMEOUT_GRACE_S` more: then `TimeoutError`, and the
        connection is closed."""
        if self._connections is None or not kinds or limit < 1:
            return await super().claim_next(lane, kinds, worker_id, lease, limit=limit)
        after = self._one_slot_turns.after(lane)
        claim, values = claim_for(lane, kinds, worker_id, lease, limit, after)
        try:
            async with self._connections.statements(EMPTY_UUID, timeout_s=lease) as conn:
                if conn is None:
                    return await super().claim_next(lane, kinds, worker_id, lease, limit=limit)
                timeout_s = lease + CLAIM_TIMEOUT_GRACE_S
                rows = await conn.fetch(claim.numbered, *values, timeout_s=timeout_s)
                self._one_slot_turns.took(lane, limit, rows)
                read = rows_read([dict(row) for row in rows])
                dead = [await _dead_letter_unreadable(conn, row) for row in read.unreadable]
        except Unsent:
            return await super().claim_next(lane, kinds, worker_id, lease, limit=limit)
        items = sorted(read, key=claim_order)
        return WorkRows(items, [row for row in dead if row is not None])

    async def complete_items(self, claims: Sequence[tuple[UUID, UUID, UUID]]) -> set[UUID]:
        """See `SqlWorkStorage.complete_items`: the same statement (`COMPLETE`), under the
        system scope, on a held connection when one is free."""
        if self._connections is None or not claims:
            return await super().complete_items(claims)
        values = complete_values(claims)
        try:
            async with self._connections.statements(EMPTY_UUID) as conn:
                if conn is None:
                    return await super().complete_items(claims)
                return {row[0] for row in await conn.fetch(COMPLETE.numbered, *values)}
        except Unsent:
            return await super().complete_items(claims)

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

    async def oldest_snapshot(self, org_id: UUID) -> OldestSnapshot | None:
        """See `WorkStorageInterface.oldest_snapshot`. A `REPEATABLE READ` transaction, a
        long statement or a session idle in a transaction keeps its snapshot, and vacuum
        cannot remove a `work_items` row version that died after it was taken."""
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            database, age, xmin = (await conn.execute(_OLDEST_SNAPSHOT)).one()
        return OldestSnapshot(str(database), int(age or 0), None if xmin is None else str(xmin))

    def wake_ups(self) -> WakeUps | None:
        """LISTEN on `WAKE_UP_CHANNEL` over a connection of its own from the queue role's
        pool (held while subscribed), fed by the table's insert trigger; None when the
        host's funnel does not expose its engines (docs/host-contract.md, Storage funnel).
        """
        engine = getattr(self._funnel, "engine", None)
        if engine is None:
            return None
        return _listen(engine(DatabaseRole.QUEUE))

    def _insert(self) -> Insert:
        return insert(t).on_conflict_do_nothing()

    def _insert_state(self) -> Insert:
        return insert(work_schedules).on_conflict_do_nothing()

    async def _insert_rows(
        self, conn: AsyncConnection, org_id: UUID, items: Sequence[WorkItem]
    ) -> dict[UUID, datetime]:
        """The insert as one statement over column arrays (`INSERTS`, `INSERT ... SELECT
        FROM unnest`): one small prepared statement whatever the batch holds, instead of a
        VALUES list of 23 parameters a row (pgqueuer enqueues batches the same way)."""
        form = insert_form(items)
        unnest = INSERTS[form, False]
        result = await conn.execute(unnest.named, unnest.params(form.values(org_id, items)))
        return {row.id: row.available_at for row in result}

    async def _holders(
        self, conn: AsyncConnection, org_id: UUID, missing: Sequence[WorkItem]
    ) -> list[WorkItem]:
        """See `SqlWorkStorage._holders`: `HOLDERS`."""
        params = HOLDERS.params(holders_values(org_id, missing))
        return [row_to_item(row._mapping) for row in await conn.execute(HOLDERS.named, params)]

    async def _claim_rows(
        self,
        conn: AsyncConnection,
        lane: str,
        kinds: Sequence[WorkKind],
        worker_id: str,
        lease_s: float,
        limit: int,
        after: UUID,
    ) -> Sequence[Mapping[Any, Any]]:
        """See `SqlWorkStorage._claim_rows`: `claim_for`."""
        claim, values = claim_for(lane, kinds, worker_id, lease_s, limit, after)
        return [row._mapping for row in await conn.execute(claim.named, claim.params(values))]

    async def _complete_rows(
        self, conn: AsyncConnection, claims: Sequence[tuple[UUID, UUID, UUID]]
    ) -> set[UUID]:
        """See `SqlWorkStorage._complete_rows`: `COMPLETE`."""
        params = COMPLETE.params(complete_values(claims))
        return set((await conn.execute(COMPLETE.named, params)).scalars())

    async def _fail_unreadable(
        self, conn: AsyncConnection, row: UnreadableRow
    ) -> Mapping[Any, Any] | None:
        """See `SqlWorkStorage._fail_unreadable`: `UNREADABLE_DEAD_LETTER`."""
        dead_letter = UNREADABLE_DEAD_LETTER
        params = dead_letter.params(unreadable_values(row))
        written = (await conn.execute(dead_letter.named, params)).first()
        return None if written is None else written._mapping


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
                async with asyncio.timeout(_PROBE_AFTER_S):
                    note = await notes.get()
            except TimeoutError:
                try:
                    async with asyncio.timeout(_PROBE_WITHIN_S):
                        await raw.execute("SELECT 1")
                except TimeoutError:
                    raw.terminate()  # closed at once: nothing more is sent on it
                    raise ConnectionError(
                        f"the wake-up connection did not answer within {_PROBE_WITHIN_S} s"
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
    form, one = insert_form(items), len(items) == 1
    values = form.values(org_id, items, one=one)
    written.update(item.id for item in items)
    try:
        rows = await conn.fetch(INSERTS[form, one].numbered, *values)
    except Unsent:
        written.clear()  # never sent: nothing of it was written
        raise
    available = {row[0]: row[1] for row in rows}
    written.intersection_update(available)
    missing = [item for item in items if item.id not in available]
    found: list[WorkItem] = []
    if missing:
        holders = await conn.fetch(HOLDERS.numbered, *holders_values(org_id, missing))
        found = [row_to_item(dict(row)) for row in holders]
    return created_items(org_id, items, available, found)


async def _dead_letter_unreadable(conn: HeldConnection, row: UnreadableRow) -> UnreadableRow | None:
    """`SqlWorkStorage._dead_letter_unreadable` on a held connection, after the claim: the
    row as written, None when the fence no longer matched."""
    written = await conn.fetch(UNREADABLE_DEAD_LETTER.numbered, *unreadable_values(row))
    if not written:
        return None
    return UnreadableRow(row.id, row.org_id, row.column, row.reason, dict(written[0]))
