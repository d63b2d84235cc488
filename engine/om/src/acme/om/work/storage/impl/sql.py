"""What the PostgreSQL and SQLite storages share: every statement but the hot path's.

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
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from functools import cached_property
from typing import Any
from uuid import UUID

from sqlalchemy import (
    ColumnElement,
    Float,
    Insert,
    Text,
    Update,
    bindparam,
    case,
    delete,
    func,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from acme.om.errors import Conflict, NotFound
from acme.om.storage.funnel import StorageFunnel
from acme.om.storage.roles import DatabaseRole
from acme.om.types import EMPTY_UUID
from acme.om.work.storage import (
    LANE_MOVED,
    LEASE_EXPIRED,
    LEASE_EXPIRED_FINAL,
    UNREADABLE,
    Created,
    OwedAudit,
    WorkStorageInterface,
)
from acme.om.work.storage.tables.work_items import (
    UtcDateTime,
    payload_is_object,
    work_items,
)
from acme.om.work.types.work_item import (
    LaneStats,
    UnreadableItem,
    UnreadableRow,
    WorkItem,
    WorkKind,
    WorkRows,
    WorkStatus,
    read_row,
)

t = work_items

# The columns of an owed audit entry, read as stored (the row may not validate).
_OWED = (
    t.c.id,
    t.c.org_id,
    t.c.kind,
    t.c.lane,
    t.c.attempts,
    t.c.last_error,
    t.c.audit_owed_reason,
    t.c.audit_owed_token,
)


def row_to_item(row: Mapping[Any, Any]) -> WorkItem:
    """A `work_items` row as a `WorkItem` (validated); `UnreadableItem` when it does not
    validate."""
    found = read_row(row)
    if isinstance(found, UnreadableRow):
        raise UnreadableItem(found)
    return found


def rows_read(rows: Sequence[Mapping[Any, Any]]) -> WorkRows:
    """Rows as `WorkRows`: the items, and beside them the rows that do not validate."""
    read = WorkRows()
    for row in rows:
        found = read_row(row)
        if isinstance(found, UnreadableRow):
            read.unreadable.append(found)
        else:
            read.append(found)
    return read


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


class SqlWorkStorage(WorkStorageInterface):
    """`WorkStorageInterface` over the host's `StorageFunnel`, in the `queue` role."""

    def __init__(self, funnel: StorageFunnel) -> None:
        self._funnel = funnel
        self._write_stmts: dict[tuple[bool, bool, bool, bool], Update] = {}

    @asynccontextmanager
    async def _session(self, role: DatabaseRole, org_id: UUID) -> AsyncIterator[AsyncConnection]:
        """The funnel's `session(role, org_id)`, opened once more when opening it met a
        pooled connection the server had already dropped.

        A pool without a pre-ping (the worker's, docs/host-contract.md "Storage funnel")
        hands out such a connection after a database restart, a failover or a killed
        backend; the funnel's first statement (`set_config`) then fails before any of the
        queue's statements ran, SQLAlchemy invalidates the connection (and every pooled one
        older than it), and a second attempt gets a fresh one. Only that failure is
        retried, so no statement of the queue ever runs twice. Raises what the funnel
        raises otherwise, and the second attempt's error.
        """
        stack = AsyncExitStack()
        try:
            conn = await stack.enter_async_context(self._funnel.session(role, org_id))
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            conn = await stack.enter_async_context(self._funnel.session(role, org_id))
        async with stack:
            yield conn

    @abstractmethod
    def _now(self) -> ColumnElement[datetime]:
        """The database's now for this statement (never the transaction's start)."""

    @abstractmethod
    def _after(self, seconds: float | ColumnElement[float]) -> ColumnElement[datetime]:
        """The database's now plus `seconds`, a number or a bound parameter (negative goes
        back)."""

    @abstractmethod
    def _seconds_since(self, moment: ColumnElement[datetime]) -> ColumnElement[float]:
        """Seconds from `moment` to the database's now (negative when it lies ahead)."""

    @abstractmethod
    def _insert(self) -> Insert:
        """An insert into `work_items` that does nothing on any unique conflict."""

    @abstractmethod
    async def _claim_rows(
        self,
        conn: AsyncConnection,
        lane: str,
        kinds: Sequence[WorkKind],
        worker_id: str,
        lease_s: float,
        limit: int,
    ) -> Sequence[Mapping[Any, Any]]:
        """The claim as one statement in `conn`'s transaction: up to `limit` due rows of
        `lane` and `kinds`, oldest `available_at` first (then `id`), each claimed by
        `worker_id` for `lease_s` seconds under a fresh token; the rows as written."""

    @abstractmethod
    async def _complete_rows(
        self, conn: AsyncConnection, org_id: UUID, claims: Sequence[tuple[UUID, UUID]]
    ) -> set[UUID]:
        """`complete_items`' one UPDATE in `conn`'s transaction; the ids it completed."""

    @abstractmethod
    async def _fail_unreadable(
        self, conn: AsyncConnection, row: UnreadableRow
    ) -> Mapping[Any, Any] | None:
        """Fail the claimed row `row` for good, fenced on the token the claim gave it, owing
        its audit entry (`unreadable`); the row as written, None when the fence no longer
        matched."""

    async def _announce(self, conn: AsyncConnection, due: Iterable[tuple[str, str]]) -> None:
        """Wake the workers that listen on this storage's own wake-ups (`wake_ups`) for
        items that an UPDATE in `conn`'s transaction made claimable now, as `(lane, kind)`
        pairs: a hand-back (a release, a requeue of stale leases, a replay) inserts
        nothing, so the insert's own notification never fires for it. Nothing here (this
        dialect has no wake-ups of its own)."""

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
            stored = select(t.c.id).where(t.c.id == item.id, t.c.org_id == org_id)
            if (await conn.execute(stored)).first() is None:
                raise NotFound(f"item_id: no work item {item.id}")
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

    async def complete_items(self, org_id: UUID, claims: Sequence[tuple[UUID, UUID]]) -> set[UUID]:
        """See `WorkStorageInterface.complete_items`: one UPDATE, each row fenced on its own
        token by the `(id, claim_token)` row-value match in its WHERE clause."""
        if not claims:
            return set()
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            return await self._complete_rows(conn, org_id, claims)

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
        async with self._session(DatabaseRole.QUEUE, EMPTY_UUID) as conn:
            read = rows_read(await self._claim_rows(conn, lane, kinds, worker_id, lease, limit))
            dead = [await self._dead_letter_unreadable(conn, row) for row in read.unreadable]
        items = sorted(read, key=lambda i: (i.available_at, i.id))
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

    async def requeue_stale(self, org_id: UUID, before: datetime | None, limit: int) -> WorkRows:
        """See `WorkStorageInterface.requeue_stale`: one statement, re-checked in its UPDATE."""
        now = self._now()
        cutoff: ColumnElement[datetime] = now if before is None else literal(before, UtcDateTime)
        stale = (
            select(t.c.id, t.c.claim_token)
            .where(
                t.c.org_id == org_id,
                t.c.status == WorkStatus.CLAIMED.value,
                t.c.lease_expires_at < cutoff,
            )
            .order_by(t.c.lease_expires_at, t.c.id)
            .limit(limit)
            .cte("stale")
        )
        exhausted = t.c.attempts >= t.c.max_attempts
        stmt = (
            update(t)
            .where(
                t.c.id == stale.c.id,
                t.c.org_id == org_id,
                # Re-checked on the row as it stands when the UPDATE reaches it: a
                # completion or a new claim that landed after the read is left alone.
                t.c.claim_token == stale.c.claim_token,
                t.c.status == WorkStatus.CLAIMED.value,
                t.c.lease_expires_at < cutoff,
            )
            .values(
                status=case((exhausted, WorkStatus.FAILED.value), else_=WorkStatus.AVAILABLE.value),
                available_at=case((exhausted, t.c.available_at), else_=now),
                last_error=case((exhausted, LEASE_EXPIRED_FINAL), else_=t.c.last_error),
                audit_owed_token=case((exhausted, stale.c.claim_token), else_=t.c.audit_owed_token),
                audit_owed_reason=case((exhausted, "lease"), else_=t.c.audit_owed_reason),
                note=LEASE_EXPIRED,
                claimed_by=None,
                claim_token=None,
                claimed_at=None,
                lease_expires_at=None,
                updated_at=now,
                updated_by=EMPTY_UUID,
            )
            .returning(*t.c)
        )
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            rows = (await conn.execute(stmt)).all()
            back = WorkStatus.AVAILABLE.value
            await self._announce(conn, [(r.lane, r.kind) for r in rows if r.status == back])
        return rows_read([r._mapping for r in rows])

    async def list_items(
        self,
        org_id: UUID,
        *,
        status: WorkStatus | None = None,
        kind: WorkKind | None = None,
        limit: int = 50,
    ) -> WorkRows:
        """See `WorkStorageInterface.list_items`."""
        query = select(t).where(t.c.org_id == org_id, t.c.deleted_at.is_(None))
        if status is not None:
            query = query.where(t.c.status == status.value)
        if kind is not None:
            query = query.where(t.c.kind == kind.value)
        query = query.order_by(t.c.created_at.desc(), t.c.id).limit(limit)
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            rows = (await conn.execute(query)).all()
        return rows_read([r._mapping for r in rows])

    async def _operator_write(
        self,
        org_id: UUID,
        item_id: UUID,
        values: Mapping[str, Any],
        *,
        also: ColumnElement[bool] | None = None,
        announce: bool = False,
    ) -> WorkItem | None:
        """One UPDATE of a live `FAILED` row (and `also`, when given); the row as written,
        and, with `announce`, the listening workers woken for it (`_announce`).

        A row that does not validate is put back as it stood: `UnreadableItem` is raised
        inside the session, which rolls the write back.
        """
        stmt = (
            update(t)
            .where(
                t.c.id == item_id,
                t.c.org_id == org_id,
                t.c.status == WorkStatus.FAILED.value,
                t.c.deleted_at.is_(None),
                *([] if also is None else [also]),
            )
            .values({**values, "updated_at": self._now(), "updated_by": EMPTY_UUID})
            .returning(*t.c)
        )
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            row = (await conn.execute(stmt)).first()
            if row is None:
                return None
            written = row_to_item(row._mapping)
            if announce:
                await self._announce(conn, [(written.lane, written.kind.value)])
            return written

    async def revive_item(self, org_id: UUID, item_id: UUID) -> WorkItem | None:
        """See `WorkStorageInterface.revive_item`."""
        return await self._operator_write(
            org_id,
            item_id,
            {
                "status": WorkStatus.AVAILABLE.value,
                "attempts": 0,
                "available_at": self._now(),
                "completed_at": None,
                "note": "replayed",
            },
            # The table keeps a payload that is not an object only on a row that cannot
            # run: such a row is not revived (None), never refused by the check mid-write.
            also=payload_is_object(t.c.payload),
            announce=True,
        )

    async def discard_item(self, org_id: UUID, item_id: UUID) -> WorkItem | None:
        """See `WorkStorageInterface.discard_item`."""
        return await self._operator_write(
            org_id, item_id, {"deleted_at": self._now(), "note": "discarded"}
        )

    async def move_lane(
        self, org_id: UUID, *, from_lane: str, to_lane: str, kind: str | None = None
    ) -> list[tuple[UUID, str]]:
        """See `WorkStorageInterface.move_lane`."""
        stmt = (
            update(t)
            .where(
                t.c.org_id == org_id,
                t.c.lane == from_lane,
                t.c.status == WorkStatus.AVAILABLE.value,
                t.c.deleted_at.is_(None),
                *([] if kind is None else [t.c.kind == kind]),
            )
            .values(
                lane=to_lane,
                note=f"{LANE_MOVED} {from_lane}",
                updated_at=self._now(),
                updated_by=EMPTY_UUID,
            )
            .returning(t.c.id, t.c.kind)
        )
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            rows = (await conn.execute(stmt)).all()
            await self._announce(conn, [(to_lane, r.kind) for r in rows])
        return [(r.id, r.kind) for r in rows]

    async def discard_unknown_kind(self, org_id: UUID, item_id: UUID) -> UnreadableRow | None:
        """See `WorkStorageInterface.discard_unknown_kind`."""
        stmt = (
            update(t)
            .where(
                t.c.id == item_id,
                t.c.org_id == org_id,
                t.c.kind.not_in([kind.value for kind in WorkKind]),
                t.c.status != WorkStatus.CLAIMED.value,
                t.c.deleted_at.is_(None),
            )
            .values(
                deleted_at=self._now(),
                note="discarded",
                updated_at=self._now(),
                updated_by=EMPTY_UUID,
            )
            .returning(*t.c)
        )
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            row = (await conn.execute(stmt)).first()
        if row is None:
            return None
        found = read_row(row._mapping)
        return found if isinstance(found, UnreadableRow) else None

    async def purge_deleted(self, org_id: UUID, older_than: float) -> int:
        """See `WorkStorageInterface.purge_deleted`."""
        stmt = (
            delete(t)
            .where(
                t.c.org_id == org_id,
                t.c.deleted_at.is_not(None),
                t.c.deleted_at < self._after(-older_than),
            )
            .returning(t.c.id)
        )
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            return len((await conn.execute(stmt)).all())

    async def purge_completed(self, org_id: UUID, older_than: float, limit: int) -> int:
        """See `WorkStorageInterface.purge_completed`: one DELETE over a limited subselect.

        Neither PostgreSQL nor SQLite (as built by default) takes a LIMIT on DELETE, so the
        subselect picks the ids and the DELETE re-checks the status and the age on the row
        as it stands when it reaches it.
        """
        cutoff = self._after(-older_than)
        done = (
            (t.c.org_id == org_id)
            & (t.c.status == WorkStatus.COMPLETED.value)
            & (t.c.completed_at < cutoff)
        )
        picked = (
            select(t.c.id)
            .where(done)
            .order_by(t.c.completed_at, t.c.id)
            .limit(limit)
            .scalar_subquery()
        )
        stmt = delete(t).where(t.c.id.in_(picked), done).returning(t.c.id)
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            return len((await conn.execute(stmt)).all())

    async def queue_stats(self, org_id: UUID) -> list[LaneStats]:
        """See `WorkStorageInterface.queue_stats`: the rows in play only, each part matching
        one partial index's predicate (an `IN` over the statuses would not: PostgreSQL then
        reads the whole table, history included)."""
        in_play = or_(
            t.c.status == WorkStatus.AVAILABLE.value,
            t.c.status == WorkStatus.CLAIMED.value,
            t.c.audit_owed_token.is_not(None),
        )
        query = select(
            t.c.lane,
            t.c.kind,
            t.c.status,
            func.count().label("count"),
            self._seconds_since(func.min(t.c.available_at)).label("age"),
            func.count(t.c.audit_owed_token).label("owed"),
        ).where(in_play, t.c.deleted_at.is_(None))
        if org_id != EMPTY_UUID:
            query = query.where(t.c.org_id == org_id)
        query = query.group_by(t.c.lane, t.c.kind, t.c.status).order_by(
            t.c.lane, t.c.kind, t.c.status
        )
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            rows = (await conn.execute(query)).all()
        return [
            LaneStats(
                lane=r.lane,
                kind=r.kind,
                status=WorkStatus(r.status),
                count=r.count,
                oldest_available_age=(
                    max(float(r.age), 0.0) if r.status == WorkStatus.AVAILABLE else None
                ),
                audit_owed=r.owed,
            )
            for r in rows
        ]

    async def oldest_snapshot_xid_age(self, org_id: UUID) -> tuple[str, int] | None:
        """See `WorkStorageInterface.oldest_snapshot_xid_age`: None, as SQLite keeps no
        old row versions; `PostgresWorkStorage` reads it."""
        return None

    async def owed_audits(
        self, org_id: UUID, *, limit: int, item_ids: Sequence[UUID] | None = None
    ) -> list[OwedAudit]:
        """See `WorkStorageInterface.owed_audits`: the partial index `ix_work_items_audit_owed`
        holds exactly these rows."""
        query = select(*_OWED).where(t.c.org_id == org_id, t.c.audit_owed_token.is_not(None))
        if item_ids is not None:
            query = query.where(t.c.id.in_(list(item_ids)))
        query = query.order_by(t.c.updated_at, t.c.id).limit(limit)
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            rows = (await conn.execute(query)).all()
        return [
            OwedAudit(
                id=r.id,
                org_id=r.org_id,
                kind=str(r.kind),
                lane=str(r.lane),
                attempts=int(r.attempts),
                last_error=r.last_error,
                reason=str(r.audit_owed_reason),
                token=r.audit_owed_token,
            )
            for r in rows
        ]

    async def settle_audit(self, org_id: UUID, item_id: UUID, token: UUID) -> bool:
        """See `WorkStorageInterface.settle_audit`."""
        stmt = (
            update(t)
            .where(t.c.id == item_id, t.c.org_id == org_id, t.c.audit_owed_token == token)
            .values(audit_owed_token=None, audit_owed_reason=None)
            .returning(t.c.id)
        )
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            return (await conn.execute(stmt)).first() is not None
