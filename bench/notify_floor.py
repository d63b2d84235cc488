"""The wake-up's floor across processes, as a NOTIFY-woken queue pays it (`make bench`).

    python notify_floor.py listen --dsn DSN --count N --within S

`measure(dsn, count, cadence)` starts this file as a second process (`listen`), which
LISTENs on `notify_floor` and, on each notification, claims with one prepared `UPDATE ...
FOR UPDATE SKIP LOCKED ... RETURNING` on a second connection (again until none is due);
meanwhile the calling process inserts one row every `cadence` seconds into a table whose
statement-level `AFTER INSERT` trigger calls `pg_notify` (`table_sql`, shared with the
bench's one-process floor). The latency of a row is from just before its `INSERT` was sent
(`time.time()`) to the return of the claim that took it (`time.time()` in the listener):
the same span and clock as the bench's wake-up rows (enqueue call to handler start), with
everything a wake-up across processes needs and nothing more: both statements durable
(autocommit), the notification sent at the insert's commit, two processes, asyncpg and no
other Python. No queue, ours or a peer's, can wake faster than this on the same server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import uuid

import asyncpg


def table_sql(table: str, *, notify: bool) -> tuple[str, ...]:
    """The statements that make the floor's `table` afresh: a queue's row reduced to what a
    claim reads, and with `notify` a statement-level `AFTER INSERT` trigger calling
    `pg_notify` on the channel named after the table. The first two drop what an earlier
    run left."""
    made = (
        f"DROP TABLE IF EXISTS {table}",
        f"DROP FUNCTION IF EXISTS {table}_notify()",
        (
            f"CREATE TABLE {table} (id uuid PRIMARY KEY, status text NOT NULL, available_at"
            " timestamptz NOT NULL DEFAULT now(), claim_token uuid, payload jsonb NOT NULL)"
        ),
        (
            f"CREATE INDEX {table}_claimable ON {table} (available_at, id)"
            " WHERE status = 'AVAILABLE'"
        ),
    )
    if not notify:
        return made
    return (
        *made,
        (
            f"CREATE FUNCTION {table}_notify() RETURNS trigger LANGUAGE plpgsql AS"
            f" $$ BEGIN PERFORM pg_notify('{table}', ''); RETURN NULL; END $$"
        ),
        (
            f"CREATE TRIGGER {table}_notify AFTER INSERT ON {table}"
            f" FOR EACH STATEMENT EXECUTE FUNCTION {table}_notify()"
        ),
    )


def insert_sql(table: str) -> str:
    """One row, `AVAILABLE` now: parameters id, payload JSON text."""
    return f"INSERT INTO {table} (id, status, payload) VALUES ($1, 'AVAILABLE', $2::text::jsonb)"


def claim_sql(table: str) -> str:
    """Claim the oldest due row, `FOR UPDATE SKIP LOCKED`: its id (none when none is due)."""
    return (
        f"UPDATE {table} SET status = 'CLAIMED', claim_token = gen_random_uuid()"
        f" WHERE id = (SELECT id FROM {table} WHERE status = 'AVAILABLE'"
        " AND available_at <= now() ORDER BY available_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)"
        " RETURNING id"
    )


_TABLE = "notify_floor"


async def _listen(dsn: str, count: int, within_s: float) -> dict[str, float]:
    """Claim on every notification until `count` rows are claimed or `within_s` passes;
    `{row id: time.time() when its claim returned}`. Prints `ready` once listening."""
    listener = await asyncpg.connect(dsn)
    claimer = await asyncpg.connect(dsn)
    try:
        claim = await claimer.prepare(claim_sql(_TABLE))
        woken = asyncio.Event()
        await listener.add_listener(_TABLE, lambda *_: woken.set())
        print("ready", flush=True)
        claimed: dict[str, float] = {}
        deadline = time.monotonic() + within_s
        while len(claimed) < count and time.monotonic() < deadline:
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                    await woken.wait()
            except TimeoutError:
                break
            woken.clear()
            # Until none is due: two notifications heard as one leave no row behind.
            while rows := await claim.fetch():
                claimed[str(rows[0]["id"])] = time.time()
        return claimed
    finally:
        await listener.close()
        await claimer.close()


async def _insert(dsn: str, count: int, cadence_s: float) -> dict[str, float]:
    """Insert `count` rows one every `cadence_s`; `{row id: time.time() before its send}`."""
    conn = await asyncpg.connect(dsn)
    try:
        insert = await conn.prepare(insert_sql(_TABLE))
        sent: dict[str, float] = {}
        origin = time.monotonic()
        for n in range(count):
            await asyncio.sleep(max(0.0, origin + n * cadence_s - time.monotonic()))
            row_id = uuid.uuid4()
            sent[str(row_id)] = time.time()
            await insert.fetch(row_id, json.dumps({"record_id": str(uuid.uuid4())}))
        return sent
    finally:
        await conn.close()


async def _table(dsn: str, statements: tuple[str, ...]) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def measure(dsn: str, count: int, cadence_s: float) -> list[float]:
    """Milliseconds, ascending, of each row's wake-up across processes (module docstring);
    rows never claimed are left out. Creates and drops its table (`table_sql`) in `dsn`'s
    database.
    Raises `RuntimeError` when the listener does not start."""
    made = table_sql(_TABLE, notify=True)
    asyncio.run(_table(dsn, made))
    within_s = count * cadence_s + 10.0
    listener = subprocess.Popen(
        [sys.executable, __file__, "listen", "--dsn", dsn, "--count", str(count),
         "--within", str(within_s)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert listener.stdout is not None
        if listener.stdout.readline().strip() != "ready":
            raise RuntimeError("notify_floor: the listener did not start")
        sent = asyncio.run(_insert(dsn, count, cadence_s))
        out, _ = listener.communicate(timeout=within_s + 10.0)
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()
        asyncio.run(_table(dsn, made[:2]))
    claimed: dict[str, float] = json.loads(out)
    return sorted((claimed[k] - at) * 1000 for k, at in sent.items() if k in claimed)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    listen = sub.add_parser("listen")
    listen.add_argument("--dsn", required=True)
    listen.add_argument("--count", type=int, required=True)
    listen.add_argument("--within", type=float, required=True)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_listen(args.dsn, args.count, args.within))))


if __name__ == "__main__":
    main()
