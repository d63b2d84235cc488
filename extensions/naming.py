"""Answer rules and derived names (seed 000, Input): one place turns the answers into names.

Pure functions, no imports beyond the standard library: the context hook (copier's Python,
every render) and the host patcher (a copier task) both load this module by file path.
"""

from __future__ import annotations

import keyword
import re

WORKER_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
WORK_KIND = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$")
LANE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")

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
    """`NOTIFY_SHIPMENT` -> `NotifyShipment`; `NOOP` -> `Noop` (seed 000, Input)."""
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


def answer_problems(*, worker_name: str, work_kind: str, lane: str) -> list[str]:
    """The rule each answer breaks, as one sentence per problem ([] when all are valid).

    Checks the formats (`worker_name` kebab-case, `work_kind` UPPER_SNAKE, `lane`
    snake_case) and then every derived identifier against the hard and soft keywords:
    the worker module (`<root>.workers.<module>`), the kind's module (`payloads/<kind>.py`),
    the kind's class (`NONE` would give `None`), and the lane.
    """
    problems: list[str] = []
    if not WORKER_NAME.match(worker_name):
        problems.append(
            f"worker_name {worker_name!r} must be kebab-case "
            "(lowercase letters and digits, words joined by '-', e.g. shipment-notifier)"
        )
    if not WORK_KIND.match(work_kind):
        problems.append(
            f"work_kind {work_kind!r} must be UPPER_SNAKE "
            "(uppercase letters and digits, words joined by '_', e.g. NOTIFY_SHIPMENT)"
        )
    if not LANE.match(lane):
        problems.append(
            f"lane {lane!r} must be snake_case "
            "(lowercase letters and digits, words joined by '_', e.g. default)"
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
