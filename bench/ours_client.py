"""Runs inside the rendered host (`uv run --all-packages --offline python ...`, cwd = host):
enqueues through the host's own managers, as an application of the host would.

    python ours_client.py enqueue --url URL [--redis URL] --singles N --items M --batch B
                                  [--api bulk|many]
    python ours_client.py wake --url URL [--redis URL] --count N --cadence S
    python ours_client.py audit --url URL --batches N --size S
    python ours_client.py spread --url URL [--redis URL] --tenants T --items M --batch B
    python ours_client.py reads --url URL --org ORG --repeat N

`enqueue` creates a tenant, enqueues N items one call each (the generated
`enqueue_notify_shipment`), then M items in batches of B, and prints one JSON line:
`single_seconds`, `batch_seconds`. The batches go through the generated
`enqueue_notify_shipment_bulk` (`--api bulk`, the default: ids back, no `WorkItem` per
payload) or `enqueue_notify_shipment_many` (`--api many`: the stored items back). Every
payload is built as the kind's payload model, as a typed caller builds it. The singles are
enqueued first; the caller empties the table between the two when it wants only the
batched items drained.

`wake` enqueues N probe items (payload `note` = `wake`) one at a time, one every S seconds,
and prints one JSON line `{"starts": {record_id: time.time() at the enqueue call}}`.

`spread` creates T tenants and enqueues M items over them in batches of B: the first holds
half, the others share the rest alike; the first tenant's items go first (a backlog that
was there before the others came). Prints one JSON line `{"tenants": [org ids]}`.

`audit` times `Managers.audit.append_many` (the host's batched audit appends, which the
worker's group commit calls once per batch of concurrent handlers) on batches of S entries
shaped as the default handler's, N times after one unmeasured batch, on a funnel built as
the worker builds it (no pre-ping), and prints one JSON line: `wall_ms` and `cpu_ms` (this
process's CPU) per batch, medians.

`reads` times the work API's reads of tenant ORG through the host's manager, as the routes
call them (docs/decisions/0046): N calls each after one unmeasured call, and prints one
JSON line `{read: median ms}`.

With `--redis` the process publishes `WORK_AVAILABLE` through Redis (`Infra.build`), so a
worker in another process wakes on it; without, through the in-memory twin (no wake-up
crosses the process boundary). An SQLite URL gets its tables created first, as the worker
does at start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from uuid import UUID, uuid4

from acme.infra.container import Infra
from acme.infra.settings import InfraSettings
from acme.om.context import AppContext, AppType, OpContext, RequestContext
from acme.om.root import Managers, build_managers
from acme.om.schema import create_all
from acme.om.storage.funnel import StorageFunnel
from acme.om.storage.impl.sql import SqlStorageRoot
from acme.om.types import EMPTY_UUID
from acme.om.work.enqueuers.notify_shipment import (
    enqueue_notify_shipment,
    enqueue_notify_shipment_bulk,
    enqueue_notify_shipment_many,
)
from acme.om.work.types.payloads.notify_shipment import NotifyShipmentPayload
from acme.om.work.types.work_item import WorkItem, WorkKind, WorkStatus
from sqlalchemy.engine import make_url

APP = AppContext(type=AppType.SERVICE, version="bench@0")
KIND = WorkKind.NOTIFY_SHIPMENT


async def _open(
    url: str, redis: str | None, *, pre_ping: bool = True
) -> tuple[StorageFunnel, Infra, Managers, OpContext]:
    """A funnel, infrastructure, managers, and a service context of a fresh tenant."""
    if url.startswith("sqlite"):
        database = make_url(url).database
        if database:
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        create_all(url)
    funnel = StorageFunnel.from_url(url, pool_size=4, pre_ping=pre_ping)
    infra = Infra.build(InfraSettings(database_url=url, redis_url=redis))
    managers = build_managers(SqlStorageRoot(funnel), infra)
    rctx = RequestContext.new(APP)
    org = await managers.tenancy.create_org(rctx, f"bench-{uuid4().hex[:8]}")
    ctx = await managers.tenancy.service_context(
        rctx, org_id=org.id, acting_for=EMPTY_UUID, caused_by_request_id=None
    )
    return funnel, infra, managers, ctx


def _payload() -> NotifyShipmentPayload:
    return NotifyShipmentPayload(record_id=uuid4())


def _item(ctx: OpContext, note: str = "") -> WorkItem:
    payload: dict[str, str] = {"record_id": str(uuid4())}
    if note:
        payload["note"] = note
    return WorkItem.new(org_id=ctx.org_id, kind=KIND, payload=payload)


async def enqueue(
    url: str, redis: str | None, singles: int, items: int, batch: int, api: str = "bulk"
) -> dict:
    """Time `singles` single enqueues, then `items` in batches of `batch` through `api`."""
    funnel, infra, managers, ctx = await _open(url, redis)
    many = enqueue_notify_shipment_bulk if api == "bulk" else enqueue_notify_shipment_many
    try:
        started = time.perf_counter()
        for _ in range(singles):
            await enqueue_notify_shipment(managers.work, ctx, _payload())
        single_seconds = time.perf_counter() - started
        started = time.perf_counter()
        for offset in range(0, items, batch):
            chunk = [_payload() for _ in range(min(batch, items - offset))]
            await many(managers.work, ctx, chunk)
        batch_seconds = time.perf_counter() - started
    finally:
        await managers.work.publish_owed_wake_ups()
        await funnel.dispose()
        await infra.aclose()
    return {"single_seconds": single_seconds, "batch_seconds": batch_seconds}


async def wake(url: str, redis: str | None, count: int, cadence: float) -> dict:
    """Enqueue `count` probe items on a `cadence`, recording each call's start time."""
    funnel, infra, managers, ctx = await _open(url, redis)
    starts: dict[str, float] = {}
    try:
        origin = time.monotonic()
        for n in range(count):
            await asyncio.sleep(max(0.0, origin + n * cadence - time.monotonic()))
            item = _item(ctx, note="wake")
            starts[str(item.payload["record_id"])] = time.time()
            await managers.work.enqueue(ctx, item)
    finally:
        await managers.work.publish_owed_wake_ups()
        await funnel.dispose()
        await infra.aclose()
    return {"starts": starts}


async def spread(url: str, redis: str | None, tenants: int, items: int, batch: int) -> dict:
    """`tenants` tenants, the first with half of `items`, the others the rest alike."""
    funnel, infra, managers, first = await _open(url, redis)
    contexts = [first]
    try:
        rctx = RequestContext.new(APP)
        for _ in range(tenants - 1):
            org = await managers.tenancy.create_org(rctx, f"bench-{uuid4().hex[:8]}")
            contexts.append(
                await managers.tenancy.service_context(
                    rctx, org_id=org.id, acting_for=EMPTY_UUID, caused_by_request_id=None
                )
            )
        shares = [items // 2] + [(items - items // 2) // max(tenants - 1, 1)] * (tenants - 1)
        for ctx, share in zip(contexts, shares, strict=True):
            for offset in range(0, share, batch):
                chunk = [_payload() for _ in range(min(batch, share - offset))]
                await enqueue_notify_shipment_bulk(managers.work, ctx, chunk)
    finally:
        await managers.work.publish_owed_wake_ups()
        await funnel.dispose()
        await infra.aclose()
    return {"tenants": [str(ctx.org_id) for ctx in contexts]}


async def audit(url: str, batches: int, size: int) -> dict:
    """Median wall and CPU milliseconds of one `append_many` of `size` entries."""
    funnel, infra, managers, ctx = await _open(url, None, pre_ping=False)
    # The optional host-contract part (docs/host-contract.md, "Batched audit appends"):
    # without it the default handler's row pays one session per entry, not per batch.
    append_many = getattr(managers.audit, "append_many", None)
    if append_many is None:
        await funnel.dispose()
        await infra.aclose()
        raise SystemExit("ours_client: the host's audit manager has no append_many")
    walls: list[float] = []
    cpus: list[float] = []
    try:
        for n in range(batches + 1):
            calls = []
            for _ in range(size):
                item_id = uuid4()
                fields = {
                    "action": "notify_shipment.handled",
                    "subject_type": "work_item",
                    "subject_id": item_id,
                    "detail": _payload().model_dump(mode="json"),
                    "idempotency_key": f"{item_id}:handled",
                }
                calls.append((ctx, fields))
            wall, cpu = time.perf_counter(), time.process_time()
            await append_many(calls)
            if n:  # the first batch opens the connection and prepares the statement
                walls.append((time.perf_counter() - wall) * 1000)
                cpus.append((time.process_time() - cpu) * 1000)
    finally:
        await funnel.dispose()
        await infra.aclose()
    return {"wall_ms": statistics.median(walls), "cpu_ms": statistics.median(cpus)}


async def reads(url: str, org: str, repeat: int) -> dict:
    """Median milliseconds of each read the work API makes of tenant `org`."""
    funnel = StorageFunnel.from_url(url, pool_size=2)
    infra = Infra.build(InfraSettings(database_url=url, redis_url=None))
    managers = build_managers(SqlStorageRoot(funnel), infra)
    work = managers.work
    rctx = RequestContext.new(APP)
    try:
        ctx = await managers.tenancy.service_context(
            rctx, org_id=UUID(org), acting_for=EMPTY_UUID, caused_by_request_id=None
        )
        (newest,) = await work.list_items(ctx, status=WorkStatus.AVAILABLE, limit=1)
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "items, newest first": lambda: work.list_items(ctx, limit=50),
            "items due": lambda: work.list_items(ctx, status=WorkStatus.AVAILABLE, limit=50),
            "dead letters": lambda: work.list_items(ctx, status=WorkStatus.FAILED, limit=50),
            "one item": lambda: work.get(ctx, newest.id),
            "the tenant's counts": lambda: work.lane_stats(ctx),
            "the tenant's last hour": lambda: work.recent_outcomes(ctx),
            "every tenant's summary": lambda: work.queue_summary(rctx),
        }
        medians: dict[str, float] = {}
        for name, call in calls.items():
            took: list[float] = []
            for n in range(repeat + 1):
                started = time.perf_counter()
                await call()
                if n:  # the first opens connections and prepares statements
                    took.append((time.perf_counter() - started) * 1000)
            medians[name] = round(statistics.median(took), 3)
    finally:
        await funnel.dispose()
        await infra.aclose()
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("enqueue", "wake", "audit", "spread", "reads"):
        p = sub.add_parser(name)
        p.add_argument("--url", required=True)
        p.add_argument("--redis", default=None)
        if name == "audit":
            p.add_argument("--batches", type=int, default=200)
            p.add_argument("--size", type=int, default=10)
        elif name == "reads":
            p.add_argument("--org", required=True)
            p.add_argument("--repeat", type=int, default=50)
        elif name == "spread":
            p.add_argument("--tenants", type=int, default=100)
            p.add_argument("--items", type=int, default=100000)
            p.add_argument("--batch", type=int, default=1000)
        elif name == "enqueue":
            p.add_argument("--singles", type=int, default=1000)
            p.add_argument("--items", type=int, default=20000)
            p.add_argument("--batch", type=int, default=1000)
            p.add_argument("--api", choices=("bulk", "many"), default="bulk")
        else:
            p.add_argument("--count", type=int, default=200)
            p.add_argument("--cadence", type=float, default=0.02)
    args = parser.parse_args()
    if args.command == "enqueue":
        result = asyncio.run(
            enqueue(args.url, args.redis, args.singles, args.items, args.batch, args.api)
        )
    elif args.command == "audit":
        result = asyncio.run(audit(args.url, args.batches, args.size))
    elif args.command == "reads":
        result = asyncio.run(reads(args.url, args.org, args.repeat))
    elif args.command == "spread":
        result = asyncio.run(spread(args.url, args.redis, args.tenants, args.items, args.batch))
    else:
        result = asyncio.run(wake(args.url, args.redis, args.count, args.cadence))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
