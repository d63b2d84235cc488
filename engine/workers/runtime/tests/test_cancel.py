"""An operator's cancel of an item a worker holds, and a handler's own verdicts, over the
memory container (docs/decisions/0038, 0039 in the worker template).

The holder hears of a cancel on its wake-up channel (here the memory topic) and cancels the
handler at once; without the channel, at its next lease renewal; a handler that returned
meanwhile has its completion refused. Each counts `worker_items_cancelled_total`, never a
lost lease nor a fencing conflict.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY, CollectorRegistry

from acme.om.context import OpContext
from acme.om.errors import Invalid
from acme.om.work.types.handler import PermanentFailure, Snooze, WorkHandlerInterface
from acme.om.work.types.work_item import WorkItem, WorkStatus
from acme.workers.runtime.container import RuntimeContainer
from acme.workers.runtime.loop import WorkerLoop
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.testing import (
    PROBE,
    PROBE_KIND,
    GateHandler,
    LoopFactory,
    make_settings,
    new_items,
    running,
    sample,
)

KIND = PROBE_KIND.value


def _cancelled(loop: WorkerLoop) -> float:
    return sample(loop.metrics, "worker_items_cancelled_total", kind=KIND)


def _lost(loop: WorkerLoop) -> float:
    return sum(
        sample(loop.metrics, "worker_leases_lost_total", kind=KIND, reason=reason)
        for reason in ("conflict", "unrenewed")
    )


def _conflicts() -> float:
    """Fencing conflicts the process's work manager counted so far (the default registry)."""
    return sum(
        REGISTRY.get_sample_value("work_fencing_conflicts_total", {"operation": operation}) or 0.0
        for operation in ("complete", "extend_lease", "fail", "release", "defer")
    )


async def _enqueue(container: RuntimeContainer, ctx: OpContext) -> WorkItem:
    (item,) = await container.managers.work.enqueue_many(ctx, new_items(PROBE, ctx))
    return item


async def test_a_cancel_heard_on_the_wake_up_channel_cancels_the_handler_at_once(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    item = await _enqueue(container, tenant)
    handler = GateHandler()
    # A lease long enough that no renewal comes before the cancel is heard.
    loop = make_loop(handlers={PROBE_KIND: handler}, settings=make_settings(PROBE, lease=30.0))
    conflicts = _conflicts()
    async with running(loop):
        await handler.started.reach(1)
        await container.managers.work.cancel_item(tenant, item.id, operator="alice")
        async with asyncio.timeout(1.0):
            await handler.cancelled.reach(1)
        await asyncio.sleep(0.05)
        assert _cancelled(loop) == 1
    row = await container.managers.work.get(tenant, item.id)
    assert (row.status, row.note) == (WorkStatus.CANCELLED, "cancelled")
    assert _lost(loop) == 0
    assert _conflicts() == conflicts
    assert sample(loop.metrics, "worker_items_released_total", kind=KIND, reason="drain") == 0


async def test_a_cancel_the_holder_did_not_hear_is_found_by_its_lease_renewal(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    """No wake-up channel: the next renewal (every lease / 5 s) is refused as a cancel."""
    item = await _enqueue(container, tenant)
    handler = GateHandler()
    settings = make_settings(PROBE)
    loop = WorkerLoop(
        settings=settings,
        work=container.managers.work,
        handlers={PROBE_KIND: handler},
        cache=container.infra.cache,
        metrics=WorkerMetrics(CollectorRegistry()),
    )
    conflicts = _conflicts()
    async with running(loop):
        await handler.started.reach(1)
        await container.managers.work.cancel_item(tenant, item.id)
        async with asyncio.timeout(settings.renewal_interval + 1.0):
            await handler.cancelled.reach(1)
    assert (await container.managers.work.get(tenant, item.id)).status is WorkStatus.CANCELLED
    assert (_cancelled(loop), _lost(loop)) == (1, 0)
    assert _conflicts() == conflicts


async def test_a_completion_after_the_cancel_committed_is_refused_and_counted_as_a_cancel(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    item = await _enqueue(container, tenant)
    handler = GateHandler()
    loop = make_loop(handlers={PROBE_KIND: handler}, settings=make_settings(PROBE, lease=30.0))
    conflicts = _conflicts()
    assert await loop.claim_once(1) == (1, 0)  # no subscription runs: nothing is heard
    await handler.started.reach(1)
    await container.managers.work.cancel_item(tenant, item.id)
    handler.gate.set()
    await handler.finished.reach(1)
    await loop.flush_completions()
    row = await container.managers.work.get(tenant, item.id)
    assert row.status is WorkStatus.CANCELLED
    assert row.completed_at is None
    assert (_cancelled(loop), _lost(loop)) == (1, 0)
    assert sample(loop.metrics, "worker_items_completed_total", kind=KIND) == 0
    assert _conflicts() == conflicts


class VerdictHandler(WorkHandlerInterface):
    """Raises the verdict it is given."""

    def __init__(self, verdict: Exception) -> None:
        self.verdict = verdict
        self.done = asyncio.Event()

    async def handle(self, ctx: OpContext, item: WorkItem) -> None:
        self.done.set()
        raise self.verdict


async def _verdict_run(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory, verdict: Exception
) -> tuple[WorkerLoop, WorkItem]:
    item = await _enqueue(container, tenant)
    loop = make_loop(handlers={PROBE_KIND: VerdictHandler(verdict)})
    assert await loop.claim_once(1) == (1, 0)
    for _ in range(100):
        row = await container.managers.work.get(tenant, item.id)
        if row.status is not WorkStatus.CLAIMED:
            return loop, row
        await asyncio.sleep(0.01)
    raise AssertionError("the verdict was not written")


async def test_a_permanent_failure_dead_letters_the_item_at_once_with_its_reason(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    loop, row = await _verdict_run(
        container, tenant, make_loop, PermanentFailure("order 17 does not exist")
    )
    assert row.attempts < row.max_attempts
    assert (row.status, row.last_error) == (
        WorkStatus.FAILED,
        "PermanentFailure: order 17 does not exist",
    )
    entries = await container.managers.audit.list_for(tenant, "work_item", row.id)
    (entry,) = [e for e in entries if e.action == "work.dead_lettered"]
    assert entry.detail["reason"] == "handler"
    assert sample(loop.metrics, "worker_items_dead_lettered_total", kind=KIND) == 1
    assert sample(loop.metrics, "worker_items_failed_total", kind=KIND) == 0


async def test_a_snooze_hands_the_item_back_for_later_without_spending_an_attempt(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    loop, row = await _verdict_run(container, tenant, make_loop, Snooze(60.0))
    assert (row.status, row.attempts, row.note, row.last_error) == (
        WorkStatus.AVAILABLE,
        0,
        "snoozed",
        None,
    )
    assert (row.available_at - row.updated_at).total_seconds() == pytest.approx(60.0, abs=1.0)
    assert await loop.claim_once(1) == (0, 0)  # not due for a minute
    assert sample(loop.metrics, "worker_items_snoozed_total", kind=KIND) == 1
    assert sample(loop.metrics, "worker_items_failed_total", kind=KIND) == 0


def test_a_snooze_refuses_a_negative_endless_or_overflowing_delay_naming_it() -> None:
    for delay in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"^delay_s: "):
            Snooze(delay)
    with pytest.raises(Invalid, match=r"past the year 9999"):
        Snooze(1e12)
