"""The work routes: one manager call each, behind `access`'s roles (docs/decisions/0044).

`/v1/orgs/{org_id}/work/...`: a tenant's items, dead letters, counts and schedules for its
members; every write (enqueue, cancel, replay, discard) for its admins, audited with the
member as actor. `/v1/work/...`: the all-tenant summary and the lanes (list, pause, resume)
for platform operators (the system scope), and the dashboard page. Enqueue and corrected
replay routes are one per kind, each typed by the kind's payload model (`WORK_PAYLOADS`), so
a payload is refused with 422 naming its field and the OpenAPI shows every body
(docs/decisions/0048).
"""

# No `from __future__ import annotations` here: each kind's route is typed by its payload
# model at import time (`_enqueue_routes`), and FastAPI reads the annotations as objects.
from collections.abc import Awaitable, Callable, Mapping, Sequence
from importlib import resources
from typing import Annotated
from uuid import UUID, uuid4

from fastapi import APIRouter, Header, Query, Response, status
from pydantic import BaseModel

from acme.om.errors import Conflict, Invalid, NotFound
from acme.om.work.rules import known_lanes, refuse_unclaimed_lane
from acme.om.work.types.lanes import LanePause
from acme.om.work.types.policy import PRIORITY_MAX, PRIORITY_MIN
from acme.om.work.types.work_item import (
    WORK_PAYLOADS,
    UnreadableItem,
    WorkItem,
    WorkKind,
    WorkStatus,
)
from acme.services.api.work.access import (
    AdminDep,
    ManagersDep,
    Member,
    OperatorDep,
    ReaderDep,
)
from acme.services.api.work.views import (
    Activity,
    DeadLetterFilter,
    Enqueued,
    FilterOutcome,
    ItemPage,
    ItemView,
    LaneChange,
    Lanes,
    LaneView,
    OutcomeSlice,
    PausedLane,
    QueueOverview,
    Schedules,
    ScheduleTick,
    Summary,
    decode_cursor,
    encode_cursor,
)

TENANT = "/v1/orgs/{org_id}/work"
MAX_BULK = 1000
MAX_FILTERED = 10_000
"""A bulk replay or discard by filter acts on at most this many dead letters per call."""
PAGE_FILES = {"": ("index.html", "text/html"), "/app.js": ("app.js", "text/javascript")}
PAGE_FILES["/app.css"] = ("app.css", "text/css")

router = APIRouter(tags=["work"])
"""Every work route but the enqueue routes (`enqueue_router`)."""

Limit = Annotated[int, Query(ge=1, le=200)]
Delay = Annotated[
    float,
    Query(ge=0, le=31_536_000, allow_inf_nan=False, description="seconds before it is due"),
]
Priority = Annotated[
    int | None,
    Query(
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description="higher is claimed first within the tenant (default: the kind's)",
    ),
]


def _kind(value: str | None) -> WorkKind | None:
    if value is None:
        return None
    try:
        return WorkKind(value)
    except ValueError:
        raise Invalid(f"kind: no work kind {value!r}") from None


def _page(rows: Sequence[WorkItem], unreadable: int, limit: int, member: Member) -> ItemPage:
    views = [ItemView.of(item, frames=member.is_admin) for item in rows]
    full = len(rows) + unreadable >= limit
    return ItemPage(
        items=views,
        next_cursor=encode_cursor(rows[-1]) if full and rows else None,
        unreadable=unreadable,
    )


@router.get(f"{TENANT}/items", response_model=ItemPage)
async def list_items(
    member: ReaderDep,
    found: ManagersDep,
    status_: Annotated[WorkStatus | None, Query(alias="status")] = None,
    kind: str | None = None,
    lane: str | None = None,
    cursor: str | None = None,
    limit: Limit = 50,
) -> ItemPage:
    """The tenant's items, newest first, by status, kind and lane; `cursor` pages on."""
    rows = await found.work.list_items(
        member.ctx,
        status=status_,
        kind=_kind(kind),
        lane=lane,
        after=None if cursor is None else decode_cursor(cursor),
        limit=limit,
    )
    return _page(rows, len(rows.unreadable), limit, member)


@router.get(TENANT + "/items/{item_id}", response_model=ItemView)
async def get_item(item_id: UUID, member: ReaderDep, found: ManagersDep) -> ItemView:
    """One item of the tenant (404 for another tenant's)."""
    item = await found.work.get(member.ctx, item_id)
    return ItemView.of(item, frames=member.is_admin)


@router.get(f"{TENANT}/dead-letters", response_model=ItemPage)
async def list_dead_letters(
    member: ReaderDep,
    found: ManagersDep,
    kind: str | None = None,
    lane: str | None = None,
    cursor: str | None = None,
    limit: Limit = 50,
) -> ItemPage:
    """The tenant's dead letters (`FAILED`, not discarded), newest first."""
    rows = await found.work.list_items(
        member.ctx,
        status=WorkStatus.FAILED,
        kind=_kind(kind),
        lane=lane,
        after=None if cursor is None else decode_cursor(cursor),
        limit=limit,
    )
    return _page(rows, len(rows.unreadable), limit, member)


@router.post(TENANT + "/items/{item_id}/cancel", response_model=ItemView)
async def cancel(item_id: UUID, member: AdminDep, found: ManagersDep) -> ItemView:
    """Cancel a waiting or claimed item for good; audited (`work.cancelled`). 409 for a
    finished or discarded item, 404 for none (docs/decisions/0038)."""
    item = await found.work.cancel_item(member.ctx, item_id)
    return ItemView.of(item, frames=True)


@router.post(TENANT + "/dead-letters/{item_id}/replay", response_model=ItemView)
async def replay(item_id: UUID, member: AdminDep, found: ManagersDep) -> ItemView:
    """Make a dead letter available again, attempts reset; audited (`work.replayed`)."""
    item = await found.work.replay(member.ctx, item_id)
    return ItemView.of(item, frames=True)


@router.post(TENANT + "/dead-letters/{item_id}/discard", response_model=ItemView)
async def discard(item_id: UUID, member: AdminDep, found: ManagersDep) -> ItemView:
    """Discard a dead letter (soft delete); audited (`work.discarded`)."""
    item = await found.work.discard(member.ctx, item_id)
    return ItemView.of(item, frames=True)


async def _by_filter(
    member: Member,
    found: ManagersDep,
    body: DeadLetterFilter,
    act: Callable[[UUID], Awaitable[object]],
) -> FilterOutcome:
    """Walk the matching dead letters page by page (at most `MAX_FILTERED`), acting on each
    unless `dry_run`; one that changed meanwhile (`Conflict`) is not counted as acted."""
    kind, matched, acted = _kind(body.kind), 0, 0
    after = None
    while matched < MAX_FILTERED:
        rows = await found.work.list_items(
            member.ctx, status=WorkStatus.FAILED, kind=kind, lane=body.lane, after=after
        )
        if not rows:
            break
        for item in rows[: MAX_FILTERED - matched]:
            matched += 1
            if body.dry_run:
                continue
            try:
                await act(item.id)
            except Conflict:
                continue
            acted += 1
        after = (rows[-1].created_at, rows[-1].id)
    return FilterOutcome(matched=matched, acted=acted, dry_run=body.dry_run)


@router.post(f"{TENANT}/dead-letters/replay", response_model=FilterOutcome)
async def replay_matching(
    body: DeadLetterFilter, member: AdminDep, found: ManagersDep
) -> FilterOutcome:
    """Replay every dead letter of `kind` and `lane` (or count them: `dry_run`)."""
    return await _by_filter(member, found, body, lambda i: found.work.replay(member.ctx, i))


@router.post(f"{TENANT}/dead-letters/discard", response_model=FilterOutcome)
async def discard_matching(
    body: DeadLetterFilter, member: AdminDep, found: ManagersDep
) -> FilterOutcome:
    """Discard every dead letter of `kind` and `lane` (or count them: `dry_run`)."""
    return await _by_filter(member, found, body, lambda i: found.work.discard(member.ctx, i))


@router.get(f"{TENANT}/summary", response_model=Summary)
async def tenant_summary(member: ReaderDep, found: ManagersDep) -> Summary:
    """The tenant's counts per lane, kind and status, with the oldest due item's age, and
    the paused lanes (who paused them is for platform operators: `/v1/work/lanes`)."""
    paused = await found.work.paused_lanes(member.ctx.request)
    return Summary(
        lanes=await found.work.lane_stats(member.ctx),
        paused=[PausedLane.of(pause) for pause in paused],
        can_write=member.is_admin,
    )


@router.get(f"{TENANT}/schedules", response_model=Schedules)
async def schedules(member: ReaderDep, found: ManagersDep) -> Schedules:
    """The tenant's schedules that have ticked, each with its latest handled tick and the
    next one, as the worker that handled it recorded (docs/decisions/0051)."""
    states = await found.work.schedule_states(member.ctx)
    return Schedules(schedules=[ScheduleTick.of(state) for state in states])


@router.get(f"{TENANT}/activity", response_model=Activity)
async def activity(member: ReaderDep, found: ManagersDep) -> Activity:
    """The tenant's completions and dead letters over the last hour, in five-minute slices."""
    window_s, buckets = 3600.0, 12
    counts = await found.work.recent_outcomes(member.ctx, window_s=window_s, buckets=buckets)
    size = window_s / buckets
    return Activity(
        window_s=window_s,
        buckets=[
            OutcomeSlice(ago_s=window_s - i * size, completed=done, dead_lettered=dead)
            for i, (done, dead) in enumerate(counts)
        ],
    )


async def unknown_kind(kind: str, member: ReaderDep) -> None:
    """404 naming the kinds, for a member's write to a kind no route serves: each kind of
    `WORK_PAYLOADS` has its own routes, mounted before these (`mount_work`)."""
    kinds = ", ".join(known.value for known in WORK_PAYLOADS) or "none"
    raise NotFound(f"kind: {kind!r:.80} names no work kind; the kinds: {kinds}")


for _suffix in ("/items", "/items/bulk", "/dead-letters/{item_id}/replay"):
    router.add_api_route(
        TENANT + "/kinds/{kind}" + _suffix, unknown_kind, methods=["POST"], include_in_schema=False
    )


@router.get("/v1/work/summary", response_model=QueueOverview)
async def all_tenants_summary(ctx: OperatorDep, found: ManagersDep) -> QueueOverview:
    """Every tenant's counts together, the paused lanes and the workers holding items:
    platform operators only, audited."""
    return QueueOverview.of(await found.work.queue_summary(ctx.request))


@router.get("/v1/work/lanes", response_model=Lanes)
async def lanes(ctx: OperatorDep, found: ManagersDep) -> Lanes:
    """Every lane the kinds module names, and any other paused one (a worker's own `LANE`,
    paused from its command line), with its pause: platform operators only, audited."""
    pauses = {pause.lane: pause for pause in await found.work.paused_lanes(ctx.request)}
    known = known_lanes()
    return Lanes(
        lanes=[
            LaneView(lane=lane, known=lane in known, pause=pauses.get(lane))
            for lane in sorted({*known, *pauses})
        ]
    )


@router.post("/v1/work/lanes/{lane}/pause", response_model=LanePause)
async def pause_lane(
    lane: str, ctx: OperatorDep, found: ManagersDep, body: LaneChange | None = None
) -> LanePause:
    """Pause `lane` for every tenant (docs/decisions/0040); the operator's user id is the
    pause's `paused_by`; the body (its reason) may be left out. 422 for a lane the kinds
    module does not name (naming those it does), 409 when it is paused already."""
    reason = None if body is None else body.reason
    return await found.work.pause_lane(ctx.request, lane, actor=str(ctx.user_id), reason=reason)


@router.post("/v1/work/lanes/{lane}/resume", response_model=LanePause)
async def resume_lane(
    lane: str, ctx: OperatorDep, found: ManagersDep, body: LaneChange | None = None
) -> LanePause:
    """Resume the paused `lane`; the pause lifted; the body may be left out. 409 when it is
    not paused (naming the paused lanes)."""
    reason = None if body is None else body.reason
    return await found.work.resume_lane(ctx.request, lane, actor=str(ctx.user_id), reason=reason)


async def _refuse_unclaimed_lane(
    found: ManagersDep, member: Member, kind: WorkKind, lane: str | None
) -> None:
    """422 for a caller's `lane` no worker claims `kind` on (`refuse_unclaimed_lane` over
    the roster): such an item would wait, stranded, until an operator moved it."""
    if lane is not None:
        workers = await found.work.workers_alive(member.ctx.request)
        refuse_unclaimed_lane(kind.value, lane, workers)


def _add_enqueue_routes(into: APIRouter, kind: WorkKind, model: type[BaseModel]) -> None:
    """`POST .../kinds/<KIND>/items`, `.../items/bulk` and
    `.../kinds/<KIND>/dead-letters/{item_id}/replay` into `into`, their bodies typed by
    `model`."""

    async def enqueue_one(
        body: BaseModel,
        member: AdminDep,
        found: ManagersDep,
        response: Response,
        idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
        lane: str | None = None,
        delay_s: Delay = 0.0,
        priority: Priority = None,
    ) -> ItemView:
        await _refuse_unclaimed_lane(found, member, kind, lane)
        item = WorkItem.new(
            org_id=member.ctx.org_id,
            kind=kind,
            payload=body,
            lane=lane,
            delay=delay_s,
            idempotency_key=idempotency_key,
            priority=priority,
        )
        stored = await found.work.enqueue(member.ctx, item)
        if stored.id != item.id:
            response.status_code = status.HTTP_200_OK  # the key's earlier item, untouched
        await found.audit.append(
            member.ctx,
            action="work.enqueued",
            subject_type="work_item",
            subject_id=stored.id,
            detail={"kind": kind.value, "lane": stored.lane, "via": "api"},
        )
        return ItemView.of(stored, frames=True)

    async def enqueue_many(
        body: list[BaseModel],
        member: AdminDep,
        found: ManagersDep,
        lane: str | None = None,
        delay_s: Delay = 0.0,
        priority: Priority = None,
    ) -> Enqueued:
        if not 1 <= len(body) <= MAX_BULK:
            raise Invalid(f"payloads: send 1 to {MAX_BULK} payloads, got {len(body)}")
        await _refuse_unclaimed_lane(found, member, kind, lane)
        ids = await found.work.enqueue_bulk(
            member.ctx, kind, body, delay=delay_s, lane=lane, priority=priority
        )
        await found.audit.append(
            member.ctx,
            action="work.enqueued_bulk",
            subject_type="work_batch",
            subject_id=uuid4(),
            detail={"kind": kind.value, "lane": lane, "ids": [str(i) for i in ids]},
        )
        return Enqueued(ids=ids)

    async def replay_corrected(
        item_id: UUID, body: BaseModel, member: AdminDep, found: ManagersDep
    ) -> ItemView:
        try:
            stored_kind = (await found.work.get(member.ctx, item_id)).kind.value
        except UnreadableItem as exc:  # a payload no model reads is what a correction fixes
            stored_kind = exc.row.kind
        if stored_kind != kind.value:
            raise Invalid(
                f"kind: item {item_id} is of kind {stored_kind}; replay it at /v1/orgs/"
                f"{member.ctx.org_id}/work/kinds/{stored_kind}/dead-letters/{item_id}/replay"
            )
        payload = body.model_dump(mode="json", warnings=False)
        item = await found.work.replay(member.ctx, item_id, payload=payload)
        return ItemView.of(item, frames=True)

    enqueue_one.__annotations__["body"] = model
    enqueue_many.__annotations__["body"] = list.__class_getitem__(model)
    replay_corrected.__annotations__["body"] = model
    path = f"{TENANT}/kinds/{kind.value}/items"
    into.add_api_route(
        path,
        enqueue_one,
        methods=["POST"],
        status_code=status.HTTP_201_CREATED,
        response_model=ItemView,
        summary=f"Enqueue one {kind.value} item",
        operation_id=f"enqueue_{kind.value.lower()}",
        description="An `Idempotency-Key` header makes a retry return the first item (200).",
    )
    into.add_api_route(
        f"{path}/bulk",
        enqueue_many,
        methods=["POST"],
        status_code=status.HTTP_201_CREATED,
        response_model=Enqueued,
        summary=f"Enqueue many {kind.value} items in one insert",
        operation_id=f"enqueue_{kind.value.lower()}_bulk",
    )
    into.add_api_route(
        TENANT + f"/kinds/{kind.value}/dead-letters/" + "{item_id}/replay",
        replay_corrected,
        methods=["POST"],
        response_model=ItemView,
        summary=f"Replay a {kind.value} dead letter with a corrected payload",
        operation_id=f"replay_{kind.value.lower()}_corrected",
        description=(
            "The body replaces the stored payload; the audit entry (`work.replayed`) holds "
            "both. 422 for an item of another kind (naming its route), 409 for one that is "
            "no live dead letter."
        ),
    )


def enqueue_router(payloads: Mapping[WorkKind, type[BaseModel]]) -> APIRouter:
    """The enqueue and corrected replay routes of every kind in `payloads` (`WORK_PAYLOADS`
    when mounted; a test passes a probe model of its own)."""
    into = APIRouter(tags=["work"])
    for kind, model in payloads.items():
        _add_enqueue_routes(into, kind, model)
    return into


def _page_route(suffix: str, name: str, media_type: str) -> None:
    body = resources.files("acme.services.api.work").joinpath("dashboard", name).read_bytes()

    async def page() -> Response:
        return Response(body, media_type=media_type)

    router.add_api_route(
        f"/v1/work/dashboard{suffix}", page, methods=["GET"], include_in_schema=False
    )


for _suffix, (_name, _media) in PAGE_FILES.items():
    _page_route(_suffix, _name, _media)
