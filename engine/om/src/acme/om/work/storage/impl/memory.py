"""The work queue in memory: the same contract over a dict and one `asyncio.Lock`."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar
from uuid import UUID, uuid4

from acme.om.errors import Conflict, NotFound
from acme.om.types import EMPTY_UUID, utc_now
from acme.om.work.rules import is_claimable, is_exhausted, is_stale
from acme.om.work.storage import (
    LANE_MOVED,
    LEASE_EXPIRED,
    LEASE_EXPIRED_FINAL,
    UNREADABLE,
    Created,
    OldestSnapshot,
    OneSlotTurns,
    OwedAudit,
    WorkStorageInterface,
)
from acme.om.work.types.lanes import LanePause, WorkerBeat
from acme.om.work.types.schedules import ScheduleState
from acme.om.work.types.work_item import (
    ItemCancelled,
    LaneStats,
    UnreadableItem,
    UnreadableRow,
    WorkItem,
    WorkKind,
    WorkRows,
    WorkStatus,
    claim_order,
    read_row,
)


def _read(row: WorkItem) -> WorkItem | UnreadableRow:
    """A stored row read as the SQL storages read theirs: validated field by field, so a row
    a test stored without validation (`WorkItem.model_construct`) is an `UnreadableRow`."""
    return read_row({name: getattr(row, name, None) for name in WorkItem.model_fields})


def _strict(row: WorkItem) -> WorkItem:
    found = _read(row)
    if isinstance(found, UnreadableRow):
        raise UnreadableItem(found)
    return found.model_copy(deep=True)


def _is_object(value: object) -> bool:
    """Whether a stored payload is a JSON object (a stored row is not always validated)."""
    return isinstance(value, dict)


def _rows(rows: list[WorkItem]) -> WorkRows:
    read = WorkRows()
    for row in rows:
        found = _read(row)
        if isinstance(found, UnreadableRow):
            read.unreadable.append(found)
        else:
            read.append(found.model_copy(deep=True))
    return read


class MemoryWorkStorage(WorkStorageInterface):
    """`WorkStorageInterface` for unit tests and the memory container.

    Every method runs under one lock, so each is atomic the way one statement is.
    `clock` (aware UTC) stands for the database clock; tests pass their own to move time.
    Rows are copied in and out, so a caller's item never aliases a stored row. The audit
    entries dead letters owe are kept beside the rows (`_owed`: id to token and reason),
    as the SQL table keeps them in two columns the item does not carry; the schedule-state
    rows in `_schedules`, the worker roster in `_roster`.
    """

    backend: ClassVar[str] = "memory"

    def __init__(self, *, clock: Callable[[], datetime] | None = None) -> None:
        self._rows: dict[UUID, WorkItem] = {}
        self._owed: dict[UUID, tuple[UUID, str]] = {}
        self._pauses: dict[str, LanePause] = {}
        self._schedules: dict[tuple[UUID, str], ScheduleState] = {}  # `work_schedules`
        self._roster: dict[str, WorkerBeat] = {}  # the `work_workers` rows, by worker id
        self._lock = asyncio.Lock()
        self._clock = clock or utc_now
        self._one_slot_turns = OneSlotTurns()

    def _after(self, seconds: float) -> datetime:
        return self._clock() + timedelta(seconds=seconds)

    def _tenant_row(self, org_id: UUID, item_id: UUID) -> WorkItem | None:
        row = self._rows.get(item_id)
        return row if row is not None and row.org_id == org_id else None

    async def create_item(self, org_id: UUID, item: WorkItem) -> Created:
        """See `WorkStorageInterface.create_item`."""
        (created,) = await self.create_items(org_id, [item])
        return created

    async def create_items(self, org_id: UUID, items: Sequence[WorkItem]) -> list[Created]:
        """See `WorkStorageInterface.create_items`."""
        async with self._lock:
            return [self._create(org_id, item) for item in items]

    def _create(self, org_id: UUID, item: WorkItem) -> Created:
        """One item's insert-or-report, under the lock."""
        if item.id in self._rows:
            return Created(item.id, False, self._copy(org_id, item.id))
        holder = self._key_holder(org_id, item.idempotency_key)
        if holder is not None:
            return Created(holder, False, self._copy(org_id, holder))
        self._rows[item.id] = item.model_copy(
            update={"org_id": org_id, "available_at": self._after(item.delay)},
            deep=True,
        )
        return Created(item.id, True, self._copy(org_id, item.id))

    async def schedule_states(self, org_id: UUID) -> list[ScheduleState]:
        """See `WorkStorageInterface.schedule_states`."""
        async with self._lock:
            return sorted(
                (state for (org, _), state in self._schedules.items() if org == org_id),
                key=lambda state: state.schedule,
            )

    async def advance_schedule(
        self,
        org_id: UUID,
        schedule: str,
        *,
        previous: datetime | None,
        tick: datetime,
        item: WorkItem | None,
        next_tick: datetime | None = None,
    ) -> bool:
        """See `WorkStorageInterface.advance_schedule`: compare and set under the lock."""
        async with self._lock:
            held = self._schedules.get((org_id, schedule))
            if (None if held is None else held.tick_at) != previous:
                return False
            self._schedules[org_id, schedule] = ScheduleState(
                schedule=schedule, tick_at=tick, next_tick_at=next_tick
            )
            if item is not None:
                self._create(org_id, item)
            return True

    def _copy(self, org_id: UUID, item_id: UUID) -> WorkItem | None:
        row = self._tenant_row(org_id, item_id)
        return None if row is None else row.model_copy(deep=True)

    def _key_holder(self, org_id: UUID, key: str | None) -> UUID | None:
        if key is None:
            return None
        for row in self._rows.values():
            if row.org_id == org_id and row.idempotency_key == key:
                return row.id
        return None

    async def read_item(self, org_id: UUID, item_id: UUID) -> WorkItem | None:
        """See `WorkStorageInterface.read_item`."""
        async with self._lock:
            row = self._tenant_row(org_id, item_id)
            return None if row is None else _strict(row)

    async def read_items(self, org_id: UUID, item_ids: Sequence[UUID]) -> list[WorkItem]:
        """See `WorkStorageInterface.read_items`."""
        async with self._lock:
            rows = (self._tenant_row(org_id, i) for i in dict.fromkeys(item_ids))
            return [_strict(r) for r in rows if r is not None]

    async def write_item(
        self,
        org_id: UUID,
        item: WorkItem,
        claim_token: UUID,
        *,
        available_in: float | None = None,
        lease_for: float | None = None,
        dead_letter: str | None = None,
    ) -> WorkItem:
        """See `WorkStorageInterface.write_item`: fenced on the claim token and the lease."""
        async with self._lock:
            row = self._tenant_row(org_id, item.id)
            if row is None:
                raise NotFound(f"item_id: no work item {item.id}")
            now = self._clock()
            if row.status is WorkStatus.CANCELLED and row.claim_token == claim_token:
                raise ItemCancelled(item.id)
            if (
                row.claim_token != claim_token
                or row.status is not WorkStatus.CLAIMED
                or row.lease_expires_at is None
                or row.lease_expires_at <= now
            ):
                raise Conflict(f"claim_token: work item {item.id} is no longer held under it")
            written = row.model_copy(
                update={
                    "status": item.status,
                    "attempts": item.attempts,
                    "claimed_by": item.claimed_by,
                    "claim_token": item.claim_token,
                    "claimed_at": item.claimed_at,
                    "lease_expires_at": (
                        item.lease_expires_at if lease_for is None else self._after(lease_for)
                    ),
                    "last_error": item.last_error,
                    "note": item.note,
                    "available_at": (
                        item.available_at if available_in is None else self._after(available_in)
                    ),
                    "completed_at": (
                        now if item.status is WorkStatus.COMPLETED else item.completed_at
                    ),
                    "updated_by": item.updated_by,
                    "updated_at": now,
                }
            )
            self._rows[item.id] = written
            if dead_letter is not None:
                self._owed[item.id] = (claim_token, dead_letter)
            return written.model_copy(deep=True)

    async def complete_items(self, claims: Sequence[tuple[UUID, UUID, UUID]]) -> set[UUID]:
        """See `WorkStorageInterface.complete_items`: each triple fenced as `write_item` is."""
        async with self._lock:
            now = self._clock()
            done: set[UUID] = set()
            for org_id, item_id, claim_token in claims:
                row = self._tenant_row(org_id, item_id)
                if (
                    row is None
                    or row.claim_token != claim_token
                    or row.status is not WorkStatus.CLAIMED
                    or row.lease_expires_at is None
                    or row.lease_expires_at <= now
                ):
                    continue
                self._rows[item_id] = row.model_copy(
                    update={
                        "status": WorkStatus.COMPLETED,
                        "claimed_by": None,
                        "claim_token": None,
                        "claimed_at": None,
                        "lease_expires_at": None,
                        "completed_at": now,
                        "updated_at": now,
                        "updated_by": EMPTY_UUID,
                    }
                )
                done.add(item_id)
            return done

    async def claim_next(
        self,
        lane: str,
        kinds: Sequence[WorkKind],
        worker_id: str,
        lease: float,
        *,
        limit: int = 1,
    ) -> WorkRows:
        """Claim up to `limit` due items across tenants (tenant-less: see the interface).

        The memory table has no tenant fence to open; like the SQL storages it reads
        every tenant's rows and returns each with its `org_id`.
        """
        async with self._lock:
            now = self._clock()
            # Each due row's turn is its place in its tenant's claim order; turns first,
            # tenants at one turn in random order; one slot, the next tenant's turn
            # (docs/decisions/0037, 0056).
            by_tenant: dict[UUID, list[WorkItem]] = {}
            for r in self._rows.values():
                if (
                    r.lane == lane
                    and lane not in self._pauses
                    and r.kind in kinds
                    and is_claimable(r, now)
                ):
                    by_tenant.setdefault(r.org_id, []).append(r)
            if limit == 1 and by_tenant:
                # The first due tenant after the last one a one-slot claim took, wrapping.
                after = self._one_slot_turns.after(lane)
                tenant = min(by_tenant, key=lambda org_id: (org_id <= after, org_id))
                by_tenant = {tenant: by_tenant[tenant]}
                self._one_slot_turns.took(lane, limit, [{"org_id": tenant}])
            turns: list[tuple[int, float, WorkItem]] = []
            for rows in by_tenant.values():
                shuffle = random.random()
                for turn, r in enumerate(sorted(rows, key=claim_order)):
                    turns.append((turn, shuffle, r))
            turns.sort(key=lambda entry: entry[:2])
            due = [r for _, _, r in turns]
            claimed = WorkRows()
            for row in due[: max(limit, 0)]:
                token = uuid4()
                taken = row.model_copy(
                    update={
                        "status": WorkStatus.CLAIMED,
                        "attempts": row.attempts + 1,
                        "claimed_by": worker_id,
                        "claim_token": token,
                        "claimed_at": now,
                        "lease_expires_at": now + timedelta(seconds=lease),
                        "note": None,
                        "updated_at": now,
                        "updated_by": EMPTY_UUID,
                    }
                )
                found = _read(taken)
                if isinstance(found, UnreadableRow):
                    dead = taken.model_copy(
                        update={
                            "status": WorkStatus.FAILED,
                            "claimed_by": None,
                            "claim_token": None,
                            "claimed_at": None,
                            "lease_expires_at": None,
                            "last_error": f"{UNREADABLE}: {found.problem}"[:2000],
                        }
                    )
                    self._rows[row.id] = dead
                    self._owed[row.id] = (token, "unreadable")
                    (written,) = _rows([dead]).unreadable
                    claimed.unreadable.append(written)
                    continue
                self._rows[row.id] = taken
                claimed.append(found.model_copy(deep=True))
            return claimed

    async def requeue_stale(self, org_id: UUID, before: datetime | None, limit: int) -> WorkRows:
        """See `WorkStorageInterface.requeue_stale`: `rules.is_stale` applied under the lock."""
        async with self._lock:
            now = self._clock()
            cutoff = now if before is None else before
            stale = sorted(
                (r for r in self._rows.values() if r.org_id == org_id and is_stale(r, cutoff)),
                key=lambda r: (r.lease_expires_at or now, r.id),
            )
            moved: list[WorkItem] = []
            for row in stale[: max(limit, 0)]:
                final = is_exhausted(row.attempts, row.max_attempts)
                if final and row.claim_token is not None:
                    self._owed[row.id] = (row.claim_token, "lease")
                written = row.model_copy(
                    update={
                        "status": WorkStatus.FAILED if final else WorkStatus.AVAILABLE,
                        "available_at": row.available_at if final else now,
                        "last_error": LEASE_EXPIRED_FINAL if final else row.last_error,
                        "note": LEASE_EXPIRED,
                        "claimed_by": None,
                        "claim_token": None,
                        "claimed_at": None,
                        "lease_expires_at": None,
                        "updated_at": now,
                        "updated_by": EMPTY_UUID,
                    }
                )
                self._rows[row.id] = written
                moved.append(written)
            return _rows(moved)

    async def list_items(
        self,
        org_id: UUID,
        *,
        status: WorkStatus | None = None,
        kind: WorkKind | None = None,
        lane: str | None = None,
        after: tuple[datetime, UUID] | None = None,
        limit: int = 50,
    ) -> WorkRows:
        """See `WorkStorageInterface.list_items`."""
        async with self._lock:
            rows = [
                r
                for r in self._rows.values()
                if r.org_id == org_id
                and r.deleted_at is None
                and (status is None or r.status is status)
                and (kind is None or r.kind is kind)
                and (lane is None or r.lane == lane)
                and (after is None or _past(r, after))
            ]
            rows.sort(key=lambda r: r.id)
            rows.sort(key=lambda r: r.created_at, reverse=True)
            return _rows(rows[: max(limit, 0)])

    async def _operator_write(
        self,
        org_id: UUID,
        item_id: UUID,
        changes: dict[str, object],
        *,
        needs_object_payload: bool = False,
    ) -> WorkItem | None:
        """Change a live `FAILED` row; `UnreadableItem`, changing nothing, for one that does
        not validate; None for one the SQL table's `payload` check would refuse the change."""
        async with self._lock:
            row = self._tenant_row(org_id, item_id)
            if row is None or row.status is not WorkStatus.FAILED or row.deleted_at is not None:
                return None
            if needs_object_payload and not _is_object(row.payload):
                return None
            changes = {**changes, "updated_at": self._clock(), "updated_by": EMPTY_UUID}
            written = _strict(row.model_copy(update=changes))
            self._rows[item_id] = written
            return written.model_copy(deep=True)

    async def revive_item(
        self, org_id: UUID, item_id: UUID, *, payload: dict[str, Any] | None = None
    ) -> WorkItem | None:
        """See `WorkStorageInterface.revive_item`."""
        changes: dict[str, object] = {
            "status": WorkStatus.AVAILABLE,
            "attempts": 0,
            "available_at": self._clock(),
            "completed_at": None,
            "note": "replayed",
        }
        if payload is not None:
            changes["payload"] = dict(payload)
        return await self._operator_write(
            org_id, item_id, changes, needs_object_payload=payload is None
        )

    async def cancel_item(self, org_id: UUID, item_id: UUID) -> WorkItem | None:
        """See `WorkStorageInterface.cancel_item` (no wake-ups of its own)."""
        async with self._lock:
            row = self._tenant_row(org_id, item_id)
            waiting = (WorkStatus.AVAILABLE, WorkStatus.CLAIMED)
            if row is None or row.status not in waiting or row.deleted_at is not None:
                return None
            changes = {
                "status": WorkStatus.CANCELLED,
                "note": "cancelled",
                "lease_expires_at": None,
                "updated_at": self._clock(),
                "updated_by": EMPTY_UUID,
            }
            written = _strict(row.model_copy(update=changes))
            self._rows[item_id] = written
            return written.model_copy(deep=True)

    async def discard_item(self, org_id: UUID, item_id: UUID) -> WorkItem | None:
        """See `WorkStorageInterface.discard_item`."""
        return await self._operator_write(
            org_id, item_id, {"deleted_at": self._clock(), "note": "discarded"}
        )

    async def move_lane(
        self, org_id: UUID, *, from_lane: str, to_lane: str, kind: str | None = None
    ) -> list[tuple[UUID, str]]:
        """See `WorkStorageInterface.move_lane` (no wake-ups of its own)."""
        async with self._lock:
            moved: list[tuple[UUID, str]] = []
            for row in self._rows.values():
                if (
                    row.org_id == org_id
                    and row.lane == from_lane
                    and row.status == WorkStatus.AVAILABLE
                    and row.deleted_at is None
                    and (kind is None or str(row.kind) == kind)
                ):
                    moved.append((row.id, str(row.kind)))
            for item_id, _ in moved:
                self._rows[item_id] = self._rows[item_id].model_copy(
                    update={
                        "lane": to_lane,
                        "note": f"{LANE_MOVED} {from_lane}",
                        "updated_at": self._clock(),
                        "updated_by": EMPTY_UUID,
                    }
                )
            return moved

    async def discard_unknown_kind(self, org_id: UUID, item_id: UUID) -> UnreadableRow | None:
        """See `WorkStorageInterface.discard_unknown_kind`."""
        async with self._lock:
            row = self._tenant_row(org_id, item_id)
            known = {kind.value for kind in WorkKind}
            if (
                row is None
                or str(row.kind) in known
                or row.status == WorkStatus.CLAIMED
                or row.deleted_at is not None
            ):
                return None
            now = self._clock()
            changes = {"deleted_at": now, "note": "discarded", "updated_at": now}
            written = row.model_copy(update=changes | {"updated_by": EMPTY_UUID})
            self._rows[item_id] = written
            found = _read(written)
            return found if isinstance(found, UnreadableRow) else None

    async def purge_deleted(self, org_id: UUID, older_than: float) -> int:
        """See `WorkStorageInterface.purge_deleted`."""
        async with self._lock:
            cutoff = self._after(-older_than)
            doomed = [
                r.id
                for r in self._rows.values()
                if r.org_id == org_id and r.deleted_at is not None and r.deleted_at < cutoff
            ]
            for item_id in doomed:
                del self._rows[item_id]
                self._owed.pop(item_id, None)
            return len(doomed)

    async def purge_completed(self, org_id: UUID, older_than: float, limit: int) -> int:
        """See `WorkStorageInterface.purge_completed`."""
        async with self._lock:
            cutoff = self._after(-older_than)
            done = sorted(
                (
                    r
                    for r in self._rows.values()
                    if r.org_id == org_id
                    and r.status is WorkStatus.COMPLETED
                    and r.completed_at is not None
                    and r.completed_at < cutoff
                ),
                key=lambda r: (r.completed_at or cutoff, r.id),
            )
            doomed = [r.id for r in done[: max(limit, 0)]]
            for item_id in doomed:
                del self._rows[item_id]
                self._owed.pop(item_id, None)
            return len(doomed)

    async def purge_cancelled(self, org_id: UUID, older_than: float, limit: int) -> int:
        """See `WorkStorageInterface.purge_cancelled`."""
        async with self._lock:
            cutoff = self._after(-older_than)
            done = sorted(
                (
                    r
                    for r in self._rows.values()
                    if r.org_id == org_id
                    and r.status is WorkStatus.CANCELLED
                    and r.updated_at < cutoff
                ),
                key=lambda r: (r.updated_at, r.id),
            )
            doomed = [r.id for r in done[: max(limit, 0)]]
            for item_id in doomed:
                del self._rows[item_id]
            return len(doomed)

    async def pause_lane(
        self, org_id: UUID, lane: str, *, paused_by: str, reason: str | None
    ) -> tuple[LanePause, bool]:
        """See `WorkStorageInterface.pause_lane` (no scope to check: one process's rows)."""
        async with self._lock:
            if lane in self._pauses:
                return self._pauses[lane], False
            pause = LanePause(
                lane=lane, paused_at=self._clock(), paused_by=paused_by, reason=reason
            )
            self._pauses[lane] = pause
            return pause, True

    async def resume_lane(self, org_id: UUID, lane: str) -> LanePause | None:
        """See `WorkStorageInterface.resume_lane`."""
        async with self._lock:
            return self._pauses.pop(lane, None)

    async def paused_lanes(self, org_id: UUID) -> list[LanePause]:
        """See `WorkStorageInterface.paused_lanes`."""
        async with self._lock:
            return [self._pauses[lane] for lane in sorted(self._pauses)]

    async def holders(self, org_id: UUID) -> dict[str, int]:
        """See `WorkStorageInterface.holders`."""
        async with self._lock:
            now = self._clock()
            held: dict[str, int] = {}
            for r in self._rows.values():
                if (
                    r.status is WorkStatus.CLAIMED
                    and r.claimed_by is not None
                    and r.lease_expires_at is not None
                    and r.lease_expires_at > now
                    and org_id in (EMPTY_UUID, r.org_id)
                ):
                    held[r.claimed_by] = held.get(r.claimed_by, 0) + 1
            return dict(sorted(held.items()))

    async def beat_worker(
        self,
        org_id: UUID,
        worker_id: str,
        *,
        worker: str,
        lane: str,
        kinds: Sequence[str],
        ttl_s: float,
    ) -> None:
        """See `WorkStorageInterface.beat_worker`."""
        async with self._lock:
            now = self._clock()
            stood = self._roster.get(worker_id)
            self._roster[worker_id] = WorkerBeat(
                worker_id=worker_id,
                worker=worker,
                lane=lane,
                kinds=tuple(kinds),
                started_at=now if stood is None else stood.started_at,
                beat_at=now,
                expires_at=now + timedelta(seconds=ttl_s),
            )

    async def drop_worker(self, org_id: UUID, worker_id: str) -> bool:
        """See `WorkStorageInterface.drop_worker`."""
        async with self._lock:
            return self._roster.pop(worker_id, None) is not None

    async def prune_workers(self, org_id: UUID, expired_for_s: float) -> int:
        """See `WorkStorageInterface.prune_workers`."""
        async with self._lock:
            cutoff = self._after(-expired_for_s)
            gone = [w for w, row in self._roster.items() if row.expires_at < cutoff]
            for worker_id in gone:
                del self._roster[worker_id]
            return len(gone)

    async def alive_workers(self, org_id: UUID) -> list[WorkerBeat]:
        """See `WorkStorageInterface.alive_workers`."""
        async with self._lock:
            now = self._clock()
            return [row for _, row in sorted(self._roster.items()) if row.expires_at > now]

    async def oldest_snapshot(self, org_id: UUID) -> OldestSnapshot | None:
        """See `WorkStorageInterface.oldest_snapshot`: None, nothing to vacuum."""
        return None

    async def recent_outcomes(
        self, org_id: UUID, *, window_s: float, buckets: int
    ) -> list[tuple[int, int]]:
        """See `WorkStorageInterface.recent_outcomes`."""
        size = window_s / buckets
        counts = [[0, 0] for _ in range(buckets)]
        async with self._lock:
            now = self._clock()
            for r in self._rows.values():
                if r.org_id != org_id:
                    continue
                if r.status is WorkStatus.COMPLETED and r.completed_at is not None:
                    at, series = r.completed_at, 0
                elif r.status is WorkStatus.FAILED and r.deleted_at is None:
                    at, series = r.updated_at, 1
                else:
                    continue
                age = (now - at).total_seconds()
                if 0 <= age < window_s:
                    counts[buckets - 1 - int(age // size)][series] += 1
        return [(done, dead) for done, dead in counts]

    async def queue_stats(self, org_id: UUID) -> list[LaneStats]:
        """See `WorkStorageInterface.queue_stats`."""
        async with self._lock:
            now = self._clock()
            counts: dict[tuple[str, str, WorkStatus], int] = {}
            oldest: dict[tuple[str, str, WorkStatus], datetime] = {}
            owed: dict[tuple[str, str, WorkStatus], int] = {}
            for r in self._rows.values():
                live = r.status in (WorkStatus.AVAILABLE, WorkStatus.CLAIMED)
                in_play = live or r.id in self._owed
                if in_play and r.deleted_at is None and org_id in (EMPTY_UUID, r.org_id):
                    key = (r.lane, str(r.kind), r.status)
                    counts[key] = counts.get(key, 0) + 1
                    oldest[key] = min(oldest.get(key, r.available_at), r.available_at)
                    owed[key] = owed.get(key, 0) + (r.id in self._owed)
            return [
                LaneStats(
                    lane=lane,
                    kind=kind,
                    status=status,
                    count=n,
                    oldest_available_age=(
                        max((now - oldest[lane, kind, status]).total_seconds(), 0.0)
                        if status == WorkStatus.AVAILABLE
                        else None
                    ),
                    audit_owed=owed[lane, kind, status],
                )
                for (lane, kind, status), n in sorted(counts.items())
            ]

    async def owed_audits(
        self, org_id: UUID, *, limit: int, item_ids: Sequence[UUID] | None = None
    ) -> list[OwedAudit]:
        """See `WorkStorageInterface.owed_audits`."""
        async with self._lock:
            wanted = None if item_ids is None else set(item_ids)
            rows = sorted(
                (
                    self._rows[item_id]
                    for item_id in self._owed
                    if self._rows[item_id].org_id == org_id
                    and (wanted is None or item_id in wanted)
                ),
                key=lambda r: (r.updated_at, r.id),
            )
            return [
                OwedAudit(
                    id=r.id,
                    org_id=r.org_id,
                    kind=str(r.kind),
                    lane=r.lane,
                    attempts=r.attempts,
                    last_error=r.last_error,
                    reason=self._owed[r.id][1],
                    token=self._owed[r.id][0],
                )
                for r in rows[: max(limit, 0)]
            ]

    async def settle_audit(self, org_id: UUID, item_id: UUID, token: UUID) -> bool:
        """See `WorkStorageInterface.settle_audit`."""
        async with self._lock:
            row = self._tenant_row(org_id, item_id)
            if row is None or self._owed.get(item_id, (None, ""))[0] != token:
                return False
            del self._owed[item_id]
            return True


def _past(row: WorkItem, after: tuple[datetime, UUID]) -> bool:
    """Whether `row` comes after the cursor `after` in `list_items`' order."""
    created_at, item_id = after
    return row.created_at < created_at or (row.created_at == created_at and row.id > item_id)
