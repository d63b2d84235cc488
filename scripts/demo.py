"""`make demo`: render a worker into the reference host and watch it process real work.

Steps (each printed as it runs):
1. copy `tests/fixtures/reference-host/` into `.demo/host` (a fresh git repository),
2. `copier copy` the template's working tree into it: `shipment-notifier` / `NOTIFY_SHIPMENT`,
3. `uv sync` the host (offline from the cache `make setup` warmed),
4. create a scratch database `acme_demo` and migrate it (or an SQLite file, embedded mode),
5. start the worker as its own process through its console command (`shipment-notifier serve`),
6. enqueue the items from a second process (`shipment-notifier enqueue`),
7. show progress until every item is completed or dead-lettered, print a summary,
8. stop the worker with SIGTERM and report how it drained.

Backends: `--backend server` uses PostgreSQL and Redis (127.0.0.1 defaults, overridden by
`DEMO_PG_URL` / `DEMO_REDIS_URL`); `--backend embedded` uses SQLite and the host's in-memory
twins (no server at all); `auto` (the default) uses the servers when both answer and says
which one is missing, and how to start it, before it falls back to embedded.
`--chaos` kills the worker with SIGKILL mid-run and starts a new one: every item must still
complete exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import redis.asyncio as aioredis
from redis.exceptions import RedisError

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "reference-host"
WORKER = "shipment-notifier"
KIND = "NOTIFY_SHIPMENT"
ENV_PREFIX = "SHIPMENT_NOTIFIER_"
IGNORE = shutil.ignore_patterns(
    ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"
)


@dataclass(frozen=True)
class Backend:
    """Where the demo's queue lives: `database_url` for the app, `admin_url` to observe."""

    name: str
    database_url: str | None
    redis_url: str | None
    admin_url: str | None
    sqlite_path: Path | None


def step(message: str) -> None:
    print(f"\033[1m==> {message}\033[0m", flush=True)


def run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> None:
    """Run a command; on failure print its output and stop the demo."""
    done = subprocess.run(cmd, check=False, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        raise SystemExit(f"demo: `{' '.join(cmd)}` failed with exit code {done.returncode}")


async def _pg_ok(url: str) -> str | None:
    try:
        conn = await asyncio.wait_for(asyncpg.connect(url), timeout=3)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        return f"{type(exc).__name__}: {exc}"
    await conn.close()
    return None


async def _redis_ok(url: str) -> str | None:
    client = aioredis.Redis.from_url(url)
    try:
        await asyncio.wait_for(client.ping(), timeout=3)
    except (OSError, TimeoutError, RedisError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await client.aclose()
    return None


def choose_backend(requested: str, work: Path) -> Backend:
    """Pick the backend, naming any unreachable server and how to start it."""
    pg_admin = os.environ.get("DEMO_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    redis_url = os.environ.get("DEMO_REDIS_URL", "redis://127.0.0.1:6379/0")
    # With no database and no Redis URL the worker runs embedded: the host's local SQLite
    # file and its in-memory cache and topic twins (wake-ups fall back to polling).
    embedded = Backend(
        "embedded (SQLite + in-memory cache and topics)",
        None,
        None,
        None,
        work / "host" / ".local" / "acme.sqlite3",
    )
    if requested == "embedded":
        return embedded
    pg_error = asyncio.run(_pg_ok(pg_admin))
    redis_error = asyncio.run(_redis_ok(redis_url))
    if pg_error:
        print(f"demo: PostgreSQL is not reachable at {pg_admin} ({pg_error}).")
        print(
            "      start it: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
        )
        print("      or name another server with DEMO_PG_URL=postgresql://user@host:port/db")
    if redis_error:
        print(f"demo: Redis is not reachable at {redis_url} ({redis_error}).")
        print("      start it: redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save ''")
        print("      or name another server with DEMO_REDIS_URL=redis://host:port/0")
    if pg_error or redis_error:
        named = "DEMO_PG_URL" in os.environ or "DEMO_REDIS_URL" in os.environ
        if requested == "server" or named:
            raise SystemExit("demo: the servers named are not reachable (see above)")
        print("demo: continuing on the embedded backend instead.")
        return embedded
    host = pg_admin.split("@", 1)[1].rsplit("/", 1)[0]
    return Backend(
        "PostgreSQL + Redis",
        f"postgresql+asyncpg://acme_app@{host}/acme_demo",
        redis_url,
        pg_admin.rsplit("/", 1)[0] + "/acme_demo",
        None,
    )


def prepare_host(work: Path) -> Path:
    host = work / "host"
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(FIXTURE, host, ignore=IGNORE)
    git = ["git", "-c", "user.email=demo@example.invalid", "-c", "user.name=demo"]
    run([*git, "init", "-q", "-b", "main"], cwd=host)
    run([*git, "add", "-A"], cwd=host)
    run([*git, "commit", "-q", "-m", "reference host"], cwd=host)
    return host


def render(host: Path) -> None:
    copier = str(Path(sys.executable).with_name("copier"))
    run(
        [
            copier,
            "copy",
            "--trust",
            "--defaults",
            "--quiet",
            "-r",
            "HEAD",
            str(REPO),
            ".",
            "-d",
            f"worker_name={WORKER}",
            "-d",
            f"work_kind={KIND}",
        ],
        cwd=host,
    )


def host_env(backend: Backend, *, metrics_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT"))}
    for name in ("ACME_DATABASE_URL", "ACME_REDIS_URL"):
        env.pop(name, None)
    env.update(
        {
            "UV_OFFLINE": "1",
            f"{ENV_PREFIX}METRICS_PORT": str(metrics_port),
            f"{ENV_PREFIX}SWEEP_INTERVAL": "2",
            f"{ENV_PREFIX}LEASE": "10",
        }
    )
    if backend.database_url:
        env["ACME_DATABASE_URL"] = backend.database_url
    if backend.redis_url:
        env["ACME_REDIS_URL"] = backend.redis_url
    return env


def prepare_database(host: Path, backend: Backend, env: dict[str, str]) -> None:
    if backend.database_url is None:
        return  # the embedded worker creates its SQLite tables at start
    run(["bash", "scripts/infra-up.sh"], cwd=host, env=env)
    admin = os.environ.get("DEMO_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

    async def recreate() -> None:
        conn = await asyncpg.connect(admin)
        try:
            await conn.execute("DROP DATABASE IF EXISTS acme_demo WITH (FORCE)")
            await conn.execute("CREATE DATABASE acme_demo OWNER acme_owner")
        finally:
            await conn.close()

    asyncio.run(recreate())
    owner_url = backend.database_url.replace("acme_app@", "acme_owner@")
    owner_env = {**env, "ACME_MIGRATION_URL": owner_url}
    run(["make", "migrate"], cwd=host, env=owner_env)


async def counts(backend: Backend) -> dict[str, int]:
    """Item counts by status, read by the demo itself (not through the worker)."""
    query = "SELECT status, count(*) FROM work_items WHERE deleted_at IS NULL GROUP BY status"
    if backend.sqlite_path is not None:
        if not backend.sqlite_path.exists():
            return {}
        with sqlite3.connect(backend.sqlite_path, timeout=5) as db:
            return {str(s).lower(): int(n) for s, n in db.execute(query)}
    assert backend.admin_url is not None
    conn = await asyncpg.connect(backend.admin_url)
    try:
        return {str(r[0]).lower(): int(r[1]) for r in await conn.fetch(query)}
    finally:
        await conn.close()


def start_worker(host: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    return subprocess.Popen(
        ["uv", "run", "--all-packages", "--offline", WORKER, "serve"],
        cwd=host,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_healthy(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.stdout.write(log.read_text(errors="replace")[-4000:])
            raise SystemExit(
                f"demo: the worker exited with {proc.returncode} before it was healthy"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"demo: the worker's /healthz did not answer within {timeout:.0f} s")


def bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / total) if total else width
    return "[" + "#" * filled + "." * (width - filled) + "]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200, help="items to enqueue (default 200)")
    parser.add_argument("--backend", choices=["auto", "server", "embedded"], default="auto")
    parser.add_argument("--chaos", action="store_true", help="SIGKILL the worker mid-run, restart")
    parser.add_argument(
        "--metrics-port", type=int, default=int(os.environ.get("DEMO_PORT", "9464"))
    )
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="seconds to wait for the items"
    )
    args = parser.parse_args()

    work = REPO / ".demo"
    backend = choose_backend(args.backend, work)
    step(f"backend: {backend.name}")
    step(f"copying the reference host into {work / 'host'}")
    host = prepare_host(work)
    step(f"copier copy: worker_name={WORKER} work_kind={KIND}")
    render(host)
    env = host_env(backend, metrics_port=args.metrics_port)
    step("uv sync (offline, from the warmed cache)")
    run(["uv", "sync", "--offline", "--all-packages", "--quiet"], cwd=host, env=env)
    step("preparing the database")
    prepare_database(host, backend, env)

    log = work / "worker.log"
    step(f"starting the worker: uv run {WORKER} serve  (log: {log})")
    worker = start_worker(host, env, log)
    try:
        wait_healthy(args.metrics_port, worker, log)
        step(f"enqueueing {args.count} items from a second process")
        started = time.monotonic()
        run(
            [
                "uv",
                "run",
                "--all-packages",
                "--offline",
                WORKER,
                "enqueue",
                "--count",
                str(args.count),
                "--payload",
                json.dumps({"record_id": str(uuid.uuid4()), "note": "demo"}),
            ],
            cwd=host,
            env=env,
        )
        killed = False
        while True:
            c = asyncio.run(counts(backend))
            finished = c.get("completed", 0) + c.get("failed", 0)
            print(
                f"\r  {bar(finished, args.count)} {finished:>4}/{args.count}  "
                f"available {c.get('available', 0):>4}  claimed {c.get('claimed', 0):>3}  "
                f"completed {c.get('completed', 0):>4}  failed {c.get('failed', 0):>3}",
                end="",
                flush=True,
            )
            if args.chaos and not killed and finished >= args.count // 3:
                print()
                step(f"chaos: SIGKILL the worker (pid {worker.pid}) with items in flight")
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
                worker = start_worker(host, env, log)
                wait_healthy(args.metrics_port, worker, log)
                step("a new worker is up; the sweep hands the lost items back after their lease")
                killed = True
            if finished >= args.count:
                break
            if time.monotonic() - started > args.timeout:
                print()
                raise SystemExit(f"demo: not done after {args.timeout:.0f} s (log: {log})")
            time.sleep(0.25)
        elapsed = time.monotonic() - started
        print()
    finally:
        if worker.poll() is None:
            step("stopping the worker with SIGTERM (drain)")
            drain_started = time.monotonic()
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                code = worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                code = worker.wait()
            print(f"  the worker exited with {code} after {time.monotonic() - drain_started:.1f} s")

    # Every worker process appends to the same log: an item completed by two holders would
    # show two `completed item_id=<id>` lines. The claim token fences the second one out.
    log_text = log.read_text(errors="replace")
    completions = Counter(re.findall(r"completed item_id=(\S+)", log_text))
    retried = len(re.findall(r"attempt failed; requeued item_id=", log_text))
    twice = sum(1 for n in completions.values() if n > 1)
    completed = c.get("completed", 0)
    dead = c.get("failed", 0)  # a dead letter is a failed row (seed 000)
    step("summary")
    print(f"  completed       {completed}/{args.count}")
    print(f"  failed          {retried} attempt(s), retried with backoff")
    print(f"  dead-lettered   {dead}")
    print(f"  completed twice {twice}")
    print(f"  elapsed         {elapsed:.2f} s")
    print(f"  throughput      {args.count / elapsed:.1f} items/s")
    return 0 if completed == args.count and twice == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
