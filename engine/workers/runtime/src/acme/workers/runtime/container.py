"""The worker's container: settings in, managers, infrastructure and handlers out.

The same shape and order as the service containers (`services/api/container.py`):
storage, infrastructure, the managers, then what the process adds, its handlers, which
each worker names (`Handlers`: the managers in, a handler per kind out). A worker's own
`container.py` binds them: `build(settings)` for the process, `for_tests(storage, infra)`
for tests over the memory twins or a test database.

Also here: the checks of the host contract's optional parts the sweep calls (parked
records, the outbox's state), run once when `serve` starts.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from inspect import Parameter
from pathlib import Path
from typing import Self, cast

from sqlalchemy.engine import make_url

from acme.infra.container import Infra
from acme.om.audit import AuditManagerInterface
from acme.om.root import Managers, build_managers
from acme.om.schema import create_all
from acme.om.storage.funnel import StorageFunnel
from acme.om.storage.impl.sql import SqlStorageRoot
from acme.om.storage.root import StorageRootInterface
from acme.om.work.storage.impl.sqlite_upgrade import upgrade_sqlite_file
from acme.om.work.types.handler import WorkHandlerInterface
from acme.om.work.types.work_item import WorkKind
from acme.workers.runtime.audit import AuditBatchAppender, GroupCommitAudit
from acme.workers.runtime.queue_stats import OutboxStatsReader
from acme.workers.runtime.settings import RuntimeSettings, embedded_database_url
from acme.workers.runtime.state import LOOP_LOGGER
from acme.workers.runtime.sweep import ParkedRecordsResumer

logger = logging.getLogger(LOOP_LOGGER)

Handlers = Callable[[Managers], Mapping[WorkKind, WorkHandlerInterface]]
"""A worker's handlers: built from the managers, one handler per kind the worker runs."""


@dataclass(frozen=True)
class RuntimeContainer:
    """Everything the loop reaches: the managers, the infrastructure and the handlers.

    A worker subclasses it and overrides `make_handlers` (its `Handlers`) and, with kinds
    added to it, `added_handlers`; `handlers` maps each work kind the worker runs to its
    handler, and the loop claims those kinds.
    `aclose()` on shutdown releases what `build` opened.
    """

    managers: Managers
    infra: Infra
    handlers: Mapping[WorkKind, WorkHandlerInterface]
    funnel: StorageFunnel | None = None

    @staticmethod
    def make_handlers(managers: Managers) -> Mapping[WorkKind, WorkHandlerInterface]:
        """The worker's handler per kind, given the managers; each worker's container
        overrides it (`Handlers`). Raises `NotImplementedError` here."""
        raise NotImplementedError("a worker's container names its handlers (make_handlers)")

    @staticmethod
    def added_handlers(managers: Managers) -> Mapping[WorkKind, WorkHandlerInterface]:
        """The handlers of the kinds added to the worker (`make add-kind`, its `kinds`
        package), beside `make_handlers`' own: none here. Apart from `make_handlers`, so a
        user's own handler factory carried across an update keeps them."""
        return {}

    @classmethod
    def _handlers(cls, managers: Managers) -> dict[WorkKind, WorkHandlerInterface]:
        grouped = with_group_commit(managers)
        return {**cls.make_handlers(grouped), **cls.added_handlers(grouped)}

    @classmethod
    def build(cls, settings: RuntimeSettings) -> Self:
        """Storage from `settings.infra.database_url` (without one, the host root's SQLite
        file the other local processes share, its tables created: `embedded_database_url`,
        which raises `NoHostRoot` outside any host), a pool of
        `settings.database_pool_size` connections per role (without a pre-ping when the
        host's funnel offers the choice: `pool_options`), infrastructure from
        `settings.infra` (Redis, or the in-memory twins without a URL: wake-ups across
        processes then fall back to polling), then the managers and the handlers (their
        audit entries group-committed where the host's audit manager can write a batch:
        `with_group_commit`)."""
        url = settings.infra.database_url or _local_sqlite(embedded_database_url())
        funnel = StorageFunnel.from_url(
            url, pool_size=settings.database_pool_size, **pool_options(StorageFunnel.from_url)
        )
        infra = Infra.build(settings.infra)
        managers = build_managers(SqlStorageRoot(funnel), infra)
        handlers = cls._handlers(managers)
        return cls(managers=managers, infra=infra, handlers=handlers, funnel=funnel)

    @classmethod
    def for_tests(cls, storage: StorageRootInterface, infra: Infra) -> Self:
        """A container over storage and infrastructure the test owns (and closes); the
        handlers' audit entries group-committed as in `build`."""
        managers = build_managers(storage, infra)
        handlers = cls._handlers(managers)
        return cls(managers=managers, infra=infra, handlers=handlers)

    async def aclose(self) -> None:
        """Publish the wake-ups the work manager still owes (an operator's `enqueue` is
        followed by its process's exit), then close the database pools and the Redis
        client opened by `build`."""
        try:
            await self.managers.work.publish_owed_wake_ups()
        finally:
            if self.funnel is not None:
                await self.funnel.dispose()
                await self.infra.aclose()


class HostContractError(TypeError):
    """The host offers something the worker uses in a shape it cannot call; the message
    names the symbol and the shape docs/host-contract.md asks for."""


RESUME_SHAPE = "async def resume_parked(self, ctx: OpContext, *, limit: int) -> int"


def parked_record_resumers(managers: Managers) -> dict[str, ParkedRecordsResumer]:
    """The managers in `managers` whose parked records the sweep resumes.

    The optional part of the host contract (docs/host-contract.md, Parked records): a
    manager that has a `resume_parked` method takes part; one whose method does not have
    the shape `RESUME_SHAPE` (a coroutine function taking the context and a keyword
    `limit`, and requiring nothing else) raises `HostContractError` naming it, since the
    sweep would fail on every pass. `serve` calls it once at start; the operator commands
    never do, so a host being fixed can still be inspected. Returns `{field name:
    manager}` in field order; empty for a host without parked records.
    """
    found: dict[str, ParkedRecordsResumer] = {}
    for name, manager in vars(managers).items():
        if not isinstance(manager, ParkedRecordsResumer):
            continue
        problem = _resume_shape_problem(manager.resume_parked)
        if problem:
            raise HostContractError(
                f"Managers.{name}.resume_parked {problem}; the sweep calls `{RESUME_SHAPE}`"
            )
        found[name] = manager
    return found


OUTBOX_STATS_SHAPE = (
    "async def outbox_stats(self, rctx: RequestContext, *, failing_after: int) -> <an object "
    "with pending: int, oldest_pending_age: float, failing: int, dead_lettered: int>"
)


def outbox_stats_reader(managers: Managers) -> OutboxStatsReader | None:
    """The host's outbox relay when it reports the outbox's state, else None.

    The optional part of the host contract (docs/host-contract.md, Outbox state and dead
    letters): `Managers.outbox_relay` with an `outbox_stats` method, which the sweep reads
    for the `worker_outbox_*` gauges. A method of another shape than `OUTBOX_STATS_SHAPE`
    (a coroutine function taking the request context and a keyword `failing_after`, and
    requiring nothing else) raises `HostContractError`; `serve` calls it once at start.
    """
    relay: object = managers.outbox_relay  # any host's relay, with the method or without
    if not isinstance(relay, OutboxStatsReader):
        return None
    problem = _shape_problem(relay.outbox_stats, "failing_after", "request context")
    if problem:
        raise HostContractError(
            f"Managers.outbox_relay.outbox_stats {problem}; the sweep calls `{OUTBOX_STATS_SHAPE}`"
        )
    return relay


APPEND_MANY_SHAPE = (
    "async def append_many(self, calls: Sequence[tuple[OpContext, Mapping[str, Any]]]) "
    "-> list[AuditEntry]"
)


def append_many_problem(audit: object) -> str:
    """What keeps `audit.append_many` from being called as `await append_many(calls)`; ""
    when nothing does, or when `audit` has none (the part is optional)."""
    method = getattr(audit, "append_many", None)
    if method is None:
        return ""
    if not callable(method):
        return "is not a coroutine function (async def)"
    return _shape_problem(method, None, "calls")


def check_audit_batches(managers: Managers) -> None:
    """Raise `HostContractError` when `Managers.audit` has an `append_many` the handlers'
    group commit cannot call (docs/host-contract.md, "Batched audit appends"); a manager
    without one meets the contract, and its entries are written one session each. `serve`
    calls it once at start (`Worker.loop`); until the host is fixed, the handlers append
    one entry at a time.
    """
    problem = append_many_problem(managers.audit)
    if problem:
        raise HostContractError(
            f"Managers.audit.append_many {problem}; the worker calls `{APPEND_MANY_SHAPE}`"
        )


def as_audit_manager(audit: AuditManagerInterface) -> AuditManagerInterface:
    """`audit` with its appends group-committed (`audit.GroupCommitAudit`) when the host's
    manager has an `append_many` of the shape `APPEND_MANY_SHAPE`; else `audit` itself (a
    manager without one, or with another shape, which `serve` refuses at start)."""
    if not isinstance(audit, AuditBatchAppender) or append_many_problem(audit):
        return audit
    return cast(AuditManagerInterface, GroupCommitAudit(audit, audit))


def with_group_commit(managers: Managers) -> Managers:
    """`managers` with `audit` replaced by `as_audit_manager(managers.audit)`: what the
    handlers are built from."""
    audit = as_audit_manager(managers.audit)
    return managers if audit is managers.audit else replace(managers, audit=audit)


def _resume_shape_problem(method: Callable[..., object]) -> str:
    """What keeps `method` from being called as `await method(ctx, limit=n)`; "" if nothing."""
    return _shape_problem(method, "limit", "context")


def _shape_problem(method: Callable[..., object], keyword: str | None, first: str) -> str:
    """What keeps `method` from being called as `await method(<first>, <keyword>=n)` (or
    `await method(<first>)` when `keyword` is None); "" if nothing. `first` names the
    positional argument in the message."""
    if not inspect.iscoroutinefunction(inspect.unwrap(method)):
        return "is not a coroutine function (async def)"
    parameters = [
        p
        for p in inspect.signature(method).parameters.values()
        if p.kind not in (Parameter.VAR_POSITIONAL, Parameter.VAR_KEYWORD)
    ]
    by_position = (Parameter.POSITIONAL_ONLY, Parameter.POSITIONAL_OR_KEYWORD)
    if not parameters or parameters[0].kind not in by_position or parameters[0].name == keyword:
        return f"takes no positional parameter for the {first}"
    by_keyword = (Parameter.POSITIONAL_OR_KEYWORD, Parameter.KEYWORD_ONLY)
    if keyword is not None and not any(
        p.name == keyword and p.kind in by_keyword for p in parameters
    ):
        return f"takes no keyword parameter `{keyword}`"
    required = [
        p.name for p in parameters[1:] if p.name != keyword and p.default is Parameter.empty
    ]
    if required:
        also = f"the {first} and `{keyword}`" if keyword is not None else f"the {first}"
        return f"also requires {', '.join(required)}, beside {also}"
    return ""


def pool_options(from_url: Callable[..., object]) -> dict[str, bool]:
    """`{"pre_ping": False}` when the host's `StorageFunnel.from_url` takes the keyword
    `pre_ping` (the optional part of docs/host-contract.md, "Storage funnel"), else `{}`.

    A pool's pre-ping costs three round trips on every checkout with asyncpg (`BEGIN`, an
    empty statement, `ROLLBACK`): more than the statement a queue session exists for. The
    queue's storage opens a session once more when its pooled connection turned out dead,
    so the worker needs no ping; a host's other storage meets such a connection at most
    once per pool after an outage (SQLAlchemy then replaces every connection older than
    it), as one failed call the loop already handles.
    """
    parameter = inspect.signature(from_url).parameters.get("pre_ping")
    return {"pre_ping": False} if parameter is not None else {}


def _local_sqlite(url: str) -> str:
    """`url` after its file's work tables are brought to this release's
    (`upgrade_sqlite_file`, which raises `SqliteFileOutdated`) and its missing tables made."""
    database = make_url(url).database
    if database:
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    if rebuilt := upgrade_sqlite_file(url):
        logger.info("upgraded %s in %s to this release's definition", ", ".join(rebuilt), database)
    create_all(url)
    return url
