"""One worker bound to the engine: `Worker`, its name, kind, settings, container, hooks and
schedules.

A worker's `loop.py` builds one `Worker` (its `WORKER`), and its `main.py`'s `cli` runs
`entry.console(WORKER)`. Configuration and the loop it builds, nothing more: this module
imports neither the server nor the command. Everything else a worker runs is the engine's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from acme.infra.cache import CacheInterface
from acme.infra.topics import TopicsInterface
from acme.om.outbox import OutboxRelayInterface
from acme.om.work import WorkManagerInterface
from acme.om.work.types.handler import WorkHandlerInterface
from acme.om.work.types.policy import KindPolicy
from acme.om.work.types.work_item import WORK_POLICIES, WorkKind
from acme.workers.runtime import API_VERSION, OWNER
from acme.workers.runtime.container import (
    RuntimeContainer,
    check_audit_batches,
    outbox_stats_reader,
    parked_record_resumers,
)
from acme.workers.runtime.hooks import NO_HOOKS, ItemHooks
from acme.workers.runtime.loop import WorkerLoop
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.outage import DatabaseOutage
from acme.workers.runtime.queue_stats import OutboxStatsReader
from acme.workers.runtime.schedules import Schedule, Scheduler, schedules_problem
from acme.workers.runtime.settings import RuntimeSettings
from acme.workers.runtime.state import ClaimSignal, LoopState, new_worker_id
from acme.workers.runtime.sweep import ParkedRecordsResumer, Sweep, UnwrittenWrites
from acme.workers.runtime.wake import wake_ups_for


class RuntimeTooOld(RuntimeError):
    """The host's worker runtime is older than the worker needs; the message is one line
    naming the update that brings it."""


@dataclass(frozen=True, kw_only=True)
class Worker:
    """One worker: what it claims and with what, bound to the engine.

    `name`: its console command and service name (kebab-case). `kind`: the work kind it
    runs (its `enqueue`, `items` and `dead-letters` commands act on that kind).
    `settings`: its `RuntimeSettings` subclass, under its own environment prefix, whose
    `lane` and `capacity` say where it claims and how many items it runs at once.
    `container`: its `RuntimeContainer` subclass, which names its handlers (the loop
    claims the kinds they handle). `hooks`: its own steps around each item (`ItemHooks`).
    `schedules`: the periodic items of its kind it enqueues (`schedules.Schedule`).
    `runtime_api`: the engine API version it was written against (`API_VERSION`).
    """

    name: str
    kind: WorkKind
    settings: type[RuntimeSettings]
    container: type[RuntimeContainer]
    hooks: ItemHooks = NO_HOOKS
    schedules: Sequence[Schedule] = ()
    runtime_api: int = API_VERSION

    def check_runtime(self, engine_api: int = API_VERSION) -> None:
        """Raise `RuntimeTooOld` when the engine (`engine_api`) is older than this worker
        needs (`runtime_api`)."""
        if self.runtime_api > engine_api:
            raise RuntimeTooOld(
                f"{self.name} needs worker runtime API {self.runtime_api}, but the host's "
                f"workers/runtime is at API {engine_api}: run `make update-worker NAME={OWNER}`"
            )

    def schedule_problem(self, settings: RuntimeSettings) -> str | None:
        """Why this worker's schedules cannot run under `settings` (one line naming the
        schedule, the worker and the fix), or None (`schedules.schedules_problem`)."""
        return schedules_problem(
            self.schedules, worker=self.name, kind=self.kind, settings=settings
        )

    def loop(
        self,
        container: RuntimeContainer,
        settings: RuntimeSettings,
        *,
        registry: CollectorRegistry,
        **overrides: Any,
    ) -> WorkerLoop:
        """This worker's `WorkerLoop` over `container` with its sweep and wake-up
        subscription (`wire_loop`), its metrics on `registry`, the host's parked-record
        resumers and outbox report taking part (each shape checked, and the audit manager's
        `append_many`: raises `HostContractError`), and its `Scheduler` when it declares
        schedules. `overrides` replace any of `wire_loop`'s keyword arguments (`worker_id`,
        `clock`, `handlers`, `parked`, `scheduler`, ...), for tests.
        """
        check_audit_batches(container.managers)
        metrics = WorkerMetrics(registry)
        scheduler = (
            Scheduler(
                worker=self.name,
                kind=self.kind,
                schedules=self.schedules,
                settings=settings,
                work=container.managers.work,
                metrics=metrics,
            )
            if self.schedules
            else None
        )
        arguments: dict[str, Any] = {
            "settings": settings,
            "work": container.managers.work,
            "handlers": container.handlers,
            "cache": container.infra.cache,
            "topics": container.infra.topics,
            "outbox_relay": container.managers.outbox_relay,
            "metrics": metrics,
            "scheduler": scheduler,
            "parked": parked_record_resumers(container.managers),
            "outbox_stats": outbox_stats_reader(container.managers),
            "hooks": self.hooks,
        }
        return wire_loop(**(arguments | overrides))


def wire_loop(
    *,
    settings: RuntimeSettings,
    work: WorkManagerInterface,
    handlers: Mapping[WorkKind, WorkHandlerInterface],
    cache: CacheInterface,
    topics: TopicsInterface,
    outbox_relay: OutboxRelayInterface,
    metrics: WorkerMetrics,
    parked: Mapping[str, ParkedRecordsResumer] | None = None,
    outbox_stats: OutboxStatsReader | None = None,
    worker_id: str | None = None,
    kinds: Sequence[WorkKind] | None = None,
    policies: Mapping[WorkKind, KindPolicy] = WORK_POLICIES,
    **loop: Any,
) -> WorkerLoop:
    """A `WorkerLoop` with its collaborators: the `Sweep` and the wake-up subscription
    (`wake.wake_ups_for`), sharing its state, claim signal, outage and unwritten writes.
    `loop` holds the loop's other keyword arguments (`clock`, `tracer`, `hooks`)."""
    worker_id = worker_id or new_worker_id()
    kinds = list(kinds) if kinds is not None else list(handlers)
    state = LoopState(
        heartbeat_failure_limit=settings.heartbeat_failure_limit,
        claim_failure_limit_s=settings.claim_failure_limit_s,
    )
    signal = ClaimSignal()
    outage = DatabaseOutage(settings, state)
    unwritten = UnwrittenWrites()
    sweep = Sweep(
        settings=settings,
        work=work,
        outbox_relay=outbox_relay,
        metrics=metrics,
        kinds=kinds,
        worker_id=worker_id,
        parked=parked,
        outbox_stats=outbox_stats,
        policies=policies,
        state=state,
        outage=outage,
        unwritten=unwritten,
    )
    wake_ups = wake_ups_for(
        settings=settings,
        work=work,
        topics=topics,
        kinds=kinds,
        metrics=metrics,
        state=state,
        signal=signal,
    )
    return WorkerLoop(
        settings=settings,
        work=work,
        handlers=handlers,
        cache=cache,
        metrics=metrics,
        sweep=sweep,
        wake_ups=wake_ups,
        state=state,
        signal=signal,
        outage=outage,
        unwritten=unwritten,
        worker_id=worker_id,
        kinds=kinds,
        policies=policies,
        **loop,
    )
