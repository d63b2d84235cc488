"""Answer rules and derived names (docs/answers.md): one place turns the answers into names.

Pure functions, no imports beyond the standard library: the context hook (copier's Python,
every render) and the host patcher (a copier task) both load this module by file path.
"""

from __future__ import annotations

import keyword
import re

WORKER_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
WORK_KIND = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*")
LANE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")
WORKER_NAME_RULE = (
    "kebab-case (lowercase letters and digits, starting with a letter, words joined by '-', "
    "e.g. shipment-notifier)"
)
"""What `WORKER_NAME` accepts, as a refusal says it."""

# Hard and soft keywords: a module, package or class named after a hard one cannot be
# imported or defined, and one named after a soft one reads as the keyword. The soft list
# is spelled out as well as read from `keyword`, since it grows by Python version (`type`
# became soft in 3.12) and copier's Python need not be the host's.
KEYWORDS = (
    frozenset(keyword.kwlist)
    | frozenset(keyword.softkwlist)
    | frozenset({"_", "case", "match", "type"})
)


def camel(upper_snake: str) -> str:
    """`NOTIFY_SHIPMENT` -> `NotifyShipment`; `NOOP` -> `Noop` (docs/answers.md)."""
    return "".join(part.capitalize() for part in upper_snake.split("_") if part)


def derive_names(*, worker_name: str, work_kind: str) -> dict[str, str]:
    """Every name the template derives from `worker_name` and `work_kind`.

    Returns the context variables: `worker_module` (`shipment_notifier`),
    `worker_env_prefix` (`SHIPMENT_NOTIFIER_`), `kind_class` (`NotifyShipment`),
    `kind_snake` (`notify_shipment`), `handler_class` (`NotifyShipmentHandlerImpl`),
    `payload_class` (`NotifyShipmentPayload`), `work_kind_value` (`work.notify_shipment`,
    the outbox row kind that enqueues this kind through the relay).
    """
    module = worker_name.replace("-", "_")
    kind_class = camel(work_kind)
    kind_snake = work_kind.lower()
    return {
        "worker_module": module,
        "worker_env_prefix": module.upper() + "_",
        "kind_class": kind_class,
        "kind_snake": kind_snake,
        "handler_class": f"{kind_class}HandlerImpl",
        "payload_class": f"{kind_class}Payload",
        "work_kind_value": f"work.{kind_snake}",
    }


RESERVED_WORKER_NAMES = {"runtime": "the worker runtime every worker runs on"}
"""Names under `workers/` the template renders itself, never a worker's."""


def answer_problems(*, worker_name: str, work_kind: str, lane: str) -> list[str]:
    """The rule each answer breaks, as one sentence per problem ([] when all are valid).

    Checks the formats (`worker_name` kebab-case, `work_kind` UPPER_SNAKE, `lane`
    snake_case) and then every derived identifier against the hard and soft keywords:
    the worker module (`<root>.workers.<module>`), the kind's module (`payloads/<kind>.py`),
    the kind's class (`NONE` would give `None`), and the lane.
    """
    problems: list[str] = []
    if not WORKER_NAME.fullmatch(worker_name):
        problems.append(f"worker_name {worker_name!r} must be {WORKER_NAME_RULE}")
    if not WORK_KIND.fullmatch(work_kind):
        problems.append(
            f"work_kind {work_kind!r} must be UPPER_SNAKE "
            "(uppercase letters and digits, starting with a letter, words joined by '_', "
            "e.g. NOTIFY_SHIPMENT)"
        )
    if not LANE.fullmatch(lane):
        problems.append(
            f"lane {lane!r} must be snake_case "
            "(lowercase letters and digits, starting with a letter, words joined by '_', "
            "e.g. default)"
        )
    if worker_name in RESERVED_WORKER_NAMES:
        problems.append(
            f"worker_name {worker_name!r} is reserved: workers/{worker_name} holds "
            f"{RESERVED_WORKER_NAMES[worker_name]}; choose another name"
        )
    if problems:
        return problems
    names = derive_names(worker_name=worker_name, work_kind=work_kind)
    derived = [
        ("worker_name", worker_name, "the worker module", names["worker_module"]),
        ("work_kind", work_kind, "the kind's module", names["kind_snake"]),
        ("work_kind", work_kind, "the kind's class", names["kind_class"]),
        ("lane", lane, "the lane", lane),
    ]
    for answer, value, what, name in derived:
        if name in KEYWORDS:
            problems.append(
                f"{answer} {value!r} gives {what} {name!r}, a Python keyword; choose another name"
            )
    return problems


BOOLEAN_WORDS = frozenset({"y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0"})
"""What a yes/no answer given as text may say; copier casts any other text to true."""


def boolean_problems(given: dict[str, object], questions: tuple[str, ...]) -> list[str]:
    """The yes/no answers among `questions` that `given` (the `-d` data, as typed) holds as
    text copier would read as true by accident (`maintenance=maybe`); [] when none."""
    problems: list[str] = []
    for question in questions:
        raw = given.get(question)
        if isinstance(raw, str) and raw.strip().lower() not in BOOLEAN_WORDS:
            problems.append(f"{question} {raw!r} must be true or false (yes/no, on/off, 1/0)")
    return problems


# The longest rendered line each derived name sits in, less the name itself (characters at
# the host's indentation), for the host's own `ruff check`/`ruff format --check` to pass:
# `from <root>.workers.<module>.settings import ENV_PREFIX, INFRA_PREFIX` (the worker's
# tests/test_main.py), `payload = <KindClass>Payload.model_validate_json(args.payload)` (its
# main.py), the first docstring line of om/tests/unit/test_enqueue_<kind>.py, `<KIND> =
# "<KIND>"` (the `WorkKind` member) and `WorkKind.<KIND>:
# KindPolicy(lane="<lane>"),` (its policy entry). tests/test_refusals.py renders at and one
# past each limit and runs the host's ruff and mypy.
WORKER_MODULE_LINE = len("from .workers..settings import ENV_PREFIX, INFRA_PREFIX")
KIND_CLASS_LINE = len("        payload = Payload.model_validate_json(args.payload)")
KIND_MEMBER_LINE = len('     = ""')
KIND_TEXT_LINE = len('"""The typed enqueue helpers of `` over the memory storage.')
LANE_POLICY_LINE = len('    WorkKind.: KindPolicy(lane=""),')
OUTBOX_KIND_PREFIX = len("work.")


def limit_problems(
    *,
    worker_name: str,
    work_kind: str,
    lane: str,
    line_length: int,
    host_root: str,
    outbox_kind_size: int | None,
) -> list[str]:
    """The length limits each (well-formed) answer passes, one sentence per problem.

    `line_length` is the host's ruff line length; `outbox_kind_size` the size of the host's
    `outbox.kind` column (the relay's `work.<kind>` row kind), None when it has no limit.
    """
    problems: list[str] = []
    names = derive_names(worker_name=worker_name, work_kind=work_kind)
    most = line_length - WORKER_MODULE_LINE - len(host_root)
    if worker_name and len(worker_name) > most:
        problems.append(
            f"worker_name {worker_name!r} is {len(worker_name)} characters, at most {most} fit "
            f"the host's line length {line_length} (from {host_root}.workers.<module>.settings "
            "import ...)"
        )
    if work_kind:
        most = line_length - KIND_CLASS_LINE
        if len(names["kind_class"]) > most:
            problems.append(
                f"work_kind {work_kind!r} gives the class {names['kind_class']}Payload: its name "
                f"may have at most {most} characters before `Payload` to fit the host's line "
                f"length {line_length}"
            )
        member, text = (line_length - KIND_MEMBER_LINE) // 2, line_length - KIND_TEXT_LINE
        most = min(member, text)
        if len(work_kind) > most:
            where = (
                f'`{work_kind} = "{work_kind}"` in WorkKind'
                if member < text
                else "the docstring of its enqueue test names it"
            )
            problems.append(
                f"work_kind {work_kind!r} is {len(work_kind)} characters, at most {most} fit "
                f"the host's line length {line_length} ({where})"
            )
        if outbox_kind_size is not None:
            most = outbox_kind_size - OUTBOX_KIND_PREFIX
            if len(work_kind) > most:
                problems.append(
                    f"work_kind {work_kind!r} is {len(work_kind)} characters, at most {most}: "
                    f"the relay's row kind {names['work_kind_value']!r} must fit the host's "
                    f"outbox.kind varchar({outbox_kind_size})"
                )
    if lane and lane != "default" and work_kind:
        most = line_length - LANE_POLICY_LINE - len(work_kind)
        if len(lane) > most:
            problems.append(
                f"lane {lane!r} is {len(lane)} characters, at most {most} fit beside the kind "
                f"{work_kind!r} in the host's line length {line_length} "
                "(`WorkKind.<KIND>: KindPolicy(lane=...)`)"
            )
    return problems


def setting_variables(worker_name: str, fields: tuple[tuple[str, str], ...]) -> set[str]:
    """The environment variables a worker's settings read (`<PREFIX><FIELD>`): worker `x`'s
    `completed_retention` and worker `x-completed`'s `retention` are one variable."""
    prefix = derive_names(worker_name=worker_name, work_kind="X")["worker_env_prefix"]
    return {f"{prefix}{field.upper()}" for field, _ in fields}
