"""What the PostgreSQL and SQLite storages share besides the hot path: the funnel session,
the dialect's clock, and the sweep's and the operator's statements (requeues, listings,
operator writes, purges, statistics, owed audit entries, the worker roster), each written
once in SQLAlchemy Core and filtered on the tenant besides opening its session under it.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import (
    ColumnElement,
    and_,
    case,
    delete,
    func,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from acme.om.storage.funnel import StorageFunnel
from acme.om.storage.roles import DatabaseRole
from acme.om.types import EMPTY_UUID
from acme.om.work.storage import (
    CANCEL_NOTE,
    LANE_MOVED,
    LEASE_EXPIRED,
    LEASE_EXPIRED_FINAL,
    OldestSnapshot,
    OwedAudit,
    WorkStorageInterface,
)
from acme.om.work.storage.tables.work_items import (
    UtcDateTime,
    payload_is_object,
    work_items,
)
from acme.om.work.storage.tables.work_lane_pauses import work_lane_pauses
from acme.om.work.storage.tables.work_workers import work_workers
from acme.om.work.types.lanes import LanePause, WorkerBeat
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
pauses = work_lane_pauses
roster = work_workers

# The queue stats' plan, for their transaction: each part through its partial index. With
# a big backlog in play the planner prices reading the whole table (history included) below
# a bitmap scan of the rows in play, and compiles that plan (JIT) for seconds more
# (docs/decisions/0058).
_ROWS_IN_PLAY_PLAN = text(
    "SELECT set_config('enable_seqscan', 'off', true), set_config('jit', 'off', true)"
)

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


class SqlOperatorStatements(WorkStorageInterface):
    """The part of `SqlWorkStorage` off the hot path, over the host's `StorageFunnel`."""

    def __init__(self, funnel: StorageFunnel) -> None:
        self._funnel = funnel

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

    async def _announce(self, conn: AsyncConnection, due: Iterable[tuple[str, str]]) -> None:
        """Wake the workers that listen on this storage's own wake-ups (`wake_ups`) for
        items that an UPDATE in `conn`'s transaction made claimable now, as `(lane, kind)`
        pairs: a hand-back (a release, a requeue of stale leases, a replay) inserts
        nothing, so the insert's own notification never fires for it. Nothing here (this
        dialect has no wake-ups of its own)."""

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
        lane: str | None = None,
        after: tuple[datetime, UUID] | None = None,
        limit: int = 50,
    ) -> WorkRows:
        """See `WorkStorageInterface.list_items`."""
        query = select(t).where(t.c.org_id == org_id, t.c.deleted_at.is_(None))
        if status is not None:
            query = query.where(t.c.status == status.value)
        if kind is not None:
            query = query.where(t.c.kind == kind.value)
        if lane is not None:
            query = query.where(t.c.lane == lane)
        if after is not None:
            created_at, item_id = after
            query = query.where(
                or_(
                    t.c.created_at < created_at,
                    and_(t.c.created_at == created_at, t.c.id > item_id),
                )
            )
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

    async def revive_item(
        self, org_id: UUID, item_id: UUID, *, payload: dict[str, Any] | None = None
    ) -> WorkItem | None:
        """See `WorkStorageInterface.revive_item`."""
        values: dict[str, Any] = {
            "status": WorkStatus.AVAILABLE.value,
            "attempts": 0,
            "available_at": self._now(),
            "completed_at": None,
            "note": "replayed",
        }
        if payload is not None:
            values["payload"] = payload
        return await self._operator_write(
            org_id,
            item_id,
            values,
            # The table keeps a payload that is not an object only on a row that cannot
            # run: such a row is not revived (None), never refused by the check mid-write,
            # unless a corrected payload replaces it.
            also=payload_is_object(t.c.payload) if payload is None else None,
            announce=True,
        )

    async def cancel_item(self, org_id: UUID, item_id: UUID) -> WorkItem | None:
        """See `WorkStorageInterface.cancel_item`: one UPDATE conditional on the status, so a
        completion or a failure that commits first leaves nothing to cancel, and one that
        comes after finds the row `CANCELLED` and is refused by its own fence."""
        stmt = (
            update(t)
            .where(
                t.c.id == item_id,
                t.c.org_id == org_id,
                or_(
                    t.c.status == WorkStatus.AVAILABLE.value,
                    t.c.status == WorkStatus.CLAIMED.value,
                ),
                t.c.deleted_at.is_(None),
            )
            .values(
                status=WorkStatus.CANCELLED.value,
                note="cancelled",
                lease_expires_at=None,
                updated_at=self._now(),
                updated_by=EMPTY_UUID,
            )
            .returning(*t.c)
        )
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            row = (await conn.execute(stmt)).first()
            if row is None:
                return None
            written = row_to_item(row._mapping)
            await self._announce(conn, [(written.lane, f"{CANCEL_NOTE}{written.id}")])
            return written

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

    async def purge_cancelled(self, org_id: UUID, older_than: float, limit: int) -> int:
        """See `WorkStorageInterface.purge_cancelled`: `purge_completed`'s shape, over the
        partial index `ix_work_items_cancelled`."""
        cutoff = self._after(-older_than)
        done = (
            (t.c.org_id == org_id)
            & (t.c.status == WorkStatus.CANCELLED.value)
            & (t.c.updated_at < cutoff)
        )
        picked = (
            select(t.c.id)
            .where(done)
            .order_by(t.c.updated_at, t.c.id)
            .limit(limit)
            .scalar_subquery()
        )
        stmt = delete(t).where(t.c.id.in_(picked), done).returning(t.c.id)
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            return len((await conn.execute(stmt)).all())

    async def recent_outcomes(
        self, org_id: UUID, *, window_s: float, buckets: int
    ) -> list[tuple[int, int]]:
        """See `WorkStorageInterface.recent_outcomes`: one row of `FILTER`ed counts per
        series, each read through its partial index over the window alone."""
        size = window_s / buckets

        def slices(at: ColumnElement[datetime]) -> list[ColumnElement[int]]:
            age = self._seconds_since(at)
            return [
                func.count().filter(
                    and_(age >= (buckets - 1 - i) * size, age < (buckets - i) * size)
                )
                for i in range(buckets)
            ]

        completed = select(*slices(t.c.completed_at)).where(
            t.c.org_id == org_id,
            t.c.status == WorkStatus.COMPLETED.value,
            t.c.completed_at >= self._after(-window_s),
        )
        dead = select(*slices(t.c.updated_at)).where(
            t.c.org_id == org_id,
            t.c.status == WorkStatus.FAILED.value,
            t.c.deleted_at.is_(None),
            t.c.updated_at >= self._after(-window_s),
        )
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            done = (await conn.execute(completed)).one()
            failed = (await conn.execute(dead)).one()
        return [(int(done[i]), int(failed[i])) for i in range(buckets)]

    async def queue_stats(self, org_id: UUID) -> list[LaneStats]:
        """See `WorkStorageInterface.queue_stats`: the rows in play only, each part matching
        one partial index's predicate (an `IN` over the statuses would not: PostgreSQL then
        reads the whole table, history included). The system scope's (the sweep's, every
        pass) reads them through those indexes on PostgreSQL however many rows are in play
        (`_ROWS_IN_PLAY_PLAN`)."""
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
            if self._funnel.dialect == "postgresql" and org_id == EMPTY_UUID:
                await conn.execute(_ROWS_IN_PLAY_PLAN)
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

    async def pause_lane(
        self, org_id: UUID, lane: str, *, paused_by: str, reason: str | None
    ) -> tuple[LanePause, bool]:
        """See `WorkStorageInterface.pause_lane`: an insert that does nothing when the lane
        is paused already, then, in that case, a read of the pause that stood."""
        dialect = postgresql if self._funnel.dialect == "postgresql" else sqlite
        stmt = (
            dialect.insert(pauses)
            .values(lane=lane, paused_at=self._now(), paused_by=paused_by, reason=reason)
            .on_conflict_do_nothing()
            .returning(*pauses.c)
        )
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            made = (await conn.execute(stmt)).first()
            if made is not None:
                return LanePause.model_validate(dict(made._mapping)), True
            stood = (await conn.execute(select(pauses).where(pauses.c.lane == lane))).one()
        return LanePause.model_validate(dict(stood._mapping)), False

    async def resume_lane(self, org_id: UUID, lane: str) -> LanePause | None:
        """See `WorkStorageInterface.resume_lane`."""
        stmt = delete(pauses).where(pauses.c.lane == lane).returning(*pauses.c)
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            gone = (await conn.execute(stmt)).first()
            if gone is not None:
                await self._announce(conn, [(lane, kind.value) for kind in WorkKind])
        return None if gone is None else LanePause.model_validate(dict(gone._mapping))

    async def paused_lanes(self, org_id: UUID) -> list[LanePause]:
        """See `WorkStorageInterface.paused_lanes`."""
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            rows = (await conn.execute(select(pauses).order_by(pauses.c.lane))).all()
        return [LanePause.model_validate(dict(row._mapping)) for row in rows]

    async def holders(self, org_id: UUID) -> dict[str, int]:
        """See `WorkStorageInterface.holders`."""
        query = (
            select(t.c.claimed_by, func.count().label("held"))
            .where(
                t.c.status == WorkStatus.CLAIMED.value,
                t.c.lease_expires_at > self._now(),
                t.c.claimed_by.is_not(None),
            )
            .group_by(t.c.claimed_by)
            .order_by(t.c.claimed_by)
        )
        if org_id != EMPTY_UUID:
            query = query.where(t.c.org_id == org_id)
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            rows = (await conn.execute(query)).all()
        return {row.claimed_by: row.held for row in rows}

    async def beat_worker(
        self,
        org_id: UUID,
        worker_id: str,
        *,
        worker: str,
        lane: str,
        kinds: Sequence[str],
        ttl_s: float,
    ) -> None:
        """See `WorkStorageInterface.beat_worker`: one `INSERT ... ON CONFLICT (worker_id)
        DO UPDATE` that keeps `started_at`."""
        dialect = postgresql if self._funnel.dialect == "postgresql" else sqlite
        now = self._now()
        stmt = dialect.insert(roster).values(
            worker_id=worker_id,
            worker=worker,
            lane=lane,
            kinds=" ".join(kinds),
            started_at=now,
            beat_at=now,
            expires_at=self._after(ttl_s),
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=[roster.c.worker_id],
            set_={
                name: stmt.excluded[name]
                for name in ("worker", "lane", "kinds", "beat_at", "expires_at")
            },
        )
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            await conn.execute(stmt)

    async def drop_worker(self, org_id: UUID, worker_id: str) -> bool:
        """See `WorkStorageInterface.drop_worker`."""
        stmt = delete(roster).where(roster.c.worker_id == worker_id).returning(roster.c.worker_id)
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            return (await conn.execute(stmt)).first() is not None

    async def prune_workers(self, org_id: UUID, expired_for_s: float) -> int:
        """See `WorkStorageInterface.prune_workers`."""
        stmt = (
            delete(roster)
            .where(roster.c.expires_at < self._after(-expired_for_s))
            .returning(roster.c.worker_id)
        )
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            return len((await conn.execute(stmt)).all())

    async def alive_workers(self, org_id: UUID) -> list[WorkerBeat]:
        """See `WorkStorageInterface.alive_workers`."""
        query = select(roster).where(roster.c.expires_at > self._now()).order_by(roster.c.worker_id)
        async with self._session(DatabaseRole.QUEUE, org_id) as conn:
            rows = (await conn.execute(query)).all()
        return [
            WorkerBeat.model_validate({**row._mapping, "kinds": tuple(row.kinds.split())})
            for row in rows
        ]

    async def oldest_snapshot(self, org_id: UUID) -> OldestSnapshot | None:
        """See `WorkStorageInterface.oldest_snapshot`: None, as SQLite keeps no
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
