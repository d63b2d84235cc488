"""The loop over the memory container: the loop contract (`runtime.contract`) over the probe
worker, and what the engine does beyond it: spans, completions, the sweep, hooks.

The sweep's gauge of the oldest snapshot runs on the real PostgreSQL (the last test).

An item of a kind without a handler is released, never failed. Renewals are forced to fail
by replacing `extend_lease` on the real work manager; time-based fencing runs on a
`FakeClock`, so a jump of the wall clock is a test's decision, not a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast
from uuid import UUID, uuid4

import asyncpg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY, CollectorRegistry
from sqlalchemy.engine import make_url
from work_fixtures import stored_row

from acme.infra.cache import CacheScope
from acme.infra.container import Infra
from acme.om.context import OpContext, RequestContext
from acme.om.storage.impl.sql import SqlStorageRoot
from acme.om.work import WorkManagerInterface
from acme.om.work.metrics import default_metrics
from acme.om.work.storage.impl.memory import MemoryWorkStorage
from acme.om.work.types.handler import WorkHandlerInterface
from acme.om.work.types.policy import KindPolicy
from acme.om.work.types.work_item import WorkItem, WorkStatus
from acme.workers.runtime.container import RuntimeContainer
from acme.workers.runtime.contract import LoopContract
from acme.workers.runtime.errors import failure_text
from acme.workers.runtime.loop import ItemHooks, WorkerLoop
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.queue_stats import (
    OUTBOX_FAILING_AFTER,
    QUEUE_STATS_EVENT,
    QUEUE_STATS_FIELDS,
)
from acme.workers.runtime.state import LoopState
from acme.workers.runtime.sweep import RESUME_LIMIT, Sweep
from acme.workers.runtime.testing import (
    APP,
    PROBE,
    PROBE_KIND,
    FakeClock,
    GateHandler,
    LoopFactory,
    ProbeContainer,
    Signal,
    make_settings,
    new_items,
    running,
    sample,
)
from acme.workers.runtime.watch import EventLoopWatch

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def _enqueue(container: RuntimeContainer, ctx: OpContext, count: int = 1) -> list[WorkItem]:
    return await container.managers.work.enqueue_many(ctx, new_items(PROBE, ctx, count))


async def _statuses(container: RuntimeContainer, ctx: OpContext) -> list[WorkStatus]:
    items = await container.managers.work.list_items(ctx, kind=PROBE_KIND, limit=100)
    return sorted(item.status for item in items)


def _sweep(loop: WorkerLoop) -> Sweep:
    """The sweep `loop` runs (every loop `make_loop` builds has one)."""
    assert loop.sweep is not None
    return loop.sweep


def _lost(loop: WorkerLoop, reason: str) -> float:
    return sample(loop.metrics, "worker_leases_lost_total", kind=PROBE_KIND.value, reason=reason)


def _replace_renewal(
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


class TestLoopContract(LoopContract):
    """The engine's loop contract over the probe worker (`testing.PROBE`)."""


async def test_the_loop_claims_and_completes_by_polling_with_no_sweep_and_no_wake_ups(
    container: RuntimeContainer, tenant: OpContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep and the wake-up subscription are the loop's collaborators, not its parts:
    a loop built without them claims what is enqueued after its first claim (found by the
    poll alone), completes it, and starts neither task nor wake-up gauge."""
    work = container.managers.work
    original = work.claim_many
    claims = Signal()

    async def counted(*args: Any, **kwargs: Any) -> Any:
        claims.bump()
        return await original(*args, **kwargs)

    monkeypatch.setattr(work, "claim_many", counted)
    handler = GateHandler()
    handler.gate.set()
    loop = WorkerLoop(
        settings=make_settings(PROBE),
        work=work,
        handlers={PROBE_KIND: handler},
        cache=container.infra.cache,
        metrics=WorkerMetrics(CollectorRegistry()),
    )
    assert (loop.sweep, loop.wake_ups) == (None, None)

    async with running(loop):
        await claims.reach(1)  # the lane was empty: only the poll claims again
        await _enqueue(container, tenant, 3)
        await handler.finished.reach(3)
        await loop.flush_completions()
        names = {task.get_name() for task in asyncio.all_tasks()}

    assert await _statuses(container, tenant) == [WorkStatus.COMPLETED] * 3
    assert claims.count >= 2
    assert not names & {"sweep", "wake-ups"}
    assert {"heartbeat", "event-loop-watch"} <= names
    up = loop.metrics.registry.get_sample_value("worker_wake_up_channel_up", {"channel": "topic"})
    assert up is None


def _block(seconds: float) -> None:
    """What a handler calling blocking code does to the event loop."""
    time.sleep(seconds)


async def test_a_blocked_event_loop_is_said_once_naming_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handler calling `time.sleep` blocks every claim and renewal: the watch says so
    once per block, and nothing while the loop runs freely."""
    watch = asyncio.create_task(EventLoopWatch().run())
    with caplog.at_level(logging.WARNING):
        await asyncio.sleep(0.6)  # running freely: nothing said
        _block(1.3)
        await asyncio.sleep(0.6)
    watch.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watch

    said = [r.getMessage() for r in caplog.records if "event loop was blocked" in r.getMessage()]
    assert len(said) == 1, said
    assert re.match(r"the event loop was blocked for 1\.\d s: ", said[0]), said[0]
    assert "asyncio.to_thread" in said[0]


async def test_the_gap_between_successful_renewals_spans_the_failures_between(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await _enqueue(container, tenant)
    handler = GateHandler()
    clock = FakeClock()

    async def renew(n: int, original: Any, ctx: OpContext, it: WorkItem, lease: float) -> Any:
        clock.advance(0.12)  # each attempt a renewal interval after the one before
        if n in (2, 3):
            raise ConnectionError("the database went away")
        return await original(ctx, it, lease)

    renewals = _replace_renewal(monkeypatch, container, renew)
    loop = make_loop(handlers={PROBE_KIND: handler}, clock=clock)

    async with running(loop):
        await handler.started.reach(1)
        # The fifth attempt starts only after the fourth's success is recorded (renewals of
        # one item follow one another): no fixed pause, which a loaded machine outruns.
        await renewals.reach(5)
        handler.gate.set()
        await handler.finished.reach(1)

    kind = PROBE_KIND.value
    assert sample(loop.metrics, "worker_lease_renewals_failed_total", kind=kind) == 2
    assert sample(loop.metrics, "worker_lease_renewals_total", kind=kind) >= 2
    # The gap that spans the two failures is three intervals (0.36 s): above 0.25 s.
    assert sample(loop.metrics, "worker_lease_renewal_gap_seconds_bucket", kind=kind, le="0.25") < (
        sample(loop.metrics, "worker_lease_renewal_gap_seconds_count", kind=kind)
    )


async def test_claims_that_keep_failing_are_counted_and_fail_healthz_until_one_succeeds(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = asyncio.Event()
    outage.set()
    failures = Signal()
    work = container.managers.work
    original_claim_many = work.claim_many

    async def flaky_claim_many(*args: Any, **kwargs: Any) -> Any:
        if outage.is_set():
            failures.bump()
            raise OSError("connection refused")
        return await original_claim_many(*args, **kwargs)

    monkeypatch.setattr(work, "claim_many", flaky_claim_many)
    handler = GateHandler()
    handler.gate.set()
    loop = make_loop(handlers={PROBE_KIND: handler})  # poll 0.05 s: unhealthy after 0.15 s
    assert loop.state.claim_failure_limit_s == pytest.approx(0.15)

    def reason() -> str | None:
        return loop.state.unhealthy_reason

    with caplog.at_level(logging.INFO):
        async with running(loop):
            await failures.reach(6)
            assert (reason() or "").startswith("every claim failed for ")
            assert sample(loop.metrics, "worker_claim_failures_total") >= 6

            outage.clear()
            await _enqueue(container, tenant)
            await handler.finished.reach(1)
            assert reason() is None
            assert loop.state.claim_failures == 0

    assert "claims succeed again after" in caplog.text
    # One traceback for the run of failures; each later failure is one line.
    failed = [r for r in caplog.records if r.getMessage().startswith("claim failed")]
    assert [r.exc_info is not None for r in failed[:2]] == [True, False]
    assert sum(r.exc_info is not None for r in failed) == 1
    assert failed[1].getMessage() == "claim failed again (2 in a row): OSError: connection refused"


async def test_a_stop_during_a_claim_stuck_in_the_database_drains_within_the_deadline(
    container: RuntimeContainer,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A claim that never returns (a lock it waits on, a connection that stopped answering)
    is given a bounded grace after `stop()`, then cancelled, and the drain runs: `run()`
    returns within `drain_deadline` instead of waiting on the claim."""
    entered = Signal()
    cancelled = asyncio.Event()

    async def stuck_claim_many(*args: Any, **kwargs: Any) -> Any:
        entered.bump()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    monkeypatch.setattr(container.managers.work, "claim_many", stuck_claim_many)
    loop = make_loop(settings=make_settings(PROBE, drain_deadline=2.0))
    task = asyncio.create_task(loop.run())
    await entered.reach(1)
    began = time.monotonic()

    with caplog.at_level(logging.WARNING):
        loop.stop()
        async with asyncio.timeout(2.0):
            await task

    assert cancelled.is_set()
    assert time.monotonic() - began < 2.0
    assert "the claim in progress did not return within 0.5 s of the stop" in caplog.text


def test_healthz_fails_only_once_claims_have_failed_for_the_limit() -> None:
    state = LoopState(heartbeat_failure_limit=3, claim_failure_limit_s=6.0)
    assert state.healthy
    state.claim_failures = 3
    state.claims_failing_since = time.monotonic() - 5.0
    assert state.healthy
    state.claims_failing_since = time.monotonic() - 7.0
    assert state.unhealthy_reason == (
        f"every claim failed for {state.claims_failing_s():.1f} s (3 in a row)"
    )
    state.heartbeat_failures = 3  # the heartbeat's reason comes first
    assert state.unhealthy_reason == "heartbeat failed 3 times in a row: claiming paused"


async def test_a_beat_whose_key_reads_back_wrong_is_a_failure(
    container: RuntimeContainer, make_loop: LoopFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = container.infra.cache

    async def lost(scope: CacheScope, key: str) -> str | None:
        return None  # written, then evicted: the beat did not land

    monkeypatch.setattr(cache, "get", lost)
    loop = make_loop()

    assert await loop.heartbeat.beat_once() is False
    assert loop.state.heartbeat_failures == 1


async def test_a_beat_on_a_stale_connection_is_tried_once_more_and_a_dead_cache_fails_once(
    container: RuntimeContainer, make_loop: LoopFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After a Redis restart the first use of each connection pooled before it fails: the
    # beat tries once more at once, so /healthz does not wait another interval for Redis.
    cache = container.infra.cache
    real_set = cache.set
    calls: list[str] = []
    down = {"stale": 1, "dead": 0}

    async def flaky(*args: Any, **kwargs: Any) -> None:
        calls.append("set")
        if down["dead"] or down["stale"]:
            down["stale"] = max(down["stale"] - 1, 0)
            raise ConnectionError("Connection closed by server.")
        await real_set(*args, **kwargs)

    monkeypatch.setattr(cache, "set", flaky)
    loop = make_loop()

    assert await loop.heartbeat.beat_once() is True  # the stale connection, then a good one
    assert (len(calls), loop.state.heartbeat_failures) == (2, 0)
    down["dead"] = 1
    assert await loop.heartbeat.beat_once() is False  # Redis down: both tries fail, one failed beat
    assert (len(calls), loop.state.heartbeat_failures) == (4, 1)


async def test_a_beat_that_hangs_is_cut_off_and_the_next_starts_on_time(
    container: RuntimeContainer, make_loop: LoopFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Beats start every interval, start to start: a hanging beat (Redis unreachable) is
    # cut off at the interval and the next begins at once, not one more interval later.
    interval = 0.5
    starts: list[float] = []
    beats = Signal()

    async def hang(*args: object, **kwargs: object) -> None:
        starts.append(time.monotonic())
        beats.bump()
        await asyncio.Event().wait()

    monkeypatch.setattr(container.infra.cache, "set", hang)
    loop = make_loop(settings=make_settings(PROBE, heartbeat_interval=interval))
    async with running(loop):
        await beats.reach(4, within=10.0)

    gaps = sorted(b - a for a, b in itertools.pairwise(starts))
    assert gaps[len(gaps) // 2] < 1.5 * interval, gaps  # waiting after the cut-off: 2 intervals
    assert loop.state.heartbeat_failures >= 3


async def test_a_drain_whose_hand_back_fails_says_so_and_counts_only_what_went_back(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await _enqueue(container, tenant, 2)
    handler = GateHandler()
    loop = make_loop(handlers={PROBE_KIND: handler})

    async def release(ctx: OpContext, item: WorkItem, note: str | None = None) -> WorkItem:
        raise ConnectionError("the database went away")

    async with running(loop) as task:
        await handler.started.reach(2)
        monkeypatch.setattr(container.managers.work, "release", release)
        with caplog.at_level(logging.INFO):
            loop.stop()
            await task

    assert "could not hand back 2 item(s) (ConnectionError)" in caplog.text
    assert "drained: 0 item(s) handed back" in caplog.text
    assert await _statuses(container, tenant) == [WorkStatus.CLAIMED] * 2  # the sweep's now


async def test_an_item_of_a_kind_without_a_handler_is_released_not_failed(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
) -> None:
    (item,) = await _enqueue(container, tenant)
    loop = make_loop(handlers={}, kinds=[PROBE_KIND])

    async with running(loop):
        released = await loop.claim_once(1)

    assert released == (1, 1)
    back = await container.managers.work.get(tenant, item.id)
    assert back.status == WorkStatus.AVAILABLE
    assert back.last_error is None
    assert back.note is not None
    assert "not handled" in back.note
    assert back.attempts == 0


async def test_a_handler_past_its_kind_timeout_fails_the_attempt(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    (item,) = await _enqueue(container, tenant)
    handler = GateHandler()  # never opened: runs until the timeout
    work = container.managers.work
    original_fail = work.fail
    failures = Signal()

    async def fail(ctx: OpContext, it: WorkItem, error: str) -> WorkItem:
        result = await original_fail(ctx, it, error)
        failures.bump()
        return result

    monkeypatch.setattr(work, "fail", fail)
    loop = make_loop(handlers={PROBE_KIND: handler}, policies={PROBE_KIND: KindPolicy(timeout=0.1)})

    with caplog.at_level(logging.WARNING):
        async with running(loop):
            await handler.cancelled.reach(1)
            await failures.reach(1)

    failed = await container.managers.work.get(tenant, item.id)
    assert failed.status == WorkStatus.AVAILABLE  # requeued with a backoff, not dead
    assert failed.last_error == "handler timed out after 0.1 s"
    # The log line says why, as the row does: an operator reads it without a query.
    (line,) = [r for r in caplog.records if r.getMessage().startswith("attempt failed")]
    assert getattr(line, "error", None) == "handler timed out after 0.1 s"
    assert sample(loop.metrics, "worker_items_failed_total", kind=PROBE_KIND.value) == 1


async def test_a_timeout_the_handler_raises_itself_keeps_its_own_message(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (item,) = await _enqueue(container, tenant)
    work = container.managers.work
    original_fail = work.fail
    failures = Signal()

    async def fail(ctx: OpContext, it: WorkItem, error: str) -> WorkItem:
        result = await original_fail(ctx, it, error)
        failures.bump()
        return result

    class UpstreamTimeout(WorkHandlerInterface):
        async def handle(self, ctx: OpContext, item: WorkItem) -> None:
            raise TimeoutError("upstream read timed out after 5 s")

    monkeypatch.setattr(work, "fail", fail)
    loop = make_loop(handlers={PROBE_KIND: UpstreamTimeout()})

    async with running(loop):
        await failures.reach(1)

    failed = await container.managers.work.get(tenant, item.id)
    assert (failed.last_error or "").splitlines()[0] == (
        "TimeoutError: upstream read timed out after 5 s"
    )


def _sku(payload: dict[str, Any]) -> object:
    return payload["sku"]  # a user's helper below the handler: KeyError 'sku'


def _price(payload: dict[str, Any]) -> object:
    return _sku(payload)


class _DeepKeyError(WorkHandlerInterface):
    async def handle(self, ctx: OpContext, item: WorkItem) -> None:
        _price(item.payload)


async def test_a_failed_attempt_logs_its_traceback_and_the_row_keeps_the_innermost_frames(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One line per failed attempt, with the traceback, at its outcome's level (WARNING when
    requeued, ERROR when dead-lettered); `last_error` keeps `Type: message` and the frames
    down to the helper that raised, within the stored limit."""
    work = container.managers.work
    retried, doomed = new_items(PROBE, tenant, 2)
    (retried,) = await work.enqueue_many(tenant, [retried])
    loop = make_loop(handlers={PROBE_KIND: _DeepKeyError()})
    with caplog.at_level(logging.INFO):
        await _run_one(loop, retried)
        (doomed,) = await work.enqueue_many(tenant, [doomed.model_copy(update={"max_attempts": 1})])
        await _run_one(loop, doomed)

    here = f"{__file__}"
    for item_id, level, message in (
        (retried.id, logging.WARNING, "attempt failed; requeued"),
        (doomed.id, logging.ERROR, "dead-lettered"),
    ):
        lines = [r for r in caplog.records if getattr(r, "item_id", None) == str(item_id)]
        (line,) = [r for r in lines if r.exc_info is not None]
        assert (line.levelno, line.getMessage().split(" item_id=")[0]) == (level, message)
        assert getattr(line, "error", None) == "KeyError: 'sku'"
        shown = logging.Formatter().format(line)
        assert f'File "{here}", line ' in shown
        assert "in _sku" in shown
        assert 'return payload["sku"]' in shown
        stored = (await work.get(tenant, item_id)).last_error or ""
        assert stored.splitlines()[0] == "KeyError: 'sku'"
        assert f'File "{here}", line {_sku.__code__.co_firstlineno + 1}, in _sku' in stored
        assert stored.index("in _price") < stored.index("in _sku")  # innermost last


def test_a_long_traceback_keeps_its_innermost_frames_within_the_limit() -> None:
    def dive(depth: int) -> None:
        if depth == 0:
            raise ValueError("bottom\x00")
        dive(depth - 1)

    with pytest.raises(ValueError, match="bottom") as caught:
        dive(50)
    text = failure_text(caught.value, 400)
    assert len(text) <= 400
    lines = text.splitlines()
    assert lines[:2] == ["ValueError: bottom\\x00", "Traceback (innermost last):"]
    assert re.fullmatch(r"  \.\.\. \d+ outer frame\(s\) omitted", lines[2])
    assert lines[-1] == '    raise ValueError("bottom\\x00")'


@pytest.mark.parametrize(
    ("raised", "recorded"),
    [
        (SystemExit(3), "SystemExit: 3"),
        (KeyboardInterrupt(), "KeyboardInterrupt: "),
        (asyncio.CancelledError("inner call cancelled"), "CancelledError: inner call cancelled"),
    ],
)
async def test_what_a_handler_raises_beyond_an_exception_fails_its_attempt_and_nothing_else(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    raised: BaseException,
    recorded: str,
) -> None:
    """A handler that raises SystemExit or KeyboardInterrupt, or a CancelledError nobody
    asked for, fails its own attempt; the process, and the items beside it, run on."""
    poison, other = await _enqueue(container, tenant, 2)
    work = container.managers.work
    original_fail = work.fail
    failures = Signal()
    completed = Signal()

    async def fail(ctx: OpContext, it: WorkItem, error: str) -> WorkItem:
        result = await original_fail(ctx, it, error)
        failures.bump()
        return result

    class Raising(WorkHandlerInterface):
        async def handle(self, ctx: OpContext, item: WorkItem) -> None:
            if item.id == poison.id:
                await asyncio.sleep(0)
                raise raised
            completed.bump()

    monkeypatch.setattr(work, "fail", fail)
    loop = make_loop(handlers={PROBE_KIND: Raising()})

    with caplog.at_level(logging.WARNING):
        async with running(loop):
            await failures.reach(1)
            await completed.reach(1)
            await loop.flush_completions()

    failed = await work.get(tenant, poison.id)
    assert failed.status == WorkStatus.AVAILABLE  # requeued with a backoff, its attempt spent
    assert failed.attempts == 1
    assert (failed.last_error or "").splitlines()[0] == recorded
    assert (await work.get(tenant, other.id)).status == WorkStatus.COMPLETED
    assert sample(loop.metrics, "worker_items_failed_total", kind=PROBE_KIND.value) == 1
    if not isinstance(raised, Exception):
        (line,) = [r for r in caplog.records if "which is not an Exception" in r.getMessage()]
        assert line.levelno == logging.ERROR


async def test_a_handler_that_outlives_its_timeout_by_catching_it_completes_with_a_warning(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    (item,) = await _enqueue(container, tenant)
    finished = Signal()

    class Stubborn(WorkHandlerInterface):
        async def handle(self, ctx: OpContext, item: WorkItem) -> None:
            with contextlib.suppress(asyncio.CancelledError):  # a handler must not do this
                await asyncio.sleep(5)
            finished.bump()

    loop = make_loop(
        handlers={PROBE_KIND: Stubborn()}, policies={PROBE_KIND: KindPolicy(timeout=0.1)}
    )
    with caplog.at_level(logging.WARNING):
        async with running(loop):
            await finished.reach(1)
            await loop.flush_completions()

    assert (await container.managers.work.get(tenant, item.id)).status == WorkStatus.COMPLETED
    assert [r for r in caplog.records if "returned after its timeout of 0.1 s" in r.getMessage()]


async def test_a_failure_the_store_refuses_is_recorded_plainly_not_left_claimed(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (item,) = await _enqueue(container, tenant)
    work = container.managers.work
    original_fail = work.fail
    calls, recorded = Signal(), Signal()

    async def fail(ctx: OpContext, it: WorkItem, error: str) -> WorkItem:
        calls.bump()
        if calls.count == 1:
            raise RuntimeError("the store refused the text")
        result = await original_fail(ctx, it, error)
        recorded.bump()
        return result

    class Broken(WorkHandlerInterface):
        async def handle(self, ctx: OpContext, item: WorkItem) -> None:
            raise ValueError("bad input")

    monkeypatch.setattr(work, "fail", fail)
    loop = make_loop(handlers={PROBE_KIND: Broken()})

    async with running(loop):
        await recorded.reach(1)

    failed = await work.get(tenant, item.id)
    assert failed.status == WorkStatus.AVAILABLE  # requeued with a backoff, not held
    assert failed.last_error == (
        "ValueError (its message could not be stored: RuntimeError('the store refused the text'))"
    )


class _CountedCompletions:
    """The work manager, counting `complete_many` calls and the items each carried."""

    def __init__(self, inner: WorkManagerInterface) -> None:
        self._inner = inner
        self.batches: list[int] = []

    async def complete_many(self, held: Sequence[tuple[OpContext, WorkItem]]) -> set[UUID]:
        self.batches.append(len(held))
        return await self._inner.complete_many(held)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_completions_that_gather_are_written_together(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    await _enqueue(container, tenant, 6)
    handler = GateHandler()
    work = _CountedCompletions(container.managers.work)
    loop = make_loop(
        handlers={PROBE_KIND: handler},
        settings=make_settings(PROBE, capacity=6),
        work=cast(WorkManagerInterface, work),
    )

    assert await loop.claim_once(6) == (6, 0)
    await handler.started.reach(6)
    handler.gate.set()
    await handler.finished.reach(6)
    await loop.flush_completions()

    assert await _statuses(container, tenant) == [WorkStatus.COMPLETED] * 6
    assert sum(work.batches) == 6
    assert len(work.batches) < 6  # the six finished together: fewer statements than items
    assert sample(loop.metrics, "worker_items_completed_total", kind=PROBE_KIND.value) == 6


async def test_completions_of_several_tenants_that_gather_are_one_write(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    """Items of two tenants that finish together complete in one `complete_many` (one
    statement: docs/decisions/0054), not one per tenant."""
    rctx = RequestContext.new(APP)
    org = await container.managers.tenancy.create_org(rctx, "second tenant")
    other = await container.managers.tenancy.service_context(
        rctx, org_id=org.id, acting_for=uuid4(), caused_by_request_id=None
    )
    await _enqueue(container, tenant, 2)
    await _enqueue(container, other, 2)
    handler = GateHandler()
    work = _CountedCompletions(container.managers.work)
    loop = make_loop(
        handlers={PROBE_KIND: handler},
        settings=make_settings(PROBE, capacity=4),
        work=cast(WorkManagerInterface, work),
    )

    assert await loop.claim_once(4) == (4, 0)
    await handler.started.reach(4)
    handler.gate.set()
    await handler.finished.reach(4)
    await loop.flush_completions()

    assert await _statuses(container, tenant) == [WorkStatus.COMPLETED] * 2
    assert await _statuses(container, other) == [WorkStatus.COMPLETED] * 2
    assert work.batches == [4]  # finished together: one write for both tenants


class _CountedClaims:
    """The work manager, recording how many items each `claim_many` returned."""

    def __init__(self, inner: WorkManagerInterface) -> None:
        self._inner = inner
        self.returned: list[int] = []
        self.calls = Signal()

    async def claim_many(self, *args: Any, **kwargs: Any) -> list[tuple[OpContext, WorkItem]]:
        pairs = await self._inner.claim_many(*args, **kwargs)
        self.returned.append(len(pairs))
        self.calls.bump()
        return pairs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def _settled(loop: WorkerLoop, work: _CountedClaims) -> None:
    """Wait until the loop has made the claims its start and its subscription to wake-ups
    called for (each finds the lane empty); the subscription is up by then."""
    await work.calls.reach(1)
    await asyncio.sleep(0.1)
    assert loop.state.wake_ups_up


async def test_a_claim_that_finds_the_lane_empty_is_not_repeated_for_each_freed_slot(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    # An idle worker claims once per wake-up: the slot its item frees and the completion
    # written for it claim nothing more, since that claim found the lane empty.
    handler = GateHandler()
    handler.gate.set()
    work = _CountedClaims(container.managers.work)
    loop = make_loop(
        handlers={PROBE_KIND: handler},
        settings=make_settings(PROBE, capacity=4, poll_interval=30.0, lease=60.0),
        work=cast(WorkManagerInterface, work),
    )

    async with running(loop):
        await _settled(loop, work)
        before = len(work.returned)
        for n in (1, 2):
            await _enqueue(container, tenant)
            await handler.finished.reach(n)
            await loop.flush_completions()
            await asyncio.sleep(0.1)  # room for any claim a freed slot or a flush would start
            assert work.returned[before:] == [1] * n

    assert await _statuses(container, tenant) == [WorkStatus.COMPLETED] * 2


async def test_a_backlog_a_poll_finds_drains_as_slots_free_not_poll_by_poll(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    # Items that become due with no wake-up (here: a delay) are found by the poll; a claim
    # that fills every free slot says the lane may hold more, so each freed slot claims
    # again at once, and the backlog does not wait a poll interval per batch.
    handler = GateHandler()
    handler.gate.set()
    work = _CountedClaims(container.managers.work)
    poll_s = 3.0
    loop = make_loop(
        handlers={PROBE_KIND: handler},
        settings=make_settings(PROBE, capacity=2, poll_interval=poll_s, lease=60.0),
        work=cast(WorkManagerInterface, work),
    )

    async with running(loop):
        await _settled(loop, work)
        await container.managers.work.enqueue_many(tenant, new_items(PROBE, tenant, 6, delay=0.2))
        await handler.finished.reach(2, within=poll_s + 2.0)  # the poll found the first two
        await handler.finished.reach(6, within=poll_s / 2)  # the rest without another poll

    assert await _statuses(container, tenant) == [WorkStatus.COMPLETED] * 6
    assert sorted(n for n in work.returned if n)[-1] == 2  # claimed at most two at a time


class _SlowClaims(_CountedClaims):
    """Claims that each take 5 ms, far longer than the handlers they feed."""

    async def claim_many(self, *args: Any, **kwargs: Any) -> list[tuple[OpContext, WorkItem]]:
        await asyncio.sleep(0.005)
        return await super().claim_many(*args, **kwargs)


class _Staggered(WorkHandlerInterface):
    """Ends every other item a millisecond after the rest: its slots free out of phase."""

    def __init__(self) -> None:
        self.finished = Signal()
        self._started = itertools.count()

    async def handle(self, ctx: OpContext, item: WorkItem) -> None:
        if next(self._started) % 2:
            await asyncio.sleep(0.001)
        self.finished.bump()


async def test_handlers_shorter_than_the_claim_refill_their_slots_together(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    # Slots that free a millisecond apart on a busy lane wait for each other (at most
    # 2 ms) and are claimed in one statement, not two: with every claim refilling half the
    # slots, the worker would pay a claim and a completion per two items for good.
    handler = _Staggered()
    work = _SlowClaims(container.managers.work)
    await container.managers.work.enqueue_many(tenant, new_items(PROBE, tenant, 40))
    loop = make_loop(
        handlers={PROBE_KIND: handler},
        settings=make_settings(PROBE, capacity=4, poll_interval=30.0, lease=60.0),
        work=cast(WorkManagerInterface, work),
    )

    async with running(loop):
        await handler.finished.reach(40)

    full = [n for n in work.returned if n]
    assert sum(full) == 40
    assert full.count(4) >= 8, full  # of 10 claims; each a pair of 2 without the wait


async def test_items_a_sweep_hands_back_are_claimed_without_waiting_for_the_poll(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    # A requeue of stale leases is an UPDATE, which no insert trigger sees: the hand-back
    # wakes the workers itself, this loop (which found the lane empty before) among them.
    handler = GateHandler()
    handler.gate.set()
    work = _CountedClaims(container.managers.work)
    loop = make_loop(
        handlers={PROBE_KIND: handler},
        settings=make_settings(PROBE, capacity=2, poll_interval=30.0, lease=60.0),
        work=cast(WorkManagerInterface, work),
    )

    async with running(loop):
        await _settled(loop, work)
        (item,) = await _enqueue(container, tenant)
        await handler.finished.reach(1)
        await loop.flush_completions()
        # Another worker claims the next item and dies; its lease passes. The item is due
        # only after the wake-up its enqueue sent, so our loop's claim finds nothing.
        (stale,) = await container.managers.work.enqueue_many(
            tenant, new_items(PROBE, tenant, delay=0.2)
        )
        await asyncio.sleep(0.3)
        pairs = await container.managers.work.claim_many(
            RequestContext.new(APP), loop.settings.lane, [PROBE_KIND], "gone", lease=0.05, limit=1
        )
        assert [i.id for _, i in pairs] == [stale.id]
        await asyncio.sleep(0.1)
        assert (await _sweep(loop).sweep_once()).get("requeue_stale") == 1
        await handler.finished.reach(2, within=2.0)

    assert handler.items == [item.id, stale.id]


async def test_a_queued_completion_whose_lease_was_lost_is_refused_and_counted(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    (item,) = await _enqueue(container, tenant)
    handler = GateHandler()
    loop = make_loop(handlers={PROBE_KIND: handler})

    assert await loop.claim_once(1) == (1, 0)
    await handler.started.reach(1)
    # The item changes hands while our handler runs (as after a lost lease and a sweep):
    # handed back under our token, then claimed by another worker under a new one.
    work = container.managers.work
    await work.release(tenant, await work.get(tenant, item.id), note="taken over")
    again = await work.claim(
        RequestContext.new(APP), loop.settings.lane, [PROBE_KIND], "other", 30.0
    )
    assert again is not None
    handler.gate.set()
    await handler.finished.reach(1)
    await loop.flush_completions()

    held = await work.get(tenant, item.id)
    assert held.status == WorkStatus.CLAIMED
    assert held.claimed_by == "other"
    assert _lost(loop, "conflict") == 1
    assert sample(loop.metrics, "worker_items_completed_total", kind=PROBE_KIND.value) == 0


async def test_stop_writes_the_completions_already_queued(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    await _enqueue(container, tenant, 3)
    handler = GateHandler()
    handler.gate.set()
    loop = make_loop(handlers={PROBE_KIND: handler}, settings=make_settings(PROBE, capacity=3))

    async with running(loop) as task:
        await handler.finished.reach(3)
        loop.stop()
        await task

    assert await _statuses(container, tenant) == [WorkStatus.COMPLETED] * 3
    assert (
        sample(loop.metrics, "worker_items_released_total", kind=PROBE_KIND.value, reason="drain")
        == 0
    )


async def test_the_item_span_links_to_the_causing_trace_and_has_no_parent(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    (item,) = await container.managers.work.enqueue_many(tenant, new_items(PROBE, tenant))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    handler = GateHandler()
    handler.gate.set()
    work = _Traced(container.managers.work, TRACEPARENT)
    loop = make_loop(
        handlers={PROBE_KIND: handler},
        tracer=provider.get_tracer("test"),
        work=cast(WorkManagerInterface, work),
    )

    await loop.claim_once(1)
    await work.completed.reach(1)  # the span ends before the completion is written

    (span,) = exporter.get_finished_spans()
    assert span.parent is None
    assert [link.context.trace_id for link in span.links] == [int(TRACEPARENT[3:35], 16)]
    assert span.attributes is not None
    assert span.attributes["work.item_id"] == str(item.id)


class _Traced:
    """The work manager, as if every item had been enqueued by a traced request (the
    enqueue stamps `traceparent` from the request); counts completions."""

    def __init__(self, inner: WorkManagerInterface, traceparent: str) -> None:
        self._inner = inner
        self._traceparent = traceparent
        self.completed = Signal()

    async def claim_many(self, *args: Any, **kwargs: Any) -> list[tuple[OpContext, WorkItem]]:
        pairs = await self._inner.claim_many(*args, **kwargs)
        update = {"traceparent": self._traceparent}
        return [(ctx, item.model_copy(update=update)) for ctx, item in pairs]

    async def complete_many(self, held: Sequence[tuple[OpContext, WorkItem]]) -> set[UUID]:
        done = await self._inner.complete_many(held)
        for _ in done:
            self.completed.bump()
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_a_sweep_pass_requeues_an_item_whose_lease_passed(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    (item,) = await _enqueue(container, tenant)
    work = container.managers.work
    claimed = await work.claim_many(
        RequestContext.new(APP),
        make_settings(PROBE).lane,
        [PROBE_KIND],
        "crashed-worker",
        lease=0.01,
        limit=1,
    )
    assert [held.id for _, held in claimed] == [item.id]
    loop = make_loop()
    await asyncio.sleep(0.05)  # the 10 ms lease passes (on the database's clock)

    moved = await _sweep(loop).sweep_once()

    assert moved["requeue_stale"] == 1
    assert (await work.get(tenant, item.id)).status == WorkStatus.AVAILABLE
    assert sample(loop.metrics, "worker_queue_depth", lane=make_settings(PROBE).lane) == 1


async def test_a_failed_completion_is_counted_and_so_is_its_recovery_by_the_sweep(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (item,) = await _enqueue(container, tenant)
    work = container.managers.work
    original_complete_many = work.complete_many
    attempts = Signal()

    async def complete_many_once_down(*args: Any, **kwargs: Any) -> Any:
        attempts.bump()
        if attempts.count == 1:
            raise ConnectionError("the database went away")
        return await original_complete_many(*args, **kwargs)

    monkeypatch.setattr(work, "complete_many", complete_many_once_down)
    handler = GateHandler()
    handler.gate.set()
    # A lease long enough that the first checks run before it passes on a busy machine.
    lease = 2.0
    loop = make_loop(handlers={PROBE_KIND: handler}, settings=make_settings(PROBE, lease=lease))

    async with running(loop):
        await attempts.reach(1)
        await loop.flush_completions()
        kind = PROBE_KIND.value
        assert sample(loop.metrics, "worker_completions_failed_total", kind=kind) == 1
        assert (await work.get(tenant, item.id)).status == WorkStatus.CLAIMED
        await _sweep(loop).sweep_once()  # the lease has not passed: nothing to count yet
        assert (
            sample(
                loop.metrics,
                "worker_unwritten_recovered_total",
                kind=kind,
                reason="completion_failed",
            )
            == 0
        )

        await asyncio.sleep(lease + 0.1)  # the lease passes
        # This pass hands the item back, or the loop's own first pass already did (its
        # start can be late on a busy machine): either counts the recovery once.
        await _sweep(loop).sweep_once()
        assert (
            sample(
                loop.metrics,
                "worker_unwritten_recovered_total",
                kind=kind,
                reason="completion_failed",
            )
            == 1
        )
        await handler.finished.reach(2)  # the item runs again and completes
        await loop.flush_completions()

    assert (await work.get(tenant, item.id)).status == WorkStatus.COMPLETED
    await _sweep(loop).sweep_once()  # nothing followed any more: counted once
    assert (
        sample(
            loop.metrics,
            "worker_unwritten_recovered_total",
            kind=PROBE_KIND.value,
            reason="completion_failed",
        )
        == 1
    )


async def test_a_sweep_pass_writes_the_audit_entry_a_dead_letter_still_owes(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last attempt failed and its audit entry could not be written: the failure stands,
    and the next sweep pass writes the entry, once."""
    work = container.managers.work
    (fresh,) = new_items(PROBE, tenant, 1)
    item = await work.enqueue(tenant, fresh.model_copy(update={"max_attempts": 1}))
    (pair,) = await work.claim_many(
        RequestContext.new(APP), make_settings(PROBE).lane, [PROBE_KIND], "w1", lease=30.0, limit=1
    )
    audit = container.managers.audit
    append = audit.append

    async def down(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(audit, "append", append)  # back after this one call
        raise ConnectionError("the audit database went away")

    monkeypatch.setattr(audit, "append", down)
    assert (await work.fail(*pair, "boom")).status == WorkStatus.FAILED
    assert await audit.list_for(tenant, "work_item", item.id) == []
    loop = make_loop()

    moved = await _sweep(loop).sweep_once()
    again = await _sweep(loop).sweep_once()

    assert moved["audit_dead_letters"] == 1
    assert "audit_dead_letters" not in again
    assert sample(loop.metrics, "worker_sweep_moved_total", step="audit_dead_letters") == 1
    entries = await audit.list_for(tenant, "work_item", item.id)
    assert [e.action for e in entries] == ["work.dead_lettered"]


async def _completed(container: RuntimeContainer, tenant: OpContext) -> WorkItem:
    await _enqueue(container, tenant)
    work = container.managers.work
    (pair,) = await work.claim_many(
        RequestContext.new(APP),
        make_settings(PROBE).lane,
        [PROBE_KIND],
        "done-worker",
        lease=30.0,
        limit=1,
    )
    return await work.complete(*pair)


async def test_a_sweep_pass_purges_completed_items_past_their_retention(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    assert (await _completed(container, tenant)).status == WorkStatus.COMPLETED
    loop = make_loop(settings=make_settings(PROBE, completed_retention=0.01))
    await asyncio.sleep(0.05)  # the item's retention passes (on the storage's clock)

    moved = await _sweep(loop).sweep_once()

    assert moved["purge_completed"] == 1
    assert await _statuses(container, tenant) == []
    assert sample(loop.metrics, "worker_sweep_moved_total", step="purge_completed") == 1


async def test_a_completed_retention_of_zero_keeps_completed_items(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    await _completed(container, tenant)
    loop = make_loop(settings=make_settings(PROBE, completed_retention=0))
    await asyncio.sleep(0.05)

    moved = await _sweep(loop).sweep_once()

    assert "purge_completed" not in moved
    assert await _statuses(container, tenant) == [WorkStatus.COMPLETED]


async def test_a_sweep_pass_sets_the_age_of_the_oldest_available_item(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    await _enqueue(container, tenant, 2)
    loop = make_loop()
    await asyncio.sleep(0.2)  # the items wait, on the storage's clock

    await _sweep(loop).sweep_once()

    lane = make_settings(PROBE).lane
    age = sample(
        loop.metrics, "worker_queue_oldest_available_age_seconds", lane=lane, kind=PROBE_KIND.value
    )
    assert 0.15 <= age < 30
    assert sample(loop.metrics, "worker_queue_depth", lane=lane) == 2


async def test_the_queue_gauges_read_zero_once_the_lane_has_nothing_in_play(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    """A lane whose items all finished drops out of the queue stats; its depth and its
    oldest age then read 0, not the last value a pass set (an alarm on them would stay
    raised)."""
    await _completed(container, tenant)  # a COMPLETED row: the lane has history, none due
    (waiting,) = await _enqueue(container, tenant)
    loop = make_loop()
    await asyncio.sleep(0.05)
    await _sweep(loop).sweep_once()
    lane = make_settings(PROBE).lane
    assert sample(loop.metrics, "worker_queue_depth", lane=lane) == 1
    work = container.managers.work
    (pair,) = await work.claim_many(
        RequestContext.new(APP), lane, [PROBE_KIND], "done-worker", lease=30.0, limit=1
    )
    assert pair[1].id == waiting.id
    await work.complete(*pair)

    await _sweep(loop).sweep_once()

    assert sample(loop.metrics, "worker_queue_depth", lane=lane) == 0
    age = sample(
        loop.metrics, "worker_queue_oldest_available_age_seconds", lane=lane, kind=PROBE_KIND.value
    )
    assert age == 0


class _ParkedRecords:
    """A host manager with `due` parked records (the host's side of `ParkedRecordsResumer`).

    Each call resumes up to `limit` of them and records `(tenant, limit)`; with `error` set
    it raises that instead, as a records database that is down would.
    """

    def __init__(self, due: int, error: Exception | None = None) -> None:
        self.due = due
        self.error = error
        self.calls: list[tuple[UUID, int]] = []

    async def resume_parked(self, ctx: OpContext, *, limit: int) -> int:
        self.calls.append((ctx.org_id, limit))
        if self.error is not None:
            raise self.error
        resumed = min(self.due, limit)
        self.due -= resumed
        return resumed


async def test_a_sweep_pass_resumes_parked_records_through_every_resumer_per_tenant(
    tenant: OpContext, make_loop: LoopFactory
) -> None:
    orders, invoices = _ParkedRecords(due=RESUME_LIMIT + 2), _ParkedRecords(due=3)
    loop = make_loop(parked={"orders": orders, "invoices": invoices})

    first = await _sweep(loop).sweep_once()
    second = await _sweep(loop).sweep_once()
    third = await _sweep(loop).sweep_once()

    assert first["resume_parked"] == RESUME_LIMIT + 3
    assert second["resume_parked"] == 2  # the rest of `orders` waited one pass
    assert "resume_parked" not in third
    assert orders.calls == [(tenant.org_id, RESUME_LIMIT)] * 3
    assert invoices.calls == [(tenant.org_id, RESUME_LIMIT)] * 3
    moved = sample(loop.metrics, "worker_sweep_moved_total", step="resume_parked")
    assert moved == RESUME_LIMIT + 5


class _CallsWrongly:
    """A resumer the start-up check would refuse: the sweep must survive it all the same."""

    async def resume_parked(self, ctx: OpContext, *, limit: int, dry_run: bool) -> int:
        return 0


class _CountsWrongly:
    async def resume_parked(self, ctx: OpContext, *, limit: int) -> list[int]:
        return [1, 2]


@pytest.mark.parametrize("resumer", [_CallsWrongly(), _CountsWrongly()])
async def test_a_resumer_of_the_wrong_shape_is_a_failed_step_not_a_dead_sweep(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory, resumer: object
) -> None:
    await _enqueue(container, tenant)
    loop = make_loop(parked={"odd": resumer})

    moved = await _sweep(loop).sweep_once()
    again = await _sweep(loop).sweep_once()

    assert moved == again == {}
    assert sample(loop.metrics, "worker_sweep_errors_total", step="resume_parked") == 2
    assert sample(loop.metrics, "worker_queue_depth", lane=make_settings(PROBE).lane) == 1


async def test_a_failing_sweep_step_logs_its_traceback_once_then_one_line_per_pass(
    container: RuntimeContainer,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first failure of a step logs its traceback; each later pass says, in one WARNING,
    which steps still fail and how often in a row; the step's recovery is one INFO line."""
    broken = True

    async def relay_pending(rctx: RequestContext) -> int:
        if broken:
            raise RuntimeError("relay broke")
        return 0

    monkeypatch.setattr(container.managers.outbox_relay, "relay_pending", relay_pending)
    loop = make_loop()
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            await _sweep(loop).sweep_once()
        broken = False
        await _sweep(loop).sweep_once()
        await _sweep(loop).sweep_once()

    about = [r for r in caplog.records if "relay_pending" in r.getMessage()]
    assert [(r.levelno, r.exc_info is not None) for r in about] == [
        (logging.ERROR, True),
        (logging.WARNING, False),
        (logging.WARNING, False),
        (logging.INFO, False),
    ]
    assert about[2].getMessage() == (
        "sweep steps still failing (failures in a row): relay_pending=3; the next pass retries them"
    )
    assert about[3].getMessage() == "sweep step relay_pending succeeds again after 3 failure(s)"
    assert sample(loop.metrics, "worker_sweep_errors_total", step="relay_pending") == 3


async def test_a_database_outage_is_said_once_waited_out_and_ends_the_loop_past_its_limit(
    container: RuntimeContainer,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A database that refuses connections, or answers that it is starting up, fails the
    claim and every sweep step alike: one line says what the loop waits for, no
    traceback; past `database_outage_limit` the loop stops itself, naming the setting."""
    work = container.managers.work
    errors = itertools.cycle(
        [
            ConnectionRefusedError(111, "Connect call failed"),
            asyncpg.CannotConnectNowError("the database system is starting up"),
        ]
    )

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise next(errors)

    for method in ("claim_many", "maintenance_contexts", "queue_stats"):
        monkeypatch.setattr(work, method, down)
    monkeypatch.setattr(container.managers.outbox_relay, "relay_pending", down)
    monkeypatch.setattr(container.managers.outbox_relay, "purge_relayed", down)
    settings = make_settings(PROBE, database_outage_limit=1.0)
    loop = make_loop(settings=settings)
    with caplog.at_level(logging.INFO):
        async with asyncio.timeout(10):
            await loop.run()  # returns once the loop stopped itself and drained

    assert loop.outage is not None
    assert loop.outage.startswith("the database was unavailable for ")
    assert f"past {PROBE.settings.env_prefix()}DATABASE_OUTAGE_LIMIT (1 s)" in loop.outage
    assert not [r for r in caplog.records if r.exc_info is not None]
    waiting = [r for r in caplog.records if "waiting for it" in r.getMessage()]
    assert len(waiting) == 1
    assert waiting[0].getMessage().startswith("the database is unavailable (")
    stopping = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in stopping] == [f"{loop.outage}: stopping"]


async def test_a_database_that_accepts_and_never_answers_ends_the_loop_past_its_limit(
    container: RuntimeContainer,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A database that takes the connection and never answers hangs the claim and every
    sweep step instead of failing them: the claim is cancelled past its lease and a grace,
    the outage counts from when the hung call began, and the loop stops itself past
    `database_outage_limit`, its line naming what did not answer."""
    work = container.managers.work

    async def hangs(*args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()

    for method in ("claim_many", "maintenance_contexts", "queue_stats"):
        monkeypatch.setattr(work, method, hangs)
    monkeypatch.setattr(container.managers.outbox_relay, "relay_pending", hangs)
    monkeypatch.setattr(container.managers.outbox_relay, "purge_relayed", hangs)
    settings = make_settings(PROBE, lease=0.5, database_outage_limit=3.0)
    loop = make_loop(settings=settings)
    with caplog.at_level(logging.INFO):
        async with asyncio.timeout(15):
            await loop.run()  # returns once the loop stopped itself and drained

    assert loop.outage is not None
    assert f"past {PROBE.settings.env_prefix()}DATABASE_OUTAGE_LIMIT (3 s)" in loop.outage
    assert loop.outage.endswith("last error: TimeoutError: the claim had no answer within 5.5 s")
    seconds = int(loop.outage.removeprefix("the database was unavailable for ").split()[0])
    assert seconds >= 5  # from when the hung claim began, not when it was cancelled
    assert not [r for r in caplog.records if r.exc_info is not None]
    stopping = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in stopping] == [f"{loop.outage}: stopping"]


async def test_a_sweep_step_that_hangs_in_an_outage_counts_toward_it(
    container: RuntimeContainer,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sweep step cancelled at `sweep_step_timeout` while the database is down is one
    more failure of the outage (no ERROR of its own), and the outage counts from when
    that step began, so the loop stops past its limit though every claim fails at once."""
    work = container.managers.work

    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionRefusedError(111, "Connect call failed")

    async def hangs(*args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()

    monkeypatch.setattr(work, "claim_many", refused)
    for method in ("maintenance_contexts", "queue_stats"):
        monkeypatch.setattr(work, method, hangs)
    settings = make_settings(
        PROBE, sweep_interval=0.2, sweep_step_timeout=0.5, database_outage_limit=2.0
    )
    loop = make_loop(settings=settings)
    with caplog.at_level(logging.INFO):
        async with asyncio.timeout(15):
            await loop.run()

    assert loop.outage is not None
    assert not [r for r in caplog.records if "ran past" in r.getMessage()]
    stopping = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in stopping] == [f"{loop.outage}: stopping"]


class _Hangs:
    """A resumer stuck on a lock that is never released."""

    def __init__(self) -> None:
        self.cancelled = False

    async def resume_parked(self, ctx: OpContext, *, limit: int) -> int:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return 0


async def test_a_step_past_its_bound_is_cancelled_and_the_pass_goes_on(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hung, healthy = _Hangs(), _ParkedRecords(due=2)
    await _enqueue(container, tenant)
    loop = make_loop(
        settings=make_settings(PROBE, sweep_step_timeout=0.1), parked={"hung": hung, "ok": healthy}
    )

    with caplog.at_level(logging.ERROR):
        moved = await asyncio.wait_for(_sweep(loop).sweep_once(), timeout=5)

    assert hung.cancelled
    assert moved == {"resume_parked": 2}
    assert sample(loop.metrics, "worker_sweep_errors_total", step="resume_parked") == 1
    assert "sweep step resume_parked (hung) ran past 0.1 s; cancelled" in caplog.text
    assert sample(loop.metrics, "worker_queue_depth", lane=make_settings(PROBE).lane) == 1


async def test_a_failing_resumer_is_counted_and_logged_and_stops_no_other_step(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = _ParkedRecords(due=5, error=RuntimeError("records table locked"))
    healthy = _ParkedRecords(due=2)
    await _enqueue(container, tenant)
    loop = make_loop(parked={"broken": broken, "healthy": healthy})

    with caplog.at_level(logging.ERROR):
        moved = await _sweep(loop).sweep_once()

    assert moved == {"resume_parked": 2}
    assert broken.calls == [(tenant.org_id, RESUME_LIMIT)]
    assert sample(loop.metrics, "worker_sweep_errors_total", step="resume_parked") == 1
    assert "sweep step resume_parked (broken) failed" in caplog.text
    assert sample(loop.metrics, "worker_queue_depth", lane=make_settings(PROBE).lane) == 1


@dataclass
class _Outbox:
    """What a host relay's `outbox_stats` returns (the shape `OutboxStatsLike` names)."""

    pending: int
    oldest_pending_age: float
    failing: int
    dead_lettered: Any


class _OutboxReport:
    """A host relay's side of `OutboxStatsReader`: returns `stats`, or raises `error`, and
    records the `failing_after` of each call."""

    def __init__(self, stats: object, error: Exception | None = None) -> None:
        self.stats = stats
        self.error = error
        self.calls: list[int] = []

    async def outbox_stats(self, rctx: RequestContext, *, failing_after: int) -> Any:
        self.calls.append(failing_after)
        if self.error is not None:
            raise self.error
        return self.stats


_OUTBOX_GAUGES = (
    "worker_outbox_pending",
    "worker_outbox_oldest_pending_age_seconds",
    "worker_outbox_failing",
    "worker_outbox_dead_letters",
)


def _outbox_gauges(loop: WorkerLoop) -> list[float | None]:
    """Each `worker_outbox_*` gauge's value, None where the registry has no such sample."""
    return [loop.metrics.registry.get_sample_value(name) for name in _OUTBOX_GAUGES]


async def test_a_sweep_pass_sets_the_outbox_gauges_from_the_hosts_relay(
    tenant: OpContext, make_loop: LoopFactory
) -> None:
    report = _OutboxReport(_Outbox(pending=7, oldest_pending_age=42.5, failing=2, dead_lettered=1))
    loop = make_loop(outbox_stats=report)
    assert _outbox_gauges(loop) == [None] * 4  # nothing exported before the first read

    await _sweep(loop).sweep_once()
    assert _outbox_gauges(loop) == [7, 42.5, 2, 1]

    report.stats = _Outbox(pending=0, oldest_pending_age=0, failing=0, dead_lettered=3)
    await _sweep(loop).sweep_once()
    assert _outbox_gauges(loop) == [0, 0, 0, 3]
    assert report.calls == [OUTBOX_FAILING_AFTER] * 2
    assert sample(loop.metrics, "worker_sweep_errors_total", step="outbox_stats") == 0


@pytest.mark.parametrize(
    "report",
    [
        _OutboxReport(None, error=RuntimeError("outbox table locked")),
        _OutboxReport(_Outbox(pending=1, oldest_pending_age=1.0, failing=0, dead_lettered="x")),
        _OutboxReport(_Outbox(pending=-1, oldest_pending_age=1.0, failing=0, dead_lettered=0)),
        _OutboxReport(_Outbox(pending=1, oldest_pending_age=-2.0, failing=0, dead_lettered=0)),
        _OutboxReport({"pending": 1}),
    ],
)
async def test_an_outbox_report_that_fails_or_is_malformed_is_a_failed_step_and_exports_nothing(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    report: _OutboxReport,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await _enqueue(container, tenant)
    loop = make_loop(outbox_stats=report)

    with caplog.at_level(logging.ERROR):
        await _sweep(loop).sweep_once()

    assert _outbox_gauges(loop) == [None] * 4
    assert sample(loop.metrics, "worker_sweep_errors_total", step="outbox_stats") == 1
    assert "sweep step outbox_stats failed" in caplog.text
    assert sample(loop.metrics, "worker_queue_depth", lane=make_settings(PROBE).lane) == 1


def count_sweeps(loop: WorkerLoop) -> Signal:
    """A `Signal` bumped after each of `loop`'s sweep passes."""
    passes = Signal()
    sweep = _sweep(loop)
    sweep_once = sweep.sweep_once

    async def counted() -> dict[str, int]:
        moved = await sweep_once()
        passes.bump()
        return moved

    sweep.sweep_once = counted  # type: ignore[method-assign]
    return passes


async def test_without_outbox_stats_no_outbox_gauge_is_exported_and_the_worker_says_so_once(
    make_loop: LoopFactory, caplog: pytest.LogCaptureFixture
) -> None:
    loop = make_loop(outbox_stats=None, settings=make_settings(PROBE, sweep_interval=0.05))
    passes = count_sweeps(loop)

    with caplog.at_level(logging.INFO):
        async with running(loop):
            await passes.reach(3)

    said = [r for r in caplog.records if "does not report the outbox's state" in r.getMessage()]
    assert [r.getMessage() for r in said] == [
        "the outbox relay does not report the outbox's state (no outbox_stats): the "
        "worker_outbox_* gauges are not exported"
    ]
    assert _outbox_gauges(loop) == [None] * 4


def _queue_stats_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """The `extra` fields (and `event`) of each `queue stats` line captured, in order."""
    return [
        {name: getattr(r, name) for name in ("event", *QUEUE_STATS_FIELDS) if hasattr(r, name)}
        for r in caplog.records
        if getattr(r, "event", None) == QUEUE_STATS_EVENT
    ]


async def test_a_sweep_pass_logs_one_queue_stats_line_with_the_fields_the_alarms_read(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each pass logs one INFO `queue stats` line whose fields are `extra` (top-level keys
    of the host's JSON lines, which the deployment's metric filters read): the loop's lane
    and kinds, the failures counted since the previous line, the wake-up channel, the
    oldest snapshot and the outbox's state."""
    await _enqueue(container, tenant, 2)
    report = _OutboxReport(_Outbox(pending=7, oldest_pending_age=42.5, failing=2, dead_lettered=1))
    loop = make_loop(outbox_stats=report)
    kind = PROBE_KIND.value
    loop.metrics.claim_failures.inc(3)
    loop.metrics.renewals_failed.labels(kind=kind).inc(2)
    loop.metrics.completions_failed.labels(kind=kind).inc()
    snapshot = default_metrics().oldest_snapshot_xid_age  # the manager's, process-wide
    snapshot.labels(database="queue_stats_line").set(123456)
    held = default_metrics().oldest_snapshot_age
    held.labels(database="queue_stats_line").set(42.25)
    await asyncio.sleep(0.2)  # the items wait, on the storage's clock

    try:
        with caplog.at_level(logging.INFO):
            await _sweep(loop).sweep_once()
            loop.state.wake_ups_up = True
            loop.metrics.claim_failures.inc()
            await _sweep(loop).sweep_once()
    finally:
        snapshot.remove("queue_stats_line")
        held.remove("queue_stats_line")

    first, second = _queue_stats_lines(caplog)
    assert list(first) == ["event", *QUEUE_STATS_FIELDS], "every field, all read this pass"
    assert first["lane"] == make_settings(PROBE).lane
    assert first["available"] == 2
    assert 0.15 <= first["oldest_available_age_s"] < 30
    assert first["dead_letters_unaudited"] == 0
    assert first["oldest_snapshot_xid_age"] >= 123456
    assert first["oldest_snapshot_age_s"] >= 42.2
    failures = ("claim_failures", "lease_renewal_failures", "completion_failures")
    assert [first[name] for name in failures] == [3, 2, 1]
    assert [second[name] for name in failures] == [1, 0, 0], "counted since the line before"
    assert (first["wake_up_channel_up"], second["wake_up_channel_up"]) == (0, 1)
    outbox = ("outbox_pending", "outbox_oldest_pending_age_s", "outbox_failing")
    assert [first[name] for name in outbox] == [7, 42.5, 2]
    assert first["outbox_dead_letters"] == 1
    # numbers a CloudWatch metric filter can read from a JSON line
    numbers = {k: v for k, v in first.items() if k not in ("event", "lane")}
    assert all(type(v) in (int, float) for v in numbers.values()), numbers
    assert json.loads(json.dumps(first)) == first
    record = next(r for r in caplog.records if getattr(r, "event", None) == QUEUE_STATS_EVENT)
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith(f"queue stats lane={first['lane']} available=2 ")


async def test_stranded_items_are_counted_last_in_the_line_and_named_in_a_warning_each_pass(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Items waiting where no worker claims them (a lane the kind's policy no longer names,
    a kind no `WorkKind` names) are `stranded=N`, the line's last field, and one WARNING
    per pass names each kind and lane with its count. Nothing is failed or moved. (After
    `copier update -d lane=bulk` both the `LANE` default and the kind's policy say `bulk`;
    the items enqueued before wait on `default`.)"""
    await _enqueue(container, tenant, 2)  # on the settings' lane, `default`
    storage = cast(Any, container.managers.work)._storage
    assert isinstance(storage, MemoryWorkStorage)
    bogus = stored_row(tenant.org_id, "bulk", kind="BOGUS_KIND")
    storage._rows[bogus["id"]] = WorkItem.model_construct(**bogus)
    kind = PROBE_KIND.value
    loop = make_loop(
        policies={PROBE_KIND: KindPolicy(lane="bulk")},
        settings=make_settings(PROBE, lane="bulk", sweep_interval=0.05),
    )
    passes = count_sweeps(loop)

    with caplog.at_level(logging.INFO):
        async with running(loop):
            await passes.reach(2)

    lines = _queue_stats_lines(caplog)
    assert [line["stranded"] for line in lines[:2]] == [3, 3]
    assert list(lines[0])[-1] == "stranded"
    record = next(r for r in caplog.records if getattr(r, "event", None) == QUEUE_STATS_EVENT)
    assert record.getMessage().endswith(" stranded=3")
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stranded")]
    assert len(warned) >= 2, "one warning per pass"
    assert warned[0].startswith(
        "stranded items, waiting where no worker claims them: BOGUS_KIND on bulk: 1 (no "
        f"worker declares this kind), {kind} on default: 2 (its workers claim on bulk); "
    )
    assert "this worker claims" not in caplog.text  # its lane is its kind's policy lane
    assert await _statuses(container, tenant) == [WorkStatus.AVAILABLE] * 2


async def test_a_worker_whose_lane_is_not_its_kinds_policy_lane_says_so_at_start(
    make_loop: LoopFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """`LANE=bulk` while the kind's policy enqueues on `default`: new items would wait
    where this worker never claims, and the worker says so once, at start."""
    loop = make_loop(settings=make_settings(PROBE, lane="bulk", sweep_interval=0.05))
    passes = count_sweeps(loop)

    with caplog.at_level(logging.INFO):
        async with running(loop):
            await passes.reach(2)

    said = [r for r in caplog.records if r.getMessage().startswith("this worker claims")]
    assert [(r.levelno, r.getMessage()) for r in said] == [
        (
            logging.WARNING,
            f"this worker claims {PROBE_KIND.value} on lane bulk, but the kind's policy "
            "enqueues it on default: new items wait there unclaimed (set "
            f"{loop.settings.env_prefix()}LANE=default, or change the kind's KindPolicy)",
        )
    ]


async def test_a_queue_stats_line_leaves_out_what_its_pass_could_not_read(
    container: RuntimeContainer,
    tenant: OpContext,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failed `queue_stats` step and a host without `outbox_stats`: the line still comes,
    with the failures and the wake-up channel, and without the fields nobody read."""
    work = container.managers.work

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("the database went away")

    monkeypatch.setattr(work, "queue_stats", down)
    loop = make_loop(outbox_stats=None)

    with caplog.at_level(logging.INFO):
        await _sweep(loop).sweep_once()

    [line] = _queue_stats_lines(caplog)
    assert set(line) == {
        "event",
        "lane",
        "claim_failures",
        "lease_renewal_failures",
        "completion_failures",
        "wake_up_channel_up",
    }
    assert sample(loop.metrics, "worker_sweep_errors_total", step="queue_stats") == 1


async def test_the_oldest_snapshot_gauge_rises_while_a_session_holds_one_and_falls_after(
    pg_storage: SqlStorageRoot,
    pg_url: str,
    make_loop: LoopFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Real PostgreSQL: a `REPEATABLE READ` transaction of another role (the admin) holds
    its snapshot while 50 transactions commit; the sweep, as `acme_app`, reads its age in
    transaction ids from `pg_stat_activity` (and logs it in its `queue stats` line), and
    times the hold from its first sighting. Committed, both fall back near 0."""
    queue = ProbeContainer.for_tests(pg_storage, Infra.memory())
    loop = make_loop(
        work=queue.managers.work,
        outbox_relay=queue.managers.outbox_relay,
        parked={},
        outbox_stats=None,
    )
    database = make_url(pg_url).database
    admin = make_url(
        os.environ.get("ACME_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    ).set(drivername="postgresql", database=database)
    holder = await asyncpg.connect(admin.render_as_string(hide_password=False))
    burner = await asyncpg.connect(admin.render_as_string(hide_password=False))

    async def burn(transactions: int) -> None:
        for _ in range(transactions):
            await burner.fetchval("SELECT txid_current()")  # one transaction id each

    def gauge(name: str = "work_queue_oldest_snapshot_xid_age") -> float | None:
        return REGISTRY.get_sample_value(name, {"database": str(database)})

    def held_s() -> float | None:
        return gauge("work_queue_oldest_snapshot_age_seconds")

    try:
        holding = holder.transaction(isolation="repeatable_read")
        await holding.start()
        await holder.fetchval("SELECT 1")  # the snapshot is taken by the first statement
        await burn(50)
        with caplog.at_level(logging.INFO):
            await _sweep(loop).sweep_once()
        held, first_held_s = gauge(), held_s()
        await burn(20)
        await asyncio.sleep(1.0)
        await _sweep(loop).sweep_once()
        still_held, still_held_s = gauge(), held_s()
        await holding.commit()
        await burn(1)
        await _sweep(loop).sweep_once()
        released, released_s = gauge(), held_s()
    finally:
        await holder.close()
        await burner.close()

    assert held is not None
    assert still_held is not None
    assert released is not None
    assert held >= 50
    first_line = _queue_stats_lines(caplog)[0]  # the first pass's, while the snapshot was held
    assert first_line["oldest_snapshot_xid_age"] >= held
    assert still_held >= held + 20  # it keeps growing while the snapshot is held
    assert released < 10
    assert first_held_s is not None
    assert still_held_s is not None
    assert still_held_s >= first_held_s + 1.0  # the same snapshot, timed across passes
    assert released_s == 0
    assert sample(loop.metrics, "worker_sweep_errors_total", step="queue_stats") == 0


class _Hooks(ItemHooks):
    """Records each hook call; `fail_before` and `fail_after` make those hooks raise."""

    def __init__(self, *, fail_before: bool = False, fail_after: bool = False) -> None:
        self.calls: list[tuple[str, UUID, str | None]] = []
        self.fail_before = fail_before
        self.fail_after = fail_after

    async def before_item(self, ctx: OpContext, item: WorkItem) -> None:
        self.calls.append(("before", item.id, None))
        if self.fail_before:
            raise RuntimeError("before_item refused it")

    async def after_item(self, ctx: OpContext, item: WorkItem, error: Exception | None) -> None:
        self.calls.append(("after", item.id, None if error is None else type(error).__name__))
        if self.fail_after:
            raise RuntimeError("after_item broke")

    async def on_dead_letter(self, ctx: OpContext, item: WorkItem) -> None:
        self.calls.append(("dead", item.id, item.status.value))


class _Fails(WorkHandlerInterface):
    async def handle(self, ctx: OpContext, item: WorkItem) -> None:
        raise ValueError("the handler failed")


async def _run_one(loop: WorkerLoop, item: WorkItem) -> None:
    """Claim `item` (the only one available) through `loop` and wait for its task and its
    completion to be written."""
    assert await loop.claim_once(1) == (1, 0)
    await asyncio.gather(*(t for t in asyncio.all_tasks() if t.get_name() == f"item-{item.id}"))
    await loop.flush_completions()


async def test_hooks_run_around_each_item_and_on_its_dead_letter(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    work = container.managers.work
    hooks = _Hooks()
    (done,) = await work.enqueue_many(tenant, new_items(PROBE, tenant))
    await _run_one(make_loop(hooks=hooks), done)
    last_try = [i.model_copy(update={"max_attempts": 1}) for i in new_items(PROBE, tenant)]
    (doomed,) = await work.enqueue_many(tenant, last_try)
    await _run_one(make_loop(hooks=hooks, handlers={PROBE_KIND: _Fails()}), doomed)

    assert hooks.calls == [
        ("before", done.id, None),
        ("after", done.id, None),
        ("before", doomed.id, None),
        ("after", doomed.id, "ValueError"),
        ("dead", doomed.id, "FAILED"),
    ]
    assert (await work.get(tenant, done.id)).status == WorkStatus.COMPLETED


async def test_a_before_hook_that_raises_fails_the_attempt_and_an_after_hook_changes_nothing(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory
) -> None:
    (refused,) = await container.managers.work.enqueue_many(tenant, new_items(PROBE, tenant))
    await _run_one(make_loop(hooks=_Hooks(fail_before=True)), refused)
    failed = await container.managers.work.get(tenant, refused.id)
    assert failed.status == WorkStatus.AVAILABLE
    assert failed.attempts == 1
    assert (failed.last_error or "").splitlines()[0] == "RuntimeError: before_item refused it"

    (done,) = await container.managers.work.enqueue_many(tenant, new_items(PROBE, tenant))
    loop = make_loop(hooks=_Hooks(fail_after=True))
    await _run_one(loop, done)
    assert (await container.managers.work.get(tenant, done.id)).status == WorkStatus.COMPLETED
    assert sample(loop.metrics, "worker_hook_failures_total", hook="after_item") == 1
