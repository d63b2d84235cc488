"""The work manager's maintenance (the sweep's steps) and the operator's commands: listing,
replay (corrected or not), discard, lane moves, lane pauses, the queue's statistics and
summary, each operator write audited under the operator's name when given."""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn
from uuid import UUID, uuid5

from pydantic import ValidationError

from acme.om.audit import AuditManagerInterface
from acme.om.context import OpContext, RequestContext
from acme.om.errors import Conflict, Invalid, NotFound
from acme.om.tenancy import TenancyManagerInterface
from acme.om.types import EMPTY_UUID, utc_now
from acme.om.work.impl.dead_letters import SUBJECT_TYPE, DeadLetterAudits
from acme.om.work.impl.wake_publisher import WakeUpPublisher
from acme.om.work.manager import WorkManagerInterface
from acme.om.work.metrics import WorkMetrics
from acme.om.work.rules import (
    field_path,
    policy_lane,
    refuse_bad_move,
    refuse_nul,
    refuse_unknown_lane,
)
from acme.om.work.storage import CANCEL_NOTE, WorkStorageInterface
from acme.om.work.types.lanes import LanePause, QueueSummary, WorkerAlive, WorkerBeat
from acme.om.work.types.work_item import (
    WORK_PAYLOADS,
    LaneStats,
    UnreadableItem,
    UnreadableRow,
    WorkItem,
    WorkKind,
    WorkRows,
    WorkStatus,
)


class OperatorCommands(WorkManagerInterface):
    """The sweep's and the operator's part of `WorkManagerInterface`, over the collaborators
    `WorkManagerImpl` sets."""

    _storage: WorkStorageInterface
    _tenancy: TenancyManagerInterface
    _audit: AuditManagerInterface
    _metrics: WorkMetrics
    _wake_ups: WakeUpPublisher
    _dead_letters: DeadLetterAudits
    _unaudited_kinds: set[str]
    _snapshot_seen: tuple[str, float] | None
    _paused_gauged: set[str]

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
        self._wake_ups.owe(
            (i.lane, i.kind.value) for i in moved if i.status is WorkStatus.AVAILABLE
        )
        if dead:
            await self._dead_letters.write_now(ctx, dead)
        return len(moved) + len(moved.unreadable)

    async def audit_dead_letters(self, ctx: OpContext, *, limit: int = 100) -> int:
        if limit < 1:
            raise Invalid(f"limit: must be at least 1, got {limit}")
        written = 0
        for owed in await self._storage.owed_audits(ctx.org_id, limit=limit):
            written += await self._dead_letters.write(ctx, owed)
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
        lane: str | None = None,
        after: tuple[datetime, UUID] | None = None,
        limit: int = 50,
    ) -> WorkRows:
        if limit < 1:
            raise Invalid(f"limit: must be at least 1, got {limit}")
        return await self._storage.list_items(
            ctx.org_id, status=status, kind=kind, lane=lane, after=after, limit=limit
        )

    async def get(self, ctx: OpContext, item_id: UUID) -> WorkItem:
        item = await self._storage.read_item(ctx.org_id, item_id)
        if item is None:
            raise NotFound(f"item_id: no work item {item_id}")
        return item

    async def replay(
        self,
        ctx: OpContext,
        item_id: UUID,
        *,
        operator: str | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> WorkItem:
        detail: dict[str, Any] = {}
        corrected = None
        if payload is not None:
            corrected, old_payload = await self._corrected(ctx, item_id, payload)
            detail = {"old_payload": old_payload, "payload": corrected}
        await self._dead_letters.settle(ctx, item_id)
        revived = await self._storage.revive_item(ctx.org_id, item_id, payload=corrected)
        if revived is None:
            await self._refuse(ctx, item_id, "replayed")
        await self._audit.append(
            ctx,
            action="work.replayed",
            subject_type=SUBJECT_TYPE,
            subject_id=item_id,
            detail=_with_operator(
                {"kind": revived.kind.value, "lane": revived.lane, **detail}, operator
            ),
        )
        self._wake_ups.owe([(revived.lane, revived.kind.value)])
        return revived

    async def cancel_item(
        self, ctx: OpContext, item_id: UUID, *, operator: str | None = None
    ) -> WorkItem:
        cancelled = await self._storage.cancel_item(ctx.org_id, item_id)
        if cancelled is None:
            current = await self.get(ctx, item_id)
            if current.deleted_at is not None:
                raise Conflict(f"deleted_at: item {item_id} was discarded at {current.deleted_at}")
            raise Conflict(
                f"status: only an available or claimed item can be cancelled; this one is "
                f"{current.status}"
            )
        was = WorkStatus.CLAIMED if cancelled.claim_token is not None else WorkStatus.AVAILABLE
        detail = {"kind": cancelled.kind.value, "lane": cancelled.lane, "was": was.value}
        if cancelled.claimed_by is not None:
            detail["claimed_by"] = cancelled.claimed_by
        self._metrics.cancelled.labels(kind=cancelled.kind.value, was=was.value.lower()).inc()
        # Its holder hears at once over Redis too (a worker on the topic; one on the storage's
        # own wake-ups heard the cancel's transaction).
        self._wake_ups.owe([(cancelled.lane, f"{CANCEL_NOTE}{cancelled.id}")])
        await self._audit.append(
            ctx,
            action="work.cancelled",
            subject_type=SUBJECT_TYPE,
            subject_id=item_id,
            detail=_with_operator(detail, operator),
        )
        return cancelled

    async def discard(
        self, ctx: OpContext, item_id: UUID, *, operator: str | None = None
    ) -> WorkItem:
        await self._dead_letters.settle(ctx, item_id)
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
        also_known: Collection[str] = (),
    ) -> list[tuple[UUID, str]]:
        workers = [] if kind is None else await self._storage.alive_workers(EMPTY_UUID)
        refuse_bad_move(from_lane, to_lane, also_known, kind=kind, workers=workers)
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
        self._wake_ups.owe((to_lane, moved_kind) for _, moved_kind in moved)
        return moved

    async def discard_unknown_kind(
        self, ctx: OpContext, item_id: UUID, *, operator: str | None = None
    ) -> UnreadableRow:
        await self._dead_letters.settle(ctx, item_id)
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

    async def _corrected(
        self, ctx: OpContext, item_id: UUID, payload: Mapping[str, Any]
    ) -> tuple[dict[str, Any], Any]:
        """`payload` as the item's kind's model validates it (JSON form), and the payload
        it replaces as stored. Raises `NotFound`, or `Invalid` naming the refused field
        (`payload.<field>: ...`), before anything is written."""
        stored: Any
        try:
            item = await self.get(ctx, item_id)
            kind, stored = item.kind.value, item.payload
        except UnreadableItem as exc:  # a payload no model reads is what a correction fixes
            kind, stored = exc.row.kind, exc.row.values.get("payload")
        model = WORK_PAYLOADS.get(WorkKind(kind)) if policy_lane(kind) is not None else None
        if model is None:
            raise Invalid(f"payload: item {item_id} is of kind {kind}, which no model reads")
        try:
            corrected = model.model_validate(dict(payload)).model_dump(mode="json")
        except ValidationError as exc:
            first = exc.errors()[0]
            raise Invalid(f"{field_path(('payload', *first['loc']))}: {first['msg']}") from exc
        refuse_nul(corrected, "payload", self._storage.backend)
        return corrected, stored

    async def _refuse(self, ctx: OpContext, item_id: UUID, verb: str) -> NoReturn:
        """Raise why an operator write found nothing to change."""
        current = await self.get(ctx, item_id)
        if current.deleted_at is not None:
            raise Conflict(f"deleted_at: item {item_id} was discarded at {current.deleted_at}")
        raise Conflict(f"status: only a failed item can be {verb}; this one is {current.status}")

    async def purge_cancelled(self, ctx: OpContext, *, older_than: float, limit: int = 1000) -> int:
        if older_than < 0:
            raise Invalid(f"older_than: must not be negative, got {older_than}")
        if limit < 1:
            raise Invalid(f"limit: must be at least 1, got {limit}")
        return await self._storage.purge_cancelled(ctx.org_id, older_than, limit)

    async def lane_stats(self, ctx: OpContext) -> list[LaneStats]:
        return await self._storage.queue_stats(ctx.org_id)

    async def recent_outcomes(
        self, ctx: OpContext, *, window_s: float = 3600.0, buckets: int = 12
    ) -> list[tuple[int, int]]:
        if not 0 < window_s <= 86_400:
            raise Invalid(f"window_s: must be in (0, 86400] seconds, got {window_s}")
        if not 1 <= buckets <= 120:
            raise Invalid(f"buckets: must be 1-120, got {buckets}")
        return await self._storage.recent_outcomes(ctx.org_id, window_s=window_s, buckets=buckets)

    async def queue_stats(self, rctx: RequestContext) -> list[LaneStats]:
        stats = await self._storage.queue_stats(EMPTY_UUID)
        unaudited: dict[str, int] = {}
        for row in stats:
            unaudited[row.kind] = unaudited.get(row.kind, 0) + row.audit_owed
        for kind in self._unaudited_kinds | set(unaudited):
            self._metrics.dead_letters_unaudited.labels(kind=kind).set(unaudited.get(kind, 0))
        self._unaudited_kinds |= set(unaudited)
        paused = {pause.lane for pause in await self._storage.paused_lanes(EMPTY_UUID)}
        for lane in self._paused_gauged | paused:
            self._metrics.lane_paused.labels(lane=lane).set(int(lane in paused))
        self._paused_gauged |= paused
        snapshot = await self._storage.oldest_snapshot(EMPTY_UUID)
        if snapshot is not None:
            database = snapshot.database
            self._metrics.oldest_snapshot_xid_age.labels(database=database).set(snapshot.xid_age)
            held_s = self._snapshot_held_s(snapshot.xmin)
            self._metrics.oldest_snapshot_age.labels(database=database).set(held_s)
        return stats

    def _snapshot_held_s(self, xmin: str | None) -> float:
        """Seconds since this process first saw `xmin` as the oldest snapshot's, 0 with none
        held: the hold timed from its first sighting, so short by at most one stats pass
        (the times of other roles' sessions are not readable without `pg_read_all_stats`)."""
        now = time.monotonic()
        if xmin is None:
            self._snapshot_seen = None
            return 0.0
        if self._snapshot_seen is None or self._snapshot_seen[0] != xmin:
            self._snapshot_seen = (xmin, now)
        return now - self._snapshot_seen[1]

    # -- lanes ---------------------------------------------------------------------------

    async def pause_lane(
        self,
        rctx: RequestContext,
        lane: str,
        *,
        actor: str,
        reason: str | None = None,
        also_known: Collection[str] = (),
    ) -> LanePause:
        refuse_unknown_lane(lane, also_known)
        actor = _refuse_no_actor(actor)
        pause, made = await self._storage.pause_lane(
            EMPTY_UUID, lane, paused_by=actor, reason=reason
        )
        if not made:
            raise Conflict(
                f"lane: {lane} is paused already, by {pause.paused_by} at "
                f"{pause.paused_at.isoformat(timespec='seconds')}; resume it first"
            )
        self._metrics.lane_paused.labels(lane=lane).set(1)
        self._paused_gauged.add(lane)
        await self._audit_lane(rctx, "work.lane_paused", pause, actor=actor, reason=reason)
        return pause

    async def resume_lane(
        self, rctx: RequestContext, lane: str, *, actor: str, reason: str | None = None
    ) -> LanePause:
        actor = _refuse_no_actor(actor)
        lifted = await self._storage.resume_lane(EMPTY_UUID, lane)
        if lifted is None:
            paused = [p.lane for p in await self._storage.paused_lanes(EMPTY_UUID)]
            raise Conflict(
                f"lane: {lane:.100} is not paused; the paused lanes: {', '.join(paused) or 'none'}"
            )
        self._metrics.lane_paused.labels(lane=lane).set(0)
        self._wake_ups.owe((lane, kind.value) for kind in WorkKind)
        await self._audit_lane(rctx, "work.lane_resumed", lifted, actor=actor, reason=reason)
        return lifted

    async def _audit_lane(
        self,
        rctx: RequestContext,
        action: str,
        pause: LanePause,
        *,
        actor: str,
        reason: str | None,
    ) -> None:
        """One `action` entry per live tenant: a pause stops every tenant's items."""
        detail = {
            "lane": pause.lane,
            "paused_at": pause.paused_at.isoformat(),
            "paused_by": pause.paused_by,
            "reason": reason,
            "operator": actor,
        }
        for ctx in await self._tenancy.service_contexts(rctx):
            await self._audit.append(
                ctx,
                action=action,
                subject_type=LANE_SUBJECT_TYPE,
                subject_id=lane_subject_id(pause.lane),
                detail=detail,
            )

    async def paused_lanes(self, rctx: RequestContext) -> list[LanePause]:
        return await self._storage.paused_lanes(EMPTY_UUID)

    async def queue_summary(self, rctx: RequestContext) -> QueueSummary:
        read_at = utc_now()
        groups = await self.queue_stats(rctx)
        paused = await self._storage.paused_lanes(EMPTY_UUID)
        holding = await self._storage.holders(EMPTY_UUID)
        alive = [
            WorkerAlive(**row.model_dump(), holding=holding.get(row.worker_id, 0))
            for row in await self._storage.alive_workers(EMPTY_UUID)
        ]
        return QueueSummary(
            groups=groups,
            paused=paused,
            workers_alive=alive,
            workers_holding=holding,
            read_at=read_at,
        )

    # -- the worker roster (docs/decisions/0049) -------------------------------------------

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
        if not worker_id or not worker:
            raise Invalid("worker_id, worker: a worker's roster row needs its id and its name")
        if not ttl_s > 0:
            raise Invalid(f"ttl_s: must be above 0 seconds, got {ttl_s}")
        await self._storage.beat_worker(
            EMPTY_UUID,
            worker_id,
            worker=worker,
            lane=lane,
            kinds=[kind.value for kind in kinds],
            ttl_s=ttl_s,
        )

    async def workers_alive(self, rctx: RequestContext) -> list[WorkerBeat]:
        return await self._storage.alive_workers(EMPTY_UUID)

    async def drop_worker(self, rctx: RequestContext, worker_id: str) -> bool:
        return await self._storage.drop_worker(EMPTY_UUID, worker_id)

    async def prune_workers(self, rctx: RequestContext, *, expired_for_s: float) -> int:
        if expired_for_s < 0:
            raise Invalid(f"expired_for_s: must be 0 seconds or more, got {expired_for_s}")
        return await self._storage.prune_workers(EMPTY_UUID, expired_for_s)


LANE_SUBJECT_TYPE = "work_lane"
"""The `subject_type` of a lane's audit entries (`work.lane_paused`, `work.lane_resumed`)."""

# Fixed for good: another namespace would give every lane a new audit subject.
_LANE_NAMESPACE = UUID("9f1d2c64-5c55-4d39-a0a4-7b7f1a3c2e10")


def lane_subject_id(lane: str) -> UUID:
    """A lane's audit `subject_id`: the same UUID for a lane's name every time (UUID 5),
    so `AuditManagerInterface.list_for` finds a lane's pauses and resumes together."""
    return uuid5(_LANE_NAMESPACE, lane)


def _refuse_no_actor(actor: str) -> str:
    """`actor` stripped; `Invalid` when nothing is left (a pause records who asked)."""
    if not actor.strip():
        raise Invalid("actor: a pause and a resume record who asked; name them")
    return actor.strip()


def _with_operator(detail: dict[str, Any], operator: str | None) -> dict[str, Any]:
    """An operator write's audit detail, naming the person who asked when one is given."""
    return detail if operator is None else detail | {"operator": operator}
