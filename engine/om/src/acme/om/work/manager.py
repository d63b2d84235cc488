"""The work manager's interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from acme.om.context import OpContext, RequestContext
from acme.om.outbox import OutboxRow
from acme.om.work.storage import WakeUps
from acme.om.work.types.lanes import LanePause, QueueSummary, WorkerBeat
from acme.om.work.types.schedules import ScheduleState
from acme.om.work.types.work_item import (
    LaneStats,
    UnreadableRow,
    WorkItem,
    WorkKind,
    WorkRows,
    WorkStatus,
)


class Completed(set[UUID]):
    """What `complete_many` reports: the ids it completed; `cancelled` holds those of the
    items left out because an operator cancelled them while they were held (under the
    token the completion carried), so no fencing conflict is counted for them."""

    def __init__(self, completed: Iterable[UUID] = (), cancelled: Iterable[UUID] = ()) -> None:
        super().__init__(completed)
        self.cancelled: set[UUID] = set(cancelled)


class WorkManagerInterface(ABC):
    """The table-backed work queue.

    An item is enqueued, claimed by one worker under a lease and a claim token, then
    completed, deferred, released, failed into a retry, or failed into a dead letter at
    `max_attempts`. Every write after the claim carries the claim token and is refused
    with `Conflict` when the token no longer matches: another worker holds the item, or
    the sweep took it back. Durations are seconds. Methods that take a `RequestContext`
    are the request stage: they find their tenant themselves (`claim`, `claim_many`,
    `maintenance_contexts`, `queue_stats`).
    """

    @abstractmethod
    async def enqueue(self, ctx: OpContext, item: WorkItem) -> WorkItem:
        """Insert `item` in `ctx`'s tenant, or return the row that already holds it.

        The payload is validated against `WORK_PAYLOADS[item.kind]`; actor, status, attempts
        and causing request are stamped from `ctx`, claim fields cleared. A duplicate id or
        `idempotency_key` returns the existing row untouched. Publishes
        `Topics.WORK_AVAILABLE` after the commit, without waiting (`publish_owed_wake_ups`).
        Raises `Invalid` naming the field, with nothing written: an unknown kind, a payload
        field, an `org_id` of another tenant or `EMPTY_UUID`, a lane that is not snake_case
        of at most 100 characters, a NUL in a payload string or key, a `priority` outside
        `PRIORITY_MIN`..`PRIORITY_MAX`.
        """

    @abstractmethod
    async def enqueue_many(self, ctx: OpContext, items: Sequence[WorkItem]) -> list[WorkItem]:
        """`enqueue` for many items in one insert statement; the rows in input order.

        Every payload is validated first: one `Invalid` and nothing is written.
        """

    @abstractmethod
    async def enqueue_bulk(
        self,
        ctx: OpContext,
        kind: WorkKind,
        payloads: Sequence[BaseModel | Mapping[str, Any]],
        *,
        delay: float = 0.0,
        lane: str | None = None,
        priority: int | None = None,
    ) -> list[UUID]:
        """Enqueue one fresh item of `kind` per payload in `ctx`'s tenant, in one insert;
        their ids, in input order.

        `enqueue_many` for large batches of one kind, at a fraction of its cost per item: no
        `WorkItem` is built or returned per payload. Each payload (the kind's payload model,
        or its JSON form) is validated in its JSON form against `WORK_PAYLOADS[kind]`, as
        `enqueue` validates it; the items are stamped as `enqueue` stamps them, with `delay`
        (seconds, a negative value counts as 0), `lane` (default: the kind's policy
        lane) and `priority` (default: the kind's policy priority) shared by all, and no
        idempotency key (the ids are new, so every item is
        inserted). Publishes `Topics.WORK_AVAILABLE` as `enqueue` does. Raises `Invalid`
        with nothing written, naming the payload and its field (`payloads.3.record_id:
        ...`; a NUL character as for `enqueue`), or what else `enqueue` refuses: an
        unknown kind, a lane no worker can name, a `delay` that is not a finite number,
        a `priority` out of its range, the nil tenant.
        """

    @abstractmethod
    async def enqueue_relayed(self, org_id: UUID, row: OutboxRow) -> WorkItem:
        """Enqueue the work an outbox row of kind `work.<KIND>` asks for.

        An operation without a principal, beside the outbox relay that calls it and the
        event append (The Business Layer: Operations Without a Principal): it
        takes no context. The item is built from `row.payload`, signed by `row.actor_id`,
        names `row.request_id` and `row.traceparent` as its cause, and presents `row.id`
        as its `idempotency_key`, so a relay that runs twice and a caller that retries
        meet one insert. Publishes `Topics.WORK_AVAILABLE` as `enqueue` does. Raises
        `Invalid` for an unknown kind, a refused payload, or `org_id` differing from
        `row.org_id`.
        """

    @abstractmethod
    async def schedule_states(self, ctx: OpContext) -> list[ScheduleState]:
        """`ctx`'s tenant's schedule-state rows (`ScheduleState`: the latest handled tick and
        the one after it), by schedule name (`<worker>:<name>`)."""

    async def schedule_ticks(self, ctx: OpContext) -> dict[str, datetime]:
        """`ctx`'s tenant's schedules' latest handled ticks (aware UTC), by schedule: the
        `tick_at` of `schedule_states`."""
        return {state.schedule: state.tick_at for state in await self.schedule_states(ctx)}

    @abstractmethod
    async def enqueue_tick(
        self,
        ctx: OpContext,
        schedule: str,
        *,
        previous: datetime | None,
        tick: datetime,
        item: WorkItem | None,
        next_tick: datetime | None = None,
    ) -> bool:
        """Advance `schedule`'s state row from `previous` to `tick` (recording `next_tick`,
        the tick after it) and enqueue `item` (None: the tick is skipped) in one
        transaction; True when this call advanced it, False when another process did first
        (nothing written). `item` is validated and stamped as `enqueue` does, and raises
        what it raises (docs/decisions/0034).
        """

    async def publish_owed_wake_ups(self) -> None:
        """Return once every `Topics.WORK_AVAILABLE` owed by this manager's enqueues so far
        is published (or its publish failed and was logged). The enqueue does not wait for
        its publish; a process that enqueues and then stops (a script, a job) awaits this
        before it closes its `Infra`, or its last wake-up may be lost (a worker then finds
        the item at its next poll). Nothing to wait for by default."""
        return None

    def wake_ups(self) -> WakeUps | None:
        """The storage's own wake-ups (`WorkStorageInterface.wake_ups`), or None.

        A worker listens to them beside `Topics.WORK_AVAILABLE`: on PostgreSQL they come
        from the insert's own transaction, with or without Redis.
        """
        return None

    @abstractmethod
    async def claim(
        self,
        rctx: RequestContext,
        lane: str,
        kinds: Sequence[WorkKind],
        worker_id: str,
        lease: float,
    ) -> tuple[OpContext, WorkItem] | None:
        """Claim the next due item of `kinds` on `lane` for `lease` seconds; None if none.

        Returns the `OpContext` the work runs under, built by the tenancy manager for the
        item's tenant, acting for the enqueuer (`created_by`) in the service role, and
        naming the item's `request_id` as its cause; and the item, its claim token on it.
        `rctx` is the loop's own context for this claim (`AppType.WORKER`).
        """

    @abstractmethod
    async def claim_many(
        self,
        rctx: RequestContext,
        lane: str,
        kinds: Sequence[WorkKind],
        worker_id: str,
        *,
        lease: float,
        limit: int,
    ) -> list[tuple[OpContext, WorkItem]]:
        """`claim` for up to `limit` items (the worker's free slots) in one statement.

        An item whose tenant is gone is failed as a dead letter and left out. So is a row
        the worker cannot read (a column the model refuses): the claim fails it for good
        in its own transaction, fenced on the token it gave it, with `last_error`
        `unreadable row: <column>: <reason>`; it is counted as a dead letter with the
        reason `unreadable`, logged, and its audit entry is written by the tenant's next
        sweep (`audit_dead_letters`). The other items of the claim are returned as usual.
        """

    @abstractmethod
    async def complete(self, ctx: OpContext, item: WorkItem) -> WorkItem:
        """Mark the claimed `item` completed. Raises `Conflict` on a stale claim token."""

    @abstractmethod
    async def complete_many(self, held: Sequence[tuple[OpContext, WorkItem]]) -> Completed:
        """`complete` for many claimed items at once, of any tenants: one conditional
        statement (docs/decisions/0054).

        Each item is completed only under its own claim token with its lease not passed,
        exactly as `complete` fences it. Returns the ids completed; an item left out was
        cancelled while held (in `Completed.cancelled`, read back only when some are left
        out) or lost its claim (counted as a fencing conflict), and its row stays as it
        stood.
        """

    @abstractmethod
    async def fail(self, ctx: OpContext, item: WorkItem, error: str) -> WorkItem:
        """Record a failed try: requeue after `rules.retry_delay`, or dead-letter.

        `error` is kept as `last_error`, a NUL character in it replaced by U+FFFD
        (`rules.storable_text`).

        At `max_attempts` the failure is final: the row becomes `FAILED` (owing its audit
        entry, in the same statement), the dead-letter counter counts it, and an
        `AuditEntry` names it. When that entry cannot be written now, the failure still
        stands and is returned: the entry stays owed and the sweep writes it
        (`audit_dead_letters`). Raises `Conflict` on a stale claim token (the row stays as
        the current holder left it).
        """

    @abstractmethod
    async def fail_permanently(self, ctx: OpContext, item: WorkItem, reason: str) -> WorkItem:
        """Make the claimed `item` a dead letter at once, whatever attempts it has left: the
        handler's verdict that it can never succeed (`PermanentFailure`).

        `reason` becomes `last_error` (a NUL replaced as `fail` does), the dead letter is
        counted with the reason `handler` and audited (`work.dead_lettered`, its detail's
        `reason` `handler`, now or by the sweep as `fail` does). Raises `ItemCancelled` or
        `Conflict` on a stale claim token.
        """

    @abstractmethod
    async def defer(
        self, ctx: OpContext, item: WorkItem, delay: float, *, note: str = "deferred"
    ) -> WorkItem:
        """Hand the item back, due again in `delay` seconds, giving its attempt back (a
        handler's `Snooze`, with `note` `snoozed`; else `deferred`).

        Raises `Conflict` on a stale claim token.
        """

    @abstractmethod
    async def release(self, ctx: OpContext, item: WorkItem, note: str | None = None) -> WorkItem:
        """Hand the item back at once, giving its attempt back; `note` says why.

        Raises `Conflict` on a stale claim token.
        """

    @abstractmethod
    async def extend_lease(self, ctx: OpContext, item: WorkItem, lease: float) -> WorkItem:
        """Renew the holder's lease to `lease` seconds from now (database clock).

        Raises `Conflict` when the claim token no longer matches or the lease passed:
        the holder must stop, since another worker may hold the item now.
        """

    @abstractmethod
    async def requeue_stale(self, ctx: OpContext, *, limit: int = 100) -> int:
        """Hand back `ctx`'s tenant's items whose lease passed; at most `limit`; how many.

        One conditional statement in storage; an item out of attempts becomes a dead
        letter (counted, and audited now or by `audit_dead_letters`) instead of running
        again (oban-bg/oban#137).
        """

    @abstractmethod
    async def audit_dead_letters(self, ctx: OpContext, *, limit: int = 100) -> int:
        """Write the audit entries `ctx`'s tenant's dead letters still owe; how many.

        A dead letter owes its `work.dead_lettered` entry from the statement that failed
        its row until the entry is written; an entry written late is the same entry, under
        the same idempotency key (`<item id>:dead_lettered:<claim token>`), so this step,
        run by any number of sweepers at once and racing the original write, records each
        entry once. At most `limit` per call, oldest first. Raises what the audit manager
        raises (the rest stay owed); `Invalid` for a `limit` below 1.
        """

    @abstractmethod
    async def maintenance_contexts(self, rctx: RequestContext) -> list[OpContext]:
        """One service context per live tenant for one sweep pass under `rctx`.

        Each is minted for the tenant, not for a member: the service role and the system
        user `EMPTY_UUID`, so a tenant whose members have all left is still swept.
        """

    @abstractmethod
    async def list_items(
        self,
        ctx: OpContext,
        *,
        status: WorkStatus | None = None,
        kind: WorkKind | None = None,
        lane: str | None = None,
        after: tuple[datetime, UUID] | None = None,
        limit: int = 50,
    ) -> WorkRows:
        """The tenant's live items, newest first, at most `limit` (operator view); `after`
        is the `(created_at, id)` of the previous page's last row (keyset pagination).

        A row the worker cannot read is not among them: it is in `unreadable` of the
        result (`UnreadableRow`: its id, the column refused and why).
        """

    @abstractmethod
    async def get(self, ctx: OpContext, item_id: UUID) -> WorkItem:
        """The tenant's item `item_id`. Raises `NotFound` (also for another tenant's), and
        `UnreadableItem` (its `row` holds the stored columns) for a row that cannot be read."""

    @abstractmethod
    async def replay(
        self,
        ctx: OpContext,
        item_id: UUID,
        *,
        operator: str | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> WorkItem:
        """Make a dead letter available again with its attempts reset; audited.

        `operator` (the person who asked, from the command line) goes into the audit
        entry's `detail` as `"operator"`; the entry's actor stays `ctx.user_id`. A dead
        letter whose own audit entry is still owed gets it first.

        `payload` replays it corrected: validated against the payload model of the item's
        kind (`WORK_PAYLOADS`) before anything is written, it replaces the stored payload,
        and the entry's `detail` holds both, `"old_payload"` and `"payload"` (a row whose
        stored payload cannot be read keeps it as stored there).

        Raises `NotFound` for no such item, `Conflict` when it is not a live failed item,
        `Invalid` naming the field of a refused `payload` (nothing written),
        `UnreadableItem` (nothing changed) for a row that cannot be read, unless a corrected
        `payload` replaces what made it unreadable.
        """

    @abstractmethod
    async def cancel_item(
        self, ctx: OpContext, item_id: UUID, *, operator: str | None = None
    ) -> WorkItem:
        """Cancel a waiting or claimed item for good; audited (`work.cancelled`, with
        `operator` as `replay` records it, and the status it was cancelled from).

        An `AVAILABLE` item is never claimed after this returns. A `CLAIMED` one keeps its
        holder's token: the holder's next write is refused (`ItemCancelled`), and it hears
        of the cancel at once over the wake-up channels (`(lane, cancel:<id>)`, PostgreSQL
        NOTIFY in the cancel's transaction and `Topics.WORK_AVAILABLE` after it), else at
        its next lease renewal, and cancels its handler. What the handler did before that
        stays done (the template's docs/guarantees.md, "Cancelling an item").

        Raises `NotFound` for no such item, `Conflict` (one line, the status) for one that
        is finished or discarded, `UnreadableItem` (nothing changed) for a row that cannot
        be read.
        """

    @abstractmethod
    async def discard(
        self, ctx: OpContext, item_id: UUID, *, operator: str | None = None
    ) -> WorkItem:
        """Soft-delete a dead letter; audited, with `operator` as `replay` records it.

        Raises `NotFound` for no such item, `Conflict` when it is not a live failed item,
        `UnreadableItem` (nothing changed) for a row that cannot be read.
        """

    @abstractmethod
    async def move_lane(
        self,
        ctx: OpContext,
        *,
        from_lane: str,
        to_lane: str,
        kind: str | None = None,
        operator: str | None = None,
        also_known: Collection[str] = (),
    ) -> list[tuple[UUID, str]]:
        """Move the tenant's waiting (`AVAILABLE`) items of `from_lane`, of `kind` when given,
        to `to_lane` in one conditional statement; `(id, kind)` of each moved. Each gets a
        `work.lane_moved` audit entry (`operator` in its detail) and `to_lane`'s workers are
        woken. Raises `Invalid` for a lane no worker can name, a `to_lane` where the items
        would be stranded (of `kind`: neither its policy's lane nor one a worker alive claims
        it on; of every kind: not in `known_lanes(also_known)`, as a pause), or
        `from_lane == to_lane`.
        """

    @abstractmethod
    async def discard_unknown_kind(
        self, ctx: OpContext, item_id: UUID, *, operator: str | None = None
    ) -> UnreadableRow:
        """Soft-delete a row whose kind no `WorkKind` names, whatever its status but
        `CLAIMED`; audited (`work.discarded`, with `operator`). Raises `NotFound` for no such
        item, `Conflict` for a row of a known kind, a claimed one or one discarded already.
        """

    @abstractmethod
    async def purge_deleted(self, ctx: OpContext, *, older_than: float) -> int:
        """Delete the tenant's items soft-deleted more than `older_than` seconds ago."""

    @abstractmethod
    async def purge_completed(self, ctx: OpContext, *, older_than: float, limit: int = 1000) -> int:
        """Delete the tenant's items completed more than `older_than` seconds ago; how many.

        The age is measured on the database clock; at most `limit` items go per call,
        oldest first. Dead letters (`FAILED`) and items not yet done are never purged.
        Raises `Invalid` for a negative `older_than` or a `limit` below 1.
        """

    @abstractmethod
    async def purge_cancelled(self, ctx: OpContext, *, older_than: float, limit: int = 1000) -> int:
        """Delete the tenant's items cancelled more than `older_than` seconds ago (the
        database clock), at most `limit`, oldest first; how many. Raises `Invalid` for a
        negative `older_than` or a `limit` below 1."""

    @abstractmethod
    async def lane_stats(self, ctx: OpContext) -> list[LaneStats]:
        """`queue_stats`' counts for `ctx`'s tenant alone, without touching the gauges; under
        the system scope (`EMPTY_UUID`, a platform operator's context) for every tenant."""

    @abstractmethod
    async def recent_outcomes(
        self, ctx: OpContext, *, window_s: float = 3600.0, buckets: int = 12
    ) -> list[tuple[int, int]]:
        """`ctx`'s tenant's `(completed, dead_lettered)` per slice of the last `window_s`
        seconds, oldest first (`WorkStorageInterface.recent_outcomes`). Raises `Invalid`
        for a window outside (0, 86400] or `buckets` outside 1-120."""

    @abstractmethod
    async def queue_stats(self, rctx: RequestContext) -> list[LaneStats]:
        """Counts per lane, kind and status of the rows in play across every tenant (system
        scope): available, claimed, and dead letters still owing their audit entry
        (`WorkStorageInterface.queue_stats`; completed rows and audited dead letters are
        history and are not read).

        Each `AVAILABLE` group also carries `oldest_available_age` (seconds, on the
        database clock); each group its `audit_owed`. Sets the gauges
        `work_dead_letters_unaudited{kind}`, `work_lane_paused{lane}` and, on PostgreSQL,
        the oldest snapshot's (`WorkStorageInterface.oldest_snapshot`).
        """

    @abstractmethod
    async def pause_lane(
        self,
        rctx: RequestContext,
        lane: str,
        *,
        actor: str,
        reason: str | None = None,
        also_known: Collection[str] = (),
    ) -> LanePause:
        """Pause `lane` for every tenant: no claim takes its items until `resume_lane`.

        In-flight items finish, enqueues go on, `/healthz` is not touched (a pause is no
        fault). `actor` (who asked) and `reason` are stored on the pause and written, with
        the lane, into a `work.lane_paused` audit entry in every live tenant (every tenant's
        items stop). A lane is known when the kinds module names it (`WORK_POLICIES`, every
        kind's lane) or it is in `also_known` (a worker's own `LANE` setting).

        Raises `Invalid` for a lane that is not known (naming the known ones), an empty
        `actor`, `Conflict` when the lane is paused already (naming who paused it, when).
        """

    @abstractmethod
    async def resume_lane(
        self, rctx: RequestContext, lane: str, *, actor: str, reason: str | None = None
    ) -> LanePause:
        """Resume the paused `lane`; the pause lifted. Its workers are woken, and a
        `work.lane_resumed` entry (`actor`, `reason`, the pause lifted) is written in every
        live tenant. Raises `Conflict` when `lane` is not paused, naming the paused lanes;
        `Invalid` for an empty `actor`."""

    @abstractmethod
    async def paused_lanes(self, rctx: RequestContext) -> list[LanePause]:
        """The paused lanes, by name (read in the system scope)."""

    @abstractmethod
    async def queue_summary(self, rctx: RequestContext) -> QueueSummary:
        """The queue at a glance, across every tenant (`QueueSummary`): counts per lane,
        kind and status of the rows in play with each lane's oldest due age, the paused
        lanes, the workers alive (the roster's unexpired rows, each with the items it holds)
        and the workers holding items under a live lease. Reads no history."""

    @abstractmethod
    async def beat_worker(
        self,
        rctx: RequestContext,
        worker_id: str,
        *,
        worker: str,
        lane: str,
        kinds: Sequence[WorkKind],
        ttl_s: float,
    ) -> None:
        """Record a heartbeat of the worker process `worker_id` (`worker` its name, claiming
        `kinds` on `lane`) in the worker roster, alive for `ttl_s` seconds from now on the
        database clock (docs/decisions/0049); one statement, in the system scope. Raises
        `Invalid` for an empty `worker_id` or `worker`, or a `ttl_s` that is not above 0."""

    @abstractmethod
    async def workers_alive(self, rctx: RequestContext) -> list[WorkerBeat]:
        """The worker roster's unexpired rows (`WorkerBeat`: each process's lane and kinds),
        read in the system scope; what `queue_summary` lists without the items held."""

    @abstractmethod
    async def drop_worker(self, rctx: RequestContext, worker_id: str) -> bool:
        """Take `worker_id` off the worker roster (its drain); whether it was on it."""

    @abstractmethod
    async def prune_workers(self, rctx: RequestContext, *, expired_for_s: float) -> int:
        """Delete the roster rows of workers expired more than `expired_for_s` seconds ago
        (gone without a drain: killed, or their host lost); how many. Raises `Invalid` for a
        negative `expired_for_s`."""
