"""The wake-up channel against a real Redis and PostgreSQL the tests break on purpose.

Each test runs the loop with a poll interval of 30 s, so an item found by the poll alone
would take 30 s: every pickup asserted here within `PICKUP` seconds came through a wake-up
(or the one-second poll while the channel is down). Redis is a `redis-server` of the
test's own (`RedisServer`), killed, restarted or cut off with `CLIENT KILL TYPE pubsub`;
a half-open connection is a `SilencingProxy` that stops forwarding on the subscription's
connection and leaves its socket open. The shared Redis is never touched.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis
from sqlalchemy.engine import make_url
from work_network import RedisServer, SilencingProxy

from acme.infra.container import Infra
from acme.infra.settings import InfraSettings
from acme.om.context import OpContext, RequestContext
from acme.om.storage.funnel import StorageFunnel
from acme.om.storage.impl.memory import MemoryStorageRoot
from acme.om.storage.impl.sql import SqlStorageRoot
from acme.om.work.types.work_item import WorkItem, WorkStatus
from acme.workers.runtime.container import RuntimeContainer
from acme.workers.runtime.loop import WorkerLoop
from acme.workers.runtime.testing import (
    APP,
    PROBE,
    PROBE_KIND,
    GateHandler,
    LoopFactory,
    ProbeContainer,
    make_settings,
    new_items,
    running,
    sample,
)

pytestmark = pytest.mark.integration

POLL = 30.0
"""The loop's poll interval (s): far longer than any pickup a test accepts."""
PICKUP = 3.0
"""The longest a pickup may take here (s): the target is 1 s; the rest is headroom for a
loaded machine, and still a tenth of the poll interval."""
LOOP_LOGGER = "acme.workers.runtime.loop"


def _settings(**overrides: Any) -> Any:
    """Slow polls; a heartbeat that rides out a Redis restart (10 beats of 0.5 s)."""
    return make_settings(
        PROBE,
        poll_interval=POLL,
        lease=2 * POLL,
        heartbeat_interval=0.5,
        heartbeat_failure_limit=10,
        **overrides,
    )


async def _until(check: Callable[[], bool], within: float, what: str) -> float:
    """Poll `check` every 20 ms until it holds; the seconds it took. Fails after `within`."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < within, f"{what} not within {within} s"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def _up(loop: WorkerLoop, channel: str) -> float:
    return sample(loop.metrics, "worker_wake_up_channel_up", channel=channel)


def _resubscribed(loop: WorkerLoop, channel: str) -> float:
    return sample(loop.metrics, "worker_wake_up_resubscriptions_total", channel=channel)


async def _picked_up(
    enqueue: Callable[[], Awaitable[object]], handler: GateHandler, what: str
) -> float:
    """Enqueue one item; the seconds until its handler starts (at most `PICKUP`).

    The count to reach is read before the enqueue: the worker shares this event loop and
    may start the handler before `enqueue()` returns."""
    target = handler.started.count + 1
    started = time.monotonic()
    await enqueue()
    try:
        await handler.started.reach(target, within=PICKUP)
    except TimeoutError:
        pytest.fail(f"{what}: not picked up within {PICKUP} s (the poll is {POLL} s)")
    return time.monotonic() - started


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(1 for r in caplog.records if r.name == LOOP_LOGGER and text in r.getMessage())


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A `redis-server` of this test's own, killed after it."""
    with RedisServer(tmp_path) as server:
        yield server


async def _infra(url: str, prefix: str) -> Infra:
    return Infra.build(InfraSettings(redis_url=url, redis_prefix=prefix))


@pytest.fixture
async def redis_world(
    redis_server: RedisServer,
) -> AsyncIterator[tuple[RuntimeContainer, RuntimeContainer, OpContext]]:
    """`(worker, enqueuer, tenant)`: one memory queue, the worker's and the enqueuer's
    own Redis clients on the test's server, under one channel prefix."""
    prefix = f"wake-test-{secrets.token_hex(4)}:"
    storage = MemoryStorageRoot()
    worker = ProbeContainer.for_tests(storage, await _infra(redis_server.url, prefix))
    enqueuer = ProbeContainer.for_tests(storage, await _infra(redis_server.url, prefix))
    rctx = RequestContext.new(APP)
    org = await enqueuer.managers.tenancy.create_org(rctx, "wake-ups")
    tenant = await enqueuer.managers.tenancy.service_context(
        rctx, org_id=org.id, acting_for=org.id, caused_by_request_id=None
    )
    yield worker, enqueuer, tenant
    await worker.infra.aclose()
    await enqueuer.infra.aclose()


def _loop(make_loop: LoopFactory, worker: RuntimeContainer, handler: GateHandler) -> WorkerLoop:
    return make_loop(
        settings=_settings(),
        work=worker.managers.work,
        cache=worker.infra.cache,
        topics=worker.infra.topics,
        handlers={PROBE_KIND: handler},
    )


def _enqueuer(container: RuntimeContainer, tenant: OpContext) -> Callable[[], Awaitable[object]]:
    async def enqueue() -> object:
        return await container.managers.work.enqueue_many(tenant, new_items(PROBE, tenant, 1))

    return enqueue


def _open_gate() -> GateHandler:
    handler = GateHandler()
    handler.gate.set()
    return handler


async def test_a_killed_pubsub_connection_is_resubscribed_and_wakes_the_next_enqueue(
    redis_world: tuple[RuntimeContainer, RuntimeContainer, OpContext],
    redis_server: RedisServer,
    make_loop: LoopFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker, enqueuer, tenant = redis_world
    handler = _open_gate()
    loop = _loop(make_loop, worker, handler)
    enqueue = _enqueuer(enqueuer, tenant)
    admin = Redis.from_url(redis_server.url)
    caplog.set_level(logging.INFO, logger=LOOP_LOGGER)
    try:
        async with running(loop):
            await _until(lambda: _up(loop, "topic") == 1, 5.0, "the first subscription")
            await _picked_up(enqueue, handler, "before the kill")

            assert await admin.client_kill_filter(_type="pubsub") >= 1
            await _until(lambda: _resubscribed(loop, "topic") == 1, 5.0, "a resubscription")
            assert _up(loop, "topic") == 1
            await _picked_up(enqueue, handler, "after the kill")

            # Killed again and an item enqueued at once, before the loop is back: the
            # resubscription wakes the loop for whatever was sent while it was away.
            await admin.client_kill_filter(_type="pubsub")
            await _picked_up(enqueue, handler, "enqueued while resubscribing")
            await _until(lambda: _resubscribed(loop, "topic") == 2, 5.0, "back again")
    finally:
        await admin.aclose()

    assert _lines(caplog, "wake-ups (topic) lost") == 2
    assert _lines(caplog, "wake-ups (topic) back") == 2


async def test_a_redis_restart_loses_no_wake_up_and_each_outage_is_logged_once(
    redis_world: tuple[RuntimeContainer, RuntimeContainer, OpContext],
    redis_server: RedisServer,
    make_loop: LoopFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker, enqueuer, tenant = redis_world
    handler = _open_gate()
    loop = _loop(make_loop, worker, handler)
    enqueue = _enqueuer(enqueuer, tenant)
    caplog.set_level(logging.DEBUG)
    async with running(loop):
        await _until(lambda: _up(loop, "topic") == 1, 5.0, "the first subscription")
        await _picked_up(enqueue, handler, "before the restart")

        redis_server.restart()
        await _until(lambda: _resubscribed(loop, "topic") == 1, 5.0, "a resubscription")
        # The enqueuer's pooled connection died with the server and this is its first
        # use since: the publisher retries on a fresh one, so the wake-up is not lost.
        await _picked_up(enqueue, handler, "after the restart")
        assert "WORK_AVAILABLE not published" not in caplog.text

        redis_server.stop()
        await _until(lambda: _up(loop, "topic") == 0, 5.0, "the loss seen")
        # While Redis is down nothing is published, and the loop claims every second.
        await _picked_up(enqueue, handler, "while Redis is down")
        await asyncio.sleep(1.5)  # tries after 0.1, 0.2, 0.4, 0.8 s ... all refused
        assert _lines(caplog, "wake-ups (topic) still unavailable") >= 2

        redis_server.start()
        await _until(lambda: _resubscribed(loop, "topic") == 2, 5.0, "a resubscription")
        await _picked_up(enqueue, handler, "after Redis came back")

    assert _lines(caplog, "wake-ups (topic) lost") == 2  # one per outage, not per try
    assert _lines(caplog, "wake-ups (topic) back after") == 2


async def test_a_silent_pubsub_connection_is_found_and_replaced(
    redis_server: RedisServer, make_loop: LoopFactory
) -> None:
    prefix = f"wake-test-{secrets.token_hex(4)}:"
    storage = MemoryStorageRoot()
    enqueuer = ProbeContainer.for_tests(storage, await _infra(redis_server.url, prefix))
    tenant = await _tenant(enqueuer)
    handler = _open_gate()
    async with SilencingProxy(redis_server.port) as proxy:
        # The worker's own Redis client goes through the proxy.
        through = await _infra(f"redis://127.0.0.1:{proxy.port}/0", prefix)
        loop = _loop(make_loop, ProbeContainer.for_tests(storage, through), handler)
        try:
            async with running(loop):
                await _until(lambda: _up(loop, "topic") == 1, 5.0, "the first subscription")
                assert proxy.silence(b"SUBSCRIBE") == 1
                took = await _until(
                    lambda: _resubscribed(loop, "topic") == 1, 15.0, "the silence found"
                )
                assert took < 10.0  # a ping after 2 s of silence, answered within 2 s
                await _picked_up(_enqueuer(enqueuer, tenant), handler, "after the silence")
        finally:
            await through.aclose()
            await enqueuer.infra.aclose()


# -- PostgreSQL LISTEN ---------------------------------------------------------------------


def _pg_loop(
    make_loop: LoopFactory, storage: SqlStorageRoot, handler: GateHandler
) -> tuple[WorkerLoop, RuntimeContainer]:
    worker = ProbeContainer.for_tests(storage, Infra.memory())
    loop = make_loop(
        settings=_settings(database_wake_ups=True),
        work=worker.managers.work,
        cache=worker.infra.cache,
        topics=worker.infra.topics,
        outbox_relay=worker.managers.outbox_relay,
        handlers={PROBE_KIND: handler},
    )
    return loop, worker


async def _tenant(queue: RuntimeContainer) -> OpContext:
    rctx = RequestContext.new(APP)
    org = await queue.managers.tenancy.create_org(rctx, "wake-ups")
    return await queue.managers.tenancy.service_context(
        rctx, org_id=org.id, acting_for=org.id, caused_by_request_id=None
    )


async def _held_elsewhere(
    queue: RuntimeContainer, tenant: OpContext, lane: str, *, lease: float = 60.0, **update: Any
) -> tuple[OpContext, WorkItem]:
    """One item claimed by another worker: enqueued due in 0.2 s (the wake-up its enqueue
    sends finds nothing due, so the loop under test does not take it), then claimed."""
    (fresh,) = new_items(PROBE, tenant, 1, delay=0.2)
    await queue.managers.work.enqueue_many(tenant, [fresh.model_copy(update=update)])
    await asyncio.sleep(0.3)
    (pair,) = await queue.managers.work.claim_many(
        RequestContext.new(APP), lane, [PROBE_KIND], "other-worker", lease=lease, limit=1
    )
    return pair


async def test_items_an_update_hands_back_wake_a_worker_on_notify(
    pg_storage: SqlStorageRoot, make_loop: LoopFactory
) -> None:
    # A release, a replay and a requeue of stale leases make items claimable with an
    # UPDATE, which fires no insert trigger: the storage notifies in their transaction.
    handler = _open_gate()
    loop, queue = _pg_loop(make_loop, pg_storage, handler)
    tenant = await _tenant(queue)
    work = queue.managers.work
    lane = loop.settings.lane
    async with running(loop):
        await _until(lambda: _up(loop, "database") == 1, 5.0, "the first LISTEN")

        ctx, item = await _held_elsewhere(queue, tenant, lane)
        await _picked_up(lambda: work.release(ctx, item), handler, "a released item")

        ctx, item = await _held_elsewhere(queue, tenant, lane, max_attempts=1)
        assert (await work.fail(ctx, item, "boom")).status == WorkStatus.FAILED
        await _picked_up(lambda: work.replay(tenant, item.id), handler, "a replayed item")

        await _held_elsewhere(queue, tenant, lane, lease=0.05)
        await asyncio.sleep(0.1)  # its lease passes
        await _picked_up(lambda: work.requeue_stale(tenant), handler, "a requeued item")

    assert handler.started.count == 3


async def test_a_released_item_wakes_a_worker_on_the_topic(
    redis_world: tuple[RuntimeContainer, RuntimeContainer, OpContext], make_loop: LoopFactory
) -> None:
    worker, enqueuer, tenant = redis_world
    handler = _open_gate()
    loop = _loop(make_loop, worker, handler)
    async with running(loop):
        await _until(lambda: _up(loop, "topic") == 1, 5.0, "the first subscription")
        ctx, item = await _held_elsewhere(enqueuer, tenant, loop.settings.lane)
        await _picked_up(
            lambda: enqueuer.managers.work.release(ctx, item), handler, "a released item"
        )


async def test_a_terminated_listen_connection_is_resubscribed_and_wakes_the_next_enqueue(
    pg_storage: SqlStorageRoot, pg_url: str, make_loop: LoopFactory
) -> None:
    handler = _open_gate()
    loop, queue = _pg_loop(make_loop, pg_storage, handler)
    tenant = await _tenant(queue)
    enqueue = _enqueuer(queue, tenant)
    async with running(loop):
        await _until(lambda: _up(loop, "database") == 1, 5.0, "the first LISTEN")
        await _picked_up(enqueue, handler, "before the termination")

        assert await _terminate_listener(pg_url) == 1
        await _until(lambda: _resubscribed(loop, "database") == 1, 5.0, "a new LISTEN")
        await _picked_up(enqueue, handler, "after the termination")


async def test_a_silent_listen_connection_is_found_and_replaced(
    pg_storage: SqlStorageRoot, pg_url: str, make_loop: LoopFactory
) -> None:
    handler = _open_gate()
    queue = ProbeContainer.for_tests(pg_storage, Infra.memory())
    tenant = await _tenant(queue)
    enqueue = _enqueuer(queue, tenant)
    url = make_url(pg_url)
    async with SilencingProxy(url.port or 5432) as proxy:
        funnel = StorageFunnel.from_url(
            url.set(port=proxy.port).render_as_string(hide_password=False), pool_size=8
        )
        try:
            loop, _ = _pg_loop(make_loop, SqlStorageRoot(funnel), handler)
            async with running(loop):
                await _until(lambda: _up(loop, "database") == 1, 5.0, "the first LISTEN")
                assert proxy.silence(b"LISTEN") == 1
                took = await _until(
                    lambda: _resubscribed(loop, "database") == 1, 15.0, "the silence found"
                )
                assert took < 10.0  # a probe after 2 s of silence, bounded at 2 s
                await _picked_up(enqueue, handler, "after the silence")
        finally:
            await funnel.dispose()


async def _terminate_listener(pg_url: str) -> int:
    """`pg_terminate_backend` the connections of the test database that `LISTEN`."""
    url = make_url(pg_url)
    admin = await asyncpg.connect(
        url.set(drivername="postgresql", username="postgres", database="postgres").render_as_string(
            hide_password=False
        )
    )
    try:
        rows = await admin.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = $1 AND query LIKE 'LISTEN%'",
            url.database,
        )
    finally:
        await admin.close()
    return len(rows)
