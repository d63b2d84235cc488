"""`make bench-scale`: the generated queue on a big table, in a PostgreSQL cluster of its own.

Not part of CI (a full run took 44 min on 2 cores). Set-up:
1. a cluster of its own, started by `scripts/chaos.py`'s `Postgres` (`initdb`, `pg_ctl`, a
   free loopback port, its files under `TMPDIR`), with production-like settings on top:
   autovacuum on at the naptime docs/operations.md asks for, shared buffers sized for the
   table, `pg_stat_statements` loaded; fsync off unless `BENCH_SCALE_FSYNC=on` (as `make
   chaos`: a commit still waits for its WAL write; with fsync on, the 100 tenants' commits
   bound the drain on this machine's disk, not the queue);
2. `shipment-notifier` rendered into a fresh reference host (`.bench/scale/host`, as
   `make bench` does), its handler replaced by `bench/host_noop_handler.py`, the roles and
   database made by the host's `scripts/infra-up.sh`, the schema by `make migrate`;
3. `BENCH_SCALE_TENANTS` (100) tenants in `orgs`.

Then, one worker process (`.venv/bin/shipment-notifier serve`, capacity
`BENCH_SCALE_CAPACITY`, 10; no Redis: PostgreSQL NOTIFY wake-ups) per phase:
1. the baseline: `BENCH_SCALE_BASELINE` (20,000) due items over the tenants, written by
   `INSERT ... SELECT generate_series`, drained from the worker's start to the last
   completion (`make bench`'s 20k row, in this cluster), the claim statement's mean
   execution time from `pg_stat_statements` over that drain (the near-empty table);
2. the load: `BENCH_SCALE_HISTORY` (10,000,000) completed rows of history and
   `BENCH_SCALE_DUE` (1,000,000) due items over the tenants, generated in the database
   (`COMPLETED_RETENTION` set to keep them), then `VACUUM ANALYZE` (a settled table);
3. the drain of every due item, minute by minute (`BENCH_SCALE_MINUTE`, 60 s): items
   completed (the worker's `worker_items_completed_total`), the claim statement's calls and
   mean time in that minute, `work_items`' dead tuples, autovacuum runs and the claim
   index's size; then the index pages one claim reads right after the drain (`EXPLAIN
   (ANALYZE, BUFFERS)` of the claim's scan) before any vacuum can run.

Bounds (issue 31): the claim's mean over the big drain at most `CLAIM_BOUND` (1.2) x its
mean on the near-empty table, and every full minute of the drain at least `DRAIN_BOUND`
(0.9) x the baseline's items/s. Prints one table; writes `.bench/scale-results.json`;
exits 1 when a bound is missed or an item is left undone.

Knobs (environment): BENCH_SCALE_HISTORY, BENCH_SCALE_DUE, BENCH_SCALE_BASELINE,
BENCH_SCALE_TENANTS, BENCH_SCALE_CAPACITY, BENCH_SCALE_MINUTE (seconds per row of the
drain), BENCH_SCALE_TIMEOUT (seconds, the big drain's limit: 3600), BENCH_SCALE_NAPTIME
(autovacuum_naptime, seconds: 15), BENCH_SCALE_SHARED_BUFFERS (1GB), BENCH_SCALE_FSYNC
(off), BENCH_SCALE_KEEP=1 (leave the cluster running at the end, for a look by hand).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import asyncpg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "engine" / "om" / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import chaos  # the throwaway cluster (`Postgres`, `cluster_root`), reused as is
import demo  # the host preparation, reused as is
from run import WorkerProcess, _env_int, _reserved_connections  # make bench's, reused as is
from work_network import free_port  # the engine tests' own, stdlib only

WORK = REPO / ".bench"
HANDLER = Path("workers/shipment-notifier/src/acme/workers/shipment_notifier/handler.py")
PREFIX = "SHIPMENT_NOTIFIER_"
EMPTY = "00000000-0000-0000-0000-000000000000"
CLAIM_BOUND = 1.2
DRAIN_BOUND = 0.9


HISTORY = _env_int("BENCH_SCALE_HISTORY", 10_000_000)
DUE = _env_int("BENCH_SCALE_DUE", 1_000_000)
BASELINE = _env_int("BENCH_SCALE_BASELINE", 20_000)
TENANTS = _env_int("BENCH_SCALE_TENANTS", 100)
CAPACITY = _env_int("BENCH_SCALE_CAPACITY", 10)
MINUTE = float(os.environ.get("BENCH_SCALE_MINUTE", "60"))
TIMEOUT = float(os.environ.get("BENCH_SCALE_TIMEOUT", "3600"))
NAPTIME = _env_int("BENCH_SCALE_NAPTIME", 15)
SHARED_BUFFERS = os.environ.get("BENCH_SCALE_SHARED_BUFFERS", "1GB")
FSYNC = os.environ.get("BENCH_SCALE_FSYNC", "off")
KEEP = os.environ.get("BENCH_SCALE_KEEP") == "1"
CHUNK = 1_000_000  # rows per generating statement (one commit each)
RETENTION_S = 90 * 86400  # COMPLETED_RETENTION: the generated history is under a day old

# Production-like, after chaos.Postgres's scratch settings (later lines win).
SERVER_SETTINGS = f"""
fsync = {FSYNC}
full_page_writes = {FSYNC}
shared_buffers = {SHARED_BUFFERS}
effective_cache_size = 4GB
maintenance_work_mem = 256MB
work_mem = 16MB
max_wal_size = 8GB
checkpoint_timeout = 15min
autovacuum = on
autovacuum_naptime = {NAPTIME}s
track_io_timing = on
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.track = all
log_autovacuum_min_duration = 0
"""

CLAIM_QUERY = "WITH picked AS (SELECT id FROM work_items%"
# The claim's scan as the claim statement runs it (postgres_statements.claim_statement).
CLAIM_SCAN = (
    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM work_items"
    " WHERE status = 'AVAILABLE' AND lane = 'default' AND kind IN ('NOTIFY_SHIPMENT')"
    " AND available_at <= statement_timestamp() AND deleted_at IS NULL"
    " AND attempts < max_attempts ORDER BY available_at, id LIMIT 10"
)


def say(message: str) -> None:
    print(f"bench-scale: {message}", flush=True)


def generate_sql(*, count: int, offset: int, status: str) -> str:
    """`count` rows of NOTIFY_SHIPMENT on lane `default`, row n of the run at tenant
    n mod TENANTS: `COMPLETED` history over the last day, or `AVAILABLE` items due over the
    last 10 minutes, oldest first by n; `offset` continues n across chunks."""
    if status == "COMPLETED":
        at = f"now() - interval '1 day' + g * interval '{86000.0 / max(HISTORY, 1):.9f} s'"
        completed, attempts = "at + interval '1 second'", 1
    else:
        at = f"now() - interval '10 minutes' + g * interval '{500.0 / max(DUE, 1):.9f} s'"
        completed, attempts = "NULL", 0
    return (
        "WITH o AS (SELECT array_agg(id ORDER BY id) AS ids FROM orgs WHERE name LIKE 'scale-%')"
        " INSERT INTO work_items (id, org_id, kind, lane, payload, status, attempts,"
        " max_attempts, available_at, completed_at, created_at, updated_at, created_by,"
        " updated_by)"
        f" SELECT gen_random_uuid(), o.ids[1 + g % {TENANTS}], 'NOTIFY_SHIPMENT', 'default',"
        " jsonb_build_object('record_id', gen_random_uuid()),"
        f" '{status}', {attempts}, 5, at, {completed}, at, coalesce({completed}, at),"
        f" '{EMPTY}', '{EMPTY}'"
        f" FROM o, generate_series({offset + 1}, {offset + count}) AS g, LATERAL (SELECT {at} AS at) t"
    )


class Scale:
    """The cluster, the rendered host and one admin connection (superuser `postgres`)."""

    def __init__(self) -> None:
        self.pg = chaos.Postgres(chaos.cluster_root(), free_port())
        self.host = WORK / "scale" / "host"
        self.logs = WORK / "scale" / "logs"
        self.env: dict[str, str] = {}
        self.pool_extra = 4

    # -- set-up ------------------------------------------------------------------------

    def start(self) -> None:
        say(f"PostgreSQL cluster in {self.pg.root} on port {self.pg.port}")
        self.pg.init()
        with (self.pg.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write(SERVER_SETTINGS)
        self.pg.start()

    def prepare(self) -> None:
        say("rendering shipment-notifier into a fresh reference host (.bench/scale/host)")
        host = demo.prepare_host(self.host.parent)
        demo.render(host, demo.Worker(*demo.FIRST, port=0, log=self.logs / "unused.log"))
        shutil.copyfile(REPO / "bench" / "host_noop_handler.py", host / HANDLER)
        env = chaos.host_env()
        demo.run(
            ["uv", "sync", "--offline", "--all-packages", "--quiet", "--compile-bytecode"],
            cwd=host,
            env=env,
        )
        say("roles, database and schema (the host's infra-up.sh and make migrate)")
        # infra-up.sh also wants a Redis to answer: the shared one's ping; the worker runs
        # without Redis (NOTIFY wake-ups).
        infra = {**env, "ACME_PGHOST": "127.0.0.1", "ACME_PGPORT": str(self.pg.port)}
        demo.run(["bash", "scripts/infra-up.sh"], cwd=host, env=infra)
        owner = self.pg.url("acme_owner").replace("postgresql:", "postgresql+asyncpg:")
        demo.run(["make", "-s", "migrate"], cwd=host, env={**env, "ACME_MIGRATION_URL": owner})
        env["ACME_DATABASE_URL"] = self.pg.url("acme_app").replace(
            "postgresql:", "postgresql+asyncpg:"
        )
        self.env = env
        self.pool_extra = _reserved_connections(host, env)
        self.logs.mkdir(parents=True, exist_ok=True)

    async def connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.pg.url(), command_timeout=None)

    async def seed_tenants(self, conn: asyncpg.Connection) -> None:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.execute(
            "INSERT INTO orgs (id, name, created_at, updated_at, created_by, updated_by)"
            f" SELECT gen_random_uuid(), 'scale-' || n, now(), now(), '{EMPTY}', '{EMPTY}'"
            f" FROM generate_series(1, {TENANTS}) AS n"
        )

    async def generate(self, conn: asyncpg.Connection, *, count: int, status: str) -> float:
        """Write `count` rows of `status` in chunks; returns the seconds it took."""
        started = time.monotonic()
        for offset in range(0, count, CHUNK):
            size = min(CHUNK, count - offset)
            await conn.execute(generate_sql(count=size, offset=offset, status=status))
            if count > CHUNK:
                rate = (offset + size) / (time.monotonic() - started)
                say(f"  {status}: {offset + size:,} of {count:,} ({rate:,.0f} rows/s)")
        return time.monotonic() - started

    # -- the worker --------------------------------------------------------------------

    def start_worker(self, tag: str) -> tuple[WorkerProcess, int]:
        port = free_port()
        env = {
            **self.env,
            f"{PREFIX}CAPACITY": str(CAPACITY),
            f"{PREFIX}DATABASE_POOL_SIZE": str(CAPACITY + self.pool_extra),
            f"{PREFIX}METRICS_PORT": str(port),
            f"{PREFIX}COMPLETED_RETENTION": str(RETENTION_S),
            "ACME_LOG_LEVEL": "WARNING",
        }
        cmd = [str(self.host / ".venv" / "bin" / "shipment-notifier"), "serve"]
        return WorkerProcess(cmd, cwd=self.host, env=env, log=self.logs / f"{tag}.log"), port


def completed(port: int) -> int | None:
    """The worker's `worker_items_completed_total`, summed over kinds; None when its metrics
    port does not answer (yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            text = answer.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    found = re.findall(r"^worker_items_completed_total\{[^}]*\} ([0-9.e+]+)$", text, re.MULTILINE)
    return int(sum(float(v) for v in found))


async def claim_stats(conn: asyncpg.Connection) -> tuple[int, float]:
    """The claim statement's calls and total execution time (ms) so far."""
    row = await conn.fetchrow(
        "SELECT coalesce(sum(calls), 0)::bigint AS calls,"
        " coalesce(sum(total_exec_time), 0)::float8 AS ms"
        " FROM pg_stat_statements WHERE query LIKE $1",
        CLAIM_QUERY,
    )
    return int(row["calls"]), float(row["ms"])


async def table_stats(conn: asyncpg.Connection) -> dict[str, Any]:
    row = await conn.fetchrow(
        "SELECT n_live_tup, n_dead_tup, autovacuum_count,"
        " pg_relation_size('ix_work_items_claimable') / 8192 AS claim_index_pages"
        " FROM pg_stat_user_tables WHERE relname = 'work_items'"
    )
    return dict(row)


async def claim_scan_pages(conn: asyncpg.Connection) -> dict[str, Any]:
    """The buffers one claim's scan touches now, and its time (`EXPLAIN ANALYZE`)."""
    plan = json.loads(await conn.fetchval(CLAIM_SCAN))[0]
    top = plan["Plan"]
    return {
        "buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
        "execution_ms": round(plan["Execution Time"], 3),
    }


async def drain(
    scale: Scale, conn: asyncpg.Connection, *, tag: str, total: int, minute: float | None
) -> dict[str, Any]:
    """Drain `total` due items with one worker; with `minute`, one row per `minute` s."""
    await conn.execute("SELECT pg_stat_statements_reset()")
    worker, port = scale.start_worker(tag)
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    last_at, last_done = started, 0
    last_calls, last_ms = 0, 0.0
    done, finished = 0, None
    try:
        while True:
            await asyncio.sleep(0.2)
            if not worker.alive():
                raise SystemExit(f"bench-scale: the {tag} worker exited:\n{worker.tail()}")
            done = completed(port) or done
            now = time.monotonic()
            if done >= total:
                finished = now
            if minute is not None and (now - last_at >= minute or finished):
                calls, ms = await claim_stats(conn)
                stats = await table_stats(conn)
                rows.append(
                    {
                        "minute": len(rows) + 1,
                        "seconds": round(now - last_at, 1),
                        "items": done - last_done,
                        "items_per_s": round((done - last_done) / (now - last_at), 1),
                        "claims": calls - last_calls,
                        "claim_mean_ms": round((ms - last_ms) / max(calls - last_calls, 1), 3),
                        **stats,
                    }
                )
                say(
                    f"  {tag} minute {len(rows)}: {rows[-1]['items_per_s']:,} items/s, claim"
                    f" {rows[-1]['claim_mean_ms']} ms, dead {stats['n_dead_tup']:,},"
                    f" autovacuums {stats['autovacuum_count']}, claim index"
                    f" {stats['claim_index_pages']:,} pages; {done:,} of {total:,}"
                )
                last_at, last_done, last_calls, last_ms = now, done, calls, ms
            if finished or now - started > TIMEOUT:
                break
    finally:
        worker.stop()
    calls, ms = await claim_stats(conn)
    elapsed = (finished or time.monotonic()) - started
    return {
        "items": done,
        "seconds": round(elapsed, 1),
        "items_per_s": round(done / elapsed, 1),
        "claims": calls,
        "claim_mean_ms": round(ms / max(calls, 1), 3),
        "complete": finished is not None,
        "minutes": rows,
    }


async def measure(scale: Scale) -> dict[str, Any]:
    conn = await scale.connect()
    try:
        await scale.seed_tenants(conn)
        say(f"baseline: {BASELINE:,} due items over {TENANTS} tenants on a near-empty table")
        await scale.generate(conn, count=BASELINE, status="AVAILABLE")
        await conn.execute("VACUUM ANALYZE work_items")
        baseline = await drain(scale, conn, tag="baseline", total=BASELINE, minute=None)
        say(
            f"  baseline: {baseline['items_per_s']:,} items/s, claim mean "
            f"{baseline['claim_mean_ms']} ms over {baseline['claims']:,} claims"
        )
        say(f"load: {HISTORY:,} completed rows, then {DUE:,} due items (in the database)")
        history_s = await scale.generate(conn, count=HISTORY, status="COMPLETED")
        due_s = await scale.generate(conn, count=DUE, status="AVAILABLE")
        started = time.monotonic()
        await conn.execute("VACUUM ANALYZE work_items")
        vacuum_s = time.monotonic() - started
        before = await table_stats(conn)
        before["relation_mb"] = await conn.fetchval(
            "SELECT pg_total_relation_size('work_items') / 1048576"
        )
        before["claim_scan"] = await claim_scan_pages(conn)
        say(
            f"  loaded in {history_s + due_s:.0f} s, VACUUM ANALYZE {vacuum_s:.0f} s; "
            f"work_items {before['relation_mb']:,} MB with its indexes"
        )
        say(f"drain: {DUE:,} due items at capacity {CAPACITY}, a row per {MINUTE:.0f} s")
        big = await drain(scale, conn, tag="drain", total=DUE, minute=MINUTE)
        after = await claim_scan_pages(conn)
        after_stats = await table_stats(conn)
    finally:
        await conn.close()
    return {
        "baseline": baseline,
        "load": {
            "history_s": round(history_s, 1),
            "due_s": round(due_s, 1),
            "vacuum_analyze_s": round(vacuum_s, 1),
            "before_drain": before,
        },
        "drain": big,
        "after_drain": {"claim_scan": after, **after_stats},
    }


def verdicts(result: dict[str, Any]) -> list[dict[str, Any]]:
    base, big = result["baseline"], result["drain"]
    claim_ratio = big["claim_mean_ms"] / base["claim_mean_ms"] if base["claim_mean_ms"] else None
    full = [m for m in big["minutes"] if m["seconds"] >= MINUTE * 0.99]
    worst = min((m["items_per_s"] for m in full), default=None)
    drain_ratio = worst / base["items_per_s"] if worst is not None else None
    return [
        {
            "name": f"claim mean over the drain <= {CLAIM_BOUND} x near-empty",
            "ratio": None if claim_ratio is None else round(claim_ratio, 2),
            "ok": claim_ratio is not None and claim_ratio <= CLAIM_BOUND,
        },
        {
            "name": f"every full minute of the drain >= {DRAIN_BOUND} x the baseline's items/s",
            "ratio": None if drain_ratio is None else round(drain_ratio, 2),
            "ok": drain_ratio is not None and drain_ratio >= DRAIN_BOUND and big["complete"],
        },
    ]


def print_table(result: dict[str, Any], checks: list[dict[str, Any]]) -> None:
    base, big = result["baseline"], result["drain"]
    print(
        f"\nwork_items: {HISTORY:,} completed + {DUE:,} due over {TENANTS} tenants; "
        f"capacity {CAPACITY}; autovacuum_naptime {NAPTIME} s; fsync {FSYNC}"
    )
    print(
        "| stage | items/s | claims | claim mean ms | dead tuples | autovacuums | claim index pages |"
    )
    print("|---|---|---|---|---|---|---|")
    print(
        f"| baseline {BASELINE:,} items, near-empty | {base['items_per_s']:,} | "
        f"{base['claims']:,} | {base['claim_mean_ms']} | | | |"
    )
    for m in big["minutes"]:
        print(
            f"| drain minute {m['minute']} ({m['seconds']} s) | {m['items_per_s']:,} | "
            f"{m['claims']:,} | {m['claim_mean_ms']} | {m['n_dead_tup']:,} | "
            f"{m['autovacuum_count']} | {m['claim_index_pages']:,} |"
        )
    print(
        f"| drain, whole | {big['items_per_s']:,} | {big['claims']:,} | "
        f"{big['claim_mean_ms']} | | | |"
    )
    before = result["load"]["before_drain"]["claim_scan"]
    after = result["after_drain"]["claim_scan"]
    print(
        f"\none claim's scan: {before['buffers']} buffers ({before['execution_ms']} ms) before "
        f"the drain, {after['buffers']} ({after['execution_ms']} ms) right after it"
    )
    for check in checks:
        print(f"{'met   ' if check['ok'] else 'MISSED'} {check['name']}: {check['ratio']}")


def main() -> int:
    began = time.monotonic()
    for tool in ("initdb", "pg_ctl"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench-scale: {tool} not found (PostgreSQL's server binaries)")
    chaos.remove_leftovers()
    scale = Scale()
    try:
        scale.start()
        scale.prepare()
        result = asyncio.run(measure(scale))
    finally:
        if KEEP:
            say(f"cluster left running: {scale.pg.url()} (pg_ctl -D {scale.pg.data} stop)")
        else:
            scale.pg.stop()
            shutil.rmtree(scale.pg.root, ignore_errors=True)
    checks = verdicts(result)
    print_table(result, checks)
    result |= {
        "config": {
            "history": HISTORY,
            "due": DUE,
            "baseline": BASELINE,
            "tenants": TENANTS,
            "capacity": CAPACITY,
            "minute_s": MINUTE,
            "server_settings": SERVER_SETTINGS.strip().splitlines(),
            "completed_retention_s": RETENTION_S,
        },
        "bounds": checks,
        "elapsed_s": round(time.monotonic() - began, 1),
    }
    (WORK / "scale-results.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    say(f"{(time.monotonic() - began) / 60:.1f} min; results in .bench/scale-results.json")
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
