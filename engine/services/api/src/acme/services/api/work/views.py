"""The bodies and responses of the work routes: every one typed, so the OpenAPI is complete.

Text that came from a payload or a handler is data, never markup: the API returns it as
JSON strings and the dashboard sets it as text (docs/security.md, "The work API").
"""

import base64
import binascii
from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, Field

from acme.om.errors import Invalid
from acme.om.work.types.lanes import LanePause, QueueSummary, WorkerAlive
from acme.om.work.types.schedules import ScheduleState
from acme.om.work.types.work_item import LaneStats, WorkItem, WorkStatus

FRAME_PREFIXES = ("Traceback (most recent call last):", "  File ", "    ")


class ItemView(BaseModel):
    """A work item as the API shows it. `last_error` keeps its stack frames for admins
    only; a member sees its other lines (`without_frames`)."""

    id: UUID
    kind: str
    lane: str
    status: WorkStatus
    payload: dict[str, Any]
    attempts: int
    max_attempts: int
    available_at: datetime
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None
    last_error: str | None
    note: str | None
    idempotency_key: str | None
    priority: int

    @classmethod
    def of(cls, item: WorkItem, *, frames: bool) -> "ItemView":
        error = item.last_error
        if error is not None and not frames:
            error = without_frames(error)
        return cls(
            id=item.id,
            kind=item.kind.value,
            lane=item.lane,
            status=item.status,
            payload=item.payload,
            attempts=item.attempts,
            max_attempts=item.max_attempts,
            available_at=item.available_at,
            created_at=item.created_at,
            updated_at=item.updated_at,
            completed_at=item.completed_at,
            last_error=error,
            note=item.note,
            idempotency_key=item.idempotency_key,
            priority=item.priority,
        )


class ItemPage(BaseModel):
    """One page of a list, newest first; `next_cursor` asks for the next (None: the last)."""

    items: list[ItemView]
    next_cursor: str | None
    unreadable: int = Field(description="rows of this page that could not be read")


class Enqueued(BaseModel):
    """The ids a bulk enqueue inserted, in the order of its payloads."""

    ids: list[UUID]


class DeadLetterFilter(BaseModel):
    """Which dead letters a bulk replay or discard acts on; `dry_run` only counts them."""

    kind: str | None = None
    lane: str | None = None
    dry_run: bool = False


class FilterOutcome(BaseModel):
    """How many dead letters matched the filter, and whether they were acted on."""

    matched: int
    acted: int
    dry_run: bool


class PausedLane(BaseModel):
    """A paused lane as a tenant's members see it: since when and why, not who paused it
    (a platform operator's identity is the platform's, not the tenant's)."""

    lane: str
    paused_at: datetime
    reason: str | None

    @classmethod
    def of(cls, pause: LanePause) -> "PausedLane":
        return cls(lane=pause.lane, paused_at=pause.paused_at, reason=pause.reason)


class Summary(BaseModel):
    """Counts per lane, kind and status of the rows in play (`LaneStats`), the paused
    lanes (no worker claims their items, the tenant's included, until they are resumed),
    and whether the caller may enqueue, cancel, replay and discard (`can_write`: the admin
    role), so a page offers only what the caller may do."""

    lanes: list[LaneStats]
    paused: list[PausedLane]
    can_write: bool


class WorkerHolding(BaseModel):
    """A worker (`claimed_by`) holding items under a live lease, and how many."""

    worker: str
    items: int


class QueueOverview(BaseModel):
    """The queue across every tenant for a platform operator (`QueueSummary`): counts, the
    paused lanes with who paused them, the workers alive by name and id (their roster rows,
    docs/decisions/0049), the workers holding items, when it was read."""

    lanes: list[LaneStats]
    paused: list[LanePause]
    workers_alive: list[WorkerAlive]
    workers_holding: list[WorkerHolding]
    read_at: datetime

    @classmethod
    def of(cls, summary: QueueSummary) -> "QueueOverview":
        holding = sorted(summary.workers_holding.items(), key=lambda pair: (-pair[1], pair[0]))
        return cls(
            lanes=summary.groups,
            paused=summary.paused,
            workers_alive=sorted(summary.workers_alive, key=lambda w: (w.worker, w.worker_id)),
            workers_holding=[WorkerHolding(worker=w, items=n) for w, n in holding],
            read_at=summary.read_at,
        )


class LaneView(BaseModel):
    """One lane: whether the kinds module names it (`known`; only a known lane can be
    paused here) and its pause, None when workers claim on it."""

    lane: str
    known: bool
    pause: LanePause | None


class Lanes(BaseModel):
    """The known lanes and any other paused one, by name."""

    lanes: list[LaneView]


class LaneChange(BaseModel):
    """Why a lane is paused or resumed (stored on the pause and in its audit entries)."""

    reason: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$"
    )


class ScheduleTick(BaseModel):
    """A schedule (`<worker>:<name>`), the latest tick a worker handled for the tenant and
    the next one by that worker's cron (aware UTC; None when the row was written by a
    release that did not record it, or the cron has no tick in 50 years)."""

    schedule: str
    latest_tick: datetime
    next_tick: datetime | None

    @classmethod
    def of(cls, state: ScheduleState) -> "ScheduleTick":
        return cls(schedule=state.schedule, latest_tick=state.tick_at, next_tick=state.next_tick_at)


class Schedules(BaseModel):
    """The tenant's schedules that have ticked at least once, by name."""

    schedules: list[ScheduleTick]


class OutcomeSlice(BaseModel):
    """One slice of the last hour: it began `ago_s` seconds ago."""

    ago_s: float
    completed: int
    dead_lettered: int


class Activity(BaseModel):
    """Completions and dead letters of the last hour, in slices, oldest first."""

    window_s: float
    buckets: list[OutcomeSlice]


def without_frames(error: str) -> str:
    """`error` without a Python traceback's frame lines (the header, `File ...` lines and
    their source lines): the exception's own line stays."""
    kept = [line for line in error.splitlines() if not line.startswith(FRAME_PREFIXES)]
    return "\n".join(kept)


def encode_cursor(item: WorkItem) -> str:
    """The opaque cursor after `item`: its `created_at` and id, URL-safe."""
    raw = f"{item.created_at.isoformat()}|{item.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    """`encode_cursor`'s pair; `Invalid` naming `cursor` for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, item_id = raw.split("|")
        created_at = datetime.fromisoformat(at)
        if created_at.tzinfo is None:
            raise ValueError("naive time")
        return created_at, UUID(item_id)
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise Invalid("cursor: not a cursor this API returned") from exc
