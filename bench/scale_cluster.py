"""`make bench-scale`'s cluster, host and worker processes, shared by its phases.

`Scale` starts a PostgreSQL cluster of its own (`scripts/chaos.py`'s `Postgres`) with the
production-like `SERVER_SETTINGS`, renders `shipment-notifier` into a fresh reference host
(`.bench/scale/host`) with the no-op handler, migrates it and starts `serve` processes;
`generate_sql` writes rows in the database; `completed`, `metrics_text` and `table_stats`
read the worker and the table. The knobs are listed in `bench/scale.py`.
"""

from __future__ import annotations

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


HISTORY = _env_int("BENCH_SCALE_HISTORY", 10_000_000)
DUE = _env_int("BENCH_SCALE_DUE", 1_000_000)
BASELINE = _env_int("BENCH_SCALE_BASELINE", 20_000)
TENANTS = _env_int("BENCH_SCALE_TENANTS", 100)
CAPACITY = _env_int("BENCH_SCALE_CAPACITY", 10)
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


def say(message: str) -> None:
    print(f"bench-scale: {message}", flush=True)


def generate_sql(*, count: int, offset: int, status: str, total: int) -> str:
    """`count` rows of NOTIFY_SHIPMENT on lane `default`, row n of the run at tenant
    n mod TENANTS: `COMPLETED` history over the last day, or `AVAILABLE` items due over the
    last 10 minutes, oldest first by n; `offset` continues n across chunks of a run of
    `total` rows (the spacing: every row of the run due, whatever its size)."""
    if status == "COMPLETED":
        at = f"now() - interval '1 day' + g * interval '{86000.0 / max(total, 1):.9f} s'"
        completed, attempts = "at + interval '1 second'", 1
    else:
        at = f"now() - interval '10 minutes' + g * interval '{500.0 / max(total, 1):.9f} s'"
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
            await conn.execute(generate_sql(count=size, offset=offset, status=status, total=count))
            if count > CHUNK:
                rate = (offset + size) / (time.monotonic() - started)
                say(f"  {status}: {offset + size:,} of {count:,} ({rate:,.0f} rows/s)")
        return time.monotonic() - started

    # -- the worker --------------------------------------------------------------------

    def start_worker(
        self, tag: str, *, retention_s: int = RETENTION_S, log_stats: bool = False
    ) -> tuple[WorkerProcess, int]:
        """One `serve` process at capacity `CAPACITY` with `COMPLETED_RETENTION` `retention_s`
        (default: long enough to keep the generated history), logging JSON lines at INFO
        (its `queue stats` lines among them) with `log_stats`, else warnings only, to
        `logs/<tag>.log`; returns it and its metrics port."""
        port = free_port()
        env = {
            **self.env,
            f"{PREFIX}CAPACITY": str(CAPACITY),
            f"{PREFIX}DATABASE_POOL_SIZE": str(CAPACITY + self.pool_extra),
            f"{PREFIX}METRICS_PORT": str(port),
            f"{PREFIX}COMPLETED_RETENTION": str(retention_s),
            "ACME_LOG_LEVEL": "INFO" if log_stats else "WARNING",
            "ACME_LOG_JSON": "true" if log_stats else "false",
        }
        cmd = [str(self.host / ".venv" / "bin" / "shipment-notifier"), "serve"]
        return WorkerProcess(cmd, cwd=self.host, env=env, log=self.logs / f"{tag}.log"), port


def remove_leftovers() -> None:
    """Stop and remove the clusters an interrupted run left behind (`chaos`'s own)."""
    chaos.remove_leftovers()


def metrics_text(port: int) -> str | None:
    """The worker's `/metrics` text; None when its port does not answer (yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            return str(answer.read().decode())
    except (urllib.error.URLError, OSError):
        return None


def completed(port: int) -> int | None:
    """The worker's `worker_items_completed_total`, summed over kinds; None when its metrics
    port does not answer (yet)."""
    text = metrics_text(port)
    if text is None:
        return None
    found = re.findall(r"^worker_items_completed_total\{[^}]*\} ([0-9.e+]+)$", text, re.MULTILINE)
    return int(sum(float(v) for v in found))


async def table_stats(conn: asyncpg.Connection) -> dict[str, Any]:
    row = await conn.fetchrow(
        "SELECT n_live_tup, n_dead_tup, autovacuum_count,"
        " pg_relation_size('ix_work_items_claim_order') / 8192 AS claim_index_pages"
        " FROM pg_stat_user_tables WHERE relname = 'work_items'"
    )
    return dict(row)
