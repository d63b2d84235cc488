"""One worker bound to the engine: `Worker`, its name, kind, settings, container and hooks.

A worker's `loop.py` builds one `Worker` (its `WORKER`), and its `main.py`'s `cli` runs
`entry.console(WORKER)`. Configuration and the loop it builds, nothing more: this module
imports neither the server nor the command. Everything else a worker runs is the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from acme.om.work.types.work_item import WorkKind
from acme.workers.runtime import API_VERSION, OWNER
from acme.workers.runtime.container import (
    RuntimeContainer,
    check_audit_batches,
    outbox_stats_reader,
    parked_record_resumers,
)
from acme.workers.runtime.loop import NO_HOOKS, ItemHooks, WorkerLoop
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.settings import RuntimeSettings


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
    `runtime_api`: the engine API version it was written against (`API_VERSION`).
    """

    name: str
    kind: WorkKind
    settings: type[RuntimeSettings]
    container: type[RuntimeContainer]
    hooks: ItemHooks = NO_HOOKS
    runtime_api: int = API_VERSION

    def check_runtime(self, engine_api: int = API_VERSION) -> None:
        """Raise `RuntimeTooOld` when the engine (`engine_api`) is older than this worker
        needs (`runtime_api`)."""
        if self.runtime_api > engine_api:
            raise RuntimeTooOld(
                f"{self.name} needs worker runtime API {self.runtime_api}, but the host's "
                f"workers/runtime is at API {engine_api}: run `make update-worker NAME={OWNER}`"
            )

    def loop(
        self,
        container: RuntimeContainer,
        settings: RuntimeSettings,
        *,
        registry: CollectorRegistry,
        **overrides: Any,
    ) -> WorkerLoop:
        """This worker's `WorkerLoop` over `container`, its metrics on `registry`, the
        host's parked-record resumers and outbox report taking part (each shape checked, and
        the audit manager's `append_many`: raises `HostContractError`). `overrides`
        replace any of the loop's keyword arguments (`worker_id`, `clock`, `handlers`,
        `parked`, ...), for tests.
        """
        check_audit_batches(container.managers)
        arguments: dict[str, Any] = {
            "settings": settings,
            "work": container.managers.work,
            "handlers": container.handlers,
            "cache": container.infra.cache,
            "topics": container.infra.topics,
            "outbox_relay": container.managers.outbox_relay,
            "metrics": WorkerMetrics(registry),
            "parked": parked_record_resumers(container.managers),
            "outbox_stats": outbox_stats_reader(container.managers),
            "hooks": self.hooks,
        }
        return WorkerLoop(**(arguments | overrides))
