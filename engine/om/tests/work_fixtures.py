"""Helpers the work namespace's tests share: a clock, items, and a wired work manager.

Plain functions and classes, no fixtures: each test module declares the fixtures it needs
from these, so nothing here is picked up behind a test's back.

Rows the manager never writes (a payload that is not a JSON object, a kind no `WorkKind`
names) are stored with `stored_row` and `store_row`. On PostgreSQL the table refuses a
runnable row whose payload is not an object (`ck_work_items_payload`): a test that needs one
lifts the check first (`lift_payload_check`, as the owner role: what a table that predates
the check, or a writer that dropped it, looks like) and puts it back after
(`restore_payload_check`, which runs the migrations' own SQL over what the test left).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import asyncpg
import pytest
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict
from sqlalchemy import JSON, insert
from sqlalchemy.engine import make_url

from acme.infra.container import Infra
from acme.om.context import AppContext, AppType, OpContext, RequestContext, Role
from acme.om.migrations_support import SQL_DIR
from acme.om.root import Managers, build_managers
from acme.om.storage.funnel import StorageFunnel
from acme.om.storage.roles import DatabaseRole
from acme.om.storage.root import StorageRootInterface
from acme.om.types import EMPTY_UUID
from acme.om.work.impl.manager import WorkManagerImpl
from acme.om.work.metrics import WorkMetrics
from acme.om.work.storage import WorkStorageInterface
from acme.om.work.storage.tables.work_items import work_items
from acme.om.work.types.work_item import (
    WORK_PAYLOADS,
    WorkItem,
    WorkKind,
    WorkStatus,
)

KIND = next(iter(WorkKind))
"""Any kind will do: the tests give it `ProbePayload` and never look at the real model."""

ACTOR = UUID(int=7)
"""The enqueuer the storage suite's items name."""

WORKER_APP = AppContext(type=AppType.WORKER, version="work-tests@0")
SERVICE_APP = AppContext(type=AppType.SERVICE, version="work-tests@0")

LANE = "default"
"""The lane the manager suites enqueue on and claim from."""

LEASE_S = 30.0
"""A lease no manager test outlives."""

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
"""A W3C trace context an enqueuer passes on."""


class FakeClock:
    """A clock that moves only when told: the memory storage's database clock."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class ProbePayload(BaseModel):
    """The payload the tests enqueue, whatever shape the kind's own payload has taken."""

    model_config = ConfigDict(extra="forbid")

    record_id: UUID
    count: int = 1
    note: str = ""


def use_probe_payload(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register `ProbePayload` as `KIND`'s payload for one test (undone after it)."""
    monkeypatch.setitem(WORK_PAYLOADS, KIND, ProbePayload)


def payload() -> dict[str, object]:
    """A fresh `ProbePayload` as the JSON object an enqueuer sends."""
    return ProbePayload(record_id=uuid4()).model_dump(mode="json")


def new_item(ctx: OpContext, **fields: object) -> WorkItem:
    """A new item of `ctx`'s tenant on `LANE`, with `fields` set over `WorkItem.new`'s."""
    item = WorkItem.new(org_id=ctx.org_id, kind=KIND, payload=payload(), lane=LANE)
    return item.model_copy(update=fields)


def make_item(
    org_id: UUID,
    lane: str,
    *,
    delay: float = 0.0,
    key: str | None = None,
    attempts: int = 0,
    max_attempts: int = 3,
    **fields: Any,
) -> WorkItem:
    """An item as the manager hands it to storage: stamped, unclaimed, due after `delay`."""
    now = datetime.now(UTC)
    return WorkItem(
        id=uuid4(),
        org_id=org_id,
        kind=KIND,
        lane=lane,
        payload={"record_id": str(uuid4())},
        attempts=attempts,
        max_attempts=max_attempts,
        available_at=now + timedelta(seconds=delay),
        idempotency_key=key,
        created_at=now,
        updated_at=now,
        created_by=ACTOR,
        updated_by=ACTOR,
        **fields,
    )


def outcome(item: WorkItem, status: WorkStatus, **fields: Any) -> WorkItem:
    """What a holder writes back: `status`, every claim field cleared, signed by the system."""
    return item.model_copy(
        update={
            "status": status,
            "claimed_by": None,
            "claim_token": None,
            "claimed_at": None,
            "lease_expires_at": None,
            "updated_by": EMPTY_UUID,
            **fields,
        }
    )


def token_of(item: WorkItem) -> UUID:
    """The claim token a claimed item carries."""
    assert item.claim_token is not None
    return item.claim_token


def stored_row(org_id: UUID, lane: str, **columns: Any) -> dict[str, Any]:
    """Every column of an unclaimed row of `KIND` on `lane`, due a minute ago (on any
    storage clock), `columns` over them, none of them validated: `payload=[1, 2, 3]`,
    `kind="NO_SUCH_KIND"`, `status="FAILED"`, ..."""
    values = make_item(org_id, lane).model_dump()
    values["available_at"] -= timedelta(minutes=1)
    values["kind"] = KIND.value
    values["status"] = WorkStatus.AVAILABLE.value
    values.update(columns)
    return values


async def store_row(funnel: StorageFunnel, values: Mapping[str, Any]) -> None:
    """Insert `values` into `work_items` as they are, in their tenant's session. A payload
    of None is stored as JSON `null`. On SQLite the table's checks are off for the insert."""
    row = dict(values)
    if row["payload"] is None:
        row["payload"] = JSON.NULL
    sqlite = funnel.dialect == "sqlite"
    async with funnel.session(DatabaseRole.QUEUE, row["org_id"]) as conn:
        if sqlite:
            await conn.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
        try:
            await conn.execute(insert(work_items).values(**row))
        finally:
            if sqlite:
                await conn.exec_driver_sql("PRAGMA ignore_check_constraints = OFF")


PAYLOAD_CHECK = "ck_work_items_payload"


def asyncpg_dsn(url: str) -> str:
    """`url` (a SQLAlchemy URL, any driver) as a DSN asyncpg connects with, password kept."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def lift_payload_check(owner_url: str) -> None:
    """Drop `ck_work_items_payload` (PostgreSQL, as the owner role at `owner_url`)."""
    conn = await asyncpg.connect(asyncpg_dsn(owner_url))
    try:
        await conn.execute(f"ALTER TABLE work_items DROP CONSTRAINT IF EXISTS {PAYLOAD_CHECK}")
    finally:
        await conn.close()


async def restore_payload_check(owner_url: str) -> None:
    """Put `ck_work_items_payload` back when it is missing, by the queue migrations' own SQL
    (`*_work_items_payload_object.up.sql`, then `*_work_items_payload_checked.up.sql`): the
    runnable rows that break it become dead letters, and the check is validated."""
    conn = await asyncpg.connect(asyncpg_dsn(owner_url))
    try:
        found = await conn.fetchval(
            "SELECT count(*) FROM pg_constraint WHERE conname = $1", PAYLOAD_CHECK
        )
        if found:
            return
        for name in ("payload_object", "payload_checked"):
            (path,) = sorted((SQL_DIR / "queue").glob(f"*_work_items_{name}.up.sql"))
            async with conn.transaction():
                await conn.execute(path.read_text(encoding="utf-8"))
    finally:
        await conn.close()


@dataclass
class WorkBench:
    """A work manager wired to real collaborators, and what a test reads back from them."""

    work: WorkManagerImpl
    managers: Managers
    infra: Infra
    registry: CollectorRegistry

    def count(self, name: str, **labels: str) -> float:
        """The value of one counter sample (`work_dead_letters_total`, ...); 0 when unset."""
        return self.registry.get_sample_value(name, labels) or 0.0

    async def member(self, name: str = "acme-test") -> OpContext:
        """A fresh tenant and the context of one of its members (the enqueuer)."""
        rctx = RequestContext.new(
            SERVICE_APP, traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        )
        org = await self.managers.tenancy.create_org(rctx, name)
        return await self.managers.tenancy.member_context(
            rctx, org_id=org.id, user_id=uuid4(), role=Role.MEMBER
        )

    async def service(self, org_id: UUID) -> OpContext:
        """The sweep's context for one tenant (service role, system user)."""
        for ctx in await self.work.maintenance_contexts(RequestContext.new(WORKER_APP)):
            if ctx.org_id == org_id:
                return ctx
        raise LookupError(org_id)


async def claim(bench: WorkBench, worker: str = "w1") -> tuple[OpContext, WorkItem]:
    """One claim on `LANE` for `KIND` as a worker would make it; the item's context and row."""
    claimed = await bench.work.claim(RequestContext.new(WORKER_APP), LANE, [KIND], worker, LEASE_S)
    assert claimed is not None
    return claimed


def work_bench(
    root: StorageRootInterface,
    infra: Infra,
    storage: WorkStorageInterface,
    *,
    context_reuse_s: float = 0.0,
) -> WorkBench:
    """A `WorkManagerImpl` over `storage`, with the tenancy and audit managers of `root`, the
    topics of `infra`, and counters on a registry of its own. It asks the tenancy manager
    for every claim batch unless `context_reuse_s` is given (the manager's own default
    reuses an answer for `CONTEXT_REUSE_S`; the suite's cases about asking want each ask)."""
    managers = build_managers(root, infra)
    registry = CollectorRegistry()
    work = WorkManagerImpl(
        storage,
        tenancy=managers.tenancy,
        audit=managers.audit,
        topics=infra.topics,
        metrics=WorkMetrics(registry),
        context_reuse_s=context_reuse_s,
    )
    return WorkBench(work=work, managers=managers, infra=infra, registry=registry)
