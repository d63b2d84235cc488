"""The work queue's storage interface."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, ClassVar
from uuid import UUID, uuid4

from acme.om.work.types.lanes import LanePause, WorkerBeat
from acme.om.work.types.schedules import ScheduleState
from acme.om.work.types.work_item import (
    LaneStats,
    UnreadableRow,
    WorkItem,
    WorkKind,
    WorkRows,
    WorkStatus,
)

LEASE_EXPIRED = "lease expired"
"""The `note` the sweep leaves on every item it hands back."""

LEASE_EXPIRED_FINAL = "lease expired on the last attempt"
"""The `last_error` the sweep leaves on an item it dead-letters."""

LANE_MOVED = "lane moved from"
"""How the `note` of an item an operator moved to another lane begins: `lane moved from
<lane>`."""

UNREADABLE = "unreadable row"
"""How the `last_error` of a row dead-lettered because it cannot be read begins:
`unreadable row: <column>: <reason>`."""

CANCEL_NOTE = "cancel:"
"""How the kind of a wake-up that names a cancelled item begins: `cancel:<item id>`, sent on
the item's lane over the channels that carry wake-ups (no `WorkKind` can spell it, so a
worker that does not know it ignores it; docs/decisions/0038 in the worker template)."""

WAKE_UP_CHANNEL = "work_available"
"""The PostgreSQL NOTIFY channel every insert of due items notifies: `<lane> <kind>`."""

WakeUps = AbstractAsyncContextManager[AsyncIterator[tuple[str, str]]]
"""A subscription to the storage's own wake-ups: `(lane, kind)` of newly due items."""


@dataclass(frozen=True)
class Created:
    """What an insert reports: the id of the row that holds the item, and whether it is new.

    `created` is False when a row with the same id, or the same `idempotency_key` in the
    same tenant, already stood; `id` is then that row's id, and the row is untouched.
    `row` is that row as stored (the inserted item with the storage's `available_at`, or
    the row that already stood, read in the insert's own session, so an enqueue is one
    transaction), or None when the id is held by a row of another tenant, which the tenant
    cannot see. Two results compare by `id` and `created` only.
    """

    id: UUID
    created: bool
    row: WorkItem | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class NewItems:
    """Items of one kind, lane, enqueuer and request, as the bulk enqueue hands them to the
    storage: columns, not a `WorkItem` each (`WorkManagerInterface.enqueue_bulk`).

    Item n has id `ids[n]` and payload `payloads[n]`, a JSON object as text, validated
    against the kind's model; every item is fresh (`AVAILABLE`, no attempt spent, no claim),
    created at `created_at` by `actor` (`updated_*` the same), available `delay` seconds
    (at least 0) after the storage clock's now, with `max_attempts`, `priority` (checked
    by the manager), the causing `request_id` and `traceparent`, and no idempotency key.
    """

    kind: WorkKind
    lane: str
    max_attempts: int
    delay: float
    created_at: datetime
    actor: UUID
    request_id: UUID | None
    traceparent: str | None
    ids: list[UUID]
    payloads: list[str]
    priority: int = 0

    def items(self, org_id: UUID) -> list[WorkItem]:
        """The same items as `WorkItem`s of tenant `org_id` (`available_at` from the
        caller's clock: the storage computes its own)."""
        return [
            WorkItem(
                id=item_id,
                org_id=org_id,
                kind=self.kind,
                lane=self.lane,
                payload=json.loads(payload),
                max_attempts=self.max_attempts,
                priority=self.priority,
                available_at=self.created_at + timedelta(seconds=self.delay),
                request_id=self.request_id,
                traceparent=self.traceparent,
                created_at=self.created_at,
                updated_at=self.created_at,
                created_by=self.actor,
                updated_by=self.actor,
            )
            for item_id, payload in zip(self.ids, self.payloads, strict=True)
        ]


@dataclass(frozen=True)
class OldestSnapshot:
    """The oldest snapshot another session of the queue's database holds (PostgreSQL).

    `xid_age`: transaction ids since it was taken, 0 when no session holds one; `xmin`: its
    `backend_xmin` as text (None when none is held), which stays the same for as long as
    that one snapshot is held, so a reader can time the hold.
    """

    database: str
    xid_age: int
    xmin: str | None


@dataclass(frozen=True)
class OwedAudit:
    """A dead letter whose `work.dead_lettered` audit entry is not written yet.

    The statement that made the row `FAILED` also recorded `token`, the claim token the
    item died under, and `reason` (`attempts`, `lease` or `unreadable`), so the entry can
    be written later, by any process, exactly once: `key` is its idempotency key, derived
    from the item and that claim, and a second write under it records nothing. The other
    fields are the row's columns as stored (`kind` as text: the row may not be readable).
    """

    id: UUID
    org_id: UUID
    kind: str
    lane: str
    attempts: int
    last_error: str | None
    reason: str
    token: UUID

    @property
    def key(self) -> str:
        """`<item id>:dead_lettered:<claim token>`: one entry per dead letter, however many
        processes write it."""
        return f"{self.id}:dead_lettered:{self.token}"


class OneSlotTurns:
    """Where a storage's one-slot claims stand in their round of each lane's due tenants:
    a claim of one item takes the first due tenant after the id `after` gives, wrapping
    round, and `took` records the tenant it took (docs/decisions/0056). Per storage, so
    each process serves the tenants in turn; its first one-slot claim on a lane starts
    after a random id."""

    def __init__(self) -> None:
        self._last: dict[str, UUID] = {}

    def after(self, lane: str) -> UUID:
        """The tenant id the next one-slot claim on `lane` starts after."""
        return self._last.get(lane) or uuid4()

    def took(self, lane: str, limit: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Record the tenant of `rows`, what a claim of `limit` items on `lane` took, when
        it was a one-slot claim that took one."""
        if limit == 1 and rows:
            found = rows[0]["org_id"]
            self._last[lane] = found if isinstance(found, UUID) else UUID(str(found))


class WorkStorageInterface(ABC):
    """All access to `work_items`; three implementations share one contract suite.

    Every method but `claim_next` takes the tenant and opens its session under it, so a
    row of another tenant is never found, written or moved. Times come from the storage's
    clock, never the caller's; durations are seconds. A conditional write that finds the
    row changed raises `Conflict`; one that finds no row of the tenant raises `NotFound`.

    A row that does not validate as a `WorkItem` never stops the others: the methods that
    return many rows return `WorkRows`, whose `unreadable` lists such rows
    (`UnreadableRow`, naming the column and why), and the methods about one item raise
    `UnreadableItem` for it. A dead letter records the audit entry it is owed
    (`OwedAudit`) in the statement that makes it, until `settle_audit` clears it.
    """

    backend: ClassVar[str]
    """The backend the rows live in (`postgresql`, `sqlite`, `memory`): a refusal names
    the reason that applies there (`rules.NUL_REFUSALS`)."""

    @abstractmethod
    async def create_item(self, org_id: UUID, item: WorkItem) -> Created:
        """Insert `item`, or report the row that already holds its id or idempotency key.

        The insert never touches an existing row and never raises on a duplicate
        (the template's docs/guarantees.md §9), so a retried enqueue cannot reset a claim.
        `available_at` is stored as the storage clock's now plus `item.delay`.
        """

    @abstractmethod
    async def create_items(self, org_id: UUID, items: Sequence[WorkItem]) -> list[Created]:
        """`create_item` for many items in one statement; one `Created` per item, in order.

        The insert is one prepared statement whatever the batch holds (each row's delay is
        a bound parameter the database adds to its clock), and the rows it did not insert
        are read back in the same transaction: one session per batch.
        """

    async def create_new(self, org_id: UUID, items: NewItems) -> set[UUID]:
        """Insert `items` in tenant `org_id` in one statement; the ids inserted (an id
        already stored is skipped and left out, its row untouched).

        This default inserts them as `WorkItem`s through `create_items`; a storage with a
        leaner statement for fresh rows of one kind overrides it (PostgreSQL binds two
        arrays, the ids and the payloads, and the rest once).
        """
        results = await self.create_items(org_id, items.items(org_id))
        return {result.id for result in results if result.created}

    @abstractmethod
    async def read_item(self, org_id: UUID, item_id: UUID) -> WorkItem | None:
        """The tenant's item, soft-deleted or not; None when the tenant has no such item.

        Raises `UnreadableItem` when the row does not validate as a `WorkItem`.
        """

    @abstractmethod
    async def read_items(self, org_id: UUID, item_ids: Sequence[UUID]) -> list[WorkItem]:
        """The tenant's items among `item_ids`, in no particular order."""

    @abstractmethod
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
        """Write a holder's outcome to the row, conditional on `claim_token` in the statement.

        Written: `status`, `attempts`, `claimed_by`, `claim_token`, `claimed_at`,
        `last_error`, `note`, `updated_by` from `item`; `updated_at` is the storage's now;
        `available_at` is now plus `available_in` seconds when given (else as on `item`);
        `lease_expires_at` is now plus `lease_for` seconds when given (else as on `item`);
        `completed_at` is now when `item.status` is `COMPLETED`. The write lands only on
        the tenant's row that is claimed under `claim_token` with its lease not yet passed
        (fencing: Kleppmann, "How to do distributed locking"). Returns the row as written.
        Raises `ItemCancelled` (a `Conflict`) when the row is `CANCELLED` under
        `claim_token` (an operator cancelled the item while it was held), `Conflict` when
        the row holds another token, another status or a passed lease (another holder, a
        sweep, or a lost lease), `NotFound` when the tenant has no row.
        `dead_letter` (the reason, with `item.status` `FAILED`) also records the audit
        entry the dead letter is owed, under `claim_token`, in the same statement
        (`owed_audits`).
        """

    @abstractmethod
    async def complete_items(self, claims: Sequence[tuple[UUID, UUID, UUID]]) -> set[UUID]:
        """Complete items held under their tokens, of any tenants, in one statement.

        `claims` is `(tenant id, item id, claim token)` triples. Each row is completed
        (`COMPLETED`, claim fields cleared, `completed_at` the storage's now) only where it
        is that tenant's, still `CLAIMED` under that very token, its lease not yet passed:
        `write_item`'s fence, checked per row, so a stale holder's write never lands
        (docs/decisions/0054; riverqueue/river's `JobSetStateIfRunningMany` batches alike).
        Returns the ids it completed; a missing id lost its claim (another holder, a sweep,
        a passed lease) or is not that tenant's, and its row is left as it stood.
        """

    def wake_ups(self) -> WakeUps | None:
        """The storage's own wake-ups, or None when it has none (memory, SQLite).

        Entering the context subscribes; the iterator yields `(lane, kind)` for every
        insert that committed due items of that lane and kind, and raises when the
        subscription is lost (the caller subscribes again). Never sent before the rows
        are visible: PostgreSQL delivers a NOTIFY at commit.
        """
        return None

    @abstractmethod
    async def claim_next(
        self,
        lane: str,
        kinds: Sequence[WorkKind],
        worker_id: str,
        lease: float,
        *,
        limit: int = 1,
    ) -> WorkRows:
        """Claim up to `limit` due items of `kinds` on `lane` for `worker_id`, in one statement.

        Tenant-less by design: a worker serves every tenant, and which tenant's item is
        due next is exactly what the claim finds out, so it reads across tenants and
        returns each row with its tenant (`org_id`), the one way the host's storage
        funnel (`acme.om.storage.funnel`) lets a statement cross them. It opens its
        session under the system scope, `EMPTY_UUID` passed explicitly to the funnel.
        Each claimed row spends an attempt, gets a fresh claim token, `claimed_by =
        worker_id`, and a lease of `lease` seconds from the storage's now, all in that
        statement. Only rows
        `rules.is_claimable` accepts are taken; concurrent claimers never receive the same
        row. A paused lane (`pause_lane`) yields nothing: the statement itself excludes the
        lanes `work_lane_pauses` lists at its snapshot. The order (docs/decisions/0036,
        0037): tenants share first, each due tenant's first item before any tenant's second
        (tenants at one turn in random order; a one-slot claim takes the next due tenant
        after the one the storage's last one-slot claim took, `OneSlotTurns`, so those
        serve the due tenants in turn), and a tenant's own items by `claim_order`
        (higher `priority` first, with aging, then the oldest `available_at`). A claim that
        leaves slots empty found no more due items.

        A claimed row that does not validate as a `WorkItem` is made a dead letter in the
        claim's own transaction, by an UPDATE fenced on the token the claim gave it:
        `FAILED`, claim fields cleared, the attempt spent, `last_error` `unreadable row:
        <column>: <reason>`, its audit entry owed with the reason `unreadable`. It is
        returned in `unreadable` (as written), never among the items; the other rows of the
        batch are claimed as usual.
        """

    @abstractmethod
    async def requeue_stale(self, org_id: UUID, before: datetime | None, limit: int) -> WorkRows:
        """Hand back the tenant's items whose lease passed before `before`; at most `limit`.

        One conditional statement: it selects the rows `rules.is_stale` accepts (with
        `before` None meaning the storage's now) and its UPDATE re-checks the status, the
        claim token it read and the lease, so a completion that lands meanwhile is never
        overwritten (riverqueue/river#1302). A row with an attempt left becomes
        `AVAILABLE` at once; a row out of attempts becomes `FAILED`, a dead letter
        (oban-bg/oban#137), owing its audit entry with the reason `lease` under the token it
        was read with. Either way its claim fields are cleared and `note` says the lease
        expired. Returns the moved rows as written; a moved row that does not validate is in
        `unreadable` (the count moved is both lists together).
        """

    @abstractmethod
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
        """The tenant's items that are not soft-deleted, newest first (`created_at`
        descending, then `id` ascending), at most `limit`.

        `after` is a keyset cursor, the `(created_at, id)` of the last row of the previous
        page: only rows past it in that order are read. `limit` counts rows, readable or
        not; the ones that do not validate are in `unreadable`, in the same order.
        """

    @abstractmethod
    async def revive_item(
        self, org_id: UUID, item_id: UUID, *, payload: dict[str, Any] | None = None
    ) -> WorkItem | None:
        """Make a failed item available again with its attempts reset (operator replay),
        its payload replaced by `payload` when given (a corrected replay; the caller has
        validated it against the kind's model).

        Conditional on the row being `FAILED` and not soft-deleted; None otherwise. A row
        that does not validate is left as it stood: `UnreadableItem`, or None when the
        table itself refuses it (a payload that is not a JSON object may stay only on a
        `FAILED` or `COMPLETED` row; a corrected payload replaces it).
        """

    @abstractmethod
    async def cancel_item(self, org_id: UUID, item_id: UUID) -> WorkItem | None:
        """Cancel the tenant's live `AVAILABLE` or `CLAIMED` item in one conditional UPDATE;
        the row as written, None when there is no such row (finished, discarded, unknown).

        `status` `CANCELLED`, `note` `cancelled`, `lease_expires_at` cleared, `updated_at`
        the storage's now (the purge measures its age from there), `updated_by`
        `EMPTY_UUID`. A claimed row keeps `claimed_by` and `claim_token`: no write fenced on
        that token lands any more (the fence wants `CLAIMED`), and the holder's refused
        write is told apart as `ItemCancelled`. The attempt spent is not given back. The
        workers of its lane are sent `(lane, cancel:<id>)` on the storage's own wake-ups in
        the same transaction (`CANCEL_NOTE`). A row that does not validate is put back as
        it stood: `UnreadableItem`.
        """

    @abstractmethod
    async def discard_item(self, org_id: UUID, item_id: UUID) -> WorkItem | None:
        """Soft-delete a failed item (`deleted_at` = now); None unless `FAILED` and live.

        Raises `UnreadableItem`, changing nothing, for a row that does not validate.
        """

    @abstractmethod
    async def move_lane(
        self, org_id: UUID, *, from_lane: str, to_lane: str, kind: str | None = None
    ) -> list[tuple[UUID, str]]:
        """Move the tenant's waiting items from `from_lane` to `to_lane` in one conditional
        UPDATE; `(id, stored kind)` of each row moved.

        Only live `AVAILABLE` rows of `from_lane` (of `kind`, as stored text, when given;
        readable or not) move: a claimed row is its holder's, a finished one history.
        Each moved row's `note` reads `lane moved from <from_lane>`, `updated_at` is the
        storage's now, `updated_by` `EMPTY_UUID`; the workers listening on `to_lane` are
        woken in the same transaction.
        """

    @abstractmethod
    async def discard_unknown_kind(self, org_id: UUID, item_id: UUID) -> UnreadableRow | None:
        """Soft-delete the tenant's live row whose kind no `WorkKind` names; the row as
        written, or None when there is no such row or it is `CLAIMED` (its holder's until the
        sweep hands it back). One conditional UPDATE: `deleted_at` and `updated_at` the
        storage's now, `note` `discarded`, whatever its status (the template's
        docs/guarantees.md section 11).
        """

    @abstractmethod
    async def purge_deleted(self, org_id: UUID, older_than: float) -> int:
        """Delete the tenant's rows soft-deleted more than `older_than` seconds ago; count."""

    @abstractmethod
    async def purge_completed(self, org_id: UUID, older_than: float, limit: int) -> int:
        """Delete the tenant's `COMPLETED` rows completed more than `older_than` seconds ago.

        One conditional statement: it deletes at most `limit` of them, oldest `completed_at`
        first, measuring the age on the storage's clock, and returns how many it deleted.
        Rows of any other status are never touched, dead letters (`FAILED`) included.
        """

    @abstractmethod
    async def purge_cancelled(self, org_id: UUID, older_than: float, limit: int) -> int:
        """Delete the tenant's `CANCELLED` rows cancelled (`updated_at`) more than
        `older_than` seconds ago on the storage's clock; at most `limit`, oldest first, in
        one conditional statement; how many it deleted. No other status is touched."""

    @abstractmethod
    async def queue_stats(self, org_id: UUID) -> list[LaneStats]:
        """Counts per lane, kind and status of the rows in play; `EMPTY_UUID` counts every
        tenant.

        The rows in play are the undeleted `AVAILABLE` and `CLAIMED` ones and the dead
        letters whose audit entry is still owed: a `FAILED` group counts only those, and no
        `COMPLETED` group is returned. The history is never read, so a call costs what the
        backlog holds (on PostgreSQL, through the partial indexes). Each `AVAILABLE` group
        carries `oldest_available_age`: seconds since its oldest row's `available_at`, on
        the storage's clock, never negative. Every group carries `audit_owed`: its rows
        whose dead-letter audit entry is still owed.
        """

    @abstractmethod
    async def recent_outcomes(
        self, org_id: UUID, *, window_s: float, buckets: int
    ) -> list[tuple[int, int]]:
        """The tenant's completions and dead letters of the last `window_s` seconds (on the
        storage's clock), counted in `buckets` equal slices, oldest slice first:
        `(completed, dead_lettered)` each.

        A completion counts by `completed_at`; a dead letter is a live `FAILED` row, by its
        `updated_at`. Only that window of the completed history is read (on PostgreSQL,
        `ix_work_items_completed` and `ix_work_items_dead_letters`).
        """

    @abstractmethod
    async def pause_lane(
        self, org_id: UUID, lane: str, *, paused_by: str, reason: str | None
    ) -> tuple[LanePause, bool]:
        """Pause `lane` for every tenant: from the commit on, no `claim_next` takes its items.

        One conditional insert into `work_lane_pauses` (`paused_at` the storage's now);
        returns the pause as stored and whether this call made it (False: the lane was
        paused already, and that pause is returned untouched). `org_id` is the session's
        scope only, `EMPTY_UUID`: the table is shared by every tenant, and on PostgreSQL
        its policy refuses any other scope a write (docs/decisions/0040).
        """

    @abstractmethod
    async def resume_lane(self, org_id: UUID, lane: str) -> LanePause | None:
        """Resume `lane`: delete its pause in one statement; the pause deleted, or None when
        the lane was not paused. `org_id` as for `pause_lane`. A resume inserts no item, so
        no insert notifies: the workers listening on the lane (every `WorkKind`) are woken
        in the same transaction, as `move_lane` wakes them."""

    @abstractmethod
    async def paused_lanes(self, org_id: UUID) -> list[LanePause]:
        """Every paused lane, by lane name; `org_id` is the session's scope (any tenant's
        session reads them all: a pause is every tenant's)."""

    @abstractmethod
    async def holders(self, org_id: UUID) -> dict[str, int]:
        """How many items each worker (`claimed_by`) holds with its lease not yet passed, on
        the storage's clock; `EMPTY_UUID` counts every tenant's items. Reads the claimed rows
        only (on PostgreSQL through `ix_work_items_claimed`)."""

    @abstractmethod
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
        """Record a beat of `worker_id` in the worker roster (`work_workers`,
        docs/decisions/0049): one upsert. A new row gets `started_at` the storage's now;
        every beat sets `worker`, `lane`, `kinds` (no space in any), `beat_at` the
        storage's now and `expires_at` `ttl_s` seconds later. `org_id` is the session's
        scope only, `EMPTY_UUID`: the roster has no tenant, and on PostgreSQL its policy
        refuses any other scope."""

    @abstractmethod
    async def drop_worker(self, org_id: UUID, worker_id: str) -> bool:
        """Delete `worker_id`'s roster row (its drain's last step); whether there was one.
        `org_id` as for `beat_worker`."""

    @abstractmethod
    async def prune_workers(self, org_id: UUID, expired_for_s: float) -> int:
        """Delete the roster rows whose `expires_at` passed more than `expired_for_s`
        seconds ago on the storage's clock (workers gone without a drain); how many, in one
        statement. `org_id` as for `beat_worker`."""

    @abstractmethod
    async def alive_workers(self, org_id: UUID) -> list[WorkerBeat]:
        """The roster rows whose `expires_at` has not passed on the storage's clock, by
        `worker_id`. `org_id` as for `beat_worker`."""

    @abstractmethod
    async def oldest_snapshot(self, org_id: UUID) -> OldestSnapshot | None:
        """The oldest snapshot of another session, which holds back the queue's cleanup.

        On PostgreSQL: the backend of this database with the oldest `backend_xmin`
        (`pg_stat_activity`, every role's sessions: a role without `pg_read_all_stats` still
        sees each one's `backend_xmin`, though not its times). None on storages without MVCC
        vacuum (SQLite, memory). `org_id` is the session's scope only (`EMPTY_UUID`): the
        horizon belongs to the whole database.
        """

    @abstractmethod
    async def owed_audits(
        self, org_id: UUID, *, limit: int, item_ids: Sequence[UUID] | None = None
    ) -> list[OwedAudit]:
        """The tenant's dead letters whose audit entry is still owed, at most `limit`.

        Oldest `updated_at` first; only the rows of `item_ids` when given. Reads the columns
        `OwedAudit` holds as they are stored, so a row that does not validate as a
        `WorkItem` is listed too.
        """

    @abstractmethod
    async def settle_audit(self, org_id: UUID, item_id: UUID, token: UUID) -> bool:
        """Record that the audit entry owed under `token` is written: one conditional
        statement, True when it cleared the debt, False when the row owes none under that
        token (another process settled it first, or the row is gone). `updated_at` is
        left as it was: the item itself does not change."""

    @abstractmethod
    async def schedule_states(self, org_id: UUID) -> list[ScheduleState]:
        """The tenant's schedule-state rows (`ScheduleState`), by schedule name."""

    async def schedule_ticks(self, org_id: UUID) -> dict[str, datetime]:
        """Each schedule's latest handled tick (aware UTC), by schedule (`<worker>:<name>`):
        the `tick_at` of `schedule_states`."""
        return {state.schedule: state.tick_at for state in await self.schedule_states(org_id)}

    @abstractmethod
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
        """Advance `schedule`'s state row from `previous` (None: no row yet) to `tick`, with
        `next_tick` as the tick after it, and, in the same transaction, insert `item` when
        given; True when this call advanced it.

        One conditional statement decides (an insert that does nothing on a row already
        there, or an update on `tick_at = previous`): of any number of calls from one
        `previous`, one advances the row and inserts its item, the rest write nothing and
        return False (docs/decisions/0034). The item is inserted as `create_items` would.
        """
