"""The work manager's maintenance (the sweep's steps) and the operator's commands: listing,
replay, discard, lane moves and the queue's statistics, each operator write audited under
the operator's name when given."""

from __future__ import annotations

import time
from typing import Any, NoReturn
from uuid import UUID

from acme.om.audit import AuditManagerInterface
from acme.om.context import OpContext, RequestContext
from acme.om.errors import Conflict, Invalid, NotFound
from acme.om.tenancy import TenancyManagerInterface
from acme.om.types import EMPTY_UUID
from acme.om.work.impl.dead_letters import SUBJECT_TYPE, DeadLetterAudits
from acme.om.work.impl.wake_publisher import WakeUpPublisher
from acme.om.work.manager import WorkManagerInterface
from acme.om.work.metrics import WorkMetrics
from acme.om.work.rules import refuse_bad_lane
from acme.om.work.storage import WorkStorageInterface
from acme.om.work.types.work_item import (
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
        await self._dead_letters.settle(ctx, item_id)
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
        self._wake_ups.owe([(revived.lane, revived.kind.value)])
        return revived

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


def _with_operator(detail: dict[str, Any], operator: str | None) -> dict[str, Any]:
    """An operator write's audit detail, naming the person who asked when one is given."""
    return detail if operator is None else detail | {"operator": operator}
