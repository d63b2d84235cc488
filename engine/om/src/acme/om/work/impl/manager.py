"""The work manager."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast
from uuid import UUID, uuid4

from pydantic import BaseModel, ValidationError

from acme.infra.topics import TopicsInterface
from acme.om.audit import AuditManagerInterface
from acme.om.context import OpContext, RequestContext
from acme.om.errors import Conflict, Invalid
from acme.om.outbox import OutboxRow
from acme.om.tenancy import TenancyManagerInterface
from acme.om.types import EMPTY_UUID
from acme.om.work.impl.answers import (
    ASKS_AT_ONCE,
    CONTEXT_REUSE_S,
    ContextKey,
    TenancyAnswers,
    context_key,
)
from acme.om.work.impl.dead_letters import DeadLetterAudits, owed_audit
from acme.om.work.impl.operator_commands import OperatorCommands
from acme.om.work.impl.wake_publisher import WAKE_UP_COALESCE_S, WakeUpPublisher
from acme.om.work.manager import Completed
from acme.om.work.metrics import WorkMetrics, default_metrics
from acme.om.work.rules import (
    field_path,
    handed_back_attempts,
    is_exhausted,
    refuse_bad_lane,
    refuse_long_key,
    refuse_nul,
    retry_delay,
    storable_text,
)
from acme.om.work.storage import NewItems, WakeUps, WorkStorageInterface
from acme.om.work.types.schedules import ScheduleState
from acme.om.work.types.work_item import (
    WORK_PAYLOADS,
    WORK_POLICIES,
    ItemCancelled,
    UnreadableRow,
    WorkItem,
    WorkKind,
    WorkStatus,
    checked_delay,
    checked_priority,
)

logger = logging.getLogger(__name__)

WORK_ROW_PREFIX = "work."
"""The outbox kind family the relay hands to `enqueue_relayed`: `work.<KIND>`."""

_JSON_NUL = "\\u0000"
"""How JSON text writes a NUL character (`json.dumps` and pydantic alike)."""

# Every claim field, cleared whenever an item leaves a holder's hands.
_UNCLAIMED: dict[str, Any] = {
    "claimed_by": None,
    "claim_token": None,
    "claimed_at": None,
    "lease_expires_at": None,
}


class WorkManagerImpl(OperatorCommands):
    """`WorkManagerInterface` over a `WorkStorageInterface`.

    `tenancy` builds the context a claimed item runs under; `audit` records dead letters
    and operator actions; `topics` carries the `WORK_AVAILABLE` wake-up; `metrics`
    defaults to the process-wide counters. Every write after the enqueue signs
    `updated_by` with `EMPTY_UUID`: the context attributes the work, not the row's
    bookkeeping.

    Its parts: `TenancyAnswers`, `WakeUpPublisher`, `DeadLetterAudits` (an entry a stop
    left owed is written once by the sweep's `audit_dead_letters`), `OperatorCommands`.
    """

    def __init__(
        self,
        storage: WorkStorageInterface,
        *,
        tenancy: TenancyManagerInterface,
        audit: AuditManagerInterface,
        topics: TopicsInterface,
        metrics: WorkMetrics | None = None,
        context_reuse_s: float = CONTEXT_REUSE_S,
        wake_up_coalesce_s: float = WAKE_UP_COALESCE_S,
    ) -> None:
        self._storage = storage
        self._tenancy = tenancy
        self._audit = audit
        self._metrics = metrics or default_metrics()
        self._answers = TenancyAnswers(tenancy, reuse_s=context_reuse_s)
        self._wake_ups = WakeUpPublisher(topics, coalesce_s=wake_up_coalesce_s)
        self._dead_letters = DeadLetterAudits(storage, audit, self._metrics)
        self._unaudited_kinds: set[str] = set()
        self._snapshot_seen: tuple[str, float] | None = None
        self._paused_gauged: set[str] = set()  # the lanes `work_lane_paused` was set for

    # -- enqueue -------------------------------------------------------------------------

    async def enqueue(self, ctx: OpContext, item: WorkItem) -> WorkItem:
        (enqueued,) = await self.enqueue_many(ctx, [item])
        return enqueued

    async def enqueue_many(self, ctx: OpContext, items: Sequence[WorkItem]) -> list[WorkItem]:
        copies = [
            self._stamped(
                item,
                org_id=ctx.org_id,
                actor=ctx.user_id,
                request_id=ctx.request.request_id,
                traceparent=ctx.request.traceparent,
            )
            for item in items
        ]
        return await self._insert(ctx.org_id, copies)

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
        try:
            kind = WorkKind(kind)  # the kind's name as text names it too
        except ValueError:
            raise Invalid(f"kind: {kind!r:.80} names no work kind") from None
        model = WORK_PAYLOADS.get(kind)
        if model is None:
            raise Invalid(f"kind: no payload model for work kind {kind!s}")
        _refuse_system_scope(ctx.org_id)
        policy = WORK_POLICIES[kind]
        lane = lane or policy.lane
        refuse_bad_lane(lane)
        now = datetime.now(UTC)
        delay_s = checked_delay(delay, now)
        priority = checked_priority(policy.priority if priority is None else priority)
        texts: list[str] = []
        for n, payload in enumerate(payloads):
            # A model is validated in its JSON form, as `enqueue` validates it: an instance
            # built without validation (`model_construct`), changed since, or of a subclass
            # with fields of its own is refused here as it is there. The dump skips the
            # serializer's warnings: the validation names the field a wrong value is in.
            body = (
                payload.model_dump(mode="json", warnings=False)
                if isinstance(payload, BaseModel)
                else payload
            )
            try:
                text = model.model_validate(body).model_dump_json()
            except ValidationError as exc:
                first = exc.errors()[0]
                where = field_path(("payloads", n, *first["loc"]))
                raise Invalid(f"{where}: {first['msg']}") from exc
            if _JSON_NUL in text:  # JSON writes a NUL character as this escape, and only so
                refuse_nul(json.loads(text), f"payloads.{n}", self._storage.backend)
            texts.append(text)
        if not texts:
            return []
        traceparent = ctx.request.traceparent
        batch = NewItems(
            kind=kind,
            lane=lane,
            max_attempts=policy.max_attempts,
            delay=delay_s,
            priority=priority,
            created_at=now,
            actor=ctx.user_id,
            request_id=ctx.request.request_id,
            traceparent=None if traceparent is None else storable_text(traceparent),
            ids=[uuid4() for _ in texts],
            payloads=texts,
        )
        inserted = await self._storage.create_new(ctx.org_id, batch)
        if len(inserted) != len(batch.ids):
            # Fresh ids never meet a stored row; one that did was not this call's to write.
            taken = next(i for i in batch.ids if i not in inserted)
            raise Conflict(f"id: work item {taken} is taken; the others were enqueued")
        self._metrics.enqueued.labels(kind=kind.value).inc(len(texts))
        self._wake_ups.owe([(batch.lane, kind.value)])
        return batch.ids

    async def enqueue_relayed(self, org_id: UUID, row: OutboxRow) -> WorkItem:
        if org_id != row.org_id:
            raise Invalid(f"org_id: {org_id} is not the outbox row's tenant {row.org_id}")
        kind = _relayed_kind(row.kind)
        now = datetime.now(UTC)
        item = WorkItem(
            id=uuid4(),
            org_id=org_id,
            kind=kind,
            lane=WORK_POLICIES[kind].lane,
            payload=row.payload,
            max_attempts=WORK_POLICIES[kind].max_attempts,
            available_at=now,
            idempotency_key=str(row.id),
            priority=WORK_POLICIES[kind].priority,
            created_at=now,
            updated_at=now,
            created_by=row.actor_id,
            updated_by=row.actor_id,
        )
        copy = self._stamped(
            item,
            org_id=org_id,
            actor=row.actor_id,
            request_id=row.request_id,
            traceparent=row.traceparent,
        )
        (enqueued,) = await self._insert(org_id, [copy])
        return enqueued

    def _stamped(
        self,
        item: WorkItem,
        *,
        org_id: UUID,
        actor: UUID,
        request_id: UUID | None,
        traceparent: str | None,
    ) -> WorkItem:
        """The manager's copy: validated payload, stamped actor, status and attempts."""
        if item.org_id != org_id:
            raise Invalid(f"org_id: the item names tenant {item.org_id}, the context {org_id}")
        _refuse_system_scope(org_id)
        model = WORK_PAYLOADS.get(item.kind)
        if model is None:
            raise Invalid(f"kind: no payload model for work kind {item.kind!s}")
        refuse_bad_lane(item.lane)
        checked_priority(item.priority)
        try:
            payload = model.model_validate(item.payload).model_dump(mode="json")
        except ValidationError as exc:
            first = exc.errors()[0]
            raise Invalid(f"{field_path(('payload', *first['loc']))}: {first['msg']}") from exc
        refuse_nul(payload, "payload", self._storage.backend)
        refuse_nul(item.idempotency_key, "idempotency_key", self._storage.backend)
        refuse_long_key(item.idempotency_key)
        return item.model_copy(
            update={
                **_UNCLAIMED,
                "payload": payload,
                "status": WorkStatus.AVAILABLE,
                "attempts": 0,
                "created_by": actor,
                "updated_by": actor,
                "request_id": request_id,
                "traceparent": None if traceparent is None else storable_text(traceparent),
                "last_error": None,
                "note": None,
                "completed_at": None,
                "deleted_at": None,
            }
        )

    async def _insert(self, org_id: UUID, items: Sequence[WorkItem]) -> list[WorkItem]:
        """Insert-or-report (the storage returns each row as stored), count, and publish
        the wake-ups (`WakeUpPublisher.owe`). Raises `Conflict` for an id another tenant
        holds, or an idempotency key an item of another kind holds (a key is the tenant's,
        whatever the kind: answering with the other kind's item would drop this one)."""
        if not items:
            return []
        results = await self._storage.create_items(org_id, items)
        for item, result in zip(items, results, strict=True):
            held = result.row
            if not result.created and held is not None and held.kind is not item.kind:
                others = "; the others were enqueued" if len(items) > 1 else ""
                raise Conflict(
                    f"idempotency_key: {item.idempotency_key!r:.80} is item {held.id} of kind "
                    f"{held.kind.value}, not {item.kind.value}: give each kind keys of its "
                    f"own{others}"
                )
        created: dict[str, int] = {}  # counted per kind, not per item: a batch is one call
        for item, result in zip(items, results, strict=True):
            if result.created:
                created[item.kind.value] = created.get(item.kind.value, 0) + 1
        for kind, count in created.items():
            self._metrics.enqueued.labels(kind=kind).inc(count)
        enqueued: list[WorkItem] = []
        for result in results:
            if result.row is None:
                raise Conflict(f"id: work item {result.id} is taken outside this tenant")
            enqueued.append(result.row)
        self._wake_ups.owe(
            (r.lane, r.kind.value) for r in enqueued if r.status is WorkStatus.AVAILABLE
        )
        return enqueued

    async def schedule_states(self, ctx: OpContext) -> list[ScheduleState]:
        return await self._storage.schedule_states(ctx.org_id)

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
        copy = (
            None
            if item is None
            else self._stamped(
                item,
                org_id=ctx.org_id,
                actor=ctx.user_id,
                request_id=ctx.request.request_id,
                traceparent=ctx.request.traceparent,
            )
        )
        advanced = await self._storage.advance_schedule(
            ctx.org_id, schedule, previous=previous, tick=tick, item=copy, next_tick=next_tick
        )
        if advanced and copy is not None:
            self._metrics.enqueued.labels(kind=copy.kind.value).inc()
            self._wake_ups.owe([(copy.lane, copy.kind.value)])
        return advanced

    async def publish_owed_wake_ups(self) -> None:
        """See `WorkManagerInterface.publish_owed_wake_ups`."""
        await self._wake_ups.published()

    # -- claim ---------------------------------------------------------------------------

    def wake_ups(self) -> WakeUps | None:
        return self._storage.wake_ups()

    async def claim(
        self,
        rctx: RequestContext,
        lane: str,
        kinds: Sequence[WorkKind],
        worker_id: str,
        lease: float,
    ) -> tuple[OpContext, WorkItem] | None:
        claimed = await self.claim_many(rctx, lane, kinds, worker_id, lease=lease, limit=1)
        return claimed[0] if claimed else None

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
        """See `WorkManagerInterface.claim_many`.

        One tenancy ask per distinct `ContextKey` in the batch, not per item, the keys asked
        at the same time, an answer that the tenant is live reused for `context_reuse_s`
        under the batch's own request `rctx`, and a key the lane's last two batches shared
        asked beside the claim (`TenancyAnswers`; docs/decisions/0016, 0022). A batch whose
        rows were not all handed out (a gone tenant's item or an unreadable row, each
        dead-lettered) is followed by another claim for the slots they left, until they are
        filled or the lane has no more due rows: a backlog of dead letters never passes for
        an empty lane.
        """
        if lease <= 0:
            raise Invalid(f"lease: must be a positive number of seconds, got {lease}")
        claimed: list[tuple[OpContext, WorkItem]] = []
        while len(claimed) < limit:
            wanted = limit - len(claimed)
            try:
                pairs, rows = await self._claim_batch(rctx, lane, kinds, worker_id, lease, wanted)
            except Exception:
                if not claimed:
                    raise
                # Pairs already handed out are held under their leases: return them rather
                # than leave them claimed by nobody; the next claim meets the failure again.
                logger.warning("a claim after dead letters failed", exc_info=True)
                break
            claimed.extend(pairs)
            if rows < wanted or len(pairs) == rows:
                break  # the lane had no more due rows, or every row was handed out
        return claimed

    async def _claim_batch(
        self,
        rctx: RequestContext,
        lane: str,
        kinds: Sequence[WorkKind],
        worker_id: str,
        lease: float,
        limit: int,
    ) -> tuple[list[tuple[OpContext, WorkItem]], int]:
        """One claim of up to `limit` rows (`claim_many`): the pairs handed out, and how many
        rows the claim took (dead letters included)."""
        claimed: list[tuple[OpContext, WorkItem]] = []
        asked: dict[ContextKey, OpContext | None] = {}
        self._answers.forget_expired()
        expected = self._answers.expected(lane)
        early: asyncio.Task[OpContext | None] | None = None
        if expected is not None and self._answers.reusable(expected, rctx) is None:
            early = asyncio.create_task(self._answers.ask(rctx, expected))
            early.add_done_callback(_retrieve)
        try:
            items = await self._storage.claim_next(lane, kinds, worker_id, lease, limit=limit)
        except BaseException:
            if early is not None:
                early.cancel()
            raise
        if early is not None and expected is not None:
            try:
                asked[expected] = await early
            except Exception:  # asked again below, where a failure hands the batch back
                logger.debug("the early tenancy ask failed; asking after the claim")
        if items:
            self._answers.expect(lane, items)
        for unreadable in items.unreadable:
            self._dead_letter_unreadable(unreadable)
        for key in map(context_key, items):
            if key not in asked and (reused := self._answers.reusable(key, rctx)) is not None:
                asked[key] = reused
        unasked = list(dict.fromkeys(k for k in map(context_key, items) if k not in asked))
        answers = await self._answers.ask_all(rctx, unasked, parallel=min(limit, ASKS_AT_ONCE))
        failed = next((a for a in answers if isinstance(a, BaseException)), None)
        if failed is not None:
            # The claim has committed: hand the whole batch back at once, attempts given
            # back, rather than leave it claimed by nobody until the leases pass.
            await self._hand_back(items)
            raise failed
        asked.update(zip(unasked, cast(list[OpContext | None], answers), strict=True))
        for item in items:
            self._metrics.claimed.labels(kind=item.kind.value).inc()
            ctx = asked[context_key(item)]
            if ctx is None:
                await self._drop_orphan(item)
                continue
            claimed.append((ctx, item))
        return claimed, len(items) + len(items.unreadable)

    async def _hand_back(self, items: Sequence[WorkItem]) -> None:
        """Release `items` under their claim tokens after a claim that cannot go on; what
        cannot be released now (the database is down) the sweep returns after its lease."""
        for item in items:
            back = item.model_copy(
                update={
                    **_UNCLAIMED,
                    "status": WorkStatus.AVAILABLE,
                    "attempts": handed_back_attempts(item.attempts),
                    "note": "handed back: the claim's context could not be built",
                    "updated_by": EMPTY_UUID,
                }
            )
            try:
                await self._storage.write_item(item.org_id, back, _token(item), available_in=0.0)
            except Exception:
                logger.exception("work item %s could not be handed back", item.id)

    def _dead_letter_unreadable(self, row: UnreadableRow) -> None:
        """Count and log a claimed row the storage could not read and failed for good in
        the claim's transaction; its audit entry is owed, and the tenant's next sweep
        writes it (the claim builds no context for work it does not run)."""
        self._metrics.dead_letters.labels(kind=row.kind, reason="unreadable").inc()
        logger.error(
            "work item %s (tenant %s) dead-lettered: its row cannot be read (%s); the other "
            "items of the claim go on",
            row.id,
            row.org_id,
            row.problem,
        )

    async def _drop_orphan(self, item: WorkItem) -> None:
        """Dead-letter a claimed item whose tenant is gone: no context can run it."""
        token = _token(item)
        failed = item.model_copy(
            update={
                **_UNCLAIMED,
                "status": WorkStatus.FAILED,
                "last_error": "tenant is gone",
                "updated_by": EMPTY_UUID,
            }
        )
        await self._storage.write_item(item.org_id, failed, token)
        self._metrics.dead_letters.labels(kind=item.kind.value, reason="tenant").inc()
        logger.warning("work item %s dead-lettered: tenant %s is gone", item.id, item.org_id)

    # -- a holder's writes (each fenced on the claim token) -------------------------------

    async def complete(self, ctx: OpContext, item: WorkItem) -> WorkItem:
        done = item.model_copy(
            update={**_UNCLAIMED, "status": WorkStatus.COMPLETED, "updated_by": EMPTY_UUID}
        )
        written = await self._write(ctx, item, done, operation="complete")
        self._metrics.completed.labels(kind=item.kind.value).inc()
        return written

    async def complete_many(self, held: Sequence[tuple[OpContext, WorkItem]]) -> Completed:
        for ctx, item in held:
            if item.org_id != ctx.org_id:
                raise Invalid(f"org_id: item {item.id} is not of the context's tenant")
        items = [item for _, item in held]
        completed = await self._storage.complete_items(
            [(item.org_id, item.id, _token(item)) for item in items]
        )
        done = Completed(completed)
        refused: dict[UUID, list[tuple[UUID, UUID]]] = {}
        for item in items:
            if item.id not in completed:
                refused.setdefault(item.org_id, []).append((item.id, _token(item)))
        for org_id, claims in refused.items():
            done.cancelled |= await self._cancelled_under(org_id, claims)
        for item in items:
            if item.id in completed:
                self._metrics.completed.labels(kind=item.kind.value).inc()
            elif item.id not in done.cancelled:
                self._metrics.fencing_conflicts.labels(operation="complete").inc()
        return done

    async def _cancelled_under(
        self, org_id: UUID, claims: Sequence[tuple[UUID, UUID]]
    ) -> set[UUID]:
        """The ids among `claims` (`(item id, claim token)`) whose row is `CANCELLED` under
        that very token: read back only after a completion left them out."""
        tokens = dict(claims)
        rows = await self._storage.read_items(org_id, list(tokens))
        return {
            row.id
            for row in rows
            if row.status is WorkStatus.CANCELLED and row.claim_token == tokens[row.id]
        }

    async def fail(self, ctx: OpContext, item: WorkItem, error: str) -> WorkItem:
        error = storable_text(error)
        if is_exhausted(item.attempts, item.max_attempts):
            dead = item.model_copy(
                update={
                    **_UNCLAIMED,
                    "status": WorkStatus.FAILED,
                    "last_error": error,
                    "updated_by": EMPTY_UUID,
                }
            )
            written = await self._write(ctx, item, dead, operation="fail", dead_letter="attempts")
            await self._dead_letters.dead_letter(ctx, owed_audit(written, _token(item), "attempts"))
            return written
        again = item.model_copy(
            update={
                **_UNCLAIMED,
                "status": WorkStatus.AVAILABLE,
                "last_error": error,
                "note": "retrying after a failure",
                "updated_by": EMPTY_UUID,
            }
        )
        written = await self._write(
            ctx, item, again, operation="fail", available_in=retry_delay(item.attempts)
        )
        self._metrics.retried.labels(kind=item.kind.value).inc()
        return written

    async def fail_permanently(self, ctx: OpContext, item: WorkItem, reason: str) -> WorkItem:
        dead = item.model_copy(
            update={
                **_UNCLAIMED,
                "status": WorkStatus.FAILED,
                "last_error": storable_text(reason),
                "note": "failed permanently by its handler",
                "updated_by": EMPTY_UUID,
            }
        )
        written = await self._write(ctx, item, dead, operation="fail", dead_letter="handler")
        await self._dead_letters.dead_letter(ctx, owed_audit(written, _token(item), "handler"))
        return written

    async def defer(
        self, ctx: OpContext, item: WorkItem, delay: float, *, note: str = "deferred"
    ) -> WorkItem:
        if delay < 0:
            raise Invalid(f"delay: must not be negative, got {delay}")
        later = item.model_copy(
            update={
                **_UNCLAIMED,
                "status": WorkStatus.AVAILABLE,
                "attempts": handed_back_attempts(item.attempts),
                "note": note,
                "updated_by": EMPTY_UUID,
            }
        )
        return await self._write(ctx, item, later, operation="defer", available_in=delay)

    async def release(self, ctx: OpContext, item: WorkItem, note: str | None = None) -> WorkItem:
        back = item.model_copy(
            update={
                **_UNCLAIMED,
                "status": WorkStatus.AVAILABLE,
                "attempts": handed_back_attempts(item.attempts),
                "note": storable_text(note) if note else "released",
                "updated_by": EMPTY_UUID,
            }
        )
        released = await self._write(ctx, item, back, operation="release", available_in=0.0)
        self._wake_ups.owe([(released.lane, released.kind.value)])  # due at once, as a replay is
        return released

    async def extend_lease(self, ctx: OpContext, item: WorkItem, lease: float) -> WorkItem:
        if lease <= 0:
            raise Invalid(f"lease: must be a positive number of seconds, got {lease}")
        renewed = item.model_copy(update={"updated_by": EMPTY_UUID})
        return await self._write(ctx, item, renewed, operation="extend_lease", lease_for=lease)

    async def _write(
        self,
        ctx: OpContext,
        held: WorkItem,
        outcome: WorkItem,
        *,
        operation: str,
        available_in: float | None = None,
        lease_for: float | None = None,
        dead_letter: str | None = None,
    ) -> WorkItem:
        """Write `outcome` under the token `held` was claimed with, in `ctx`'s tenant;
        `dead_letter` (a reason) records the audit entry the dead letter owes.

        Raises `Conflict` (counted) when the token no longer holds, `NotFound` when the
        tenant has no such item.
        """
        try:
            return await self._storage.write_item(
                ctx.org_id,
                outcome,
                _token(held),
                available_in=available_in,
                lease_for=lease_for,
                dead_letter=dead_letter,
            )
        except ItemCancelled:
            raise  # an operator's cancel, not a lost claim: no conflict is counted
        except Conflict:
            self._metrics.fencing_conflicts.labels(operation=operation).inc()
            raise


def _refuse_system_scope(org_id: UUID) -> None:
    """Raise `Invalid` for the nil tenant: `EMPTY_UUID` is the system scope (row-level
    security lets it see every tenant), never a tenant, and an item enqueued under it would
    belong to none (the worker dead-letters it: no tenancy answer exists for it)."""
    if org_id == EMPTY_UUID:
        raise Invalid("org_id: the nil tenant is the system scope; enqueue under a tenant")


def _token(item: WorkItem) -> UUID:
    """The claim token `item` was claimed with; `Conflict` when it carries none."""
    if item.claim_token is None:
        raise Conflict(f"claim_token: work item {item.id} is not held by this caller")
    return item.claim_token


def _relayed_kind(outbox_kind: str) -> WorkKind:
    """`work.notify_shipment` or `work.NOTIFY_SHIPMENT` -> `WorkKind.NOTIFY_SHIPMENT`."""
    name = outbox_kind.removeprefix(WORK_ROW_PREFIX)
    if name == outbox_kind or name.upper() not in WorkKind.__members__:
        raise Invalid(f"kind: {outbox_kind!r} names no work kind")
    return WorkKind[name.upper()]


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark an early ask's outcome as seen (a claim that failed never awaits it)."""
    if not task.cancelled():
        task.exception()
