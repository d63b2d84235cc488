"""Several kinds in one process: each kind's own capacity inside the process's, and `serve`
claiming a subset (`--kind`). The process-level cases are in test_process.py.

The loop's cases run over the memory container with two gated handlers; the settings'
cases read the environment as a process does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from acme.om.context import OpContext
from acme.om.work.types.work_item import WorkItem, WorkKind, WorkStatus
from acme.workers.runtime.commands import Refused
from acme.workers.runtime.container import RuntimeContainer
from acme.workers.runtime.server import serving_kinds
from acme.workers.runtime.testing import (
    PROBE,
    PROBE_KIND,
    GateHandler,
    LoopFactory,
    ProbeSettings,
    make_settings,
    running,
    sample_payload,
)

SECOND_KIND = next((kind for kind in WorkKind if kind != PROBE_KIND), None)
"""A kind beside the probe's (make engine-check renders a host with two)."""

PREFIX = ProbeSettings.env_prefix()


@pytest.fixture
def second() -> WorkKind:
    assert SECOND_KIND is not None, "the host defines one kind; make engine-check renders two"
    return SECOND_KIND


async def _enqueue(
    container: RuntimeContainer, ctx: OpContext, kind: WorkKind, count: int
) -> list[WorkItem]:
    items = [
        WorkItem.new(org_id=ctx.org_id, kind=kind, payload=sample_payload(), lane="default")
        for _ in range(count)
    ]
    return await container.managers.work.enqueue_many(ctx, items)


async def _until(check: Callable[[], bool], within_s: float = 3.0) -> None:
    """Poll `check` every 10 ms until it holds; fails after `within_s` seconds."""
    for _ in range(int(within_s * 100)):
        if check():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"not within {within_s} s")


def test_a_kind_capacity_is_read_one_variable_per_kind(
    monkeypatch: pytest.MonkeyPatch, second: WorkKind
) -> None:
    monkeypatch.setenv(f"{PREFIX}KIND_CAPACITY__{second.value.lower()}", "3")
    settings = ProbeSettings()
    assert settings.kind_capacity == {second.value: 3}
    assert ProbeSettings.misspelt({f"{PREFIX}KIND_CAPACITY__{second.value}": "3"}) is None
    assert settings.kinds_problem([PROBE_KIND.value, second.value]) is None


def test_a_kind_capacity_above_the_process_capacity_is_refused_naming_both() -> None:
    settings = make_settings(PROBE, capacity=4, kind_capacity={PROBE_KIND.value: 5})
    assert settings.kinds_problem([PROBE_KIND.value]) == (
        f"{PREFIX}KIND_CAPACITY__{PROBE_KIND.value} is 5, above {PREFIX}CAPACITY (4), the "
        "items the whole process handles at once: lower it or raise the capacity"
    )


def test_serve_claims_the_kinds_named_and_refuses_one_it_does_not_handle(
    second: WorkKind,
) -> None:
    settings = make_settings(PROBE)
    handled = [PROBE_KIND, second]
    assert serving_kinds(handled, [], settings) == handled
    assert serving_kinds(handled, [second.value.lower()], settings) == [second]
    with pytest.raises(Refused) as refused:
        serving_kinds([PROBE_KIND], [second.value], settings)
    assert str(refused.value) == (
        f"--kind {second.value}: this worker handles {PROBE_KIND.value}; name one of them"
    )


def test_serve_refuses_a_kind_capacity_for_a_kind_it_does_not_handle(second: WorkKind) -> None:
    settings = make_settings(PROBE, kind_capacity={second.value: 2})
    assert serving_kinds([PROBE_KIND, second], [PROBE_KIND.value], settings) == [PROBE_KIND]
    with pytest.raises(Refused) as refused:
        serving_kinds([PROBE_KIND], [], settings)
    assert str(refused.value) == (
        f"invalid settings: {PREFIX}KIND_CAPACITY__{second} names a kind this worker does "
        f"not handle ({PROBE_KIND})"
    )


async def test_each_kind_runs_at_most_its_own_capacity_and_the_process_at_most_its_own(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory, second: WorkKind
) -> None:
    await _enqueue(container, tenant, PROBE_KIND, 5)
    await _enqueue(container, tenant, second, 5)
    first_handler, second_handler = GateHandler(), GateHandler()
    loop = make_loop(
        handlers={PROBE_KIND: first_handler, second: second_handler},
        settings=make_settings(PROBE, capacity=4, kind_capacity={PROBE_KIND.value: 1}),
    )

    async with running(loop):
        await first_handler.started.reach(1)
        await second_handler.started.reach(3)
        await asyncio.sleep(0.3)  # several polls: nothing more is claimed
        assert (len(first_handler.items), len(second_handler.items)) == (1, 3)
        first_handler.gate.set()
        await first_handler.started.reach(5)  # one at a time, each freed slot claims again
        second_handler.gate.set()
        await second_handler.finished.reach(5)
        await loop.flush_completions()

    items = await container.managers.work.list_items(tenant)
    assert {item.status for item in items} == {WorkStatus.COMPLETED}


async def test_a_capped_kinds_freed_slot_claims_again_though_the_other_kind_was_empty(
    container: RuntimeContainer, tenant: OpContext, make_loop: LoopFactory, second: WorkKind
) -> None:
    await _enqueue(container, tenant, PROBE_KIND, 3)
    handler = GateHandler()
    settings = make_settings(
        PROBE, capacity=4, kind_capacity={PROBE_KIND.value: 1}, poll_interval=60.0, lease=120.0
    )
    loop = make_loop(handlers={PROBE_KIND: handler, second: GateHandler()}, settings=settings)

    async with running(loop):
        await handler.started.reach(1)
        await _until(lambda: loop.signal.lane_empty)  # the second kind found nothing
        handler.gate.set()
        # No wake-up and a minute's poll: only the freed slot of its kind claims the rest.
        await handler.finished.reach(3)
