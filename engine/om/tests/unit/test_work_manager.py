"""The work manager over the memory storage, with the real tenancy, audit and topics twins.

The life of an item as a host relies on it: enqueue (and a retried or relayed one), the
claim's context and token, complete and defer. The engine's other cases are in
`test_work_manager_engine.py` in the template's engine, which hosts do not receive.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from work_fixtures import (
    KIND,
    LANE,
    LEASE_S,
    TRACEPARENT,
    WORKER_APP,
    FakeClock,
    WorkBench,
    claim,
    new_item,
    payload,
    use_probe_payload,
    work_bench,
)

from acme.infra.container import Infra
from acme.infra.topics import Topics, WorkAvailablePayload
from acme.om.context import OpContext, RequestContext, Role
from acme.om.outbox import OutboxRow
from acme.om.storage.impl.memory import MemoryStorageRoot
from acme.om.types import EMPTY_UUID
from acme.om.work.storage.impl.memory import MemoryWorkStorage
from acme.om.work.types.work_item import (
    WorkStatus,
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def bench(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> WorkBench:
    use_probe_payload(monkeypatch)
    return work_bench(MemoryStorageRoot(), Infra.memory(), MemoryWorkStorage(clock=clock))


@pytest.fixture
async def ctx(bench: WorkBench) -> OpContext:
    return await bench.member()


# -- enqueue -----------------------------------------------------------------------------------


async def test_enqueue_publishes_work_available(bench: WorkBench, ctx: OpContext) -> None:
    async with bench.infra.topics.subscribe(Topics.WORK_AVAILABLE) as messages:
        await bench.work.enqueue(ctx, new_item(ctx))
        message = await asyncio.wait_for(anext(messages), timeout=1)
    assert message == WorkAvailablePayload(lane=LANE, kind=KIND.value)
    assert bench.count("work_items_enqueued_total", kind=KIND.value) == 1


async def test_the_copy_stamps_actor_status_and_attempts_and_keeps_the_timestamps(
    bench: WorkBench, ctx: OpContext
) -> None:
    sent = new_item(
        ctx,
        status=WorkStatus.COMPLETED,
        attempts=4,
        created_by=uuid4(),
        updated_by=uuid4(),
        claimed_by="someone",
        claim_token=uuid4(),
        claimed_at=datetime.now(UTC),
        lease_expires_at=datetime.now(UTC),
        request_id=uuid4(),
        traceparent="00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01",
    )
    item = await bench.work.enqueue(ctx, sent)
    assert (item.id, item.created_at, item.updated_at) == (
        sent.id,
        sent.created_at,
        sent.updated_at,
    )
    assert (item.status, item.attempts) == (WorkStatus.AVAILABLE, 0)
    assert (item.created_by, item.updated_by) == (ctx.user_id, ctx.user_id)
    assert (item.claimed_by, item.claim_token, item.claimed_at, item.lease_expires_at) == (
        None,
        None,
        None,
        None,
    )
    assert (item.request_id, item.traceparent) == (
        ctx.request.request_id,
        ctx.request.traceparent,
    )


async def test_a_retried_enqueue_leaves_a_claimed_row_untouched(
    bench: WorkBench, ctx: OpContext
) -> None:
    item = new_item(ctx)
    await bench.work.enqueue(ctx, item)
    _, claimed = await claim(bench)
    again = await bench.work.enqueue(ctx, item)
    assert again == claimed
    assert bench.count("work_items_enqueued_total", kind=KIND.value) == 1


def outbox_row(ctx: OpContext, kind: str) -> OutboxRow:
    return OutboxRow(
        id=uuid4(),
        org_id=ctx.org_id,
        kind=kind,
        payload=payload(),
        actor_id=uuid4(),
        request_id=uuid4(),
        traceparent=TRACEPARENT,
        created_at=datetime.now(UTC),
        relayed_at=None,
    )


async def test_enqueue_relayed_takes_actor_request_and_trace_from_the_row(
    bench: WorkBench, ctx: OpContext
) -> None:
    row = outbox_row(ctx, f"work.{KIND.value.lower()}")
    item = await bench.work.enqueue_relayed(ctx.org_id, row)
    assert (item.created_by, item.updated_by) == (row.actor_id, row.actor_id)
    assert (item.request_id, item.traceparent) == (row.request_id, TRACEPARENT)
    assert item.idempotency_key == str(row.id)
    assert item.payload == row.payload
    assert await bench.work.enqueue_relayed(ctx.org_id, row) == item


async def test_enqueue_relayed_and_a_retried_enqueue_meet_one_insert(
    bench: WorkBench, ctx: OpContext
) -> None:
    row = outbox_row(ctx, f"work.{KIND.value}")
    enqueued = await bench.work.enqueue(
        ctx, new_item(ctx, payload=row.payload, idempotency_key=str(row.id))
    )
    assert await bench.work.enqueue_relayed(ctx.org_id, row) == enqueued
    assert len(await bench.work.list_items(ctx)) == 1


async def test_claim_returns_the_enqueuers_context_caused_by_the_items_request(
    bench: WorkBench, ctx: OpContext
) -> None:
    item = await bench.work.enqueue(ctx, new_item(ctx))
    rctx = RequestContext.new(WORKER_APP)
    claimed = await bench.work.claim(rctx, LANE, [KIND], "w1", LEASE_S)
    assert claimed is not None
    work_ctx, held = claimed
    assert work_ctx.request is rctx
    assert (work_ctx.org_id, work_ctx.user_id, work_ctx.role) == (
        ctx.org_id,
        ctx.user_id,
        Role.SERVICE,
    )
    assert work_ctx.caused_by_request_id == item.request_id == ctx.request.request_id
    assert held.id == item.id
    assert held.claim_token is not None
    assert held.updated_by == EMPTY_UUID


async def test_complete_signs_updated_by_with_the_system_user(
    bench: WorkBench, ctx: OpContext
) -> None:
    await bench.work.enqueue(ctx, new_item(ctx))
    work_ctx, held = await claim(bench)
    done = await bench.work.complete(work_ctx, held)
    assert (done.status, done.updated_by, done.claim_token) == (
        WorkStatus.COMPLETED,
        EMPTY_UUID,
        None,
    )
    assert done.completed_at is not None
    assert (done.created_by, done.request_id) == (ctx.user_id, ctx.request.request_id)


async def test_defer_gives_the_attempt_back_and_delays_the_item(
    bench: WorkBench, ctx: OpContext, clock: FakeClock
) -> None:
    await bench.work.enqueue(ctx, new_item(ctx))
    work_ctx, held = await claim(bench)
    later = await bench.work.defer(work_ctx, held, 60)
    assert (later.status, later.attempts, later.updated_by) == (
        WorkStatus.AVAILABLE,
        0,
        EMPTY_UUID,
    )
    assert later.available_at == clock.now + timedelta(seconds=60)
    assert (
        await bench.work.claim(RequestContext.new(WORKER_APP), LANE, [KIND], "w", LEASE_S) is None
    )
    clock.advance(61)
    assert (await claim(bench))[1].id == held.id
