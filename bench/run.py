"""`make bench`: our generated queue side by side with procrastinate and pgqueuer.

Renders `shipment-notifier` into a fresh reference host (`.bench/render/host`, as `make
demo` does), migrates a scratch database `acme_bench`, gives each peer its own scratch
database with its schema applied by its own tool, then runs the same workload on every row
(`ROWS`), `BENCH_RUNS` times:

1. `BENCH_SINGLES` (1,000) single enqueues, one call each, timed;
2. `BENCH_ITEMS` (20,000) items enqueued in batches of `BENCH_BATCH` (1,000), timed;
3. one worker process drains them, timed from its start to the last completion (the
   queue table polled every 50 ms), its CPU (user + sys of the process tree, from
   `/proc`) and peak RSS (`VmHWM` of the process running the loop) sampled until it exits;
   the end state is checked: every item done, none twice;
4. after the worker stopped (its backends flush their statistics on exit): the queue
   table's size with its indexes and its dead tuples;
5. wake-up latency: a fresh worker, idle, gets `BENCH_WAKE_COUNT` (200) items enqueued one
   at a time every 20 ms; latency = enqueue call start to handler start, both
   `time.time()`, the handler writing its start to the file named by `BENCH_WAKE_LOG`;
6. a pgbench floor: a one-row prepared `UPDATE ... RETURNING`, 4 clients;
7. what the server and the host allow beneath two targets (`wake_floor`, `notify_floor`,
   `audit_batch`): the wake-up's floor, a durable one-row insert and then its durable claim
   from a second connection with nothing between them (`BENCH_WAKE_COUNT` pairs on the
   wake-up cadence); the same wake-up across two processes as a NOTIFY-woken queue with no
   framework pays it (`bench/notify_floor.py`: an insert whose trigger notifies, a listener
   process that claims on each notification); and one batch of the host's audit appends as
   the default handler's row pays it (ten entries, `Managers.audit.append_many` through
   `bench/ours_client.py audit`).

The fairness row (`ours_fairness`, capacity 10, no-op handler; docs/decisions/0037) runs its
own phases instead of 1-5: (a) tenant B alone enqueues `BENCH_FAIR_RATE` (20) probes/s to an
idle worker; tenant A's `BENCH_FAIR_ITEMS` (100,000) are drained alone; then drained again
while B enqueues at that rate for most of the drain. B's wait is due (its enqueue call) to
handler start, p95; the lane's drain is every completion from the worker's start. (b)
`BENCH_FAIR_TENANTS` (100) tenants hold `BENCH_FAIR_SPREAD_ITEMS` (100,000), the first half
of them, enqueued first; one worker drains them; each tenant's wait (due to completion,
from the rows: the no-op handler ends where it starts) at p95. `BENCH_ROWS=ours_fairness`
runs that row alone, without the peers (nor their virtualenv) and the floors.

Prints one table of medians, the ratio of ours to each peer row, and the targets of
`bench/targets.json` (ratios ours / peer, same run); writes everything to
`.bench/results.json`; exits 1 when a target is missed or an end state is wrong.

Ours is driven inside the host: `bench/ours_client.py` enqueues through the host's managers
(`uv run`), and the worker is the host's console command run directly from the host's
virtualenv (`.venv/bin/shipment-notifier serve`), so the pid measured is the loop's. Its
handler is replaced by `bench/host_noop_handler.py` except on the default-handler row.
The peers run from `.bench/peers-venv` (`bench/requirements-peers.txt`) via `bench/peers.py`.

Knobs (environment): BENCH_RUNS (3), BENCH_ITEMS (20000), BENCH_SINGLES (1000), BENCH_BATCH
(1000), BENCH_DRAIN_TIMEOUT (seconds, 120: a drain still running then is stopped and its
partial rate reported, marked `*`), BENCH_BEST_CAPACITY (100; the pool is capacity + 4, or
+ what the rendered settings reserve when more), BENCH_WAKE_COUNT (200),
BENCH_PGBENCH_SECONDS (10), BENCH_ROWS (comma-separated row keys, all by default),
BENCH_FAIR_ITEMS (100000), BENCH_FAIR_RATE (20), BENCH_FAIR_TENANTS (100),
BENCH_FAIR_SPREAD_ITEMS (100000), BENCH_OURS_DB (acme_bench: the database ours runs in),
DEMO_PG_URL (the admin URL), DEMO_REDIS_URL.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import asyncpg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "engine" / "om" / "tests"))

import demo  # the demo's host preparation, reused as is
import notify_floor  # beside this file
from work_network import free_port  # the engine tests' own, stdlib only

BENCH = REPO / "bench"
WORK = REPO / ".bench"
PEERS_PYTHON = WORK / "peers-venv" / "bin" / "python"
ADMIN = os.environ.get("DEMO_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("DEMO_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_HOST = ADMIN.split("@", 1)[1].rsplit("/", 1)[0]  # host:port
OURS_DB = os.environ.get("BENCH_OURS_DB", "acme_bench")
PEER_ROLE = "bench_peer"
HANDLER = Path("workers/shipment-notifier/src/acme/workers/shipment_notifier/handler.py")
SQLITE_FILE = Path(".local/acme.sqlite3")
CLK_TCK = os.sysconf("SC_CLK_TCK")
POLL = 0.05


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


RUNS = _env_int("BENCH_RUNS", 3)
ITEMS = _env_int("BENCH_ITEMS", 20000)
SINGLES = _env_int("BENCH_SINGLES", 1000)
BATCH = _env_int("BENCH_BATCH", 1000)
DRAIN_TIMEOUT = float(os.environ.get("BENCH_DRAIN_TIMEOUT", "120"))
BEST_CAPACITY = _env_int("BENCH_BEST_CAPACITY", 100)
WAKE_COUNT = _env_int("BENCH_WAKE_COUNT", 200)
WAKE_CADENCE = 0.02
PGBENCH_SECONDS = _env_int("BENCH_PGBENCH_SECONDS", 10)
FAIR_ITEMS = _env_int("BENCH_FAIR_ITEMS", 100000)
FAIR_RATE = _env_int("BENCH_FAIR_RATE", 20)
FAIR_TENANTS = _env_int("BENCH_FAIR_TENANTS", 100)
FAIR_SPREAD_ITEMS = _env_int("BENCH_FAIR_SPREAD_ITEMS", 100000)


@dataclass(frozen=True)
class Row:
    """One line of the table: a system, how its worker is configured, what it is paired with.

    `system`: `ours`, `procrastinate` or `pgqueuer`. For ours, `capacity` is
    SHIPMENT_NOTIFIER_CAPACITY (pool = capacity + 4), `redis` whether ACME_REDIS_URL is set,
    `sqlite` the embedded default (ACME_DATABASE_URL unset), `handler` `noop` or `default`
    (the rendered one). For a peer, `capacity` is its concurrency (0: library defaults).
    `wake`: measure wake-up latency. `versus`: the ours row this peer row is compared with.
    `pool_extra`: connections beside the handler slots (4, or what the rendered settings
    require when they reserve more: `RESERVED_CONNECTIONS`). `fairness`: the fairness
    phases instead of the drain and wake-up (`Bench.fairness`).
    """

    key: str
    label: str
    system: str
    capacity: int
    redis: bool = True
    database_wake_ups: bool = True
    sqlite: bool = False
    handler: str = "noop"
    wake: bool = False
    versus: str | None = None
    pool_extra: int = 4
    fairness: bool = False

    @property
    def pool(self) -> int | None:
        return self.capacity + self.pool_extra if self.system == "ours" else None

    @property
    def capacity_label(self) -> str:
        if self.system == "ours":
            return f"{self.capacity} (pool {self.pool})"
        if self.capacity == 0:
            return "defaults"
        return str(self.capacity)


ROWS = [
    Row("ours_c1", "ours, no-op, Redis", "ours", 1),
    Row("ours_c10", "ours, no-op, Redis", "ours", 10, wake=True),
    Row("ours_best", "ours, no-op, Redis (best)", "ours", BEST_CAPACITY, wake=True),
    Row("ours_default_c10", "ours, default handler (audit entry)", "ours", 10, handler="default"),
    Row("ours_redis_only_c10", "ours, no-op, Redis wake-ups only", "ours", 10,
        database_wake_ups=False, wake=True),
    Row("ours_noredis_c10", "ours, no-op, NOTIFY wake-ups only", "ours", 10, redis=False,
        wake=True),
    Row("ours_sqlite_c10", "ours, no-op, SQLite embedded", "ours", 10, redis=False, sqlite=True,
        wake=True),
    Row("ours_fairness", "ours, no-op, fairness (tenants)", "ours", 10, fairness=True),
    Row("procrastinate_c1", "procrastinate", "procrastinate", 1, versus="ours_c1"),
    Row("procrastinate_c10", "procrastinate", "procrastinate", 10, wake=True, versus="ours_c10"),
    Row("pgqueuer_c10", "pgqueuer (concurrency_limit)", "pgqueuer", 10, wake=True,
        versus="ours_c10"),
    Row("pgqueuer_defaults", "pgqueuer", "pgqueuer", 0, wake=True, versus="ours_best"),
]  # fmt: skip

QUEUE_TABLE = {"ours": "work_items", "procrastinate": "procrastinate_jobs", "pgqueuer": "pgqueuer"}
RESET = {
    "ours": "TRUNCATE work_items, audit_entries, outbox",
    "procrastinate": "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers "
    "CASCADE",
    "pgqueuer": "TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics",
}


@dataclass
class Measurement:
    """What one run of one row measured; None where not measured or not applicable."""

    enqueue_single_per_s: float | None = None
    enqueue_batch_per_s: float | None = None
    enqueue_many_per_s: float | None = None
    items_per_s: float | None = None
    drain_seconds: float | None = None
    completed: int = 0
    partial: bool = False
    end_state_ok: bool | None = None
    end_state: str = ""
    cpu_ms_per_item: float | None = None
    peak_rss_mb: float | None = None
    table_mb: float | None = None
    dead_tuples: int | None = None
    wake_p50_ms: float | None = None
    wake_p95_ms: float | None = None
    wake_p99_ms: float | None = None
    wake_missing: int | None = None
    fair_b_alone_p95_ms: float | None = None
    fair_b_p95_ms: float | None = None
    fair_a_alone_per_s: float | None = None
    fair_lane_per_s: float | None = None
    fair_spread_median_p95_ms: float | None = None
    fair_spread_worst_p95_ms: float | None = None
    fair_spread_p95_ms: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# -- processes -----------------------------------------------------------------------------


def _json_out(cmd: list[str], *, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """Run a helper that prints one JSON line last; stop the bench when it fails."""
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"bench: `{' '.join(cmd[:6])} ...` failed ({done.returncode})")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _proc_tree(root: int) -> list[int]:
    """`root` and its live descendants, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(parents.get(pid, []))
    return tree


def _cpu_seconds(pid: int) -> float | None:
    """user + sys CPU seconds of one process (its reaped children included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # after the comm: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLK_TCK


def _vm_hwm_mb(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) / 1024 if found else None


class Sampler:
    """CPU of a process tree (the highest reading seen per pid) and the root's VmHWM."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.cpu: dict[int, float] = {}
        self.hwm_mb: float | None = None

    def sample(self) -> None:
        for pid in _proc_tree(self.root):
            seconds = _cpu_seconds(pid)
            if seconds is not None:
                self.cpu[pid] = max(seconds, self.cpu.get(pid, 0.0))
        hwm = _vm_hwm_mb(self.root)
        if hwm is not None:
            self.hwm_mb = max(hwm, self.hwm_mb or 0.0)

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu.values())


class WorkerProcess:
    """A worker started in its own session; `stop()` sends SIGTERM, then SIGKILL."""

    def __init__(self, cmd: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.port: int | None = None  # ours: the metrics port, for /healthz
        self.started = time.monotonic()
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.sampler = Sampler(self.proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM the process group, sampling until exit; SIGKILL after `timeout`."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.alive() and time.monotonic() < deadline:
                self.sampler.sample()
                time.sleep(POLL)
            if self.alive():
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


# -- databases -----------------------------------------------------------------------------


def _admin_url(database: str) -> str:
    return ADMIN.rsplit("/", 1)[0] + "/" + database


def _peer_dsn(system: str) -> str:
    return f"postgresql://{PEER_ROLE}@{PG_HOST}/bench_{system}"


async def _admin(database: str, *statements: str) -> None:
    conn = await asyncpg.connect(_admin_url(database))
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


async def _others_connected(database: str) -> list[str]:
    """Every other session connected to `database`, as `pid application_name (client)`;
    a session that is closing is given 2 s to go."""
    conn = await asyncpg.connect(_admin_url(database))
    try:
        for _ in range(20):
            rows = await conn.fetch(
                "SELECT pid, application_name, client_addr FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'"
            )
            if not rows:
                return []
            await asyncio.sleep(0.1)
        return [f"{r['pid']} {r['application_name'] or '-'} ({r['client_addr']})" for r in rows]
    finally:
        await conn.close()


async def _fetchval(database: str, query: str) -> Any:
    conn = await asyncpg.connect(_admin_url(database))
    try:
        return await conn.fetchval(query)
    finally:
        await conn.close()


async def _recreate_databases(peers: bool = True) -> None:
    """`acme_bench` owned by acme_owner; with `peers`, one database per peer, owned by
    `bench_peer` (a plain LOGIN role, as the application role of a real deployment would
    be), and the pgbench floor's."""
    conn = await asyncpg.connect(ADMIN)
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", PEER_ROLE):
            await conn.execute(f"CREATE ROLE {PEER_ROLE} LOGIN")
        databases = [(OURS_DB, "acme_owner")]
        if peers:
            databases += [
                ("bench_procrastinate", PEER_ROLE),
                ("bench_pgqueuer", PEER_ROLE),
                ("bench_pgbench", "postgres"),
            ]
        for name, owner in databases:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            await conn.execute(f"CREATE DATABASE {name} OWNER {owner}")
    finally:
        await conn.close()


def _database(row: Row) -> str:
    return OURS_DB if row.system == "ours" else f"bench_{row.system}"


def _done_query(row: Row, total: int) -> str:
    if row.system == "ours":
        return "SELECT count(*) FROM work_items WHERE status = 'COMPLETED'"
    if row.system == "procrastinate":
        return "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
    return f"SELECT {total} - count(*) FROM pgqueuer"  # a finished job's row is deleted


_RETRIED = "SELECT count(*) FROM work_items WHERE attempts > 1 OR status <> 'COMPLETED'"


async def _tenant_p95_ms(database: str) -> list[float]:
    """Each tenant's p95 wait (ms), due (`available_at`) to completion, over its rows."""
    conn = await asyncpg.connect(_admin_url(database))
    try:
        rows = await conn.fetch(
            "SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM"
            " completed_at - available_at)) * 1000 FROM work_items GROUP BY org_id"
        )
    finally:
        await conn.close()
    return [float(r[0]) for r in rows]


# -- the bench -----------------------------------------------------------------------------


@dataclass
class Bench:
    """The rendered host, its environment and the handlers; runs rows and the pgbench floor."""

    host: Path
    host_env: dict[str, str]
    generated_handler: str
    logs: Path
    pool_extra: int

    # ours -----------------------------------------------------------------------------

    def ours_env(self, row: Row) -> dict[str, str]:
        """The worker's environment (and the client's: the same URLs)."""
        env = dict(self.host_env)
        env.update(self.ours_knobs(row))
        return env

    @staticmethod
    def ours_knobs(row: Row) -> dict[str, str]:
        """Exactly what the bench sets on our worker (the metrics port is picked per start)."""
        knobs = {
            "SHIPMENT_NOTIFIER_CAPACITY": str(row.capacity),
            "SHIPMENT_NOTIFIER_DATABASE_POOL_SIZE": str(row.pool),
            "ACME_LOG_LEVEL": "WARNING",
        }
        if not row.sqlite:
            knobs["ACME_DATABASE_URL"] = f"postgresql+asyncpg://acme_app@{PG_HOST}/{OURS_DB}"
        if row.redis:
            knobs["ACME_REDIS_URL"] = REDIS
        if not row.database_wake_ups:
            knobs["SHIPMENT_NOTIFIER_DATABASE_WAKE_UPS"] = "false"
        return knobs

    def ours_url(self, row: Row) -> str:
        return (
            f"sqlite+aiosqlite:///{SQLITE_FILE}"
            if row.sqlite
            else f"postgresql+asyncpg://acme_app@{PG_HOST}/{OURS_DB}"
        )

    def ours_client(self, row: Row, *args: str) -> dict[str, Any]:
        cmd = ["uv", "run", "--all-packages", "--offline", "python"]
        cmd += [str(BENCH / "ours_client.py"), *args, "--url", self.ours_url(row)]
        if row.redis:
            cmd += ["--redis", REDIS]
        return _json_out(cmd, cwd=self.host, env=self.ours_env(row))

    def set_handler(self, row: Row) -> None:
        """The no-op handler, or the rendered one, as a user editing `handler.py` would."""
        text = (
            self.generated_handler
            if row.handler == "default"
            else (BENCH / "host_noop_handler.py").read_text()
        )
        (self.host / HANDLER).write_text(text)

    # every system ---------------------------------------------------------------------

    def reset(self, row: Row) -> None:
        """Empty the row's queue (and what its handler writes), so each phase starts clean.

        Refuses (exits) while any other session is connected to the row's database: a
        worker left over from an earlier run (or from someone's own experiment) would
        claim items beside the measured one, and the drain and the wake-up probes would
        measure two workers."""
        if row.sqlite:
            for path in self.host.glob(f"{SQLITE_FILE}*"):
                path.unlink()
            return
        others = asyncio.run(_others_connected(_database(row)))
        if others:
            raise SystemExit(
                f"bench: {len(others)} other session(s) are connected to {_database(row)} "
                f"before {row.key}: {'; '.join(others)}. Stop that process (a worker left "
                "running would take items beside the measured one) and run again."
            )
        asyncio.run(_admin(_database(row), RESET[row.system]))

    def enqueue(self, row: Row, singles: int, items: int, api: str = "bulk") -> dict[str, Any]:
        """Time the enqueues; ours batches through `enqueue_*_bulk`, or `api="many"`."""
        args = ["--singles", str(singles), "--items", str(items), "--batch", str(BATCH)]
        if row.system == "ours":
            return self.ours_client(row, "enqueue", *args, "--api", api)
        cmd = [str(PEERS_PYTHON), str(BENCH / "peers.py"), "enqueue", "--system", row.system]
        return _json_out(
            [*cmd, "--dsn", _peer_dsn(row.system), *args], cwd=REPO, env=dict(os.environ)
        )

    def start_worker(self, row: Row, tag: str, wake_log: Path | None = None) -> WorkerProcess:
        log = self.logs / f"{row.key}.{tag}.log"
        if row.system == "ours":
            env = self.ours_env(row)
            port = free_port()
            env["SHIPMENT_NOTIFIER_METRICS_PORT"] = str(port)
            if wake_log:
                env["BENCH_WAKE_LOG"] = str(wake_log)
            worker = WorkerProcess(
                [str(self.host / ".venv" / "bin" / "shipment-notifier"), "serve"],
                cwd=self.host, env=env, log=log,
            )  # fmt: skip
            worker.port = port
            return worker
        env = dict(os.environ)
        if wake_log:
            env["BENCH_WAKE_LOG"] = str(wake_log)
        cmd = [str(PEERS_PYTHON), str(BENCH / "peers.py"), "worker", "--system", row.system]
        cmd += ["--dsn", _peer_dsn(row.system), "--concurrency", str(row.capacity)]
        cmd += ["--counts", str(self.logs / f"{row.key}.{tag}.counts.json")]
        return WorkerProcess(cmd, cwd=REPO, env=env, log=log)

    def wait_ready(self, row: Row, worker: WorkerProcess, timeout: float = 60.0) -> None:
        """Ours: `/healthz` answers 200. Peers: their worker registered (procrastinate) or a
        short settle (pgqueuer has no probe); then one more second of idling."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not worker.alive():
                raise SystemExit(f"bench: {row.key} worker exited early:\n{worker.tail()}")
            if row.system == "ours":
                try:
                    url = f"http://127.0.0.1:{worker.port}/healthz"
                    with urllib.request.urlopen(url, timeout=1) as answer:
                        if answer.status == 200:
                            break
                except (urllib.error.URLError, OSError):
                    pass
            elif row.system == "procrastinate":
                query = "SELECT count(*) FROM procrastinate_workers"
                if asyncio.run(_fetchval(_database(row), query)):
                    break
            elif time.monotonic() - worker.started > 3.0:
                break
            time.sleep(0.1)
        time.sleep(1.0)

    def done_count(
        self,
        row: Row,
        total: int,
        conn: asyncpg.Connection | None,
        loop: asyncio.AbstractEventLoop,
    ) -> int:
        """Items done so far (ours: COMPLETED rows; procrastinate: succeeded jobs;
        pgqueuer: rows gone from its queue table)."""
        if row.sqlite:
            path = self.host / SQLITE_FILE
            if not path.exists():
                return 0
            try:
                with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as db:
                    found = db.execute(_done_query(row, total)).fetchone()
            except sqlite3.Error:
                return 0
            return int(found[0]) if found else 0
        assert conn is not None
        return int(loop.run_until_complete(conn.fetchval(_done_query(row, total))))

    def drain(self, row: Row, total: int, m: Measurement) -> None:
        """Start a worker, poll until `total` items are done (or the timeout), stop it."""
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        conn = None if row.sqlite else loop.run_until_complete(
            asyncpg.connect(_admin_url(_database(row)))
        )  # fmt: skip
        try:
            worker = self.start_worker(row, "drain")
            done, finished = 0, None
            while True:
                worker.sampler.sample()
                done = self.done_count(row, total, conn, loop)
                if done >= total:
                    finished = time.monotonic()
                    break
                if not worker.alive():
                    m.notes.append(f"worker exited with {worker.proc.returncode}")
                    break
                if time.monotonic() - worker.started > DRAIN_TIMEOUT:
                    break
                time.sleep(POLL)
            elapsed = (finished or time.monotonic()) - worker.started
            cpu = worker.sampler.cpu_seconds
            code = worker.stop()
            if code not in (0, -signal.SIGTERM):
                m.notes.append(f"drain worker exit code {code}")
            m.completed = done
            m.partial = finished is None
            m.drain_seconds = round(elapsed, 3)
            m.items_per_s = round(done / elapsed, 1) if elapsed > 0 else None
            m.cpu_ms_per_item = round(cpu * 1000 / done, 3) if done else None
            m.peak_rss_mb = round(worker.sampler.hwm_mb, 1) if worker.sampler.hwm_mb else None
            if m.partial:
                m.notes.append(f"drain stopped after {elapsed:.0f} s: {done}/{total} done")
            self.check_end_state(row, total, m, worker, conn, loop)
        finally:
            if conn is not None:
                loop.run_until_complete(conn.close())
            loop.close()
            asyncio.set_event_loop(None)

    def check_end_state(
        self,
        row: Row,
        total: int,
        m: Measurement,
        worker: WorkerProcess,
        conn: asyncpg.Connection | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """All done, none twice; then the queue table's size and dead tuples."""
        if row.system == "ours":
            query = (
                "SELECT count(*), count(*) FILTER (WHERE status = 'COMPLETED' AND attempts = 1),"
                " count(*) FILTER (WHERE attempts > 1) FROM work_items"
            )
            if row.sqlite:
                with sqlite3.connect(self.host / SQLITE_FILE, timeout=30) as db:
                    rows, once, twice = db.execute(query).fetchone()
                size = sum(p.stat().st_size for p in self.host.glob(f"{SQLITE_FILE}*"))
                m.table_mb = round(size / 2**20, 2)  # the whole SQLite file
            else:
                assert conn is not None
                rows, once, twice = loop.run_until_complete(conn.fetchrow(query))
            m.end_state = f"{once}/{rows} completed after exactly 1 attempt, {twice} retried"
            m.end_state_ok = rows == total and once == total
        else:
            counts_file = self.logs / f"{row.key}.drain.counts.json"
            counts = json.loads(counts_file.read_text()) if counts_file.exists() else {}
            calls, distinct = counts.get("calls"), counts.get("distinct")
            assert conn is not None
            if row.system == "procrastinate":
                query = (
                    "SELECT count(*) FILTER (WHERE status = 'succeeded') FROM procrastinate_jobs"
                )
            else:
                query = "SELECT count(*) FROM pgqueuer"
            found = int(loop.run_until_complete(conn.fetchval(query)))
            remaining = found if row.system == "pgqueuer" else total - found
            m.end_state = (
                f"{total - remaining}/{total} done, handler calls {calls} ({distinct} distinct)"
            )
            m.end_state_ok = remaining == 0 and calls == total and distinct == total
        if m.partial:
            m.end_state_ok = None  # not judged: the drain was cut short
        if not row.sqlite:
            assert conn is not None
            # The worker has exited, so its backends flushed their statistics; force ours.
            loop.run_until_complete(conn.execute("SELECT pg_stat_force_next_flush()"))
            time.sleep(0.5)
            table = QUEUE_TABLE[row.system]
            size, dead = loop.run_until_complete(
                conn.fetchrow(
                    f"SELECT pg_total_relation_size('{table}'), (SELECT n_dead_tup FROM "
                    f"pg_stat_user_tables WHERE relname = '{table}')"
                )
            )
            m.table_mb = round(size / 2**20, 2)
            m.dead_tuples = dead

    def wake(self, row: Row, m: Measurement) -> None:
        """Wake-up latency of an idle, started worker: probes on a 20 ms cadence."""
        self.reset(row)
        wake_log = self.logs / f"{row.key}.wake.times"
        wake_log.unlink(missing_ok=True)
        if row.sqlite:
            self.enqueue(row, 0, 0)  # creates the SQLite tables before the worker polls
        worker = self.start_worker(row, "wake", wake_log=wake_log)
        try:
            self.wait_ready(row, worker)
            args = ["--count", str(WAKE_COUNT), "--cadence", str(WAKE_CADENCE)]
            if row.system == "ours":
                starts = self.ours_client(row, "wake", *args)["starts"]
            else:
                cmd = [str(PEERS_PYTHON), str(BENCH / "peers.py"), "wake", "--system", row.system]
                cmd += ["--dsn", _peer_dsn(row.system), *args]
                starts = _json_out(cmd, cwd=REPO, env=dict(os.environ))["starts"]
            handled: dict[str, float] = {}
            deadline = time.monotonic() + 15.0
            while time.monotonic() < deadline:
                if wake_log.exists():
                    for line in wake_log.read_text().splitlines():
                        marker, _, at = line.partition(" ")
                        if marker in starts and at:
                            handled.setdefault(marker, float(at))
                if len(handled) >= len(starts):
                    break
                time.sleep(0.1)
        finally:
            worker.stop()
        latencies = sorted((handled[k] - starts[k]) * 1000 for k in handled)
        m.wake_missing = len(starts) - len(handled)
        if latencies:
            m.wake_p50_ms = round(_percentile(latencies, 50), 1)
            m.wake_p95_ms = round(_percentile(latencies, 95), 1)
            m.wake_p99_ms = round(_percentile(latencies, 99), 1)
        if m.wake_missing:
            m.notes.append(f"wake-up: {m.wake_missing} probe(s) not handled within 15 s")

    def measure(self, row: Row) -> Measurement:
        """One run of one row: enqueue singles, enqueue batches, drain, wake-up."""
        m = Measurement()
        if row.system == "ours":
            self.set_handler(row)
        if row.fairness:
            self.fairness(row, m)
            return m
        self.reset(row)
        timed = self.enqueue(row, SINGLES, 0)
        m.enqueue_single_per_s = round(SINGLES / timed["single_seconds"], 1)
        if row.system == "ours":
            self.reset(row)
            timed = self.enqueue(row, 0, ITEMS, api="many")
            m.enqueue_many_per_s = round(ITEMS / timed["batch_seconds"], 1)
        self.reset(row)
        timed = self.enqueue(row, 0, ITEMS)
        m.enqueue_batch_per_s = round(ITEMS / timed["batch_seconds"], 1)
        self.drain(row, ITEMS, m)
        if row.wake:
            self.wake(row, m)
        return m

    def fair_drain(
        self, row: Row, total: int, probes: int, m: Measurement
    ) -> tuple[float, list[float]]:
        """Start a worker on the enqueued backlog; once it is ready, tenant B (a fresh one)
        enqueues `probes` probes at `FAIR_RATE` a second; poll until `total` plus them are
        done. The seconds from the worker's start to the last completion, and B's waits
        (ms, enqueue call to handler start, ascending). Samples CPU and RSS as `drain`."""
        wake_log = self.logs / f"{row.key}.fair.times"
        wake_log.unlink(missing_ok=True)
        loop = asyncio.new_event_loop()
        conn = loop.run_until_complete(asyncpg.connect(_admin_url(_database(row))))
        worker = self.start_worker(row, "fair", wake_log=wake_log)
        client = None
        try:
            self.wait_ready(row, worker)
            if probes:
                cmd = ["uv", "run", "--all-packages", "--offline", "python"]
                cmd += [str(BENCH / "ours_client.py"), "wake", "--url", self.ours_url(row)]
                cmd += ["--redis", REDIS, "--count", str(probes), "--cadence", str(1 / FAIR_RATE)]
                client = subprocess.Popen(
                    cmd, cwd=self.host, env=self.ours_env(row), stdout=subprocess.PIPE, text=True
                )
            finished = None
            while time.monotonic() - worker.started < DRAIN_TIMEOUT:
                worker.sampler.sample()
                if self.done_count(row, total, conn, loop) >= total + probes:
                    finished = time.monotonic()
                    break
                time.sleep(POLL)
            elapsed = (finished or time.monotonic()) - worker.started
            if finished is None:
                m.notes.append(f"fairness drain stopped after {elapsed:.0f} s")
            starts: dict[str, float] = {}
            if client is not None:
                out, _ = client.communicate(timeout=120)
                starts = json.loads(out.strip().splitlines()[-1])["starts"]
        finally:
            worker.stop()
            loop.run_until_complete(conn.close())
            loop.close()
        m.cpu_ms_per_item = round(worker.sampler.cpu_seconds * 1000 / max(total + probes, 1), 3)
        m.peak_rss_mb = round(worker.sampler.hwm_mb, 1) if worker.sampler.hwm_mb else None
        handled: dict[str, float] = {}
        if wake_log.exists():
            for line in wake_log.read_text().splitlines():
                marker, _, at = line.partition(" ")
                if marker in starts and at:
                    handled.setdefault(marker, float(at))
        if len(handled) < len(starts):
            m.notes.append(f"fairness: {len(starts) - len(handled)} probe(s) not handled")
        return elapsed, sorted((handled[k] - starts[k]) * 1000 for k in handled)

    def fairness(self, row: Row, m: Measurement) -> None:
        """The fairness row's phases (the module's docstring): (a) B alone, A alone, A and B
        together; (b) the spread over `FAIR_TENANTS` tenants."""
        self.reset(row)
        _, alone = self.fair_drain(row, 0, FAIR_RATE * 10, m)
        m.fair_b_alone_p95_ms = round(_percentile(alone, 95), 1) if alone else None
        self.reset(row)
        self.enqueue(row, 0, FAIR_ITEMS)
        elapsed, _ = self.fair_drain(row, FAIR_ITEMS, 0, m)
        m.fair_a_alone_per_s = round(FAIR_ITEMS / elapsed, 1)
        m.items_per_s = m.fair_a_alone_per_s
        # B enqueues for most of what A's drain took alone, from the worker's readiness on.
        probes = max(int(FAIR_RATE * (elapsed - 3.0) * 0.8), FAIR_RATE)
        self.reset(row)
        self.enqueue(row, 0, FAIR_ITEMS)
        elapsed, beside = self.fair_drain(row, FAIR_ITEMS, probes, m)
        m.fair_lane_per_s = round((FAIR_ITEMS + probes) / elapsed, 1)
        m.fair_b_p95_ms = round(_percentile(beside, 95), 1) if beside else None
        self.reset(row)
        self.ours_client(
            row, "spread", "--tenants", str(FAIR_TENANTS), "--items", str(FAIR_SPREAD_ITEMS)
        )
        total = int(asyncio.run(_fetchval(_database(row), "SELECT count(*) FROM work_items")))
        self.fair_drain(row, total, 0, m)
        waits = sorted(asyncio.run(_tenant_p95_ms(_database(row))))
        m.fair_spread_p95_ms = [round(w, 1) for w in waits]
        if waits:
            m.fair_spread_median_p95_ms = round(statistics.median(waits), 1)
            m.fair_spread_worst_p95_ms = round(waits[-1], 1)
        twice = int(asyncio.run(_fetchval(_database(row), _RETRIED)))
        m.end_state = f"{total} spread over {len(waits)} tenants, {twice} retried"
        m.end_state_ok = len(waits) == FAIR_TENANTS and twice == 0

    def pgbench(self) -> float | None:
        """tps of a one-row prepared `UPDATE ... RETURNING`, 4 clients: the server's floor."""
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"))
        binary = shutil.which("pgbench") or (str(found[-1]) if found else None)
        if binary is None:
            print("bench: pgbench not found (apt-get install postgresql-contrib); skipped")
            return None
        asyncio.run(
            _admin(
                "bench_pgbench",
                "DROP TABLE IF EXISTS floor",
                "CREATE TABLE floor (id int PRIMARY KEY, n bigint NOT NULL)",
                "INSERT INTO floor VALUES (1, 0)",
            )
        )
        script = self.logs / "pgbench.sql"
        script.write_text("UPDATE floor SET n = n + 1 WHERE id = 1 RETURNING n;\n")
        host, _, port = PG_HOST.partition(":")
        user = ADMIN.split("://", 1)[1].split("@", 1)[0].split(":", 1)[0]
        done = subprocess.run(
            [binary, "-h", host, "-p", port or "5432", "-U", user, "-n", "-M", "prepared",
             "-c", "4", "-j", "2", "-T", str(PGBENCH_SECONDS), "-f", str(script),
             "bench_pgbench"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        tps = re.search(r"tps = ([\d.]+)", done.stdout)
        if done.returncode != 0 or not tps:
            print(f"bench: pgbench failed: {done.stderr.strip()[-500:]}")
            return None
        return round(float(tps.group(1)), 1)

    def wake_floor(self) -> dict[str, float] | None:
        """The wake-up's floor on this server, in ms (p50, p95): `_wake_floor`."""
        latencies = asyncio.run(_wake_floor(WAKE_COUNT, WAKE_CADENCE))
        if not latencies:
            return None
        return {
            "p50_ms": round(_percentile(latencies, 50), 2),
            "p95_ms": round(_percentile(latencies, 95), 2),
        }

    def notify_floor(self) -> dict[str, float] | None:
        """The wake-up's floor across processes, NOTIFY-woken, in ms (p50, p95):
        `notify_floor.measure` on `BENCH_WAKE_COUNT` rows at the wake-up cadence."""
        try:
            latencies = notify_floor.measure(_admin_url("bench_pgbench"), WAKE_COUNT, WAKE_CADENCE)
        except (RuntimeError, OSError, subprocess.SubprocessError, ValueError) as exc:
            print(f"bench: the NOTIFY wake-up floor was not measured: {exc}")
            return None
        if not latencies:
            return None
        return {
            "p50_ms": round(_percentile(latencies, 50), 2),
            "p95_ms": round(_percentile(latencies, 95), 2),
        }

    def audit_batch(self) -> dict[str, float] | None:
        """One `Managers.audit.append_many` of ten entries in the host (ms of wall and of
        CPU, medians of 200): what the default handler's row pays per batch of ten items
        at capacity 10 (the worker's group commit writes one batch per claim of ten)."""
        row = next(r for r in ROWS if r.key == "ours_default_c10")
        try:
            found = self.ours_client(row, "audit", "--batches", "200", "--size", "10")
        except SystemExit as exc:
            print(f"bench: the audit batch was not measured: {exc}")
            return None
        return {"wall_ms": round(found["wall_ms"], 2), "cpu_ms": round(found["cpu_ms"], 2)}


# The wake-up floor's table: `notify_floor`'s, without its trigger (no notification).
_FLOOR_TABLE = "wake_floor"


async def _wake_floor(count: int, cadence: float) -> list[float]:
    """Milliseconds, ascending, from sending a one-row INSERT on one connection to the
    return of the UPDATE ... RETURNING that claims that row on a second, `count` times, one
    every `cadence` s. Both run alone (autocommit), so each is committed, and flushed to
    the WAL, before it returns: the two durable commits a wake-up that keeps both the
    enqueue and the claim durable pays, with no transport, no wake-up message and no
    Python but the driver's between them. Prepared statements, in `bench_pgbench`: the
    table, insert and claim of `notify_floor`, so the two floors differ only by the
    notification and the second process."""
    first = await asyncpg.connect(_admin_url("bench_pgbench"))
    second = await asyncpg.connect(_admin_url("bench_pgbench"))
    try:
        made = notify_floor.table_sql(_FLOOR_TABLE, notify=False)
        for statement in made:
            await first.execute(statement)
        insert = await first.prepare(notify_floor.insert_sql(_FLOOR_TABLE))
        claim = await second.prepare(notify_floor.claim_sql(_FLOOR_TABLE))
        latencies: list[float] = []
        for _ in range(count):
            started = time.perf_counter()
            await insert.fetch(uuid.uuid4(), json.dumps({"record_id": str(uuid.uuid4())}))
            claimed = await claim.fetch()
            if claimed:
                latencies.append((time.perf_counter() - started) * 1000)
            await asyncio.sleep(cadence)
        for statement in made[:2]:
            await first.execute(statement)
        return sorted(latencies)
    finally:
        await first.close()
        await second.close()


def _percentile(ordered: list[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, -(-len(ordered) * pct // 100))
    return ordered[int(rank) - 1]


# -- report --------------------------------------------------------------------------------

COLUMNS = [
    ("items/s", "items_per_s", 9),
    ("enq batch/s", "enqueue_batch_per_s", 12),
    ("enq many/s", "enqueue_many_per_s", 11),
    ("enq 1x1/s", "enqueue_single_per_s", 10),
    ("wake p50", "wake_p50_ms", 9),
    ("p95", "wake_p95_ms", 8),
    ("p99 ms", "wake_p99_ms", 8),
    ("CPU ms/it", "cpu_ms_per_item", 10),
    ("RSS MB", "peak_rss_mb", 8),
    ("table MB", "table_mb", 9),
    ("dead tup", "dead_tuples", 9),
]
METRICS = [key for _, key, _ in COLUMNS]
FAIR_METRICS = [
    "fair_b_alone_p95_ms",
    "fair_b_p95_ms",
    "fair_a_alone_per_s",
    "fair_lane_per_s",
    "fair_spread_median_p95_ms",
    "fair_spread_worst_p95_ms",
]


def medians(runs: list[Measurement]) -> dict[str, Any]:
    """Median of every metric over the runs that measured it; `partial` if any run was."""
    out: dict[str, Any] = {}
    for key in METRICS + FAIR_METRICS:
        values = [getattr(m, key) for m in runs if getattr(m, key) is not None]
        out[key] = round(statistics.median(values), 3) if values else None
    out["partial"] = any(m.partial for m in runs)
    out["end_state_ok"] = all(m.end_state_ok is not False for m in runs)
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value >= 100:
        return f"{value:.0f}"
    if isinstance(value, float):
        return f"{value:.2f}" if value < 10 else f"{value:.1f}"
    return str(value)


def print_table(rows: list[Row], med: dict[str, dict[str, Any]]) -> None:
    head = f"{'system':<38}{'capacity':<14}" + "".join(f"{t:>{w}}" for t, _, w in COLUMNS)
    print(head)
    print("-" * len(head))
    for row in rows:
        got = med[row.key]
        cells = []
        for _, key, width in COLUMNS:
            text = _fmt(got[key])
            if key == "items_per_s" and got["partial"]:
                text += "*"
            cells.append(f"{text:>{width}}")
        flag = "" if got["end_state_ok"] else "  END STATE WRONG"
        print(f"{row.label:<38}{row.capacity_label:<14}" + "".join(cells) + flag)
    if any(med[r.key]["partial"] for r in rows):
        print(f"* the drain hit BENCH_DRAIN_TIMEOUT={DRAIN_TIMEOUT:.0f} s: the partial rate")


def print_fairness(
    rows: list[Row], med: dict[str, dict[str, Any]], runs: dict[str, list[Measurement]]
) -> None:
    """The fairness row's figures (docs/decisions/0037), medians of the runs."""
    for row in (r for r in rows if r.fairness):
        got = med[row.key]
        print(
            f"\nfairness, capacity {row.capacity} ({FAIR_ITEMS} items of A; {FAIR_RATE}/s of B;"
            f" {FAIR_SPREAD_ITEMS} over {FAIR_TENANTS} tenants, one holding half)"
        )
        print(
            f"  (a) B's p95 wait: alone {_fmt(got['fair_b_alone_p95_ms'])} ms, beside A's"
            f" backlog {_fmt(got['fair_b_p95_ms'])} ms; drain: A alone"
            f" {_fmt(got['fair_a_alone_per_s'])} items/s, A and B {_fmt(got['fair_lane_per_s'])}"
        )
        print(
            f"  (b) p95 wait per tenant: median {_fmt(got['fair_spread_median_p95_ms'])} ms,"
            f" worst {_fmt(got['fair_spread_worst_p95_ms'])} ms"
        )
        for n, m in enumerate(runs[row.key], 1):
            print(f"      run {n}, every tenant's p95 (ms, ascending): {m.fair_spread_p95_ms}")


def print_ratios(rows: list[Row], med: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Ours / peer for every peer row, against the ours row it is paired with."""
    ratios: dict[str, dict[str, Any]] = {}
    keys = {
        "items_per_s": "items/s",
        "enqueue_batch_per_s": "enq batch",
        "enqueue_single_per_s": "enq 1x1",
        "wake_p50_ms": "wake p50",
        "wake_p95_ms": "wake p95",
        "cpu_ms_per_item": "CPU/item",
        "peak_rss_mb": "RSS",
    }
    present = {r.key for r in rows}
    pairs = [r for r in rows if r.versus and r.versus in present]
    if not pairs:
        return ratios
    print("\nours / peer (items/s and enqueue: higher is better; wake-up, CPU, RSS: lower)")
    print(f"{'ours row':<20}{'peer row':<20}" + "".join(f"{t:>10}" for t in keys.values()))
    for peer in pairs:
        assert peer.versus is not None
        ours, theirs = med[peer.versus], med[peer.key]
        found = {k: _ratio(ours[k], theirs[k]) for k in keys}
        ratios[f"{peer.versus}/{peer.key}"] = found
        cells = "".join(f"{_fmt(v):>10}" for v in found.values())
        print(f"{peer.versus:<20}{peer.key:<20}" + cells)
    return ratios


def _ratio(ours: float | None, peer: float | None) -> float | None:
    return round(ours / peer, 3) if ours is not None and peer else None


def _selected(target: dict[str, Any], present: set[str]) -> bool:
    """Whether `target`'s rows were all selected (`BENCH_ROWS`): ours, and its peer row or
    one of the rows it picks among; a floor's target needs only ours."""
    peer = target["peer"]
    if isinstance(peer, str):
        needed = {peer}
    elif isinstance(peer, dict) and "among" in peer:
        needed = {next((k for k in peer["among"] if k in present), peer["among"][0])}
    else:
        needed = set()
    return target["ours"] in present and needed <= present


def check_targets(
    targets: dict[str, Any],
    rows: list[Row],
    med: dict[str, dict[str, Any]],
    floors: dict[str, dict[str, float] | None],
) -> list[dict[str, Any]]:
    """Every floor of targets.json, judged on the medians: ratio = ours / peer, where the
    peer is a row, the row lowest in a metric, or a floor measured in the run (`floors`:
    name -> its medians, None when not measured)."""
    present = {r.key for r in rows}
    results = []
    print("\ntargets (bench/targets.json, ours / peer, same run)")
    if len(present) < len(ROWS):
        print("  (BENCH_ROWS: a target over a row not selected is `not run`, not missed)")
    for target in targets["targets"]:
        peer = target["peer"]
        ours_key, metric, floor = target["ours"], target["metric"], target["ratio"]
        value = None
        if isinstance(peer, dict) and set(peer) == {"metric"}:  # the same row's other metric
            if ours_key in present:
                value = _ratio(med[ours_key][metric], med[ours_key][peer["metric"]])
            peer = ours_key
        elif isinstance(peer, dict) and "floor" in peer:  # {"floor": name, "metric": its key}
            measured = floors.get(peer["floor"])
            if measured and ours_key in present:
                value = _ratio(med[ours_key][metric], measured.get(peer["metric"]))
            peer = peer["floor"]
        else:
            if isinstance(peer, dict):  # {"lowest": metric, "among": [row keys]}
                among = [k for k in peer["among"] if k in present and med[k][peer["lowest"]]]
                peer = min(among, key=lambda k: med[k][peer["lowest"]]) if among else None
            if peer and peer in present and ours_key in present:
                value = _ratio(med[ours_key][metric], med[peer][metric])
        if value is None and not _selected(target, present):
            ok, verdict = True, "not run"
        elif value is None:
            ok, verdict = False, "NOT MEASURED"
        else:
            ok = value >= floor if target["op"] == ">=" else value <= floor
            verdict = "ok" if ok else "MISSED"
        results.append({**target, "peer_row": peer, "value": value, "ok": ok})
        shown = "-" if value is None else f"{value:.3f}"
        print(f"  {verdict:<13}{target['name']:<62} {shown:>8} {target['op']} {floor}")
    for shown_only in targets.get("reported", []):  # ratios with no floor
        ours_key, peer, metric = shown_only["ours"], shown_only["peer"], shown_only["metric"]
        value = None
        if ours_key in present and peer in present:
            value = _ratio(med[ours_key][metric], med[peer][metric])
        results.append({**shown_only, "value": value, "ok": True})
        print(f"  {'reported':<13}{shown_only['name']:<62} {_fmt(value):>8}")
    for metric in targets.get("reported_for_every_row", []):
        missing = [r.key for r in rows if med[r.key][metric] is None]
        ok = not missing
        results.append({"name": f"{metric} reported for every row", "ok": ok, "missing": missing})
        verdict = "ok" if ok else "MISSED"
        print(
            f"  {verdict:<13}{metric} reported for every row" + (f": {missing}" if missing else "")
        )
    return results


def _median_of(runs: list[dict[str, float]]) -> dict[str, float] | None:
    """Each key's median over the runs that measured it; None when none did."""
    if not runs:
        return None
    return {key: round(statistics.median(run[key] for run in runs), 2) for key in runs[0]}


def print_beneath(
    med: dict[str, dict[str, Any]],
    verdicts: list[dict[str, Any]],
    wake_floor: dict[str, float] | None,
    notify: dict[str, float] | None,
    audit_batch: dict[str, float] | None,
) -> dict[str, Any]:
    """What the server and the host allow beneath the wake-up p50 and default-handler
    targets, measured in this run beside them (docs/performance.md, "Beneath two targets")."""
    found: dict[str, Any] = {}
    if wake_floor is None and notify is None and audit_batch is None:
        return found
    print("\nbeneath two targets (same run)")
    if wake_floor is not None:
        found["wake_floor"] = wake_floor
        print(
            f"  wake-up floor: a durable insert, then its durable claim from a second "
            f"connection, nothing between: p50 {wake_floor['p50_ms']:.2f} ms, "
            f"p95 {wake_floor['p95_ms']:.2f} ms"
        )
        target = next(
            (v for v in verdicts if v.get("metric") == "wake_p50_ms" and v["peer_row"] in med),
            None,
        )
        peer = target.get("peer_row") if target else None
        if target and peer and med[peer]["wake_p50_ms"]:
            allowed = target["ratio"] * med[peer]["wake_p50_ms"]
            found["wake_p50_allowed_ms"] = round(allowed, 2)
            found["wake_p50_allowed_over_floor"] = round(allowed / wake_floor["p50_ms"], 3)
            print(
                f"    the p50 target allows ours {allowed:.2f} ms ({target['ratio']} x "
                f"{peer}'s {med[peer]['wake_p50_ms']:.2f}): "
                f"{allowed / wake_floor['p50_ms']:.2f} x that floor"
            )
    if notify is not None:
        found["notify_floor"] = notify
        print(
            f"  the same across two processes, NOTIFY-woken, no framework (bench/notify_floor.py):"
            f" p50 {notify['p50_ms']:.2f} ms, p95 {notify['p95_ms']:.2f} ms"
        )
        walls = {
            key: med[key]["wake_p50_ms"]
            for key in ("ours_c10", "procrastinate_c10", "pgqueuer_c10")
            if key in med and med[key]["wake_p50_ms"]
        }
        if walls:
            found["wake_p50_over_notify_floor"] = {
                key: round(wall / notify["p50_ms"], 3) for key, wall in walls.items()
            }
            shown = ", ".join(f"{key} {wall / notify['p50_ms']:.2f}" for key, wall in walls.items())
            print(f"    each row's wake-up p50 as a multiple of it: {shown}")
        if "wake_p50_allowed_ms" in found:
            allowed = found["wake_p50_allowed_ms"]
            found["wake_p50_allowed_over_notify_floor"] = round(allowed / notify["p50_ms"], 3)
            print(
                f"    the p50 target allows ours {allowed:.2f} ms: "
                f"{allowed / notify['p50_ms']:.2f} x this floor"
            )
    if audit_batch is not None:
        found["audit_batch"] = audit_batch
        print(
            f"  the host's audit batch (Managers.audit.append_many, 10 entries, one funnel "
            f"session): {audit_batch['wall_ms']:.2f} ms wall, {audit_batch['cpu_ms']:.2f} ms CPU"
            f"; per item {audit_batch['wall_ms'] / 10:.3f} ms wall, "
            f"{audit_batch['cpu_ms'] / 10:.3f} ms CPU"
        )
        rate = med.get("ours_c10", {}).get("items_per_s")
        if rate:
            cycle = 10_000 / rate  # ms the no-op row takes per ten items at capacity 10
            bound = cycle / (cycle + audit_batch["wall_ms"])
            found["noop_ms_per_10"] = round(cycle, 2)
            found["default_bound_if_serial"] = round(bound, 3)
            print(
                f"    the no-op row takes {cycle:.2f} ms per ten items at capacity 10; one "
                f"such batch more per ten, in series, leaves {bound:.2f} of its rate"
            )
    return found


# -- main ----------------------------------------------------------------------------------


def _reserved_connections(host: Path, env: dict[str, str]) -> int:
    """The pool beside the handler slots: 4, or more when the rendered settings reserve more
    (their `RESERVED_CONNECTIONS`; a worker refuses to start on a smaller pool)."""
    code = (
        "from acme.workers.runtime import settings as s;"
        "print(sum(getattr(s, 'RESERVED_CONNECTIONS', {}).values()))"
    )
    done = subprocess.run(
        [str(host / ".venv" / "bin" / "python"), "-c", code],
        cwd=host, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    reserved = int(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else 0
    return max(4, reserved)


def prepare(peers: bool = True) -> Bench:
    """Render, sync, migrate; with `peers` (a row of theirs, or a floor, is measured) the
    peers' databases and schemas; the peers' virtualenv."""
    if peers and not PEERS_PYTHON.exists():
        raise SystemExit(
            "bench: .bench/peers-venv is missing: run `make bench` (it installs "
            "bench/requirements-peers.txt there)"
        )
    print("bench: rendering shipment-notifier into .bench/render/host", flush=True)
    host = demo.prepare_host(WORK / "render")
    demo.render(host, demo.Worker(*demo.FIRST, port=0, log=WORK / "render" / "unused.log"))
    env = demo.host_env(demo.Backend("bench", None, None, None, None), [])
    demo.run(["uv", "sync", "--offline", "--all-packages", "--quiet"], cwd=host, env=env)
    # Every system starts from compiled bytecode, as a deployed image does: a process that
    # compiles its imports at start (PYTHONDONTWRITEBYTECODE, a fresh venv) pays seconds
    # of CPU that no queue spends in production.
    trees = [(host / ".venv/bin/python", host)]
    if peers:
        trees.append((PEERS_PYTHON, PEERS_PYTHON.parents[1]))
    for python, tree in trees:
        demo.run([str(python), "-m", "compileall", "-q", "-j", "0", str(tree)], cwd=REPO, env=env)
    demo.run(["bash", "scripts/infra-up.sh"], cwd=host, env=env)
    asyncio.run(_recreate_databases(peers))
    owner = f"postgresql+asyncpg://acme_owner@{PG_HOST}/{OURS_DB}"
    demo.run(["make", "migrate"], cwd=host, env={**env, "ACME_MIGRATION_URL": owner})
    for system in ("procrastinate", "pgqueuer") if peers else ():
        cmd = [str(PEERS_PYTHON), str(BENCH / "peers.py"), "install", "--system", system]
        _json_out([*cmd, "--dsn", _peer_dsn(system)], cwd=REPO, env=dict(os.environ))
    logs = WORK / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    return Bench(host, env, (host / HANDLER).read_text(), logs, _reserved_connections(host, env))


def main() -> int:
    began = time.monotonic()
    targets = json.loads((BENCH / "targets.json").read_text())
    wanted = [k for k in os.environ.get("BENCH_ROWS", "").split(",") if k]
    # The fairness row alone needs neither the peers nor the floors measured beside them.
    peers = not wanted or any(not r.fairness for r in ROWS if r.key in wanted)
    bench = prepare(peers)
    rows = [replace(r, pool_extra=bench.pool_extra) for r in ROWS if not wanted or r.key in wanted]
    if bench.pool_extra != 4:
        print(f"bench: the rendered settings reserve {bench.pool_extra} connections: pool = "
              f"capacity + {bench.pool_extra}")  # fmt: skip
    versions = _json_out([str(PEERS_PYTHON), str(BENCH / "peers.py"), "versions"], cwd=REPO,
                         env=dict(os.environ)) if peers else {}  # fmt: skip
    runs: dict[str, list[Measurement]] = {r.key: [] for r in rows}
    pgbench: list[float] = []
    wake_floors: list[dict[str, float]] = []
    notify_floors: list[dict[str, float]] = []
    audit_batches: list[dict[str, float]] = []
    keys = {r.key for r in rows}
    for n in range(RUNS):
        for row in rows:
            started = time.monotonic()
            m = bench.measure(row)
            runs[row.key].append(m)
            notes = f"; {'; '.join(m.notes)}" if m.notes else ""
            print(
                f"bench: run {n + 1}/{RUNS} {row.key}: {_fmt(m.items_per_s)} items/s "
                f"({m.end_state}){notes} [{time.monotonic() - started:.0f} s]",
                flush=True,
            )
        tps = bench.pgbench() if peers else None
        if tps is not None:
            pgbench.append(tps)
        if "ours_c10" in keys and (found := bench.wake_floor()) is not None:
            wake_floors.append(found)
        if "ours_c10" in keys and (found := bench.notify_floor()) is not None:
            notify_floors.append(found)
        if "ours_default_c10" in keys and (found := bench.audit_batch()) is not None:
            audit_batches.append(found)
    bench.set_handler(Row("restore", "", "ours", 1, handler="default"))
    med = {key: medians(found) for key, found in runs.items()}
    elapsed = time.monotonic() - began

    print(
        f"\n{RUNS} run(s), {ITEMS} items drained, {SINGLES} single enqueues, batches of {BATCH}; "
        f"medians. Peers: " + ", ".join(f"{k} {v}" for k, v in versions.items())
    )
    print_table(rows, med)
    print_fairness(rows, med, runs)
    floor = statistics.median(pgbench) if pgbench else None
    print(f"\npgbench floor (one-row prepared UPDATE ... RETURNING, 4 clients): {_fmt(floor)} tps")
    ratios = print_ratios(rows, med)
    verdicts = check_targets(targets, rows, med, {"notify_floor": _median_of(notify_floors)})
    beneath = print_beneath(
        med,
        verdicts,
        _median_of(wake_floors),
        _median_of(notify_floors),
        _median_of(audit_batches),
    )
    wrong = [r.key for r in rows if not med[r.key]["end_state_ok"]]
    if wrong:
        print(f"\nbench: wrong end state (an item not done, or done twice) on: {', '.join(wrong)}")
    missed = [v["name"] for v in verdicts if not v["ok"]]
    print(f"\nbench: {elapsed / 60:.1f} min; results in .bench/results.json")
    result = {
        "config": {
            "runs": RUNS,
            "items": ITEMS,
            "singles": SINGLES,
            "batch": BATCH,
            "drain_timeout_s": DRAIN_TIMEOUT,
            "wake_count": WAKE_COUNT,
            "wake_cadence_s": WAKE_CADENCE,
            "fairness": {
                "items": FAIR_ITEMS,
                "rate_per_s": FAIR_RATE,
                "tenants": FAIR_TENANTS,
                "spread_items": FAIR_SPREAD_ITEMS,
            },
            "best_capacity": {"capacity": BEST_CAPACITY, "pool": BEST_CAPACITY + bench.pool_extra},
        },
        "versions": versions,
        "rows": {r.key: asdict(r) | {"capacity_label": r.capacity_label} for r in rows},
        "ours_worker_env": {
            r.key: Bench.ours_knobs(r) | {"SHIPMENT_NOTIFIER_METRICS_PORT": "<free port>"}
            for r in rows
            if r.system == "ours"
        },
        "runs": {key: [asdict(m) for m in found] for key, found in runs.items()},
        "medians": med,
        "ratios": ratios,
        "pgbench_tps": {"runs": pgbench, "median": floor},
        "wake_floor": {"runs": wake_floors, "median": beneath.get("wake_floor")},
        "notify_floor": {"runs": notify_floors, "median": beneath.get("notify_floor")},
        "audit_batch": {"runs": audit_batches, "median": beneath.get("audit_batch")},
        "beneath": beneath,
        "targets": verdicts,
        "missed": missed,
        "wrong_end_state": wrong,
        "elapsed_s": round(elapsed, 1),
    }
    (WORK / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    if missed:
        print("bench: missed: " + "; ".join(missed))
    return 1 if missed or wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
