"""Lease renewal and self-fencing, per item while its handler runs.

`extend_lease` with the claim token every `lease / 5` seconds (`renewal_interval`), started
by a timer so an item done sooner never starts it, each call bounded at that interval.
`Conflict` means another holder has the item: the handler is cancelled at once;
`ItemCancelled` that an operator cancelled it (`cancel`, counted apart). Any other
failure is retried; once half the lease has passed by wall clock since the last successful
renewal the item is given up too (the queue may hand it to someone else from the lease's
end). Lease expiry itself is the database's clock (docs/guarantees.md §7).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from acme.om.errors import Conflict
from acme.om.work import WorkManagerInterface
from acme.om.work.types.work_item import ItemCancelled
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.settings import RuntimeSettings
from acme.workers.runtime.state import InFlight, Phase, log_item


class LeaseRenewal:
    """Renews the leases of the loop's items; `clock` is the wall clock (seconds) the
    self-fencing rule measures with."""

    def __init__(
        self,
        *,
        settings: RuntimeSettings,
        work: WorkManagerInterface,
        metrics: WorkerMetrics,
        clock: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._work = work
        self._metrics = metrics
        self._clock = clock

    def start(self, flight: InFlight, since: float) -> None:
        """Start the item's renewal task (the timer set when its handler started fired)."""
        if flight.phase is Phase.HANDLING and flight.renewal is None:
            flight.renewal = asyncio.create_task(
                self._renew_forever(flight, since), name=f"renew-{flight.item.id}"
            )

    async def stop(self, flight: InFlight, starter: asyncio.TimerHandle) -> None:
        """The handler is done: no renewal starts from here, and one that started ends."""
        if flight.phase is Phase.HANDLING:
            flight.phase = Phase.HANDLED
        starter.cancel()
        renewal, flight.renewal = flight.renewal, None
        if renewal is not None:
            renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewal

    async def _renew_forever(self, flight: InFlight, since: float) -> None:
        """Renew the lease with the claim token until cancelled or the lease is lost.

        Started a renewal interval after the handler (`since`, on the injected clock, counts
        as the last renewal: the claim set the lease). Attempts start every
        `renewal_interval` seconds (a fifth of the lease) and each is bounded by that
        interval, so an attempt that times out is followed by the next at once: one timeout
        is retried before half the lease has passed, a second is not. Each success is
        counted, with the seconds since the previous one (`worker_lease_renewal_gap_seconds`).
        """
        interval = self._settings.renewal_interval
        lease = self._settings.lease
        running = asyncio.get_running_loop()
        last_ok = since
        next_attempt = running.time()
        while True:
            await asyncio.sleep(max(next_attempt - running.time(), 0.0))
            next_attempt = running.time() + interval
            try:
                async with asyncio.timeout(interval):
                    flight.item = await self._work.extend_lease(flight.ctx, flight.item, lease)
            except ItemCancelled:
                self.cancel(flight)
                return
            except Conflict:
                self.lose(flight, Phase.LOST_CONFLICT)
                return
            except Exception as exc:
                self._metrics.renewals_failed.labels(kind=str(flight.item.kind)).inc()
                unrenewed = self._clock() - last_ok
                log_item(
                    logging.WARNING,
                    "lease renewal failed",
                    flight.item,
                    error=type(exc).__name__,
                    unrenewed_s=round(unrenewed, 3),
                )
                if unrenewed >= lease / 2:
                    self.lose(flight, Phase.LOST_UNRENEWED)
                    return
            else:
                now = self._clock()
                kind = str(flight.item.kind)
                self._metrics.renewals.labels(kind=kind).inc()
                self._metrics.renewal_gap.labels(kind=kind).observe(max(now - last_ok, 0.0))
                last_ok = now

    def lose(self, flight: InFlight, lost: Phase) -> None:
        """Self-fencing: stop handling an item this worker may no longer hold (`lost` is
        `Phase.LOST_CONFLICT` or `Phase.LOST_UNRENEWED`; its value is the metric's reason)."""
        if flight.phase is not Phase.HANDLING:
            return
        flight.phase = lost
        reason = lost.value
        self._metrics.leases_lost.labels(kind=str(flight.item.kind), reason=reason).inc()
        log_item(logging.WARNING, "lease lost; cancelling the handler", flight.item, reason=reason)
        if flight.task is not None:
            flight.task.cancel()

    def cancel(self, flight: InFlight) -> None:
        """An operator cancelled the item (its row is `CANCELLED` under this holder's
        token): stop its handler and write nothing more (`mark_cancelled`). Only while the
        handler runs: once it has returned, its refused write marks the cancel."""
        if flight.phase is not Phase.HANDLING:
            return
        mark_cancelled(flight, self._metrics, "cancelled by an operator; cancelling the handler")
        if flight.task is not None:
            flight.task.cancel()


def mark_cancelled(flight: InFlight, metrics: WorkerMetrics, message: str) -> None:
    """Put the item in `Phase.CANCELLED`, count it (`worker_items_cancelled_total`, never a
    lost lease nor a fencing conflict) and log `message`, once per item."""
    if flight.phase is Phase.CANCELLED:
        return
    flight.phase = Phase.CANCELLED
    metrics.cancelled.labels(kind=str(flight.item.kind)).inc()
    log_item(logging.INFO, message, flight.item)
