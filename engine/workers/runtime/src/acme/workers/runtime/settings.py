"""The settings every worker shares: `RuntimeSettings`, one `BaseSettings` that each worker
subclasses in its own `settings.py` with its environment prefix, lane and metrics port.

Durations are `Seconds` (a float of seconds). The database and Redis URLs are not
repeated here: they come from
the host's `InfraSettings`, the same object `boot()` reads, under its own prefix:
`ACME_`.

The capacity is set against the pool this process opens and never independently of it,
since a worker that runs more items at once than its pool serves spends the difference
waiting on a checkout (the host's database roles: `acme.om.storage.roles`).
"""

from __future__ import annotations

import difflib
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, ClassVar, Self
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from acme.infra.settings import InfraSettings
from acme.om.work.rules import lane_problem

INFRA_PREFIX = "ACME_"

DATABASES = ("postgresql", "sqlite")
"""The database backends the work queue's storage runs on."""

ASYNC_DRIVERS = ("asyncpg", "aiosqlite")
"""The drivers the host's funnel opens (`postgresql://` and `sqlite://` map to them)."""

REDIS_SCHEMES = ("redis", "rediss", "unix")
_PORT_LIMIT = 65536  # TCP ports are 1 to 65535

EMBEDDED_DATABASE = Path(".local/acme.sqlite3")
"""The embedded database, when the host's database URL is unset: this file under the host
root, the one every local process uses wherever it was started, so a local enqueue reaches
this worker (`embedded_database_url`)."""


class NoHostRoot(Exception):
    """No host root at or above the working directory, so no embedded database; the
    message says what to do instead."""


def host_root_of(path: Path) -> Path | None:
    """The host root holding `path`: the nearest folder at or above it (absolute) whose
    `pyproject.toml` declares the uv workspace (`[tool.uv.workspace]`, docs/host-contract.md
    in the worker template); None outside any host. A member's own `pyproject.toml`
    (`workers/<name>/pyproject.toml`) declares none, so the walk goes past it."""
    start = path.resolve()
    for folder in (start, *start.parents):
        manifest = folder / "pyproject.toml"
        try:
            declared = tomllib.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        uv = declared.get("tool", {}).get("uv") if isinstance(declared.get("tool"), dict) else None
        if isinstance(uv, dict) and isinstance(uv.get("workspace"), dict):
            return folder
    return None


def embedded_database_file(cwd: Path | None = None) -> Path:
    """The embedded SQLite file: `EMBEDDED_DATABASE` under the host root of `cwd` (default:
    the working directory), else of the running Python environment (`sys.prefix`: the
    host's `.venv` under `uv run --project <host>` from elsewhere), absolute. Raises
    `NoHostRoot` when neither is inside a host."""
    here = Path.cwd() if cwd is None else cwd
    root = host_root_of(here) or host_root_of(Path(sys.prefix))
    if root is None:
        raise NoHostRoot(
            f"no host root at or above {here.resolve()} or the Python environment "
            f"{sys.prefix} (a folder whose pyproject.toml has [tool.uv.workspace]) to hold "
            f"the embedded database {EMBEDDED_DATABASE}: run the command inside the host, "
            f"or set {INFRA_PREFIX}DATABASE_URL"
        )
    return root / EMBEDDED_DATABASE


def embedded_database_url(cwd: Path | None = None) -> str:
    """`embedded_database_file(cwd)` as the URL the host's funnel opens
    (`sqlite+aiosqlite:////abs/path`). Raises `NoHostRoot` outside any host."""
    url = URL.create("sqlite+aiosqlite", database=str(embedded_database_file(cwd)))
    return url.render_as_string(hide_password=False)


# Connections the loop needs beside one per item in flight (the item's handler holds one,
# and on the queue role its lease renewal does): the claim and its tenancy lookup, the
# completion flush, the maintenance sweep, and on PostgreSQL the one that listens for
# wake-ups. On PostgreSQL the queue storage keeps the claim's and the completion flush's
# connections checked out between calls (its held connections, docs/decisions/0021 in the
# worker template). Each role's pool must hold its share at once; one sum covers every
# role. The heartbeat's roster write borrows a connection for one statement, bounded by the
# beat's interval, and holds none between beats: it reserves none (docs/decisions/0049).
RESERVED_CONNECTIONS = {
    "claim": 1,
    "claim's tenancy lookup": 1,
    "completion flush": 1,
    "sweep": 1,
    "wake-up listener": 1,
}

MAX_SECONDS = 10 * 365 * 24 * 3600.0
"""The longest duration a setting takes (ten years, in seconds): a longer one, or an
infinite one, would overflow the dates and intervals it is added to, and fail in the loop
long after the start instead of at it."""

Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
"""A duration or an age in seconds, above 0 and finite, at most `MAX_SECONDS` (the type
says the unit the name does not)."""

SecondsOrZero = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
"""Seconds where 0 means "never" (a retention that keeps everything); finite, at most
`MAX_SECONDS`."""

Count = Annotated[int, Field(ge=1)]
"""A number of things, at least 1 (items at once, connections, beats)."""

Port = Annotated[int, Field(ge=1, le=65535)]
"""A TCP port."""


class RuntimeSettings(BaseSettings):
    """The settings every worker shares; a worker's `WorkerSettings` subclasses it, sets
    `service_name`, its environment prefix (`model_config`), and the defaults of its own
    (its lane and metrics port).

    Raises `pydantic.ValidationError` at start, naming the field and what is wrong with it.
    """

    # `__` reads a mapping one entry a variable: `<PREFIX>KIND_CAPACITY__SEND_INVOICE=4`.
    model_config = SettingsConfigDict(
        env_prefix="WORKER_", env_nested_delimiter="__", extra="ignore", frozen=True
    )
    service_name: ClassVar[str] = "worker"
    """The worker's name: its console command, its service name, its `AppContext` version."""

    lane: str = "default"
    capacity: Count = Field(default=10, description="items handled at once")
    kind_capacity: dict[str, Count] = Field(
        default_factory=dict,
        description=(
            "items of one kind handled at once, within `capacity` (KIND_CAPACITY__<KIND>); "
            "a kind not named shares what the others leave"
        ),
    )
    lease: Seconds = Field(default=30.0, gt=0, description="lease length per claim, seconds")
    heartbeat_interval: Seconds = Field(default=5.0, gt=0, description="seconds between beats")
    heartbeat_failure_limit: Count = Field(
        default=3, ge=1, description="failed beats in a row before claiming stops"
    )
    sweep_interval: Seconds = Field(default=30.0, gt=0, description="seconds between sweeps")
    sweep_step_timeout: Seconds = Field(
        default=60.0,
        gt=0,
        description="seconds one sweep step may run before it is cancelled and retried",
    )
    retention: Seconds = Field(
        default=7 * 24 * 3600.0,
        gt=0,
        description=(
            "age in seconds past which relayed outbox rows and deleted or cancelled items "
            "are purged"
        ),
    )
    completed_retention: SecondsOrZero = Field(
        default=7 * 24 * 3600.0,
        ge=0,
        description="age in seconds past which completed items are purged; 0 keeps them",
    )
    metrics_host: str = "127.0.0.1"
    metrics_port: Port = 9100
    drain_deadline: Seconds = Field(
        default=20.0, gt=0, description="seconds a stop may take to hand every item back"
    )
    poll_interval: Seconds = Field(
        default=2.0, gt=0, description="seconds between claims when no wake-up arrives"
    )
    database_wake_ups: bool = Field(
        default=True,
        description=(
            "on PostgreSQL, LISTEN for the wake-ups each enqueue's transaction sends at "
            "commit instead of the Redis topic (off behind a transaction-pooling proxy, "
            "where LISTEN does not work)"
        ),
    )
    database_pool_size: Count = Field(
        default=15, ge=1, description="connections per database role: capacity plus 5"
    )
    database_outage_limit: Seconds = Field(
        default=300.0,
        gt=0,
        description=(
            "seconds `serve` waits out a database it cannot reach (refused, starting, "
            "shutting down, failing over) before it exits 1"
        ),
    )
    release: str = Field(default="dev", min_length=1, description="the running release")
    operator: str | None = Field(
        default=None,
        max_length=200,
        description=(
            "who runs an operator command (enqueue, dead-letters replay|discard): recorded "
            "in its audit entry; required for those writes on a database server. `serve` "
            "does not read it"
        ),
    )
    infra: InfraSettings = Field(default_factory=InfraSettings)

    @classmethod
    def env_prefix(cls) -> str:
        """The prefix of every variable these settings read (`SHIPMENT_NOTIFIER_`)."""
        return str(cls.model_config.get("env_prefix", ""))

    @field_validator("lane")
    @classmethod
    def _lane_is_snake_case(cls, value: str) -> str:
        problem = lane_problem(value)  # the rule every enqueue applies too
        if problem is not None:
            raise ValueError(f"lane {problem}")
        return value

    @field_validator("kind_capacity", mode="before")
    @classmethod
    def _kinds_in_capitals(cls, value: object) -> object:
        """Environment variables are read case-blind, so a kind's key arrives in lower case;
        kinds are UPPER_SNAKE (`WorkKind`)."""
        if isinstance(value, Mapping):
            return {str(kind).upper(): count for kind, count in value.items()}
        return value

    def kinds_problem(self, handled: Sequence[str]) -> str | None:
        """Why `kind_capacity` does not fit the kinds this worker handles (`handled`), or
        None: a kind it does not handle, or a capacity above `capacity` (docs/operations.md
        of the worker template, "Kinds")."""
        for kind, count in sorted(self.kind_capacity.items()):
            variable = f"{self.env_prefix()}KIND_CAPACITY__{kind}"
            if kind not in handled:
                handles = ", ".join(handled)
                return f"{variable} names a kind this worker does not handle ({handles})"
            if count > self.capacity:
                return (
                    f"{variable} is {count}, above {self.env_prefix()}CAPACITY ({self.capacity}), "
                    "the items the whole process handles at once: lower it or raise the capacity"
                )
        return None

    @field_validator("operator", mode="before")
    @classmethod
    def _operator_is_one_line(cls, value: object) -> object:
        """Blank is unset (`.env.example` lists the variable empty); otherwise one printable
        line, stripped, so an audit entry names a person and nothing else."""
        if not isinstance(value, str):
            return value
        text = value.strip()
        if not text:
            return None
        if not text.isprintable():
            raise ValueError("operator must be one printable line")
        return text

    @field_validator("infra")
    @classmethod
    def _urls_are_usable(cls, infra: InfraSettings) -> InfraSettings:
        """Refuse at start the URLs the worker cannot open, naming the variable (never its
        value, which may hold a password). A URL set but empty is refused too: unset, the
        database is the embedded SQLite file and Redis the in-process twins, which an empty
        secret must not select without a word."""
        for variable, value in (
            (f"{INFRA_PREFIX}DATABASE_URL", infra.database_url),
            (f"{INFRA_PREFIX}REDIS_URL", infra.redis_url),
        ):
            if value is not None and not value.strip():
                raise ValueError(
                    f"{variable} is set but empty: give the URL, or unset it for the "
                    + ("embedded SQLite database" if "DATABASE" in variable else "in-process twins")
                )
        if infra.database_url:
            variable = f"{INFRA_PREFIX}DATABASE_URL"
            try:
                url = make_url(infra.database_url)
                port = url.port  # a port that is not a number raises here
            except (ArgumentError, ValueError):
                raise ValueError(
                    f"{variable} is not a database URL "
                    "(postgresql://user@host:5432/name or sqlite:///path)"
                ) from None
            # The backend and driver as written: SQLAlchemy's get_driver_name() would load
            # the dialect, and an unknown one raises NoSuchModuleError, not a refusal.
            backend, _, driver = url.drivername.partition("+")
            if backend == "postgres":
                raise ValueError(
                    f"{variable} starts with postgres://, a scheme SQLAlchemy does not read "
                    "(since 1.4): write postgresql://"
                )
            if backend not in DATABASES:
                raise ValueError(
                    f"{variable} names {backend}; the queue runs on {' or '.join(DATABASES)}"
                )
            if driver and driver not in ASYNC_DRIVERS:
                raise ValueError(
                    f"{variable} names the driver {driver}; the worker is "
                    f"async: leave the driver out ({backend}://...) or name "
                    f"{' or '.join(ASYNC_DRIVERS)}"
                )
            if port is not None and not 0 < port < _PORT_LIMIT:
                raise ValueError(f"{variable} has port {port}: a port is 1 to {_PORT_LIMIT - 1}")
            if "sslmode" in url.query:
                raise ValueError(
                    f"{variable} has sslmode, which asyncpg does not take: "
                    "write ssl=require (or ssl=verify-full) instead"
                )
        if infra.redis_url:
            variable = f"{INFRA_PREFIX}REDIS_URL"
            parts = urlsplit(infra.redis_url)
            if parts.scheme not in REDIS_SCHEMES:
                schemes = ", ".join(f"{scheme}://" for scheme in REDIS_SCHEMES)
                raise ValueError(f"{variable} must start with one of {schemes}")
            try:
                port = parts.port  # raises for a port that is not a number or out of range
            except ValueError:
                raise ValueError(
                    f"{variable} has a port that is not one: a port is a number from 1 to "
                    f"{_PORT_LIMIT - 1}"
                ) from None
            if port == 0:
                raise ValueError(f"{variable} has port 0: a port is 1 to {_PORT_LIMIT - 1}")
        return infra

    @classmethod
    def misspelt(cls, environ: Mapping[str, str]) -> str | None:
        """The first variable of `environ` under this worker's prefix that names no setting
        but nearly names one (`CAPACTY` for `CAPACITY`), as a refusal naming both; None when
        there is none. Such a variable is a typo whose value would be ignored without a
        word, the setting keeping its default; a variable that resembles no setting (one
        the handler reads itself, say) is left alone."""
        prefix = cls.env_prefix().upper()
        names = [name.upper() for name in cls.model_fields if name != "infra"]
        for variable in sorted(environ):
            if not variable.upper().startswith(prefix):
                continue
            rest = variable.upper()[len(prefix) :]
            if rest in names or rest.partition("__")[0] in names:
                continue  # a setting, or one entry of a mapping (`KIND_CAPACITY__<KIND>`)
            close = difflib.get_close_matches(rest, names, n=1, cutoff=0.8)
            if close:
                return f"{variable} is not a setting; did you mean {prefix}{close[0]}?"
        return None

    def serving_problem(self) -> str | None:
        """Why `serve` cannot run the loop with these settings, or None.

        The pool must hold one connection per item in flight and `RESERVED_CONNECTIONS`
        beside them. Only `serve` runs the loop, so the operator commands (`tenants`,
        `items`, `enqueue`, `dead-letters`) run with any pool: a capacity set in `.env` for
        the worker never stops an operator's one-off command.
        """
        required = self.capacity + sum(RESERVED_CONNECTIONS.values())
        if self.database_pool_size >= required:
            return None
        reserved = ", ".join(f"{n} for the {what}" for what, n in RESERVED_CONNECTIONS.items())
        return (
            f"capacity {self.capacity} needs a database pool of at least {required} "
            f"connections ({self.capacity} for the items in flight, {reserved}), but "
            f"{self.env_prefix()}DATABASE_POOL_SIZE is {self.database_pool_size}: "
            "raise the pool or lower the capacity"
        )

    @model_validator(mode="after")
    def _fits_together(self) -> Self:
        if self.poll_interval >= self.lease:
            raise ValueError(
                f"{self.env_prefix()}POLL_INTERVAL ({self.poll_interval:g} s) must be shorter "
                f"than {self.env_prefix()}LEASE ({self.lease:g} s)"
            )
        return self

    @property
    def renewal_interval(self) -> Seconds:
        """Seconds between lease renewals, and the bound on each: a fifth of the lease.

        A renewal that times out (one interval) is retried at once and still lands before
        half the lease has passed, where the loop fences itself (`runtime/loop.py`).
        """
        return self.lease / 5

    @property
    def claim_failure_limit_s(self) -> Seconds:
        """Seconds every claim may fail in a row before `/healthz` answers 503: three poll
        intervals, so at least three retries (one per poll interval) have failed as well."""
        return 3 * self.poll_interval

    @property
    def liveness_ttl(self) -> Seconds:
        """Seconds the liveness key outlives its beat: one beat past the failure limit."""
        return self.heartbeat_interval * (self.heartbeat_failure_limit + 1)

    @property
    def roster_grace(self) -> Seconds:
        """Seconds a worker-roster row outlives its expiry before this worker's sweep deletes
        it: two liveness TTLs, so a worker gone without a drain leaves the roster three TTLs
        after its last beat (docs/decisions/0049), and a worker whose roster writes failed
        for a while but whose liveness beat held keeps its row (and its `started_at`)."""
        return 2 * self.liveness_ttl

    @property
    def app_version(self) -> str:
        """`<worker>@<release>`, the version the loop's `AppContext` carries."""
        return f"{self.service_name}@{self.release}"
