"""A worker's console command (`run`): the parser, `serve`, and the exit codes.

`serve` boots the process as a service does (`boot(settings)`: logging, error reporting,
trust store, tracing) and runs the worker (`server.serve`) until SIGTERM or SIGINT. The
other subcommands are for demos and operators: `enqueue` items of the worker's kind,
`schedules` (each periodic item and its next tick), `tenants` (the live tenant ids),
`items list|show|move|discard`, `dead-letters list|replay|discard`, `lanes
list|pause|resume` and `summary` (`commands.py`). Every line a command prints about itself
starts with the worker's name. The top of the engine: nothing in it imports this module; a
worker's `main.py` reaches it through `entry.console`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn
from uuid import UUID
from zoneinfo import ZoneInfo

import asyncpg
from pydantic import ValidationError
from sqlalchemy.exc import SQLAlchemyError

from acme.infra.boot import boot
from acme.infra.settings import InfraSettings
from acme.om.errors import Invalid, OmError
from acme.om.work.storage.impl.sqlite_upgrade import SqliteFileOutdated
from acme.om.work.types.policy import PRIORITY_MAX, PRIORITY_MIN
from acme.om.work.types.work_item import WorkStatus, checked_priority
from acme.workers.runtime.commands import MOST_AT_ONCE, Refused, run_operator_command
from acme.workers.runtime.container import HostContractError
from acme.workers.runtime.errors import escape_log_output
from acme.workers.runtime.server import (
    DatabaseOutage,
    MetricsPortUnavailable,
    NotMigrated,
    serve,
)
from acme.workers.runtime.settings import (
    EMBEDDED_DATABASE,
    INFRA_PREFIX,
    NoHostRoot,
    RuntimeSettings,
    embedded_database_file,
)
from acme.workers.runtime.worker import RuntimeTooOld, Worker


def _settings_line(exc: ValidationError, env_prefix: str) -> str:
    """Settings errors on one line, each named by its environment variable
    (`SHIPMENT_NOTIFIER_CAPACITY`, `ACME_DATABASE_URL`), which is what an
    operator sets.
    An error the host's `InfraSettings` raises itself (while the worker's settings build
    it) is located in that model, so its fields take the host's prefix."""
    parts = []
    infra_model = exc.title == InfraSettings.__name__
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        if loc[:1] == ["infra"]:
            name = f"{INFRA_PREFIX}{loc[1].upper()}" if len(loc) > 1 else ""
        elif infra_model:
            name = f"{INFRA_PREFIX}{loc[0].upper()}" if loc else ""
        else:
            name = f"{env_prefix}{loc[0].upper()}" if loc else ""
        message = str(error["msg"]).removeprefix("Value error, ")
        parts.append(f"{name}: {message}" if name else message)
    return "; ".join(parts)


def _one_line(exc: ValidationError, prefix: str = "") -> str:
    """`field.path: message; ...`: a refusal an operator can read on one line.

    `prefix` names what was validated (`payload.`); an error about the whole of it (bad
    JSON) is named by the prefix alone.
    """
    parts = []
    for error in exc.errors():
        path = ".".join(str(part) for part in error["loc"])
        name = f"{prefix}{path}" if path else prefix.rstrip(".")
        parts.append(f"{name}: {error['msg']}" if name else str(error["msg"]))
    return "; ".join(parts)


async def _run_command(worker: Worker, settings: RuntimeSettings, args: argparse.Namespace) -> None:
    if args.command == "serve":
        await serve(worker, settings, kinds=args.kind)
    else:
        await run_operator_command(worker, settings, args)


def _printable_line(text: str, *, empty: str) -> str:
    """`text` stripped, when it is one printable line of 1-200 characters; else an
    `ArgumentTypeError` (saying `empty` when nothing is left)."""
    line = text.strip()
    if not line:
        raise argparse.ArgumentTypeError(empty)
    if len(line) > 200 or not line.isprintable():
        raise argparse.ArgumentTypeError("give one printable line of 1-200 characters")
    return line


def _identity(text: str) -> str:
    """An argparse type: an operator identity, one printable line of 1-200 characters."""
    return _printable_line(
        text, empty="it is empty (a shell variable that is unset, such as $USER?); give a name"
    )


def _tenant_name(text: str) -> str:
    """An argparse type: a new tenant's name, one printable line of 1-200 characters (a tab
    or a newline in it would break the `created tenant` line that reports it)."""
    return _printable_line(text, empty="give one printable line of 1-200 characters")


def _reason(text: str) -> str:
    """An argparse type: why an operator pauses or resumes a lane, one printable line."""
    return _printable_line(text, empty="give one printable line of 1-200 characters")


def _priority(text: str) -> int:
    """An argparse type: an item's priority, by `checked_priority`'s rule."""
    try:
        return checked_priority(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    except Invalid as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("priority: ")) from None


def _positive(text: str) -> int:
    """An argparse type: an integer from 1 to `MOST_AT_ONCE` (argparse turns the error into
    exit 2)."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{number} is not at least 1")
    if number > MOST_AT_ONCE:
        raise argparse.ArgumentTypeError(f"{number} is more than {MOST_AT_ONCE:,}")
    return number


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2), naming `--help`, like
    every other refusal of the command line; subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parser(worker: Worker, env_prefix: str) -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog=worker.name, description=f"The {worker.name} worker ({worker.kind.value} items)."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serving = commands.add_parser("serve", help="run the worker until SIGTERM/SIGINT, then drain")
    serving.add_argument(
        "--kind",
        action="append",
        default=[],
        metavar="KIND",
        help="claim only this kind (repeat for more; default: every kind the worker handles)",
    )
    commands.add_parser("schedules", help="list the worker's schedules and each one's next tick")

    enqueue = commands.add_parser("enqueue", help=f"enqueue {worker.kind.value} items (demos, ops)")
    enqueue.add_argument(
        "-n",
        "--count",
        type=_positive,
        default=1,
        help=f"how many (default 1, at most {MOST_AT_ONCE:,})",
    )
    tenant = enqueue.add_mutually_exclusive_group()
    tenant.add_argument("--org", type=UUID, help=f"tenant id (see `{worker.name} tenants`)")
    tenant.add_argument(
        "--create-tenant",
        metavar="NAME",
        type=_tenant_name,
        help="create a tenant named NAME and enqueue into it (prints its id); for demos",
    )
    enqueue.add_argument(
        "--payload",
        default="{}",
        help="the payload as a JSON object, validated by the kind's payload model",
    )
    enqueue.add_argument(
        "--priority",
        type=_priority,
        help=f"{PRIORITY_MIN} to {PRIORITY_MAX}, higher claimed first within the tenant"
        " (default: the kind's)",
    )

    commands.add_parser("tenants", help="the live tenant ids, one a line (read-only)")

    items = commands.add_parser(
        "items", help="read work items; cancel one; move or discard stranded ones"
    )
    items_actions = items.add_subparsers(dest="action", required=True)
    listing = items_actions.add_parser("list", help="newest first, per tenant, with the lane")
    listing.add_argument("--org", type=UUID, help="one tenant (default: every tenant)")
    listing.add_argument("--status", choices=[status.value for status in WorkStatus])
    listing.add_argument("--limit", type=_positive, default=50)
    listing.add_argument(
        "--any-kind",
        action="store_true",
        help="every kind's items, one no worker declares included (default: this worker's)",
    )
    show = items_actions.add_parser("show", help="one item of any kind as JSON")
    show.add_argument("item_id", type=UUID)
    show.add_argument("--org", type=UUID, required=True, help="the item's tenant")
    move = items_actions.add_parser(
        "move", help="move the waiting items of a lane to another (after a lane change)"
    )
    move.add_argument("--from-lane", required=True, metavar="LANE", help="the old lane")
    move.add_argument(
        "--kind", metavar="KIND", help=f"the items' kind (default: {worker.kind.value})"
    )
    move.add_argument(
        "--to-lane", metavar="LANE", help="the new lane (default: the one the kind's policy names)"
    )
    move.add_argument("--org", type=UUID, help="one tenant (default: every tenant)")
    move.add_argument(
        "--dry-run", action="store_true", help="print what would move; change nothing"
    )
    discard = items_actions.add_parser(
        "discard", help="delete (soft) a row of a kind no worker declares"
    )
    discard.add_argument("item_id", type=UUID)
    discard.add_argument("--org", type=UUID, required=True, help="the item's tenant")
    discard.add_argument(
        "--dry-run", action="store_true", help="print what it would discard; change nothing"
    )

    cancel = items_actions.add_parser(
        "cancel", help="cancel a waiting or running item of this kind for good (audited)"
    )
    cancel.add_argument("item_id", type=UUID)
    cancel.add_argument("--org", type=UUID, required=True, help="the item's tenant")
    cancel.add_argument(
        "--dry-run", action="store_true", help="print what it would cancel; change nothing"
    )

    dead = commands.add_parser("dead-letters", help="failed items: list, replay, discard")
    dead_actions = dead.add_subparsers(dest="action", required=True)
    dead_list = dead_actions.add_parser("list", help="dead letters, newest first")
    dead_list.add_argument("--org", type=UUID, help="one tenant (default: every tenant)")
    dead_list.add_argument("--limit", type=_positive, default=50)
    for action, text in (
        ("replay", "make it available again, attempts reset"),
        ("discard", "delete it (soft)"),
    ):
        one = dead_actions.add_parser(action, help=text)
        one.add_argument("item_id", type=UUID)
        one.add_argument("--org", type=UUID, required=True, help="the item's tenant")
        one.add_argument(
            "--dry-run", action="store_true", help=f"print what it would {action}; change nothing"
        )
    dead_actions.choices["replay"].add_argument(
        "--payload",
        metavar="JSON",
        help="replay it with this payload instead (a JSON object, validated by the kind's "
        "payload model; the audit entry keeps the old and the new)",
    )

    lanes = commands.add_parser("lanes", help="pause and resume lanes (every tenant's items)")
    lane_actions = lanes.add_subparsers(dest="action", required=True)
    lane_actions.add_parser("list", help="the paused lanes: who paused each, when, why")
    lane_writers = []
    for action, text in (
        ("pause", "no worker claims on the lane until it is resumed; in-flight items finish"),
        ("resume", "workers claim on the lane again"),
    ):
        one = lane_actions.add_parser(action, help=text)
        one.add_argument("lane", nargs="?", help="the lane (default: this worker's LANE)")
        one.add_argument("--reason", type=_reason, help="why, for the audit entries")
        lane_writers.append(one)

    summary = commands.add_parser(
        "summary", help="the queue at a glance: counts, oldest due age, paused lanes, holders"
    )
    summary.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    for writer in (
        enqueue,
        move,
        discard,
        cancel,
        *(dead_actions.choices[name] for name in ("replay", "discard")),
        *lane_writers,
    ):
        writer.add_argument(
            "--operator",
            type=_identity,
            metavar="NAME",
            help=f"who asks, for the audit entry (default: {env_prefix}OPERATOR); required "
            "when a database server is configured",
        )
    return parser


def run(worker: Worker, argv: Sequence[str] | None = None) -> None:
    """`worker`'s console command (`entry.console`), with `argv` (default: `sys.argv[1:]`).

    Exits 0 on success; 1 on an engine older than the worker needs, invalid settings, a
    metrics port another process holds, no host root to hold the embedded database
    (`NoHostRoot`), an embedded file whose rows do not fit this release's tables, a host
    the worker cannot use (the message names the part), a database an operator command
    cannot reach, or one `serve` waited for past `DATABASE_OUTAGE_LIMIT`; 2 on input the
    model refuses, and on a command refused before it opens anything (`enqueue` without
    `--org` or `--create-tenant`, a write on a database server without an operator
    identity).
    """
    name = worker.name
    try:
        worker.check_runtime()
    except RuntimeTooOld as exc:
        sys.exit(f"{name}: {exc}")
    args = _parser(worker, worker.settings.env_prefix()).parse_args(argv)
    try:
        settings = worker.settings()
    except ValidationError as exc:
        sys.exit(f"{name}: invalid settings: {_settings_line(exc, worker.settings.env_prefix())}")
    if (misspelt := worker.settings.misspelt(os.environ)) is not None:
        sys.exit(f"{name}: invalid settings: {misspelt}")
    if args.command == "serve" and (problem := settings.serving_problem()) is not None:
        sys.exit(f"{name}: invalid settings: {problem}")
    if (
        args.command in ("serve", "schedules")
        and (problem := worker.schedule_problem(settings)) is not None
    ):
        sys.exit(problem)
    if args.command == "schedules":
        print_schedules(worker, datetime.now(UTC))
        return
    if settings.infra.database_url is None:
        try:
            embedded = embedded_database_file()
        except NoHostRoot as exc:
            sys.exit(f"{name}: {exc}")
        if (stray := _stray_embedded_file(embedded)) is not None:
            print(f"{name}: {stray}", file=sys.stderr)
    boot(settings.infra, service_name=name)
    escape_log_output()
    try:
        asyncio.run(_run_command(worker, settings, args))
    except Refused as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        sys.exit(2)
    except ValidationError as exc:
        if args.command in ("enqueue", "dead-letters"):
            refusal = f"{_one_line(exc, 'payload.')} (pass the payload with --payload '<json>')"
        else:
            refusal = _one_line(exc)
        print(f"{name}: Invalid: {refusal}", file=sys.stderr)  # as OmError `Invalid`
        sys.exit(2)
    except OmError as exc:
        print(f"{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(2)
    except HostContractError as exc:
        sys.exit(f"{name}: the host does not meet the contract: {exc}")
    except (MetricsPortUnavailable, NotMigrated, DatabaseOutage, SqliteFileOutdated) as exc:
        sys.exit(f"{name}: {exc}")
    # An operator command's database is down, or refuses the connection itself (a database
    # or role that does not exist, a wrong password: asyncpg raises those unwrapped).
    except (OSError, SQLAlchemyError, asyncpg.PostgresError) as exc:
        cause = str(exc).splitlines()[0] if str(exc) else ""
        if _undefined_table(exc):
            sys.exit(
                f"{name}: the database has not been migrated: {cause} "
                "(run the host's migrations, `make migrate`, as the database's owner)"
            )
        sys.exit(f"{name}: the database is unavailable: {type(exc).__name__}: {cause}")


def print_schedules(worker: Worker, now: datetime) -> None:
    """One line per schedule of `worker`: its name, expression, zone, tenants, catch-up
    horizon and next tick after `now` (UTC, and local in its zone); reads no database."""
    if not worker.schedules:
        print(f"{worker.name}: no schedules (declare them in its loop.py, `schedules=`)")
        return
    for schedule in worker.schedules:
        tick = schedule.next_tick(now)
        local = "none" if tick is None else tick.astimezone(ZoneInfo(schedule.zone)).isoformat()
        print(
            f"{schedule.key(worker.name)}\tcron={schedule.cron!r}\tzone={schedule.zone}"
            f"\tfor={schedule.tenant or 'each live tenant'}"
            f"\tcatch_up_s={'none' if schedule.catch_up_s is None else f'{schedule.catch_up_s:g}'}"
            f"\tnext={'none' if tick is None else tick.isoformat()}\tnext_local={local}"
        )


def _stray_embedded_file(embedded: Path) -> str | None:
    """A warning when the working directory holds an embedded database that is not
    `embedded` (the host root's): one an earlier release made here, when the file was
    relative to the working directory, whose items no process reads any more; else None."""
    here = (Path.cwd() / EMBEDDED_DATABASE).resolve()
    if here == embedded or not here.is_file():
        return None
    return (
        f"{here} is not read: the embedded database is {embedded}, the host root's (to see "
        f"what the other holds, run with {INFRA_PREFIX}DATABASE_URL=sqlite:///{here}; then "
        "delete it)"
    )


def _undefined_table(exc: BaseException) -> bool:
    """Whether `exc` (or its cause, as SQLAlchemy wraps the driver's) says a table is
    missing: PostgreSQL's `undefined_table` (42P01) or SQLite's `no such table`."""
    seen: BaseException | None = exc
    for _ in range(5):  # a chain of a few wrappers at most
        if seen is None:
            break
        if isinstance(seen, asyncpg.UndefinedTableError) or "no such table" in str(seen):
            return True
        seen = seen.__cause__ or getattr(seen, "orig", None)
    return False
