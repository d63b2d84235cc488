"""The handler every worker implements for the kinds it runs, and the verdicts it may raise
(`PermanentFailure`, `Snooze`; docs/decisions/0039 in the worker template)."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from datetime import UTC, datetime

from acme.om.context import OpContext
from acme.om.work.types.work_item import WorkItem, checked_delay


class WorkHandlerInterface(ABC):
    """Runs one claimed work item.

    The loop passes the `OpContext` the claim returned; a handler never builds one. A
    handler may run twice for one item (a lease lost mid-run, a crash before completion),
    so a write to the record it advances is a compare-and-set on the record's `version`:
    the claim token fences the queue row, never the record.
    """

    @abstractmethod
    async def handle(self, ctx: OpContext, item: WorkItem) -> None:
        """Do the work of `item` under `ctx`; raise to have the item failed and retried,
        `PermanentFailure` to dead-letter it at once, `Snooze` to run it again later."""


class PermanentFailure(Exception):
    """The handler's verdict that its item can never succeed (a payload no retry can fix):
    the loop dead-letters the item at once, whatever attempts it has left, with `reason` as
    its `last_error`, audited (`work.dead_lettered`, reason `handler`). As Oban's
    `{:cancel, reason}` and River's `JobCancel`, but kept as a dead letter an operator can
    read and replay."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Snooze(Exception):
    """The handler's verdict that its item should run again in `delay_s` seconds, without
    spending an attempt (River's `JobSnooze`, Oban's `{:snooze, seconds}`): the loop hands
    it back due then, its attempt given back, `note` `snoozed`. Raises `ValueError` for a
    `delay_s` that is negative or not finite, `Invalid` for one past the year 9999."""

    def __init__(self, delay_s: float) -> None:
        if not math.isfinite(delay_s) or delay_s < 0:
            raise ValueError(f"delay_s: a finite number of seconds, at least 0, got {delay_s}")
        checked_delay(delay_s, datetime.now(UTC))
        super().__init__(f"snoozed for {delay_s} s")
        self.delay_s = float(delay_s)
