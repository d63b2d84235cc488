"""The operator commands of a worker's console command: `enqueue`, `tenants`, `items
list|show|move|discard|cancel`, `dead-letters list|replay|discard`, `lanes
list|pause|resume` and `summary` (`run_operator_command`).

Each does only what its name says. A row the worker cannot read is named, never fatal:
`list` prints it as a line whose last column says which column it cannot read and why,
`show` prints its stored columns with the same words. `items list --any-kind` shows every
kind's items with their lane, so stranded ones (a lane no worker claims, a kind no worker
declares) are found; `items move` moves the waiting ones of a lane to another, `items
discard` deletes a row of a kind no worker declares, `items cancel` cancels a waiting or
running item for good. A write (`enqueue`, `move`, `cancel`, `replay`, `discard`) prints
what it wrote and records who asked (`--operator`, else the `OPERATOR` setting) in its
audit entry; on a database server it is refused without that identity.
`enqueue` writes into the tenant `--org` names and creates one only when `--create-tenant
NAME` says so. `dead-letters replay --payload` replays a dead letter with a corrected
payload. `lanes pause|resume` act on every tenant's items and always record who asked;
`summary` reads the queue at a glance (docs/operations.md, Pausing a lane, Queue summary).
The parser and the exit codes are `cli.py`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel

from acme.om.context import AppContext, AppType, OpContext, RequestContext
from acme.om.errors import Conflict, Invalid, NotFound
from acme.om.types import EMPTY_UUID
from acme.om.work.rules import policy_lane, refuse_bad_move, refuse_nul, stranded
from acme.om.work.types.lanes import LanePause
from acme.om.work.types.work_item import (
    WORK_PAYLOADS,
    UnreadableItem,
    UnreadableRow,
    WorkItem,
    WorkRows,
    WorkStatus,
)
from acme.workers.runtime.container import RuntimeContainer
from acme.workers.runtime.errors import escape_control
from acme.workers.runtime.settings import RuntimeSettings, embedded_database_file
from acme.workers.runtime.worker import Worker

ENQUEUED_ACTION = "work.enqueued_by_operator"
"""The audit action of an item enqueued from the command line (one entry per item)."""

MOST_AT_ONCE = 10_000
"""The most items one `enqueue -n` writes, and one `--limit` lists: an operator's command,
not a bulk load (an application enqueues through `enqueue_<kind>_bulk`)."""


class Refused(Exception):
    """A command refused before anything opens; its message is the one line to print."""


def _app(settings: RuntimeSettings) -> AppContext:
    return AppContext(type=AppType.WORKER, version=settings.app_version)


async def _contexts(
    container: RuntimeContainer, rctx: RequestContext, org: UUID | None
) -> list[OpContext]:
    """One service context for `org`, or one per live tenant when `org` is None. Raises
    `Refused` naming `--org` and the `tenants` command when `org` is no live tenant."""
    if org is None:
        return await container.managers.work.maintenance_contexts(rctx)
    try:
        context = await container.managers.tenancy.service_context(
            rctx, org_id=org, acting_for=EMPTY_UUID, caused_by_request_id=None
        )
    except NotFound as exc:
        raise Refused(
            f"--org {org} is no live tenant (the `tenants` command lists them; `enqueue "
            "--create-tenant NAME` creates one); nothing read or written"
        ) from exc
    return [context]


def _row(item: WorkItem) -> str:
    """One item as a line of tab-separated columns, its control characters escaped (a
    handler's error text reaches the terminal as text, never as a terminal command)."""
    # `last_error`'s first line is `Type: message`; its frames are for `items show`.
    reason = (item.last_error or item.note or "").partition("\n")[0]
    return _line(
        [
            str(item.id),
            str(item.org_id),
            item.status.value,
            item.kind.value,
            item.lane,
            f"{item.attempts}/{item.max_attempts}",
            item.updated_at.isoformat(timespec="seconds"),
            reason[:120],
        ]
    )


def _line(columns: list[str]) -> str:
    return escape_control("\t".join(column.replace("\t", " ") for column in columns))


def _unreadable_row(row: UnreadableRow) -> str:
    """A row the worker cannot read, in `_row`'s columns as stored; the last one says which
    column and why: `unreadable: payload: Input should be a valid dictionary`."""
    updated = row.values.get("updated_at")
    when = updated.isoformat(timespec="seconds") if isinstance(updated, datetime) else ""
    return _line(
        [
            str(row.id),
            str(row.org_id),
            row.status,
            row.kind,
            row.text("lane"),
            f"{row.text('attempts')}/{row.text('max_attempts')}",
            when,
            f"unreadable: {row.problem}".replace("\n", " ")[:120],
        ]
    )


def _print_rows(rows: WorkRows) -> int:
    """One line per item, then one per row that cannot be read; how many lines."""
    for item in rows:
        print(_row(item))
    for unreadable in rows.unreadable:
        print(_unreadable_row(unreadable))
    return len(rows) + len(rows.unreadable)


def _none_found(worker: Worker, what: str, tenants: int, *, any_kind: bool = False) -> None:
    """Say on stderr that a list found nothing (stdout keeps only rows, for scripts)."""
    kind = "any kind" if any_kind else f"kind {worker.kind}"
    print(f"no {what} of {kind} in {tenants} tenant(s)", file=sys.stderr)


def _unreadable_json(row: UnreadableRow) -> str:
    """`items show` of a row that cannot be read: its stored columns and what is wrong."""
    shown = {"unreadable": {"column": row.column, "reason": row.reason}, **row.values}
    return json.dumps(shown, indent=2, default=_as_json)


def _as_json(value: object) -> str:
    """A stored value JSON has no type for: a time in ISO 8601, anything else (ids) as text."""
    return value.isoformat() if isinstance(value, datetime) else str(value)


async def _enqueue(
    worker: Worker,
    container: RuntimeContainer,
    settings: RuntimeSettings,
    args: argparse.Namespace,
    payload: BaseModel,
) -> None:
    rctx = RequestContext.new(_app(settings))
    org: UUID | None = args.org
    if org is None:  # `cli` refused the command unless --create-tenant names one
        created = await container.managers.tenancy.create_org(rctx, args.create_tenant)
        org = created.id
        print(f"created tenant\t{org}\t{args.create_tenant}", flush=True)
    (ctx,) = await _contexts(container, rctx, org)
    new = [
        WorkItem.new(
            org_id=ctx.org_id,
            kind=worker.kind,
            payload=payload,
            lane=settings.lane,
            priority=args.priority,
        )
        for _ in range(args.count)
    ]
    items = await container.managers.work.enqueue_many(ctx, new)
    for item in items:
        await container.managers.audit.append(
            ctx,
            action=ENQUEUED_ACTION,
            subject_type="work_item",
            subject_id=item.id,
            detail=_operator_detail(
                {"kind": item.kind.value, "lane": item.lane}, _operator(settings, args)
            ),
        )
        print(f"enqueued   {_row(item)}")


async def _tenants(container: RuntimeContainer, settings: RuntimeSettings) -> None:
    """The live tenant ids, one a line (read-only): what `--org` takes."""
    rctx = RequestContext.new(_app(settings))
    for ctx in await container.managers.tenancy.service_contexts(rctx):
        print(ctx.org_id)


async def _items(
    worker: Worker, container: RuntimeContainer, settings: RuntimeSettings, args: argparse.Namespace
) -> None:
    rctx = RequestContext.new(_app(settings))
    work = container.managers.work
    if args.action == "show":  # read-only: any kind, one no worker declares included
        (ctx,) = await _contexts(container, rctx, args.org)
        try:
            item = await work.get(ctx, args.item_id)
        except UnreadableItem as exc:
            print(_unreadable_json(exc.row))
        else:
            print(item.model_dump_json(indent=2))
        return
    if args.action == "move":
        await _move(worker, container, settings, args)
        return
    if args.action == "discard":
        await _discard_unknown(container, settings, args)
        return
    if args.action == "cancel":
        await _cancel(worker, container, settings, args)
        return
    status = WorkStatus(args.status) if args.status else None
    contexts = await _contexts(container, rctx, args.org)
    kind = None if args.any_kind else worker.kind
    shown = 0
    for ctx in contexts:
        shown += _print_rows(await work.list_items(ctx, status=status, kind=kind, limit=args.limit))
    if not shown:
        what = f"{status.value} items" if status else "items"
        _none_found(worker, what, len(contexts), any_kind=args.any_kind)


async def _move(
    worker: Worker, container: RuntimeContainer, settings: RuntimeSettings, args: argparse.Namespace
) -> None:
    """`items move`: the waiting items of `--kind` (default: this worker's) on `--from-lane`
    to `--to-lane` (default: the lane the kind's policy names), per tenant, each tenant's in
    one conditional statement; a dry run lists what would move."""
    kind: str = args.kind or worker.kind.value
    to_lane: str | None = args.to_lane or policy_lane(kind)
    if to_lane is None:
        raise Invalid(f"to_lane: no worker declares kind {kind}; name the lane with --to-lane")
    rctx = RequestContext.new(_app(settings))
    work = container.managers.work
    # the dry run refuses what the move would, before it lists anything
    workers = await work.workers_alive(rctx)
    refuse_bad_move(args.from_lane, to_lane, [settings.lane], kind=kind, workers=workers)
    contexts = await _contexts(container, rctx, args.org)
    moved = 0
    for ctx in contexts:
        if args.dry_run:
            rows = await work.list_items(ctx, status=WorkStatus.AVAILABLE, limit=MOST_AT_ONCE)
            found = [(i.id, i.kind.value, i.lane) for i in rows]
            found += [(u.id, u.kind, u.text("lane")) for u in rows.unreadable]
            for item_id, item_kind, lane in found:
                if item_kind == kind and lane == args.from_lane:
                    print(f"would move {item_id}\t{ctx.org_id}\t{kind}\t{lane}\t{to_lane}")
                    moved += 1
            continue
        done = await work.move_lane(
            ctx,
            from_lane=args.from_lane,
            to_lane=to_lane,
            kind=kind,
            operator=_operator(settings, args),
            also_known=[settings.lane],
        )
        for item_id, _ in done:
            print(f"moved      {item_id}\t{ctx.org_id}\t{kind}\t{args.from_lane}\t{to_lane}")
        moved += len(done)
    verb = "would move" if args.dry_run else "moved"
    print(
        f"{worker.name}: {verb} {moved} waiting item(s) of kind {kind} from lane "
        f"{args.from_lane} to {to_lane} in {len(contexts)} tenant(s)"
        + ("; dry run: nothing changed" if args.dry_run else ""),
        file=sys.stderr,
    )


async def _discard_unknown(
    container: RuntimeContainer, settings: RuntimeSettings, args: argparse.Namespace
) -> None:
    """`items discard`: soft-delete one row of a kind no worker declares, audited; a dry run
    shows it, or why it would be refused."""
    rctx = RequestContext.new(_app(settings))
    work = container.managers.work
    (ctx,) = await _contexts(container, rctx, args.org)
    if args.dry_run:
        try:
            item = await work.get(ctx, args.item_id)
        except UnreadableItem as exc:
            if policy_lane(exc.row.kind) is not None:
                raise
            print(f"would discard {_unreadable_row(exc.row)}")
            print("dry run: nothing changed", file=sys.stderr)
            return
        raise Conflict(
            f"kind: item {item.id} is of kind {item.kind.value}, which this code names; only a "
            "row of a kind no worker declares is discarded here (a dead letter: "
            "`dead-letters discard`)"
        )
    row = await work.discard_unknown_kind(ctx, args.item_id, operator=_operator(settings, args))
    print(f"discarded  {_unreadable_row(row)}")


async def _cancel(
    worker: Worker, container: RuntimeContainer, settings: RuntimeSettings, args: argparse.Namespace
) -> None:
    """`items cancel`: cancel one waiting or claimed item of this worker's kind, audited
    (`WorkManagerInterface.cancel_item`); a dry run shows it, or why it would be refused."""
    rctx = RequestContext.new(_app(settings))
    work = container.managers.work
    (ctx,) = await _contexts(container, rctx, args.org)
    item = await work.get(ctx, args.item_id)
    _refuse_other_kind(worker, item.id, item.kind.value)
    if args.dry_run:
        if item.deleted_at is not None:
            raise Conflict(f"deleted_at: item {item.id} was discarded at {item.deleted_at}")
        if item.status not in (WorkStatus.AVAILABLE, WorkStatus.CLAIMED):
            raise Conflict(
                "status: only an available or claimed item can be cancelled; this one is "
                f"{item.status}"
            )
        print(f"would cancel {_row(item)}")
        print("dry run: nothing changed", file=sys.stderr)
        return
    cancelled = await work.cancel_item(ctx, args.item_id, operator=_operator(settings, args))
    print(f"cancelled  {_row(cancelled)}")


async def _dead_letters(
    worker: Worker, container: RuntimeContainer, settings: RuntimeSettings, args: argparse.Namespace
) -> None:
    rctx = RequestContext.new(_app(settings))
    work = container.managers.work
    if args.action == "list":
        contexts = await _contexts(container, rctx, args.org)
        shown = 0
        for ctx in contexts:
            shown += _print_rows(
                await work.list_items(
                    ctx, status=WorkStatus.FAILED, kind=worker.kind, limit=args.limit
                )
            )
        if not shown:
            _none_found(worker, "dead letters", len(contexts))
        return
    (ctx,) = await _contexts(container, rctx, args.org)
    try:
        item = await work.get(ctx, args.item_id)
    except UnreadableItem as exc:  # a dead letter the worker cannot read is still its own
        _refuse_other_kind(worker, exc.row.id, exc.row.kind)
        if args.dry_run:
            raise
    else:
        _refuse_other_kind(worker, item.id, item.kind.value)
    if args.dry_run:  # read-only: what the write would touch, or why it would be refused
        verb = "replayed" if args.action == "replay" else "discarded"
        if item.deleted_at is not None:
            raise Conflict(f"deleted_at: item {item.id} was discarded at {item.deleted_at}")
        if item.status is not WorkStatus.FAILED:
            raise Conflict(f"status: only a failed item can be {verb}; this one is {item.status}")
        print(f"would {args.action:<8}{_row(item)}")
        if (corrected := _corrected_payload(worker, args)) is not None:
            print(f"would replace payload {json.dumps(item.payload)} with {json.dumps(corrected)}")
        print("dry run: nothing changed", file=sys.stderr)
        return
    operator = _operator(settings, args)
    if args.action == "replay":
        replayed = await work.replay(
            ctx, args.item_id, operator=operator, payload=_corrected_payload(worker, args)
        )
        print(f"replayed   {_row(replayed)}")
    else:
        print(f"discarded  {_row(await work.discard(ctx, args.item_id, operator=operator))}")


def _corrected_payload(worker: Worker, args: argparse.Namespace) -> dict[str, Any] | None:
    """`dead-letters replay --payload`'s payload as the kind's model dumps it, or None.
    Raises `ValidationError` (the command is refused before anything opens: it was
    validated once already by `run_operator_command`)."""
    if args.command != "dead-letters" or args.action != "replay":
        return None
    given: str | None = args.payload
    if given is None:
        return None
    dumped: dict[str, Any] = (
        WORK_PAYLOADS[worker.kind].model_validate_json(given).model_dump(mode="json")
    )
    return dumped


async def _lanes(
    worker: Worker, container: RuntimeContainer, settings: RuntimeSettings, args: argparse.Namespace
) -> None:
    """`lanes list|pause|resume`: the pauses, one a line, or one pause made or lifted."""
    rctx = RequestContext.new(_app(settings))
    work = container.managers.work
    if args.action == "list":
        paused = await work.paused_lanes(rctx)
        for pause in paused:
            print(_pause_line("paused", pause))
        if not paused:
            print("no lane is paused", file=sys.stderr)
        return
    lane: str = args.lane or settings.lane
    operator = _operator(settings, args) or ""  # `_refusal` made sure there is one
    if args.action == "pause":
        pause = await work.pause_lane(
            rctx, lane, actor=operator, reason=args.reason, also_known=[settings.lane]
        )
        print(_pause_line("paused", pause))
        print(
            f"{worker.name}: no worker claims on lane {lane} until `{worker.name} lanes resume "
            f"{lane}`; items already claimed finish, enqueues go on",
            file=sys.stderr,
        )
        return
    lifted = await work.resume_lane(rctx, lane, actor=operator, reason=args.reason)
    print(_pause_line("resumed", lifted))


def _pause_line(verb: str, pause: LanePause) -> str:
    """`<verb> <lane> <paused_by> <paused_at> <reason>`, tab-separated like every line."""
    when = pause.paused_at.isoformat(timespec="seconds")
    return _line([verb, pause.lane, pause.paused_by, when, pause.reason or ""])


async def _summary(
    container: RuntimeContainer, settings: RuntimeSettings, args: argparse.Namespace
) -> None:
    """`summary`: the queue at a glance, as lines (`count`, `stranded`, `paused`, `alive`,
    `holding`) or JSON. A `stranded` line is waiting items no worker claims (`stranded`:
    of a kind no worker declares, or off its kind's lane). An `alive` line is a worker in
    the roster (docs/decisions/0049): its id, name, lane, kinds (comma-separated), last
    beat and the items it holds (0: idle)."""
    summary = await container.managers.work.queue_summary(RequestContext.new(_app(settings)))
    if args.json:
        print(summary.model_dump_json(indent=2))
        return
    for group in summary.groups:
        age = group.oldest_available_age
        print(
            _line(
                [
                    "count",
                    group.lane,
                    group.kind,
                    group.status.value,
                    str(group.count),
                    "-" if age is None else f"{age:.1f}s",
                ]
            )
        )
    for (kind, lane), count in stranded(summary.groups).items():
        print(_line(["stranded", lane, kind, str(count)]))
    for pause in summary.paused:
        print(_pause_line("paused", pause))
    for alive in summary.workers_alive:
        beat_at = alive.beat_at.isoformat(timespec="seconds")
        print(
            _line(
                [
                    "alive",
                    alive.worker_id,
                    alive.worker,
                    alive.lane,
                    ",".join(alive.kinds),
                    beat_at,
                    str(alive.holding),
                ]
            )
        )
    for worker_id, held in summary.workers_holding.items():
        print(_line(["holding", worker_id, str(held)]))
    idle = sum(1 for alive in summary.workers_alive if not alive.holding)
    print(
        f"{len(summary.groups)} group(s) in play, oldest due item waiting "
        f"{summary.oldest_due_age():.1f}s, {len(summary.paused)} lane(s) paused, "
        f"{len(summary.workers_alive)} worker(s) alive ({idle} idle), "
        f"{len(summary.workers_holding)} worker(s) holding items",
        file=sys.stderr,
    )


def _refuse_other_kind(worker: Worker, item_id: UUID, kind: str) -> None:
    """Raise `Invalid` for an item of another kind than `worker`'s: the item commands act on
    this worker's items only, as `items list` and `dead-letters list` show them (another
    team's dead letter is replayed by its own worker's command, once its cause is fixed)."""
    if kind != worker.kind.value:
        instead = (
            "no worker declares that kind: `items discard` deletes it"
            if policy_lane(kind) is None
            else "use that kind's worker"
        )
        raise Invalid(
            f"item_id: item {item_id} is of kind {kind}, not {worker.kind.value}: "
            f"{worker.name} acts only on its own kind's items ({instead})"
        )


def _operator(settings: RuntimeSettings, args: argparse.Namespace) -> str | None:
    """Who asked for this write: `--operator`, else the `OPERATOR` setting."""
    given: str | None = getattr(args, "operator", None)
    return given if given is not None else settings.operator


def _operator_detail(detail: dict[str, str], operator: str | None) -> dict[str, str]:
    return detail if operator is None else detail | {"operator": operator}


def _writes(args: argparse.Namespace) -> bool:
    """Whether the command changes anything (a dry run does not)."""
    if args.command == "enqueue":
        return True
    if args.command == "items":
        return args.action in ("move", "discard", "cancel") and not args.dry_run
    if args.command == "lanes":
        return bool(args.action != "list")
    return args.command == "dead-letters" and args.action != "list" and not args.dry_run


def _refusal(worker: Worker, settings: RuntimeSettings, args: argparse.Namespace) -> str | None:
    """Why the command may not run at all, on one line; checked before anything opens."""
    if args.command == "enqueue" and args.org is None and args.create_tenant is None:
        return (
            "enqueue needs --org ORG (the live tenant ids: "
            f"`{worker.name} tenants`) or --create-tenant NAME to create one; nothing written"
        )
    if args.command == "lanes" and _writes(args) and _operator(settings, args) is None:
        return (
            f"lanes {args.action} records who asked, for every tenant: pass --operator NAME or "
            f"set {settings.env_prefix()}OPERATOR; nothing written"
        )
    if _writes(args) and settings.infra.database_url and _operator(settings, args) is None:
        command = " ".join(filter(None, [args.command, getattr(args, "action", None)]))
        return (
            f"{command} writes to a database server and records who asked: pass --operator "
            f"NAME or set {settings.env_prefix()}OPERATOR; nothing written"
        )
    return None


async def run_operator_command(
    worker: Worker, settings: RuntimeSettings, args: argparse.Namespace
) -> None:
    """Run the operator command `args` names (any but `serve`) for `worker`.

    Raises `Refused` before anything opens (`_refusal`), `ValidationError` for an
    `enqueue` payload the kind's model refuses, `OmError` for a refusal of the managers'."""
    refusal = _refusal(worker, settings, args)
    if refusal is not None:
        raise Refused(refusal)
    payload = None
    if args.command == "enqueue":  # refused before anything is opened or written
        payload = WORK_PAYLOADS[worker.kind].model_validate_json(args.payload)
        refuse_nul(payload.model_dump(mode="json"), "payload")
    if (corrected := _corrected_payload(worker, args)) is not None:  # as the enqueue's
        refuse_nul(corrected, "payload")
    if settings.infra.database_url is None:
        print(f"{worker.name}: embedded: SQLite {embedded_database_file()}", file=sys.stderr)
    container = worker.container.build(settings)
    try:
        if payload is not None:
            await _enqueue(worker, container, settings, args, payload)
        elif args.command == "tenants":
            await _tenants(container, settings)
        elif args.command == "items":
            await _items(worker, container, settings, args)
        elif args.command == "lanes":
            await _lanes(worker, container, settings, args)
        elif args.command == "summary":
            await _summary(container, settings, args)
        else:
            await _dead_letters(worker, container, settings, args)
    finally:
        await container.aclose()
