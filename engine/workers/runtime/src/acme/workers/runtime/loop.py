"""The worker loop: claim, handle, complete; lease renewal, self-fencing, heartbeat, drain.

`WorkerLoop` claims up to its free slots with one `claim_many` when woken (`ClaimSignal`,
by its wake-up subscription) or when the poll interval passes (on a busy lane, while
handlers run shorter than the claim, a partial refill waits up to 2 ms for the slots
freeing beside it: docs/decisions/0055); runs each item as its own task; renews each
item's lease every `lease / 5` seconds and fences itself off an item whose lease it may
have lost; writes completions in groups (one `complete_many` per batch); beats on the
cache; and drains at `stop()`. The sweep (`sweep.Sweep`), the
wake-up subscription (`wake.WakeUpSubscription`) and the scheduler (`schedules.Scheduler`)
are collaborators it starts and stops.
Fencing times come from the injected wall clock (`clock`); lease expiry is the database's
(docs/guarantees.md §7). Every bound is `asyncio.timeout`, never `asyncio.wait_for`
(docs/decisions/0030).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from uuid import UUID

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from acme.infra.cache import CacheInterface
from acme.om.context import AppContext, AppType, RequestContext
from acme.om.errors import Conflict
from acme.om.work import WorkManagerInterface
from acme.om.work.types.handler import PermanentFailure, Snooze, WorkHandlerInterface
from acme.om.work.types.policy import KindPolicy
from acme.om.work.types.work_item import (
    WORK_POLICIES,
    ItemCancelled,
    WorkItem,
    WorkKind,
    WorkStatus,
)
from acme.workers.runtime.completion import Completions
from acme.workers.runtime.errors import failure_text
from acme.workers.runtime.heartbeat import Heartbeat
from acme.workers.runtime.hooks import NO_HOOKS as NO_HOOKS
from acme.workers.runtime.hooks import ItemHooks as ItemHooks
from acme.workers.runtime.lease import LeaseRenewal, mark_cancelled
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.outage import DatabaseOutage
from acme.workers.runtime.schedules import Scheduler
from acme.workers.runtime.settings import RuntimeSettings
from acme.workers.runtime.state import (
    LOOP_LOGGER,
    ClaimSignal,
    InFlight,
    LoopState,
    Phase,
    log_item,
    new_worker_id,
)
from acme.workers.runtime.sweep import Sweep, UnwrittenWrites
from acme.workers.runtime.wake import WakeUpSubscription
from acme.workers.runtime.watch import EventLoopWatch

logger = logging.getLogger(LOOP_LOGGER)

Clock = Callable[[], float]

_ERROR_LIMIT = 2000  # characters of an error and its innermost frames kept on the row
_CLAIM_AFTER_STOP_S = 2.0  # seconds the claim in progress at a stop may take to return
# Seconds a partial refill may wait for more slots while handlers run shorter than the
# claim that feeds them (docs/decisions/0055); the weight of each new sample in the means.
_REFILL_WAIT_S = 0.002
_MEAN_WEIGHT = 0.1
_CANCELLED_CLAIM_S = 1.0  # seconds a claim cancelled at a stop may take to unwind
# Seconds a claim may run past its lease before it is cancelled as unanswered: a claim
# that takes longer hands out leases already spent, and a database that accepts the
# connection and never answers would otherwise hold it for the driver's own timeouts.
_CLAIM_GRACE_S = 5.0
_CLAIM_LEAST_S = 0.1  # seconds: the shortest bound a claim is given


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


def _turned(kinds: list[WorkKind], turn: int) -> list[WorkKind]:
    """`kinds` starting at the `turn`-th (modulo their number)."""
    if not kinds:
        return []
    at = turn % len(kinds)
    return kinds[at:] + kinds[:at]


class WorkerLoop:
    """Claims `(lane, kinds)` and runs each item through its handler; see the module docstring.

    `handlers` maps each kind to its handler; `kinds` (default: the handlers' kinds) is what
    the loop claims; an item of a kind without a handler is released with a note. `sweep`
    and `wake_ups` are run beside the claim loop (None: none; the loop polls), and so is
    `scheduler`, which enqueues the worker's periodic items (None: it has none). `state`,
    `signal`, `outage` and `unwritten` are shared with them (fresh ones by default).
    `clock` is the wall clock (seconds) self-fencing measures with. `hooks`: `ItemHooks`.
    """

    def __init__(
        self,
        *,
        settings: RuntimeSettings,
        work: WorkManagerInterface,
        handlers: Mapping[WorkKind, WorkHandlerInterface],
        cache: CacheInterface,
        metrics: WorkerMetrics,
        sweep: Sweep | None = None,
        wake_ups: WakeUpSubscription[Any] | None = None,
        scheduler: Scheduler | None = None,
        state: LoopState | None = None,
        signal: ClaimSignal | None = None,
        outage: DatabaseOutage | None = None,
        unwritten: UnwrittenWrites | None = None,
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
        self.state = state or LoopState(
            heartbeat_failure_limit=settings.heartbeat_failure_limit,
            claim_failure_limit_s=settings.claim_failure_limit_s,
        )
        self.sweep = sweep
        self.wake_ups = wake_ups
        self.scheduler = scheduler
        self.signal = signal or ClaimSignal()
        self.database = outage or DatabaseOutage(settings, self.state)
        self.database.stop = self.stop
        self.unwritten = unwritten or UnwrittenWrites()
        self._work = work
        self._handlers = dict(handlers)
        self._kinds = list(kinds) if kinds is not None else list(self._handlers)
        # Several kinds claim one statement each, a kind with a capacity of its own
        # (`kind_capacity`) up to it, in turns (docs/decisions/0042).
        self._kind_capacity = {
            kind: settings.kind_capacity[str(kind)]
            for kind in self._kinds
            if str(kind) in settings.kind_capacity
        }
        self._turn = 0
        # Capped kinds whose last claim took all it asked for (or that have not claimed yet):
        # a slot of theirs that frees claims again even when the rest was found empty.
        self._maybe_more: set[WorkKind] = set(self._kind_capacity)
        self._policies = policies
        self._clock = clock
        self._hooks = hooks
        self._tracer = tracer or trace.get_tracer(__name__)
        self._app = AppContext(type=AppType.WORKER, version=settings.app_version)
        self._items: dict[UUID, InFlight] = {}
        # Whether the last claim found the lane empty; when the first slot of a partial
        # refill freed; running means of a handler's and a claim's seconds.
        self._last_empty = True
        self._partial_since: float | None = None
        self._handled_s = 0.0
        self._claim_s = 0.0
        self.heartbeat = Heartbeat(
            settings=settings,
            cache=cache,
            work=work,
            metrics=metrics,
            worker_id=self.worker_id,
            kinds=self._kinds,
            state=self.state,
            signal=self.signal,
        )
        self._lease = LeaseRenewal(settings=settings, work=work, metrics=metrics, clock=clock)
        self._completions = Completions(
            work=work,
            metrics=metrics,
            outage=self.database,
            unwritten=self.unwritten,
            signal=self.signal,
        )
        if wake_ups is not None:
            wake_ups.on_cancel = self.cancel_held
        self._stop = asyncio.Event()
        self._drained = asyncio.Event()

    @property
    def outage(self) -> str | None:
        """Why the loop stopped itself: a database outage past `database_outage_limit`."""
        return self.database.outage

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self) -> None:
        """Run until `stop()` is called, then drain; returns once drained (see `_drain`)."""
        heartbeat = asyncio.create_task(self.heartbeat.run(), name="heartbeat")
        others = [asyncio.create_task(EventLoopWatch().run(), name="event-loop-watch")]
        if self.wake_ups is not None:
            others.append(asyncio.create_task(self.wake_ups.run(), name="wake-ups"))
        if self.sweep is not None:
            others.append(asyncio.create_task(self.sweep.run(), name="sweep"))
        if self.scheduler is not None:
            others.append(asyncio.create_task(self.scheduler.run(), name="scheduler"))
        try:
            await self._claim_until_stopped()
        finally:
            await self._drain(heartbeat, others)

    def stop(self) -> None:
        """Ask the loop to drain: claiming stops at once. Safe to call from a signal handler."""
        self.state.draining = True
        self.metrics.claiming.set(0)
        self._stop.set()
        self.signal.event.set()

    async def wait_drained(self) -> None:
        """Wait until `run()` has drained."""
        await self._drained.wait()

    # -- claiming ----------------------------------------------------------------------

    async def _claim_until_stopped(self) -> None:
        """`_claim_forever` until `stop()`, giving the claim in progress at the stop at most
        `_CLAIM_AFTER_STOP_S` (and a quarter of `drain_deadline`) to return, so a claim stuck
        in the database never holds the drain back; one cancelled so is rolled back, and
        rows it claimed go back after their lease. Raises what `_claim_forever` raises.
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
        """Claim for the free slots whenever `signal` is set or the poll interval passes,
        until `stop()`. A claim that took fewer items than it asked for found the lane
        empty: a freed slot does not claim again until a wake-up or the poll; a wake-up
        during the claim voids that verdict (`ClaimSignal`, docs/decisions/0024).
        """
        signal = self.signal
        while not self._stop.is_set():
            signal.event.clear()
            free = self.settings.capacity - len(self._items)
            if self._completions.unwritten > self.settings.capacity:
                free = 0  # completions are backing up: let them be written first
            paused = self.state.claiming_paused
            self.metrics.claiming.set(0 if paused else 1)
            wait_s = 0.0 if paused else self._refill_wait_s(free)
            if wait_s > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await signal.event.wait()
                continue
            self._partial_since = None
            if free > 0 and not paused:
                wake_ups = signal.wake_ups
                empty, more, unhandled = await self._claim_for(free)
                self._last_empty = empty
                # Every claim gives its verdict afresh (a failed one gives none).
                signal.lane_empty = (
                    empty
                    and not unhandled
                    and signal.wake_ups == wake_ups
                    and self.state.claims_failing_since is None
                )
                if unhandled:
                    # A kind nobody here handles was handed back; claiming again at once
                    # would take it straight back, so wait out the poll interval.
                    await self._sleep_unless_stopped(self.settings.poll_interval)
                    continue
                if more:
                    continue  # the lane may hold more: the next pass finds the slots full
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.state.poll_wait_s(self.settings.poll_interval)):
                    await signal.event.wait()

    def _refill_wait_s(self, free: int) -> float:
        """Seconds to wait before claiming for `free` slots (0: claim now). Only a partial
        refill on a busy lane waits, and only while handlers run shorter than the claim
        (running means): then statements are the throughput, and a slot claimed alone
        splits the slots into cohorts that each pay a claim and a completion. It waits
        up to `_REFILL_WAIT_S` from the first free slot for the others (docs/decisions/0055).
        """
        busy = not self._last_empty and self._handled_s < self._claim_s
        if not busy or not 0 < free < self.settings.capacity:
            return 0.0
        now = time.monotonic()
        if self._partial_since is None:
            self._partial_since = now
        return max(0.0, self._partial_since + _REFILL_WAIT_S - now)

    async def _claim_for(self, free: int) -> tuple[bool, bool, int]:
        """Claim for `free` slots. One kind: one `claim_once`. Several: one `claim_once` per
        kind, each asking for what is left of the process's slots and, for a kind with a
        capacity of its own, of its own. Those kinds ask first, up to their capacity; the
        others share what is left. Within each, the first kind asked turns each pass, so
        none waits behind another (docs/decisions/0042).

        Returns `(empty, more, unhandled)`: whether every claim found fewer items than it
        asked for (a kind at its own capacity has no say: a slot of its that frees claims
        again, `_maybe_more`), whether one took all it asked for while it had room left,
        and how many items were of a kind without a handler.
        """
        if len(self._kinds) <= 1:
            claimed, unhandled = await self.claim_once(free)
            return claimed < free, claimed == free, unhandled
        running = collections.Counter(flight.item.kind for flight in self._items.values())
        self._turn += 1
        capped = [kind for kind in self._kinds if kind in self._kind_capacity]
        shared = [kind for kind in self._kinds if kind not in self._kind_capacity]
        empty, more, unhandled_all = True, False, 0
        for kind in _turned(capped, self._turn) + _turned(shared, self._turn):
            cap = self._kind_capacity.get(kind)
            room = free if cap is None else cap - running[kind]
            asked = min(room, self.settings.capacity - len(self._items))
            if asked <= 0:
                empty = empty and cap is not None and room <= 0  # else the process is full
                continue
            claimed, unhandled = await self.claim_once(asked, [kind])
            unhandled_all += unhandled
            if cap is not None and claimed == asked:
                self._maybe_more.add(kind)
                empty = empty and claimed == room  # at its own capacity now: no say
            else:
                self._maybe_more.discard(kind)
                empty = empty and claimed < asked
            more = more or (claimed == asked and claimed < room)
        return empty, more, unhandled_all

    async def claim_once(
        self, limit: int, kinds: Sequence[WorkKind] | None = None
    ) -> tuple[int, int]:
        """Claim up to `limit` items of `kinds` (default: every kind this loop claims) and
        start a task for each.

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
                        self._kinds if kinds is None else kinds,
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
            if self.database.failed(exc, "claim", began):
                return 0, 0  # an outage: said once, and waited out (`DatabaseOutage.failed`)
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
        self._claim_s += (time.monotonic() - began - self._claim_s) * _MEAN_WEIGHT
        self.database.answered()
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
            flight = InFlight(ctx=ctx, item=item, claimed_at=started)
            if item.kind not in self._handlers:
                unhandled += 1
                note = f"kind {item.kind} is not handled by worker {self.worker_id}"
                await self._release(flight, note=note, reason="unhandled_kind")
                continue
            log_item(logging.DEBUG, "claimed", item)
            self._items[item.id] = flight
            flight.task = asyncio.create_task(self._run_item(flight), name=f"item-{item.id}")
        self.state.in_flight = len(self._items)
        self.metrics.in_flight.set(len(self._items))
        return len(pairs), unhandled

    # -- one item ----------------------------------------------------------------------

    async def _run_item(self, flight: InFlight) -> None:
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
            self.settings.renewal_interval, self._lease.start, flight, since
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
            if not flight.phase.stopped and task is not None and task.cancelling() == 0:
                # Nobody cancelled this task: the handler raised CancelledError itself (a
                # future it awaited was cancelled, say). A failed attempt, as any error is;
                # re-raised, it would leave the item claimed until its lease passed.
                await self._handler_failed(flight, starter, exc, failing)
            else:
                await self._lease.stop(flight, starter)
                if not flight.phase.stopped:
                    raise  # the drain cancelled us: it hands the item back
                if task is not None:
                    task.uncancel()
                await self._after_lease_lost(flight)  # a cancelled item: nothing to write
        except (PermanentFailure, Snooze) as verdict:
            await self._lease.stop(flight, starter)
            await self._hook("after_item", self._hooks.after_item(flight.ctx, item, verdict), item)
            await self._verdict(flight, verdict)
        except Exception as exc:
            if isinstance(exc, TimeoutError) and bound.expired():
                await self._lease.stop(flight, starter)
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
            if flight.phase is Phase.CANCELLED:
                # Cancelled while it ran, and it returned anyway: its completion would be
                # refused; nothing is written.
                await self._lease.stop(flight, starter)
                return
            if bound.expired():
                # The handler caught the timeout's cancellation and went on to finish: its
                # work is done, so the item completes, but its timeout did not hold.
                log_item(
                    logging.WARNING,
                    f"handler returned after its timeout of {policy.timeout} s "
                    "(it caught the cancellation); completed",
                    item,
                )
            # Queued first: a drain that cancels us while the renewal ends still finds the
            # completion queued, writes it, and does not hand a handled item back.
            self._completions.add(flight)
            await self._lease.stop(flight, starter)
            await self._hook("after_item", self._hooks.after_item(flight.ctx, item, None), item)
        finally:
            handled_s = time.monotonic() - started
            self.metrics.handle_duration.labels(kind=kind).observe(handled_s)
            self._handled_s += (handled_s - self._handled_s) * _MEAN_WEIGHT
            self._forget(flight)

    async def _handler_failed(
        self,
        flight: InFlight,
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
        await self._lease.stop(flight, starter)
        error = (
            raised
            if isinstance(raised, Exception)
            else RuntimeError(f"the {failing} raised {type(raised).__name__}: {raised}")
        )
        await self._hook("after_item", self._hooks.after_item(flight.ctx, item, error), item)
        if not isinstance(raised, Exception):
            log_item(
                logging.ERROR,
                f"{failing} raised {type(raised).__name__}, which is not an Exception; "
                "counted as a failed attempt",
                item,
                error=type(raised).__name__,
            )
        await self._fail(flight, failure_text(raised, _ERROR_LIMIT), raised=raised, failing=failing)

    async def _verdict(self, flight: InFlight, verdict: PermanentFailure | Snooze) -> None:
        """Write the handler's own verdict (docs/decisions/0039): `PermanentFailure` makes
        the item a dead letter at once, `Snooze` hands it back for `delay_s` seconds with
        its attempt given back; both fenced on the claim token like every write."""
        kind = str(flight.item.kind)
        try:
            if isinstance(verdict, PermanentFailure):
                reason = f"PermanentFailure: {verdict.reason}"[:_ERROR_LIMIT]
                flight.item = await self._work.fail_permanently(flight.ctx, flight.item, reason)
            else:
                flight.item = await self._work.defer(
                    flight.ctx, flight.item, verdict.delay_s, note="snoozed"
                )
        except ItemCancelled:
            mark_cancelled(flight, self.metrics, "verdict refused: cancelled by an operator")
            return
        except Conflict:
            flight.phase = Phase.SETTLED
            self.metrics.leases_lost.labels(kind=kind, reason="conflict").inc()
            log_item(logging.WARNING, "verdict refused: the lease was lost", flight.item)
            return
        except Exception:
            self.unwritten.follow(flight.ctx, flight.item, "failure_unrecorded")
            logger.exception("recording the handler's verdict failed; the sweep hands it back")
            return
        flight.phase = Phase.SETTLED
        if isinstance(verdict, Snooze):
            self.metrics.snoozed.labels(kind=kind).inc()
            log_item(logging.INFO, "snoozed", flight.item, delay_s=verdict.delay_s)
            return
        self.metrics.dead_lettered.labels(kind=kind).inc()
        log_item(logging.ERROR, "dead-lettered by its handler", flight.item, error=verdict.reason)
        await self._hook(
            "on_dead_letter", self._hooks.on_dead_letter(flight.ctx, flight.item), flight.item
        )

    def cancel_held(self, item_id: UUID) -> None:
        """An operator cancelled item `item_id` (a wake-up channel said so): when this
        worker runs its handler, cancel it (`LeaseRenewal.cancel`); else nothing."""
        flight = self._items.get(item_id)
        if flight is not None:
            self._lease.cancel(flight)

    async def _hook(self, name: str, call: Awaitable[None], item: WorkItem) -> None:
        """Await one after-the-fact hook (`ItemHooks`); what it raises is logged and counted,
        never passed on."""
        try:
            await call
        except Exception:
            self.metrics.hook_failures.labels(hook=name).inc()
            logger.exception("hook %s failed for item %s; the item's outcome stands", name, item.id)

    async def _after_lease_lost(self, flight: InFlight) -> None:
        """After self-fencing on unrenewed time, try once to hand the item back early.

        The release is conditional on the claim token, so it is refused (`Conflict`) when
        another worker holds the item already; otherwise the sweep returns it after the lease.
        """
        if flight.phase is not Phase.LOST_UNRENEWED:
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.settings.renewal_interval):
                await self._release(flight, note="lease lost: renewals failed", reason="lease_lost")

    async def flush_completions(self) -> None:
        """Wait until every completion queued so far is written (tests, and the drain)."""
        await self._completions.flush()

    async def _fail(
        self,
        flight: InFlight,
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
        except ItemCancelled:
            mark_cancelled(flight, self.metrics, "failure refused: cancelled by an operator")
        except Conflict:
            flight.phase = Phase.SETTLED
            self.metrics.leases_lost.labels(kind=kind, reason="conflict").inc()
            log_item(
                logging.WARNING,
                "attempt failed; its failure refused: the lease was lost",
                flight.item,
                exc_info=raised,
                **more,
            )
        except Exception:
            self.unwritten.follow(flight.ctx, flight.item, "failure_unrecorded")
            log_item(
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
                log_item(logging.ERROR, "dead-lettered", flight.item, exc_info=raised, **more)
                await self._hook(
                    "on_dead_letter",
                    self._hooks.on_dead_letter(flight.ctx, flight.item),
                    flight.item,
                )
            else:
                self.metrics.failed.labels(kind=kind).inc()
                log_item(
                    logging.WARNING,
                    "attempt failed; requeued",
                    flight.item,
                    exc_info=raised,
                    **more,
                )

    async def _record_failure(self, flight: InFlight, error: str) -> WorkItem:
        """`fail` with the handler's error; when the store refuses that (a text it cannot
        hold, say), once more with a plain one, so the item is not left claimed until its
        lease runs out. `Conflict` and a second failure propagate."""
        try:
            return await self._work.fail(flight.ctx, flight.item, error)
        except Conflict:
            raise
        except Exception as exc:
            log_item(
                logging.WARNING,
                "the failure's message could not be stored; recording a plain one",
                flight.item,
                error=type(exc).__name__,
            )
            plain = f"{error.partition(':')[0]} (its message could not be stored: {exc!r:.200})"
            return await self._work.fail(flight.ctx, flight.item, plain)

    async def _release(self, flight: InFlight, *, note: str, reason: str) -> None:
        kind = str(flight.item.kind)
        try:
            flight.item = await self._work.release(flight.ctx, flight.item, note=note)
        except ItemCancelled:
            mark_cancelled(flight, self.metrics, "release refused: cancelled by an operator")
        except Conflict:
            flight.phase = Phase.SETTLED
            log_item(logging.WARNING, "release refused: the lease was lost", flight.item)
        else:
            flight.phase = Phase.SETTLED
            self.metrics.released.labels(kind=kind, reason=reason).inc()
            log_item(logging.INFO, "released", flight.item, note=note)

    def _forget(self, flight: InFlight) -> None:
        self._items.pop(flight.item.id, None)
        self.state.in_flight = len(self._items)
        self.metrics.in_flight.set(len(self._items))
        if flight.item.kind in self._maybe_more:
            self.signal.event.set()  # its kind was at its own capacity, not found empty
        else:
            self.signal.slot_freed()

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
                await self.heartbeat.mark_offline()
        except Exception as exc:
            logger.warning("could not mark the worker offline (%s)", type(exc).__name__)
        logger.info("drained: %d item(s) handed back", handed_back)
        self._drained.set()

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()
