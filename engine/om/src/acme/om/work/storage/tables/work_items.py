"""The `work_items` table, in the `queue` database role.

Constraint names follow the naming convention of `metadata` (`pk_work_items`,
`ck_work_items_status`, ...). The table must equal what the queue migrations
(`om/migrations/sql/queue/*_work_items*.up.sql`, in order) build; the integration suite
compares the two on PostgreSQL. SQLite gets it from `metadata.create_all`.

`ck_work_items_payload`: a row that can still run (`AVAILABLE`, `CLAIMED`) holds a JSON
object as its payload; a dead letter or a completed row may keep any JSON, so a row written
before the check existed stays where an operator can read it. `JsonType` spells the JSON
type of a value in each dialect (`jsonb_typeof` on PostgreSQL, `json_type` on SQLite).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    CheckConstraint,
    Column,
    ColumnElement,
    DateTime,
    Dialect,
    Index,
    Integer,
    SmallInteger,
    Table,
    Text,
    Uuid,
    column,
    or_,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import JSON, TypeDecorator

from acme.om.storage.metadata import metadata
from acme.om.work.types.policy import PRIORITY_AGING_S


class UtcDateTime(TypeDecorator[datetime]):
    """`timestamptz` on PostgreSQL; on SQLite, naive UTC text read back as aware UTC.

    SQLite keeps times as `YYYY-MM-DD HH:MM:SS.ffffff` text and compares them as text,
    so every time the SQLite storage computes in SQL uses that exact shape too.
    Raises `ValueError` when bound a naive datetime.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """Refuse naive times; hand SQLite naive UTC."""
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("work_items times must be timezone-aware")
        if dialect.name == "sqlite":
            return value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        """Read every time back as aware UTC."""
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f"unexpected time value {value!r}")
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class JsonType(FunctionElement[str]):
    """The JSON type of a value as text (`'object'`, `'array'`, `'null'`, ...): `jsonb_typeof`
    on PostgreSQL, `json_type` on SQLite."""

    name = "json_type"
    type = Text()
    inherit_cache = True


@compiles(JsonType, "postgresql")
def _json_type_postgresql(element: JsonType, compiler: SQLCompiler, **kw: Any) -> str:
    return f"jsonb_typeof({compiler.process(element.clauses, **kw)})"


@compiles(JsonType, "sqlite")
def _json_type_sqlite(element: JsonType, compiler: SQLCompiler, **kw: Any) -> str:
    return f"json_type({compiler.process(element.clauses, **kw)})"


class ClaimRank(FunctionElement[Any]):
    """Where a row stands in its tenant's claim order: `available_at` less a head start of
    `PRIORITY_AGING_S` per `priority` level (docs/decisions/0036). Immutable in both
    dialects, so an index can hold it: on PostgreSQL as UTC `timestamp` (`timezone('UTC',
    ...)` is immutable where `timestamptz - interval` is not), on SQLite as a Julian day."""

    name = "claim_rank"
    inherit_cache = True


@compiles(ClaimRank, "postgresql")
def _claim_rank_postgresql(element: ClaimRank, compiler: SQLCompiler, **kw: Any) -> str:
    available_at, priority = (compiler.process(c, **kw) for c in element.clauses)
    return claim_rank_sql(available_at, priority)


@compiles(ClaimRank, "sqlite")
def _claim_rank_sqlite(element: ClaimRank, compiler: SQLCompiler, **kw: Any) -> str:
    available_at, priority = (compiler.process(c, **kw) for c in element.clauses)
    return f"(julianday({available_at}) - {priority} * {PRIORITY_AGING_S / 86400.0!r})"


def claim_rank_sql(available_at: str, priority: str) -> str:
    """`ClaimRank` as PostgreSQL text over two column expressions, spelled as PostgreSQL
    prints the index's expression (the claim's text must parse to the index's expression
    for the planner to read the index; alembic compares the printed forms)."""
    minutes, seconds = divmod(PRIORITY_AGING_S, 60)
    hours, minutes = divmod(minutes, 60)
    step = f"'{hours:02}:{minutes:02}:{seconds:02}'::interval"
    return f"(timezone('UTC'::text, {available_at}) - {priority}::double precision * {step})"


def payload_is_object(payload: ColumnElement[Any]) -> ColumnElement[bool]:
    """True where `payload` (the column, or a stand-in for it) holds a JSON object."""
    return JsonType(payload) == "object"


work_items = Table(
    "work_items",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("org_id", Uuid, nullable=False),
    Column("kind", Text, nullable=False),
    Column("lane", Text, nullable=False),
    Column("payload", JSON().with_variant(JSONB(), "postgresql"), nullable=False),
    Column("status", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("available_at", UtcDateTime, nullable=False),
    Column("claimed_by", Text),
    Column("claim_token", Uuid),
    Column("claimed_at", UtcDateTime),
    Column("lease_expires_at", UtcDateTime),
    Column("last_error", Text),
    Column("note", Text),
    Column("idempotency_key", Text),
    Column("request_id", Uuid),
    Column("traceparent", Text),
    Column("completed_at", UtcDateTime),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    Column("created_by", Uuid, nullable=False),
    Column("updated_by", Uuid, nullable=False),
    Column("deleted_at", UtcDateTime),
    # While a dead letter's audit entry is not written: the claim token it died under (the
    # entry's idempotency key is derived from it) and why it died; both NULL otherwise (every
    # statement that writes one writes the other).
    Column("audit_owed_token", Uuid),
    Column("audit_owed_reason", Text),
    # Higher first within a tenant, aged (`ClaimRank`); the default keeps the order items
    # had before priorities.
    Column("priority", SmallInteger, nullable=False, server_default=text("0")),
    CheckConstraint(
        "status IN ('AVAILABLE', 'CLAIMED', 'COMPLETED', 'FAILED', 'CANCELLED')", name="status"
    ),
    CheckConstraint("attempts >= 0", name="attempts"),
    CheckConstraint("max_attempts >= 1", name="max_attempts"),
    CheckConstraint(
        or_(
            payload_is_object(column("payload")),
            column("status").in_(["COMPLETED", "FAILED"]),
        ),
        name="payload",
    ),
    # Idempotency is per tenant: two tenants may use one key without meeting, and the
    # index leads with `org_id`, so it also serves every tenant-scoped read.
    Index("ix_work_items_org_id_idempotency_key", "org_id", "idempotency_key", unique=True),
    # The sweep: a tenant's claimed items. No time in it, so a lease renewal touches no
    # indexed column and PostgreSQL can write it as a HOT update.
    Index(
        "ix_work_items_claimed",
        "org_id",
        postgresql_where=text("status = 'CLAIMED'"),
        sqlite_where=text("status = 'CLAIMED'"),
    ),
    # The retention sweep: a tenant's completed items, oldest first.
    Index(
        "ix_work_items_completed",
        "org_id",
        "completed_at",
        postgresql_where=text("status = 'COMPLETED'"),
        sqlite_where=text("status = 'COMPLETED'"),
    ),
    # The retention sweep of cancelled items: a tenant's, oldest cancel first (a cancelled
    # row is final, so `updated_at` is when it was cancelled).
    Index(
        "ix_work_items_cancelled",
        "org_id",
        "updated_at",
        postgresql_where=text("status = 'CANCELLED'"),
        sqlite_where=text("status = 'CANCELLED'"),
    ),
    # The sweep's audit step: a tenant's dead letters whose audit entry is owed (a handful).
    Index(
        "ix_work_items_audit_owed",
        "org_id",
        postgresql_where=text("audit_owed_token IS NOT NULL"),
        sqlite_where=text("audit_owed_token IS NOT NULL"),
    ),
    # The work API's dead letters, newest first (docs/decisions/0046): the live ones only,
    # so a page of the list reads its own rows and never the completed history.
    Index(
        "ix_work_items_dead_letters",
        "org_id",
        text("created_at DESC"),
        "id",
        postgresql_where=text("status = 'FAILED' AND deleted_at IS NULL"),
        sqlite_where=text("status = 'FAILED' AND deleted_at IS NULL"),
    ),
    # The work API's items list, newest first (docs/decisions/0050): a page walks its own
    # entries in the list's order, whatever history the retention keeps. Neither key column
    # changes after the insert, so a lease renewal stays a HOT update.
    Index(
        "ix_work_items_listed",
        "org_id",
        text("created_at DESC"),
        "id",
        postgresql_where=text("deleted_at IS NULL"),
        sqlite_where=text("deleted_at IS NULL"),
    ),
    # The sweep's purge of discarded items: a tenant's discarded rows (an operator's few),
    # so the purge never reads the completed history.
    Index(
        "ix_work_items_deleted",
        "org_id",
        "deleted_at",
        postgresql_where=text("deleted_at IS NOT NULL"),
        sqlite_where=text("deleted_at IS NOT NULL"),
    ),
)

# The claim (docs/decisions/0037): per lane and kind, the tenants with available items
# (read by a skip scan over `org_id`), and each tenant's items in claim order, so a
# tenant's `LIMIT k` reads k entries, whatever other tenants or kinds hold.
Index(
    "ix_work_items_claim_order",
    work_items.c.lane,
    work_items.c.kind,
    work_items.c.org_id,
    ClaimRank(work_items.c.available_at, work_items.c.priority),
    work_items.c.id,
    postgresql_where=text("status = 'AVAILABLE'"),
    sqlite_where=text("status = 'AVAILABLE'"),
)
