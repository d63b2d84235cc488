"""The worker roster from the runtime's side (docs/decisions/0049), over the memory
container: the heartbeat upserts the worker's row, the drain deletes it, the sweep prunes a
row whose worker died without a drain, and a failed roster write leaves the liveness beat
standing."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from acme.om.context import RequestContext
from acme.om.work.types.lanes import WorkerAlive
from acme.workers.runtime.container import RuntimeContainer
from acme.workers.runtime.testing import (
    APP,
    PROBE,
    PROBE_KIND,
    LoopFactory,
    Signal,
    make_settings,
    running,
    sample,
)


async def _row(container: RuntimeContainer, worker_id: str) -> WorkerAlive | None:
    """`worker_id` among the workers alive the queue summary lists, or None."""
    summary = await container.managers.work.queue_summary(RequestContext.new(APP))
    return next((row for row in summary.workers_alive if row.worker_id == worker_id), None)


def _count_roster_writes(
    container: RuntimeContainer, monkeypatch: pytest.MonkeyPatch, *, failing: list[bool]
) -> tuple[Signal, Signal]:
    """Route the manager's `beat_worker` through a wrapper: it raises while `failing[0]`,
    else writes; returns the signals of the writes tried and of those that landed."""
    work = container.managers.work
    real = work.beat_worker
    tried, landed = Signal(), Signal()

    async def beat_worker(*args: object, **kwargs: object) -> None:
        tried.bump()
        if failing[0]:
            raise ConnectionError("the database went away")
        await real(*args, **kwargs)  # type: ignore[arg-type]
        landed.bump()

    monkeypatch.setattr(work, "beat_worker", beat_worker)
    return tried, landed


async def test_the_heartbeat_puts_an_idle_worker_on_the_roster_and_the_drain_takes_it_off(
    container: RuntimeContainer, make_loop: LoopFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, landed = _count_roster_writes(container, monkeypatch, failing=[False])
    loop = make_loop()
    settings = make_settings(PROBE)
    rctx = RequestContext.new(APP)

    async with running(loop):
        await landed.reach(1)
        first = await _row(container, loop.worker_id)
        await landed.reach(landed.count + 2)
        later = await _row(container, loop.worker_id)
        summary = await container.managers.work.queue_summary(rctx)

    assert first is not None
    assert later is not None
    assert (first.worker, first.lane, first.kinds) == (
        PROBE.name,
        settings.lane,
        (PROBE_KIND.value,),
    )
    assert later.beat_at > first.beat_at
    assert later.started_at == first.started_at
    assert [(w.worker_id, w.holding) for w in summary.workers_alive] == [(loop.worker_id, 0)]
    assert summary.workers_holding == {}
    assert await _row(container, loop.worker_id) is None  # drained
    assert await container.managers.work.drop_worker(rctx, loop.worker_id) is False


async def test_a_failing_roster_write_is_counted_and_said_once_and_the_beat_stands(
    container: RuntimeContainer,
    make_loop: LoopFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    failing = [True]
    tried, landed = _count_roster_writes(container, monkeypatch, failing=failing)
    loop = make_loop()
    with caplog.at_level(logging.INFO):
        async with running(loop):
            await tried.reach(4)
            failures_before = loop.state.heartbeat_failures
            failing[0] = False
            await landed.reach(1)
            alive = await _row(container, loop.worker_id)

    assert failures_before == 0
    assert alive is not None
    assert sample(loop.metrics, "worker_roster_write_failures_total") >= 4
    assert sample(loop.metrics, "worker_heartbeat_failures_total") == 0
    said = [r.getMessage() for r in caplog.records if "worker roster" in r.getMessage()]
    # The cause is the test's ConnectionError, or on a busy machine a beat that used the
    # whole (short) test interval first: either opens the streak's one warning.
    assert re.match(
        r"worker roster write failed \((ConnectionError: the database went away|"
        r"TimeoutError: the liveness beat used the whole interval)\)",
        said[0],
    ), said[0]
    assert [s for s in said if "failed (" in s] == said[:1]  # once per streak
    assert said[1].startswith("worker roster written again after ")


async def test_a_sweep_pass_prunes_the_row_of_a_worker_gone_without_a_drain(
    container: RuntimeContainer, make_loop: LoopFactory
) -> None:
    work = container.managers.work
    rctx = RequestContext.new(APP)
    settings = make_settings(PROBE)
    for worker_id, ttl_s in (("killed", settings.liveness_ttl), ("beating", 60.0)):
        await work.beat_worker(
            rctx, worker_id, worker=PROBE.name, lane=settings.lane, kinds=[PROBE_KIND], ttl_s=ttl_s
        )
    loop = make_loop()
    assert loop.sweep is not None
    await asyncio.sleep(settings.liveness_ttl + settings.roster_grace + 0.1)

    moved = await loop.sweep.sweep_once()
    again = await loop.sweep.sweep_once()

    assert moved["prune_roster"] == 1
    assert "prune_roster" not in again
    assert await work.drop_worker(rctx, "killed") is False  # deleted, not only expired
    assert await _row(container, "beating") is not None
