"""Test helpers for workers and the engine: settings, a clock, handlers, runners, and
`PROBE`, the worker the engine's own tests run.

Importable from any test (the tests run in importlib mode, so test folders are not on the
path); nothing here runs in production. The process tests' worker and the servers and
proxies the engine's own tests start stay in the template's repository. The pattern
follows procrastinate's `testing.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar
from uuid import UUID, uuid4

from pydantic_settings import SettingsConfigDict

from acme.om.context import AppContext, AppType, OpContext, RequestContext
from acme.om.root import Managers
from acme.om.work.types.handler import WorkHandlerInterface
from acme.om.work.types.work_item import WorkItem, WorkKind
from acme.workers.runtime.container import RuntimeContainer
from acme.workers.runtime.loop import WorkerLoop
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.settings import RuntimeSettings
from acme.workers.runtime.worker import Worker

APP = AppContext(type=AppType.WORKER, version="worker@test")

# Fast but not hair-trigger (seconds): a renewal every 0.12 s, a beat every 0.05 s.
FAST: dict[str, Any] = {
    "capacity": 2,
    "lease": 0.6,
    "heartbeat_interval": 0.05,
    "heartbeat_failure_limit": 2,
    "sweep_interval": 60.0,
    "poll_interval": 0.05,
    "drain_deadline": 2.0,
}


LoopFactory = Callable[..., WorkerLoop]
"""The type of the `make_loop` fixture: keywords override `WorkerLoop`'s arguments."""


def sample_payload() -> dict[str, Any]:
    """A payload the kind's model accepts; reshape it with the payload model."""
    return {"record_id": str(uuid4())}


def make_settings(worker: Worker, **overrides: Any) -> RuntimeSettings:
    """`worker`'s settings with the `FAST` values and `overrides`."""
    return worker.settings.model_validate(FAST | overrides)


def new_items(worker: Worker, ctx: OpContext, count: int = 1, **fields: Any) -> list[WorkItem]:
    """`count` items of `worker`'s kind, on its settings' default lane, for `ctx`'s tenant."""
    lane = worker.settings().lane
    kind = worker.kind
    return [
        WorkItem.new(org_id=ctx.org_id, kind=kind, payload=sample_payload(), lane=lane, **fields)
        for _ in range(count)
    ]


async def claimed_item(
    worker: Worker, container: RuntimeContainer, ctx: OpContext
) -> tuple[OpContext, WorkItem]:
    """Enqueue one item of `worker`'s kind in `ctx`'s tenant and claim it as the worker's
    loop would: the context the claim returned and the claimed item (a handler's input)."""
    (item,) = await container.managers.work.enqueue_many(ctx, new_items(worker, ctx))
    lane = worker.settings().lane
    claimed = await container.managers.work.claim(
        RequestContext.new(APP), lane, [worker.kind], "test-worker", 30.0
    )
    assert claimed is not None, "nothing was claimed"
    assert claimed[1].id == item.id, "another item was claimed"
    return claimed


class FakeClock:
    """A wall clock the test moves: `clock()` reads it, `advance(s)` jumps it (seconds)."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Signal:
    """A counter a test waits on without sleeping: `bump()`, then `await reach(n)`."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = asyncio.Event()

    def bump(self) -> None:
        self.count += 1
        self._changed.set()

    async def reach(self, n: int, within: float = 5.0) -> None:
        """Return once `count >= n`; raises `TimeoutError` after `within` seconds."""
        async with asyncio.timeout(within):
            while self.count < n:
                self._changed.clear()
                await self._changed.wait()


class GateHandler(WorkHandlerInterface):
    """Records each start and waits on `gate`; counts a cancellation before re-raising."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started = Signal()
        self.cancelled = Signal()
        self.finished = Signal()
        self.items: list[UUID] = []

    async def handle(self, ctx: OpContext, item: WorkItem) -> None:
        self.items.append(item.id)
        self.started.bump()
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled.bump()
            raise
        self.finished.bump()


@asynccontextmanager
async def running(loop: WorkerLoop) -> AsyncIterator[asyncio.Task[None]]:
    """Run `loop` for the block, then stop it and wait for its drain (at most 5 s)."""
    task = asyncio.create_task(loop.run())
    try:
        yield task
    finally:
        loop.stop()
        async with asyncio.timeout(5.0):
            await task


def sample(metrics: WorkerMetrics, name: str, **labels: str) -> float:
    """The current value of one sample of `metrics`' registry (0.0 when never recorded)."""
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


class ProbeSettings(RuntimeSettings):
    """The probe worker's settings, under `WORKER_PROBE_`."""

    model_config = SettingsConfigDict(env_prefix="WORKER_PROBE_", extra="ignore", frozen=True)
    service_name: ClassVar[str] = "worker-probe"


class _NoOpHandler(WorkHandlerInterface):
    """Handles an item by doing nothing (the engine's tests replace it where it matters)."""

    async def handle(self, ctx: OpContext, item: WorkItem) -> None:
        return None


PROBE_KIND = next(iter(WorkKind))
"""The kind the probe worker runs: the first the host defines."""


class ProbeContainer(RuntimeContainer):
    """The probe worker's container: a no-op handler for `PROBE_KIND`."""

    @staticmethod
    def make_handlers(managers: Managers) -> dict[WorkKind, WorkHandlerInterface]:
        return {PROBE_KIND: _NoOpHandler()}


PROBE = Worker(
    name="worker-probe", kind=PROBE_KIND, settings=ProbeSettings, container=ProbeContainer
)
"""The worker the engine's own tests run: the first kind of the host, a no-op handler, its
settings under `WORKER_PROBE_`. A worker's tests run the engine's contract over its own
`WORKER` instead (`runtime.contract`)."""
