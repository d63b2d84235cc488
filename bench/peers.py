"""Runs in `.bench/peers-venv`: the peers `make bench` measures ours against, driven through
their own public APIs (procrastinate with psycopg, pgqueuer with asyncpg).

    python peers.py install  --system S --dsn DSN
    python peers.py enqueue  --system S --dsn DSN --singles N --items M --batch B
    python peers.py wake     --system S --dsn DSN --count N --cadence SECONDS
    python peers.py worker   --system S --dsn DSN [--concurrency N] --counts FILE
    python peers.py versions

`S` is `procrastinate` or `pgqueuer`. `install` applies the peer's schema with its own
tool. `enqueue` and `wake` print one JSON line, as `ours_client.py` does. `worker` runs one
worker with a no-op task until SIGTERM, then writes `{"calls": n, "distinct": d}` (handler
invocations, counted in the process) to FILE. `--concurrency` 0 means the library's
defaults (pgqueuer: no per-entrypoint limit, batch size as shipped). With `BENCH_WAKE_LOG`
set, a probe item (`note` = `wake`) appends `<record_id> <time.time()>` at handler start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any
from uuid import uuid4

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from procrastinate import App, PsycopgConnector

TASK = "noop"
WAKE_LOG = os.environ.get("BENCH_WAKE_LOG")
CALLS: list[str] = []


def _record(payload: dict[str, Any]) -> None:
    """Count the invocation; write the wake-up line for a probe item."""
    started = time.time()
    CALLS.append(str(payload.get("record_id")))
    if WAKE_LOG and payload.get("note") == "wake":
        with open(WAKE_LOG, "a", encoding="utf-8") as log:
            log.write(f"{payload['record_id']} {started}\n")


def _payload(note: str = "") -> dict[str, str]:
    body = {"record_id": str(uuid4())}
    if note:
        body["note"] = note
    return body


# -- procrastinate -------------------------------------------------------------------------


def _procrastinate_app(dsn: str) -> App:
    app = App(connector=PsycopgConnector(conninfo=dsn))

    @app.task(name=TASK)
    async def noop(record_id: str, note: str = "") -> None:
        _record({"record_id": record_id, "note": note})

    return app


# -- pgqueuer ------------------------------------------------------------------------------


async def _pgqueuer_queries(dsn: str) -> tuple[asyncpg.Connection, Queries]:
    conn = await asyncpg.connect(dsn)
    return conn, Queries(AsyncpgDriver(conn))


def _encode(body: dict[str, str]) -> bytes:
    return json.dumps(body).encode()


# -- commands ------------------------------------------------------------------------------


async def install(system: str, dsn: str) -> dict[str, Any]:
    """Apply the peer's schema with its own tool."""
    if system == "procrastinate":
        app = _procrastinate_app(dsn)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
    else:
        conn, queries = await _pgqueuer_queries(dsn)
        try:
            await queries.install()
        finally:
            await conn.close()
    return {"installed": system}


async def _timed_enqueue(
    single: Callable[[dict[str, str]], Awaitable[object]],
    many: Callable[[list[dict[str, str]]], Awaitable[object]],
    singles: int,
    items: int,
    batch: int,
) -> dict[str, float]:
    started = time.perf_counter()
    for _ in range(singles):
        await single(_payload())
    single_seconds = time.perf_counter() - started
    started = time.perf_counter()
    for offset in range(0, items, batch):
        await many([_payload() for _ in range(min(batch, items - offset))])
    return {"single_seconds": single_seconds, "batch_seconds": time.perf_counter() - started}


async def enqueue(system: str, dsn: str, singles: int, items: int, batch: int) -> dict[str, Any]:
    """Time `singles` single enqueues, then `items` in batches of `batch`."""
    if system == "procrastinate":
        app = _procrastinate_app(dsn)
        task = app.tasks[TASK]
        async with app.open_async():

            async def p_single(body: dict[str, str]) -> object:
                return await task.defer_async(**body)

            async def p_many(bodies: list[dict[str, str]]) -> object:
                return await task.batch_defer_async(*bodies)

            return await _timed_enqueue(p_single, p_many, singles, items, batch)
    conn, queries = await _pgqueuer_queries(dsn)
    try:

        async def q_single(body: dict[str, str]) -> object:
            return await queries.enqueue(TASK, _encode(body), 0)

        async def q_many(bodies: list[dict[str, str]]) -> object:
            n = len(bodies)
            return await queries.enqueue([TASK] * n, [_encode(b) for b in bodies], [0] * n)

        return await _timed_enqueue(q_single, q_many, singles, items, batch)
    finally:
        await conn.close()


async def wake(system: str, dsn: str, count: int, cadence: float) -> dict[str, Any]:
    """Enqueue `count` probe items one at a time on a `cadence`, recording call starts."""
    starts: dict[str, float] = {}

    async def paced(send: Callable[[dict[str, str]], Awaitable[object]]) -> None:
        origin = time.monotonic()
        for n in range(count):
            await asyncio.sleep(max(0.0, origin + n * cadence - time.monotonic()))
            body = _payload(note="wake")
            starts[body["record_id"]] = time.time()
            await send(body)

    if system == "procrastinate":
        app = _procrastinate_app(dsn)
        task = app.tasks[TASK]
        async with app.open_async():

            async def p_send(body: dict[str, str]) -> object:
                return await task.defer_async(**body)

            await paced(p_send)
    else:
        conn, queries = await _pgqueuer_queries(dsn)
        try:

            async def q_send(body: dict[str, str]) -> object:
                return await queries.enqueue(TASK, _encode(body), 0)

            await paced(q_send)
        finally:
            await conn.close()
    return {"starts": starts}


async def worker(system: str, dsn: str, concurrency: int, counts: Path) -> None:
    """One worker with the no-op task until SIGTERM; then write the invocation counts."""
    try:
        if system == "procrastinate":
            app = _procrastinate_app(dsn)
            async with app.open_async():
                # The library installs its own SIGTERM/SIGINT handlers: a graceful stop.
                await app.run_worker_async(concurrency=max(concurrency, 1))
        else:
            conn = await asyncpg.connect(dsn)
            qm = QueueManager(Queries(AsyncpgDriver(conn)))

            async def noop(job: Job) -> None:
                _record(json.loads(job.payload or b"{}"))

            qm.entrypoint(TASK, concurrency_limit=concurrency)(noop)
            running = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                running.add_signal_handler(signum, qm.shutdown.set)
            try:
                await qm.run()  # the library's defaults: batch size, dequeue timeout
            finally:
                await conn.close()
    finally:
        counts.write_text(json.dumps({"calls": len(CALLS), "distinct": len(set(CALLS))}))


def versions() -> dict[str, str]:
    """The installed versions of the peers and their drivers."""
    return {name: version(name) for name in ("procrastinate", "psycopg", "pgqueuer", "asyncpg")}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("versions")
    for name in ("install", "enqueue", "wake", "worker"):
        p = sub.add_parser(name)
        p.add_argument("--system", choices=["procrastinate", "pgqueuer"], required=True)
        p.add_argument("--dsn", required=True)
        if name == "enqueue":
            p.add_argument("--singles", type=int, default=1000)
            p.add_argument("--items", type=int, default=20000)
            p.add_argument("--batch", type=int, default=1000)
        elif name == "wake":
            p.add_argument("--count", type=int, default=200)
            p.add_argument("--cadence", type=float, default=0.02)
        elif name == "worker":
            p.add_argument("--concurrency", type=int, default=0)
            p.add_argument("--counts", type=Path, required=True)
    args = parser.parse_args()
    result: dict[str, Any]
    if args.command == "versions":
        result = dict(versions())
    elif args.command == "install":
        result = asyncio.run(install(args.system, args.dsn))
    elif args.command == "enqueue":
        result = asyncio.run(enqueue(args.system, args.dsn, args.singles, args.items, args.batch))
    elif args.command == "wake":
        result = asyncio.run(wake(args.system, args.dsn, args.count, args.cadence))
    else:
        asyncio.run(worker(args.system, args.dsn, args.concurrency, args.counts))
        return
    print(json.dumps(result))


if __name__ == "__main__":
    main()
