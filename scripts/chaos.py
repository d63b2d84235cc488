"""`make chaos` and `make soak`: the rendered worker under the faults production meets.

Set-up (every run, in `.chaos/`, but for the cluster's files):
1. a PostgreSQL cluster of its own (`initdb`, `pg_ctl`, a free loopback port; its files in
   a fresh folder under `TMPDIR` or /tmp, owned by the server's OS user: `cluster_root`)
   and a `redis-server` of its own (a free port), so restarting them never touches the
   shared services; the workers reach Redis through a loopback proxy in this process,
   which can leave connections open but silent (a half-open connection);
2. the reference host copied, `shipment-notifier` rendered into it (`copier copy`, as
   `make demo` does), its handler replaced by `scripts/chaos_handler.py` (a ledger row per
   execution, a compare-and-set on the item's record), `uv sync` offline, the roles and the
   database made by the host's `scripts/infra-up.sh`, the schema by `make migrate`;
3. the harness's own tables in that database (`chaos_ledger`, `chaos_records`,
   `chaos_transitions`, and a trigger on `work_items` that appends every change of status
   or claim token to `chaos_transitions` with `clock_timestamp()`): the queue's own writes
   seen from outside the queue.

`chaos` (the default): 4 worker processes (`.venv/bin/shipment-notifier serve`; two take
their wake-ups from Redis, two from PostgreSQL `NOTIFY`), `--items` items enqueued at a
steady rate by `scripts/chaos_client.py` over `--seconds`, and the faults,
one after another while the kills go on: `kill -9` of a random worker that is up (its
`/healthz` has answered) every `--kill-every` seconds (the harness starts a new one at once);
one half-open Redis connection set (every connection open at that moment goes silent for
good); one `pg_terminate_backend` of every worker connection; one handler that blocks its
event loop for the lease + a sweep interval + 3 s; one Redis outage (`--redis-outage-s`, 10 s); one PostgreSQL
restart (`pg_ctl stop -m immediate`, down `--pg-outage-s`, then started); one pause of the
workers' lane for 6 s (`shipment-notifier lanes pause`, then `lanes resume`). A few items
are poison (fail every attempt: dead-lettered by design). While items arrive, the client
cancels one every 3 s as an operator does (`cancel_item`; a claimed one when a worker, live
or killed, holds one). While an outage lasts one worker (the witness) is spared the kills, so its
`/healthz` is seen across the whole outage; the process running the blocked handler is
spared too. When every item is settled the workers are stopped (SIGTERM) and the
invariants are checked:

- completed once, dead-lettered once, or cancelled with no completion accepted after the
  cancel committed: every item has exactly one accepted completion (one change to
  COMPLETED), or is a poison item dead-lettered (one change to FAILED) with its audit entry
  written, or was cancelled by the operator and nothing changed it after its change to
  CANCELLED (no completion, no requeue by the sweep); none lost;
- every accepted completion is the claim of an execution that ran to its end;
- no two executions of one item overlap in time, except those in flight in the blocked
  loop's process when its loop blocked (the blocked item's, and any other it was running
  then: none can renew its lease; reported);
- every record advanced exactly once per completed item (version 1), poison records never,
  a cancelled item's at most once (what its handler did before the cancel stays done);
- every item held by a killed worker was handed back (the sweep's requeue) within lease +
  sweep interval + 1 s of the kill (kills whose window meets the PostgreSQL outage are
  reported apart: the sweep cannot run while the database is down);
- no item was claimed while the lane was paused (from 1 s after the pause committed until
  its resume began: a claim that read its snapshot before the commit may land just after);
- the witness's `/healthz` answered non-2xx within the documented bound of each outage
  (docs/operations.md, `/healthz`) and 2xx again within the bound after recovery; the
  wake-up channel cut by the half-open connection was re-established within its bound.

Prints a summary table, writes `summary.json` and keeps every log under
`.chaos/run-<time>/`; exits 1 when an invariant breaks.

`soak` (`--mode soak`): the same set-up and workers, no faults; first a burst measures how
many items per second the 4 workers drain, then items arrive at half that rate for
`--minutes` (30); it samples each worker's RSS, open file descriptors, open
PostgreSQL and Redis connections (its sockets, from `/proc`) and asyncio task count
(`worker_event_loop_tasks`) every 5 s, and it reports claim latency percentiles per minute.
Per minute, RSS is the median of the samples and each count its floor (the fewest seen:
load moves the counts, an item in flight holds a task and a busy moment opens pooled
connections, while a leak raises the floor). It fails when a worker's figure at the last
minute is more than 10 % above its figure at minute 5 (the counts pools hold, connections
and fds, may also reach what the burst opened: a pool keeps up to its size what its
heaviest moment needed, and the half-rate load never needs more), when the claim latency's
p50 or p95 over the last five minutes is more than 10 % + 5 ms above minutes 3-7 (medians
of the minutes: one minute's p95 moves by a third on its own), or when a worker process
ends. It also records `work_items`' live and dead rows and autovacuum runs every 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pwd
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "engine" / "om" / "tests"))

import demo  # the demo's host preparation, reused as is
from work_network import SilencingProxy, free_port  # the engine tests' own, stdlib only

WORK = REPO / ".chaos"
LEGACY_CLUSTER = WORK / "pg"  # where the cluster lived before it moved out of the clone
CLUSTER_PREFIX = "worker-template-chaos-pg-"
LEFTOVER_AGE_S = 3600.0  # a cluster folder untouched this long, its server gone: a dead run's
WORKER = demo.Worker("shipment-notifier", "NOTIFY_SHIPMENT", 0, WORK / "unused.log")
PREFIX = "SHIPMENT_NOTIFIER_"
HANDLER = Path("workers/shipment-notifier/src/acme/workers/shipment_notifier/handler.py")
SLOTS = 4
CANCEL_EVERY_S = 3.0  # seconds between two operator cancels while items arrive
# Worker settings for the run: short enough that recovery happens many times a minute.
LEASE_S = 5.0
SWEEP_INTERVAL_S = 2.0
HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_FAILURE_LIMIT = 3
POLL_INTERVAL_S = 1.0
CAPACITY = 10
# The bounds checked (docs/operations.md): a worker's items are handed back by the sweep
# once their lease passes; /healthz turns 503 after HEARTBEAT_FAILURE_LIMIT failed beats
# (Redis down) or after 3 poll intervals of failed claims (the database down), the first
# failure coming within one interval; one good beat or claim brings 200 back.
SLACK_S = 1.0
REQUEUE_BOUND_S = LEASE_S + SWEEP_INTERVAL_S + SLACK_S
PG_UNHEALTHY_BOUND_S = 4 * POLL_INTERVAL_S + SLACK_S
REDIS_UNHEALTHY_BOUND_S = (HEARTBEAT_FAILURE_LIMIT + 1) * HEARTBEAT_INTERVAL_S + SLACK_S
HEALTHY_AGAIN_BOUND_S = max(HEARTBEAT_INTERVAL_S, POLL_INTERVAL_S) + SLACK_S
# The blocked handler sleeps past the lease and a sweep and more, so that the item is
# handed back and run elsewhere while the first run is still inside its handler.
BLOCK_S = LEASE_S + SWEEP_INTERVAL_S + 3
# A silent subscription is found in about 5 s (a probe after 2 s of silence, 2 s to
# answer) and re-established within about 1 s after that (docs/operations.md, Wake-ups).
RESUBSCRIBE_BOUND_S = 7.0
PAUSE_S = 6.0  # how long the lane stays paused among the faults
# A claim whose statement read its snapshot before the pause committed may still land just
# after it (docs/decisions/0040); later than this after the pause, a claim breaks the rule.
PAUSE_GRACE_S = 1.0


def say(message: str) -> None:
    print(f"chaos: {message}", flush=True)


# -- the services the run owns -------------------------------------------------------------


def server_os_user() -> str | None:
    """The OS user the PostgreSQL server runs as: PostgreSQL refuses to run as root, so run
    as root the harness runs it as `CHAOS_PG_OS_USER` (`postgres`); None otherwise (the
    harness's own user)."""
    return os.environ.get("CHAOS_PG_OS_USER", "postgres") if os.geteuid() == 0 else None


def cluster_root() -> Path:
    """A fresh folder for the run's PostgreSQL cluster: `tempfile.mkdtemp` under `TMPDIR`
    (or /tmp), owned by the server's OS user, never inside the clone, which may sit where
    that user cannot enter (run as root from a home folder of mode 700, `initdb` fails).

    Raises `SystemExit` with one line naming the fix (`TMPDIR`, `CHAOS_PG_OS_USER`) when
    the server could not use the folder, before anything else is made; the folder is gone.
    """
    parent = tempfile.gettempdir()
    try:
        root = Path(tempfile.mkdtemp(prefix=CLUSTER_PREFIX))
    except OSError as exc:
        raise SystemExit(
            f"chaos: cannot make the PostgreSQL cluster's folder in {parent} "
            f"({exc.strerror or exc}): set TMPDIR to a writable folder"
        ) from None
    user = server_os_user()
    if user is None:
        return root
    try:
        owner = pwd.getpwnam(user)
    except KeyError:
        shutil.rmtree(root)
        raise SystemExit(
            f"chaos: run as root, the PostgreSQL server runs as the OS user {user}, which does "
            "not exist: create it, or set CHAOS_PG_OS_USER to a user that is not root"
        ) from None
    os.chown(root, owner.pw_uid, owner.pw_gid)
    enters = subprocess.run(
        ["runuser", "-u", user, "--", "test", "-w", str(root), "-a", "-x", str(root)],
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if enters.returncode != 0:
        shutil.rmtree(root)
        raise SystemExit(
            f"chaos: the OS user {user}, who runs the PostgreSQL server, cannot enter {parent} "
            "(a folder on its path is closed to it): set TMPDIR to a folder it can enter, "
            "such as TMPDIR=/tmp"
        )
    return root


def remove_leftovers() -> None:
    """Remove the clusters of runs that ended without their teardown: the one inside the
    clone (`.chaos/pg`, where earlier releases kept it; its server stopped first), and
    folders under `TMPDIR` whose server is gone and that nobody touched for
    `LEFTOVER_AGE_S` (a run being set up has no server yet, but has just made its folder)."""
    if LEGACY_CLUSTER.exists():
        Postgres(LEGACY_CLUSTER, 0).stop("immediate")
        shutil.rmtree(LEGACY_CLUSTER, ignore_errors=True)
    for folder in Path(tempfile.gettempdir()).glob(f"{CLUSTER_PREFIX}*"):
        with contextlib.suppress(OSError):
            if time.time() - folder.stat().st_mtime < LEFTOVER_AGE_S or _serving(folder):
                continue
            shutil.rmtree(folder)


def _serving(root: Path) -> bool:
    """Whether the cluster under `root` has a server running (its postmaster.pid names a
    live process)."""
    try:
        pid = int((root / "data" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, and another user's
        pass
    return True


class Postgres:
    """A throwaway cluster under `root`: `initdb` once per run, started and stopped with
    `pg_ctl`. Superuser `postgres`, trust auth on loopback only. Run as root, the server
    runs as `server_os_user()`."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.data = root / "data"
        self.port = port
        self.log = root / "postgres.log"
        self.as_user: list[str] = []
        if (user := server_os_user()) is not None:
            self.as_user = ["runuser", "-u", user, "--"]

    def _run(self, args: list[str], *, check: bool = True) -> None:
        subprocess.run(
            [*self.as_user, *args],
            cwd=self.root,  # the server's user may not enter the clone the run started in
            check=check,
            stdout=subprocess.DEVNULL,
            stderr=None if check else subprocess.DEVNULL,
        )

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.as_user:
            owner = pwd.getpwnam(self.as_user[2])
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        self._run(["initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"])
        conf = self.data / "postgresql.conf"
        with conf.open("a", encoding="utf-8") as f:
            f.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.root}'\nmax_connections = 300\n"
                # Scratch data: no fsync (the machine does not crash, the server does). A
                # commit still waits for its WAL write, so an immediate stop loses nothing
                # that was acknowledged (synchronous_commit = off would).
                "fsync = off\nfull_page_writes = off\n"
                "shared_buffers = 128MB\n"
            )

    def start(self) -> None:
        self._run(["pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start"])

    def stop(self, mode: str = "fast") -> None:
        if self.data.exists():
            self._run(["pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop"], check=False)

    def url(self, user: str = "postgres", database: str = "acme") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"


class Redis:
    """A `redis-server` child on `port`, no persistence; restartable on the same port."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.root / "redis.log").open("ab")
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.root),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s,
            ):
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        raise SystemExit("chaos: redis-server did not answer within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


# -- the host -------------------------------------------------------------------------------


INSTRUMENTATION = """
CREATE TABLE chaos_records (
    id uuid PRIMARY KEY, item_index integer NOT NULL, version integer NOT NULL DEFAULT 0,
    advanced_by uuid, advanced_at timestamptz
);
CREATE TABLE chaos_ledger (
    id bigserial PRIMARY KEY, item_id uuid NOT NULL, claim_token uuid, attempt integer,
    pid integer NOT NULL, started_at timestamptz NOT NULL, ended_at timestamptz
);
CREATE INDEX ON chaos_ledger (item_id);
CREATE TABLE chaos_transitions (
    id bigserial PRIMARY KEY, item_id uuid NOT NULL, old_status text, new_status text,
    old_token uuid, new_token uuid, claimed_by text, available_at timestamptz,
    at timestamptz NOT NULL
);
CREATE INDEX ON chaos_transitions (item_id);
CREATE FUNCTION chaos_record_transition() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = public AS $$
BEGIN
    INSERT INTO chaos_transitions
        (item_id, old_status, new_status, old_token, new_token, claimed_by, available_at, at)
    VALUES (NEW.id, OLD.status, NEW.status, OLD.claim_token, NEW.claim_token,
            coalesce(NEW.claimed_by, OLD.claimed_by), OLD.available_at, clock_timestamp());
    RETURN NULL;
END $$;
CREATE TRIGGER chaos_transitions AFTER UPDATE ON work_items FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR OLD.claim_token IS DISTINCT FROM NEW.claim_token)
    EXECUTE FUNCTION chaos_record_transition();
"""


def prepare(run_dir: Path, pg: Postgres, redis_port: int) -> Path:
    """Render the worker into a fresh reference host and migrate the run's database."""
    say(f"rendering {WORKER.name} into a fresh reference host ({WORK / 'render'})")
    host = demo.prepare_host(WORK / "render")
    demo.render(host, WORKER)
    shutil.copyfile(REPO / "scripts" / "chaos_handler.py", host / HANDLER)
    shutil.copyfile(REPO / "scripts" / "chaos_client.py", host / "chaos_client.py")
    env = base_env(pg, redis_port)
    # Compiled once here, as a deployed image is: a worker that compiled its imports at
    # every start (PYTHONDONTWRITEBYTECODE) would spend seconds booting after each kill.
    demo.run(
        ["uv", "sync", "--offline", "--all-packages", "--quiet", "--compile-bytecode"],
        cwd=host,
        env=env,
    )
    say("roles, database and schema (the host's infra-up.sh and make migrate)")
    infra = {
        **env,
        "ACME_PGHOST": "127.0.0.1",
        "ACME_PGPORT": str(pg.port),
        "ACME_REDIS_PORT": str(redis_port),
    }
    demo.run(["bash", "scripts/infra-up.sh"], cwd=host, env=infra)
    owner = {
        **env,
        "ACME_MIGRATION_URL": pg.url("acme_owner").replace("postgresql:", "postgresql+asyncpg:"),
    }
    demo.run(["make", "-s", "migrate"], cwd=host, env=owner)
    asyncio.run(_execute(pg.url(), INSTRUMENTATION))
    return host


async def _execute(url: str, sql: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def host_env() -> dict[str, str]:
    """This process's environment for the host's commands: no virtualenv or uv project of
    ours, none of the host's or the worker's settings, offline, bytecode written."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT"))}
    for name in list(env):
        if name.startswith(("ACME_", PREFIX)):
            del env[name]
    env["UV_OFFLINE"] = "1"
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def base_env(pg: Postgres, redis_port: int) -> dict[str, str]:
    env = host_env()
    env["ACME_DATABASE_URL"] = pg.url("acme_app").replace("postgresql:", "postgresql+asyncpg:")
    env["ACME_REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
    return env


# -- the workers ----------------------------------------------------------------------------


@dataclass
class Incarnation:
    """One process of a slot: when it started and how it ended."""

    slot: int
    pid: int
    started: float
    log: str
    ended: float | None = None
    end: str = ""  # "killed", "exit <code>", "stopped <code>"
    cause: str = ""  # for an exit no kill or stop explains: the last line of its log


def exit_cause(log_text: str, limit: int = 300) -> str:
    """Why a process exited, as its log says: the last line that is not blank (the one-line
    refusal `serve` exits with, or a traceback's `Type: message`), at most `limit`
    characters; `(empty log)` when it wrote nothing."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    return lines[-1][:limit] if lines else "(empty log)"


@dataclass
class Slot:
    index: int
    port: int
    channel: str  # "topic" (Redis) or "database" (NOTIFY)
    proc: subprocess.Popen[bytes] | None = None
    incarnations: list[Incarnation] = field(default_factory=list)


class Fleet:
    """The worker processes, restarted when they die, and what was seen of them."""

    def __init__(self, host: Path, env: dict[str, str], run_dir: Path) -> None:
        self.host = host
        self.env = env
        self.run_dir = run_dir
        self.slots = [
            Slot(i, free_port(), "topic" if i < SLOTS // 2 else "database") for i in range(SLOTS)
        ]
        self.kills: list[tuple[float, int, int]] = []  # (time, slot, pid)
        self.health: list[tuple[float, int, int, int | None, str | None]] = []
        self.spared_slots: Counter[int] = Counter()
        self.spared_pids: set[int] = set()
        self.ready: set[int] = set()  # pids whose /healthz has answered 200
        self.stopping = False

    def start(self, slot: Slot) -> None:
        n = len(slot.incarnations)
        log_path = self.run_dir / f"worker-{slot.index}-{n}.log"
        env = {
            **self.env,
            f"{PREFIX}METRICS_PORT": str(slot.port),
            f"{PREFIX}DATABASE_WAKE_UPS": "true" if slot.channel == "database" else "false",
        }
        slot.proc = subprocess.Popen(
            [str(self.host / ".venv" / "bin" / WORKER.name), "serve"],
            cwd=self.host,
            env=env,
            stdout=log_path.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        slot.incarnations.append(Incarnation(slot.index, slot.proc.pid, time.time(), log_path.name))

    def alive(self, slot: Slot) -> bool:
        return slot.proc is not None and slot.proc.poll() is None

    def kill(self, slot: Slot) -> None:
        assert slot.proc is not None
        pid = slot.proc.pid
        now = time.time()
        os.kill(pid, signal.SIGKILL)
        slot.proc.wait()
        self.kills.append((now, slot.index, pid))
        slot.incarnations[-1].ended = now
        slot.incarnations[-1].end = "killed"
        self.start(slot)

    async def supervise(self) -> None:
        """Start a new process for a slot whose process exited (not by a kill)."""
        while not self.stopping:
            for slot in self.slots:
                if slot.proc is not None and slot.proc.poll() is not None and not self.stopping:
                    inc = slot.incarnations[-1]
                    inc.ended = time.time()
                    inc.end = f"exit {slot.proc.returncode}"
                    log = (self.run_dir / inc.log).read_text(errors="replace")
                    inc.cause = exit_cause(log)
                    await asyncio.sleep(0.5)
                    self.start(slot)
            await asyncio.sleep(0.2)

    async def killer(self, every_s: float, rng: random.Random) -> None:
        while not self.stopping:
            await asyncio.sleep(every_s)
            targets = [
                s
                for s in self.slots
                if self.alive(s)
                and self.spared_slots[s.index] <= 0
                and s.proc is not None
                and s.proc.pid in self.ready
                and s.proc.pid not in self.spared_pids
            ]
            if targets and not self.stopping:
                self.kill(rng.choice(targets))

    async def watch_health(self) -> None:
        """Every 0.2 s, each live worker's /healthz at once: (time, slot, pid, status,
        wake_ups)."""

        async def probe(slot: Slot, pid: int) -> None:
            asked = time.time()
            status, body = await http_get(slot.port, "/healthz")
            wake = None
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                wake = json.loads(body).get("wake_ups") if body else None
            self.health.append((asked, slot.index, pid, status, wake))
            if status == 200:
                self.ready.add(pid)

        while not self.stopping:
            live = [(s, s.proc.pid) for s in self.slots if self.alive(s) and s.proc is not None]
            await asyncio.gather(*(probe(slot, pid) for slot, pid in live), asyncio.sleep(0.2))

    async def wait_healthy(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        for slot in self.slots:
            while True:
                status, _ = await http_get(slot.port, "/healthz")
                if status == 200:
                    break
                if slot.proc is not None and slot.proc.poll() is not None:
                    log = (self.run_dir / slot.incarnations[-1].log).read_text(errors="replace")
                    raise SystemExit(f"chaos: worker {slot.index} exited at start:\n{log[-3000:]}")
                if time.monotonic() > deadline:
                    raise SystemExit(f"chaos: worker {slot.index} not healthy in {timeout_s} s")
                await asyncio.sleep(0.2)

    def stop_all(self) -> None:
        self.stopping = True
        for slot in self.slots:
            if self.alive(slot):
                assert slot.proc is not None
                os.kill(slot.proc.pid, signal.SIGTERM)
        for slot in self.slots:
            if slot.proc is None:
                continue
            try:
                code = slot.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(slot.proc.pid, signal.SIGKILL)
                code = slot.proc.wait()
            inc = slot.incarnations[-1]
            if inc.ended is None:
                inc.ended = time.time()
                inc.end = f"stopped {code}"


async def http_get(port: int, path: str, timeout_s: float = 1.0) -> tuple[int | None, str | None]:
    """(status, body) of a GET on the loopback port; (None, None) when it does not answer."""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
            await writer.drain()
            raw = await reader.read()
            writer.close()
    except (OSError, TimeoutError):
        return None, None
    head, _, body = raw.partition(b"\r\n\r\n")
    match = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    return (int(match.group(1)) if match else None), body.decode(errors="replace")


# -- the run --------------------------------------------------------------------------------


@dataclass
class Fault:
    name: str
    at: float  # time.time() it began
    detail: dict[str, Any] = field(default_factory=dict)


class ChaosRun:
    def __init__(self, args: argparse.Namespace, run_dir: Path) -> None:
        self.args = args
        self.run_dir = run_dir
        self.rng = random.Random(args.seed)
        # First: a location the server cannot use refuses before anything is made.
        self.pg = Postgres(cluster_root(), free_port())
        self.redis = Redis(run_dir, free_port())
        self.proxy = SilencingProxy(self.redis.port, free_port())
        self.faults: list[Fault] = []
        self.client_lines: list[dict[str, Any]] = []
        self.client_done = asyncio.Event()
        self.block_pid: int | None = None
        self.fleet: Fleet | None = None
        self.cancels: list[dict[str, Any]] = []  # the client's cancels that landed

    # set-up
    def setup(self) -> tuple[Path, dict[str, str]]:
        remove_leftovers()
        say(
            f"PostgreSQL cluster on 127.0.0.1:{self.pg.port}, redis-server on {self.redis.port}, "
            f"its proxy on {self.proxy.port}"
        )
        self.pg.init()
        self.pg.start()
        self.redis.start()
        host = prepare(self.run_dir, self.pg, self.redis.port)
        env = base_env(self.pg, self.proxy.port)
        env.update(
            {
                f"{PREFIX}LEASE": str(LEASE_S),
                f"{PREFIX}SWEEP_INTERVAL": str(SWEEP_INTERVAL_S),
                f"{PREFIX}HEARTBEAT_INTERVAL": str(HEARTBEAT_INTERVAL_S),
                f"{PREFIX}HEARTBEAT_FAILURE_LIMIT": str(HEARTBEAT_FAILURE_LIMIT),
                f"{PREFIX}POLL_INTERVAL": str(POLL_INTERVAL_S),
                f"{PREFIX}CAPACITY": str(CAPACITY),
                f"{PREFIX}DRAIN_DEADLINE": "5",
                "CHAOS_LEDGER_URL": self.pg.url(),
                "CHAOS_WORK_S": str(self.args.work_s),
                "CHAOS_BLOCK_S": str(BLOCK_S),
            }
        )
        return host, env

    def teardown(self) -> None:
        """Kill every worker still running (a run that stopped early), then the servers."""
        if self.fleet is not None:
            self.fleet.stopping = True
            for slot in self.fleet.slots:
                if self.fleet.alive(slot) and slot.proc is not None:
                    slot.proc.kill()
                    slot.proc.wait()
        self.redis.stop()
        self.pg.stop("fast")
        if self.pg.log.exists() and self.run_dir.exists():
            shutil.copyfile(self.pg.log, self.run_dir / "postgres.log")
        shutil.rmtree(self.pg.root, ignore_errors=True)

    async def client(
        self,
        host: Path,
        env: dict[str, str],
        items: int,
        rate: float,
        poison: list[int],
        block: int,
    ) -> None:
        cmd = [
            str(host / ".venv" / "bin" / "python"),
            "chaos_client.py",
            "--url",
            env["ACME_DATABASE_URL"],
            "--redis",
            env["ACME_REDIS_URL"],
            "--ledger",
            self.pg.url(),
            "--items",
            str(items),
            "--rate",
            str(rate),
            "--poison",
            ",".join(map(str, poison)),
            "--block",
            str(block),
            "--block-file",
            str(self.run_dir / "block.go"),
            "--cancels",
            str(max(1, min(items // 50, int(items / rate / CANCEL_EVERY_S)))),
            "--cancel-every",
            str(CANCEL_EVERY_S),
        ]
        with (self.run_dir / "client.log").open("ab") as log:
            proc = await asyncio.create_subprocess_exec(
                *cmd, cwd=host, env=env, stdout=asyncio.subprocess.PIPE, stderr=log
            )
            assert proc.stdout is not None
            async for raw in proc.stdout:
                line = json.loads(raw)
                if "cancelled" in line:
                    self.cancels.append({"item": uuid.UUID(line["cancelled"]), "was": line["was"]})
                    continue
                self.client_lines.append({**line, "t": time.time()})
            code = await proc.wait()
        if code != 0:
            raise SystemExit(f"chaos: the enqueuing client exited {code} (client.log)")
        self.client_done.set()

    async def wind_down(self, fleet: Fleet, tasks: list[asyncio.Task[Any]]) -> None:
        """Cancel the run's tasks, stop every worker with SIGTERM, close the proxy."""
        fleet.stopping = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.to_thread(fleet.stop_all)
        await self.proxy.close()

    async def unsettled(self) -> int:
        """Items neither COMPLETED nor FAILED."""
        conn = await asyncpg.connect(self.pg.url())
        try:
            return int(
                await conn.fetchval(
                    # Each arm its partial index: the harness never reads the history.
                    "SELECT (SELECT count(*) FROM work_items WHERE status = 'AVAILABLE') "
                    "+ (SELECT count(*) FROM work_items WHERE status = 'CLAIMED')"
                )
            )
        finally:
            await conn.close()

    # faults
    async def _witness(self, fleet: Fleet, channel: str) -> int:
        """Spare a slot of `channel` (not running the blocked handler) from the kills, and
        give it time to be healthy: it watches the next outage through its /healthz."""
        slot = next(
            s
            for s in fleet.slots
            if s.channel == channel and (s.proc is None or s.proc.pid != self.block_pid)
        )
        fleet.spared_slots[slot.index] += 1
        await asyncio.sleep(5)
        deadline = time.monotonic() + 60
        while not (fleet.alive(slot) and slot.proc is not None and slot.proc.pid in fleet.ready):
            if time.monotonic() > deadline:
                raise SystemExit(f"chaos: worker {slot.index} not up within 60 s to witness")
            await asyncio.sleep(0.2)
        await asyncio.sleep(3)
        return slot.index

    async def half_open(self, fleet: Fleet) -> None:
        witness = await self._witness(fleet, "topic")
        fault = Fault("half-open Redis connections", time.time(), {"witness": witness})
        self.faults.append(fault)
        fault.detail["silenced"] = self.proxy.silence()
        await asyncio.sleep(RESUBSCRIBE_BOUND_S + 5)
        fleet.spared_slots[witness] -= 1

    async def terminate_backends(self) -> None:
        conn = await asyncpg.connect(self.pg.url())
        try:
            fault = Fault("pg_terminate_backend", time.time())
            self.faults.append(fault)
            n = await conn.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE usename = 'acme_app'"
            )
            fault.detail["terminated"] = int(n)
        finally:
            await conn.close()

    async def blocked_loop(self, fleet: Fleet, index: int) -> None:
        """Have the client enqueue item `index` (note `block`), spare the process that runs
        it until its handler has blocked for `BLOCK_S` and a little after."""
        (self.run_dir / "block.go").touch()
        conn = await asyncpg.connect(self.pg.url())
        try:
            while True:
                await asyncio.sleep(0.2)
                with contextlib.suppress(OSError, asyncpg.PostgresError):
                    row = await conn.fetchrow(
                        "SELECT l.pid, extract(epoch FROM l.started_at) AS started "
                        "FROM chaos_ledger l JOIN chaos_records r ON r.item_index = $1 "
                        "JOIN work_items w ON w.id = l.item_id "
                        "AND w.payload->>'record_id' = r.id::text ORDER BY l.id LIMIT 1",
                        index,
                    )
                    if row is not None:
                        break
        finally:
            await conn.close()
        fleet.spared_pids.add(row["pid"])
        self.block_pid = row["pid"]
        self.faults.append(
            Fault(
                "handler blocks its event loop",
                float(row["started"]),
                {"pid": row["pid"], "blocked_s": BLOCK_S},
            )
        )
        await asyncio.sleep(BLOCK_S + 5)
        fleet.spared_pids.discard(row["pid"])

    async def redis_outage(self, fleet: Fleet) -> None:
        witness = await self._witness(fleet, "topic")
        fault = Fault("Redis outage", time.time(), {"witness": witness})
        self.faults.append(fault)
        await asyncio.to_thread(self.redis.stop)
        fault.detail["down_at"] = time.time()
        await asyncio.sleep(self.args.redis_outage_s)
        await asyncio.to_thread(self.redis.start)
        fault.detail["up_at"] = time.time()
        await asyncio.sleep(HEALTHY_AGAIN_BOUND_S + 3)
        fleet.spared_slots[witness] -= 1

    async def pg_outage(self, fleet: Fleet) -> None:
        witness = await self._witness(fleet, "database")
        fault = Fault("PostgreSQL restart", time.time(), {"witness": witness})
        self.faults.append(fault)
        await asyncio.to_thread(self.pg.stop, "immediate")
        fault.detail["down_at"] = time.time()
        await asyncio.sleep(self.args.pg_outage_s)
        await asyncio.to_thread(self.pg.start)
        fault.detail["up_at"] = time.time()
        await asyncio.sleep(HEALTHY_AGAIN_BOUND_S + 3)
        fleet.spared_slots[witness] -= 1

    async def lane_pause(self, fleet: Fleet) -> None:
        """Pause the workers' lane with the worker's own command, keep it paused `PAUSE_S`
        (kills and enqueues go on), then resume it; the times come from the pause's row
        (the database's clock) and from just before the resume began."""
        command = [str(fleet.host / ".venv" / "bin" / WORKER.name), "lanes"]
        who = ["--operator", "chaos"]

        def run(*args: str) -> None:
            done = subprocess.run(
                [*command, *args, *who],
                check=False,
                cwd=fleet.host,
                env=fleet.env,
                capture_output=True,
            )
            if done.returncode != 0:
                raise RuntimeError(f"lanes {args[0]}: {done.stderr.decode(errors='replace')}")

        await asyncio.to_thread(run, "pause", "default", "--reason", "chaos: a paused lane")
        conn = await asyncpg.connect(self.pg.url())
        try:
            paused_at = await conn.fetchval(
                "SELECT extract(epoch FROM paused_at) FROM work_lane_pauses WHERE lane = 'default'"
            )
        finally:
            await conn.close()
        fault = Fault("lane paused", float(paused_at), {"lane": "default"})
        self.faults.append(fault)
        await asyncio.sleep(PAUSE_S)
        fault.detail["resume_began_at"] = time.time()
        await asyncio.to_thread(run, "resume", "default")

    async def fault_script(self, fleet: Fleet, block: int) -> None:
        """The faults besides the kills, one after another (the kills never stop)."""
        await asyncio.sleep(3)
        await self.half_open(fleet)
        await self.terminate_backends()
        await self.lane_pause(fleet)
        await asyncio.sleep(3)
        await self.blocked_loop(fleet, block)
        await self.redis_outage(fleet)
        await asyncio.sleep(3)
        await self.pg_outage(fleet)

    async def run_chaos(self, host: Path, env: dict[str, str]) -> int:
        args = self.args
        await self.proxy.start()
        fleet = self.fleet = Fleet(host, env, self.run_dir)
        for slot in fleet.slots:
            fleet.start(slot)
        await fleet.wait_healthy()
        say(f"{SLOTS} workers healthy; enqueuing {args.items} items over {args.seconds:.0f} s")
        items, span = args.items, args.seconds
        poison = [int(items * f) for f in (0.01, 0.03, 0.05, 0.07, 0.09)][: max(1, items // 2000)]
        block = items - 1  # enqueued when the script gets to it
        origin = time.monotonic()
        tasks = [
            asyncio.create_task(fleet.supervise()),
            asyncio.create_task(fleet.watch_health()),
            asyncio.create_task(fleet.killer(args.kill_every, self.rng)),
            asyncio.create_task(self.client(host, env, items, items / span, poison, block)),
            asyncio.create_task(self.fault_script(fleet, block)),
        ]
        faults_done = tasks[4]
        try:
            last = time.monotonic()
            deadline = origin + span + args.drain_timeout
            while True:
                await asyncio.sleep(1)
                for task in tasks:
                    failed = task.exception() if task.done() and not task.cancelled() else None
                    if failed is not None:
                        raise failed
                if self.client_done.is_set() and faults_done.done():
                    try:
                        left = await self.unsettled()
                    except (OSError, asyncpg.PostgresError):
                        continue
                    if left == 0:
                        break
                if time.monotonic() > deadline:
                    say("drain timeout: items still unsettled; checking what there is")
                    break
                if time.monotonic() - last >= 10:
                    last = time.monotonic()
                    sent = max(
                        (x.get("enqueued", x.get("done", 0)) for x in self.client_lines), default=0
                    )
                    say(
                        f"t={time.monotonic() - origin:5.0f} s enqueued {sent}, kills "
                        f"{len(fleet.kills)}, faults {len(self.faults)}"
                    )
        finally:
            await self.wind_down(fleet, tasks)
        duration = time.monotonic() - origin
        report = await Checks(self, fleet, items, poison, block, duration).run()
        (self.run_dir / "summary.json").write_text(json.dumps(report, indent=2, default=str))
        with (self.run_dir / "health.jsonl").open("w") as f:
            for sample in fleet.health:
                f.write(json.dumps(sample) + "\n")
        print_report(report)
        say(f"logs and summary.json kept in {self.run_dir}")
        return 0 if report["ok"] else 1


# -- the checks -----------------------------------------------------------------------------


class Checks:
    """The invariants, read from the queue table, the ledger, the transitions, the records
    and the audit entries once every worker has stopped."""

    def __init__(
        self,
        run: ChaosRun,
        fleet: Fleet,
        items: int,
        poison: list[int],
        block: int,
        duration: float,
    ) -> None:
        self.run_ = run
        self.fleet = fleet
        self.items = items
        self.poison = poison
        self.block = block
        self.duration = duration
        self.failures: list[str] = []
        self.late_detail: list[dict[str, Any]] = []
        self.transitions: list[asyncpg.Record] = []

    def expect(self, ok: bool, message: str) -> None:
        if not ok:
            self.failures.append(message)

    async def run(self) -> dict[str, Any]:
        conn = await asyncpg.connect(self.run_.pg.url())
        try:
            return await self._run(conn)
        finally:
            await conn.close()

    async def _run(self, conn: asyncpg.Connection) -> dict[str, Any]:
        items = await conn.fetch(
            "SELECT w.id, w.status, w.claim_token, w.last_error, w.audit_owed_token, r.item_index, "
            "r.version, r.advanced_by FROM work_items w "
            "JOIN chaos_records r ON r.id::text = w.payload->>'record_id'"
        )
        by_id = {row["id"]: row for row in items}
        poison_ids = {row["id"] for row in items if row["item_index"] in self.poison}
        block_ids = {row["id"] for row in items if row["item_index"] == self.block}
        transitions = await conn.fetch(
            "SELECT item_id, old_status, new_status, old_token, new_token, claimed_by, "
            "extract(epoch FROM at) AS at FROM chaos_transitions ORDER BY id"
        )
        ledger = await conn.fetch(
            "SELECT item_id, claim_token, pid, extract(epoch FROM started_at) AS started, "
            "extract(epoch FROM ended_at) AS ended FROM chaos_ledger ORDER BY id"
        )
        audited = {
            row["key"]
            for row in await conn.fetch(
                "SELECT idempotency_key AS key FROM audit_entries "
                "WHERE idempotency_key LIKE '%:dead_lettered:%'"
            )
        }
        enqueued = len(items)
        self.expect(enqueued == self.items, f"{enqueued} items in the table, {self.items} enqueued")
        completions = changes_to("COMPLETED", transitions)
        died_under = changes_to("FAILED", transitions)
        doubled = [i for i, c in completions.items() if len(c) > 1]
        cancelled_ids = {c["item"] for c in self.run_.cancels}
        lost = [
            row["id"]
            for row in items
            if not (
                (row["id"] not in poison_ids and row["status"] == "COMPLETED")
                or (row["id"] in poison_ids and row["status"] == "FAILED")
                or (row["id"] in cancelled_ids and row["status"] == "CANCELLED")
            )
        ]
        # Cancelled: nothing accepted after the change to CANCELLED (no completion, no
        # requeue of a dead holder's item), and no completion before it either (a cancel
        # of a completed item is refused).
        after_cancel = [
            i
            for i in cancelled_ids
            if i in completions or not _last_change_is(i, "CANCELLED", transitions)
        ]
        self.expect(
            not after_cancel,
            f"{len(after_cancel)} cancelled items changed after the cancel: {after_cancel[:5]}",
        )
        self.expect(not doubled, f"{len(doubled)} items completed twice")
        self.expect(
            not lost,
            f"{len(lost)} items lost or dead-lettered not by design: "
            + ", ".join(f"{i} {by_id[i]['status']} {by_id[i]['last_error']}" for i in lost[:5]),
        )
        unaudited = [
            i
            for i in poison_ids
            if by_id[i]["status"] == "FAILED"
            and (
                by_id[i]["audit_owed_token"] is not None
                or len(died_under.get(i, [])) != 1
                or f"{i}:dead_lettered:{died_under[i][0]}" not in audited
            )
        ]
        self.expect(not unaudited, f"{len(unaudited)} dead letters without their audit entry")
        # Every accepted completion is the claim of an execution that ran to its end.
        finished = {(r["item_id"], r["claim_token"]) for r in ledger if r["ended"] is not None}
        orphan = [i for i, tokens in completions.items() if (i, tokens[0]) not in finished]
        self.expect(not orphan, f"{len(orphan)} completions without a finished execution")
        # Records: advanced once per completed item, never for poison.
        bad_records = [
            row["id"]
            for row in items
            if (row["id"] in cancelled_ids and row["version"] not in (0, 1))
            or (
                row["id"] not in cancelled_ids
                and row["version"] != (0 if row["id"] in poison_ids else 1)
            )
        ]
        self.expect(not bad_records, f"{len(bad_records)} records not advanced exactly once")
        kill_at = {pid: t for t, _, pid in self.fleet.kills}
        runs = executions(ledger, transitions, kill_at)
        overlaps: list[dict[str, Any]] = []
        block_overlaps: list[dict[str, Any]] = []
        # The blocked loop's process and when its loop blocked: an item whose execution there
        # spans that moment (the blocked item, or another of its items in flight) cannot
        # renew its lease while the loop is blocked, so running again elsewhere is the
        # fault's expected outcome, reported, not a broken fence.
        blocked = [
            (f.detail["pid"], f.at)
            for f in self.run_.faults
            if f.name == "handler blocks its event loop" and "pid" in f.detail
        ]
        for overlap in overlapping(runs):
            expected = overlap["item"] in {str(i) for i in block_ids} or in_blocked_loop(
                overlap, blocked
            )
            (block_overlaps if expected else overlaps).append(overlap)
        self.expect(not overlaps, f"{len(overlaps)} overlapping executions: {overlaps[:3]}")
        re_executed = sum(1 for spans in runs.values() if len(spans) > 1)
        executions_n = len(ledger)
        # Items held by a killed worker: handed back within lease + sweep interval.
        recovery = self._requeues(transitions)
        self.transitions = transitions
        faults = self._faults()
        outcome = {
            "items": self.items,
            "enqueued": enqueued,
            "completed": sum(1 for row in items if row["status"] == "COMPLETED"),
            "dead_lettered_by_design": sum(1 for i in poison_ids if by_id[i]["status"] == "FAILED"),
            "cancelled": len(cancelled_ids),
            "cancelled_while_claimed": sum(1 for c in self.run_.cancels if c["was"] == "CLAIMED"),
            "cancelled_changed_after": len(after_cancel),
            "lost": len(lost),
            "completed_twice": len(doubled),
            "records_not_advanced_once": len(bad_records),
            "overlapping_executions": len(overlaps),
            "blocked_item_overlaps": block_overlaps,
            "executions": executions_n,
            "items_run_more_than_once": re_executed,
            "kills": len(self.fleet.kills),
            "incarnations": sum(len(s.incarnations) for s in self.fleet.slots),
            "exits_other_than_kills": [
                asdict(i)
                for s in self.fleet.slots
                for i in s.incarnations
                if i.end and not i.end.startswith(("killed", "stopped"))
            ],
            "enqueue_retries": (
                self.run_.client_lines[-1].get("retries") if self.run_.client_lines else None
            ),
            "duration_s": round(self.duration, 1),
        }
        return {
            "ok": not self.failures,
            "failures": self.failures,
            "outcome": outcome,
            "recovery": recovery,
            "faults": faults,
            "cancels": [{"item": str(c["item"]), "was": c["was"]} for c in self.run_.cancels],
            "settings": {
                "lease_s": LEASE_S,
                "sweep_interval_s": SWEEP_INTERVAL_S,
                "heartbeat_interval_s": HEARTBEAT_INTERVAL_S,
                "heartbeat_failure_limit": HEARTBEAT_FAILURE_LIMIT,
                "poll_interval_s": POLL_INTERVAL_S,
                "capacity": CAPACITY,
                "workers": SLOTS,
                "kill_every_s": self.run_.args.kill_every,
                "work_s": self.run_.args.work_s,
            },
        }

    def _pg_window(self) -> tuple[float, float] | None:
        for f in self.run_.faults:
            if f.name == "PostgreSQL restart" and "up_at" in f.detail:
                return f.detail["down_at"], f.detail["up_at"]
        return None

    def _requeues(self, transitions: list[asyncpg.Record]) -> dict[str, Any]:
        """For each kill: the items the killed process held, and when each was handed back."""
        held: dict[int, dict[tuple[Any, Any], float]] = {}  # pid -> (item, token) -> claimed at
        left: dict[tuple[Any, Any], float] = {}
        for t in transitions:
            if t["new_status"] == "CLAIMED" and t["new_token"] is not None and t["claimed_by"]:
                parts = t["claimed_by"].split(":")
                if len(parts) >= 3 and parts[-2].isdigit():
                    held.setdefault(int(parts[-2]), {})[(t["item_id"], t["new_token"])] = float(
                        t["at"]
                    )
            if t["old_status"] == "CLAIMED" and t["old_token"] is not None:
                left.setdefault((t["item_id"], t["old_token"]), float(t["at"]))
        window = self._pg_window()
        in_outage: list[float] = []
        late: list[float] = []
        calm_times: list[float] = []
        for killed_at, _, pid in self.fleet.kills:
            for key, claimed_at in held.get(pid, {}).items():
                if claimed_at > killed_at:
                    continue
                back = left.get(key)
                if back is not None and back < killed_at:
                    continue  # settled before the kill
                waited = (back if back is not None else float("inf")) - killed_at
                meets_outage = (
                    window is not None
                    and killed_at < window[1]
                    and (killed_at + REQUEUE_BOUND_S > window[0])
                )
                if meets_outage:
                    in_outage.append(waited)
                    continue
                calm_times.append(waited)
                if waited > REQUEUE_BOUND_S:
                    late.append(round(waited, 2))
                    self.late_detail.append(
                        {
                            "item": str(key[0]),
                            "pid": pid,
                            "killed_at": killed_at,
                            "claimed_at": claimed_at,
                            "handed_back_after_s": round(waited, 2),
                        }
                    )
        self.expect(
            not late,
            f"{len(late)} items of killed workers handed back later than "
            f"{REQUEUE_BOUND_S} s: {sorted(late)[-5:]}",
        )
        calm = sorted(t for t in calm_times if t != float("inf"))
        return {
            "items_held_at_kills": len(calm_times),
            "handed_back_p50_s": _pct(calm, 50),
            "handed_back_max_s": round(calm[-1], 2) if calm else None,
            "bound_s": REQUEUE_BOUND_S,
            "late": self.late_detail,
            "during_pg_outage": len(in_outage),
            "during_pg_outage_max_s": round(max(in_outage), 2) if in_outage else None,
        }

    def _resubscribed(self, witness: int, since: float) -> tuple[float | None, float | None]:
        """When the witness logged its wake-up channel lost, and back, after `since`: the
        loop logs both once (docs/operations.md, Wake-ups). Times from the log lines."""
        lost = back = None
        slot = self.fleet.slots[witness]
        for inc in slot.incarnations:
            if inc.started > since or (inc.ended is not None and inc.ended < since):
                continue
            for line in (self.run_.run_dir / inc.log).read_text(errors="replace").splitlines():
                match = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ", line)
                if not match:
                    continue
                at = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S"))
                at += int(match.group(2)) / 1000
                if at < since:
                    continue
                if lost is None and "wake-ups (topic) lost" in line:
                    lost = at
                elif lost is not None and "wake-ups (topic) back" in line:
                    return lost, at
        return lost, back

    def _faults(self) -> list[dict[str, Any]]:
        rows = []
        health = self.fleet.health
        for f in self.run_.faults:
            row: dict[str, Any] = {"fault": f.name, "at": f.at, **f.detail}
            if f.name in ("PostgreSQL restart", "Redis outage") and "up_at" in f.detail:
                witness = f.detail["witness"]
                bound = (
                    PG_UNHEALTHY_BOUND_S
                    if f.name.startswith("PostgreSQL")
                    else REDIS_UNHEALTHY_BOUND_S
                )
                down, up = f.detail["down_at"], f.detail["up_at"]
                seen = [h for h in health if h[1] == witness and down - 5 <= h[0]]
                pids = {h[2] for h in seen if h[0] <= up + HEALTHY_AGAIN_BOUND_S}
                unhealthy = next(
                    (h[0] for h in seen if h[0] >= down and h[3] not in (200, None)), None
                )
                healthy = next((h[0] for h in seen if h[0] >= up and h[3] == 200), None)
                row.update(
                    outage_s=round(up - down, 1),
                    witness_pids=sorted(pids),
                    unhealthy_after_s=None if unhealthy is None else round(unhealthy - down, 2),
                    unhealthy_bound_s=bound,
                    healthy_again_after_s=None if healthy is None else round(healthy - up, 2),
                    healthy_again_bound_s=HEALTHY_AGAIN_BOUND_S,
                )
                self.expect(len(pids) == 1, f"{f.name}: the witness restarted during the outage")
                self.expect(
                    unhealthy is not None and unhealthy - down <= bound,
                    f"{f.name}: /healthz not non-2xx within {bound} s",
                )
                self.expect(
                    healthy is not None and healthy - up <= HEALTHY_AGAIN_BOUND_S,
                    f"{f.name}: /healthz not 2xx again within {HEALTHY_AGAIN_BOUND_S} s",
                )
            if f.name == "lane paused" and "resume_began_at" in f.detail:
                start, end = f.at + PAUSE_GRACE_S, f.detail["resume_began_at"]
                claimed = [
                    float(t["at"]) - f.at
                    for t in self.transitions
                    if t["new_status"] == "CLAIMED" and start <= float(t["at"]) <= end
                ]
                row.update(
                    paused_s=round(end - f.at, 1),
                    claims_while_paused=len(claimed),
                    claims_in_grace=sum(
                        1
                        for t in self.transitions
                        if t["new_status"] == "CLAIMED" and f.at <= float(t["at"]) < start
                    ),
                )
                self.expect(
                    not claimed,
                    f"lane paused: {len(claimed)} claims while it was paused, "
                    f"{[round(c, 2) for c in claimed[:5]]} s after the pause",
                )
            if f.name == "half-open Redis connections":
                lost, back = self._resubscribed(f.detail["witness"], f.at)
                row.update(
                    wake_ups_lost_after_s=None if lost is None else round(lost - f.at, 2),
                    wake_ups_back_after_s=None if back is None else round(back - f.at, 2),
                    bound_s=RESUBSCRIBE_BOUND_S,
                )
                self.expect(
                    back is not None and back - f.at <= RESUBSCRIBE_BOUND_S,
                    f"half-open: wake-ups not back within {RESUBSCRIBE_BOUND_S} s",
                )
            rows.append(row)
        names = {f.name for f in self.run_.faults}
        for expected in (
            "PostgreSQL restart",
            "Redis outage",
            "half-open Redis connections",
            "pg_terminate_backend",
            "handler blocks its event loop",
        ):
            self.expect(expected in names, f"fault not injected: {expected}")
        self.expect(bool(self.fleet.kills), "no worker was killed")
        self.expect(bool(self.run_.cancels), "no item was cancelled")
        return rows


Row = Any  # an asyncpg.Record or a mapping with the same keys


def _last_change_is(item_id: Any, status: str, transitions: list[Row]) -> bool:
    """Whether the item's last recorded change (status or claim token) is the one to
    `status`."""
    last = None
    for t in transitions:
        if t["item_id"] == item_id:
            last = t
    return last is not None and last["new_status"] == status


def changes_to(status: str, transitions: list[Row]) -> dict[Any, list[Any]]:
    """Item id -> the claim tokens it held each time it changed to `status`, in order: an
    item completed once has one token under `COMPLETED`."""
    found: dict[Any, list[Any]] = {}
    for t in transitions:
        if t["new_status"] == status and t["old_status"] != status:
            found.setdefault(t["item_id"], []).append(t["old_token"])
    return found


def executions(
    ledger: list[Row], transitions: list[Row], kill_at: dict[int, float]
) -> dict[Any, list[tuple[float, float, int]]]:
    """Item id -> its executions as (start, end, pid), times in epoch seconds.

    An execution ends at its ledger `ended` time; without one (its process died, or it
    raised before stamping it) at its process's kill, else at the first change that took the
    item from its claim token (the failure or hand-back written after it), else never.
    """
    leave_at: dict[tuple[Any, Any], float] = {}
    for t in transitions:
        if t["old_token"] is not None and (
            t["old_token"] != t["new_token"] or t["new_status"] != "CLAIMED"
        ):
            leave_at.setdefault((t["item_id"], t["old_token"]), float(t["at"]))
    runs: dict[Any, list[tuple[float, float, int]]] = {}
    for r in ledger:
        end = r["ended"]
        if end is None:
            killed = kill_at.get(r["pid"])
            candidates = [
                killed if killed is not None and killed >= float(r["started"]) else None,
                leave_at.get((r["item_id"], r["claim_token"])),
            ]
            end = min((c for c in candidates if c is not None), default=float("inf"))
        runs.setdefault(r["item_id"], []).append((float(r["started"]), float(end), r["pid"]))
    return runs


def in_blocked_loop(overlap: dict[str, Any], blocked: list[tuple[int, float]]) -> bool:
    """Whether either execution of `overlap` (as `overlapping` reports it) ran in a process
    of `blocked` (pid, when its loop blocked) and was in flight at that moment."""
    return any(
        pid == blocked_pid and start <= at <= end
        for start, end, pid in (overlap["first"], overlap["second"])
        for blocked_pid, at in blocked
    )


def overlapping(runs: dict[Any, list[tuple[float, float, int]]]) -> list[dict[str, Any]]:
    """Every pair of executions of one item that overlap in time, each with its overlap in
    seconds (an execution that never ended overlaps everything after its start)."""
    found = []
    for item_id, spans in runs.items():
        ordered = sorted(spans)
        for i, (s1, e1, p1) in enumerate(ordered):
            for s2, e2, p2 in ordered[i + 1 :]:
                if s2 >= e1:
                    continue
                found.append(
                    {
                        "item": str(item_id),
                        "first": [s1, e1, p1],
                        "second": [s2, e2, p2],
                        "overlap_s": round(min(e1, e2) - s2, 3),
                    }
                )
    return found


def _pct(ordered: list[float], pct: float) -> float | None:
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))], 3)


def print_report(report: dict[str, Any]) -> None:
    o, r = report["outcome"], report["recovery"]
    print()
    print(
        "| items | completed | dead-lettered by design (audited) | lost | completed twice "
        "| records not advanced once | overlapping executions (the blocked item's apart) "
        "| items run more than once |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {o['items']:,} | {o['completed']:,} | {o['dead_lettered_by_design']} | {o['lost']} "
        f"| {o['completed_twice']} | {o['records_not_advanced_once']} "
        f"| {o['overlapping_executions']} | {o['items_run_more_than_once']:,} |"
    )
    print(
        f"\ncancelled by the operator: {o['cancelled']} ({o['cancelled_while_claimed']} while "
        f"claimed); changed after the cancel: {o['cancelled_changed_after']}"
    )
    print()
    print("| fault | injected | measured | bound |")
    print("|---|---|---|---|")
    outage = (
        f"{r['during_pg_outage']} more held when the PostgreSQL outage began, back after at "
        f"most {r['during_pg_outage_max_s']} s"
        if r["during_pg_outage"]
        else "none held when the PostgreSQL outage began"
    )
    print(
        f"| kill -9 of a worker (restarted at once) | {o['kills']} | {r['items_held_at_kills']} items "
        f"held at the kills, handed back after p50 {r['handed_back_p50_s']} s, max "
        f"{r['handed_back_max_s']} s; {outage} | {r['bound_s']} s |"
    )
    for f in report["faults"]:
        if "unhealthy_after_s" in f:
            measured = (
                f"down {f['outage_s']} s; /healthz 503 after {f['unhealthy_after_s']} s, "
                f"200 again {f['healthy_again_after_s']} s after recovery"
            )
            bound = f"{f['unhealthy_bound_s']} s / {f['healthy_again_bound_s']} s"
        elif "wake_ups_back_after_s" in f:
            measured = (
                f"{f['silenced']} connections silenced; the witness's wake-ups lost "
                f"after {f['wake_ups_lost_after_s']} s, back after "
                f"{f['wake_ups_back_after_s']} s"
            )
            bound = f"{f['bound_s']} s"
        elif "terminated" in f:
            measured, bound = f"{f['terminated']} connections terminated", "-"
        elif "claims_while_paused" in f:
            measured = (
                f"paused {f['paused_s']} s; {f['claims_while_paused']} claims while paused "
                f"({f['claims_in_grace']} in the first {PAUSE_GRACE_S} s)"
            )
            bound = "0 claims"
        else:
            overlaps = o["blocked_item_overlaps"]
            measured = (
                f"loop blocked {f.get('blocked_s')} s; the item ran again elsewhere, "
                f"{len(overlaps)} overlap(s) of "
                + ", ".join(f"{x['overlap_s']} s" for x in overlaps)
                if overlaps
                else f"loop blocked {f.get('blocked_s')} s; no overlap"
            )
            bound = "reported"
        print(f"| {f['fault']} | 1 | {measured} | {bound} |")
    print()
    print(
        f"{o['executions']:,} executions in {o['duration_s']} s; {o['incarnations']} worker "
        f"processes; enqueue retries {o['enqueue_retries']}; exits other than kills: "
        f"{len(o['exits_other_than_kills'])}"
    )
    for exited in o["exits_other_than_kills"]:
        print(
            f"- slot {exited['slot']} pid {exited['pid']} ({exited['log']}): {exited['end']}: "
            f"{exited['cause'] or 'no cause logged'}"
        )
    if report["failures"]:
        print("\nINVARIANTS BROKEN:")
        for failure in report["failures"]:
            print(f"  - {failure}")
    else:
        print("\nevery invariant held")


# -- soak -----------------------------------------------------------------------------------


def _proc_figures(pid: int, pg_port: int, redis_port: int) -> dict[str, float] | None:
    """RSS (MB), open file descriptors, and sockets to PostgreSQL and to Redis of `pid`."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = os.listdir(f"/proc/{pid}/fd")
        inodes = set()
        for fd in fds:
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    except OSError:
        return None
    found = re.search(r"VmRSS:\s+(\d+)", status)
    if found is None:
        return None  # a zombie: no memory left to measure
    rss = int(found.group(1)) / 1024
    pg = rd = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[9] in inodes and cols[3] == "01":  # ESTABLISHED
                    port = int(cols[2].rsplit(":", 1)[1], 16)
                    pg += port == pg_port
                    rd += port == redis_port
    return {"rss_mb": round(rss, 1), "fds": len(fds), "pg_connections": pg, "redis_connections": rd}


async def _sample_fleet(run: ChaosRun, fleet: Fleet, origin: float) -> list[dict[str, Any]]:
    """One sample per live worker: `_proc_figures` and its `worker_event_loop_tasks`."""
    samples = []
    now = time.time()
    for slot in fleet.slots:
        if not fleet.alive(slot):
            continue
        assert slot.proc is not None
        figures = _proc_figures(slot.proc.pid, run.pg.port, run.proxy.port)
        _, metrics = await http_get(slot.port, "/metrics")
        tasks_n = _metric(metrics or "", "worker_event_loop_tasks")
        if figures is not None:
            sample: dict[str, Any] = {"t": now - origin, "slot": slot.index, "pid": slot.proc.pid}
            samples.append(sample | figures | {"tasks": tasks_n})
    return samples


async def _table_figures(run: ChaosRun, origin: float) -> dict[str, Any]:
    """`work_items` as PostgreSQL counts it: live and dead rows, autovacuum runs so far."""
    conn = await asyncpg.connect(run.pg.url())
    try:
        row = await conn.fetchrow(
            "SELECT n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count "
            "FROM pg_stat_user_tables WHERE relname = 'work_items'"
        )
    finally:
        await conn.close()
    return {"t": time.time() - origin, **dict(row or {})}


async def run_soak(run: ChaosRun, host: Path, env: dict[str, str]) -> int:
    args = run.args
    await run.proxy.start()
    fleet = run.fleet = Fleet(host, env, run.run_dir)
    for slot in fleet.slots:
        fleet.start(slot)
    await fleet.wait_healthy()
    tasks = [asyncio.create_task(fleet.supervise())]
    try:
        burst = args.burst_items
        say(f"measuring capacity: {burst} items at once")
        await run.client(host, env, burst, 1e9, [], -1)
        # The burst is the heaviest load of the run: what each pool opens for it is the
        # most the steady half-rate load can need (a pool keeps what it opened, up to its
        # size), so the connection counts are judged against it as well as minute 5.
        burst_samples: list[dict[str, Any]] = []
        while await run.unsettled() > 0:
            burst_samples += await _sample_fleet(run, fleet, time.time())
            await asyncio.sleep(0.5)
        capacity = burst / await _drain_seconds(run)
        rate = capacity / 2
        total = int(rate * args.minutes * 60)
        say(
            f"capacity {capacity:.0f} items/s; soaking at {rate:.0f} items/s for {args.minutes} min "
            f"({total:,} items)"
        )
        run.client_done.clear()
        client = asyncio.create_task(run.client(host, env, total, rate, [], -1))
        tasks.append(client)
        samples: list[dict[str, Any]] = []
        table: list[dict[str, Any]] = []
        origin = time.time()
        reported = 0
        while not client.done():
            await asyncio.sleep(5)
            now = time.time()
            samples += await _sample_fleet(run, fleet, origin)
            table.append(await _table_figures(run, origin))
            minutes_done = int((now - origin) // 60)
            if minutes_done > reported:
                reported = minutes_done
                say(f"minute {minutes_done} of {args.minutes} done")
        client.result()
        while await run.unsettled() > 0:
            await asyncio.sleep(0.5)
        latency = await _claim_latency(run, origin)
    finally:
        await run.wind_down(fleet, tasks)
    report = _soak_report(
        samples, burst_samples, table, latency, fleet, capacity, rate, args.minutes
    )
    (run.run_dir / "soak.json").write_text(json.dumps(report, indent=2))
    say(f"logs and soak.json kept in {run.run_dir}")
    return 0 if report["ok"] else 1


async def _drain_seconds(run: ChaosRun) -> float:
    """Seconds from the first claim to the last completion (the transitions so far)."""
    conn = await asyncpg.connect(run.pg.url())
    try:
        return float(
            await conn.fetchval(
                "SELECT extract(epoch FROM max(at) FILTER (WHERE new_status = 'COMPLETED') "
                "- min(at) FILTER (WHERE new_status = 'CLAIMED')) FROM chaos_transitions"
            )
        )
    finally:
        await conn.close()


def _metric(text: str, name: str) -> float | None:
    match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


async def _claim_latency(run: ChaosRun, origin: float) -> dict[int, dict[str, float]]:
    """Per minute of the soak: p50/p95/p99 of claim time minus the item's available_at."""
    conn = await asyncpg.connect(run.pg.url())
    try:
        rows = await conn.fetch(
            "SELECT floor((extract(epoch FROM at) - $1) / 60)::int + 1 AS minute, "
            "percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP "
            "(ORDER BY extract(epoch FROM at - available_at)) AS p, count(*) AS n "
            "FROM chaos_transitions WHERE new_status = 'CLAIMED' AND at >= to_timestamp($1) "
            "GROUP BY 1 ORDER BY 1",
            origin,
        )
    finally:
        await conn.close()
    return {
        int(r["minute"]): {
            "p50_ms": round(r["p"][0] * 1000, 1),
            "p95_ms": round(r["p"][1] * 1000, 1),
            "p99_ms": round(r["p"][2] * 1000, 1),
            "claims": int(r["n"]),
        }
        for r in rows
    }


# Figures a pool keeps at the most it opened: judged against the burst's peak as well.
_POOLED = ("fds", "pg_connections", "redis_connections")
# Claim latency is judged over five-minute windows (a minute's p95 moves by a third on its
# own), with 5 ms on top of the 10 % for the scheduler's and the wake-up's jitter.
_LATENCY_SLACK_MS = 5.0


def _soak_report(
    samples: list[dict[str, Any]],
    burst_samples: list[dict[str, Any]],
    table: list[dict[str, Any]],
    latency: dict[int, dict[str, float]],
    fleet: Fleet,
    capacity: float,
    rate: float,
    minutes: int,
) -> dict[str, Any]:
    """The soak's verdict: each worker's figures at the last minute against minute 5, the
    claim latency of the last five minutes against minutes 3-7, and no worker ending."""
    failures: list[str] = []
    figures = ("rss_mb", "fds", "pg_connections", "redis_connections", "tasks")

    # RSS: the median of a minute's samples. The counts move with the load (an item in
    # flight holds a task, a busy moment opens pooled connections up to the pool's size):
    # their floor, the fewest seen in the minute, is what a leak raises and load does not.
    def summary(f: str, values: list[float]) -> float:
        return statistics.median(values) if f == "rss_mb" else min(values)

    per_minute: dict[int, dict[int, dict[str, float]]] = {}
    for slot in range(SLOTS):
        for minute in range(1, minutes + 1):
            window = [
                s for s in samples if s["slot"] == slot and minute - 1 <= s["t"] / 60 < minute
            ]
            for f in figures:
                values = [s[f] for s in window if s[f] is not None]
                if values:
                    per_minute.setdefault(slot, {}).setdefault(minute, {})[f] = summary(f, values)
    burst_peak = {
        slot: {
            f: max((s[f] for s in burst_samples if s["slot"] == slot), default=0.0) for f in _POOLED
        }
        for slot in range(SLOTS)
    }
    first, last = min(5, minutes), minutes
    for slot, by_minute in per_minute.items():
        a, b = by_minute.get(first), by_minute.get(last)
        if a is None or b is None:
            failures.append(f"worker {slot}: no samples at minute {first} or {last}")
            continue
        for f in figures:
            if f not in a or f not in b:
                continue
            bound = a[f] * 1.10 + (0 if f == "rss_mb" else 0.5)
            if f in _POOLED:
                bound = max(bound, burst_peak[slot][f])
            if b[f] > bound:
                failures.append(
                    f"worker {slot}: {f} grew from {a[f]} (minute {first}) to {b[f]} "
                    f"(bound {bound:g})"
                )
    early = [latency[m] for m in range(3, 8) if m in latency]
    late = [latency[m] for m in range(max(8, last - 4), last + 1) if m in latency]
    latency_windows: dict[str, dict[str, float]] = {}
    if early and late:
        for q in ("p50_ms", "p95_ms"):
            before = statistics.median(p[q] for p in early)
            after = statistics.median(p[q] for p in late)
            latency_windows[q] = {"minutes_3_7": before, "last_5": after}
            if after > before * 1.10 + _LATENCY_SLACK_MS:
                failures.append(
                    f"claim latency {q[:3]} grew from {before} ms (minutes 3-7) to {after} ms "
                    f"(the last five)"
                )
    restarts = [
        asdict(i) for s in fleet.slots for i in s.incarnations if i.end and "stopped" not in i.end
    ]
    if restarts:
        failures.append(f"{len(restarts)} worker processes ended during the soak")
    cols = [m for m in sorted({first, 10, 15, 20, 25, last}) if m <= last]
    print()
    print("| worker | figure | " + " | ".join(f"min {m}" for m in cols) + " | burst peak |")
    print("|---|---|" + "---|" * (len(cols) + 1))
    for slot, by_minute in sorted(per_minute.items()):
        for f in figures:
            peak = burst_peak[slot][f] if f in _POOLED else "-"
            print(
                f"| {slot} | {f} | "
                + " | ".join(str(by_minute.get(m, {}).get(f, "-")) for m in cols)
                + f" | {peak} |"
            )
    print()
    print(
        "| minute | claims | p50 ms | p95 ms | p99 ms | work_items live / dead rows | autovacuums |"
    )
    print("|---|---|---|---|---|---|---|")
    for minute, p in sorted(latency.items()):
        at = [t for t in table if minute - 1 <= t["t"] / 60 < minute]
        rows = f"{at[-1]['n_live_tup']:,} / {at[-1]['n_dead_tup']:,}" if at else "-"
        vacuums = at[-1]["autovacuum_count"] if at else "-"
        print(
            f"| {minute} | {p['claims']:,} | {p['p50_ms']} | {p['p95_ms']} | {p['p99_ms']} "
            f"| {rows} | {vacuums} |"
        )
    print()
    for q, w in latency_windows.items():
        print(
            f"claim latency {q[:3]}: {w['minutes_3_7']} ms (minutes 3-7), {w['last_5']} ms (last 5)"
        )
    print("no growth" if not failures else "GROWTH OR RESTARTS:\n  - " + "\n  - ".join(failures))
    return {
        "ok": not failures,
        "failures": failures,
        "capacity_items_per_s": round(capacity, 1),
        "rate_items_per_s": round(rate, 1),
        "samples": samples,
        "burst_samples": burst_samples,
        "burst_peak": burst_peak,
        "table": table,
        "minutes": minutes,
        "per_minute": per_minute,
        "claim_latency": latency,
        "claim_latency_windows": latency_windows,
        "restarts": restarts,
    }


# -- main -----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mode", choices=["chaos", "soak"], default="chaos")
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=120.0, help="enqueue span (chaos)")
    parser.add_argument("--kill-every", type=float, default=2.0)
    parser.add_argument("--redis-outage-s", type=float, default=10.0)
    parser.add_argument("--pg-outage-s", type=float, default=8.0)
    parser.add_argument("--work-s", type=float, default=0.01, help="the handler's I/O wait")
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    parser.add_argument("--minutes", type=int, default=30, help="soak length")
    parser.add_argument("--burst-items", type=int, default=5000, help="soak capacity burst")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    for tool in ("initdb", "pg_ctl", "redis-server"):
        if shutil.which(tool) is None:
            raise SystemExit(
                f"chaos: `{tool}` is not on PATH (PostgreSQL and Redis server binaries)"
            )
    run_dir = WORK / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{args.mode}"
    run = ChaosRun(args, run_dir)
    try:
        run_dir.mkdir(parents=True)
        say(f"mode {args.mode}, seed {args.seed}, logs in {run_dir}")
        host, env = run.setup()
        if args.mode == "soak":
            return asyncio.run(run_soak(run, host, env))
        return asyncio.run(run.run_chaos(host, env))
    finally:
        run.teardown()


if __name__ == "__main__":
    sys.exit(main())
