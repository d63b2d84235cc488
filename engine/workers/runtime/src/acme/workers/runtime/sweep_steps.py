"""`SweepSteps`: how the sweep runs each step of a pass: bounded, counted and logged, and
never fatal to the pass (the steps in `sweep.py` and `queue_stats.py` share it)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.outage import DatabaseOutage
from acme.workers.runtime.settings import RuntimeSettings
from acme.workers.runtime.state import LOOP_LOGGER, LoopState

logger = logging.getLogger(LOOP_LOGGER)

T = TypeVar("T")

Moved = dict[str, int]
"""The rows each step moved in one pass, by step name."""


class SweepSteps:
    """Runs each sweep step wrapped: bounded at `sweep_step_timeout` seconds, any exception
    and the timeout counted (`worker_sweep_errors_total{step}`), logged and swallowed."""

    def __init__(
        self,
        settings: RuntimeSettings,
        metrics: WorkerMetrics,
        state: LoopState,
        outage: DatabaseOutage,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.state = state
        self.outage = outage
        self._failing: dict[str, int] = {}  # step to its failures in a row
        self._unsaid: set[str] = set()  # steps this pass failed without a line

    async def move(
        self, moved: Moved, step: str, call: Callable[[], Awaitable[int]], *, source: str = ""
    ) -> None:
        """Run one moving step and count the rows it moved (`worker_sweep_moved_total`)."""
        rows = await self.run(step, call, source=source)
        if rows:
            moved[step] = moved.get(step, 0) + rows
            self.metrics.sweep_moved.labels(step=step).inc(rows)

    async def run(
        self,
        step: str,
        call: Callable[[], Awaitable[T]],
        *,
        source: str = "",
        reads_queue: bool = False,
    ) -> T | None:
        """`await call()`; None when it raised (even before its first await) or timed out.

        A step cancelled at its bound rolls back; the next pass retries it. A step's first
        failure is logged with its traceback, later ones once per pass (`say_failing`), a
        database outage's by `DatabaseOutage.failed`; a step that `reads_queue` and
        succeeds ends one.
        """
        name = f"{step} ({source})" if source else step
        bound = asyncio.timeout(self.settings.sweep_step_timeout)
        began = time.monotonic()
        try:
            async with bound:
                result = await call()
        except Exception as exc:
            self.metrics.sweep_errors.labels(step=step).inc()
            again = name in self._failing
            self._failing[name] = self._failing.get(name, 0) + 1
            origin = f"sweep step {step}"
            if not bound.expired():
                outage = self.outage.failed(exc, origin, began)
            else:
                # A step that hangs is an outage's when the queue's own storage did not
                # answer, or while the database is known to be down; else a lock, a host call.
                unanswered = TimeoutError(
                    f"no answer within {self.settings.sweep_step_timeout:g} s"
                )
                down = reads_queue or self.state.database_down_since is not None
                outage = down and self.outage.failed(unanswered, origin, began)
            if again or outage:
                self._unsaid.add(name)  # said once per pass (`say_failing`)
            elif bound.expired():
                logger.error(
                    "sweep step %s ran past %s s; cancelled, the next pass retries it",
                    name,
                    self.settings.sweep_step_timeout,
                )
            else:
                logger.exception("sweep step %s failed; the next pass retries it", name)
            return None
        failures = self._failing.pop(name, 0)
        if failures:
            logger.info("sweep step %s succeeds again after %d failure(s)", name, failures)
        if reads_queue:
            self.outage.answered()  # the queue's own storage answered: the database is up
        return result

    def say_failing(self) -> None:
        """One WARNING for the steps that failed this pass without a line of their own,
        with each step's failures in a row."""
        if self._unsaid:
            counts = " ".join(
                f"{name}={self._failing.get(name, 0)}" for name in sorted(self._unsaid)
            )
            logger.warning(
                "sweep steps still failing (failures in a row): %s; the next pass retries them",
                counts,
            )
            self._unsaid.clear()
