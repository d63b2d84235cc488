"""The worker process's serving side: `serve` and the metrics and health port.

`serve` builds the worker's container, runs its loop, and serves `/metrics` and
`/healthz` alone on the metrics port. SIGTERM and SIGINT drain the loop (stop claiming,
hand every item back with a note, mark the worker offline; see `WorkerLoop._drain`) and
`serve` returns. The console command (`cli.py`) boots the process first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import Generator, Iterable, Sequence

import uvicorn
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from acme.om.storage.roles import DatabaseRole
from acme.om.work.types.work_item import WorkKind
from acme.workers.runtime.audit import GroupCommitAudit
from acme.workers.runtime.commands import Refused
from acme.workers.runtime.container import (
    HostContractError,
    RuntimeContainer,
    as_audit_manager,
    parked_record_resumers,
)
from acme.workers.runtime.errors import one_line, transient_database_error
from acme.workers.runtime.settings import INFRA_PREFIX, RuntimeSettings, embedded_database_file
from acme.workers.runtime.state import LoopState
from acme.workers.runtime.worker import Worker

logger = logging.getLogger(__name__)


def create_app(state: LoopState, registry: CollectorRegistry, title: str = "worker") -> FastAPI:
    """The metrics port's app: `/metrics` (Prometheus text) and `/healthz` only.

    `/healthz` reads the loop's state and does no I/O of its own (The Network Layer, The
    Gateway): 200 while the heartbeat holds and claims succeed, 503 with the reason in
    its body once the beats failed their limit or every claim has failed for
    `claim_failure_limit_s` seconds (`LoopState.unhealthy_reason`). Every
    other path is 404 (no docs, no schema, no redirect from `/metrics/`), and every other
    method on these two is 405.
    """
    app = FastAPI(
        title=title,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,
    )

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        reason = state.unhealthy_reason
        body = {
            "status": "ok" if reason is None else "unhealthy",
            "reason": reason,
            "heartbeat_failures": state.heartbeat_failures,
            "claim_failures": state.claim_failures,
            "claims_failing_s": round(state.claims_failing_s(), 3),
            "claiming": not (state.claiming_paused or state.draining),
            "draining": state.draining,
            "in_flight": state.in_flight,
            "wake_ups": "up" if state.wake_ups_up else "down",
        }
        return JSONResponse(body, status_code=200 if reason is None else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


class _MetricsServer(uvicorn.Server):
    """uvicorn without signal handling of its own: the worker's stop handlers own SIGTERM
    and SIGINT, so a signal drains the loop first and the server stops after it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class MetricsPortUnavailable(OSError):
    """The metrics port cannot be bound; the message names the address and the setting."""


def _bind(host: str, port: int, env_prefix: str) -> socket.socket:
    """Bind the metrics port before anything starts, so a taken port fails the start.

    Raises `MetricsPortUnavailable` (an `OSError`) naming the address and the setting
    (`<env_prefix>METRICS_PORT`, `<env_prefix>METRICS_HOST`).
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if isinstance(exc, socket.gaierror):
            change = f"set {env_prefix}METRICS_HOST to an address of this machine"
        else:
            change = f"set {env_prefix}METRICS_PORT to a free port"
        raise MetricsPortUnavailable(
            f"cannot serve /metrics on {host}:{port} ({exc.strerror or exc}); {change}"
        ) from exc
    return sock


async def serve(
    worker: Worker,
    settings: RuntimeSettings,
    container: RuntimeContainer | None = None,
    *,
    kinds: Sequence[str] = (),
) -> None:
    """Run `worker` until SIGTERM or SIGINT, then drain and return.

    `container` defaults to `worker.container.build(settings)`; it is closed on return.
    `kinds` names the kinds to claim (`serve --kind`; none: every kind it handles).
    Raises `Refused` naming the kinds it handles when `kinds` or `kind_capacity` names
    another, before anything opens;
    Raises `MetricsPortUnavailable` when the metrics port cannot be bound,
    `HostContractError` when a host manager's `resume_parked`, or the outbox relay's
    `outbox_stats`, has a shape the sweep cannot call, `NotMigrated` when the database
    answers without the queue's table (nothing has started then), and `DatabaseOutage`
    once the loop stopped itself after `database_outage_limit` seconds without the
    database (it drained first).
    """
    container = container or worker.container.build(settings)
    try:
        claimed = serving_kinds(container.handlers, kinds, settings)
    except Refused:
        await container.aclose()
        raise
    sock = _bind(settings.metrics_host, settings.metrics_port, settings.env_prefix())
    try:
        down_since = await _refuse_unmigrated(container)
        loop = worker.loop(container, settings, registry=REGISTRY, kinds=claimed)
        loop.state.database_down_since = down_since  # the outage counts from the start
    except (HostContractError, NotMigrated):
        sock.close()
        await container.aclose()
        raise
    config = uvicorn.Config(
        create_app(loop.state, REGISTRY, title=worker.name),
        log_config=None,
        access_log=False,
        lifespan="off",
    )
    server = _MetricsServer(config)
    running = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        running.add_signal_handler(signum, loop.stop)
    server_task = asyncio.create_task(server.serve(sockets=[sock]), name="metrics-server")
    await _warn_unanswered_redis(settings, container)
    parked = parked_record_resumers(container.managers)
    logger.info(
        "serving %s on lane %r, capacity %d%s; storage %s; cache and topics %s; wake-ups: %s; "
        "the sweep resumes parked records of: %s; the handlers' audit entries: %s; "
        "schedules: %s; /metrics and /healthz on http://%s:%d",
        ", ".join(str(kind) for kind in claimed),
        settings.lane,
        settings.capacity,
        "".join(
            f", {kind} at most {settings.kind_capacity[str(kind)]}"
            for kind in claimed
            if str(kind) in settings.kind_capacity
        ),
        _describe(settings.infra.database_url, f"SQLite {embedded_database_file()} (embedded)"),
        _describe(settings.infra.redis_url, "in memory (embedded, no Redis URL)"),
        _wake_ups(settings, container),
        ", ".join(parked) or "none (no manager has resume_parked)",
        "in batches (append_many)"
        if isinstance(as_audit_manager(container.managers.audit), GroupCommitAudit)
        else "one session each (the audit manager has no append_many)",
        ", ".join(schedule.key(worker.name) for schedule in worker.schedules) or "none",
        settings.metrics_host,
        settings.metrics_port,
    )
    try:
        await loop.run()
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await server_task
        sock.close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            running.remove_signal_handler(signum)
        await container.aclose()
    if loop.outage is not None:
        raise DatabaseOutage(loop.outage)


def serving_kinds(
    handled: Iterable[WorkKind], named: Sequence[str], settings: RuntimeSettings
) -> list[WorkKind]:
    """The kinds `serve` claims: those `named` (`--kind`), else every kind `handled`.

    Raises `Refused` in one line naming the kinds handled when `named` or the settings'
    `kind_capacity` names a kind not handled (`RuntimeSettings.kinds_problem`); a capacity
    of a kind handled but not named stays unused, so one `.env` serves every subset.
    """
    handled = list(handled)
    by_name = {str(kind): kind for kind in handled}
    unknown = [name for name in named if name.upper() not in by_name]
    if unknown:
        raise Refused(
            f"--kind {unknown[0]}: this worker handles {', '.join(by_name)}; name one of them"
        )
    claimed = [by_name[name.upper()] for name in dict.fromkeys(named)] or handled
    problem = settings.kinds_problem(list(by_name))
    if problem is not None:
        raise Refused(f"invalid settings: {problem}")
    return claimed


class DatabaseOutage(Exception):
    """The database stayed unreachable past `database_outage_limit`; the message names the
    setting. The process exits 1, so its supervisor restarts it or raises the alarm."""


class NotMigrated(Exception):
    """The database answers but has no `work_items` table: the host's migrations have not
    run on it. Refused at start, where every claim would otherwise fail with the same
    error; a database that does not answer is not refused (the loop waits for it)."""


async def _refuse_unmigrated(container: RuntimeContainer) -> float | None:
    """Raise `NotMigrated` when the PostgreSQL database answers within
    `_MIGRATED_CHECK_S` and has no `work_items` table. The embedded SQLite database
    creates its tables at start; a database that does not answer in time, or answers that
    it cannot serve yet (starting up, shutting down: `transient_database_error`), is left
    to the loop, which waits for it and reports it on `/healthz`. Returns the
    `time.monotonic()` at which the check began when it met a transient database error
    (the outage's start), else None."""
    funnel = container.funnel
    if funnel is None or funnel.dialect != "postgresql":
        return None
    began = time.monotonic()
    try:
        async with asyncio.timeout(_MIGRATED_CHECK_S):
            async with funnel.engine(DatabaseRole.QUEUE).connect() as conn:
                found = await conn.scalar(text("SELECT to_regclass('work_items')"))
    except Exception as exc:
        if not isinstance(exc, OSError | SQLAlchemyError) and not transient_database_error(exc):
            raise
        logger.warning(
            "the database does not answer yet (%s): the loop waits for it (check %sDATABASE_URL)",
            one_line(exc),
            INFRA_PREFIX,
        )
        return began if transient_database_error(exc) else None
    if found is None:
        raise NotMigrated(
            "the database has not been migrated: it has no work_items table "
            "(run the host's migrations, `make migrate`, as the database's owner)"
        )
    return None


# How long the start waits for the database to say whether it was migrated (s).
_MIGRATED_CHECK_S = 5.0
_REDIS_CHECK_S = 2.0  # seconds the start gives Redis to answer a ping


async def _warn_unanswered_redis(settings: RuntimeSettings, container: RuntimeContainer) -> None:
    """Log one WARNING naming the URL's setting when Redis does not answer a ping within
    `_REDIS_CHECK_S`. Never raises: the heartbeat and the wake-ups wait for Redis as they
    do in any outage, but a mistyped URL is said once, at start."""
    if not settings.infra.redis_url:
        return
    try:
        async with asyncio.timeout(_REDIS_CHECK_S):
            await container.infra.topics.ping()
    except Exception as exc:
        logger.warning(
            "Redis does not answer (%s): the heartbeat and the wake-ups wait for it "
            "(check %sREDIS_URL)",
            one_line(exc),
            INFRA_PREFIX,
        )


def _wake_ups(settings: RuntimeSettings, container: RuntimeContainer) -> str:
    """What wakes the loop besides its poll: PostgreSQL NOTIFY, or Redis `WORK_AVAILABLE`."""
    polled = f"a poll every {settings.poll_interval:g} s"
    if settings.database_wake_ups and container.managers.work.wake_ups() is not None:
        return f"PostgreSQL NOTIFY, else {polled}"
    if settings.infra.redis_url:
        return f"Redis WORK_AVAILABLE, else {polled}"
    return f"only {polled} (in-memory topics do not cross processes)"


def _describe(url: str | None, embedded: str) -> str:
    """A URL as a log line may show it (no password), or what runs without one."""
    return make_url(url).render_as_string(hide_password=True) if url else embedded
