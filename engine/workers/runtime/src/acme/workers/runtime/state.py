"""What the worker loop and its collaborators share: its state (read by `/healthz`), each
claimed item (`InFlight`, `Phase`), the claim signal (what wakes the claim loop), and the
per-item log line.

Every line the loop, its sweep and its wake-up subscription write goes to one logger,
`LOOP_LOGGER`, so a host filters them as one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
import uuid
from dataclasses import dataclass
from enum import Enum
from typing import Any

from acme.om.context import OpContext
from acme.om.types import EMPTY_UUID
from acme.om.work.types.work_item import WorkItem

LOOP_LOGGER = "acme.workers.runtime.loop"
"""The logger of every line about the loop, its sweep, its wake-ups and its heartbeat."""

logger = logging.getLogger(LOOP_LOGGER)

POLL_WHILE_DOWN_S = 1.0  # seconds between claims while the wake-up channel is down


def new_worker_id() -> str:
    """`<host>:<pid>:<random>`: unique per process start, readable in `claimed_by`."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def liveness_key(worker_id: str) -> str:
    """The worker's liveness key under `CacheScope.WORKER_LIVENESS`, in the system scope."""
    return f"{EMPTY_UUID}:{worker_id}"


def item_fields(item: WorkItem) -> dict[str, Any]:
    """The fields every log line about an item carries (as `extra` and in the message)."""
    return {
        "item_id": str(item.id),
        "kind": str(item.kind),
        "attempt": item.attempts,
        "tenant": str(item.org_id),
    }


def log_item(
    level: int,
    message: str,
    item: WorkItem,
    *,
    exc_info: BaseException | None = None,
    **more: Any,
) -> None:
    """One line about `item`: `message`, then `item_fields` and `more` as `key=value` (and
    as `extra`), with `exc_info`'s traceback when given."""
    if not logger.isEnabledFor(level):
        return  # the per-item lines are DEBUG: build nothing for a line nobody reads
    fields = item_fields(item) | more
    suffix = " ".join(f"{key}={value}" for key, value in fields.items())
    logger.log(level, "%s %s", message, suffix, extra=fields, exc_info=exc_info)


@dataclass
class LoopState:
    """The loop's own bookkeeping; `/healthz` reads it without any I/O of its own.

    `claim_failure_limit_s` is in seconds; `claims_failing_since` is the `time.monotonic()`
    of the first of the claims that have failed in a row (None once one succeeds), and
    `claim_failures` how many those are. `wake_ups_up` is true while the loop holds its
    wake-up subscription. `database_down_since` is the `time.monotonic()` of the first
    transient database error of an outage (`errors.transient_database_error`), None while
    the database answers. `claim_began` is the `time.monotonic()` at which the claim in
    progress began (None between claims): a claim that hangs counts as failing from then.
    """

    heartbeat_failure_limit: int
    claim_failure_limit_s: float = math.inf
    heartbeat_failures: int = 0
    beats: int = 0
    draining: bool = False
    in_flight: int = 0
    claim_failures: int = 0
    claims_failing_since: float | None = None
    wake_ups_up: bool = False
    database_down_since: float | None = None
    claim_began: float | None = None

    @property
    def claiming_paused(self) -> bool:
        """True once `heartbeat_failure_limit` beats in a row failed."""
        return self.heartbeat_failures >= self.heartbeat_failure_limit

    def claims_failing_s(self, now: float | None = None) -> float:
        """Seconds since the first of the claims that failed in a row began, at `now`
        (`time.monotonic()` by default); while the last claim succeeded, how long the claim
        in progress has run (0.0 between claims)."""
        since = self.claims_failing_since
        if since is None:
            since = self.claim_began
        if since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - since

    @property
    def unhealthy_reason(self) -> str | None:
        """Why `/healthz` answers 503, or None while it answers 200: the beats past their
        failure limit, or every claim failing for `claim_failure_limit_s` seconds or more."""
        if self.claiming_paused:
            return f"heartbeat failed {self.heartbeat_failures} times in a row: claiming paused"
        failing = self.claims_failing_s()
        if failing >= self.claim_failure_limit_s:
            if self.claims_failing_since is None:
                return f"the claim in progress has not returned for {failing:.1f} s"
            return f"every claim failed for {failing:.1f} s ({self.claim_failures} in a row)"
        return None

    def poll_wait_s(self, poll_interval_s: float) -> float:
        """Seconds the claim loop waits for a wake-up before claiming anyway: the poll
        interval, and at most `POLL_WHILE_DOWN_S` while the wake-up channel is down (its
        wake-ups are lost), unless claims are failing too (the database is down)."""
        if self.wake_ups_up or self.claims_failing_since is not None:
            return poll_interval_s
        return min(poll_interval_s, POLL_WHILE_DOWN_S)

    @property
    def healthy(self) -> bool:
        """What `/healthz` answers: false while `unhealthy_reason` names a reason."""
        return self.unhealthy_reason is None


class Phase(Enum):
    """Where one claimed item stands in this worker; only the loop moves it.

    `CLAIMED`: claimed, its handler not started. `HANDLING`: the handler runs and the lease
    is renewed. `HANDLED`: the handler returned or raised; its final write (completion,
    failure) is queued or under way. `LOST_CONFLICT`, `LOST_UNRENEWED`: the loop fenced
    itself while the handler ran (a renewal refused with `Conflict`; half a lease without a
    successful renewal) and cancelled the handler. `CANCELLED`: an operator cancelled the
    item while it was held (heard on a wake-up channel, or from a write refused with
    `ItemCancelled`); the handler was cancelled and nothing more is written. `SETTLED`: a
    final write reached the store (completed, failed, released, or refused because another
    worker holds it).
    """

    CLAIMED = "claimed"
    HANDLING = "handling"
    HANDLED = "handled"
    LOST_CONFLICT = "conflict"
    LOST_UNRENEWED = "unrenewed"
    CANCELLED = "cancelled"
    SETTLED = "settled"

    @property
    def lost(self) -> bool:
        """True once the loop fenced itself off the item."""
        return self in (Phase.LOST_CONFLICT, Phase.LOST_UNRENEWED)

    @property
    def stopped(self) -> bool:
        """True once the loop cancelled the handler itself: fenced off, or cancelled."""
        return self.lost or self is Phase.CANCELLED


@dataclass
class InFlight:
    """One claimed item: its context, its latest copy (renewals update it), its task, and
    where it stands (`Phase`)."""

    ctx: OpContext
    item: WorkItem
    claimed_at: float
    task: asyncio.Task[None] | None = None
    renewal: asyncio.Task[None] | None = None
    phase: Phase = Phase.CLAIMED


class ClaimSignal:
    """What wakes the claim loop: `event`, and whether the last claim found the lane empty.

    `woken()` says the lane may hold items (a wake-up, a channel back or lost, claiming
    resumed); `slot_freed()` claims again only while the lane was not found empty
    (docs/decisions/0024). `wake_ups` counts the wake-ups, so one during a claim voids
    that claim's verdict.
    """

    __slots__ = ("event", "lane_empty", "wake_ups")

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.lane_empty = False
        self.wake_ups = 0

    def woken(self) -> None:
        """Claim now, whatever the last claim found."""
        self.wake_ups += 1
        self.lane_empty = False
        self.event.set()

    def slot_freed(self) -> None:
        """A slot is free, or claiming held back for unwritten completions may go on."""
        if not self.lane_empty:
            self.event.set()
