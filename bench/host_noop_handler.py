"""The no-op handler `make bench` writes over the rendered `handler.py` (as a user editing
their handler would), so the drain measures the queue and not the default audit write.

It keeps the rendered class name and constructor. With `BENCH_WAKE_LOG` set, an item whose
payload `note` is `wake` appends `<record_id> <time.time()>` to that file on handler start:
the wake-up latency probe. Every other item does nothing.
"""

from __future__ import annotations

import asyncio
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
            # On probe items only; the start time is taken before the write, off the loop.
            line = f"{item.payload['record_id']} {started}\n"
            await asyncio.to_thread(_append, self._wake_log, line)


def _append(path: str, line: str) -> None:
    """Append `line` to the file at `path` (run in a thread: a blocking write)."""
    with open(path, "a", encoding="utf-8") as log:
        log.write(line)
