"""`make bench-scale`'s upgrade phase: the oldest supported release, migrated under traffic.

A host rendered at the 0.1.0 release (`tests/conftest.py`'s `RELEASE_0_1_0`, tagged
`v0.1.0` in a clone of this repository whose `HEAD` is tagged `v0.2.0`) is migrated in a
database of its own (`acme_upgrade`, in `scale.Scale`'s cluster), given `HISTORY` completed
rows and `DUE` due items, and drained by two of its own workers (its default handler) while
`BENCH_SCALE_UPGRADE_RATE` (50) items/s are enqueued. A copy of it updated to `v0.2.0` then
applies the pending queue revisions one at a time, as `make migrate` would, the old workers
still running (a rolling upgrade: the schema first, the workers after).

Per revision: its seconds, the longest gap between two completions (from `completed_at`)
across its run, and the enqueues' p99 and slowest while it ran; beside them the longest
gap with no revision running (the settle periods), which the old workers' own statements
leave on a table this size. A revision that gives up on
its `lock_timeout` is run again, as docs/updating.md tells an operator, after a pause of
`RETRY_PAUSE_S`, at most `BENCH_SCALE_UPGRADE_TRIES` (5) tries in all; its tries and the
longest transactions open when each gave up are recorded. Bound: no revision written
under the safe-revision rule (any not in `tests/test_revision_rule.py`'s `FROZEN`) stalls
completions or an enqueue longer than `STALL_BOUND_S` (3 s). The frozen ones are reported
(docs/updating.md, "Revisions on a big table", gives their by-hand recipe).
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import math
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import asyncpg
import chaos  # scripts/, on the path scale_cluster sets (bench/scale.py imports it first)
import copier
import demo
import scale_cluster as sc
from run import WorkerProcess, _env_int
from work_network import free_port

sys.path.insert(0, str(sc.REPO / "tests"))
# The 0.1.0 release commit the tests' release history uses, and the revisions shipped
# before the safe-revision rule (tests/test_revision_rule.py), reused as they are.
RELEASE_0_1_0: str = importlib.import_module("conftest").RELEASE_0_1_0
_RULE = importlib.import_module("test_revision_rule")
FROZEN: Mapping[str, object] = _RULE.FROZEN
STAMP: str = _RULE.STAMP

RATE = _env_int("BENCH_SCALE_UPGRADE_RATE", 50)
WORKERS = 2
STALL_BOUND_S = 3.0
SETTLE_S = _env_int("BENCH_SCALE_UPGRADE_SETTLE_S", 20)
TRIES = _env_int("BENCH_SCALE_UPGRADE_TRIES", 5)
RETRY_PAUSE_S = 5.0
DATABASE = "acme_upgrade"
ROOT = sc.WORK / "scale" / "upgrade"
REVISIONS = Path("om/migrations/versions/queue")
_REVISION = re.compile(r'^revision = "([^"]+)"', re.MULTILINE)
_DOWN = re.compile(r'^down_revision = "([^"]+)"', re.MULTILINE)
_SQL = re.compile(r'run_sql_file\("queue/([^"]+\.up\.sql)"\)')


def template_releases(dst: Path) -> Path:
    """This repository's committed `HEAD` cloned into `dst`: `v0.1.0` at the 0.1.0 release,
    `v0.2.0` at `HEAD` (uncommitted changes are not in it)."""
    subprocess.run(["git", "clone", "-q", str(sc.REPO), str(dst)], check=True, timeout=300)
    for tag, commit in (("v0.1.0", RELEASE_0_1_0), ("v0.2.0", "HEAD")):
        subprocess.run(["git", "-C", str(dst), "tag", tag, commit], check=True)
    return dst


def _commit(host: Path, message: str) -> None:
    git = ["git", "-c", "user.email=bench@example.invalid", "-c", "user.name=bench"]
    demo.run([*git, "add", "-A"], cwd=host)
    demo.run([*git, "commit", "-q", "--allow-empty", "-m", message], cwd=host)


def pending_revisions(host: Path, current: str) -> list[tuple[str, str]]:
    """The queue revisions after `current` in `host`, oldest first: (revision, its up SQL
    file with the stamp taken off, as `FROZEN` names it). Raises `SystemExit` on a gap."""
    after: dict[str, tuple[str, str]] = {}
    for path in (host / REVISIONS).glob("*.py"):
        text = path.read_text(encoding="utf-8")
        revision, down, sql = _REVISION.search(text), _DOWN.search(text), _SQL.search(text)
        if revision and down and sql:
            after[down.group(1)] = (revision.group(1), sql.group(1).split("_", 1)[1])
    chain, at = [], current
    while at in after:
        chain.append(after[at])
        at = chain[-1][0]
    if not chain:
        raise SystemExit(f"bench-scale: no queue revision after {current} in {host / REVISIONS}")
    return chain


def lock_timed_out(output: str) -> bool:
    """Whether a failed `migrate` gave up on a lock: PostgreSQL's `lock_timeout` error
    (SQLSTATE 55P03, "canceling statement due to lock timeout"), as asyncpg raises it."""
    return "LockNotAvailableError" in output or "due to lock timeout" in output


def frozen(sql_file: str) -> bool:
    """Whether the revision of `sql_file` (stamp taken off) shipped before the rule."""
    return any(name.removeprefix(f"{STAMP}_") == sql_file for name in FROZEN)


class Upgrade:
    """The old host (rendered at `v0.1.0`) and its updated copy, over `scale`'s cluster."""

    def __init__(self, scale: sc.Scale) -> None:
        self.scale = scale
        self.old = ROOT / "old" / "host"
        self.new = ROOT / "new" / "host"
        owner = scale.pg.url("acme_owner", DATABASE)
        self.migration_url = owner.replace("postgresql:", "postgresql+asyncpg:")
        app = scale.pg.url("acme_app", DATABASE).replace("postgresql:", "postgresql+asyncpg:")
        self.env = {**chaos.host_env(), "ACME_DATABASE_URL": app}

    def prepare(self) -> None:
        """Render at `v0.1.0`, sync, make the database and migrate it; copy the host and
        update the copy to `v0.2.0` (no database step)."""
        if ROOT.exists():
            shutil.rmtree(ROOT)
        template = template_releases(ROOT / "worker-template")
        sc.say("upgrade: shipment-notifier at v0.1.0 in a fresh reference host")
        old = demo.prepare_host(self.old.parent)
        copier.run_copy(
            str(template), str(old), vcs_ref="v0.1.0", unsafe=True, defaults=True, quiet=True,
            data={"worker_name": "shipment-notifier", "work_kind": "NOTIFY_SHIPMENT"},
        )  # fmt: skip
        _commit(old, "shipment-notifier at v0.1.0")
        shutil.copytree(old, self.new, symlinks=True)
        self._sync(old)
        infra = {
            **self.env,
            "ACME_PGHOST": "127.0.0.1",
            "ACME_PGPORT": str(self.scale.pg.port),
            "ACME_DATABASE": DATABASE,
        }
        demo.run(["bash", "scripts/infra-up.sh"], cwd=old, env=infra)
        self.migrate(old)
        sc.say("upgrade: the copy updated to v0.2.0 (copier update; the database untouched)")
        copier.run_update(
            str(self.new), answers_file="workers/shipment-notifier/.copier-answers.yml",
            vcs_ref="v0.2.0", unsafe=True, defaults=True, overwrite=True, skip_answered=True,
            quiet=True,
        )  # fmt: skip
        _commit(self.new, "shipment-notifier at v0.2.0")
        self._sync(self.new)

    def _sync(self, host: Path) -> None:
        demo.run(
            ["uv", "sync", "--offline", "--all-packages", "--quiet", "--compile-bytecode"],
            cwd=host,
            env=self.env,
        )

    def migrate(self, host: Path, *args: str) -> None:
        """`python -m acme.om.migrate upgrade [args]` in `host`, as its `make migrate` runs it."""
        demo.run(
            [str(host / ".venv" / "bin" / "python"), "-m", "acme.om.migrate", "upgrade", *args],
            cwd=host,
            env={**self.env, "ACME_MIGRATION_URL": self.migration_url},
        )

    def migrate_to(self, revision: str) -> subprocess.CompletedProcess[str]:
        """The queue role to `revision`, once; the finished process (never raises)."""
        return subprocess.run(
            [str(self.new / ".venv" / "bin" / "python"), "-m", "acme.om.migrate", "upgrade",
             "--role", "queue", "--to", revision],
            cwd=self.new, env={**self.env, "ACME_MIGRATION_URL": self.migration_url},
            capture_output=True, text=True, check=False,
        )  # fmt: skip

    def start_worker(self, tag: str) -> WorkerProcess:
        """One of the old host's `serve` processes at capacity `CAPACITY`."""
        env = {
            **self.env,
            f"{sc.PREFIX}CAPACITY": str(sc.CAPACITY),
            f"{sc.PREFIX}DATABASE_POOL_SIZE": str(sc.CAPACITY + 5),
            f"{sc.PREFIX}METRICS_PORT": str(free_port()),
            f"{sc.PREFIX}COMPLETED_RETENTION": str(sc.RETENTION_S),
            "ACME_LOG_LEVEL": "WARNING",
        }
        cmd = [str(self.old / ".venv" / "bin" / "shipment-notifier"), "serve"]
        return WorkerProcess(cmd, cwd=self.old, env=env, log=self.scale.logs / f"{tag}.log")


async def _enqueue(
    conn: asyncpg.Connection, stop: asyncio.Event, sent_at: list[tuple[float, float]]
) -> None:
    """One due item per 1/RATE s (tenants in turn) until `stop`, each as (epoch seconds at
    send, seconds it took) into `sent_at`; the insert the 0.1.0 schema takes."""
    orgs = [r["id"] for r in await conn.fetch("SELECT id FROM orgs WHERE name LIKE 'scale-%'")]
    statement = await conn.prepare(
        "INSERT INTO work_items (id, org_id, kind, lane, payload, status, attempts, max_attempts,"
        " available_at, created_at, updated_at, created_by, updated_by)"
        " VALUES (gen_random_uuid(), $1, 'NOTIFY_SHIPMENT', 'default',"
        " jsonb_build_object('record_id', gen_random_uuid()), 'AVAILABLE', 0, 5,"
        f" statement_timestamp(), statement_timestamp(), statement_timestamp(), '{sc.EMPTY}',"
        f" '{sc.EMPTY}')"
    )
    started, sent = time.monotonic(), 0
    while not stop.is_set():
        if (wait := started + sent / RATE - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        began = time.time()
        await statement.fetch(orgs[sent % len(orgs)])
        sent_at.append((began, time.time() - began))
        sent += 1


def longest_gap(completions: list[float], start: float, end: float) -> float:
    """The longest time without a completion that overlaps [start, end] (epoch seconds),
    counting from the last completion before `start` to the first after `end`."""
    before = [t for t in completions if t < start]
    inside = [t for t in completions if start <= t <= end]
    after = [t for t in completions if t > end]
    points = before[-1:] + inside + after[:1]
    if len(points) < 2:
        return end - start
    return max(b - a for a, b in itertools.pairwise(points))


def _p99_ms(latencies: list[float]) -> float | None:
    if not latencies:
        return None
    ordered = sorted(latencies)
    return round(ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)] * 1000, 1)


async def upgrade(scale: sc.Scale) -> dict[str, Any]:
    """The upgrade phase (module docstring); its record: the rows, the traffic, one entry per
    revision, and whether the old workers stayed up."""
    up = Upgrade(scale)
    up.prepare()
    conn = await asyncpg.connect(scale.pg.url("postgres", DATABASE), command_timeout=None)
    feed = await asyncpg.connect(scale.pg.url("postgres", DATABASE))
    workers: list[WorkerProcess] = []
    stop = asyncio.Event()
    sent_at: list[tuple[float, float]] = []
    try:
        await scale.seed_tenants(conn)
        seconds = await _generate(conn)
        current = await conn.fetchval("SELECT version_num FROM alembic_version_queue")
        chain = pending_revisions(up.new, current)
        sc.say(f"upgrade: {len(chain)} queue revisions from {current}, under traffic")
        workers = [up.start_worker(f"upgrade-old-{n}") for n in range(WORKERS)]
        enqueuer = asyncio.create_task(_enqueue(feed, stop, sent_at))
        settle_began = time.time()
        await asyncio.sleep(SETTLE_S)
        steps: list[dict[str, Any]] = []
        for revision, sql_file in chain:
            began = time.time()
            tries, holders = await _apply(up, conn, revision)
            steps.append({"revision": revision, "frozen": frozen(sql_file), "began": began,
                          "ended": time.time(), "tries": tries, "holders": holders})  # fmt: skip
            sc.say(f"  {revision}: {steps[-1]['ended'] - began:.1f} s, {tries} tries")
        await asyncio.to_thread(up.migrate, up.new)  # every other role, as make migrate
        settled = time.time()
        await asyncio.sleep(SETTLE_S)
        settle_ended = time.time()
        stop.set()
        await enqueuer
        alive = [w.alive() for w in workers]
        completions = [
            r["at"]
            for r in await conn.fetch(
                "SELECT extract(epoch FROM completed_at)::float8 AS at FROM work_items"
                " WHERE completed_at >= to_timestamp($1) ORDER BY completed_at",
                steps[0]["began"] - SETTLE_S,
            )
        ]
    finally:
        stop.set()
        for worker in workers:
            worker.stop()
        await feed.close()
        await conn.close()
    return {
        "generated_rows": sc.HISTORY + sc.DUE,
        "generate_s": round(seconds, 1),
        "enqueue_rate": RATE,
        "workers_alive_at_end": alive,
        # The same traffic with no revision running, before the first and after the last:
        # what the old workers' own statements leave between completions on this table.
        "baseline_longest_completion_gap_s": round(
            max(
                longest_gap(completions, settle_began, steps[0]["began"]),
                longest_gap(completions, settled, settle_ended),
            ),
            3,
        ),
        "revisions": [_step(s, completions, sent_at) for s in steps],
    }


async def _apply(
    up: Upgrade, conn: asyncpg.Connection, revision: str
) -> tuple[int, list[list[dict[str, Any]]]]:
    """Apply `revision`, again after each lock timeout up to `TRIES` tries; the tries and,
    per timeout, the transactions open longest then (`_long_transactions`). Raises
    `SystemExit` with the output on any other failure, or on the last try's."""
    holders: list[list[dict[str, Any]]] = []
    for attempt in range(1, TRIES + 1):
        done = await asyncio.to_thread(up.migrate_to, revision)
        if done.returncode == 0:
            return attempt, holders
        output = done.stdout + done.stderr
        if not lock_timed_out(output) or attempt == TRIES:
            sys.stderr.write(output[-6000:])
            raise SystemExit(f"bench-scale: {revision} failed on try {attempt} of {TRIES}")
        holders.append(await _long_transactions(conn))
        sc.say(f"  {revision}: lock timeout on try {attempt}; open: {holders[-1]}")
        await asyncio.sleep(RETRY_PAUSE_S)
    raise AssertionError("unreachable")


async def _long_transactions(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """The five transactions open longest (other than this connection's), with their
    application, state, age in seconds and the start of their statement."""
    rows = await conn.fetch(
        "SELECT pid, application_name AS app, state, wait_event_type AS waits,"
        " round(extract(epoch FROM now() - xact_start)::numeric, 1)::float8 AS open_s,"
        " left(query, 120) AS query FROM pg_stat_activity"
        " WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid()"
        " ORDER BY xact_start LIMIT 5"
    )
    return [dict(r) for r in rows]


async def _generate(conn: asyncpg.Connection) -> float:
    """HISTORY completed rows and DUE due items, as `scale.Scale.generate` writes them."""
    started = time.monotonic()
    for status, count in (("COMPLETED", sc.HISTORY), ("AVAILABLE", sc.DUE)):
        for offset in range(0, count, sc.CHUNK):
            size = min(sc.CHUNK, count - offset)
            sql = sc.generate_sql(count=size, offset=offset, status=status, total=count)
            await conn.execute(sql)
    await conn.execute("VACUUM ANALYZE work_items")
    return time.monotonic() - started


def _step(
    step: dict[str, Any], completions: list[float], sent_at: list[tuple[float, float]]
) -> dict[str, Any]:
    during = [took for at, took in sent_at if step["began"] <= at <= step["ended"]]
    return {
        "revision": step["revision"],
        "frozen": step["frozen"],
        "seconds": round(step["ended"] - step["began"], 2),
        "tries": step["tries"],
        "holders": step["holders"],
        "longest_completion_gap_s": round(
            longest_gap(completions, step["began"], step["ended"]), 3
        ),
        "enqueues": len(during),
        "enqueue_p99_ms": _p99_ms(during),
        "enqueue_max_s": round(max(during), 3) if during else None,
    }


def upgrade_verdicts(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One check per revision written under the rule: completions and enqueues never stall
    past STALL_BOUND_S; and one that the old workers stayed up."""
    checks = [
        {
            "name": f"upgrade {step['revision']}: longest stall <= {STALL_BOUND_S} s",
            "value": f"completions {step['longest_completion_gap_s']} s, enqueue max "
            f"{step['enqueue_max_s']} s",
            "ok": step["longest_completion_gap_s"] <= STALL_BOUND_S
            and (step["enqueue_max_s"] or 0) <= STALL_BOUND_S,
        }
        for step in result["revisions"]
        if not step["frozen"]
    ]
    alive = result["workers_alive_at_end"]
    checks.append(
        {"name": "upgrade: the 0.1.0 workers stayed up", "value": alive, "ok": all(alive)}
    )
    return checks


def print_upgrade(result: dict[str, Any]) -> None:
    print(
        "\nwith no revision running (the settle periods before and after): longest completion"
        f" gap {result.get('baseline_longest_completion_gap_s')} s"
    )
    print(
        "\n| revision | shipped before the rule | tries | s | longest completion gap s |"
        " enqueues | enqueue p99 ms | slowest enqueue s |\n|---|---|---|---|---|---|---|---|"
    )
    for s in result["revisions"]:
        print(
            f"| {s['revision']} | {'yes' if s['frozen'] else 'no'} | {s['tries']} | {s['seconds']} |"
            f" {s['longest_completion_gap_s']} | {s['enqueues']} | {s['enqueue_p99_ms']} |"
            f" {s['enqueue_max_s']} |"
        )
