"""The work queue on SQLite (aiosqlite): the embedded default for local development."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import cached_property
from typing import Any, ClassVar
from uuid import UUID

from sqlalchemy import (
    ColumnElement,
    Float,
    Insert,
    Subquery,
    Text,
    Update,
    Uuid,
    bindparam,
    exists,
    func,
    literal,
    select,
    tuple_,
    type_coerce,
    update,
)
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from acme.om.types import EMPTY_UUID
from acme.om.work.storage.impl.sql import SqlWorkStorage, unreadable_error
from acme.om.work.storage.tables.work_items import ClaimRank, UtcDateTime, work_items
from acme.om.work.storage.tables.work_lane_pauses import work_lane_pauses
from acme.om.work.storage.tables.work_schedules import work_schedules
from acme.om.work.types.work_item import UnreadableRow, WorkKind, WorkStatus

t = work_items

# SQLite's `strftime('%f')` stops at milliseconds; three zeros give the six digits
# SQLAlchemy writes for a bound time, so SQL-made and bound times compare as text.
_TIME_FORMAT = "%Y-%m-%d %H:%M:%f"


class SqliteWorkStorage(SqlWorkStorage):
    """`WorkStorageInterface` on SQLite.

    Times come from SQLite's own clock (`'now'` is fixed for one statement). SQLite has
    no row-level security; every statement's tenant filter is the fence. SQLite runs
    one writer at a time, and the claim reads and writes under the write lock, so no
    two claimers can take one row.
    """

    backend: ClassVar[str] = "sqlite"

    def _now(self) -> ColumnElement[datetime]:
        return type_coerce(
            func.strftime(_TIME_FORMAT, "now", type_=Text).concat("000"), UtcDateTime
        )

    def _after(self, seconds: float | ColumnElement[float]) -> ColumnElement[datetime]:
        if isinstance(seconds, ColumnElement):
            modifier: ColumnElement[str] | str = func.printf("%+.6f seconds", seconds, type_=Text)
        else:
            modifier = f"{seconds:+.6f} seconds"
        shifted = func.strftime(_TIME_FORMAT, "now", modifier, type_=Text)
        return type_coerce(shifted.concat("000"), UtcDateTime)

    def _seconds_since(self, moment: ColumnElement[datetime]) -> ColumnElement[float]:
        # `julianday` reads the stored text shape; days to seconds.
        days = func.julianday("now", type_=Float) - func.julianday(moment, type_=Float)
        return days * 86400.0

    def _insert(self) -> Insert:
        return insert(t).on_conflict_do_nothing()

    def _insert_state(self) -> Insert:
        return insert(work_schedules).on_conflict_do_nothing()

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
        """See `SqlWorkStorage._claim_rows`: `BEGIN IMMEDIATE` first, so the claim's
        transaction takes the database's write lock before it reads and a second claimer
        waits (up to the funnel's busy timeout) instead of reading the same rows and failing
        to upgrade its lock; the driver opens no transaction of its own before it, and
        commits this one when the session ends."""
        await conn.exec_driver_sql("BEGIN IMMEDIATE")
        params = {
            "claim_lane": lane,
            "claim_kinds": [kind.value for kind in kinds],
            "claim_worker": worker_id,
            "claim_lease": lease_s,
            "claim_limit": limit,
        }
        if limit == 1:
            params["claim_after"] = after
            return [r._mapping for r in await conn.execute(self._claim_one_stmt, params)]
        return [r._mapping for r in await conn.execute(self._claim_stmt, params)]

    @cached_property
    def _claim_stmt(self) -> Update:
        """`_claim_update` with tenants at one turn in random order."""
        return self._claim_update(lambda due: (func.random(),))

    @cached_property
    def _claim_one_stmt(self) -> Update:
        """`_claim_update` for one slot: the first due tenant after tenant id `claim_after`,
        wrapping round (`OneSlotTurns`)."""
        after = bindparam("claim_after", type_=t.c.org_id.type)
        return self._claim_update(lambda due: (due.c.org_id <= after, due.c.org_id))

    def _claim_update(
        self, tenants: Callable[[Subquery], tuple[ColumnElement[Any], ...]]
    ) -> Update:
        """One statement, `UPDATE ... WHERE id IN (SELECT ... LIMIT k) RETURNING`
        (parameters prefixed `claim_`: one may not share a column's name in an UPDATE), run
        under the write lock `_claim_rows` took, so no two claimers can take one row.

        The order (docs/decisions/0037): each due row's turn is its place in its tenant's
        claim order (`ClaimRank`, then `available_at` and `id`: a Julian day rounds to
        tenths of a millisecond); turns first, tenants at one turn in the order `tenants`
        gives over the due rows. It reads every due row of the lane and kinds: the embedded
        database serves one developer's backlog."""
        now = self._now()
        turn = (
            func.row_number()
            .over(
                partition_by=t.c.org_id,
                order_by=(ClaimRank(t.c.available_at, t.c.priority), t.c.available_at, t.c.id),
            )
            .label("turn")
        )
        due = (
            select(t.c.id, t.c.org_id, turn)
            .where(
                (t.c.status == WorkStatus.AVAILABLE.value)
                & (t.c.lane == bindparam("claim_lane"))
                & t.c.kind.in_(bindparam("claim_kinds", expanding=True))
                & (t.c.available_at <= now)
                & t.c.deleted_at.is_(None)
                & (t.c.attempts < t.c.max_attempts)
                # A paused lane yields nothing (docs/decisions/0040).
                & ~exists().where(work_lane_pauses.c.lane == bindparam("claim_lane"))
            )
            .subquery()
        )
        picked = (
            select(due.c.id)
            .order_by(due.c.turn, *tenants(due))
            .limit(bindparam("claim_limit"))
            .scalar_subquery()
        )
        return (
            update(t)
            .where(t.c.id.in_(picked))
            .values(
                status=WorkStatus.CLAIMED.value,
                attempts=t.c.attempts + 1,
                claimed_by=bindparam("claim_worker"),
                # 32 hex digits: the form SQLAlchemy's `Uuid` stores on SQLite.
                claim_token=type_coerce(func.lower(func.hex(func.randomblob(16))), Uuid),
                claimed_at=now,
                lease_expires_at=self._after(bindparam("claim_lease", type_=Float)),
                note=None,
                updated_at=now,
                updated_by=EMPTY_UUID,
            )
            .returning(*t.c)
        )

    async def _complete_rows(
        self, conn: AsyncConnection, claims: Sequence[tuple[UUID, UUID, UUID]]
    ) -> set[UUID]:
        """See `SqlWorkStorage._complete_rows`: each row fenced on its tenant and its own
        token by the `(org_id, id, claim_token)` row-value match in its WHERE clause."""
        params = {"done_claims": list(claims)}
        return set((await conn.execute(self._complete_stmt, params)).scalars())

    @cached_property
    def _complete_stmt(self) -> Update:
        now = self._now()
        return (
            update(t)
            .where(
                tuple_(t.c.org_id, t.c.id, t.c.claim_token).in_(
                    bindparam("done_claims", expanding=True)
                ),
                t.c.status == WorkStatus.CLAIMED.value,
                t.c.lease_expires_at > now,
            )
            .values(
                status=WorkStatus.COMPLETED.value,
                claimed_by=None,
                claim_token=None,
                claimed_at=None,
                lease_expires_at=None,
                completed_at=now,
                updated_at=now,
                updated_by=EMPTY_UUID,
            )
            .returning(t.c.id)
        )

    async def _fail_unreadable(
        self, conn: AsyncConnection, row: UnreadableRow
    ) -> Mapping[Any, Any] | None:
        """See `SqlWorkStorage._fail_unreadable`."""
        params = {
            "u_id": row.id,
            "u_org_id": row.org_id,
            "u_token": row.values.get("claim_token"),
            "u_error": unreadable_error(row),
        }
        written = (await conn.execute(self._unreadable_stmt, params)).first()
        return None if written is None else written._mapping

    @cached_property
    def _unreadable_stmt(self) -> Update:
        """The dead letter of a claimed row that cannot be read; parameters prefixed `u_`."""
        now = self._now()
        token = bindparam("u_token", type_=t.c.claim_token.type)
        return (
            update(t)
            .where(
                t.c.id == bindparam("u_id", type_=t.c.id.type),
                t.c.org_id == bindparam("u_org_id", type_=t.c.org_id.type),
                t.c.claim_token == token,
                t.c.status == WorkStatus.CLAIMED.value,
                t.c.lease_expires_at > now,
            )
            .values(
                status=WorkStatus.FAILED.value,
                claimed_by=None,
                claim_token=None,
                claimed_at=None,
                lease_expires_at=None,
                last_error=bindparam("u_error", type_=Text),
                audit_owed_token=token,
                audit_owed_reason=literal("unreadable", Text),
                updated_at=now,
                updated_by=EMPTY_UUID,
            )
            .returning(*t.c)
        )
