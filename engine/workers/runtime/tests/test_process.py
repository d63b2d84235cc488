"""The worker as a process against the real PostgreSQL and Redis: signals, crashes, outages.

Each test starts `serve_scripted` (the production `serve` with a handler scripted through
the environment) as a child process and watches the queue through the work manager. The
replays come from peers' failure reports: graphile/worker#526 (SIGTERM then SIGKILL must not
leave a job locked for hours), oban-bg/oban#137 (a crash runs an item at most once more).
Process tests poll with deadlines; nothing here is mocked or skipped.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest
import work_process
from redis.asyncio import Redis
from sqlalchemy.engine import make_url
from work_network import RedisServer, SilencingProxy, free_port

from acme.infra.container import Infra
from acme.infra.settings import InfraSettings
from acme.om.context import OpContext, RequestContext
from acme.om.storage.impl.sql import SqlStorageRoot
from acme.om.work.types.work_item import WorkItem, WorkKind, WorkStatus
from acme.workers.runtime.container import RuntimeContainer
from acme.workers.runtime.testing import (
    APP,
    PROBE,
    PROBE_KIND,
    ProbeContainer,
    ProbeSettings,
    new_items,
    sample_payload,
)

pytestmark = pytest.mark.integration

PREFIX = ProbeSettings.env_prefix()
ROOT = "ACME_"
LEASE_S = 1.5
SWEEP_INTERVAL_S = 1.0
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
ADMIN_URL = os.environ.get(f"{ROOT}TEST_ADMIN_URL", DEFAULT_ADMIN_URL)


class WorkerProcess:
    """One `serve_scripted` child process; `log` holds its stderr, `script` the handler's."""

    def __init__(self, tmp: Path, env: dict[str, str], name: str) -> None:
        self.port = free_port()
        self.log = tmp / f"{name}.log"
        self.script = tmp / "handled.log"
        self.env = env | {
            f"{PREFIX}METRICS_PORT": str(self.port),
            "WORKER_TEST_LOG": str(self.script),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, work_process.__file__],
                env=self.env,
                stdout=out,
                stderr=out,
            )
        return self

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, within: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=within)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def script_lines(self, word: str, item_id: UUID) -> int:
        text = self.script.read_text() if self.script.exists() else ""
        return text.splitlines().count(f"{word} {item_id}")

    async def healthz(self) -> int:
        async with httpx.AsyncClient() as client:
            try:
                response = await client.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1.0)
            except httpx.TransportError:
                return 0
            return response.status_code


async def eventually(
    check: Callable[[], Awaitable[bool]], within: float, what: str, *workers: WorkerProcess
) -> float:
    """Poll `check` every 0.1 s until it holds; returns the seconds it took.

    Fails with `what` and the workers' logs after `within` seconds.
    """
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > within:
            logs = "\n".join(worker.tail() for worker in workers)
            pytest.fail(f"{what} not within {within} s\n{logs}")
        await asyncio.sleep(0.1)
    return time.monotonic() - started


@pytest.fixture
def queue(pg_storage: SqlStorageRoot) -> RuntimeContainer:
    """The test's view of the queue: the work manager over the session database, its
    tables emptied (the host's `pg_storage`), without Redis (wake-ups are the worker's)."""
    return ProbeContainer.for_tests(pg_storage, Infra.memory())


@pytest.fixture
async def tenant(queue: RuntimeContainer) -> OpContext:
    rctx = RequestContext.new(APP)
    org = await queue.managers.tenancy.create_org(rctx, "process tests")
    return await queue.managers.tenancy.service_context(
        rctx, org_id=org.id, acting_for=org.id, caused_by_request_id=None
    )


@pytest.fixture
def worker_env(pg_url: str, redis_url: str) -> dict[str, str]:
    """The child's environment: the session database, a private Redis prefix, fast timers."""
    inherited = {
        key: value for key, value in os.environ.items() if not key.startswith((PREFIX, ROOT))
    }
    return inherited | {
        f"{ROOT}DATABASE_URL": pg_url,
        f"{ROOT}REDIS_URL": redis_url,
        f"{ROOT}REDIS_PREFIX": f"worker-test-{secrets.token_hex(4)}:",
        f"{PREFIX}LEASE": str(LEASE_S),
        f"{PREFIX}SWEEP_INTERVAL": str(SWEEP_INTERVAL_S),
        f"{PREFIX}HEARTBEAT_INTERVAL": "0.2",
        f"{PREFIX}HEARTBEAT_FAILURE_LIMIT": "2",
        f"{PREFIX}POLL_INTERVAL": "0.2",
        f"{PREFIX}DRAIN_DEADLINE": "5",
        f"{PREFIX}CAPACITY": "3",
    }


@pytest.fixture
def workers(tmp_path: Path, worker_env: dict[str, str]) -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker processes (`workers(name, **env)`); every one is killed after the test."""
    started: list[WorkerProcess] = []

    def start(name: str = "worker", **env: str) -> WorkerProcess:
        worker = WorkerProcess(tmp_path, worker_env | env, name).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


async def _item(queue: RuntimeContainer, ctx: OpContext, item_id: UUID) -> WorkItem:
    return await queue.managers.work.get(ctx, item_id)


async def _enqueue(queue: RuntimeContainer, ctx: OpContext, count: int = 1) -> list[WorkItem]:
    return await queue.managers.work.enqueue_many(ctx, new_items(PROBE, ctx, count))


async def _status_is(
    queue: RuntimeContainer, ctx: OpContext, item_id: UUID, status: WorkStatus
) -> bool:
    return (await _item(queue, ctx, item_id)).status == status


async def test_sigterm_hands_every_item_in_flight_back_with_a_note(
    queue: RuntimeContainer, tenant: OpContext, workers: Callable[..., WorkerProcess]
) -> None:
    items = await _enqueue(queue, tenant, 3)
    worker = workers(WORKER_TEST_SECONDS="60")

    async def all_started() -> bool:
        return all(worker.script_lines("start", item.id) == 1 for item in items)

    await eventually(all_started, 15.0, "three items started", worker)
    worker.signal(signal.SIGTERM)
    started = time.monotonic()

    assert worker.wait(within=5 + 2) == 0, worker.tail()
    assert time.monotonic() - started < 5
    for item in items:
        back = await _item(queue, tenant, item.id)
        assert back.status == WorkStatus.AVAILABLE
        assert back.note is not None
        assert "draining" in back.note
        assert back.attempts == 0


async def test_a_handler_error_with_control_characters_is_logged_escaped_and_stored_as_itself(
    queue: RuntimeContainer, tenant: OpContext, workers: Callable[..., WorkerProcess]
) -> None:
    """Text logs (the default) never carry a raw control character or a lone surrogate; the
    row keeps the error as its own text, what PostgreSQL cannot hold (U+0000, a lone
    surrogate) escaped, never the driver's refusal of it."""
    (item,) = await _enqueue(queue, tenant)
    raised = r"bad\x00byte \ud800 \x1b[31mred\nFORGED CRITICAL a line of its own"
    worker = workers(WORKER_TEST_RAISE=raised, **{f"{ROOT}LOG_JSON": "false"})

    async def failed_once() -> bool:
        return (await _item(queue, tenant, item.id)).last_error is not None

    await eventually(failed_once, 15.0, "the attempt failed", worker)
    worker.signal(signal.SIGTERM)
    assert worker.wait(within=10) == 0, worker.tail()
    stored = (await _item(queue, tenant, item.id)).last_error or ""
    assert stored.splitlines()[0] == "ValueError: bad\\x00byte \\ud800 \x1b[31mred"
    log = worker.log.read_bytes()
    assert b"\x00" not in log
    assert b"\x1b" not in log
    assert b"error=ValueError: bad\\x00byte \\ud800 \\x1b[31mred" in log, worker.tail()
    # The traceback's lines are its own; the message's newline is written `\n` within them.
    assert b"\nFORGED" not in log, worker.tail()
    assert b"red\\nFORGED CRITICAL a line of its own" in log, worker.tail()


async def test_sigkill_leaves_the_item_claimable_within_a_lease_and_a_sweep_and_it_completes_once(
    queue: RuntimeContainer, tenant: OpContext, workers: Callable[..., WorkerProcess]
) -> None:
    (item,) = await _enqueue(queue, tenant)
    first = workers("first", WORKER_TEST_HANG_FIRST="1")

    async def started_once() -> bool:
        return first.script_lines("start", item.id) == 1

    await eventually(started_once, 15.0, "the first run started", first)
    second = workers("second", WORKER_TEST_HANG_FIRST="1")
    await eventually(lambda: _up(second), 15.0, "the second worker up", second)
    first.signal(signal.SIGKILL)
    first.wait(within=5)

    async def completed() -> bool:
        return await _status_is(queue, tenant, item.id, WorkStatus.COMPLETED)

    took = await eventually(
        completed, LEASE_S + SWEEP_INTERVAL_S + 3.0, "completion", first, second
    )
    assert took <= LEASE_S + SWEEP_INTERVAL_S + 1.0, f"claimable only after {took:.1f} s"
    done = await _item(queue, tenant, item.id)
    assert done.attempts == 2
    assert first.script_lines("done", item.id) == 1  # one script, both processes


async def test_a_handler_running_three_leases_long_completes_once(
    queue: RuntimeContainer, tenant: OpContext, workers: Callable[..., WorkerProcess]
) -> None:
    (item,) = await _enqueue(queue, tenant)
    worker = workers(WORKER_TEST_SECONDS=str(3 * LEASE_S))

    async def completed() -> bool:
        return await _status_is(queue, tenant, item.id, WorkStatus.COMPLETED)

    await eventually(completed, 3 * LEASE_S + 15.0, "completion", worker)
    done = await _item(queue, tenant, item.id)
    assert done.attempts == 1
    assert worker.script_lines("start", item.id) == 1
    assert worker.script_lines("done", item.id) == 1


@pytest.mark.parametrize("channel", ["database", "topic"])
async def test_a_running_item_cancelled_ends_cancelled_its_handler_cancelled_within_1_s(
    queue: RuntimeContainer,
    tenant: OpContext,
    workers: Callable[..., WorkerProcess],
    pg_storage: SqlStorageRoot,
    worker_env: dict[str, str],
    channel: str,
) -> None:
    """Issue 33's acceptance: a 30 s item cancelled mid-run ends `CANCELLED`, its handler
    gets `CancelledError` within 1 s (over PostgreSQL NOTIFY, and over the Redis topic), and
    the worker counts a cancel, never a fencing conflict nor a lost lease. The lease is 30 s
    (a renewal every 6 s), so only the wake-up channel can be that quick."""
    topic = channel == "topic"
    canceller = queue
    if topic:  # the operator's manager publishes on the worker's Redis
        infra = InfraSettings(
            redis_url=worker_env[f"{ROOT}REDIS_URL"],
            redis_prefix=worker_env[f"{ROOT}REDIS_PREFIX"],
        )
        canceller = ProbeContainer.for_tests(pg_storage, Infra.build(infra))
    (item,) = await _enqueue(queue, tenant)
    worker = workers(
        WORKER_TEST_SECONDS="30",
        **{
            f"{PREFIX}LEASE": "30",
            f"{PREFIX}DATABASE_WAKE_UPS": "false" if topic else "true",
        },
    )
    up = f'worker_wake_up_channel_up{{channel="{channel}"}}'
    await eventually(lambda: _metric_is(worker, up, 1.0), 30.0, "subscribed", worker)

    async def started() -> bool:
        return worker.script_lines("start", item.id) == 1

    await eventually(started, 15.0, "the run started", worker)
    try:
        asked = time.time()
        await canceller.managers.work.cancel_item(tenant, item.id, operator="process test")
        await canceller.managers.work.publish_owed_wake_ups()
    finally:
        if topic:  # the test's own Redis client (the container closes only what it built)
            await canceller.infra.aclose()

    async def cancelled() -> bool:
        return worker.script_lines("start", item.id) == 1 and _cancelled_at(worker, item.id) > 0

    await eventually(cancelled, 5.0, "the handler cancelled", worker)
    assert _cancelled_at(worker, item.id) - asked < 1.0, worker.tail()
    cancels = f'worker_items_cancelled_total{{kind="{PROBE_KIND.value}"}}'
    assert await _metric_is(worker, cancels, 1.0), await _metrics(worker)
    metrics = await _metrics(worker)
    assert "worker_leases_lost_total{" not in metrics, metrics
    assert not [
        line
        for line in metrics.splitlines()
        if line.startswith("work_fencing_conflicts_total{") and not line.endswith(" 0.0")
    ]
    row = await _item(queue, tenant, item.id)
    assert (row.status, row.completed_at) == (WorkStatus.CANCELLED, None)
    assert worker.script_lines("done", item.id) == 0
    worker.signal(signal.SIGTERM)
    assert worker.wait(within=10) == 0, worker.tail()
    assert (await _item(queue, tenant, item.id)).status is WorkStatus.CANCELLED


def _cancelled_at(worker: WorkerProcess, item_id: UUID) -> float:
    """When the handler of `item_id` was cancelled (`time.time()`), 0.0 if it was not."""
    text = worker.script.read_text() if worker.script.exists() else ""
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "cancelled" and rest.startswith(str(item_id)):
            return float(rest.split()[1])
    return 0.0


async def _metrics(worker: WorkerProcess) -> str:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"http://127.0.0.1:{worker.port}/metrics", timeout=1.0)
    return response.text


async def test_a_terminated_database_backend_is_survived(
    queue: RuntimeContainer,
    tenant: OpContext,
    workers: Callable[..., WorkerProcess],
    pg_url: str,
) -> None:
    (item,) = await _enqueue(queue, tenant)
    worker = workers(WORKER_TEST_SECONDS="1.0")

    async def started() -> bool:
        return worker.script_lines("start", item.id) == 1

    await eventually(started, 15.0, "the run started", worker)
    assert await _terminate_backends(pg_url) > 0

    async def completed() -> bool:
        return await _status_is(queue, tenant, item.id, WorkStatus.COMPLETED)

    await eventually(completed, 10.0, "completion after the backends died", worker)
    (later,) = await _enqueue(queue, tenant)

    async def later_completed() -> bool:
        return await _status_is(queue, tenant, later.id, WorkStatus.COMPLETED)

    await eventually(later_completed, 10.0, "a later item completed", worker)
    assert worker.proc is not None
    assert worker.proc.poll() is None


async def test_a_database_that_never_answers_costs_few_lines_then_exit_1_naming_the_limit(
    workers: Callable[..., WorkerProcess], pg_url: str
) -> None:
    """A refused connection, from the start on: the claim and every sweep pass wait it out
    without a traceback, and past `DATABASE_OUTAGE_LIMIT` the process drains and exits 1 in
    one line naming the setting."""
    closed = make_url(pg_url).set(port=free_port()).render_as_string(hide_password=False)
    worker = workers(**{f"{ROOT}DATABASE_URL": closed, f"{PREFIX}DATABASE_OUTAGE_LIMIT": "5"})
    assert await asyncio.to_thread(worker.wait, 40) == 1, worker.tail()
    lines = worker.log.read_text().splitlines()
    assert lines[-1].startswith("worker-probe: the database was unavailable for "), lines[-1]
    assert f"past {PREFIX}DATABASE_OUTAGE_LIMIT (5 s); last error: " in lines[-1]
    assert not [line for line in lines if line.startswith("Traceback")], worker.tail()
    # Five sweep passes and 25 polls: a few lines a pass, none per poll.
    assert len(lines) <= 30, worker.tail()


async def test_a_database_that_accepts_and_never_answers_is_an_outage_bounded_alike(
    workers: Callable[..., WorkerProcess], pg_url: str
) -> None:
    """A database that takes the connection and never answers (a hung server, the URL
    pointed at another service): `/healthz` stops saying ok while the claim hangs, and the
    process exits 1 naming `DATABASE_OUTAGE_LIMIT` about the limit after its start (the
    start's check and the claims are bounded by what is left of it), not after the
    driver's own timeouts."""
    held: list[asyncio.StreamWriter] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # the connection stays open and nothing is ever answered

    server = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        url = make_url(pg_url).set(port=port).render_as_string(hide_password=False)
        worker = workers(**{f"{ROOT}DATABASE_URL": url, f"{PREFIX}DATABASE_OUTAGE_LIMIT": "12"})
        await eventually(lambda: _healthz_is(worker, 503), 20.0, "healthz 503", worker)
        assert await asyncio.to_thread(worker.wait, 30) == 1, worker.tail()
    finally:
        server.close()
        for writer in held:
            writer.close()
    lines = worker.log.read_text().splitlines()
    # From the process's first log line (its imports done) to the exit's: the limit and the
    # drain, never the driver's own timeouts (a minute and more).
    exit_line = next(line for line in lines if " ERROR " in line and " past " in line)
    booted, stopped = (datetime.fromisoformat(line[:23]) for line in (lines[0], exit_line))
    assert (stopped - booted).total_seconds() < 12 + 2, worker.tail()
    assert lines[-1].startswith("worker-probe: the database was unavailable for "), lines[-1]
    assert f"past {PREFIX}DATABASE_OUTAGE_LIMIT (12 s); last error: TimeoutError: " in lines[-1]
    assert not lines[-1].endswith("TimeoutError: "), lines[-1]
    assert not [line for line in lines if line.startswith("Traceback")], worker.tail()


class _StartingPostgres(SilencingProxy):
    """A proxy in front of PostgreSQL that, while `starting`, answers every new connection
    as a server still starting up does: SQLSTATE 57P03, `CannotConnectNowError` in
    asyncpg (PostgreSQL's protocol: an SSLRequest gets `N`, the startup message a FATAL
    ErrorResponse). `refused` counts those connections."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.starting = True
        self.refused = 0

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.starting:
            await super()._accept(reader, writer)
            return
        try:
            length, code = struct.unpack("!ii", await reader.readexactly(8))
            if code == _SSL_REQUEST:
                writer.write(b"N")
                length, _ = struct.unpack("!ii", await reader.readexactly(8))
            await reader.readexactly(length - 8)
            fields = b"SFATAL\0VFATAL\0C57P03\0Mthe database system is starting up\0\0"
            writer.write(b"E" + struct.pack("!i", len(fields) + 4) + fields)
            await writer.drain()
            self.refused += 1
        except (OSError, asyncio.IncompleteReadError):
            pass
        writer.close()


_SSL_REQUEST = 80877103  # the SSLRequest code of PostgreSQL's protocol


async def test_a_database_still_starting_up_at_start_is_waited_out(
    queue: RuntimeContainer,
    tenant: OpContext,
    workers: Callable[..., WorkerProcess],
    pg_url: str,
) -> None:
    """`CannotConnectNowError` at start (a database still starting, a standby catching up)
    is waited out as a refused connection is: the worker runs on and handles the item
    once the database answers."""
    url = make_url(pg_url)
    (item,) = await _enqueue(queue, tenant)
    async with _StartingPostgres(url.port or 5432) as proxy:
        through = url.set(port=proxy.port).render_as_string(hide_password=False)
        worker = workers(**{f"{ROOT}DATABASE_URL": through})

        async def refused_some() -> bool:
            return proxy.refused >= 3

        await eventually(refused_some, 15.0, "connections refused as starting", worker)
        proxy.starting = False

        async def completed() -> bool:
            return await _status_is(queue, tenant, item.id, WorkStatus.COMPLETED)

        await eventually(completed, 20.0, "the item completed once the database answered", worker)
        assert worker.proc is not None
        assert worker.proc.poll() is None, worker.tail()
    log = worker.log.read_text()
    assert "the database does not answer yet (CannotConnectNowError" in log
    assert "the database answers again after" in log


async def test_redis_loss_pauses_claiming_and_fails_healthz_and_both_recover(
    queue: RuntimeContainer,
    tenant: OpContext,
    workers: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    port = free_port()
    with _redis_server(port, tmp_path):
        worker = workers(**{f"{ROOT}REDIS_URL": f"redis://127.0.0.1:{port}/0"})
        await eventually(lambda: _healthz_is(worker, 200), 15.0, "healthz 200", worker)
    await eventually(lambda: _healthz_is(worker, 503), 5.0, "healthz 503", worker)

    (item,) = await _enqueue(queue, tenant)
    for _ in range(10):  # two poll intervals' worth of chances to claim, five times over
        assert (await _item(queue, tenant, item.id)).status == WorkStatus.AVAILABLE
        await asyncio.sleep(0.1)

    with _redis_server(port, tmp_path):
        await eventually(lambda: _healthz_is(worker, 200), 10.0, "healthz 200 again", worker)

        async def completed() -> bool:
            return await _status_is(queue, tenant, item.id, WorkStatus.COMPLETED)

        await eventually(completed, 10.0, "completion after Redis came back", worker)


async def test_wake_ups_survive_a_pubsub_kill_and_a_redis_restart_within_a_second_or_so(
    pg_storage: SqlStorageRoot,
    tenant: OpContext,
    workers: Callable[..., WorkerProcess],
    tmp_path: Path,
) -> None:
    """The issue's setting (a long poll, Redis wake-ups): after `CLIENT KILL TYPE pubsub`
    and after a restart, the next item is picked up through a wake-up, not the poll."""
    poll, pickup = 30.0, 3.0  # a pickup by the poll would take 30 s
    with RedisServer(tmp_path) as redis_server:
        prefix = f"worker-test-{secrets.token_hex(4)}:"
        worker = workers(
            **{
                f"{ROOT}REDIS_URL": redis_server.url,
                f"{ROOT}REDIS_PREFIX": prefix,
                f"{PREFIX}POLL_INTERVAL": str(poll),
                f"{PREFIX}LEASE": str(2 * poll),
                f"{PREFIX}HEARTBEAT_INTERVAL": "0.5",
                f"{PREFIX}HEARTBEAT_FAILURE_LIMIT": "10",
                f"{PREFIX}DATABASE_WAKE_UPS": "false",
            }
        )
        # The test enqueues as a producer does: through a manager that publishes on Redis.
        producer = ProbeContainer.for_tests(
            pg_storage, Infra.build(InfraSettings(redis_url=redis_server.url, redis_prefix=prefix))
        )
        try:
            await eventually(lambda: _metric_is(worker, _UP, 1.0), 30.0, "subscribed", worker)

            async def picked_up(what: str) -> float:
                (item,) = await producer.managers.work.enqueue_many(
                    tenant, new_items(PROBE, tenant)
                )

                async def started() -> bool:
                    return worker.script_lines("start", item.id) == 1

                return await eventually(started, pickup, what, worker)

            await picked_up("before the faults")
            admin = Redis.from_url(redis_server.url)
            try:
                assert await admin.client_kill_filter(_type="pubsub") == 1
            finally:
                await admin.aclose()
            await eventually(lambda: _metric_is(worker, _RESUBSCRIBED, 1.0), 5.0, "back", worker)
            await picked_up("after CLIENT KILL TYPE pubsub")

            redis_server.restart()
            await eventually(lambda: _metric_is(worker, _RESUBSCRIBED, 2.0), 5.0, "back", worker)
            await picked_up("after a Redis restart")
            assert worker.log.read_text().count("wake-ups (topic) lost") == 2  # one a fault
        finally:
            await producer.infra.aclose()


_UP = 'worker_wake_up_channel_up{channel="topic"}'
_RESUBSCRIBED = 'worker_wake_up_resubscriptions_total{channel="topic"}'


async def _metric_is(worker: WorkerProcess, series: str, value: float) -> bool:
    """Whether the worker's `/metrics` shows `series` at `value`."""
    async with httpx.AsyncClient() as client:
        try:
            response = await client.get(f"http://127.0.0.1:{worker.port}/metrics", timeout=1.0)
        except httpx.TransportError:
            return False
    return f"{series} {value}" in response.text


async def _up(worker: WorkerProcess) -> bool:
    return await worker.healthz() == 200


async def _healthz_is(worker: WorkerProcess, status: int) -> bool:
    return await worker.healthz() == status


async def _terminate_backends(pg_url: str) -> int:
    """`pg_terminate_backend` every other connection to the test database; how many."""
    url = make_url(pg_url)
    admin = make_url(ADMIN_URL).set(drivername="postgresql")
    connection = await asyncpg.connect(admin.render_as_string(hide_password=False))
    try:
        rows: list[Any] = await connection.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = $1 AND pid <> pg_backend_pid()",
            url.database,
        )
    finally:
        await connection.close()
    return len(rows)


@contextmanager
def _redis_server(port: int, tmp: Path) -> Iterator[None]:
    """A `redis-server` of the test's own on `port`, stopped when the block ends."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not on PATH (apt-get install redis-server)"
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=tmp,
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 5
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=5)


async def test_a_paused_lane_with_two_workers_claims_nothing_for_10_s_then_drains_after_resume(
    queue: RuntimeContainer, tenant: OpContext, workers: Callable[..., WorkerProcess]
) -> None:
    """Issue 33's acceptance: the pause is in the claim statement, so neither worker claims
    on the lane, whatever wake-up each enqueue sends it; `/healthz` stays 200 and `/metrics`
    shows the pause; after the resume both drain what was enqueued meanwhile."""
    lane = f"paused_{secrets.token_hex(4)}"
    rctx = RequestContext.new(APP)
    work = queue.managers.work
    await work.pause_lane(rctx, lane, actor="process test", also_known=[lane])
    pair = [workers(name, **{f"{PREFIX}LANE": lane}) for name in ("first", "second")]
    for worker in pair:
        await eventually(partial(_up, worker), 30.0, "the worker up", worker)

    async def enqueue(count: int) -> list[WorkItem]:
        fresh = [
            WorkItem.new(org_id=tenant.org_id, kind=PROBE.kind, payload=sample_payload(), lane=lane)
            for _ in range(count)
        ]
        return await work.enqueue_many(tenant, fresh)

    enqueued: list[WorkItem] = []
    started = time.monotonic()
    while time.monotonic() - started < 10.0:  # enqueues go on; nothing is claimed
        enqueued += await enqueue(3)
        await asyncio.sleep(0.5)
        held = await work.list_items(tenant, status=WorkStatus.CLAIMED)
        done = await work.list_items(tenant, status=WorkStatus.COMPLETED)
        assert (len(held), len(done)) == (0, 0), [w.tail() for w in pair]
        for worker in pair:
            assert await worker.healthz() == 200, worker.tail()
    assert not pair[0].script.exists(), pair[0].script.read_text()
    series = f'work_lane_paused{{lane="{lane}"}}'
    for worker in pair:
        await eventually(partial(_metric_is, worker, series, 1.0), 5.0, "the gauge", worker)

    await work.resume_lane(rctx, lane, actor="process test")

    async def drained() -> bool:
        done = await work.list_items(tenant, status=WorkStatus.COMPLETED, limit=500)
        return len(done) == len(enqueued)

    await eventually(drained, 20.0, f"{len(enqueued)} items drained", *pair)
    assert all(pair[0].script_lines("done", item.id) == 1 for item in enqueued)


SECOND_KIND = next((kind for kind in WorkKind if kind != PROBE_KIND), None)
"""A kind beside the probe's (make engine-check renders a host with two)."""


async def _enqueue_kind(
    queue: RuntimeContainer, ctx: OpContext, kind: WorkKind, count: int
) -> list[WorkItem]:
    lane = ProbeSettings().lane
    items = [
        WorkItem.new(org_id=ctx.org_id, kind=kind, payload=sample_payload(), lane=lane)
        for _ in range(count)
    ]
    return await queue.managers.work.enqueue_many(ctx, items)


def _most_at_once(script: Path, items: list[WorkItem]) -> int:
    """The most of `items` the scripted handler ran at once, read from its start/done log."""
    ids = {str(item.id) for item in items}
    running = most = 0
    for line in script.read_text().splitlines():
        word, _, item_id = line.partition(" ")
        if item_id in ids:
            running += 1 if word == "start" else -1
            most = max(most, running)
    return most


async def _all_completed(queue: RuntimeContainer, ctx: OpContext, items: list[WorkItem]) -> bool:
    stored = [await _item(queue, ctx, item.id) for item in items]
    return all(item.status == WorkStatus.COMPLETED for item in stored)


async def test_a_two_kind_worker_drains_both_kinds_each_at_its_own_capacity(
    queue: RuntimeContainer, tenant: OpContext, workers: Callable[..., WorkerProcess]
) -> None:
    assert SECOND_KIND is not None, "the host defines one kind; make engine-check renders two"
    first = await _enqueue_kind(queue, tenant, PROBE_KIND, 12)
    second = await _enqueue_kind(queue, tenant, SECOND_KIND, 12)
    worker = workers(
        "two-kinds",
        WORKER_TEST_SECONDS="0.3",
        WORKER_TEST_KINDS=f"{PROBE_KIND},{SECOND_KIND}",
        **{
            f"{PREFIX}CAPACITY": "6",
            f"{PREFIX}KIND_CAPACITY__{PROBE_KIND}": "2",
            f"{PREFIX}KIND_CAPACITY__{SECOND_KIND}": "3",
        },
    )

    await eventually(
        lambda: _all_completed(queue, tenant, first + second), 30, "both kinds drained", worker
    )
    # Each kind ran at its own capacity, never above it: 2 and 3 of the process's 6 slots.
    assert _most_at_once(worker.script, first) == 2
    assert _most_at_once(worker.script, second) == 3
    assert _most_at_once(worker.script, first + second) == 5
    assert all(worker.script_lines("done", item.id) == 1 for item in first + second)


async def test_serve_with_one_kind_claims_only_that_kind(
    queue: RuntimeContainer, tenant: OpContext, workers: Callable[..., WorkerProcess]
) -> None:
    assert SECOND_KIND is not None, "the host defines one kind; make engine-check renders two"
    first = await _enqueue_kind(queue, tenant, PROBE_KIND, 3)
    second = await _enqueue_kind(queue, tenant, SECOND_KIND, 3)
    worker = workers(
        "one-kind",
        WORKER_TEST_KINDS=f"{PROBE_KIND},{SECOND_KIND}",
        WORKER_TEST_SERVE_KINDS=str(SECOND_KIND),
    )

    await eventually(lambda: _all_completed(queue, tenant, second), 20, "its kind drained", worker)
    await asyncio.sleep(5 * float(worker.env[f"{PREFIX}POLL_INTERVAL"]))  # polls that claim
    for item in first:
        stored = await _item(queue, tenant, item.id)
        assert (stored.status, stored.attempts) == (WorkStatus.AVAILABLE, 0)
        assert worker.script_lines("start", item.id) == 0
    assert f"serving {SECOND_KIND} on lane" in worker.tail()
    assert "; schedules: none; /metrics" in worker.tail()
