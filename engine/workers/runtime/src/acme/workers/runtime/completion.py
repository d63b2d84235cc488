"""Group commit of completions: one `complete_many` per batch, whatever its tenants.

While a write is in flight, handled items gather; the next write takes them all, each row
fenced on its own claim token (docs/decisions/0021).
"""

from __future__ import annotations

import asyncio
import logging
import time

from acme.om.work import WorkManagerInterface
from acme.workers.runtime.errors import one_line
from acme.workers.runtime.lease import mark_cancelled
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.outage import DatabaseOutage
from acme.workers.runtime.state import LOOP_LOGGER, ClaimSignal, InFlight, Phase, log_item
from acme.workers.runtime.sweep import UnwrittenWrites

logger = logging.getLogger(LOOP_LOGGER)


class Completions:
    """The loop's completion queue; `unwritten` counts the completions not yet written.

    A failed write is logged, counted (`worker_completions_failed_total`) and each of its
    items followed until a sweep hands it back (`UnwrittenWrites`).
    """

    def __init__(
        self,
        *,
        work: WorkManagerInterface,
        metrics: WorkerMetrics,
        outage: DatabaseOutage,
        unwritten: UnwrittenWrites,
        signal: ClaimSignal,
    ) -> None:
        self.metrics = metrics
        self.unwritten = 0
        self._work = work
        self._outage = outage
        self._unwritten_writes = unwritten
        self._signal = signal
        self._queued: list[InFlight] = []
        self._flusher: asyncio.Task[None] | None = None

    def add(self, flight: InFlight) -> None:
        """Queue a handled item's completion; one flush writes every queued completion.

        Group commit: while a flush is in flight, completions gather, and the next flush
        writes them all (one conditional statement, each row fenced on its tenant and its
        own claim token: docs/decisions/0054), so an idle worker completes an item at once
        and a busy one pays one statement per batch. The item's slot is free from here; the
        loop holds claiming back while more than `capacity` completions wait (`unwritten`).
        """
        self._queued.append(flight)
        self.unwritten += 1
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name="complete")

    async def _flush(self) -> None:
        """Write the queued completions until none is left (see `add`), one statement a
        batch."""
        while self._queued:
            queued, self._queued = self._queued, []
            await self._write(queued)
            self._signal.slot_freed()  # claiming held back for the backlog may go on

    async def _write(self, batch: list[InFlight]) -> None:
        """Write a batch of queued completions (one statement) and account for each."""
        began = time.monotonic()
        try:
            done = await self._work.complete_many([(f.ctx, f.item) for f in batch])
        except Exception as exc:
            message = "completion of %d item(s) failed; the sweep requeues them after their lease"
            if self._outage.failed(exc, "completion flush", began):
                logger.warning(message + " (%s)", len(batch), one_line(exc))  # an outage's
            else:
                logger.exception(message, len(batch))
            for flight in batch:
                self.metrics.completions_failed.labels(kind=str(flight.item.kind)).inc()
                self._unwritten_writes.follow(flight.ctx, flight.item, "completion_failed")
                log_item(logging.ERROR, "completion failed", flight.item)
            return
        finally:
            self.unwritten -= len(batch)
        for flight in batch:
            kind = str(flight.item.kind)
            flight.phase = Phase.SETTLED
            if flight.item.id in done:
                self.metrics.completed.labels(kind=kind).inc()
                log_item(logging.DEBUG, "completed", flight.item)
            elif flight.item.id in done.cancelled:
                mark_cancelled(flight, self.metrics, "completion refused: cancelled by an operator")
            else:
                self.metrics.leases_lost.labels(kind=kind, reason="conflict").inc()
                log_item(logging.WARNING, "completion refused: the lease was lost", flight.item)

    async def flush(self) -> None:
        """Wait until every completion queued so far is written (tests, and the drain)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)
