"""The work item: one unit of work in the table-backed queue, its statuses and its kinds.

The kinds live in `types/kinds.py`, a module the host patcher owns: it is never rendered
by copier, and each worker that adds a kind inserts one entry into each of its three
parts. Its exact shape:

    from enum import StrEnum
    from pydantic import BaseModel
    from .payloads.notify_shipment import NotifyShipmentPayload
    from .policy import KindPolicy

    class WorkKind(StrEnum):
        NOTIFY_SHIPMENT = "NOTIFY_SHIPMENT"

    WORK_PAYLOADS: dict[WorkKind, type[BaseModel]] = {
        WorkKind.NOTIFY_SHIPMENT: NotifyShipmentPayload,
    }
    WORK_POLICIES: dict[WorkKind, KindPolicy] = {
        WorkKind.NOTIFY_SHIPMENT: KindPolicy(),
    }

`WorkKind`, `WORK_PAYLOADS` and `WORK_POLICIES` are re-exported here, so the work
types import from one module.

A row the worker cannot read as a `WorkItem` (a column the model refuses: a payload that is
not a JSON object, a kind no `WorkKind` names, ...) is an `UnreadableRow`: the storage
reports it beside the items it could read (`WorkRows.unreadable`) and never lets it stop
them; reading it alone raises `UnreadableItem`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Self
from uuid import UUID, uuid4

from pydantic import BaseModel, Field, ValidationError

from acme.om.errors import Conflict, Invalid, OmError
from acme.om.types import EMPTY_UUID, Identifiable, Trackable

from .kinds import WORK_PAYLOADS, WORK_POLICIES, WorkKind
from .policy import PRIORITY_AGING_S, PRIORITY_MAX, PRIORITY_MIN

__all__ = [
    "PRIORITY_AGING_S",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "WORK_PAYLOADS",
    "WORK_POLICIES",
    "ItemCancelled",
    "LaneStats",
    "UnreadableItem",
    "UnreadableRow",
    "WorkItem",
    "WorkKind",
    "WorkRows",
    "WorkStatus",
    "checked_delay",
    "checked_priority",
    "claim_order",
    "read_row",
]


class WorkStatus(StrEnum):
    """Where a work item stands.

    `AVAILABLE`: waiting to be claimed once `available_at` has passed. `CLAIMED`: one
    worker holds it under a lease and a claim token. `COMPLETED`: done, final.
    `FAILED`: the dead letter, final until an operator replays it. `CANCELLED`: an operator
    cancelled it, final; a cancelled claimed row keeps the token it was held under, so its
    holder tells the cancel from a lost claim (`ItemCancelled`).
    """

    AVAILABLE = "AVAILABLE"
    CLAIMED = "CLAIMED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class WorkItem(Identifiable, Trackable):
    """One row of `work_items`, the work queue.

    Times are timezone-aware UTC. `attempts` counts the claims spent (an attempt is
    spent at claim and given back by release and defer); `max_attempts` caps it.
    `claim_token` is minted by every claim and fences every later write on the row:
    a write carrying any other token is refused. `lease_expires_at` is when the holder's
    lease passes and the sweep may hand the item back. `request_id` and `traceparent`
    name the request that caused the work, so its spans link to that trace.
    `note` says why the item was last handed back; `last_error` why it last failed.
    `priority` orders a tenant's due items (`PRIORITY_AGING_S`, `claim_order`).
    """

    org_id: UUID
    kind: WorkKind
    lane: str = "default"
    payload: dict[str, Any]
    status: WorkStatus = WorkStatus.AVAILABLE
    attempts: int = Field(default=0, ge=0)
    max_attempts: int = Field(default=5, ge=1)
    available_at: datetime
    claimed_by: str | None = None
    claim_token: UUID | None = None
    claimed_at: datetime | None = None
    lease_expires_at: datetime | None = None
    last_error: str | None = None
    note: str | None = None
    idempotency_key: str | None = None
    request_id: UUID | None = None
    traceparent: str | None = None
    completed_at: datetime | None = None
    priority: int = 0

    @classmethod
    def new(
        cls,
        *,
        org_id: UUID,
        kind: WorkKind,
        payload: BaseModel | Mapping[str, Any],
        lane: str | None = None,
        delay: float = 0.0,
        idempotency_key: str | None = None,
        priority: int | None = None,
    ) -> Self:
        """Build an item for `WorkManagerInterface.enqueue`.

        `payload` is the kind's payload model or its JSON form; `lane` defaults to the
        kind's policy lane, `max_attempts` comes from the kind's policy; `delay` (seconds,
        at least 0) postpones the first claim, and the storage anchors it on the database
        clock; `priority` defaults to the kind's policy priority. The actor, request id and
        trace context are stamped by the manager.

        Raises `Invalid` for a `delay` that is not a finite number or reaches past the year
        9999 (`checked_delay`), or a `priority` out of its range (`checked_priority`).
        """
        policy = WORK_POLICIES[kind]
        now = datetime.now(UTC)
        available_at = now + timedelta(seconds=checked_delay(delay, now))
        # Dumped without the serializer's warnings: the manager's validation names the field.
        body = (
            payload.model_dump(mode="json", warnings=False)
            if isinstance(payload, BaseModel)
            else dict(payload)
        )
        return cls(
            id=uuid4(),
            org_id=org_id,
            kind=kind,
            lane=lane or policy.lane,
            payload=body,
            max_attempts=policy.max_attempts,
            available_at=available_at,
            idempotency_key=idempotency_key,
            priority=checked_priority(policy.priority if priority is None else priority),
            created_at=now,
            updated_at=now,
            created_by=EMPTY_UUID,
            updated_by=EMPTY_UUID,
        )

    @property
    def delay(self) -> float:
        """Seconds between construction and first availability (never negative)."""
        return max((self.available_at - self.created_at).total_seconds(), 0.0)


class LaneStats(BaseModel):
    """How many items of one kind stand in one status on one lane (operator view).

    Only the items in play are counted: `AVAILABLE`, `CLAIMED`, and `FAILED` ones whose
    audit entry is still owed (so a `FAILED` group's `count` equals its `audit_owed`);
    completed items and audited dead letters are history, never read for these counts.

    `oldest_available_age` is set on the `AVAILABLE` group only (None on the others): the
    seconds since its oldest item became due, measured on the storage's clock (the
    database's, never the caller's), 0.0 when none of its items is due yet. A growing age
    says the lane's workers fall behind even when the count looks small. `audit_owed` is
    how many of the group's items are dead letters whose `work.dead_lettered` audit entry
    is not written yet (the sweep writes it; the template's docs/guarantees.md §5).
    """

    lane: str
    kind: str
    status: WorkStatus
    count: int
    oldest_available_age: float | None = None
    audit_owed: int = 0


@dataclass(frozen=True)
class UnreadableRow:
    """A `work_items` row that does not validate as a `WorkItem`.

    `column` names the first column the model refuses (`payload`, `kind`, ...) and `reason`
    says why, in the model's words (`Input should be a valid dictionary`); when more columns
    are refused, `reason` ends by counting them. `values` holds every column as the storage
    read it (times as aware datetimes, ids as UUIDs, the payload as JSON values), so an
    operator can see the row; the text views (`text`, `kind`, `status`) never raise.
    """

    id: UUID
    org_id: UUID
    column: str
    reason: str
    values: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, values: Mapping[Any, Any], error: ValidationError) -> UnreadableRow:
        """The row `values`, which `WorkItem` refused with `error`; raises `ValueError` when
        even its `id` or `org_id` is not a UUID (nothing could then name it)."""
        problems = error.errors()
        first = problems[0]
        column = ".".join(str(part) for part in first["loc"]) or "row"
        reason = str(first["msg"])
        if len(problems) > 1:
            reason += f" (and {len(problems) - 1} more column(s))"
        return cls(
            id=_uuid(values.get("id")),
            org_id=_uuid(values.get("org_id")),
            column=column,
            reason=reason,
            values=dict(values),
        )

    @property
    def problem(self) -> str:
        """`<column>: <reason>`, e.g. `payload: Input should be a valid dictionary`."""
        return f"{self.column}: {self.reason}"

    def text(self, name: str) -> str:
        """Column `name` as text (`''` for NULL or a missing column)."""
        value = self.values.get(name)
        return "" if value is None else str(value)

    @property
    def kind(self) -> str:
        """The stored kind, whether or not a `WorkKind` names it."""
        return self.text("kind")

    @property
    def status(self) -> str:
        """The stored status."""
        return self.text("status")


class WorkRows(list[WorkItem]):
    """Rows a storage read or moved, as a list of the `WorkItem`s among them, in the
    statement's order; `unreadable` holds the rows that did not validate (`UnreadableRow`),
    so one bad row never hides or stops the others."""

    def __init__(
        self, items: Iterable[WorkItem] = (), unreadable: Iterable[UnreadableRow] = ()
    ) -> None:
        super().__init__(items)
        self.unreadable: list[UnreadableRow] = list(unreadable)


class UnreadableItem(OmError):
    """The one item asked for is a row the worker cannot read; `row` is that row.

    The message names the column first, then the item and why:
    `payload: work item <id> cannot be read (Input should be a valid dictionary)`.
    """

    def __init__(self, row: UnreadableRow) -> None:
        super().__init__(f"{row.column}: work item {row.id} cannot be read ({row.reason})")
        self.row = row


class ItemCancelled(Conflict):
    """A holder's write refused because an operator cancelled the item it holds: the row is
    `CANCELLED` under the very claim token the write carried. A `Conflict` (the write did
    not land), but no lost claim: the holder stops its handler and writes nothing more
    (the template's docs/guarantees.md, "Cancelling an item")."""

    def __init__(self, item_id: UUID) -> None:
        super().__init__(f"status: work item {item_id} was cancelled while held")
        self.item_id = item_id


def read_row(values: Mapping[Any, Any]) -> WorkItem | UnreadableRow:
    """The row `values` (column name to value) as a `WorkItem`, or as an `UnreadableRow`
    naming the column the model refuses. Raises `ValueError` only when the row's `id` or
    `org_id` is not a UUID."""
    try:
        return WorkItem.model_validate(dict(values))
    except ValidationError as exc:
        return UnreadableRow.of(values, exc)


def checked_delay(delay: object, now: datetime) -> float:
    """`delay` (seconds) as a float of at least 0 (a negative one counts as 0). Raises
    `Invalid` naming `delay` when it is not a real number (a bool neither), is not finite,
    or puts `now` plus it past the year 9999."""
    if isinstance(delay, bool) or not isinstance(delay, int | float):
        raise Invalid(f"delay: must be a number of seconds, got {type(delay).__name__}")
    try:
        seconds = float(delay)
        if not math.isfinite(seconds):  # before the clamp: -inf is no more a delay than nan
            raise Invalid(f"delay: {delay!r} is not a finite number of seconds")
        seconds = max(seconds, 0.0)
        now + timedelta(seconds=seconds)
    except OverflowError:
        raise Invalid(f"delay: {delay!r:.40} seconds reaches past the year 9999") from None
    return seconds


def checked_priority(priority: object) -> int:
    """`priority` as an int from `PRIORITY_MIN` to `PRIORITY_MAX`. Raises `Invalid` naming
    `priority` and the range otherwise (a bool is no priority)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise Invalid(
            f"priority: must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX},"
            f" got {type(priority).__name__}"
        )
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise Invalid(
            f"priority: {priority} is out of range; use an integer from {PRIORITY_MIN}"
            f" to {PRIORITY_MAX} (higher is claimed first)"
        )
    return priority


def claim_order(item: WorkItem) -> tuple[datetime, UUID]:
    """Where `item` stands in its tenant's claim order: `available_at` less its priority's
    head start (`PRIORITY_AGING_S` per level), then `id`; the claim index's order."""
    return item.available_at - timedelta(seconds=PRIORITY_AGING_S * item.priority), item.id


def _uuid(value: object) -> UUID:
    return value if isinstance(value, UUID) else UUID(str(value))
