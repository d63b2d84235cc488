"""What the PostgreSQL and SQLite storages share on the hot path (the enqueue, the claim,
a holder's writes); the rest is `SqlOperatorStatements` (sql_operator.py).

Each shared statement is written once in SQLAlchemy Core; the dialect supplies its clock
(`_now`, `_after`), its insert and the hot path's statements (the claim, the completion,
an unreadable row's dead letter: `_claim_rows`, `_complete_rows`, `_fail_unreadable`).
Every write after the insert is conditional in the statement itself (fencing on the
claim token, or on the status an operator write expects), and every method but
`claim_next` filters on the tenant besides opening its session under it, so SQLite,
which has no row-level security, holds the same line PostgreSQL's policy holds.

Rows are read with `read_row`: a row the model refuses is reported (`WorkRows.unreadable`,
`UnreadableItem`) and never stops the rows beside it.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cached_property
from typing import Any
from uuid import UUID

from sqlalchemy import (
    Float,
    Insert,
    Text,
    Update,
    bindparam,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from acme.om.errors import Conflict, NotFound
from acme.om.storage.funnel import StorageFunnel
from acme.om.storage.roles import DatabaseRole
from acme.om.types import EMPTY_UUID
from acme.om.work.storage import (
    UNREADABLE,
    Created,
    OneSlotTurns,
)
from acme.om.work.storage.impl.sql_operator import (
    SqlOperatorStatements,
    row_to_item,
    rows_read,
)
from acme.om.work.storage.tables.work_items import (
    work_items,
)
from acme.om.work.storage.tables.work_schedules import work_schedules
from acme.om.work.types.schedules import ScheduleState
from acme.om.work.types.work_item import (
    ItemCancelled,
    UnreadableRow,
    WorkItem,
    WorkKind,
    WorkRows,
    WorkStatus,
    claim_order,
)

t = work_items
s = work_schedules


def unreadable_error(row: UnreadableRow) -> str:
    """The `last_error` of an unreadable row's dead letter (at most 2,000 characters)."""
    return f"{UNREADABLE}: {row.problem}"[:2000]


def created_items(
    org_id: UUID,
    items: Sequence[WorkItem],
    available: Mapping[UUID, datetime],
    found: Sequence[WorkItem],
) -> list[Created]:
    """`create_items`' answer, one `Created` per item in order, from what its insert did:
    `available` (each inserted id's `available_at`) and `found` (the stored rows that held
    the ids or idempotency keys of the items it skipped, read in the same transaction)."""
    # The row as stored is the item as sent, in this tenant, with the database's
    # `available_at`: no need to read back and validate what was just written.
    inserted = {
        item.id: item.model_copy(update={"org_id": org_id, "available_at": available[item.id]})
        for item in items
        if item.id in available
    }
    by_id = {row.id: row for row in found}
    by_key = {row.idempotency_key: row for row in found if row.idempotency_key is not None}
    results: list[Created] = []
    for item in items:
        if item.id in inserted:
            results.append(Created(item.id, True, inserted[item.id]))
        elif item.id in by_id or item.idempotency_key not in by_key:
            # Held by this tenant's row, or (row None) by another tenant's.
            results.append(Created(item.id, False, by_id.get(item.id)))
        else:
            holder = by_key[item.idempotency_key]
            results.append(Created(holder.id, False, holder))
    return results


class SqlWorkStorage(SqlOperatorStatements):
    """`WorkStorageInterface` over the host's `StorageFunnel`, in the `queue` role: the
    hot path (the enqueue, the claim, a holder's writes) over `SqlOperatorStatements`."""

    def __init__(self, funnel: StorageFunnel) -> None:
        super().__init__(funnel)
        self._write_stmts: dict[tuple[bool, bool, bool, bool], Update] = {}
        self._one_slot_turns = OneSlotTurns()

    @abstractmethod
    def _insert(self) -> Insert:
        """An insert into `work_items` that does nothing on any unique conflict."""

    @abstractmethod
    def _insert_state(self) -> Insert:
        """An insert into `work_schedules` that does nothing on a row already there."""

    @abstractmethod
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
        """The claim as one statement in `conn`'s transaction: up to `limit` due rows of
        `lane` and `kinds` in the claim's order (`WorkStorageInterface.claim_next`; one
        slot: the first due tenant after tenant id `after`, `OneSlotTurns`), each claimed
        by `worker_id` for `lease_s` seconds under a fresh token; the rows as written."""

    @abstractmethod
    async def _complete_rows(
        self, conn: AsyncConnection, claims: Sequence[tuple[UUID, UUID, UUID]]
    ) -> set[UUID]:
        """`complete_items`' one UPDATE in `conn`'s transaction; the ids it completed."""

    @abstractmethod
    async def _fail_unreadable(
        self, conn: AsyncConnection, row: UnreadableRow
    ) -> Mapping[Any, Any] | None:
        """Fail the claimed row `row` for good, fenced on the token the claim gave it, owing
        its audit entry (`unreadable`); the row as written, None when the fence no longer
        matched."""

    def _row(self, org_id: UUID, item: WorkItem) -> dict[str, Any]:
        """`item`'s column values for the insert; `available_at` is computed from `delay_s`."""
        values = item.model_dump()
        values["org_id"] = org_id
        values["delay_s"] = item.delay
        del values["available_at"]
        return values

    async def create_item(self, org_id: UUID, item: WorkItem) -> Created:
        """See `WorkStorageInterface.create_item`."""
        (created,) = await self.create_items(org_id, [item])
        return created

    async def create_items(self, org_id: UUID, items: Sequence[WorkItem]) -> list[Created]:
        """See `WorkStorageInterface.create_items`: one insert (`_insert_rows`), then one
        read of the rows it did not insert, in one session."""
        if not items:
            return []
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            available = await self._insert_rows(conn, org_id, items)
            missing = [i for i in items if i.id not in available]
            found = await self._holders(conn, org_id, missing) if missing else []
        return created_items(org_id, items, available, found)

    async def _holders(
        self, conn: AsyncConnection, org_id: UUID, missing: Sequence[WorkItem]
    ) -> list[WorkItem]:
        """The stored rows of `org_id` holding the ids or idempotency keys of `missing`."""
        keys = [i.idempotency_key for i in missing if i.idempotency_key is not None]
        query = select(t).where(
            t.c.org_id == org_id,
            or_(t.c.id.in_([i.id for i in missing]), t.c.idempotency_key.in_(keys)),
        )
        return [row_to_item(r._mapping) for r in await conn.execute(query)]

    async def _insert_rows(
        self, conn: AsyncConnection, org_id: UUID, items: Sequence[WorkItem]
    ) -> dict[UUID, datetime]:
        """Insert `items` (a duplicate id or key is skipped); `available_at` per inserted id.

        One executemany of a single cached statement (SQLAlchemy's "insertmanyvalues"
        batches the rows into multi-row VALUES), each row's `available_at` computed by the
        database from its bound delay: a statement whose rows carried SQL expressions would
        be compiled anew for every batch.
        """
        result = await conn.execute(self._insert_stmt, [self._row(org_id, i) for i in items])
        return {row.id: row.available_at for row in result}

    @cached_property
    def _insert_stmt(self) -> Insert:
        """The one insert statement every enqueue runs (built once, cached by SQLAlchemy)."""
        delay = bindparam("delay_s", type_=Float)
        return (
            self._insert()
            .values(available_at=self._after(delay))
            .returning(t.c.id, t.c.available_at)
        )

    async def schedule_states(self, org_id: UUID) -> list[ScheduleState]:
        """See `WorkStorageInterface.schedule_states`."""
        query = (
            select(s.c.schedule, s.c.tick_at, s.c.next_tick_at)
            .where(s.c.org_id == org_id)
            .order_by(s.c.schedule)
        )
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            rows = (await conn.execute(query)).all()
        return [ScheduleState.model_validate(row._mapping) for row in rows]

    async def advance_schedule(
        self,
        org_id: UUID,
        schedule: str,
        *,
        previous: datetime | None,
        tick: datetime,
        item: WorkItem | None,
        next_tick: datetime | None = None,
    ) -> bool:
        """See `WorkStorageInterface.advance_schedule`: the conditional statement, then the
        item's insert (`_insert_rows`), in one session."""
        values = {"tick_at": tick, "next_tick_at": next_tick, "updated_at": self._now()}
        if previous is None:
            advance: Insert | Update = self._insert_state().values(
                org_id=org_id, schedule=schedule, **values
            )
        else:
            advance = (
                update(s)
                .where(s.c.org_id == org_id, s.c.schedule == schedule, s.c.tick_at == previous)
                .values(values)
            )
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            if (await conn.execute(advance.returning(s.c.schedule))).first() is None:
                return False
            if item is not None:
                await self._insert_rows(conn, org_id, [item])
        return True

    async def read_item(self, org_id: UUID, item_id: UUID) -> WorkItem | None:
        """See `WorkStorageInterface.read_item`."""
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            row = (
                await conn.execute(select(t).where(t.c.id == item_id, t.c.org_id == org_id))
            ).first()
        return None if row is None else row_to_item(row._mapping)

    async def read_items(self, org_id: UUID, item_ids: Sequence[UUID]) -> list[WorkItem]:
        """See `WorkStorageInterface.read_items`."""
        if not item_ids:
            return []
        query = select(t).where(t.c.id.in_(list(item_ids)), t.c.org_id == org_id)
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            rows = (await conn.execute(query)).all()
        return [row_to_item(r._mapping) for r in rows]

    async def write_item(
        self,
        org_id: UUID,
        item: WorkItem,
        claim_token: UUID,
        *,
        available_in: float | None = None,
        lease_for: float | None = None,
        dead_letter: str | None = None,
    ) -> WorkItem:
        """See `WorkStorageInterface.write_item`: one UPDATE fenced on the claim token; a
        hand-back that is due at once (`available_in` 0) wakes the listening workers in
        the same transaction (`_announce`)."""
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            written = await self._write_on(
                conn,
                org_id,
                item,
                claim_token,
                available_in=available_in,
                lease_for=lease_for,
                dead_letter=dead_letter,
            )
            due = available_in is not None and available_in <= 0
            if due and written.status is WorkStatus.AVAILABLE:
                await self._announce(conn, [(written.lane, written.kind.value)])
            return written

    async def _write_on(
        self,
        conn: AsyncConnection,
        org_id: UUID,
        item: WorkItem,
        claim_token: UUID,
        *,
        available_in: float | None = None,
        lease_for: float | None = None,
        dead_letter: str | None = None,
    ) -> WorkItem:
        """`write_item` on an open session (the race replays hold its transaction open)."""
        params: dict[str, Any] = {
            "w_item_id": item.id,
            "w_org_id": org_id,
            "w_held_token": claim_token,
            "w_status": item.status.value,
            "w_attempts": item.attempts,
            "w_claimed_by": item.claimed_by,
            "w_claim_token": item.claim_token,
            "w_claimed_at": item.claimed_at,
            "w_lease_expires_at": item.lease_expires_at,
            "w_last_error": item.last_error,
            "w_note": item.note,
            "w_available_at": item.available_at,
            "w_completed_at": item.completed_at,
            "w_updated_by": item.updated_by,
            "w_available_in": available_in,
            "w_lease_for": lease_for,
            "w_dead_letter": dead_letter,
        }
        stmt = self._write_stmt(
            available_in is not None,
            lease_for is not None,
            item.status is WorkStatus.COMPLETED,
            dead_letter is not None,
        )
        row = (await conn.execute(stmt, params)).first()
        if row is None:
            stored = select(t.c.status, t.c.claim_token).where(
                t.c.id == item.id, t.c.org_id == org_id
            )
            found = (await conn.execute(stored)).first()
            if found is None:
                raise NotFound(f"item_id: no work item {item.id}")
            if found.status == WorkStatus.CANCELLED.value and found.claim_token == claim_token:
                raise ItemCancelled(item.id)
            raise Conflict(f"claim_token: work item {item.id} is no longer held under it")
        return row_to_item(row._mapping)

    def _write_stmt(
        self, shift_available: bool, shift_lease: bool, completing: bool, dead_letter: bool
    ) -> Update:
        """The fenced UPDATE of `_write_on`, one shape per kind of write, each built once
        (building a statement costs more than running it); parameters prefixed `w_`. A dead
        letter also records its owed audit entry: the token it is fenced on, and why."""
        key = (shift_available, shift_lease, completing, dead_letter)
        if key not in self._write_stmts:
            now = self._now()
            values: dict[str, Any] = {
                name: bindparam(f"w_{name}", type_=t.c[name].type)
                for name in (
                    "status",
                    "attempts",
                    "claimed_by",
                    "claim_token",
                    "claimed_at",
                    "lease_expires_at",
                    "last_error",
                    "note",
                    "available_at",
                    "completed_at",
                    "updated_by",
                )
            }
            values["updated_at"] = now
            if shift_available:
                values["available_at"] = self._after(bindparam("w_available_in", type_=Float))
            if shift_lease:
                values["lease_expires_at"] = self._after(bindparam("w_lease_for", type_=Float))
            if completing:
                values["completed_at"] = now
            if dead_letter:
                values["audit_owed_token"] = bindparam("w_held_token", type_=t.c.claim_token.type)
                values["audit_owed_reason"] = bindparam("w_dead_letter", type_=Text)
            self._write_stmts[key] = (
                update(t)
                .where(
                    t.c.id == bindparam("w_item_id"),
                    t.c.org_id == bindparam("w_org_id"),
                    t.c.claim_token == bindparam("w_held_token"),
                    t.c.status == WorkStatus.CLAIMED.value,
                    t.c.lease_expires_at > now,
                )
                .values(values)
                .returning(*t.c)
            )
        return self._write_stmts[key]

    async def complete_items(self, claims: Sequence[tuple[UUID, UUID, UUID]]) -> set[UUID]:
        """See `WorkStorageInterface.complete_items`: one UPDATE under the system scope (as
        the claim), each row fenced on its tenant and its own token in its WHERE clause."""
        if not claims:
            return set()
        async with self._session(DatabaseRole.QUEUE, EMPTY_UUID) as conn:
            return await self._complete_rows(conn, claims)

    async def claim_next(
        self,
        lane: str,
        kinds: Sequence[WorkKind],
        worker_id: str,
        lease: float,
        *,
        limit: int = 1,
    ) -> WorkRows:
        """Claim up to `limit` due items across tenants (tenant-less: see the interface).

        Opens its session under the system scope, `EMPTY_UUID` passed explicitly, since
        the claim finds out which tenant's item is due and returns the tenant with it. The
        rows are read inside the claim's transaction, so a row that does not validate is
        made a dead letter before the claim commits and is never seen claimed.
        """
        if not kinds or limit < 1:
            return WorkRows()
        after = self._one_slot_turns.after(lane)
        async with self._session(DatabaseRole.QUEUE, EMPTY_UUID) as conn:
            rows = await self._claim_rows(conn, lane, kinds, worker_id, lease, limit, after)
            self._one_slot_turns.took(lane, limit, rows)
            read = rows_read(rows)
            dead = [await self._dead_letter_unreadable(conn, row) for row in read.unreadable]
        items = sorted(read, key=claim_order)
        return WorkRows(items, [row for row in dead if row is not None])

    async def _dead_letter_unreadable(
        self, conn: AsyncConnection, row: UnreadableRow
    ) -> UnreadableRow | None:
        """`_fail_unreadable` in the claim's transaction (which never sees the fence fail);
        the row as written."""
        written = await self._fail_unreadable(conn, row)
        if written is None:
            return None
        return UnreadableRow(row.id, row.org_id, row.column, row.reason, dict(written))
