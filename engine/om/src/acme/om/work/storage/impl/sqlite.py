"""The work queue on SQLite (aiosqlite): the embedded default for local development."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar
from uuid import UUID

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Float,
    Insert,
    Text,
    Update,
    Uuid,
    func,
    select,
    type_coerce,
)
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from acme.om.work.storage.impl.sql import SqlWorkStorage
from acme.om.work.storage.tables.work_items import UtcDateTime, work_items

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

    def _new_token(self) -> ColumnElement[UUID]:
        # 32 hex digits: the form SQLAlchemy's `Uuid` stores on SQLite.
        return type_coerce(func.lower(func.hex(func.randomblob(16))), Uuid)

    def _insert(self) -> Insert:
        return insert(t).on_conflict_do_nothing()

    async def _before_claim(self, conn: AsyncConnection) -> None:
        """`BEGIN IMMEDIATE`: the claim's transaction takes the database's write lock
        before it reads, so a second claimer waits (up to the funnel's busy timeout)
        instead of reading the same rows and failing to upgrade its lock; the driver opens
        no transaction of its own before this statement, and commits this one when the
        session ends."""
        await conn.exec_driver_sql("BEGIN IMMEDIATE")

    def _claim_statement(
        self, claim: Update, candidates: ColumnElement[bool], limit: BindParameter[int]
    ) -> Update:
        """One statement, `UPDATE ... WHERE id IN (SELECT ... LIMIT k) RETURNING`, run under
        the write lock `_before_claim` took, so no two claimers can take one row."""
        picked = (
            select(t.c.id)
            .where(candidates)
            .order_by(t.c.available_at, t.c.id)
            .limit(limit)
            .scalar_subquery()
        )
        return claim.where(t.c.id.in_(picked)).returning(*t.c)
