"""The loop contract: what every worker's loop does, run over that worker's own wiring.

`LoopContract` is a pytest test class. A worker's `tests/test_loop.py` subclasses it and
its `conftest.py` provides the `worker` fixture (its `WORKER`) beside the engine's
fixtures (`runtime.fixtures`); the engine's own tests run it over `testing.PROBE`. The
cases: claims stay within the capacity; the lease is renewed with the claim token while
the handler runs; a renewal refused with `Conflict` cancels the handler at once; a renewal
that times out is retried; half a lease without a successful renewal, by wall clock,
cancels the task; failed heartbeats pause claiming and a good beat resumes it; a stop
hands every item back with a note and marks the worker offline; the worker runs its kind
from its lane and leaves other lanes alone; its default capacity fits its default pool.

Test code only (it imports pytest); nothing here runs in production.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from acme.infra.cache import CacheInterface, CacheScope, CacheUnavailable
from acme.om.context import OpContext
from acme.om.errors import Conflict
from acme.om.work.types.work_item import WorkItem, WorkStatus
from acme.workers.runtime.container import RuntimeContainer
from acme.workers.runtime.loop import WorkerLoop
from acme.workers.runtime.state import liveness_key
from acme.workers.runtime.testing import (
    FakeClock,
    GateHandler,
    LoopFactory,
    Signal,
    make_settings,
    new_items,
    running,
    sample,
    sample_payload,
)
from acme.workers.runtime.worker import Worker


async def _enqueue(
    worker: Worker, container: RuntimeContainer, ctx: OpContext, count: int = 1
) -> list[WorkItem]:
    return await container.managers.work.enqueue_many(ctx, new_items(worker, ctx, count))


async def _statuses(
    worker: Worker, container: RuntimeContainer, ctx: OpContext
) -> list[WorkStatus]:
    items = await container.managers.work.list_items(ctx, kind=worker.kind, limit=100)
    return sorted(item.status for item in items)


def _lost(worker: Worker, loop: WorkerLoop, reason: str) -> float:
    return sample(loop.metrics, "worker_leases_lost_total", kind=worker.kind.value, reason=reason)


def replace_renewal(
    monkeypatch: pytest.MonkeyPatch, container: RuntimeContainer, attempt: Any
) -> Signal:
    """Route `extend_lease` through `attempt(n, original, ctx, item, lease)`; n counts from 1."""
    work = container.managers.work
    original = work.extend_lease
    calls = Signal()

    async def extend_lease(ctx: OpContext, item: WorkItem, lease: float) -> WorkItem:
        calls.bump()
        result: WorkItem = await attempt(calls.count, original, ctx, item, lease)
        return result

    monkeypatch.setattr(work, "extend_lease", extend_lease)
    return calls


class LoopContract:
    """The engine's loop contract; see the module docstring. Subclass it as `Test...`."""

    async def test_claims_no_more_than_its_capacity(
        self, worker: Worker, container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
    ) -> None:
        await _enqueue(worker, container, tenant, 5)
        handler = GateHandler()
        loop = make_loop(
            handlers={worker.kind: handler}, settings=make_settings(worker, capacity=2)
        )

        async with running(loop):
            await handler.started.reach(2)
            assert handler.started.count == 2
            assert (
                await _statuses(worker, container, tenant)
                == [WorkStatus.AVAILABLE] * 3 + [WorkStatus.CLAIMED] * 2
            )
            handler.gate.set()
            await handler.finished.reach(5)

        assert await _statuses(worker, container, tenant) == [WorkStatus.COMPLETED] * 5
        assert sample(loop.metrics, "worker_items_completed_total", kind=worker.kind.value) == 5

    async def test_the_lease_is_renewed_while_the_handler_runs(
        self,
        worker: Worker,
        container: RuntimeContainer,
        tenant: OpContext,
        make_loop: LoopFactory,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        (item,) = await _enqueue(worker, container, tenant)
        handler = GateHandler()
        clock = FakeClock()  # the fence's clock moves one interval per attempt, load or not

        async def renew(n: int, original: Any, ctx: OpContext, it: WorkItem, lease: float) -> Any:
            clock.advance(0.12)
            return await original(ctx, it, lease)

        renewals = replace_renewal(monkeypatch, container, renew)
        loop = make_loop(handlers={worker.kind: handler}, clock=clock)

        async with running(loop):
            await handler.started.reach(1)
            await renewals.reach(6)  # six renewals, 0.12 s apart: longer than one 0.6 s lease
            handler.gate.set()
            await handler.finished.reach(1)

        done = await container.managers.work.get(tenant, item.id)
        assert done.status == WorkStatus.COMPLETED
        assert done.attempts == 1
        assert _lost(worker, loop, "conflict") == 0
        succeeded = sample(loop.metrics, "worker_lease_renewals_total", kind=worker.kind.value)
        assert succeeded >= 6
        gaps = sample(
            loop.metrics, "worker_lease_renewal_gap_seconds_count", kind=worker.kind.value
        )
        assert gaps == succeeded  # one gap per success, the first measured from the start
        longest_bucket = sample(
            loop.metrics,
            "worker_lease_renewal_gap_seconds_bucket",
            kind=worker.kind.value,
            le="0.25",
        )
        assert longest_bucket == gaps  # every gap near the 0.12 s interval, none near 0.3 s

    async def test_a_renewal_refused_with_conflict_cancels_the_handler_at_once(
        self,
        worker: Worker,
        container: RuntimeContainer,
        tenant: OpContext,
        make_loop: LoopFactory,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        (item,) = await _enqueue(worker, container, tenant)
        handler = GateHandler()

        async def refuse(n: int, original: Any, ctx: OpContext, it: WorkItem, lease: float) -> Any:
            raise Conflict("another worker holds the item")

        renewals = replace_renewal(monkeypatch, container, refuse)
        loop = make_loop(handlers={worker.kind: handler})

        async with running(loop):
            await handler.cancelled.reach(1)
            assert renewals.count == 1  # definitive: never retried
            assert _lost(worker, loop, "conflict") == 1

        held = await container.managers.work.get(tenant, item.id)
        assert held.status == WorkStatus.CLAIMED  # nothing written: the item is someone else's now
        assert handler.finished.count == 0

    async def test_a_renewal_that_times_out_is_retried(
        self,
        worker: Worker,
        container: RuntimeContainer,
        tenant: OpContext,
        make_loop: LoopFactory,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        (item,) = await _enqueue(worker, container, tenant)
        handler = GateHandler()
        never = asyncio.Event()

        async def hang_once(
            n: int, original: Any, ctx: OpContext, it: WorkItem, lease: float
        ) -> Any:
            if n == 1:
                await never.wait()  # bounded by the loop at the renewal interval
            return await original(ctx, it, lease)

        renewals = replace_renewal(monkeypatch, container, hang_once)
        # The fence's clock stands still: what is tested is the retry after a timeout, and a
        # loaded machine that fires the timeout late must not fence the item instead.
        loop = make_loop(handlers={worker.kind: handler}, clock=FakeClock())

        async with running(loop):
            await renewals.reach(2)
            handler.gate.set()
            await handler.finished.reach(1)

        assert (await container.managers.work.get(tenant, item.id)).status == WorkStatus.COMPLETED
        assert (
            sample(loop.metrics, "worker_lease_renewals_failed_total", kind=worker.kind.value) == 1
        )
        assert handler.cancelled.count == 0

    async def test_half_a_lease_without_renewal_by_wall_clock_cancels_the_task(
        self,
        worker: Worker,
        container: RuntimeContainer,
        tenant: OpContext,
        make_loop: LoopFactory,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        (item,) = await _enqueue(worker, container, tenant)
        handler = GateHandler()
        clock = FakeClock()
        settings = make_settings(worker)

        async def fail(n: int, original: Any, ctx: OpContext, it: WorkItem, lease: float) -> Any:
            # The first failure comes early; before the second, the process "stalled" (a pause
            # of the VM, a GC): the wall clock jumped past half the lease.
            clock.advance(0.01 if n == 1 else settings.lease)
            raise OSError("database unreachable")

        renewals = replace_renewal(monkeypatch, container, fail)
        loop = make_loop(handlers={worker.kind: handler}, settings=settings, clock=clock)

        async with running(loop):
            await handler.cancelled.reach(1)
            assert renewals.count == 2  # the first failure was retried, the second fenced
            assert _lost(worker, loop, "unrenewed") == 1

        assert handler.finished.count == 0
        assert (await container.managers.work.get(tenant, item.id)).status != WorkStatus.COMPLETED

    async def test_heartbeat_failures_pause_claiming_and_a_good_beat_resumes_it(
        self,
        worker: Worker,
        container: RuntimeContainer,
        tenant: OpContext,
        make_loop: LoopFactory,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        cache: CacheInterface = container.infra.cache
        outage = asyncio.Event()
        outage.set()
        failures = Signal()
        original_set = cache.set

        async def flaky_set(scope: CacheScope, key: str, value: str, *, ttl: float) -> None:
            if outage.is_set():
                failures.bump()
                raise CacheUnavailable("redis is gone")
            await original_set(scope, key, value, ttl=ttl)

        monkeypatch.setattr(cache, "set", flaky_set)
        claims = Signal()
        work = container.managers.work
        original_claim_many = work.claim_many

        async def counted_claim_many(*args: Any, **kwargs: Any) -> Any:
            claims.bump()
            return await original_claim_many(*args, **kwargs)

        monkeypatch.setattr(work, "claim_many", counted_claim_many)
        handler = GateHandler()
        handler.gate.set()
        loop = make_loop(handlers={worker.kind: handler})

        async with running(loop):
            # A failed beat tries twice (the second on the pool's next connection): the
            # fifth try is the third beat's first, so two beats have failed.
            await failures.reach(5)
            assert not loop.state.healthy
            await _enqueue(worker, container, tenant)
            paused_at = claims.count
            await failures.reach(failures.count + 6)  # three more beats, each a poll interval
            assert claims.count == paused_at
            assert handler.started.count == 0

            outage.clear()
            await handler.finished.reach(1)
            assert loop.state.heartbeat_failures == 0  # healthy again: claiming resumed

        assert await _statuses(worker, container, tenant) == [WorkStatus.COMPLETED]
        assert sample(loop.metrics, "worker_heartbeat_failures_total") >= 5

    async def test_stop_hands_every_item_back_with_a_note_and_marks_the_worker_offline(
        self, worker: Worker, container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
    ) -> None:
        await _enqueue(worker, container, tenant, 2)
        handler = GateHandler()
        loop = make_loop(handlers={worker.kind: handler})

        async with running(loop) as task:
            await handler.started.reach(2)
            assert await container.infra.cache.get(
                CacheScope.WORKER_LIVENESS, liveness_key(loop.worker_id)
            )
            loop.stop()
            await task

        assert handler.cancelled.count == 2
        items = await container.managers.work.list_items(tenant, kind=worker.kind)
        assert [item.status for item in items] == [WorkStatus.AVAILABLE] * 2
        assert all(item.note and "draining" in item.note for item in items)
        assert all(item.attempts == 0 for item in items)  # a drain gives the attempt back
        assert (
            await container.infra.cache.get(
                CacheScope.WORKER_LIVENESS, liveness_key(loop.worker_id)
            )
            is None
        )
        assert (
            sample(
                loop.metrics, "worker_items_released_total", kind=worker.kind.value, reason="drain"
            )
            == 2
        )

    async def test_it_runs_its_kind_from_its_lane_and_no_other_lane(
        self, worker: Worker, container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
    ) -> None:
        assert worker.kind in container.handlers
        lanes = (worker.settings().lane, "another_lane")
        items = [
            WorkItem.new(
                org_id=tenant.org_id, kind=worker.kind, payload=sample_payload(), lane=lane
            )
            for lane in lanes
        ]
        mine, other = await container.managers.work.enqueue_many(tenant, items)
        loop = make_loop()
        assert await loop.claim_once(loop.settings.capacity) == (1, 0)  # its lane's item alone
        await asyncio.gather(*(t for t in asyncio.all_tasks() if t.get_name() == f"item-{mine.id}"))
        await loop.flush_completions()
        assert (await container.managers.work.get(tenant, mine.id)).status == WorkStatus.COMPLETED
        assert (await container.managers.work.get(tenant, other.id)).status == WorkStatus.AVAILABLE

    def test_its_schedules_run_with_its_default_settings(self, worker: Worker) -> None:
        """A malformed expression, an unknown zone, a payload the kind refuses or a
        catch-up horizon past the retention would stop `serve` at start."""
        assert worker.schedule_problem(worker.settings()) is None

    def test_its_default_capacity_fits_its_default_pool(self, worker: Worker) -> None:
        settings = worker.settings()
        assert settings.serving_problem() is None, settings.serving_problem()
