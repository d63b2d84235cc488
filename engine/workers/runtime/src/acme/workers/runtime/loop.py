"""The worker loop: claim, handle, complete; lease renewal, self-fencing, heartbeat, sweep, drain.

One `WorkerLoop` runs four kinds of task beside the items it handles:

- the claim loop: wakes on the NOTIFY each enqueue's transaction sends on PostgreSQL, or on
  `Topics.WORK_AVAILABLE` where the storage has no wake-ups of its own or
  `database_wake_ups` is off (a poll is the fallback either way, every second while the
  wake-up channel is down), and claims up to the free slots with one `claim_many` (a freed
  slot claims again only while the last claim filled its slots); every item runs as its
  own task; a lost wake-up subscription is re-established after 0.1 s,
  doubling to 1 s, and logged once when lost and once when back;
- the completion flush: a handled item's completion is queued, and one task writes what
  gathered with one `complete_many` (one statement per tenant, each row fenced on its own
  claim token), so a busy worker pays one statement per batch (group commit);
- per item, the lease renewal: `extend_lease` with the claim token every `lease / 5` seconds
  (started by a timer, so an item done sooner never starts it), each call bounded at that
  interval; `Conflict` means another holder
  has the item and cancels the handler at once; any other failure is retried, and once half
  the lease has passed by wall clock since the last successful renewal the task cancels
  itself (self-fencing: the queue may hand the item to someone else from the lease's end);
- the heartbeat: a key under `CacheScope.WORKER_LIVENESS` written and read back on a beat
  started every `heartbeat_interval` seconds (start to start); after
  `heartbeat_failure_limit` failed beats in a row the loop stops claiming and `/healthz`
  answers non-2xx, and one good beat resumes both;
- the maintenance sweep on a timer: requeue stale items, write the audit entries dead
  letters still owe, resume parked records (through each host manager that resumes them,
  `ParkedRecordsResumer`), and purge soft-deleted items and completed ones past their
  retention, per tenant; relay what a crash left in
  the outbox (and what the resumed records just announced there), purge relayed outbox
  rows, refresh the queue gauges (and the outbox's, when the host's relay reports them)
  and log them in one `queue stats` line (`QUEUE_STATS_FIELDS`, JSON fields for alarms);
  each step is idempotent (a conditional statement) and wrapped, so one failing step never
  stops the others.

Times the loop measures for fencing come from the injected wall clock (`clock`, seconds);
lease expiry itself is the database's clock (the template's docs/guarantees.md §7).

Every bound is `asyncio.timeout`, never `asyncio.wait_for`: on Python 3.11, `wait_for`
swallows a cancellation that arrives as its inner call completes, and a drain that
cancels the heartbeat would then wait for it forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import Any, Protocol, TypeVar, runtime_checkable
from uuid import UUID

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client.metrics import MetricWrapperBase
from pydantic import BaseModel

from acme.infra.cache import CacheInterface, CacheScope
from acme.infra.topics import Topics, TopicsInterface, WorkAvailablePayload
from acme.om.context import AppContext, AppType, OpContext, RequestContext
from acme.om.errors import Conflict, NotFound
from acme.om.outbox import OutboxRelayInterface
from acme.om.types import EMPTY_UUID
from acme.om.work import WorkManagerInterface
from acme.om.work.metrics import default_metrics
from acme.om.work.rules import policy_lane, stagger, stranded
from acme.om.work.storage import LEASE_EXPIRED
from acme.om.work.types.handler import WorkHandlerInterface
from acme.om.work.types.policy import KindPolicy
from acme.om.work.types.work_item import (
    WORK_POLICIES,
    LaneStats,
    WorkItem,
    WorkKind,
    WorkStatus,
)
from acme.workers.runtime.errors import failure_text, one_line, transient_database_error
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.settings import RuntimeSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")
Clock = Callable[[], float]

_ERROR_LIMIT = 2000  # characters of an error and its innermost frames kept on the row

_RESUBSCRIBE_FIRST_S = 0.1  # seconds before the first try to resubscribe to wake-ups
_RESUBSCRIBE_CAP_S = 1.0  # seconds: the longest pause between two tries to resubscribe
_POLL_WHILE_DOWN_S = 1.0  # seconds between claims while the wake-up channel is down
_SUBSCRIBE_WITHIN_S = 5.0  # seconds a subscription may take to be entered
_AWAITING_SWEEP_LIMIT = 1000  # items with a failed final write followed until swept
_CLAIM_AFTER_STOP_S = 2.0  # seconds the claim in progress at a stop may take to return
_CANCELLED_CLAIM_S = 1.0  # seconds a claim cancelled at a stop may take to unwind
_OUTAGE_REMINDER_S = 60.0  # seconds between two "still waiting for the database" lines
# Seconds a claim may run past its lease before it is cancelled as unanswered: a claim
# that takes longer hands out leases already spent, and a database that accepts the
# connection and never answers would otherwise hold it for the driver's own timeouts.
_CLAIM_GRACE_S = 5.0
_CLAIM_LEAST_S = 0.1  # seconds: the shortest bound a claim is given

RESUME_LIMIT = 100
"""Parked records one resumer resumes per tenant and sweep pass (the rest wait a pass)."""


@runtime_checkable
class ParkedRecordsResumer(Protocol):
    """A host manager that resumes its parked records; the sweep calls it per tenant.

    A parked record is one whose next step waits until a time (the template's
    docs/host-contract.md, "Parked records"). `resume_parked` resumes the tenant's records
    that are due, at most `limit`, each by a compare-and-set on the record's `version`
    that appends its continuation to the outbox in the same transaction (a `work.<kind>`
    row becomes a work item when the sweep's relay step runs next), and returns how many
    it resumed. It must be idempotent and safe with several workers sweeping at once.
    The host contract's optional part (docs/host-contract.md, Parked records); the worker's
    container finds every such manager in `Managers` (`container.parked_record_resumers`).
    """

    async def resume_parked(self, ctx: OpContext, *, limit: int) -> int:
        """Resume up to `limit` of `ctx`'s tenant's due parked records; how many."""
        ...


async def _resume_parked(resumer: ParkedRecordsResumer, ctx: OpContext) -> int:
    """`resumer.resume_parked` for one tenant; raises `TypeError` unless it counts in an int."""
    resumed: object = await resumer.resume_parked(ctx, limit=RESUME_LIMIT)
    if not isinstance(resumed, int) or isinstance(resumed, bool) or resumed < 0:
        raise TypeError(f"resume_parked returned {resumed!r}, not the number of records it resumed")
    return resumed


OUTBOX_FAILING_AFTER = 3
"""Failed relays after which a pending outbox row counts in `worker_outbox_failing`."""


class OutboxStatsLike(Protocol):
    """What `OutboxStatsReader.outbox_stats` returns: the outbox across every tenant.

    `pending`: rows not relayed and not given up; `oldest_pending_age`: seconds since the
    oldest pending row was written (0 when none); `failing`: pending rows whose relay
    failed at least `failing_after` times; `dead_lettered`: rows the relay gave up on and
    keeps. Counts are non-negative ints, the age a non-negative number of seconds.
    """

    @property
    def pending(self) -> int: ...

    @property
    def oldest_pending_age(self) -> float: ...

    @property
    def failing(self) -> int: ...

    @property
    def dead_lettered(self) -> int: ...


@runtime_checkable
class OutboxStatsReader(Protocol):
    """A host outbox relay that reports the outbox's state; the sweep reads it each pass.

    The host contract's optional part (docs/host-contract.md, "Outbox state and dead
    letters"): `Managers.outbox_relay` with this method; the worker's container checks its
    shape (`container.outbox_stats_reader`). Without it the `worker_outbox_*` gauges are
    not exported.
    """

    async def outbox_stats(self, rctx: RequestContext, *, failing_after: int) -> OutboxStatsLike:
        """The outbox across every tenant; see `OutboxStatsLike`."""
        ...


async def _outbox_stats(
    reader: OutboxStatsReader, rctx: RequestContext
) -> tuple[int, float, int, int]:
    """`(pending, oldest_pending_age, failing, dead_lettered)` from `reader.outbox_stats`;
    raises `TypeError` unless each count is a non-negative int and the age a non-negative
    number of seconds."""
    stats: object = await reader.outbox_stats(rctx, failing_after=OUTBOX_FAILING_AFTER)
    counts: list[int] = []
    for field in ("pending", "failing", "dead_lettered"):
        value = getattr(stats, field, None)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TypeError(f"outbox_stats returned {field}={value!r}, not a count")
        counts.append(value)
    age = getattr(stats, "oldest_pending_age", None)
    if not isinstance(age, int | float) or isinstance(age, bool) or not 0 <= age < math.inf:
        raise TypeError(f"outbox_stats returned oldest_pending_age={age!r}, not seconds")
    return counts[0], float(age), counts[1], counts[2]


QUEUE_STATS_EVENT = "queue_stats"
"""The `event` field of the line each sweep pass logs, `queue stats ...` (INFO)."""

QUEUE_STATS_FIELDS = (
    "lane",
    "available",
    "oldest_available_age_s",
    "dead_letters_unaudited",
    "oldest_snapshot_xid_age",
    "claim_failures",
    "lease_renewal_failures",
    "completion_failures",
    "wake_up_channel_up",
    "outbox_pending",
    "outbox_oldest_pending_age_s",
    "outbox_failing",
    "outbox_dead_letters",
    "stranded",
)
"""The fields of that line besides `event`, as `extra` (top-level keys of a JSON log line,
where the host's deployment turns them into metrics; docs/operations.md, Alerts).

The loop's own lane (`lane`) and kinds: `available` items (due or not) and
`oldest_available_age_s` (the oldest due one's wait, on the database clock),
`dead_letters_unaudited`; across the database, `oldest_snapshot_xid_age` (PostgreSQL
only). Since this loop's previous line: `claim_failures`, `lease_renewal_failures`,
`completion_failures`. `wake_up_channel_up`: 1 or 0. The outbox's four, across tenants,
with an `outbox_stats` reader. Last, `stranded`: across lanes and kinds, the waiting items
no worker claims (`rules.stranded`). A field this pass could not read is left out."""


def _sample_values(metric: MetricWrapperBase, suffix: str = "") -> list[float]:
    """The values of `metric`'s samples whose name ends with `suffix`, over every label set
    (a counter's `_total` ones, not its `_created`)."""
    return [
        sample.value
        for family in metric.collect()
        for sample in family.samples
        if sample.name.endswith(suffix)
    ]


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


def _log_item(
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


def span_links(traceparent: str | None) -> list[Link]:
    """A link to the causing request's span, when `traceparent` names a valid one.

    The item's span is linked and never parented: the item outlives the request that
    caused it.
    """
    if not traceparent:
        return []
    carrier = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    span_context = trace.get_current_span(carrier).get_span_context()
    return [Link(span_context)] if span_context.is_valid else []


@dataclass
class LoopState:
    """The loop's own bookkeeping; `/healthz` reads it without any I/O of its own.

    `claim_failure_limit` is in seconds; `claims_failing_since` is the `time.monotonic()`
    of the first of the claims that have failed in a row (None once one succeeds), and
    `claim_failures` how many those are. `wake_ups_up` is true while the loop holds its
    wake-up subscription. `database_down_since` is the `time.monotonic()` of the first
    transient database error of an outage (`errors.transient_database_error`), None while
    the database answers. `claim_began` is the `time.monotonic()` at which the claim in
    progress began (None between claims): a claim that hangs counts as failing from then.
    """

    heartbeat_failure_limit: int
    claim_failure_limit: float = math.inf
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
        failure limit, or every claim failing for `claim_failure_limit` seconds or more."""
        if self.claiming_paused:
            return f"heartbeat failed {self.heartbeat_failures} times in a row: claiming paused"
        failing = self.claims_failing_s()
        if failing >= self.claim_failure_limit:
            if self.claims_failing_since is None:
                return f"the claim in progress has not returned for {failing:.1f} s"
            return f"every claim failed for {failing:.1f} s ({self.claim_failures} in a row)"
        return None

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
    successful renewal) and cancelled the handler. `SETTLED`: a final write reached the
    store (completed, failed, released, or refused because another worker holds it).
    """

    CLAIMED = "claimed"
    HANDLING = "handling"
    HANDLED = "handled"
    LOST_CONFLICT = "conflict"
    LOST_UNRENEWED = "unrenewed"
    SETTLED = "settled"

    @property
    def lost(self) -> bool:
        """True once the loop fenced itself off the item."""
        return self in (Phase.LOST_CONFLICT, Phase.LOST_UNRENEWED)


@dataclass
class _InFlight:
    """One claimed item: its context, its latest copy (renewals update it), its task, and
    where it stands (`Phase`)."""

    ctx: OpContext
    item: WorkItem
    claimed_at: float
    task: asyncio.Task[None] | None = None
    renewal: asyncio.Task[None] | None = None
    phase: Phase = Phase.CLAIMED


class ItemHooks:
    """What a worker adds around each of its items without editing the engine: subclass it,
    override what you need, and pass an instance as the worker's `hooks` (its `loop.py`).

    Every hook is a coroutine run in the item's own task, under the item's span and its
    context. `before_item` runs inside the kind's timeout, just before the handler: raising
    there fails the attempt as a handler's exception does (retried with backoff). The
    others run after the fact and never change the outcome: an exception they raise is
    logged with its traceback and counted (`worker_hook_failures_total{hook}`), then
    dropped. `after_item` follows the handler (`error` is what it raised, None when it
    returned), before the completion or failure is written; `on_dead_letter` follows the
    write that made the item a dead letter (its attempts are spent).
    """

    async def before_item(self, ctx: OpContext, item: WorkItem) -> None:
        """Before the handler runs `item` (a claimed item, its attempt already counted)."""

    async def after_item(self, ctx: OpContext, item: WorkItem, error: Exception | None) -> None:
        """After the handler ran `item`; `error` is what it raised, or None."""

    async def on_dead_letter(self, ctx: OpContext, item: WorkItem) -> None:
        """After `item` became a dead letter (`FAILED`, its attempts spent)."""


NO_HOOKS = ItemHooks()
"""The hooks of a worker that adds nothing around its items."""


class WorkerLoop:
    """Claims `(lane, kinds)` and runs each item through its handler; see the module docstring.

    `handlers` maps each kind to its handler; `kinds` (default: the handlers' kinds) is what
    the loop claims. An item of a kind without a handler is released with a note, never
    failed. `parked` names the host managers whose parked records
    the sweep resumes (none: that step does nothing); `outbox_stats` is the host's relay
    when it reports the outbox's state (None: the `worker_outbox_*` gauges are not
    exported, and the first sweep pass says so once). `clock` is the wall clock (seconds)
    the self-fencing rule measures with; tests inject one. `hooks` are the worker's own
    steps around each item (`ItemHooks`).
    """

    def __init__(
        self,
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
        clock: Clock = time.time,
        tracer: Tracer | None = None,
        hooks: ItemHooks = NO_HOOKS,
    ) -> None:
        self.settings = settings
        self.worker_id = worker_id or new_worker_id()
        self.metrics = metrics
        self.state = LoopState(
            heartbeat_failure_limit=settings.heartbeat_failure_limit,
            claim_failure_limit=settings.claim_failure_limit,
        )
        self._work = work
        self._handlers = dict(handlers)
        self._kinds = list(kinds) if kinds is not None else list(self._handlers)
        self._cache = cache
        self._topics = topics
        self._relay = outbox_relay
        self._parked = dict(parked or {})
        self._outbox_stats = outbox_stats
        self._policies = policies
        self._clock = clock
        self._hooks = hooks
        self._tracer = tracer or trace.get_tracer(__name__)
        self._app = AppContext(type=AppType.WORKER, version=settings.app_version)
        self._items: dict[UUID, _InFlight] = {}
        self._to_complete: list[_InFlight] = []
        self._unwritten = 0
        self._flusher: asyncio.Task[None] | None = None
        self._awaiting_sweep: dict[UUID, tuple[_InFlight, str]] = {}
        self._wake = asyncio.Event()
        # Whether the lane was found empty: the last claim took fewer items than it asked
        # for, and no wake-up has come since it was sent (`_claim_forever`).
        self._lane_empty = False
        self._wake_ups = 0  # wake-ups so far (`_woken`): one during a claim voids its verdict
        self._stop = asyncio.Event()
        self._drained = asyncio.Event()
        self._failures_logged: dict[str, float] = {}  # totals at the last queue stats
        self._gauged_lanes: set[str] = set()  # the queue gauges' label values set so far
        self._gauged_ages: set[tuple[str, str]] = set()
        self._outage_said = 0.0  # when the last line about the database outage was written
        self._failing_steps: dict[str, int] = {}  # sweep step to its failures in a row
        self._unsaid_failures: set[str] = set()  # steps this pass failed without a line
        self.outage: str | None = None
        """Why the loop stopped itself: a database outage past `database_outage_limit`."""

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self) -> None:
        """Run until `stop()` is called, then drain; returns once drained (see `_drain`)."""
        heartbeat = asyncio.create_task(self._heartbeat_forever(), name="heartbeat")
        # One wake-up path: the storage's own (PostgreSQL NOTIFY, sent at commit) when it
        # has one and the settings allow it, else the WORK_AVAILABLE topic. Listening to
        # both would wake the loop twice per enqueue, the second time for an empty claim.
        listen = (
            self._listen_database_forever()
            if self.settings.database_wake_ups and self._work.wake_ups() is not None
            else self._listen_forever()
        )
        others = [
            asyncio.create_task(listen, name="wake-ups"),
            asyncio.create_task(self._sweep_forever(), name="sweep"),
        ]
        try:
            await self._claim_until_stopped()
        finally:
            await self._drain(heartbeat, others)

    def stop(self) -> None:
        """Ask the loop to drain: claiming stops at once. Safe to call from a signal handler."""
        self.state.draining = True
        self.metrics.claiming.set(0)
        self._stop.set()
        self._wake.set()

    async def wait_drained(self) -> None:
        """Wait until `run()` has drained."""
        await self._drained.wait()

    # -- claiming ----------------------------------------------------------------------

    async def _claim_until_stopped(self) -> None:
        """`_claim_forever` until `stop()`, giving the claim in progress at the stop at most
        `_CLAIM_AFTER_STOP_S` (and a quarter of `drain_deadline`) to return.

        A claim stuck in the database (a lock it waits on, a connection that stopped
        answering) would otherwise hold the drain back past `drain_deadline`, with the sweep
        still running. A claim cancelled so is rolled back where it had not committed; rows
        it had claimed are handed back by the sweep once their lease passes. Raises what
        `_claim_forever` raises.
        """
        claiming = asyncio.create_task(self._claim_forever(), name="claim")
        stopped = asyncio.create_task(self._stop.wait(), name="stopped")
        try:
            await asyncio.wait({claiming, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not claiming.done():
                grace = min(_CLAIM_AFTER_STOP_S, self.settings.drain_deadline / 4)
                await asyncio.wait({claiming}, timeout=grace)
            if not claiming.done():
                logger.warning(
                    "the claim in progress did not return within %.1f s of the stop; "
                    "cancelled (rows it claimed, if any, go back when their lease passes)",
                    grace,
                )
                claiming.cancel()
                await asyncio.wait({claiming}, timeout=_CANCELLED_CLAIM_S)
                return
            claiming.result()
        finally:
            stopped.cancel()
            if not claiming.done():
                claiming.cancel()

    async def _claim_forever(self) -> None:
        """Claim for the free slots whenever the wake event is set or the poll interval
        passes, until `stop()`.

        A claim that comes back with fewer items than it asked for found the lane empty:
        from then on a slot that frees or a completion that is written does not claim again
        (that claim would come back empty: two statements per item that buy nothing on a
        worker that keeps up); a wake-up (a NOTIFY or a `WORK_AVAILABLE` for the lane, which
        an enqueue and a hand-back due at once send alike, a wake-up channel coming back or
        lost, claiming resumed) or the poll does. A wake-up that arrives while a claim is
        in flight voids that claim's verdict, since the claim may have read the lane before
        the new items were committed. Items that become due later with no wake-up (a
        retry's backoff, a deferral) are found by the poll, as before (the template's
        docs/decisions/0024).
        """
        while not self._stop.is_set():
            self._wake.clear()
            free = self.settings.capacity - len(self._items)
            if self._unwritten > self.settings.capacity:
                free = 0  # completions are backing up: let them be written first
            paused = self.state.claiming_paused
            self.metrics.claiming.set(0 if paused else 1)
            if free > 0 and not paused:
                wake_ups = self._wake_ups
                claimed, unhandled = await self.claim_once(free)
                # Every claim gives its verdict afresh (a failed one gives none).
                self._lane_empty = (
                    claimed < free
                    and not unhandled
                    and self._wake_ups == wake_ups
                    and self.state.claims_failing_since is None
                )
                if unhandled:
                    # A kind nobody here handles was handed back; claiming again at once
                    # would take it straight back, so wait out the poll interval.
                    await self._sleep_unless_stopped(self.settings.poll_interval)
                    continue
                if claimed == free:
                    continue  # the lane may hold more: the next pass finds the slots full
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_wait()):
                    await self._wake.wait()

    def _poll_wait(self) -> float:
        """Seconds to wait for a wake-up before claiming anyway: the poll interval, and at
        most `_POLL_WHILE_DOWN_S` while the wake-up channel is down (its wake-ups are lost),
        unless claims are failing too (the database is down: claiming sooner only fails
        sooner)."""
        if self.state.wake_ups_up or self.state.claims_failing_since is not None:
            return self.settings.poll_interval
        return min(self.settings.poll_interval, _POLL_WHILE_DOWN_S)

    async def claim_once(self, limit: int) -> tuple[int, int]:
        """Claim up to `limit` items and start a task for each.

        Returns `(claimed, unhandled)`: how many came back, and how many of those were of a
        kind without a handler and were released. A failed claim is logged (the first of a
        run of failures with its traceback, the next ones on one line each), counted
        (`worker_claim_failures_total`, and in `state` for `/healthz`) and counts 0. A claim
        unanswered `lease` + `_CLAIM_GRACE_S` seconds, or during an outage past the end of
        its `database_outage_limit`, is cancelled and fails with `TimeoutError` (a database
        outage, from when the claim began).
        """
        rctx = RequestContext.new(self._app)
        began = self.state.claim_began = time.monotonic()
        bound_s = self.settings.lease + _CLAIM_GRACE_S
        down_since = self.state.database_down_since
        if down_since is not None:  # a claim in an outage does not outlast its limit
            left_s = down_since + self.settings.database_outage_limit - began
            bound_s = min(bound_s, max(left_s, _CLAIM_LEAST_S))
        bound = asyncio.timeout(bound_s)
        try:
            try:
                async with bound:
                    pairs = await self._work.claim_many(
                        rctx,
                        self.settings.lane,
                        self._kinds,
                        self.worker_id,
                        lease=self.settings.lease,
                        limit=limit,
                    )
            except TimeoutError as exc:
                if bound.expired():
                    raise TimeoutError(f"the claim had no answer within {bound_s:.1f} s") from exc
                raise
        except Exception as exc:
            self.metrics.claim_failures.inc()
            self.state.claim_failures += 1
            first = self.state.claims_failing_since is None
            if first:
                self.state.claims_failing_since = began
            if self._database_failed(exc, "claim", began):
                return 0, 0  # an outage: said once, and waited out (`_database_failed`)
            if first:
                logger.exception("claim failed; retrying on the next wake-up or poll")
            else:  # the traceback was logged with the first failure of this run of them
                logger.warning(
                    "claim failed again (%d in a row): %s",
                    self.state.claim_failures,
                    f"{type(exc).__name__}: {exc}"[:300],
                )
            return 0, 0
        finally:
            self.state.claim_began = None
        self._database_answered()
        if self.state.claims_failing_since is not None:
            logger.info(
                "claims succeed again after %d failure(s) in %.1f s",
                self.state.claim_failures,
                self.state.claims_failing_s(),
            )
            self.state.claims_failing_since = None
            self.state.claim_failures = 0
        started = time.monotonic()
        unhandled = 0
        for ctx, item in pairs:
            self.metrics.claimed.labels(kind=str(item.kind)).inc()
            flight = _InFlight(ctx=ctx, item=item, claimed_at=started)
            if item.kind not in self._handlers:
                unhandled += 1
                note = f"kind {item.kind} is not handled by worker {self.worker_id}"
                await self._release(flight, note=note, reason="unhandled_kind")
                continue
            _log_item(logging.DEBUG, "claimed", item)
            self._items[item.id] = flight
            flight.task = asyncio.create_task(self._run_item(flight), name=f"item-{item.id}")
        self.state.in_flight = len(self._items)
        self.metrics.in_flight.set(len(self._items))
        return len(pairs), unhandled

    def _database_failed(self, exc: BaseException, where: str, began: float) -> bool:
        """Whether `exc`, raised by `where` (the claim, a sweep step) in a call that began
        at `began` (`time.monotonic()`), is a database outage (`transient_database_error`);
        False for any other error, which the caller logs.

        An outage runs from when its first failing call began (a call that hangs until its
        bound counts from its start). Its first error writes one line saying what the loop
        waits for, and one more follows every `_OUTAGE_REMINDER_S` while it lasts. Past
        `database_outage_limit` seconds the loop stops itself, `outage` saying why, and
        `serve` exits 1 (docs/operations.md, "Outages", in the worker template).
        """
        if not transient_database_error(exc):
            return False
        now = time.monotonic()
        limit = self.settings.database_outage_limit
        setting = f"{self.settings.env_prefix()}DATABASE_OUTAGE_LIMIT"
        since = self.state.database_down_since
        if since is None or began < since:
            first = since is None
            self.state.database_down_since = since = min(began, now)
            if first:
                self._outage_said = now
        else:
            first = False
        if now - since >= limit:
            if self.outage is None:
                self.outage = (
                    f"the database was unavailable for {now - since:.0f} s, past {setting} "
                    f"({limit:g} s); last error: {one_line(exc)}"
                )
                logger.error("%s: stopping", self.outage)
                self.stop()
            return True
        if first:
            logger.warning(
                "the database is unavailable (%s, in the %s): waiting for it; claims and "
                "sweeps retry, and the worker exits after %g s of it (%s)",
                one_line(exc),
                where,
                limit,
                setting,
            )
        elif now - self._outage_said >= _OUTAGE_REMINDER_S:
            self._outage_said = now
            logger.warning(
                "still waiting for the database after %.0f s (%s); the worker exits at %g s (%s)",
                now - since,
                one_line(exc),
                limit,
                setting,
            )
        return True

    def _database_answered(self) -> None:
        """A database call succeeded: an outage in progress is over (one line says so)."""
        since = self.state.database_down_since
        if since is not None:
            self.state.database_down_since = None
            logger.info("the database answers again after %.1f s", time.monotonic() - since)

    # -- one item ----------------------------------------------------------------------

    async def _run_item(self, flight: _InFlight) -> None:
        item = flight.item
        kind = str(item.kind)
        handler = self._handlers[item.kind]
        policy = self._policies.get(item.kind, KindPolicy())
        self.metrics.claim_to_start.labels(kind=kind).observe(time.monotonic() - flight.claimed_at)
        # The first renewal is due a renewal interval from now: a timer, not a task, so an
        # item that finishes sooner (most do) never pays for a renewal task at all.
        since = self._clock()
        running = asyncio.get_running_loop()
        starter = running.call_later(
            self.settings.renewal_interval, self._start_renewal, flight, since
        )
        started = time.monotonic()
        flight.phase = Phase.HANDLING
        bound = asyncio.timeout(policy.timeout)
        failing = "before_item hook"  # what an exception came from, for the log line
        try:
            with self._tracer.start_as_current_span(
                f"work {kind}",
                context=Context(),
                kind=SpanKind.CONSUMER,
                links=span_links(item.traceparent),
                attributes={
                    "work.item_id": str(item.id),
                    "work.kind": kind,
                    "work.attempt": item.attempts,
                    "work.tenant": str(item.org_id),
                },
            ):
                async with bound:
                    await self._hooks.before_item(flight.ctx, item)
                    failing = "handler"
                    await handler.handle(flight.ctx, item)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if not flight.phase.lost and task is not None and task.cancelling() == 0:
                # Nobody cancelled this task: the handler raised CancelledError itself (a
                # future it awaited was cancelled, say). A failed attempt, as any error is;
                # re-raised, it would leave the item claimed until its lease passed.
                await self._handler_failed(flight, starter, exc, failing)
            else:
                await self._stop_renewal(flight, starter)
                if not flight.phase.lost:
                    raise  # the drain cancelled us: it hands the item back
                if task is not None:
                    task.uncancel()
                await self._after_lease_lost(flight)
        except Exception as exc:
            if isinstance(exc, TimeoutError) and bound.expired():
                await self._stop_renewal(flight, starter)
                await self._hook("after_item", self._hooks.after_item(flight.ctx, item, exc), item)
                await self._fail(flight, f"handler timed out after {policy.timeout} s")
            else:
                # A TimeoutError the handler raised itself is its own failure, message kept.
                await self._handler_failed(flight, starter, exc, failing)
        except BaseException as exc:
            if isinstance(exc, GeneratorExit):
                raise  # the coroutine itself is being closed: nothing may be awaited
            # SystemExit, KeyboardInterrupt raised by the handler (the worker's own SIGTERM
            # and SIGINT drain through the event loop's signal handlers, never through a
            # handler): a failed attempt, not the end of the process and of every item in
            # flight with it.
            await self._handler_failed(flight, starter, exc, failing)
        else:
            if bound.expired():
                # The handler caught the timeout's cancellation and went on to finish: its
                # work is done, so the item completes, but its timeout did not hold.
                _log_item(
                    logging.WARNING,
                    f"handler returned after its timeout of {policy.timeout} s "
                    "(it caught the cancellation); completed",
                    item,
                )
            # Queued first: a drain that cancels us while the renewal ends still finds the
            # completion queued, writes it, and does not hand a handled item back.
            self._complete_later(flight)
            await self._stop_renewal(flight, starter)
            await self._hook("after_item", self._hooks.after_item(flight.ctx, item, None), item)
        finally:
            self.metrics.handle_duration.labels(kind=kind).observe(time.monotonic() - started)
            self._forget(flight)

    async def _handler_failed(
        self,
        flight: _InFlight,
        starter: asyncio.TimerHandle,
        raised: BaseException,
        failing: str,
    ) -> None:
        """Record what the handler (or the before_item hook, `failing`) raised as a failed
        attempt: the renewal stopped, the after_item hook told (an `Exception`: what was
        raised, or a `RuntimeError` naming what was not one), `_fail` with the error's text
        and innermost frames (`failure_text`), which logs the attempt's one line with the
        traceback. Only `Exception`s are a handler's to raise; anything else is also said
        at ERROR."""
        item = flight.item
        await self._stop_renewal(flight, starter)
        error = (
            raised
            if isinstance(raised, Exception)
            else RuntimeError(f"the {failing} raised {type(raised).__name__}: {raised}")
        )
        await self._hook("after_item", self._hooks.after_item(flight.ctx, item, error), item)
        if not isinstance(raised, Exception):
            _log_item(
                logging.ERROR,
                f"{failing} raised {type(raised).__name__}, which is not an Exception; "
                "counted as a failed attempt",
                item,
                error=type(raised).__name__,
            )
        await self._fail(flight, failure_text(raised, _ERROR_LIMIT), raised=raised, failing=failing)

    async def _hook(self, name: str, call: Awaitable[None], item: WorkItem) -> None:
        """Await one after-the-fact hook (`ItemHooks`); what it raises is logged and counted,
        never passed on."""
        try:
            await call
        except Exception:
            self.metrics.hook_failures.labels(hook=name).inc()
            logger.exception("hook %s failed for item %s; the item's outcome stands", name, item.id)

    def _start_renewal(self, flight: _InFlight, since: float) -> None:
        """Start the item's renewal task (the timer set when its handler started fired)."""
        if flight.phase is Phase.HANDLING and flight.renewal is None:
            flight.renewal = asyncio.create_task(
                self._renew_forever(flight, since), name=f"renew-{flight.item.id}"
            )

    async def _stop_renewal(self, flight: _InFlight, starter: asyncio.TimerHandle) -> None:
        """The handler is done: no renewal starts from here, and one that started ends."""
        if flight.phase is Phase.HANDLING:
            flight.phase = Phase.HANDLED
        starter.cancel()
        renewal, flight.renewal = flight.renewal, None
        if renewal is not None:
            renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewal

    async def _renew_forever(self, flight: _InFlight, since: float) -> None:
        """Renew the lease with the claim token until cancelled or the lease is lost.

        Started a renewal interval after the handler (`since`, on the injected clock, counts
        as the last renewal: the claim set the lease). Attempts start every
        `renewal_interval` seconds (a fifth of the lease) and each is bounded by that
        interval, so an attempt that times out is followed by the next at once: one timeout
        is retried before half the lease has passed, a second is not. Each success is
        counted, with the seconds since the previous one (`worker_lease_renewal_gap_seconds`).
        """
        interval = self.settings.renewal_interval
        lease = self.settings.lease
        running = asyncio.get_running_loop()
        last_ok = since
        next_attempt = running.time()
        while True:
            await asyncio.sleep(max(next_attempt - running.time(), 0.0))
            next_attempt = running.time() + interval
            try:
                async with asyncio.timeout(interval):
                    flight.item = await self._work.extend_lease(flight.ctx, flight.item, lease)
            except Conflict:
                self._lose(flight, Phase.LOST_CONFLICT)
                return
            except Exception as exc:
                self.metrics.renewals_failed.labels(kind=str(flight.item.kind)).inc()
                unrenewed = self._clock() - last_ok
                _log_item(
                    logging.WARNING,
                    "lease renewal failed",
                    flight.item,
                    error=type(exc).__name__,
                    unrenewed_s=round(unrenewed, 3),
                )
                if unrenewed >= lease / 2:
                    self._lose(flight, Phase.LOST_UNRENEWED)
                    return
            else:
                now = self._clock()
                kind = str(flight.item.kind)
                self.metrics.renewals.labels(kind=kind).inc()
                self.metrics.renewal_gap.labels(kind=kind).observe(max(now - last_ok, 0.0))
                last_ok = now

    def _lose(self, flight: _InFlight, lost: Phase) -> None:
        """Self-fencing: stop handling an item this worker may no longer hold (`lost` is
        `Phase.LOST_CONFLICT` or `Phase.LOST_UNRENEWED`; its value is the metric's reason)."""
        if flight.phase is not Phase.HANDLING:
            return
        flight.phase = lost
        reason = lost.value
        self.metrics.leases_lost.labels(kind=str(flight.item.kind), reason=reason).inc()
        _log_item(logging.WARNING, "lease lost; cancelling the handler", flight.item, reason=reason)
        if flight.task is not None:
            flight.task.cancel()

    async def _after_lease_lost(self, flight: _InFlight) -> None:
        """After self-fencing on unrenewed time, try once to hand the item back early.

        The release is conditional on the claim token, so it is refused (`Conflict`) when
        another worker holds the item already; otherwise the sweep returns it after the lease.
        """
        if flight.phase is not Phase.LOST_UNRENEWED:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.settings.renewal_interval):
                await self._release(flight, note="lease lost: renewals failed", reason="lease_lost")

    def _complete_later(self, flight: _InFlight) -> None:
        """Queue a handled item's completion; one flush writes every queued completion.

        Group commit: while a flush is in flight, completions gather, and the next flush
        writes them all (one conditional statement per tenant, each row fenced on its own
        claim token), so an idle worker completes an item at once and a busy one pays one
        statement per batch. The item's slot is free from here; `_claim_forever` holds
        claiming back while more than `capacity` completions wait.
        """
        self._to_complete.append(flight)
        self._unwritten += 1
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_completions(), name="complete")

    async def _flush_completions(self) -> None:
        """Write the queued completions until none is left (see `_complete_later`), one
        statement per tenant."""
        while self._to_complete:
            queued, self._to_complete = self._to_complete, []
            tenants: dict[UUID, list[_InFlight]] = {}
            for flight in queued:
                tenants.setdefault(flight.item.org_id, []).append(flight)
            for batch in tenants.values():  # one tenant's failure leaves the others written
                await self._complete_batch(batch)
            self._slot_freed()  # claiming held back for the backlog may go on

    async def _complete_batch(self, batch: list[_InFlight]) -> None:
        """Write one tenant's queued completions (one statement) and account for each."""
        began = time.monotonic()
        try:
            done = await self._work.complete_many([(f.ctx, f.item) for f in batch])
        except Exception as exc:
            message = "completion of %d item(s) failed; the sweep requeues them after their lease"
            if self._database_failed(exc, "completion flush", began):
                logger.warning(message + " (%s)", len(batch), one_line(exc))  # an outage's
            else:
                logger.exception(message, len(batch))
            for flight in batch:
                self.metrics.completions_failed.labels(kind=str(flight.item.kind)).inc()
                self._await_sweep(flight, "completion_failed")
                _log_item(logging.ERROR, "completion failed", flight.item)
            return
        finally:
            self._unwritten -= len(batch)
        for flight in batch:
            kind = str(flight.item.kind)
            flight.phase = Phase.SETTLED
            if flight.item.id in done:
                self.metrics.completed.labels(kind=kind).inc()
                _log_item(logging.DEBUG, "completed", flight.item)
            else:
                self.metrics.leases_lost.labels(kind=kind, reason="conflict").inc()
                _log_item(logging.WARNING, "completion refused: the lease was lost", flight.item)

    def _await_sweep(self, flight: _InFlight, reason: str) -> None:
        """Follow an item whose final write failed (`reason`: `completion_failed` or
        `failure_unrecorded`) until a sweep hands it back (`_check_awaiting_sweep`); at
        most `_AWAITING_SWEEP_LIMIT` items are followed, the rest only logged."""
        if len(self._awaiting_sweep) < _AWAITING_SWEEP_LIMIT:
            self._awaiting_sweep[flight.item.id] = (flight, reason)

    async def _check_awaiting_sweep(self) -> int:
        """Read each item whose final write failed: one a sweep has handed back since (it
        was claimed again, or its note is the sweep's `lease expired`) is counted in
        `worker_unwritten_recovered_total{kind, reason}` and forgotten, one the write
        reached after all is forgotten, one still held under the failed claim is kept for
        the next pass. Returns how many were handed back; raises what the reads raise."""
        recovered = 0
        for item_id, (flight, reason) in list(self._awaiting_sweep.items()):
            held = flight.item
            try:
                item = await self._work.get(flight.ctx, item_id)
            except NotFound:
                self._awaiting_sweep.pop(item_id, None)
                continue
            if item.status == WorkStatus.CLAIMED and item.attempts == held.attempts:
                continue  # its lease has not passed, or no sweep has run since
            self._awaiting_sweep.pop(item_id, None)
            if item.attempts > held.attempts or item.note == LEASE_EXPIRED:
                recovered += 1
                self.metrics.unwritten_recovered.labels(kind=str(held.kind), reason=reason).inc()
                _log_item(logging.INFO, "handed back by the sweep", held, reason=reason)
        return recovered

    async def flush_completions(self) -> None:
        """Wait until every completion queued so far is written (tests, and the drain)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.shield(self._flusher)

    async def _fail(
        self,
        flight: _InFlight,
        error: str,
        *,
        raised: BaseException | None = None,
        failing: str = "handler",
    ) -> None:
        """Record a failed attempt with `error` (the row's `last_error`, cut at
        `_ERROR_LIMIT`) and log its one line at the level of its outcome: WARNING when it
        is requeued, ERROR when dead-lettered, with `raised`'s traceback when given."""
        kind = str(flight.item.kind)
        shown = error.partition("\n")[0][:200]  # the log line's `error` field: the first line
        # Where the error came from: `handler`, or `before_item` (the hook), with a traceback.
        more = {"error": shown} | ({"raised_by": failing.split()[0]} if raised else {})
        try:
            flight.item = await self._record_failure(flight, error[:_ERROR_LIMIT])
        except Conflict:
            flight.phase = Phase.SETTLED
            self.metrics.leases_lost.labels(kind=kind, reason="conflict").inc()
            _log_item(
                logging.WARNING,
                "attempt failed; its failure refused: the lease was lost",
                flight.item,
                exc_info=raised,
                **more,
            )
        except Exception:
            self._await_sweep(flight, "failure_unrecorded")
            _log_item(
                logging.ERROR,
                "attempt failed; recording the failure failed",
                flight.item,
                exc_info=raised,
                **more,
            )
            logger.exception("recording the failure failed; the sweep hands the item back")
        else:
            flight.phase = Phase.SETTLED
            if flight.item.status == WorkStatus.FAILED:
                self.metrics.dead_lettered.labels(kind=kind).inc()
                _log_item(
                    logging.ERROR,
                    "dead-lettered",
                    flight.item,
                    exc_info=raised,
                    **more,
                )
                await self._hook(
                    "on_dead_letter",
                    self._hooks.on_dead_letter(flight.ctx, flight.item),
                    flight.item,
                )
            else:
                self.metrics.failed.labels(kind=kind).inc()
                _log_item(
                    logging.WARNING,
                    "attempt failed; requeued",
                    flight.item,
                    exc_info=raised,
                    **more,
                )

    async def _record_failure(self, flight: _InFlight, error: str) -> WorkItem:
        """`fail` with the handler's error; when the store refuses that (a text it cannot
        hold, say), once more with a plain one, so the item is not left claimed until its
        lease runs out. `Conflict` and a second failure propagate."""
        try:
            return await self._work.fail(flight.ctx, flight.item, error)
        except Conflict:
            raise
        except Exception as exc:
            _log_item(
                logging.WARNING,
                "the failure's message could not be stored; recording a plain one",
                flight.item,
                error=type(exc).__name__,
            )
            plain = f"{error.partition(':')[0]} (its message could not be stored: {exc!r:.200})"
            return await self._work.fail(flight.ctx, flight.item, plain)

    async def _release(self, flight: _InFlight, *, note: str, reason: str) -> None:
        kind = str(flight.item.kind)
        try:
            flight.item = await self._work.release(flight.ctx, flight.item, note=note)
        except Conflict:
            flight.phase = Phase.SETTLED
            _log_item(logging.WARNING, "release refused: the lease was lost", flight.item)
        else:
            flight.phase = Phase.SETTLED
            self.metrics.released.labels(kind=kind, reason=reason).inc()
            _log_item(logging.INFO, "released", flight.item, note=note)

    def _forget(self, flight: _InFlight) -> None:
        self._items.pop(flight.item.id, None)
        self.state.in_flight = len(self._items)
        self.metrics.in_flight.set(len(self._items))
        self._slot_freed()

    def _slot_freed(self) -> None:
        """A slot is free, or claiming held back for unwritten completions may go on:
        claim again unless the last claim found the lane empty (`_claim_forever`)."""
        if not self._lane_empty:
            self._wake.set()

    def _woken(self) -> None:
        """Something says the lane may hold items (a wake-up, a channel back or lost,
        claiming resumed): claim now, whatever the last claim found."""
        self._wake_ups += 1
        self._lane_empty = False
        self._wake.set()

    # -- wake-ups ----------------------------------------------------------------------

    async def _listen_forever(self) -> None:
        """Set the wake event on `WORK_AVAILABLE` for this lane and kinds; resubscribe on
        loss (`_keep_subscribed`, channel `topic`)."""
        kinds = {str(kind) for kind in self._kinds}

        def wanted(message: BaseModel) -> bool:
            return (
                isinstance(message, WorkAvailablePayload)
                and message.lane == self.settings.lane
                and message.kind in kinds
            )

        await self._keep_subscribed(
            "topic", partial(self._topics.subscribe, Topics.WORK_AVAILABLE), wanted
        )

    async def _listen_database_forever(self) -> None:
        """Set the wake event on the storage's own wake-ups (PostgreSQL NOTIFY, sent by the
        enqueue's transaction at commit) for this lane and kinds; resubscribe on loss
        (`_keep_subscribed`, channel `database`)."""
        kinds = {str(kind) for kind in self._kinds}

        def wanted(note: tuple[str, str]) -> bool:
            lane, kind = note
            return lane == self.settings.lane and kind in kinds

        await self._keep_subscribed("database", self._work.wake_ups, wanted)

    async def _keep_subscribed(
        self,
        channel: str,
        subscribe: Callable[[], AbstractAsyncContextManager[AsyncIterator[T]] | None],
        wanted: Callable[[T], bool],
    ) -> None:
        """Hold one wake-up subscription; set the wake event for each message `wanted` takes.

        `subscribe()` returns the subscription to enter (None: the channel is gone, and the
        task ends). Entering may take `_SUBSCRIBE_WITHIN_S` seconds; once in, the loop wakes
        (whatever was sent while it was away) and `worker_wake_up_channel_up{channel}` is
        1. A subscription that cannot be entered, raises or ends is lost: the gauge is 0,
        one WARNING says so, the claim loop polls every `_POLL_WHILE_DOWN_S` seconds, and the
        next try follows after 0.1 s, doubling to `_RESUBSCRIBE_CAP_S` (the poll interval
        when shorter); each failed try is logged at DEBUG only. The try that succeeds logs
        one INFO line with the time the channel was down and counts
        `worker_wake_up_resubscriptions_total{channel}`. A connection that goes silent is
        the subscription's own to find out (a ping or probe with a deadline, then raise):
        the host's topics subscriber and the PostgreSQL storage each check theirs.
        """
        gauge = self.metrics.wake_up_channel_up.labels(channel=channel)
        gauge.set(0)
        cap = min(_RESUBSCRIBE_CAP_S, self.settings.poll_interval)
        retry = _RESUBSCRIBE_FIRST_S
        lost_at: float | None = None  # time.monotonic() of the loss; None while subscribed
        tries = 0
        while True:
            subscription = subscribe()
            if subscription is None:
                return
            try:
                async with contextlib.AsyncExitStack() as stack:
                    async with asyncio.timeout(_SUBSCRIBE_WITHIN_S):
                        messages = await stack.enter_async_context(subscription)
                    self.state.wake_ups_up = True
                    gauge.set(1)
                    if lost_at is not None:
                        self.metrics.wake_up_resubscriptions.labels(channel=channel).inc()
                        logger.info(
                            "wake-ups (%s) back after %.1f s (%d tries)",
                            channel,
                            time.monotonic() - lost_at,
                            tries + 1,
                        )
                    lost_at, tries, retry = None, 0, _RESUBSCRIBE_FIRST_S
                    self._woken()  # whatever was enqueued while we were away
                    async for message in messages:
                        if wanted(message):
                            self._woken()
                raise ConnectionError("the subscription ended")
            except Exception as exc:
                error = one_line(exc, 200)
            self.state.wake_ups_up = False
            gauge.set(0)
            if lost_at is None:
                lost_at = time.monotonic()
                self._woken()  # the claim loop's wait was set for the long poll: cut it
                logger.warning(
                    "wake-ups (%s) lost (%s); resubscribing every %g s at most, claiming "
                    "every %g s until then",
                    channel,
                    error,
                    cap,
                    self._poll_wait(),
                )
            else:
                tries += 1
                logger.debug("wake-ups (%s) still unavailable (%s)", channel, error)
            await asyncio.sleep(retry)
            retry = min(retry * 2, cap)

    # -- heartbeat ---------------------------------------------------------------------

    async def _write_liveness(self, key: str, value: str) -> None:
        """Write `value` under the liveness `key` and read it back; raises `LookupError` when
        what comes back differs (the write was lost or evicted), or what the cache raises."""
        await self._cache.set(
            CacheScope.WORKER_LIVENESS, key, value, ttl=self.settings.liveness_ttl
        )
        seen = await self._cache.get(CacheScope.WORKER_LIVENESS, key)
        if seen != value:
            raise LookupError("the liveness key read back differs from the one written")

    async def _heartbeat_forever(self) -> None:
        """Start a beat every `heartbeat_interval` seconds, start to start.

        A beat is cut off at the interval, so one that hangs (Redis unreachable) is followed
        at once by the next: after Redis returns, a good beat comes within one interval.
        """
        interval = self.settings.heartbeat_interval
        while True:
            started = time.monotonic()
            await self.beat_once()
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def beat_once(self) -> bool:
        """Write the liveness key and read it back; a miss or an error is a failed beat.

        A beat that raises is tried once more at once, within the same bound: after a Redis
        restart the first use of each connection pooled before it fails (it was open to the
        old server), so one retry on the pool's next connection tells a stale connection
        from a Redis still down, and `/healthz` returns within one interval of Redis.

        Returns whether the beat succeeded and updates `state`: claiming pauses after
        `heartbeat_failure_limit` failures in a row and resumes on the next good beat.
        """
        self.metrics.event_loop_tasks.set(len(asyncio.all_tasks()))
        key = liveness_key(self.worker_id)
        value = uuid.uuid4().hex
        bound = self.settings.heartbeat_interval
        try:
            async with asyncio.timeout(bound):
                try:
                    await self._write_liveness(key, value)
                except Exception:
                    await self._write_liveness(key, value)
        except Exception as exc:
            was_paused = self.state.claiming_paused
            self.state.heartbeat_failures += 1
            self.metrics.heartbeat_failures.inc()
            cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            logger.warning(
                "heartbeat failed (%s), %d in a row",
                cause[:300],
                self.state.heartbeat_failures,
            )
            if self.state.claiming_paused and not was_paused:
                logger.error(
                    "heartbeat failed %d times: claiming paused", self.state.heartbeat_failures
                )
            return False
        if self.state.claiming_paused:
            logger.info("heartbeat recovered: claiming resumed")
            self._woken()
        self.state.heartbeat_failures = 0
        self.state.beats += 1
        return True

    # -- maintenance sweep -------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        """The first pass runs at once (a restart recovers what a crash left behind); the
        second follows after this worker's stable stagger (`rules.stagger`, less than one
        interval), then one pass per interval. Replicas started together thus sweep out of
        step, and no two passes of one worker are ever more than an interval apart."""
        if self._outbox_stats is None:
            logger.info(
                "the outbox relay does not report the outbox's state (no outbox_stats): "
                "the worker_outbox_* gauges are not exported"
            )
        for kind in self._kinds:
            lane = policy_lane(kind, self._policies)
            if lane != self.settings.lane:
                logger.warning(
                    "this worker claims %s on lane %s, but the kind's policy enqueues it on "
                    "%s: new items wait there unclaimed (set %sLANE=%s, or change the kind's "
                    "KindPolicy)",
                    kind,
                    self.settings.lane,
                    lane,
                    self.settings.env_prefix(),
                    lane,
                )
        await self._sweep_logged()
        await asyncio.sleep(stagger(self.worker_id, self.settings.sweep_interval))
        while True:
            await self._sweep_logged()
            await asyncio.sleep(self.settings.sweep_interval)

    async def _sweep_logged(self) -> None:
        """One pass, its moves logged; an error outside every step (a bug) is logged too,
        so the timer never dies silently and the next pass runs."""
        try:
            moved = await self.sweep_once()
        except Exception:
            self.metrics.sweep_errors.labels(step="pass").inc()
            logger.exception("sweep pass failed; the next pass runs on time")
            return
        if moved:
            logger.info("swept %s", " ".join(f"{step}={rows}" for step, rows in moved.items()))

    async def sweep_once(self) -> dict[str, int]:
        """One sweep pass; returns the rows each step moved. Never raises (each step wrapped).

        Per tenant, under its service context: `requeue_stale` (stale leases back to the
        queue, or a dead letter when out of attempts), `audit_dead_letters` (the audit
        entries dead letters still owe, each written once), `resume_parked` (once per resumer
        in `parked`, at most `RESUME_LIMIT` records each), `purge_deleted`, and
        `purge_completed` (skipped while `completed_retention` is 0). Across tenants:
        `relay_pending` (what a crash left in the outbox, and the continuations the
        resumed records appended there) and `purge_relayed`. Then `unwritten`, only while
        this worker follows items whose final write failed (`_check_awaiting_sweep`), and
        the queue gauges: the depth per lane, the oldest available age per lane and kind
        (and, through the manager, the oldest snapshot's age on PostgreSQL). Then, with an
        `outbox_stats` reader, `outbox_stats`: the `worker_outbox_*` gauges. Last, one
        `queue stats` line (`_log_queue_stats`, `QUEUE_STATS_FIELDS`).
        """
        rctx = RequestContext.new(self._app)
        moved: dict[str, int] = {}
        retention = self.settings.retention
        kept_done = self.settings.completed_retention
        work, relay = self._work, self._relay
        contexts = await self._step(
            "maintenance_contexts", partial(work.maintenance_contexts, rctx), reads_queue=True
        )
        for ctx in contexts or []:
            await self._move(moved, "requeue_stale", partial(work.requeue_stale, ctx))
            await self._move(moved, "audit_dead_letters", partial(work.audit_dead_letters, ctx))
            for name, resumer in self._parked.items():
                await self._move(
                    moved, "resume_parked", partial(_resume_parked, resumer, ctx), source=name
                )
            await self._move(
                moved, "purge_deleted", partial(work.purge_deleted, ctx, older_than=retention)
            )
            if kept_done > 0:
                await self._move(
                    moved,
                    "purge_completed",
                    partial(work.purge_completed, ctx, older_than=kept_done),
                )
        await self._move(moved, "relay_pending", partial(relay.relay_pending, rctx))
        await self._move(
            moved, "purge_relayed", partial(relay.purge_relayed, rctx, older_than=retention)
        )
        if self._awaiting_sweep:
            await self._step("unwritten", self._check_awaiting_sweep)
        stats = await self._step("queue_stats", partial(work.queue_stats, rctx), reads_queue=True)
        line: dict[str, Any] = {"lane": self.settings.lane}  # the queue stats line's fields
        if stats is not None:
            depth: dict[str, int] = {}
            ages: dict[tuple[str, str], float] = {}
            for row in stats:
                available = row.count if row.status == WorkStatus.AVAILABLE else 0
                depth[row.lane] = depth.get(row.lane, 0) + available
                ages[row.lane, row.kind] = max(
                    ages.get((row.lane, row.kind), 0.0), row.oldest_available_age or 0.0
                )
            # A lane or kind with no row in play any more reads 0, not its last value.
            self._gauged_lanes |= depth.keys()
            self._gauged_ages |= ages.keys()
            for lane in self._gauged_lanes:
                self.metrics.queue_depth.labels(lane=lane).set(depth.get(lane, 0))
            for lane, kind in self._gauged_ages:
                age = ages.get((lane, kind), 0.0)
                self.metrics.queue_oldest_available_age.labels(lane=lane, kind=kind).set(age)
            kinds = {str(kind) for kind in self._kinds}
            own = [row for row in stats if row.lane == self.settings.lane and row.kind in kinds]
            line["available"] = sum(r.count for r in own if r.status == WorkStatus.AVAILABLE)
            oldest = max((ages[r.lane, r.kind] for r in own), default=0.0)
            line["oldest_available_age_s"] = round(oldest, 3)
            line["dead_letters_unaudited"] = sum(r.audit_owed for r in own)
            line["stranded"] = self._report_stranded(stats)
            # The manager's gauge, refreshed by the queue_stats just read (PostgreSQL only).
            xid_ages = _sample_values(default_metrics().oldest_snapshot_xid_age)
            if xid_ages:
                line["oldest_snapshot_xid_age"] = int(max(xid_ages))
        if self._outbox_stats is not None:
            outbox = await self._step(
                "outbox_stats", partial(_outbox_stats, self._outbox_stats, rctx)
            )
            if outbox is not None:
                gauges = self.metrics.outbox_gauges()
                pending, oldest_age, failing, dead = outbox
                gauges.pending.set(pending)
                gauges.oldest_pending_age.set(oldest_age)
                gauges.failing.set(failing)
                gauges.dead_letters.set(dead)
                line["outbox_pending"] = pending
                line["outbox_oldest_pending_age_s"] = round(oldest_age, 3)
                line["outbox_failing"] = failing
                line["outbox_dead_letters"] = dead
        self._say_failing_steps()
        self._log_queue_stats(line)
        return moved

    def _report_stranded(self, stats: Sequence[LaneStats]) -> int:
        """Log one WARNING naming each kind and lane with stranded items and how many
        (`rules.stranded`: waiting where no worker claims them), when there are any; the
        total. Nothing is failed or moved: an operator decides (`items move`, `items
        discard`; the template's docs/operations.md, "Stranded items")."""
        found = stranded(stats, self._policies)
        named = []
        for (kind, lane), count in found.items():
            home = policy_lane(kind, self._policies)
            why = "no worker declares this kind" if home is None else f"its workers claim on {home}"
            named.append(f"{kind} on {lane}: {count} ({why})")
        if named:
            logger.warning(
                "stranded items, waiting where no worker claims them: %s; list them with "
                "`items list --any-kind`, then `items move` or `items discard`",
                ", ".join(named),
            )
        return sum(found.values())

    def _log_queue_stats(self, line: dict[str, Any]) -> None:
        """Log this pass's `queue stats` line (INFO): `event` `QUEUE_STATS_EVENT` and the
        `QUEUE_STATS_FIELDS` known, as `extra` fields and as `key=value` in the message.

        `line` holds what the pass read; this adds the failures counted since the previous
        line (from the counters `/metrics` serves, so the two never disagree) and whether
        the wake-up channel is up. One line per pass and loop, whatever its lane's traffic.
        """
        failures = {
            "claim_failures": sum(_sample_values(self.metrics.claim_failures, "_total")),
            "lease_renewal_failures": sum(_sample_values(self.metrics.renewals_failed, "_total")),
            "completion_failures": sum(_sample_values(self.metrics.completions_failed, "_total")),
        }
        for name, total in failures.items():
            line[name] = round(total - self._failures_logged.get(name, 0.0))
        self._failures_logged = failures
        line["wake_up_channel_up"] = int(self.state.wake_ups_up)
        fields = {"event": QUEUE_STATS_EVENT} | {
            name: line[name] for name in QUEUE_STATS_FIELDS if name in line
        }
        suffix = " ".join(f"{name}={value}" for name, value in fields.items() if name != "event")
        logger.info("queue stats %s", suffix, extra=fields)

    async def _move(
        self,
        moved: dict[str, int],
        step: str,
        call: Callable[[], Awaitable[int]],
        *,
        source: str = "",
    ) -> None:
        """Run one moving step (wrapped by `_step`) and count the rows it moved."""
        rows = await self._step(step, call, source=source)
        if rows:
            moved[step] = moved.get(step, 0) + rows
            self.metrics.sweep_moved.labels(step=step).inc(rows)

    async def _step(
        self,
        step: str,
        call: Callable[[], Awaitable[T]],
        *,
        source: str = "",
        reads_queue: bool = False,
    ) -> T | None:
        """Call `call` and await it, for at most `sweep_step_timeout` seconds; any
        exception, even one raised before the first await (a host method of an unexpected
        signature), and the timeout are counted, logged and swallowed. A step cancelled at
        its bound rolls back its transaction; each step is idempotent, so the next pass
        simply retries it, and a step that hangs (a lock, a host call) never stalls the
        steps after it, stale-lease recovery included. A step's first failure is logged
        with its traceback, later ones once per pass (`_say_failing_steps`), a database
        outage's by `_database_failed`; a step that `reads_queue` and succeeds ends one."""
        name = f"{step} ({source})" if source else step
        bound = asyncio.timeout(self.settings.sweep_step_timeout)
        began = time.monotonic()
        try:
            async with bound:
                result = await call()
        except Exception as exc:
            self.metrics.sweep_errors.labels(step=step).inc()
            again = name in self._failing_steps
            self._failing_steps[name] = self._failing_steps.get(name, 0) + 1
            origin = f"sweep step {step}"
            if not bound.expired():
                outage = self._database_failed(exc, origin, began)
            else:
                # A step that hangs is an outage's when the queue's own storage did not
                # answer, or while the database is known to be down; else a lock, a host call.
                unanswered = TimeoutError(
                    f"no answer within {self.settings.sweep_step_timeout:g} s"
                )
                down = reads_queue or self.state.database_down_since is not None
                outage = down and self._database_failed(unanswered, origin, began)
            if again or outage:
                self._unsaid_failures.add(name)  # said once per pass (`_say_failing_steps`)
            elif bound.expired():
                logger.error(
                    "sweep step %s ran past %s s; cancelled, the next pass retries it",
                    name,
                    self.settings.sweep_step_timeout,
                )
            else:
                logger.exception("sweep step %s failed; the next pass retries it", name)
            return None
        failures = self._failing_steps.pop(name, 0)
        if failures:
            logger.info("sweep step %s succeeds again after %d failure(s)", name, failures)
        if reads_queue:
            self._database_answered()  # the queue's own storage answered: the database is up
        return result

    def _say_failing_steps(self) -> None:
        """One WARNING for the steps that failed this pass without a line of their own (a
        step's first failure logs its traceback; the next ones, and an outage's, are
        counted here), with each step's failures in a row."""
        if self._unsaid_failures:
            counts = " ".join(
                f"{name}={self._failing_steps.get(name, 0)}"
                for name in sorted(self._unsaid_failures)
            )
            logger.warning(
                "sweep steps still failing (failures in a row): %s; the next pass retries them",
                counts,
            )
            self._unsaid_failures.clear()

    # -- drain -------------------------------------------------------------------------

    async def _drain(self, heartbeat: asyncio.Task[None], others: list[asyncio.Task[None]]) -> None:
        """In order: stop claiming, cancel every task, hand each item back with a note,
        stop the heartbeat, then mark the worker offline, within `drain_deadline` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.drain_deadline

        def remaining() -> float:
            return max(deadline - loop.time(), 0.0)

        self.stop()
        for task in others:
            task.cancel()
        flights = list(self._items.values())
        tasks = [flight.task for flight in flights if flight.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=remaining())
        try:
            async with asyncio.timeout(remaining()):
                await self.flush_completions()  # handled items are written, not handed back
        except TimeoutError:
            logger.error("drain deadline passed while completions were written")
        note = f"worker {self.worker_id} stopped: handed back while draining"
        pending = [f for f in flights if f.phase in (Phase.CLAIMED, Phase.HANDLING, Phase.HANDLED)]
        if pending:
            try:
                async with asyncio.timeout(remaining()):
                    outcomes = await asyncio.gather(
                        *(self._release(f, note=note, reason="drain") for f in pending),
                        return_exceptions=True,
                    )
            except TimeoutError:
                logger.error("drain deadline passed; the sweep returns what is left")
            else:
                errors = [o for o in outcomes if isinstance(o, BaseException)]
                if errors:
                    logger.error(
                        "could not hand back %d item(s) (%s); the sweep returns them after "
                        "their lease",
                        len(errors),
                        type(errors[0]).__name__,
                    )
        handed_back = sum(1 for flight in pending if flight.phase is Phase.SETTLED)
        heartbeat.cancel()
        await asyncio.wait([heartbeat, *others], timeout=max(remaining(), 0.1))
        try:
            async with asyncio.timeout(max(remaining(), 0.1)):
                await self._cache.delete(CacheScope.WORKER_LIVENESS, liveness_key(self.worker_id))
        except Exception as exc:
            logger.warning("could not mark the worker offline (%s)", type(exc).__name__)
        logger.info("drained: %d item(s) handed back", handed_back)
        self._drained.set()

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()
