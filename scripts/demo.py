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
complete exactly once. `--two-workers` also renders `invoice-mailer` / `SEND_INVOICE` into
the same host (it joins the namespace the first worker created) and runs both side by side:
each must handle only its own kind. `--serve` then keeps the workers running and serves
the host's API and the work dashboard over the demo's items at a printed URL until Ctrl-C
(or SIGTERM, or SIGHUP: a closed terminal), and stops everything it started. A port it
would serve on that is already taken stops it before anything is written. `DEMO_DIR`
moves its scratch folder (`.demo/`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
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
from urllib.parse import urlsplit

import asyncpg
import redis.asyncio as aioredis
from redis.exceptions import RedisError

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "reference-host"
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


@dataclass
class Worker:
    """One rendered worker the demo runs: its answers, its metrics port, its process."""

    name: str
    kind: str
    port: int
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def env_prefix(self) -> str:
        return self.name.replace("-", "_").upper() + "_"


CHAOS_WAIT_S = 5.0
"""How long `--chaos` waits, after resuming the paused worker, for it to hold an item (s)."""

FIRST = ("shipment-notifier", "NOTIFY_SHIPMENT")
SECOND = ("invoice-mailer", "SEND_INVOICE")


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
    except (
        OSError,
        TimeoutError,
        ValueError,
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
    ) as exc:
        # asyncpg refuses a URL it cannot read (another scheme, a bad port) with an
        # InterfaceError or a ValueError: named like an unreachable server, not a traceback.
        return f"{type(exc).__name__}: {exc}"
    await conn.close()
    return None


async def _redis_ok(url: str) -> str | None:
    try:
        client = aioredis.Redis.from_url(url)
    except ValueError as exc:  # a scheme redis-py does not take
        return f"{type(exc).__name__}: {exc}"
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
    host = urlsplit(pg_admin).netloc.rsplit("@", 1)[-1]  # host[:port], without the user
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


def render(host: Path, worker: Worker) -> None:
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
            f"worker_name={worker.name}",
            "-d",
            f"work_kind={worker.kind}",
        ],
        cwd=host,
    )


def host_env(backend: Backend, workers: list[Worker]) -> dict[str, str]:
    """The environment every host command runs with: the backend's URLs (none: embedded),
    each worker's metrics port, and a short lease and sweep so `--chaos` recovers quickly."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT"))}
    for name in ("ACME_DATABASE_URL", "ACME_REDIS_URL"):
        env.pop(name, None)
    env["UV_OFFLINE"] = "1"
    for worker in workers:
        env[f"{worker.env_prefix}METRICS_PORT"] = str(worker.port)
        env[f"{worker.env_prefix}SWEEP_INTERVAL"] = "2"
        env[f"{worker.env_prefix}LEASE"] = "10"
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


async def counts(backend: Backend) -> Counter[str]:
    """Item counts by status (`completed`, ...) and by `<kind>:<status>`, read by the demo
    itself straight from the table, not through a worker."""
    query = (
        "SELECT kind, status, count(*) FROM work_items WHERE deleted_at IS NULL "
        "GROUP BY kind, status"
    )
    rows: list[tuple[str, str, int]] = []
    if backend.sqlite_path is not None:
        if backend.sqlite_path.exists():
            with sqlite3.connect(backend.sqlite_path, timeout=5) as db:
                rows = list(db.execute(query))
    else:
        assert backend.admin_url is not None
        conn = await asyncpg.connect(backend.admin_url)
        try:
            rows = [(r[0], r[1], r[2]) for r in await conn.fetch(query)]
        finally:
            await conn.close()
    found: Counter[str] = Counter()
    for kind, status, n in rows:
        found[str(status).lower()] += int(n)
        found[f"{kind}:{str(status).lower()}"] += int(n)
    return found


async def until_claimed(backend: Backend, within: float) -> int:
    """Poll the table over one connection until some item is claimed; how many are (0 after
    `within` seconds). The worker drains 200 items in a tenth of a second, so a fixed pause
    before the kill could find it holding none."""
    query = "SELECT count(*) FROM work_items WHERE status = 'CLAIMED'"
    deadline = time.monotonic() + within
    if backend.sqlite_path is not None:
        with sqlite3.connect(backend.sqlite_path, timeout=5) as db:
            while time.monotonic() < deadline:
                (claimed,) = db.execute(query).fetchone()
                if claimed:
                    return int(claimed)
                await asyncio.sleep(0.001)
        return 0
    assert backend.admin_url is not None
    conn = await asyncpg.connect(backend.admin_url)
    try:
        while time.monotonic() < deadline:
            claimed = await conn.fetchval(query)
            if claimed:
                return int(claimed)
            await asyncio.sleep(0.001)
    finally:
        await conn.close()
    return 0


def port_in_use(port: int) -> bool:
    """Whether something on this machine listens on 127.0.0.1:`port` (a bind fails). With
    `SO_REUSEADDR`, as the servers bind, so a closed connection's TIME_WAIT (the last demo's
    scrape, for a minute after it) does not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def refuse_ports_in_use(ports: dict[int, str]) -> None:
    """Stop the demo, before it writes anything, when a port it would serve on is taken:
    a process left running there would answer its health checks in its place."""
    for port, knob in ports.items():
        if port_in_use(port):
            raise SystemExit(
                f"demo: port {port} on 127.0.0.1 is in use (a demo, worker or API left "
                f"running? stop it, or choose another with {knob})"
            )


def _stop_like_ctrl_c(signum: int, frame: object) -> None:
    """SIGTERM and SIGHUP (a closed terminal) stop the demo as Ctrl-C does, so the
    `finally` blocks stop the processes it started in their own sessions."""
    raise KeyboardInterrupt(signal.Signals(signum).name)


def start_worker(host: Path, env: dict[str, str], worker: Worker) -> None:
    """`<worker> serve` as its own process (its own session, so signals reach uv's child)."""
    out = worker.log.open("ab")
    worker.proc = subprocess.Popen(
        ["uv", "run", "--all-packages", "--offline", worker.name, "serve"],
        cwd=host,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_healthy(worker: Worker, timeout: float = 60) -> None:
    """Poll the worker's `/healthz` until 200; stop the demo if the process dies first."""
    assert worker.proc is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.proc.poll() is not None:
            sys.stdout.write(worker.log.read_text(errors="replace")[-4000:])
            raise SystemExit(
                f"demo: {worker.name} exited with {worker.proc.returncode} before it was healthy"
            )
        try:
            url = f"http://127.0.0.1:{worker.port}/healthz"
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"demo: {worker.name}'s /healthz did not answer within {timeout:.0f} s")


def stop_worker(worker: Worker) -> None:
    """SIGTERM (drain), then report how long the drain took and the exit code."""
    if worker.proc is None or worker.proc.poll() is not None:
        return
    step(f"stopping {worker.name} with SIGTERM (drain)")
    started = time.monotonic()
    os.killpg(worker.proc.pid, signal.SIGTERM)
    try:
        code = worker.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(worker.proc.pid, signal.SIGKILL)
        code = worker.proc.wait()
    print(f"  {worker.name} exited with {code} after {time.monotonic() - started:.1f} s")


DASHBOARD_SEED = """
import asyncio
from uuid import uuid4
from acme.om.context import AppContext, AppType, RequestContext, Role
from acme.om.types import EMPTY_UUID
from acme.services.api.container import ServiceContainer
from acme.services.api.settings import ApiSettings

async def main() -> None:
    container = ServiceContainer.build(ApiSettings())
    tenancy = container.managers.tenancy
    rctx = RequestContext.new(AppContext(type=AppType.SERVICE, version="demo@0"))
    org = (await tenancy.service_contexts(rctx))[0].org_id
    user = uuid4()
    for scope in (org, EMPTY_UUID):  # an admin of the demo tenant, and a platform operator
        await tenancy.grant_membership(rctx, org_id=scope, user_id=user, role=Role.ADMIN)
    await container.aclose()
    print(org, user)

asyncio.run(main())
"""


def serve_dashboard(host: Path, env: dict[str, str], port: int, log: Path) -> None:
    """Grant a demo user the admin role in the demo's tenant (and the platform operator's),
    serve the host's API (`acme-api serve`) on `port`, print the dashboard's URL and wait
    for Ctrl-C; the API is stopped whatever ends the wait."""
    seeded = subprocess.run(
        ["uv", "run", "--all-packages", "--offline", "python", "-c", DASHBOARD_SEED],
        cwd=host,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if seeded.returncode != 0:
        raise SystemExit(f"demo: the dashboard's user was not granted:\n{seeded.stderr[-3000:]}")
    org, user = seeded.stdout.split()[-2:]
    step(f"starting the API: uv run acme-api serve  (log: {log})")
    api = subprocess.Popen(
        ["uv", "run", "--all-packages", "--offline", "acme-api", "serve"],
        cwd=host,
        env={**env, "ACME_API_PORT": str(port)},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if api.poll() is not None:
                raise SystemExit(f"demo: the API exited with {api.returncode} (log: {log})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise SystemExit(f"demo: the API did not answer in 60 s (log: {log})") from None
                time.sleep(0.2)
        step("serving; Ctrl-C stops the API and the workers")
        print(f"  dashboard  http://127.0.0.1:{port}/v1/work/dashboard?org={org}&as={user}")
        print(f"  API docs   http://127.0.0.1:{port}/docs  (header X-Acme-User: {user})")
        try:
            while api.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            # A terminal's Ctrl-C reaches `uv run` too, which passes it on: once is enough.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            print()
        else:
            raise SystemExit(f"demo: the API exited with {api.returncode} (log: {log})")
    finally:
        if api.poll() is None:
            step("stopping the API with SIGTERM")
            os.killpg(api.pid, signal.SIGTERM)
            try:
                api.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(api.pid, signal.SIGKILL)
                api.wait()


def bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / total) if total else width
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number of at least 1, refused before anything is rendered."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{number} is not at least 1")
    return number


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--count", type=_at_least_one, default=200, help="items per worker (default 200)"
    )
    parser.add_argument("--backend", choices=["auto", "server", "embedded"], default="auto")
    parser.add_argument("--chaos", action="store_true", help="SIGKILL a worker mid-run, restart")
    parser.add_argument("--two-workers", action="store_true", help="add invoice-mailer as well")
    parser.add_argument(
        "--metrics-port", type=int, default=int(os.environ.get("DEMO_PORT", "9464"))
    )
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="seconds to wait for the items"
    )
    parser.add_argument(
        "--serve", action="store_true", help="then serve the API and dashboard until Ctrl-C"
    )
    parser.add_argument(
        "--api-port", type=int, default=int(os.environ.get("DEMO_API_PORT", "8000"))
    )
    args = parser.parse_args()

    work = Path(os.environ.get("DEMO_DIR") or REPO / ".demo")
    answers = [FIRST, SECOND] if args.two_workers else [FIRST]
    workers = [
        Worker(name, kind, args.metrics_port + i, work / f"{name}.log")
        for i, (name, kind) in enumerate(answers)
    ]
    ports = {worker.port: "--metrics-port or DEMO_PORT" for worker in workers}
    refuse_ports_in_use({**ports, **({args.api_port: "DEMO_API_PORT"} if args.serve else {})})
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, _stop_like_ctrl_c)
    total = args.count * len(workers)
    backend = choose_backend(args.backend, work)
    step(f"backend: {backend.name}")
    step(f"copying the reference host into {work / 'host'}")
    host = prepare_host(work)
    for worker in workers:
        step(f"copier copy: worker_name={worker.name} work_kind={worker.kind}")
        render(host, worker)
        run(["git", "add", "-A"], cwd=host)
        run(
            [
                "git",
                "-c",
                "user.email=demo@example.invalid",
                "-c",
                "user.name=demo",
                "commit",
                "-q",
                "-m",
                f"add {worker.name}",
            ],
            cwd=host,
        )
    env = host_env(backend, workers)
    step("uv sync (offline, from the warmed cache)")
    run(["uv", "sync", "--offline", "--all-packages", "--quiet"], cwd=host, env=env)
    step("preparing the database")
    prepare_database(host, backend, env)

    serving = False
    try:
        for worker in workers:
            step(f"starting {worker.name}: uv run {worker.name} serve  (log: {worker.log})")
            start_worker(host, env, worker)
        for worker in workers:
            wait_healthy(worker)
        victim = workers[0]
        if args.chaos and victim.proc is not None:
            # The worker drains 200 items in well under a second now: pause it while the
            # items are enqueued, let it run briefly, and kill it while it holds some.
            os.killpg(victim.proc.pid, signal.SIGSTOP)
        started = time.monotonic()
        for worker in workers:
            step(f"enqueueing {args.count} {worker.kind} items from a second process")
            payload = json.dumps({"record_id": str(uuid.uuid4()), "note": "demo"})
            run(
                [
                    "uv",
                    "run",
                    "--all-packages",
                    "--offline",
                    worker.name,
                    "enqueue",
                    "--create-tenant",
                    "demo",
                    "--operator",
                    "scripts/demo.py",
                    "--count",
                    str(args.count),
                    "--payload",
                    payload,
                ],
                cwd=host,
                env=env,
            )
        if args.chaos and victim.proc is not None:
            os.killpg(victim.proc.pid, signal.SIGCONT)
            claimed = asyncio.run(until_claimed(backend, CHAOS_WAIT_S))
            step(
                f"chaos: SIGKILL {victim.name} (pid {victim.proc.pid}) "
                f"with {claimed} item(s) claimed"
            )
            os.killpg(victim.proc.pid, signal.SIGKILL)
            victim.proc.wait()
            start_worker(host, env, victim)
            wait_healthy(victim)
            step("a new worker is up; the sweep hands the lost items back after their lease")
        tty = sys.stdout.isatty()
        last_print = 0.0
        while True:
            c = asyncio.run(counts(backend))
            finished = c["completed"] + c["failed"]
            line = (
                f"{bar(finished, total)} {finished:>4}/{total}  available {c['available']:>4}"
                f"  claimed {c['claimed']:>3}  completed {c['completed']:>4}"
                f"  failed {c['failed']:>3}"
            )
            if tty:
                print(f"\r  {line}", end="", flush=True)
            elif time.monotonic() - last_print >= 1 or finished >= total:
                print(f"  {line}", flush=True)
                last_print = time.monotonic()
            if finished >= total:
                break
            if time.monotonic() - started > args.timeout:
                print()
                raise SystemExit(f"demo: not done after {args.timeout:.0f} s (logs in {work})")
            time.sleep(0.25)
        elapsed = time.monotonic() - started
        if tty:
            print()
        serving = args.serve
    finally:
        if not serving:
            for worker in workers:
                stop_worker(worker)

    step("summary")
    ok = True
    for worker in workers:
        # Every process of a worker appends to one log: an item completed by two holders
        # would show two `completed item_id=<id>` lines. The claim token fences one out.
        log_text = worker.log.read_text(errors="replace")
        completions = Counter(re.findall(r"completed item_id=(\S+)", log_text))
        twice = sum(1 for n in completions.values() if n > 1)
        retried = len(re.findall(r"attempt failed; requeued item_id=", log_text))
        foreign = sorted(set(re.findall(r" kind=(\S+)", log_text)) - {worker.kind})
        completed = c[f"{worker.kind}:completed"]
        dead = c[f"{worker.kind}:failed"]  # a dead letter is a failed row (seed 000)
        print(f"  {worker.name} ({worker.kind})")
        print(f"    completed       {completed}/{args.count}")
        print(f"    failed          {retried} attempt(s), retried with backoff")
        print(f"    dead-lettered   {dead}")
        print(f"    completed twice {twice}")
        print(f"    other kinds     {', '.join(foreign) or 'none'}")
        ok = ok and completed == args.count and twice == 0 and not foreign
    print(f"  elapsed           {elapsed:.2f} s")
    print(f"  throughput        {total / elapsed:.1f} items/s")
    if serving:
        try:
            serve_dashboard(host, env, args.api_port, work / "api.log")
        finally:
            for worker in workers:
                stop_worker(worker)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt as stopped:
        raise SystemExit(
            f"demo: stopped ({stopped or 'SIGINT'}); what it started is stopped"
        ) from None
