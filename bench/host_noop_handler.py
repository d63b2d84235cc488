"""The no-op handler `make bench` writes over the rendered `handler.py` (as a user editing
their handler would), so the drain measures the queue and not the default audit write.

It keeps the rendered class name and constructor. With `BENCH_WAKE_LOG` set, an item whose
payload `note` is `wake` appends `<record_id> <time.time()>` to that file on handler start:
the wake-up latency probe. Every other item does nothing.
"""

from __future__ import annotations

import os
import time

from acme.om.audit import AuditManagerInterface
from acme.om.context import OpContext
from acme.om.work.types.handler import WorkHandlerInterface
from acme.om.work.types.work_item import WorkItem


class NotifyShipmentHandlerImpl(WorkHandlerInterface):
    """Does nothing with the item (the benchmark's no-op), but logs wake-up probes."""

    def __init__(self, *, audit: AuditManagerInterface) -> None:
        self._audit = audit
        self._wake_log = os.environ.get("BENCH_WAKE_LOG")

    async def handle(self, ctx: OpContext, item: WorkItem) -> None:
        """Nothing, or one line in the wake-up log for a probe item."""
        started = time.time()
        if self._wake_log and item.payload.get("note") == "wake":
            # One short blocking append, on probe items only (as the peers' handlers do).
            with open(self._wake_log, "a", encoding="utf-8") as log:  # noqa: ASYNC230
                log.write(f"{item.payload['record_id']} {started}\n")
