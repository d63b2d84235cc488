"""Runs inside a rendered host (`uv run python`): queue throughput and claim latency.

Usage: python queue_inner.py <database_url> <items> <claimers> <batch>
Prints one JSON line: items, claimers, batch, enqueue_seconds, drain_seconds,
items_per_second, claim_p50_ms, claim_p99_ms.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from uuid import uuid4

from acme.infra.container import Infra
from acme.om.context import AppContext, AppType, RequestContext
from acme.om.root import build_managers
from acme.om.storage.funnel import StorageFunnel
from acme.om.storage.impl.sql import SqlStorageRoot
from acme.om.types import EMPTY_UUID
from acme.om.work.types.work_item import WorkItem, WorkKind

APP = AppContext(type=AppType.WORKER, version="bench@0")


async def main(url: str, total: int, claimers: int, batch: int) -> dict[str, float]:
    funnel = StorageFunnel.from_url(url, pool_size=claimers + 2)
    managers = build_managers(SqlStorageRoot(funnel), Infra.memory())
    rctx = RequestContext.new(APP)
    org = await managers.tenancy.create_org(rctx, f"bench-{uuid4().hex[:8]}")
    ctx = await managers.tenancy.service_context(
        rctx, org_id=org.id, acting_for=EMPTY_UUID, caused_by_request_id=None
    )
    kind = next(iter(WorkKind))
    started = time.perf_counter()
    for offset in range(0, total, 500):
        items = [
            WorkItem.new(org_id=org.id, kind=kind, payload={"record_id": str(uuid4())})
            for _ in range(min(500, total - offset))
        ]
        await managers.work.enqueue_many(ctx, items)
    enqueued = time.perf_counter()
    latencies: list[float] = []
    done = 0

    async def claimer(n: int) -> None:
        nonlocal done
        while True:
            t0 = time.perf_counter()
            claimed = await managers.work.claim_many(
                RequestContext.new(APP), "default", [kind], f"bench-{n}", 30.0, batch
            )
            latencies.append(time.perf_counter() - t0)
            if not claimed:
                return
            for item_ctx, item in claimed:
                await managers.work.complete(item_ctx, item)
                done += 1

    await asyncio.gather(*(claimer(n) for n in range(claimers)))
    drained = time.perf_counter()
    await funnel.dispose()
    assert done == total, f"completed {done} of {total}"
    ordered = sorted(latencies)
    return {
        "items": total,
        "claimers": claimers,
        "batch": batch,
        "enqueue_seconds": round(enqueued - started, 3),
        "drain_seconds": round(drained - enqueued, 3),
        "items_per_second": round(total / (drained - enqueued), 1),
        "claim_p50_ms": round(statistics.median(ordered) * 1000, 2),
        "claim_p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 2),
    }


if __name__ == "__main__":
    url, total, claimers, batch = sys.argv[1], *map(int, sys.argv[2:5])
    print(json.dumps(asyncio.run(main(url, total, claimers, batch))))
