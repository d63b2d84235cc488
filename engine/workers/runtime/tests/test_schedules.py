"""Periodic items (docs/decisions/0034): each tick enqueued once however many schedulers
run, across daylight-saving changes, after a purge, and after downtime by the catch-up
policy; a schedule that cannot run is refused at start. Every scheduler here runs on an
injected clock (`StepClock`), never an accelerated system clock."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import cast
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo

import pytest
from prometheus_client import CollectorRegistry

from acme.infra.container import Infra
from acme.om.context import RequestContext
from acme.om.storage.impl.memory import MemoryStorageRoot
from acme.om.storage.impl.sql import SqlStorageRoot
from acme.om.work.types.work_item import WorkItem, WorkStatus
from acme.workers.runtime.cli import print_schedules
from acme.workers.runtime.container import RuntimeContainer
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.schedules import Schedule, Scheduler
from acme.workers.runtime.testing import (
    APP,
    PROBE,
    PROBE_KIND,
    ProbeContainer,
    make_settings,
    sample,
    sample_payload,
)

NEW_YORK = ZoneInfo("America/New_York")
HOURLY = Schedule(name="hourly", cron="0 * * * *", payload=sample_payload())


class StepClock:
    """An aware UTC clock that moves only when told."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, step: timedelta) -> None:
        self.now += step


def scheduler(
    container: RuntimeContainer, schedules: Sequence[Schedule], clock: StepClock
) -> Scheduler:
    return Scheduler(
        worker=PROBE.name,
        kind=PROBE_KIND,
        schedules=schedules,
        settings=make_settings(PROBE),
        work=container.managers.work,
        metrics=WorkerMetrics(CollectorRegistry()),
        clock=clock,
    )


async def tenants(container: RuntimeContainer, count: int) -> list[UUID]:
    rctx = RequestContext.new(APP)
    return [
        (await container.managers.tenancy.create_org(rctx, f"tenant {n}")).id for n in range(count)
    ]


async def items_of(container: RuntimeContainer, org: UUID) -> list[WorkItem]:
    ctx = next(
        c
        for c in await container.managers.work.maintenance_contexts(RequestContext.new(APP))
        if c.org_id == org
    )
    return list(await container.managers.work.list_items(ctx, limit=500))


async def run_minutes(
    schedulers: Sequence[Scheduler], clock: StepClock, until: datetime, step_s: float = 60.0
) -> None:
    """Every scheduler passes at once, then the clock moves a step, until `until`."""
    while clock.now <= until:
        await asyncio.gather(*(s.tick_once() for s in schedulers))
        clock.advance(timedelta(seconds=step_s))


@pytest.fixture
def memory_queues() -> tuple[RuntimeContainer, RuntimeContainer]:
    """Two worker processes' containers over one memory storage."""
    storage = MemoryStorageRoot()
    return (
        ProbeContainer.for_tests(storage, Infra.memory()),
        ProbeContainer.for_tests(storage, Infra.memory()),
    )


@pytest.fixture
def pg_queues(pg_storage: SqlStorageRoot) -> tuple[RuntimeContainer, RuntimeContainer]:
    """Two worker processes' containers over one PostgreSQL database."""
    return (
        ProbeContainer.for_tests(pg_storage, Infra.memory()),
        ProbeContainer.for_tests(pg_storage, Infra.memory()),
    )


async def enqueue_three_hours_from_two_schedulers(
    first: RuntimeContainer, second: RuntimeContainer
) -> None:
    """No leader: both pass at every minute of three hours, each tenant gets one item per
    hour, and between them the schedulers count three enqueued ticks per tenant."""
    orgs = await tenants(first, 2)
    clock = StepClock(datetime(2026, 6, 1, 9, 30, tzinfo=UTC))
    one, two = scheduler(first, [HOURLY], clock), scheduler(second, [HOURLY], clock)
    await run_minutes([one, two], clock, until=datetime(2026, 6, 1, 12, 30, tzinfo=UTC))
    for org in orgs:
        items = await items_of(first, org)
        assert sorted(str(i.idempotency_key).rsplit("@", 1)[1] for i in items) == [
            "2026-06-01T10:00:00+00:00",
            "2026-06-01T11:00:00+00:00",
            "2026-06-01T12:00:00+00:00",
        ]
    enqueued = sum(
        sample(s.metrics, "worker_schedule_ticks_enqueued_total", schedule="worker-probe:hourly")
        for s in (one, two)
    )
    assert enqueued == 3 * len(orgs)
    # each tenant's row holds the tick handled and the next by the cron, for the work API
    for org in orgs:
        ctx = next(
            c
            for c in await first.managers.work.maintenance_contexts(RequestContext.new(APP))
            if c.org_id == org
        )
        [state] = await first.managers.work.schedule_states(ctx)
        assert (state.schedule, state.tick_at, state.next_tick_at) == (
            "worker-probe:hourly",
            datetime(2026, 6, 1, 12, 0, tzinfo=UTC),
            datetime(2026, 6, 1, 13, 0, tzinfo=UTC),
        )


async def test_two_schedulers_over_memory_enqueue_an_hourly_schedule_thrice_in_three_hours(
    memory_queues: tuple[RuntimeContainer, RuntimeContainer],
) -> None:
    await enqueue_three_hours_from_two_schedulers(*memory_queues)


async def test_two_schedulers_over_postgres_enqueue_an_hourly_schedule_thrice_in_three_hours(
    pg_queues: tuple[RuntimeContainer, RuntimeContainer],
) -> None:
    await enqueue_three_hours_from_two_schedulers(*pg_queues)


async def test_a_purge_between_ticks_does_not_enqueue_the_tick_again(
    pg_queues: tuple[RuntimeContainer, RuntimeContainer],
) -> None:
    queue, _ = pg_queues
    (org,) = await tenants(queue, 1)
    clock = StepClock(datetime(2026, 6, 1, 10, 0, 5, tzinfo=UTC))
    ticking = scheduler(queue, [HOURLY], clock)
    assert await ticking.tick_once() == 1
    work = queue.managers.work
    ctx = (await work.maintenance_contexts(RequestContext.new(APP)))[0]
    claimed = await work.claim(
        RequestContext.new(APP), make_settings(PROBE).lane, [PROBE_KIND], "w1", 30.0
    )
    assert claimed is not None
    await work.complete(*claimed)
    await asyncio.sleep(0.01)
    assert await work.purge_completed(ctx, older_than=0) == 1
    fresh = scheduler(queue, [HOURLY], clock)  # a restarted process: it knows nothing
    clock.advance(timedelta(seconds=30))
    assert await fresh.tick_once() == 0
    assert await items_of(queue, org) == []


async def test_a_local_time_runs_once_a_day_across_both_daylight_saving_changes(
    memory_queues: tuple[RuntimeContainer, RuntimeContainer],
) -> None:
    """01:30 in New York, minute by minute across spring forward (8 March 2026) and fall
    back (1 November 2026, when 01:30 happens twice): once each local day."""
    queue, _ = memory_queues
    (org,) = await tenants(queue, 1)
    daily = Schedule(
        name="daily", cron="30 1 * * *", zone="America/New_York", payload=sample_payload()
    )
    days: Counter[str] = Counter()
    for start in (datetime(2026, 3, 7, tzinfo=NEW_YORK), datetime(2026, 10, 31, tzinfo=NEW_YORK)):
        clock = StepClock(start.astimezone(UTC))
        await run_minutes(
            [scheduler(queue, [daily], clock)], clock, until=clock.now + timedelta(days=3)
        )
    for item in await items_of(queue, org):
        assert item.idempotency_key is not None
        tick = datetime.fromisoformat(item.idempotency_key.rsplit("@", 1)[1])
        local = tick.astimezone(NEW_YORK)
        days[local.date().isoformat()] += 1
        assert (local.hour, local.minute) == (1, 30)
    assert days == dict.fromkeys(
        ["2026-03-07", "2026-03-08", "2026-03-09", "2026-10-31", "2026-11-01", "2026-11-02"], 1
    )


def test_a_time_that_does_not_exist_on_spring_forward_day_runs_at_the_first_valid_minute() -> None:
    """procrastinate#1472: 02:30 does not exist in New York on 8 March 2026; it runs at 03:00."""
    schedule = Schedule(name="night", cron="30 2 * * *", zone="America/New_York")
    tick = schedule.next_tick(datetime(2026, 3, 8, 0, 0, tzinfo=NEW_YORK))
    assert tick is not None
    assert tick.astimezone(NEW_YORK).replace(tzinfo=None) == datetime(2026, 3, 8, 3, 0)
    at = datetime(2026, 3, 8, 3, 0, 10, tzinfo=NEW_YORK)
    assert schedule.latest_tick(at) == tick
    assert schedule.next_tick(tick) == datetime(2026, 3, 9, 2, 30, tzinfo=NEW_YORK)


async def test_after_downtime_the_latest_missed_tick_within_the_horizon_is_enqueued_once(
    memory_queues: tuple[RuntimeContainer, RuntimeContainer], caplog: pytest.LogCaptureFixture
) -> None:
    queue, _ = memory_queues
    (org,) = await tenants(queue, 1)
    clock = StepClock(datetime(2026, 6, 1, 10, 0, 5, tzinfo=UTC))
    assert await scheduler(queue, [HOURLY], clock).tick_once() == 1
    clock.advance(timedelta(hours=5, minutes=10))  # down through 11:00 to 15:00
    restarted = scheduler(queue, [HOURLY], clock)
    assert await restarted.tick_once() == 1
    assert await restarted.tick_once() == 0
    assert len(await items_of(queue, org)) == 2
    name = "worker-probe:hourly"
    assert sample(restarted.metrics, "worker_schedule_ticks_missed_total", schedule=name) == 4
    # The log says it too, once, where an operator looks first.
    (warning,) = [r.getMessage() for r in caplog.records if "missed" in r.getMessage()]
    assert warning == (
        f"schedule {name}: 4 ticks missed for tenant {org} before"
        " 2026-06-01T15:00:00+00:00 (this one enqueued late)"
    )


@pytest.mark.parametrize(
    ("catch_up_s", "down", "enqueued", "missed"),
    [(None, timedelta(hours=2, minutes=10), 0, 2), (600.0, timedelta(hours=1, minutes=20), 0, 1)],
)
async def test_a_missed_tick_past_the_horizon_or_without_catch_up_is_counted_not_enqueued(
    memory_queues: tuple[RuntimeContainer, RuntimeContainer],
    catch_up_s: float | None,
    down: timedelta,
    enqueued: int,
    missed: int,
) -> None:
    queue, _ = memory_queues
    await tenants(queue, 1)
    schedule = Schedule(
        name="hourly", cron="0 * * * *", payload=sample_payload(), catch_up_s=catch_up_s
    )
    clock = StepClock(datetime(2026, 6, 1, 10, 0, 5, tzinfo=UTC))
    assert await scheduler(queue, [schedule], clock).tick_once() == 1
    clock.advance(down)
    restarted = scheduler(queue, [schedule], clock)
    assert await restarted.tick_once() == enqueued
    name = "worker-probe:hourly"
    assert sample(restarted.metrics, "worker_schedule_ticks_missed_total", schedule=name) == missed


async def test_a_schedule_for_one_tenant_enqueues_for_it_alone(
    memory_queues: tuple[RuntimeContainer, RuntimeContainer],
) -> None:
    queue, _ = memory_queues
    chosen, other = await tenants(queue, 2)
    clock = StepClock(datetime(2026, 6, 1, 10, 0, 5, tzinfo=UTC))
    mine = Schedule(name="mine", cron="0 * * * *", payload=sample_payload(), tenant=chosen)
    assert await scheduler(queue, [mine], clock).tick_once() == 1
    assert len(await items_of(queue, chosen)) == 1
    assert await items_of(queue, other) == []
    (item,) = await items_of(queue, chosen)
    assert item.status is WorkStatus.AVAILABLE
    assert item.lane == make_settings(PROBE).lane


@pytest.mark.parametrize(
    ("schedule", "refusal"),
    [
        (
            Schedule(name="nightly", cron="61 1 * * *"),
            "worker-probe: schedule 'nightly': malformed cron '61 1 * * *'",
        ),
        (
            Schedule(name="nightly", cron="0 1 * *"),
            "worker-probe: schedule 'nightly': cron '0 1 * *' needs five fields",
        ),
        (
            Schedule(name="nightly", cron="0 1 * * *", zone="America/Gotham"),
            "worker-probe: schedule 'nightly': unknown time zone 'America/Gotham': use an IANA",
        ),
        (
            Schedule(
                name="nightly", cron="0 1 * * *", payload=sample_payload(), catch_up_s=604800.0
            ),
            "worker-probe: schedule 'nightly': catch_up_s (604800 s) must be shorter than "
            "WORKER_PROBE_COMPLETED_RETENTION (604800 s): lower the horizon or raise the "
            "retention",
        ),
        (
            Schedule(name="nightly", cron="0 1 * * *", payload={"record_id": "x"}),
            "worker-probe: schedule 'nightly': payload.record_id:",
        ),
        (
            Schedule(
                name="nightly",
                cron="0 1 * * *",
                tenant=cast(UUID, "7207035f-0000-4000-8000-000000000000"),
            ),
            "worker-probe: schedule 'nightly': tenant '7207035f-0000-4000-8000-000000000000' "
            "is a str, not a UUID: write tenant=UUID('...'), or None for each live tenant",
        ),
    ],
)
def test_a_schedule_that_cannot_run_is_refused_at_start_naming_it_and_the_fix(
    schedule: Schedule, refusal: str
) -> None:
    worker = PROBE.__class__(**{**PROBE.__dict__, "schedules": [schedule]})
    problem = worker.schedule_problem(make_settings(PROBE, completed_retention=7 * 24 * 3600.0))
    assert problem is not None
    assert problem.startswith(refusal), problem
    assert "\n" not in problem


def test_the_schedules_command_lists_each_with_its_next_tick(
    capsys: pytest.CaptureFixture[str],
) -> None:
    daily = Schedule(name="daily", cron="30 1 * * *", zone="America/New_York", tenant=uuid4())
    worker = PROBE.__class__(**{**PROBE.__dict__, "schedules": [daily, HOURLY]})
    print_schedules(worker, datetime(2026, 11, 1, 5, 0, tzinfo=UTC))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("worker-probe:daily\tcron='30 1 * * *'\tzone=America/New_York")
    assert "next=2026-11-01T05:30:00+00:00\tnext_local=2026-11-01T01:30:00-04:00" in lines[0]
    assert "for=each live tenant" in lines[1]
    assert "next=2026-11-01T06:00:00+00:00" in lines[1]
