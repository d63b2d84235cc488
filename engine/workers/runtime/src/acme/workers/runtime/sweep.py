"""The maintenance sweep: a maintainer that runs its services on the sweep interval.

Each service does one job and is idempotent (a conditional statement): per tenant, under
its service context, `RequeueStale`, `AuditDeadLetters`, `ResumeParked`, `PurgeDeleted`,
`PurgeCompleted`, `PurgeCancelled`; across tenants, `RelayOutbox` (what a crash left in the
outbox, and the continuations resumed records appended there), `PurgeRelayed`,
`PruneRoster` (worker-roster rows of workers gone without a drain), `UnwrittenWrites`
(items whose final write failed, followed until a sweep hands them back) and last
`QueueStats` (the gauges and the `queue stats` line, `queue_stats.py`). Every call
is wrapped by `SweepSteps`, so one failing step never stops the others. The shape follows
River's queue maintainer (one service per job).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Protocol, TypeVar, runtime_checkable
from uuid import UUID

from acme.om.context import AppContext, AppType, OpContext, RequestContext
from acme.om.errors import NotFound
from acme.om.outbox import OutboxRelayInterface
from acme.om.work import WorkManagerInterface
from acme.om.work.rules import policy_lane, stagger
from acme.om.work.storage import LEASE_EXPIRED
from acme.om.work.types.policy import KindPolicy
from acme.om.work.types.work_item import WORK_POLICIES, WorkItem, WorkKind, WorkStatus
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.outage import DatabaseOutage
from acme.workers.runtime.queue_stats import OutboxStatsReader, QueueStats
from acme.workers.runtime.settings import RuntimeSettings
from acme.workers.runtime.state import LOOP_LOGGER, LoopState, log_item, new_worker_id
from acme.workers.runtime.sweep_steps import Moved, SweepSteps

logger = logging.getLogger(LOOP_LOGGER)

T = TypeVar("T")

_AWAITING_SWEEP_LIMIT = 1000  # items with a failed final write followed until swept

RESUME_LIMIT = 100
"""Parked records one resumer resumes per tenant and sweep pass (the rest wait a pass)."""


@runtime_checkable
class ParkedRecordsResumer(Protocol):
    """A host manager that resumes its parked records; the sweep calls it per tenant.

    `resume_parked` resumes the tenant's due records, at most `limit`, each by a
    compare-and-set on its `version` that appends its continuation to the outbox in the
    same transaction, and returns how many; idempotent, safe with several workers sweeping.
    The host contract's optional part (docs/host-contract.md, "Parked records"); the
    container finds every such manager (`container.parked_record_resumers`).
    """

    async def resume_parked(self, ctx: OpContext, *, limit: int) -> int:
        """Resume up to `limit` of `ctx`'s tenant's due parked records; how many."""
        ...


class TenantService(Protocol):
    """One job of the sweep, run per tenant under its service context."""

    async def sweep_tenant(self, steps: SweepSteps, ctx: OpContext, moved: Moved) -> None:
        """Run the job for `ctx`'s tenant, each call through `steps`."""
        ...


class RequeueStale:
    """Stale leases back to the queue, or a dead letter when out of attempts."""

    def __init__(self, work: WorkManagerInterface) -> None:
        self._work = work

    async def sweep_tenant(self, steps: SweepSteps, ctx: OpContext, moved: Moved) -> None:
        await steps.move(moved, "requeue_stale", partial(self._work.requeue_stale, ctx))


class AuditDeadLetters:
    """The audit entries dead letters still owe, each written once."""

    def __init__(self, work: WorkManagerInterface) -> None:
        self._work = work

    async def sweep_tenant(self, steps: SweepSteps, ctx: OpContext, moved: Moved) -> None:
        await steps.move(moved, "audit_dead_letters", partial(self._work.audit_dead_letters, ctx))


async def _resume_parked(resumer: ParkedRecordsResumer, ctx: OpContext) -> int:
    """`resumer.resume_parked` for one tenant; raises `TypeError` unless it counts in an int."""
    resumed: object = await resumer.resume_parked(ctx, limit=RESUME_LIMIT)
    if not isinstance(resumed, int) or isinstance(resumed, bool) or resumed < 0:
        raise TypeError(f"resume_parked returned {resumed!r}, not the number of records it resumed")
    return resumed


class ResumeParked:
    """Due parked records, through each host manager that resumes them (`RESUME_LIMIT`
    each per tenant and pass); the step's `source` names the manager."""

    def __init__(self, parked: Mapping[str, ParkedRecordsResumer]) -> None:
        self._parked = dict(parked)

    async def sweep_tenant(self, steps: SweepSteps, ctx: OpContext, moved: Moved) -> None:
        for name, resumer in self._parked.items():
            call = partial(_resume_parked, resumer, ctx)
            await steps.move(moved, "resume_parked", call, source=name)


class PurgeDeleted:
    """Soft-deleted items past `retention` seconds."""

    def __init__(self, work: WorkManagerInterface, retention_s: float) -> None:
        self._work, self._retention_s = work, retention_s

    async def sweep_tenant(self, steps: SweepSteps, ctx: OpContext, moved: Moved) -> None:
        call = partial(self._work.purge_deleted, ctx, older_than=self._retention_s)
        await steps.move(moved, "purge_deleted", call)


class PurgeCompleted:
    """Completed items past `completed_retention` seconds (skipped while it is 0)."""

    def __init__(self, work: WorkManagerInterface, retention_s: float) -> None:
        self._work, self._retention_s = work, retention_s

    async def sweep_tenant(self, steps: SweepSteps, ctx: OpContext, moved: Moved) -> None:
        if self._retention_s > 0:
            call = partial(self._work.purge_completed, ctx, older_than=self._retention_s)
            await steps.move(moved, "purge_completed", call)


class PurgeCancelled:
    """Cancelled items past `retention` seconds since their cancel."""

    def __init__(self, work: WorkManagerInterface, retention_s: float) -> None:
        self._work, self._retention_s = work, retention_s

    async def sweep_tenant(self, steps: SweepSteps, ctx: OpContext, moved: Moved) -> None:
        call = partial(self._work.purge_cancelled, ctx, older_than=self._retention_s)
        await steps.move(moved, "purge_cancelled", call)


class RelayOutbox:
    """Relay what the outbox holds (a crash's leftovers, resumed records' continuations),
    then purge relayed rows past `retention` seconds."""

    def __init__(self, relay: OutboxRelayInterface, retention_s: float) -> None:
        self._relay, self._retention_s = relay, retention_s

    async def sweep(self, steps: SweepSteps, rctx: RequestContext, moved: Moved) -> None:
        await steps.move(moved, "relay_pending", partial(self._relay.relay_pending, rctx))
        purge = partial(self._relay.purge_relayed, rctx, older_than=self._retention_s)
        await steps.move(moved, "purge_relayed", purge)


class PruneRoster:
    """Worker-roster rows expired more than `grace_s` seconds ago: workers killed without a
    drain (docs/decisions/0049)."""

    def __init__(self, work: WorkManagerInterface, grace_s: float) -> None:
        self._work, self._grace_s = work, grace_s

    async def sweep(self, steps: SweepSteps, rctx: RequestContext, moved: Moved) -> None:
        prune = partial(self._work.prune_workers, rctx, expired_for_s=self._grace_s)
        await steps.move(moved, "prune_roster", prune)


class UnwrittenWrites:
    """Items whose final write (completion, failure) failed, followed until a sweep hands
    them back; at most `_AWAITING_SWEEP_LIMIT` are followed, the rest only logged."""

    def __init__(self) -> None:
        self.items: dict[UUID, tuple[OpContext, WorkItem, str]] = {}

    def follow(self, ctx: OpContext, item: WorkItem, reason: str) -> None:
        """Follow `item` (`reason`: `completion_failed` or `failure_unrecorded`)."""
        if len(self.items) < _AWAITING_SWEEP_LIMIT:
            self.items[item.id] = (ctx, item, reason)

    async def check(self, work: WorkManagerInterface, metrics: WorkerMetrics) -> int:
        """Read each followed item: one handed back since (claimed again, or noted `lease
        expired`) is counted in `worker_unwritten_recovered_total{kind, reason}` and
        forgotten, one the write reached after all is forgotten, one still held is kept.
        Returns how many were handed back; raises what the reads raise."""
        recovered = 0
        for item_id, (ctx, held, reason) in list(self.items.items()):
            try:
                item = await work.get(ctx, item_id)
            except NotFound:
                self.items.pop(item_id, None)
                continue
            if item.status == WorkStatus.CLAIMED and item.attempts == held.attempts:
                continue  # its lease has not passed, or no sweep has run since
            self.items.pop(item_id, None)
            if item.attempts > held.attempts or item.note == LEASE_EXPIRED:
                recovered += 1
                metrics.unwritten_recovered.labels(kind=str(held.kind), reason=reason).inc()
                log_item(logging.INFO, "handed back by the sweep", held, reason=reason)
        return recovered


class Sweep:
    """The queue maintainer: one pass of every service at once, the second after this
    worker's stagger (`rules.stagger`), then one per `sweep_interval` seconds (`run`).

    `parked`: the host managers whose parked records are resumed; `outbox_stats`: the
    host's relay when it reports the outbox (None: no `worker_outbox_*` gauges, said once).
    `state`, `outage` and `unwritten` are shared with the worker's loop (fresh ones alone).
    """

    def __init__(
        self,
        *,
        settings: RuntimeSettings,
        work: WorkManagerInterface,
        outbox_relay: OutboxRelayInterface,
        metrics: WorkerMetrics,
        kinds: Sequence[WorkKind],
        worker_id: str | None = None,
        parked: Mapping[str, ParkedRecordsResumer] | None = None,
        outbox_stats: OutboxStatsReader | None = None,
        policies: Mapping[WorkKind, KindPolicy] = WORK_POLICIES,
        state: LoopState | None = None,
        outage: DatabaseOutage | None = None,
        unwritten: UnwrittenWrites | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.worker_id = worker_id or new_worker_id()
        self.state = state or LoopState(heartbeat_failure_limit=settings.heartbeat_failure_limit)
        self.outage = outage or DatabaseOutage(settings, self.state)
        self.unwritten = unwritten or UnwrittenWrites()
        self.steps = SweepSteps(settings, metrics, self.state, self.outage)
        self._work = work
        self._kinds = list(kinds)
        self._policies = policies
        self._app = AppContext(type=AppType.WORKER, version=settings.app_version)
        self.tenant_services: list[TenantService] = [
            RequeueStale(work),
            AuditDeadLetters(work),
            ResumeParked(parked or {}),
            PurgeDeleted(work, settings.retention),
            PurgeCompleted(work, settings.completed_retention),
            PurgeCancelled(work, settings.retention),
        ]
        self.relay = RelayOutbox(outbox_relay, settings.retention)
        self.roster = PruneRoster(work, settings.roster_grace)
        self.queue_stats = QueueStats(
            settings=settings,
            work=work,
            metrics=metrics,
            kinds=self._kinds,
            policies=policies,
            state=self.state,
            outbox_stats=outbox_stats,
        )

    async def run(self) -> None:
        """Sweep until cancelled: the first pass at once (a restart recovers what a crash
        left), the second after the stagger (less than one interval), then every interval;
        replicas started together thus sweep out of step."""
        self.queue_stats.say_what_is_not_exported()
        for kind in self._kinds:
            lane = policy_lane(kind, self._policies)
            if lane != self.settings.lane:
                logger.warning(
                    "this worker claims %s on lane %s, but the kind's policy enqueues it on "
                    "%s: new items wait there unclaimed (set %sLANE=%s, or change the kind's "
                    "KindPolicy)",
                    kind,
                    self.settings.lane,
                    lane,
                    self.settings.env_prefix(),
                    lane,
                )
        await self._sweep_logged()
        await asyncio.sleep(stagger(self.worker_id, self.settings.sweep_interval))
        while True:
            await self._sweep_logged()
            await asyncio.sleep(self.settings.sweep_interval)

    async def _sweep_logged(self) -> None:
        """One pass, its moves logged; an error outside every step (a bug) is logged too."""
        try:
            moved = await self.sweep_once()
        except Exception:
            self.metrics.sweep_errors.labels(step="pass").inc()
            logger.exception("sweep pass failed; the next pass runs on time")
            return
        if moved:
            logger.info("swept %s", " ".join(f"{step}={rows}" for step, rows in moved.items()))

    async def sweep_once(self) -> Moved:
        """One pass of every service, in the order of the module docstring; returns the
        rows each step moved. Never raises (each step wrapped)."""
        rctx = RequestContext.new(self._app)
        moved: Moved = {}
        steps = self.steps
        contexts = await steps.run(
            "maintenance_contexts", partial(self._work.maintenance_contexts, rctx), reads_queue=True
        )
        for ctx in contexts or []:
            for service in self.tenant_services:
                await service.sweep_tenant(steps, ctx, moved)
        await self.relay.sweep(steps, rctx, moved)
        await self.roster.sweep(steps, rctx, moved)
        if self.unwritten.items:
            await steps.run("unwritten", partial(self.unwritten.check, self._work, self.metrics))
        await self.queue_stats.sweep(steps, rctx)
        return moved
