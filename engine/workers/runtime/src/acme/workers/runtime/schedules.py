"""Periodic items: a worker's schedules (`Schedule`) and the `Scheduler` that enqueues each
tick once, whatever number of processes run it (docs/decisions/0034).

A tick is the time a cron expression names in its time zone; the `Scheduler`, a loop
collaborator (docs/decisions/0030), enqueues it by advancing the schedule's state row from
the tick it read, in the enqueue's transaction (`WorkManagerInterface.enqueue_tick`): of
many processes, one advances the row and the rest write nothing. Expressions are read by
cronsim, which follows Debian cron across daylight-saving changes: a time that occurs
twice runs once, a time that does not exist runs at the first valid minute after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import ValidationError

from acme.om.context import AppContext, AppType, OpContext, RequestContext
from acme.om.work import WorkManagerInterface
from acme.om.work.types.work_item import WORK_PAYLOADS, WorkItem, WorkKind
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.settings import RuntimeSettings
from acme.workers.runtime.state import LOOP_LOGGER

logger = logging.getLogger(LOOP_LOGGER)

DEFAULT_CATCH_UP_S = 3600.0
"""A schedule's default catch-up horizon: after downtime, the latest missed tick is enqueued
when it is at most an hour old (`Schedule.catch_up_s`)."""

ON_TIME_S = 60.0
"""A tick enqueued at most this many seconds after its time is on time; a later one is a
catch-up, which the schedule's horizon allows or not."""

SCHEDULER_PASS_S = 30.0
"""The longest the scheduler sleeps between passes; it wakes sooner for a nearer tick."""

MISSED_COUNT_LIMIT = 10_000
"""Missed ticks counted at most per advance (a minutely schedule down for a week)."""

MAX_NAME_LENGTH = 64
"""A schedule's name, at most (its items' idempotency keys carry it)."""

Clock = Callable[[], datetime]


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """A periodic item of the worker's kind, declared in its `loop.py` (`Worker.schedules`).

    `name`: unique in the worker, snake_case. `cron`: five fields, minute hour day-of-month
    month day-of-week (`"30 1 * * *"`: 01:30 daily), read in `zone`, an IANA time zone.
    `payload`: the kind's payload, validated at start. `tenant`: the one tenant it runs for;
    None runs it for each live tenant. `catch_up_s`: after downtime, the latest missed tick
    is enqueued when at most this many seconds old (shorter than `COMPLETED_RETENTION`);
    None enqueues no missed tick.
    """

    name: str
    cron: str
    zone: str = "UTC"
    payload: Mapping[str, Any] = field(default_factory=dict)
    tenant: UUID | None = None
    catch_up_s: float | None = DEFAULT_CATCH_UP_S

    def key(self, worker: str) -> str:
        """Its state row's `schedule` column: `<worker>:<name>`."""
        return f"{worker}:{self.name}"

    def latest_tick(self, now: datetime) -> datetime | None:
        """The latest tick at or before `now` (aware), in UTC; None when none in 50 years."""
        zone = ZoneInfo(self.zone)
        # cronsim's reverse walk starts one second back: start one second ahead.
        start = (now + timedelta(seconds=1)).astimezone(zone).replace(microsecond=0)
        try:
            return next(CronSim(self.cron, start, reverse=True)).astimezone(UTC)
        except StopIteration:
            return None

    def next_tick(self, after: datetime) -> datetime | None:
        """The first tick after `after` (aware), in UTC; None when none in 50 years."""
        start = after.astimezone(ZoneInfo(self.zone))
        try:
            return next(CronSim(self.cron, start)).astimezone(UTC)
        except StopIteration:
            return None

    def ticks_between(self, after: datetime, before: datetime) -> int:
        """Ticks strictly between `after` and `before`, at most `MISSED_COUNT_LIMIT`."""
        found = 0
        walk = CronSim(self.cron, after.astimezone(ZoneInfo(self.zone)))
        for tick in walk:
            if tick >= before or found >= MISSED_COUNT_LIMIT:
                break
            found += 1
        return found


def schedule_problem(
    schedule: Schedule, *, worker: str, kind: WorkKind, settings: RuntimeSettings
) -> str | None:
    """Why `schedule` cannot run, one line naming it, the worker and the fix; None when it
    can. Checked at start, before anything is written: the tenant's type, the expression,
    the zone, the payload and the catch-up horizon against `COMPLETED_RETENTION`."""
    where = f"{worker}: schedule {schedule.name!r}"
    if not schedule.name.isidentifier() or schedule.name != schedule.name.lower():
        return f"{where}: name it in snake_case (letters, digits, underscores)"
    if len(schedule.name) > MAX_NAME_LENGTH:
        return f"{where}: name it in at most {MAX_NAME_LENGTH} characters"
    # Typed UUID, but `loop.py` is not always type-checked: a string never equals a
    # tenant's id, so the schedule would wait forever.
    tenant: object = schedule.tenant
    if tenant is not None and not isinstance(tenant, UUID):
        return (
            f"{where}: tenant {tenant!r} is a {type(tenant).__name__}, "
            "not a UUID: write tenant=UUID('...'), or None for each live tenant"
        )
    if len(schedule.cron.split()) != 5:
        return (
            f"{where}: cron {schedule.cron!r} needs five fields, minute hour day-of-month "
            "month day-of-week (for example '30 1 * * *', 01:30 daily)"
        )
    try:
        zone = ZoneInfo(schedule.zone)
    except (ZoneInfoNotFoundError, ValueError):
        return (
            f"{where}: unknown time zone {schedule.zone!r}: use an IANA name such as "
            "'UTC' or 'America/New_York'"
        )
    try:
        CronSim(schedule.cron, datetime.now(zone))
    except CronSimError as exc:
        return f"{where}: malformed cron {schedule.cron!r} ({exc}): fix the expression"
    try:
        WORK_PAYLOADS[kind].model_validate(dict(schedule.payload))
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(part) for part in first["loc"])
        return f"{where}: payload.{path}: {first['msg']}: fix the schedule's payload"
    horizon, retention = schedule.catch_up_s, settings.completed_retention
    if horizon is not None and horizon <= 0:
        return f"{where}: catch_up_s must be above 0 (None: no catch-up)"
    if horizon is not None and retention and horizon >= retention:
        return (
            f"{where}: catch_up_s ({horizon:g} s) must be shorter than "
            f"{settings.env_prefix()}COMPLETED_RETENTION ({retention:g} s): lower the "
            "horizon or raise the retention"
        )
    return None


def schedules_problem(
    schedules: Sequence[Schedule], *, worker: str, kind: WorkKind, settings: RuntimeSettings
) -> str | None:
    """The first problem of `schedules` (`schedule_problem`, or a name used twice)."""
    seen: set[str] = set()
    for schedule in schedules:
        if schedule.name in seen:
            return f"{worker}: schedule {schedule.name!r} is declared twice: rename one"
        seen.add(schedule.name)
        problem = schedule_problem(schedule, worker=worker, kind=kind, settings=settings)
        if problem is not None:
            return problem
    return None


@dataclass(frozen=True)
class Decision:
    """What one pass does with a schedule's latest tick: enqueue it, and how many ticks it
    counts as missed (those passed over, and the tick itself when it is not enqueued)."""

    enqueue: bool
    missed: int


def decide(
    schedule: Schedule, *, previous: datetime | None, tick: datetime, now: datetime
) -> Decision:
    """Whether the latest tick `tick` (after `previous`, the state row's; None: no row yet)
    is enqueued at `now`: on time (`ON_TIME_S`) always; later, when the schedule's
    catch-up horizon reaches it. A schedule seen for the first time enqueues only a tick on
    time and counts nothing missed: it never ran before."""
    late_s = (now - tick).total_seconds()
    if previous is None:
        return Decision(enqueue=late_s <= ON_TIME_S, missed=0)
    enqueue = late_s <= ON_TIME_S or (
        schedule.catch_up_s is not None and late_s <= schedule.catch_up_s
    )
    passed_over = schedule.ticks_between(previous, tick)
    return Decision(enqueue=enqueue, missed=passed_over + (0 if enqueue else 1))


class Scheduler:
    """Enqueues the ticks of `schedules` for the worker `worker` (its kind, on its lane),
    for each tenant they name: one pass at start, then one at each tick's time (at most
    `SCHEDULER_PASS_S` apart), on `clock` (aware UTC; tests pass their own).

    Stateless but for what it last read of each state row, so any number of processes run
    it: a process whose read is stale loses the conditional advance, reads again and finds
    the tick handled. Each item names its tick in its idempotency key
    (`<worker>:<name>@<tick, UTC ISO 8601>`), for operators; the state row, not the key,
    keeps the tick from running twice. Counts `worker_schedule_ticks_enqueued` and
    `_missed`.
    """

    def __init__(
        self,
        *,
        worker: str,
        kind: WorkKind,
        schedules: Sequence[Schedule],
        settings: RuntimeSettings,
        work: WorkManagerInterface,
        metrics: WorkerMetrics,
        clock: Clock | None = None,
    ) -> None:
        self.worker = worker
        self.schedules = list(schedules)
        self._kind = kind
        self._lane = settings.lane
        self._work = work
        self.metrics = metrics
        self._clock = clock or (lambda: datetime.now(UTC))
        self._app = AppContext(type=AppType.WORKER, version=settings.app_version)
        self._known: dict[tuple[UUID, str], datetime] = {}
        self._absent: set[UUID] = set()

    async def run(self) -> None:
        """Pass until cancelled; a failed pass is logged and the next runs on time."""
        while True:
            try:
                enqueued = await self.tick_once()
                if enqueued:
                    logger.info("schedules of %s: %d ticks enqueued", self.worker, enqueued)
            except Exception:
                logger.exception("schedule pass failed; the next pass runs on time")
            await asyncio.sleep(self._pause_s())

    def _pause_s(self) -> float:
        now = self._clock()
        ticks = [t for s in self.schedules if (t := s.next_tick(now)) is not None]
        if not ticks:
            return SCHEDULER_PASS_S
        return min(max((min(ticks) - now).total_seconds(), 0.1), SCHEDULER_PASS_S)

    async def tick_once(self) -> int:
        """One pass over every schedule and tenant; the ticks this pass enqueued."""
        if not self.schedules:
            return 0
        contexts = await self._work.maintenance_contexts(RequestContext.new(self._app))
        live = {ctx.org_id: ctx for ctx in contexts}
        enqueued = 0
        for schedule in self.schedules:
            if schedule.tenant is None:
                targets = list(live.values())
            elif schedule.tenant in live:
                targets = [live[schedule.tenant]]
            else:
                if schedule.tenant not in self._absent:
                    self._absent.add(schedule.tenant)
                    logger.warning(
                        "schedule %s: tenant %s is not a live tenant; its ticks wait",
                        schedule.key(self.worker),
                        schedule.tenant,
                    )
                targets = []
            for ctx in targets:
                enqueued += await self._tick(schedule, ctx)
        return enqueued

    async def _tick(self, schedule: Schedule, ctx: OpContext) -> int:
        """Handle `schedule`'s latest tick for `ctx`'s tenant; 1 when this call enqueued it."""
        now = self._clock()
        tick = schedule.latest_tick(now)
        name = schedule.key(self.worker)
        if tick is None:
            return 0
        known = (ctx.org_id, name)
        if known not in self._known or self._known[known] < tick:
            ticks = await self._work.schedule_ticks(ctx)
            for stored_name, stored in ticks.items():
                self._known[ctx.org_id, stored_name] = stored
        previous = self._known.get(known)
        if previous is not None and previous >= tick:
            return 0
        decision = decide(schedule, previous=previous, tick=tick, now=now)
        item = (
            WorkItem.new(
                org_id=ctx.org_id,
                kind=self._kind,
                payload=schedule.payload,
                lane=self._lane,
                idempotency_key=f"{name}@{tick.isoformat()}",
            )
            if decision.enqueue
            else None
        )
        advanced = await self._work.enqueue_tick(
            ctx, name, previous=previous, tick=tick, item=item, next_tick=schedule.next_tick(tick)
        )
        if not advanced:
            self._known.pop(known, None)  # another process was first: read again next pass
            return 0
        self._known[known] = tick
        if decision.missed:
            self.metrics.ticks_missed.labels(schedule=name).inc(decision.missed)
            logger.warning(
                "schedule %s: %d ticks missed for tenant %s before %s (%s)",
                name,
                decision.missed,
                ctx.org_id,
                tick.isoformat(),
                "this one enqueued late" if item is not None else "none enqueued",
            )
        if item is None:
            return 0
        self.metrics.ticks_enqueued.labels(schedule=name).inc()
        return 1
