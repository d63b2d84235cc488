"""The work manager."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn, cast
from uuid import UUID, uuid4

from pydantic import BaseModel, ValidationError

from acme.infra.topics import (
    Topics,
    TopicsInterface,
    TopicsUnavailable,
    WorkAvailablePayload,
)
from acme.om.audit import AuditManagerInterface
from acme.om.context import OpContext, RequestContext
from acme.om.errors import Conflict, Invalid, NotFound
from acme.om.outbox import OutboxRow
from acme.om.tenancy import TenancyManagerInterface
from acme.om.types import EMPTY_UUID
from acme.om.work.manager import WorkManagerInterface
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
from acme.om.work.storage import NewItems, OwedAudit, WakeUps, WorkStorageInterface
from acme.om.work.types.work_item import (
    WORK_PAYLOADS,
    WORK_POLICIES,
    LaneStats,
    UnreadableItem,
    UnreadableRow,
    WorkItem,
    WorkKind,
    WorkRows,
    WorkStatus,
    checked_delay,
)

logger = logging.getLogger(__name__)

WORK_ROW_PREFIX = "work."
"""The outbox kind family the relay hands to `enqueue_relayed`: `work.<KIND>`."""

SUBJECT_TYPE = "work_item"
"""The `subject_type` of every audit entry about a work item."""

DEAD_LETTERED = "work.dead_lettered"
"""The audit action of a dead letter: one entry per dead letter, keyed by `OwedAudit.key`."""

_ASKS_AT_ONCE = 10
"""The most tenancy reads one claim batch runs at the same time (`_ask_all`)."""

ContextKey = tuple[UUID, UUID, UUID | None]
"""What a claimed item's context is built from: (tenant, enqueuer, causing request)."""

CONTEXT_REUSE_S = 0.25
"""How long (s, from the start of the ask) the tenancy manager's answer that a tenant is
live serves the later claim batches of the same `ContextKey` (the template's
docs/decisions/0022): a tenant gone longer than this has its claimed items dead-lettered,
as every answer that it is gone does at once."""

WAKE_UP_COALESCE_S = 0.005
"""After publishing `WORK_AVAILABLE` the manager waits this long (s) before it publishes the
wake-ups owed meanwhile (`_wake`): an enqueue after a quiet spell is published at once, and
a stream of enqueues sends at most one message per lane and kind per window, not one per
enqueue (each costs a round trip of the topic's CPU in the enqueuing process)."""

_JSON_NUL = "\\u0000"
"""How JSON text writes a NUL character (`json.dumps` and pydantic alike)."""

_ANSWERS_KEPT = 1_000
"""The most tenancy answers kept for reuse (the oldest go first)."""

# Every claim field, cleared whenever an item leaves a holder's hands.
_UNCLAIMED: dict[str, Any] = {
    "claimed_by": None,
    "claim_token": None,
    "claimed_at": None,
    "lease_expires_at": None,
}


class WorkManagerImpl(WorkManagerInterface):
    """`WorkManagerInterface` over a `WorkStorageInterface`.

    `tenancy` builds the context a claimed item runs under; `audit` records dead letters
    and operator actions; `topics` carries the `WORK_AVAILABLE` wake-up; `metrics`
    defaults to the process-wide counters. Every write after the enqueue signs
    `updated_by` with `EMPTY_UUID`, never with the context's user: the context is the
    attribution of the work, not of the bookkeeping on its row (the work queue's one
    exception to The Business Layer, Shape of an Operation).

    A dead letter's row and its audit entry live in two roles, so they cannot share a
    transaction: the statement that fails the row also records the entry it owes
    (`OwedAudit`), the entry is appended under an idempotency key derived from the item
    and the claim it died under, and only then is the debt settled. Whatever stops in
    between, `audit_dead_letters` (a sweep step) finds the debt and writes the entry once.
    When the host's `AuditManagerInterface.append` takes no `idempotency_key` (optional in
    the template's docs/host-contract.md), the manager looks for the entry by its
    `claim_token` detail first instead, which two writers racing can both miss.
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
        self._topics = topics
        # The (lane, kind) pairs whose WORK_AVAILABLE is owed, and the task publishing them.
        self._wake_owed: dict[tuple[str, str], None] = {}
        self._waking: asyncio.Task[None] | None = None
        self._wake_up_coalesce_s = wake_up_coalesce_s
        self._metrics = metrics or default_metrics()
        self._keyed_audit = _takes_keyword(audit.append, "idempotency_key")
        self._unaudited_kinds: set[str] = set()
        # Per lane: the context key of the last claim batch, and the key asked for early
        # (beside the next claim) because the last two batches shared it.
        self._last_key: dict[str, ContextKey] = {}
        self._expected_key: dict[str, ContextKey] = {}
        # Answers that a tenant is live, by key: (when asked, time.monotonic(); the context),
        # the oldest first; reused for `context_reuse_s` (0: never).
        self._context_reuse_s = context_reuse_s
        self._answers: dict[ContextKey, tuple[float, OpContext]] = {}

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
        self._wake([(batch.lane, kind.value)])
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
        the wake-ups (`_wake`)."""
        if not items:
            return []
        results = await self._storage.create_items(org_id, items)
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
        self._wake((r.lane, r.kind.value) for r in enqueued if r.status is WorkStatus.AVAILABLE)
        return enqueued

    def _wake(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Publish `WORK_AVAILABLE` for each (lane, kind) of `pairs`, whose rows are
        committed, without the caller waiting on the topic's round trip.

        One task per manager publishes what is owed, then waits `wake_up_coalesce_s`
        (`WAKE_UP_COALESCE_S`) and publishes once more what was owed meanwhile, until a
        window passes with nothing owed: every enqueue is followed by a message for its lane
        and kind sent after its commit (at once after a quiet spell, else when the window
        ends), and a stream of enqueues sends one message per lane, kind and window, not
        one each. A wake-up owed when the process stops is lost: a worker on PostgreSQL
        wakes on the insert's NOTIFY anyway, one on Redis at its next poll (a lost wake-up
        costs one poll interval, never an item; `publish_owed_wake_ups` waits for them)."""
        self._wake_owed.update(dict.fromkeys(pairs))
        if not self._wake_owed:
            return
        loop = asyncio.get_running_loop()
        if self._waking is None or self._waking.done() or self._waking.get_loop() is not loop:
            self._waking = loop.create_task(self._publish_owed())

    async def publish_owed_wake_ups(self) -> None:
        """See `WorkManagerInterface.publish_owed_wake_ups`."""
        while self._waking is not None and not self._waking.done():
            if self._waking.get_loop() is not asyncio.get_running_loop():
                return  # a task of a loop gone: what it owed is published by the next `_wake`
            await asyncio.shield(self._waking)

    async def _publish_owed(self) -> None:
        """`_wake`'s task: publish every owed pair, wait out the coalescing window, and
        again, until a window passes with none owed."""
        while self._wake_owed:
            owed, self._wake_owed = list(self._wake_owed), {}
            for lane, kind in owed:
                try:
                    await self._publish(lane, kind)
                except Exception:
                    logger.exception("WORK_AVAILABLE not published for %s/%s", lane, kind)
            if self._wake_up_coalesce_s > 0:
                await asyncio.sleep(self._wake_up_coalesce_s)

    async def _publish(self, lane: str, kind: str) -> None:
        """Wake the workers of `lane`; a lost wake-up costs one poll interval, never an item."""
        try:
            await self._topics.publish(
                Topics.WORK_AVAILABLE, WorkAvailablePayload(lane=lane, kind=kind)
            )
        except TopicsUnavailable:
            logger.warning("WORK_AVAILABLE not published for %s/%s; workers will poll", lane, kind)

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

        One tenancy transition per distinct (tenant, enqueuer, causing request) in the
        batch, not one per item: items enqueued together share all three, and only the
        tenancy manager builds an OpContext (the host's OpContext Stages). When the last
        two batches of the lane shared their key, the next claim asks for that key's
        context beside the claim rather than after it, so the two sessions run at once: a
        draining worker waits for one of them, not both (the template's
        docs/decisions/0016). An answer that the tenant is live serves the key's later
        batches for `context_reuse_s` (`CONTEXT_REUSE_S`, from the start of its ask;
        docs/decisions/0022), each of them running under that answer's context with the
        batch's own request `rctx`, so a draining worker asks about once per key and
        quarter second instead of once per batch; an answer that the tenant is gone is
        never reused. An answer may so predate the claim's return by `context_reuse_s`
        (its age is checked when the claim returns), as an answer asked after the claim
        predates the handler. An early answer the batch does not use costs one tenancy
        read and nothing else. The keys asked after the claim are asked at the same time
        (`_ask_all`).

        A batch whose claimed rows were not all handed out (a gone tenant's item or an
        unreadable row, each dead-lettered) is followed at once by another claim for the
        slots they left, until the slots are filled or the lane has no more due rows: a
        backlog of dead letters never passes for an empty lane, which would make the loop
        wait a poll interval with the rows behind it due.
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
        self._forget_answers()
        expected = self._expected_key.get(lane)
        early: asyncio.Task[OpContext | None] | None = None
        if expected is not None and self._reusable(expected, rctx) is None:
            early = asyncio.create_task(self._ask(rctx, expected))
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
            self._expect(lane, items)
        for unreadable in items.unreadable:
            self._dead_letter_unreadable(unreadable)
        for key in map(_context_key, items):
            if key not in asked and (reused := self._reusable(key, rctx)) is not None:
                asked[key] = reused
        unasked = list(dict.fromkeys(k for k in map(_context_key, items) if k not in asked))
        answers = await self._ask_all(rctx, unasked, parallel=min(limit, _ASKS_AT_ONCE))
        failed = next((a for a in answers if isinstance(a, BaseException)), None)
        if failed is not None:
            # The claim has committed: hand the whole batch back at once, attempts given
            # back, rather than leave it claimed by nobody until the leases pass.
            await self._hand_back(items)
            raise failed
        asked.update(zip(unasked, cast(list[OpContext | None], answers), strict=True))
        for item in items:
            self._metrics.claimed.labels(kind=item.kind.value).inc()
            ctx = asked[_context_key(item)]
            if ctx is None:
                await self._drop_orphan(item)
                continue
            claimed.append((ctx, item))
        return claimed, len(items) + len(items.unreadable)

    def _reusable(self, key: ContextKey, rctx: RequestContext) -> OpContext | None:
        """The answer for `key` asked less than `context_reuse_s` ago, now (a claim that
        took long does not stretch the window), under the claim's request `rctx`; None
        when there is none."""
        answer = self._answers.get(key)
        if answer is None or answer[0] <= time.monotonic() - self._context_reuse_s:
            return None
        ctx = answer[1]
        # The host contract's OpContext is a frozen dataclass: the tenancy manager's answer,
        # with the request of the claim it now serves.
        return ctx if ctx.request is rctx else dataclasses.replace(ctx, request=rctx)

    async def _ask_all(
        self, rctx: RequestContext, keys: Sequence[ContextKey], *, parallel: int
    ) -> list[OpContext | BaseException | None]:
        """`_ask` for each of `keys`, at most `parallel` at a time; each answer, or the
        exception its ask raised, in the order of `keys`.

        A batch of items from many requests (each web request enqueues its own) needs one
        tenancy read per request: in turn they would keep the whole batch from starting for
        as many sessions. `parallel` is at most the batch's size, whose handlers have not
        started yet, so the reads take no connection a running handler holds, and at most
        `_ASKS_AT_ONCE`, so a large batch never opens a connection per item at once.
        """
        if len(keys) <= 1:
            try:
                return [await self._ask(rctx, key) for key in keys]
            except Exception as exc:
                return [exc]
        gate = asyncio.Semaphore(max(1, min(parallel, len(keys))))

        async def ask(key: ContextKey) -> OpContext | None:
            async with gate:
                return await self._ask(rctx, key)

        return list(await asyncio.gather(*map(ask, keys), return_exceptions=True))

    async def _ask(self, rctx: RequestContext, key: ContextKey) -> OpContext | None:
        """The tenancy manager's service context for `key`; None when the tenant is gone.
        Raises what the tenancy manager raises besides `NotFound`."""
        org_id, acting_for, caused_by = key
        asked_at = time.monotonic()
        try:
            ctx = await self._tenancy.service_context(
                rctx, org_id=org_id, acting_for=acting_for, caused_by_request_id=caused_by
            )
        except NotFound:
            self._answers.pop(key, None)
            return None
        if self._context_reuse_s > 0:
            self._answers.pop(key, None)  # re-inserted last: the dict stays oldest first
            self._answers[key] = (asked_at, ctx)
            if len(self._answers) > _ANSWERS_KEPT:
                del self._answers[next(iter(self._answers))]
        return ctx

    def _forget_answers(self) -> None:
        """Drop the answers asked `context_reuse_s` ago or earlier (the oldest are first)."""
        expired = time.monotonic() - self._context_reuse_s
        while self._answers:
            key, (asked_at, _) = next(iter(self._answers.items()))
            if asked_at > expired:
                break
            del self._answers[key]

    def _expect(self, lane: str, items: Sequence[WorkItem]) -> None:
        """Ask early next time only while batches repeat a key: a workload whose every
        item comes from another request never pays for an early answer it cannot use."""
        keys: dict[ContextKey, int] = {}
        for item in items:
            key = _context_key(item)
            keys[key] = keys.get(key, 0) + 1
        key = max(keys, key=keys.__getitem__)
        if self._last_key.get(lane) == key:
            self._expected_key[lane] = key
        else:
            self._expected_key.pop(lane, None)
        self._last_key[lane] = key

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

    async def complete_many(self, held: Sequence[tuple[OpContext, WorkItem]]) -> set[UUID]:
        by_tenant: dict[UUID, list[WorkItem]] = {}
        for ctx, item in held:
            if item.org_id != ctx.org_id:
                raise Invalid(f"org_id: item {item.id} is not of the context's tenant")
            by_tenant.setdefault(ctx.org_id, []).append(item)
        done: set[UUID] = set()
        for org_id, items in by_tenant.items():
            tokens = [(item.id, _token(item)) for item in items]
            completed = await self._storage.complete_items(org_id, tokens)
            done |= completed
            for item in items:
                if item.id in completed:
                    self._metrics.completed.labels(kind=item.kind.value).inc()
                else:
                    self._metrics.fencing_conflicts.labels(operation="complete").inc()
        return done

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
            await self._dead_letter(ctx, _owed(written, _token(item), "attempts"))
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

    async def defer(self, ctx: OpContext, item: WorkItem, delay: float) -> WorkItem:
        if delay < 0:
            raise Invalid(f"delay: must not be negative, got {delay}")
        later = item.model_copy(
            update={
                **_UNCLAIMED,
                "status": WorkStatus.AVAILABLE,
                "attempts": handed_back_attempts(item.attempts),
                "note": "deferred",
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
        self._wake([(released.lane, released.kind.value)])  # due at once, as a replay is
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
        except Conflict:
            self._metrics.fencing_conflicts.labels(operation=operation).inc()
            raise

    async def _dead_letter(self, ctx: OpContext, owed: OwedAudit) -> None:
        """A dead letter is the failed row (written, owing its entry), its count and its
        audit entry (`_audit_now`)."""
        self._metrics.dead_letters.labels(kind=owed.kind, reason=owed.reason).inc()
        await self._audit_now(ctx, [owed.id], known=[owed])

    async def _audit_now(
        self, ctx: OpContext, item_ids: Sequence[UUID], *, known: Sequence[OwedAudit] = ()
    ) -> None:
        """Write the entries the dead letters `item_ids` of `ctx`'s tenant owe (`known`
        debts as given, the others read first). What cannot be written now is logged and
        left owed: the sweep's `audit_dead_letters` writes it, and the failure it follows
        stands."""
        debts = list(known)
        given = {debt.id for debt in known}
        unread = [item_id for item_id in item_ids if item_id not in given]
        try:
            if unread:
                debts += await self._storage.owed_audits(
                    ctx.org_id, limit=len(unread), item_ids=unread
                )
            for debt in debts:
                await self._write_owed_audit(ctx, debt)
        except Exception as exc:
            logger.warning(
                "work item(s) %s: a dead letter whose audit entry is not written yet (%s); "
                "the sweep writes it",
                ", ".join(str(item_id) for item_id in item_ids),
                type(exc).__name__,
            )

    async def _write_owed_audit(self, ctx: OpContext, owed: OwedAudit) -> bool:
        """Append the `work.dead_lettered` entry `owed` stands for, once, then settle the
        debt; True when this call settled it. Raises what the audit or the storage raise
        (the debt then stays, and a later call writes the same entry)."""
        detail = {
            "kind": owed.kind,
            "lane": owed.lane,
            "attempts": owed.attempts,
            "reason": owed.reason,
            "last_error": owed.last_error,
            "claim_token": str(owed.token),
        }
        if self._keyed_audit:
            # Passed by name from a mapping: a host whose `append` has no such parameter
            # still type-checks (and takes the other branch).
            keyed: dict[str, Any] = {"idempotency_key": owed.key}
            await self._audit.append(
                ctx,
                action=DEAD_LETTERED,
                subject_type=SUBJECT_TYPE,
                subject_id=owed.id,
                detail=detail,
                **keyed,
            )
        elif not await self._has_entry(ctx, owed):
            await self._audit.append(
                ctx,
                action=DEAD_LETTERED,
                subject_type=SUBJECT_TYPE,
                subject_id=owed.id,
                detail=detail,
            )
        return await self._storage.settle_audit(owed.org_id, owed.id, owed.token)

    async def _has_entry(self, ctx: OpContext, owed: OwedAudit) -> bool:
        """Whether the item already has the dead-letter entry of `owed` (by its token)."""
        entries = await self._audit.list_for(ctx, SUBJECT_TYPE, owed.id)
        return any(
            entry.action == DEAD_LETTERED and entry.detail.get("claim_token") == str(owed.token)
            for entry in entries
        )

    # -- maintenance ---------------------------------------------------------------------

    async def requeue_stale(self, ctx: OpContext, *, limit: int = 100) -> int:
        if limit < 1:
            raise Invalid(f"limit: must be at least 1, got {limit}")
        moved = await self._storage.requeue_stale(ctx.org_id, None, limit)
        dead: list[UUID] = []
        for kind, item_id, status in [
            *((i.kind.value, i.id, i.status.value) for i in moved),
            *((u.kind, u.id, u.status) for u in moved.unreadable),
        ]:
            if status == WorkStatus.FAILED:
                self._metrics.dead_letters.labels(kind=kind, reason="lease").inc()
                dead.append(item_id)
            else:
                self._metrics.requeued_stale.labels(kind=kind).inc()
        # Handed back due at once: a worker on the topic wakes for them (one that listens
        # to the storage's own wake-ups was woken by the requeue's transaction).
        self._wake((i.lane, i.kind.value) for i in moved if i.status is WorkStatus.AVAILABLE)
        if dead:
            await self._audit_now(ctx, dead)
        return len(moved) + len(moved.unreadable)

    async def audit_dead_letters(self, ctx: OpContext, *, limit: int = 100) -> int:
        if limit < 1:
            raise Invalid(f"limit: must be at least 1, got {limit}")
        written = 0
        for owed in await self._storage.owed_audits(ctx.org_id, limit=limit):
            written += await self._write_owed_audit(ctx, owed)
        return written

    async def maintenance_contexts(self, rctx: RequestContext) -> list[OpContext]:
        return await self._tenancy.service_contexts(rctx)

    async def purge_deleted(self, ctx: OpContext, *, older_than: float) -> int:
        if older_than < 0:
            raise Invalid(f"older_than: must not be negative, got {older_than}")
        return await self._storage.purge_deleted(ctx.org_id, older_than)

    async def purge_completed(self, ctx: OpContext, *, older_than: float, limit: int = 1000) -> int:
        if older_than < 0:
            raise Invalid(f"older_than: must not be negative, got {older_than}")
        if limit < 1:
            raise Invalid(f"limit: must be at least 1, got {limit}")
        return await self._storage.purge_completed(ctx.org_id, older_than, limit)

    # -- operator ------------------------------------------------------------------------

    async def list_items(
        self,
        ctx: OpContext,
        *,
        status: WorkStatus | None = None,
        kind: WorkKind | None = None,
        limit: int = 50,
    ) -> WorkRows:
        if limit < 1:
            raise Invalid(f"limit: must be at least 1, got {limit}")
        return await self._storage.list_items(ctx.org_id, status=status, kind=kind, limit=limit)

    async def get(self, ctx: OpContext, item_id: UUID) -> WorkItem:
        item = await self._storage.read_item(ctx.org_id, item_id)
        if item is None:
            raise NotFound(f"item_id: no work item {item_id}")
        return item

    async def replay(
        self, ctx: OpContext, item_id: UUID, *, operator: str | None = None
    ) -> WorkItem:
        await self._settle_owed(ctx, item_id)
        revived = await self._storage.revive_item(ctx.org_id, item_id)
        if revived is None:
            await self._refuse(ctx, item_id, "replayed")
        await self._audit.append(
            ctx,
            action="work.replayed",
            subject_type=SUBJECT_TYPE,
            subject_id=item_id,
            detail=_with_operator({"kind": revived.kind.value, "lane": revived.lane}, operator),
        )
        self._wake([(revived.lane, revived.kind.value)])
        return revived

    async def discard(
        self, ctx: OpContext, item_id: UUID, *, operator: str | None = None
    ) -> WorkItem:
        await self._settle_owed(ctx, item_id)
        discarded = await self._storage.discard_item(ctx.org_id, item_id)
        if discarded is None:
            await self._refuse(ctx, item_id, "discarded")
        await self._audit.append(
            ctx,
            action="work.discarded",
            subject_type=SUBJECT_TYPE,
            subject_id=item_id,
            detail=_with_operator(
                {"kind": discarded.kind.value, "last_error": discarded.last_error}, operator
            ),
        )
        return discarded

    async def move_lane(
        self,
        ctx: OpContext,
        *,
        from_lane: str,
        to_lane: str,
        kind: str | None = None,
        operator: str | None = None,
    ) -> list[tuple[UUID, str]]:
        refuse_bad_lane(from_lane)
        refuse_bad_lane(to_lane)
        if from_lane == to_lane:
            raise Invalid(f"to_lane: the items are on {from_lane} already; name another lane")
        moved = await self._storage.move_lane(
            ctx.org_id, from_lane=from_lane, to_lane=to_lane, kind=kind
        )
        for item_id, moved_kind in moved:
            await self._audit.append(
                ctx,
                action="work.lane_moved",
                subject_type=SUBJECT_TYPE,
                subject_id=item_id,
                detail=_with_operator(
                    {"kind": moved_kind, "from_lane": from_lane, "to_lane": to_lane}, operator
                ),
            )
        self._wake((to_lane, moved_kind) for _, moved_kind in moved)
        return moved

    async def discard_unknown_kind(
        self, ctx: OpContext, item_id: UUID, *, operator: str | None = None
    ) -> UnreadableRow:
        await self._settle_owed(ctx, item_id)
        discarded = await self._storage.discard_unknown_kind(ctx.org_id, item_id)
        if discarded is None:
            try:
                current = await self.get(ctx, item_id)
            except UnreadableItem as exc:
                row = exc.row
                if row.values.get("deleted_at") is not None:
                    raise Conflict(f"deleted_at: item {item_id} was discarded already") from None
                raise Conflict(
                    f"status: item {item_id} is {row.status}; a claimed row is its holder's "
                    "until the sweep hands it back (after its lease)"
                ) from None
            raise Conflict(
                f"kind: item {item_id} is of kind {current.kind.value}, which this code names; "
                "only a row of a kind no worker declares is discarded here "
                "(a dead letter: `dead-letters discard`)"
            )
        await self._audit.append(
            ctx,
            action="work.discarded",
            subject_type=SUBJECT_TYPE,
            subject_id=item_id,
            detail=_with_operator(
                {
                    "kind": discarded.kind,
                    "lane": discarded.text("lane"),
                    "status": discarded.status,
                },
                operator,
            ),
        )
        return discarded

    async def _settle_owed(self, ctx: OpContext, item_id: UUID) -> None:
        """Write the dead-letter entry the item still owes before an operator write moves
        it on (a replayed item can die again, under a new debt); raises when it cannot."""
        for owed in await self._storage.owed_audits(ctx.org_id, limit=1, item_ids=[item_id]):
            await self._write_owed_audit(ctx, owed)

    async def _refuse(self, ctx: OpContext, item_id: UUID, verb: str) -> NoReturn:
        """Raise why an operator write found nothing to change."""
        current = await self.get(ctx, item_id)
        if current.deleted_at is not None:
            raise Conflict(f"deleted_at: item {item_id} was discarded at {current.deleted_at}")
        raise Conflict(f"status: only a failed item can be {verb}; this one is {current.status}")

    async def queue_stats(self, rctx: RequestContext) -> list[LaneStats]:
        stats = await self._storage.queue_stats(EMPTY_UUID)
        unaudited: dict[str, int] = {}
        for row in stats:
            unaudited[row.kind] = unaudited.get(row.kind, 0) + row.audit_owed
        for kind in self._unaudited_kinds | set(unaudited):
            self._metrics.dead_letters_unaudited.labels(kind=kind).set(unaudited.get(kind, 0))
        self._unaudited_kinds |= set(unaudited)
        snapshot = await self._storage.oldest_snapshot_xid_age(EMPTY_UUID)
        if snapshot is not None:
            database, xid_age = snapshot
            self._metrics.oldest_snapshot_xid_age.labels(database=database).set(xid_age)
        return stats


def _refuse_system_scope(org_id: UUID) -> None:
    """Raise `Invalid` for the nil tenant: `EMPTY_UUID` is the system scope (row-level
    security lets it see every tenant), never a tenant, and an item enqueued under it would
    belong to none (the worker dead-letters it: no tenancy answer exists for it)."""
    if org_id == EMPTY_UUID:
        raise Invalid("org_id: the nil tenant is the system scope; enqueue under a tenant")


def _with_operator(detail: dict[str, Any], operator: str | None) -> dict[str, Any]:
    """An operator write's audit detail, naming the person who asked when one is given."""
    return detail if operator is None else detail | {"operator": operator}


def _owed(item: WorkItem, token: UUID, reason: str) -> OwedAudit:
    """The audit entry `item`, just failed for good under `token`, owes."""
    return OwedAudit(
        id=item.id,
        org_id=item.org_id,
        kind=item.kind.value,
        lane=item.lane,
        attempts=item.attempts,
        last_error=item.last_error,
        reason=reason,
        token=token,
    )


def _takes_keyword(method: Any, name: str) -> bool:
    """Whether `method` accepts the keyword argument `name` (or any keyword)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == name and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        or p.kind is p.VAR_KEYWORD
        for p in parameters
    )


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


def _context_key(item: WorkItem) -> ContextKey:
    return (item.org_id, item.created_by, item.request_id)
