"""Runs inside the rendered host for `make chaos` (`.venv/bin/python`, cwd = host): enqueues
the run's items through the host's own managers, paced, through every fault.

    python chaos_client.py --url URL --redis URL --ledger URL --items N --rate R
        [--poison I,J,...] [--block I --block-file PATH] [--batch B]
        [--cancels C --cancel-every S]

Item `i` (0 <= i < N) carries `record_id` = uuid5(`CHAOS_NAMESPACE`, str(i)) and the
idempotency key `chaos:<i>`; its record (`chaos_records`, version 0) is written first.
Items are enqueued in batches of at most B (`enqueue_many`) at R items per second; a batch
that fails (the database restarting, a connection terminated) is retried after 0.5 s until
it goes in: the idempotency keys make a retry of a batch whose outcome was lost harmless.
`--poison` names the items whose `note` is `poison`. Item `--block` (note `block`) is left out
of the schedule and enqueued alone as soon as `--block-file` exists (the harness creates it
when its fault script gets there), or last.

Every `--cancel-every` seconds while it enqueues, at most `--cancels` times, it cancels one
item as an operator does (`cancel_item`, audited, operator `chaos`): a claimed one first,
the most recently claimed (a live worker's, or one a killed worker held), else a waiting
one; never a poison item nor the blocked one. A cancel refused because the item finished
first is not counted.

Prints one JSON line per second (`{"enqueued": n, "retries": r}`), one per cancel
(`{"cancelled": id, "was": "CLAIMED"}`) and a last line
`{"done": N, "retries": r, "org_id": ..., "block_enqueued_at": <time.time() or null>}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
from acme.infra.container import Infra
from acme.infra.settings import InfraSettings
from acme.om.context import AppContext, AppType, RequestContext
from acme.om.errors import Conflict
from acme.om.root import build_managers
from acme.om.storage.funnel import StorageFunnel
from acme.om.storage.impl.sql import SqlStorageRoot
from acme.om.types import EMPTY_UUID
from acme.om.work.types.work_item import WorkItem, WorkKind
from sqlalchemy.exc import SQLAlchemyError

CHAOS_NAMESPACE = uuid.UUID("5f0c1c9e-3a52-4d7c-9d59-6b1f0c0a7e11")
APP = AppContext(type=AppType.SERVICE, version="chaos@0")


def record_id(index: int) -> uuid.UUID:
    """The record item `index` advances (the harness computes the same ids)."""
    return uuid.uuid5(CHAOS_NAMESPACE, str(index))


async def _retrying(what: str, call: Callable[[], Awaitable[None]], retries: list[int]) -> None:
    """Await `call()` until it succeeds, 0.5 s between tries; counts the retries."""
    while True:
        try:
            await call()
            return
        except Exception as exc:  # noqa: BLE001 - every failure here is a fault of the run
            retries[0] += 1
            print(json.dumps({"retry": what, "error": type(exc).__name__}), flush=True)
            await asyncio.sleep(0.5)


async def main(args: argparse.Namespace) -> None:
    poison = {int(i) for i in args.poison.split(",") if i}
    funnel = StorageFunnel.from_url(args.url, pool_size=2)
    infra = Infra.build(InfraSettings(database_url=args.url, redis_url=args.redis))
    managers = build_managers(SqlStorageRoot(funnel), infra)
    ledger = await asyncpg.create_pool(args.ledger, min_size=1, max_size=2, command_timeout=5)
    retries = [0]
    rctx = RequestContext.new(APP)
    org = await managers.tenancy.create_org(rctx, f"chaos-{uuid.uuid4().hex[:8]}")
    ctx = await managers.tenancy.service_context(
        rctx, org_id=org.id, acting_for=EMPTY_UUID, caused_by_request_id=None
    )
    block_enqueued_at: float | None = None
    started = time.monotonic()
    last_report = 0.0
    index = 0
    scheduled = args.items - (1 if 0 <= args.block < args.items else 0)

    async def enqueue(chunk: range) -> None:
        async def write_records() -> None:
            await ledger.executemany(
                "INSERT INTO chaos_records (id, item_index) VALUES ($1, $2) "
                "ON CONFLICT (id) DO NOTHING",
                [(record_id(i), i) for i in chunk],
            )

        await _retrying("records", write_records, retries)
        items = [
            WorkItem.new(
                org_id=ctx.org_id,
                kind=WorkKind.NOTIFY_SHIPMENT,
                payload={
                    "record_id": str(record_id(i)),
                    "note": "poison" if i in poison else "block" if i == args.block else "",
                },
                idempotency_key=f"chaos:{i}",
            )
            for i in chunk
        ]

        async def put() -> None:
            await managers.work.enqueue_many(ctx, items)

        await _retrying("enqueue", put, retries)

    async def maybe_block(last: bool = False) -> None:
        nonlocal block_enqueued_at
        if (
            block_enqueued_at is None
            and scheduled < args.items
            and (last or (args.block_file and os.path.exists(args.block_file)))
        ):
            await enqueue(range(args.block, args.block + 1))
            block_enqueued_at = time.time()

    spared = [*poison, args.block]
    cancelled = 0
    last_cancel = time.monotonic()

    async def maybe_cancel() -> None:
        nonlocal cancelled, last_cancel
        if cancelled >= args.cancels or time.monotonic() - last_cancel < args.cancel_every:
            return
        last_cancel = time.monotonic()
        try:
            row = await ledger.fetchrow(
                "SELECT w.id, w.status FROM work_items w "
                "JOIN chaos_records r ON r.id::text = w.payload->>'record_id' "
                "WHERE w.status IN ('AVAILABLE', 'CLAIMED') AND r.item_index <> ALL($1::int[]) "
                "ORDER BY w.status = 'CLAIMED' DESC, w.claimed_at DESC NULLS LAST LIMIT 1",
                spared,
            )
            if row is None:
                return
            await managers.work.cancel_item(ctx, row["id"], operator="chaos")
        except Conflict:
            return  # it finished first
        except (OSError, asyncpg.PostgresError, SQLAlchemyError) as exc:
            # An outage (a fault of the run): this cancel is skipped.
            print(json.dumps({"cancel_failed": type(exc).__name__}), flush=True)
            return
        cancelled += 1
        print(json.dumps({"cancelled": str(row["id"]), "was": row["status"]}), flush=True)

    try:
        while index < scheduled:
            await maybe_block()
            await maybe_cancel()
            due = int((time.monotonic() - started) * args.rate) + 1
            if due <= index:
                await asyncio.sleep(
                    min(0.05, (index + 1) / args.rate - (time.monotonic() - started))
                )
                continue
            upto = min(scheduled, due, index + args.batch)
            await enqueue(range(index, upto))
            index = upto
            if time.monotonic() - last_report >= 1.0:
                last_report = time.monotonic()
                print(json.dumps({"enqueued": index, "retries": retries[0]}), flush=True)
        while args.block_file and block_enqueued_at is None and scheduled < args.items:
            await maybe_block()  # the harness's script has not got there yet
            await asyncio.sleep(0.1)
        await maybe_block(last=True)
    finally:
        await ledger.close()
        await managers.work.publish_owed_wake_ups()
        await funnel.dispose()
        await infra.aclose()
    print(
        json.dumps(
            {
                "done": index + (1 if block_enqueued_at is not None else 0),
                "retries": retries[0],
                "org_id": str(ctx.org_id),
                "block_enqueued_at": block_enqueued_at,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--redis", default=None)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True, help="items per second")
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--poison", default="")
    parser.add_argument("--block", type=int, default=-1)
    parser.add_argument("--block-file", default="")
    parser.add_argument("--cancels", type=int, default=0, help="items to cancel, at most")
    parser.add_argument("--cancel-every", type=float, default=3.0, help="seconds between cancels")
    asyncio.run(main(parser.parse_args()))
