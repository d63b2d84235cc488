"""The host patcher: the seed's "Changed" rows as idempotent, structural fragments.

Run by copier as a task in the destination (copier.yml `_tasks`):

    python <template>/extensions/patcher.py --operation copy --answers-file workers/<name>/.copier-answers.yml

It reads the worker's recorded answers, then edits the host files many workers share
(docs/host-contract.md): libcst for Python, tomlkit for TOML, and text
between explicit markers for shell, env and Markdown. Each fragment first looks for its
own edit and changes nothing when it is there, so applying twice is byte-identical.

`check_host(host, spec)` is the precondition check the context hook runs in the prompt
phase of `copier copy`, before any file is written: it names every host file and part a
fragment needs and cannot find. The patcher never runs `uv` or anything network-bound; the
user runs `uv sync` afterwards.

Update replays (copier 9.19.1 runs tasks in two bare temporary copies, too) are refused
quietly: the patcher acts only in a folder that is a host root and, on update, a git
work tree (the replays are not git repositories while tasks run).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import hashlib
import importlib.util
import io
import re
import runpy
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

# `_sibling("naming")`: extensions/naming.py, loaded once per template checkout (siblings.py).
_sibling: Callable[[str], ModuleType] = functools.partial(
    runpy.run_path(str(Path(__file__).with_name("siblings.py")))["load"], __file__
)


if TYPE_CHECKING:
    import host_workers
    import hostfacts
    import naming
else:
    naming = _sibling("naming")
    hostfacts = _sibling("hostfacts")
    host_workers = _sibling("host_workers")

try:
    import libcst as cst
    import ruamel.yaml  # noqa: F401  (extensions/deploy.py: the deploy workflows, compose)
    import tomlkit
except ImportError as exc:  # pragma: no cover - depends on how copier was installed
    MISSING_DEPS: str | None = exc.name
else:
    MISSING_DEPS = None
    if TYPE_CHECKING:
        import deploy
        import lifecycle
        import pyedit
    else:
        pyedit = _sibling("pyedit")
        deploy = _sibling("deploy")
        lifecycle = _sibling("lifecycle")

INSTALL_HINT = (
    "install copier with the template's extras: "
    "uv tool install copier --with copier-template-extensions --with jinja2-time "
    "--with libcst --with tomlkit --with ruamel.yaml"
)

# The worker's settings (template/workers/<name>/src/<root>/workers/<module>/settings.py),
# field by field with its local value, in declaration order: `.env.example` gets one line
# each under the worker's prefix. tests/test_patcher.py holds this list to a rendered
# settings.py, so the two cannot drift.
WORKER_SETTINGS: tuple[tuple[str, str], ...] = (
    ("lane", "{lane}"),
    ("capacity", "10"),
    ("lease", "30"),
    ("heartbeat_interval", "5"),
    ("heartbeat_failure_limit", "3"),
    ("sweep_interval", "30"),
    ("sweep_step_timeout", "60"),
    ("retention", "604800"),
    ("completed_retention", "604800"),
    ("metrics_host", "127.0.0.1"),
    ("metrics_port", "{metrics_port}"),
    ("drain_deadline", "20"),
    ("poll_interval", "2"),
    ("database_wake_ups", "true"),
    ("database_pool_size", "15"),
    ("database_outage_limit", "300"),
    ("release", "dev"),
    ("operator", ""),
)
# Fields that are not the worker's own variables: `infra` is the shared `<ROOT>_` block.
SHARED_SETTINGS = frozenset({"infra"})
# Fields read one variable per kind (`<PREFIX>KIND_CAPACITY__<KIND>`): an added kind's
# `.env.example` block names its own (`kind_env_block`).
KIND_SETTINGS = frozenset({"kind_capacity"})
# An added kind's capacity in `.env.example`: half the worker's default capacity, so the
# worker's own kind keeps slots while the added one is busy (docs/operations.md, "Kinds").
ADDED_KIND_CAPACITY = 5
# Each worker's local metrics port: the first gets 9100, the next 9101, ..., so every worker
# scripts/dev.sh starts can serve /metrics beside the others.
METRICS_PORT_BASE = 9100

# Names the work namespace's templates define (template/{% if namespace_absent %}om...).
POSTGRES_STORAGE = ("work.storage.impl.postgres", "PostgresWorkStorage")
SQLITE_STORAGE = ("work.storage.impl.sqlite", "SqliteWorkStorage")
MEMORY_STORAGE = ("work.storage.impl.memory", "MemoryWorkStorage")
REQUEST_STAGE = (
    "claim",
    "claim_many",
    "maintenance_contexts",
    "queue_stats",
    "pause_lane",
    "resume_lane",
    "paused_lanes",
    "queue_summary",
    "beat_worker",
    "drop_worker",
    "prune_workers",
    "workers_alive",
)

KINDS_HEADER = (
    '"""Work kinds, their payload models and policies: one entry per worker (fragments)."""'
)


@dataclass(frozen=True)
class Spec:
    """What the fragments need: the answers plus the names derived from them."""

    worker_name: str
    work_kind: str
    lane: str
    host_root: str
    namespace_absent: bool
    container: bool = False
    storage_has_claim_many: bool = False
    # The rendered storage interface's abstract methods that take no `org_id` (`host_spec`).
    storage_tenantless: tuple[str, ...] = ()
    metrics_port: int | None = None
    line_length: int = 88  # the host's `[tool.ruff] line-length` (`line_length(host)`)
    added_kind: bool = False  # a kind added to the existing worker `worker_name`

    @classmethod
    def from_answers(cls, answers: dict[str, Any]) -> Spec:
        return cls(
            worker_name=str(answers["worker_name"]),
            work_kind=str(answers["work_kind"]),
            lane=str(answers.get("lane") or "default"),
            host_root=str(answers["host_root"]),
            namespace_absent=bool(answers.get("namespace_absent")),
            container=bool(answers.get("container")),
            metrics_port=int(answers["metrics_port"]) if answers.get("metrics_port") else None,
            added_kind=answers.get("added_kind") is True,
        )

    @property
    def names(self) -> dict[str, str]:
        return naming.derive_names(worker_name=self.worker_name, work_kind=self.work_kind)

    @property
    def policy(self) -> str:
        """The kind's `KindPolicy(...)` expression: the lane is named when not the default."""
        return "KindPolicy()" if self.lane == "default" else f'KindPolicy(lane="{self.lane}")'

    @property
    def om(self) -> str:
        return f"om/src/{self.host_root}/om"

    @property
    def pkg(self) -> str:
        return f"{self.host_root}.om"


class Missing(Exception):
    """A host file lacks what a fragment needs; str() is `<file>: <what is missing>`."""


@dataclass(frozen=True)
class Fragment:
    """One Changed row: the file it edits, a check that raises `Missing`, and the edit.

    `apply(host, spec)` returns the new text of the file, or None when the file must be
    created and `create` is set; `check` runs before rendering and names what is missing.
    """

    name: str
    path: Callable[[Spec], str]
    edit: Callable[[str, Spec, int], str]
    create: Callable[[Spec], str] | None = None
    # An optional fragment: why the host does without it (None: it applies), said once.
    skip: Callable[[Path, Spec], str | None] | None = None

    def target(self, host: Path, spec: Spec) -> Path:
        return host / self.path(spec)

    def skipped(self, host: Path, spec: Spec) -> str | None:
        return None if self.skip is None else self.skip(host, spec)

    def check(self, host: Path, spec: Spec, limit: int) -> None:
        if self.skipped(host, spec) is not None:
            return
        path = self.target(host, spec)
        if not path.is_file():
            if self.create is not None:
                return
            raise Missing(f"{self.path(spec)}: the file does not exist")
        self.edit(path.read_text(encoding="utf-8"), spec, limit)

    def apply(self, host: Path, spec: Spec, limit: int) -> bool:
        reason = self.skipped(host, spec)
        if reason is not None:
            print(f"    note     {reason}", file=sys.stderr)
            return False
        path = self.target(host, spec)
        if path.is_file():
            before = path.read_text(encoding="utf-8")
            after = self.edit(before, spec, limit)
        elif self.create is not None:
            before, after = None, self.edit(self.create(spec), spec, limit)
        else:
            raise Missing(f"{self.path(spec)}: the file does not exist")
        if after == before:
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(after, encoding="utf-8")
        return True


# --- Python helpers ---------------------------------------------------------------------


def _parse(text: str, where: str) -> cst.Module:
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        raise Missing(f"{where}: does not parse as Python ({exc.message})") from exc


def _class(module: cst.Module, name: str, where: str) -> cst.ClassDef:
    node = pyedit.find_class(module, name)
    if node is None:
        raise Missing(f"{where}: no top-level `class {name}`")
    return node


def _member(name: str, value: str) -> cst.BaseStatement:
    return pyedit.stmt(f'{name} = "{value}"\n')


def _enum_add(module: cst.Module, cls: str, name: str, value: str, where: str) -> cst.Module:
    node = _class(module, cls, where)
    if not isinstance(node.body, cst.IndentedBlock):
        raise Missing(f"{where}: `class {cls}` has its body on the `class` line")
    if name in pyedit.class_members(node):
        return module
    body = pyedit.insert_after_last(
        node.body.body, _member(name, value), pyedit.is_simple(cst.Assign)
    )
    return pyedit.replace(module, node, node.with_changes(body=node.body.with_changes(body=body)))


def _dict_add(
    module: cst.Module, var: str, key: str, value: str, where: str, limit: int | None = None
) -> cst.Module:
    """`var`'s dict literal with `key: value` appended; with `limit` (characters), a value
    whose entry line would pass it goes in parentheses on a line of its own, as ruff keeps
    it (ruff never splits a bare name)."""
    if limit is not None and len(f"{pyedit.INDENT}{key}: {value},") > limit:
        value = f"(\n{pyedit.INDENT * 2}{value}\n{pyedit.INDENT})"
    statement = pyedit.find_assignment(module, var)
    if statement is None:
        raise Missing(f"{where}: no top-level `{var} = {{...}}`")
    node = pyedit.assigned_value(statement)
    if not isinstance(node, cst.Dict):
        raise Missing(f"{where}: `{var}` is not a dict literal")
    new = pyedit.dict_append(node, key, value)
    if new is node:
        return module
    return pyedit.replace(
        module, node, pyedit.explode(new) if "\n" not in module.code_for_node(node) else new
    )


def _import(module: cst.Module, from_module: str, name: str, limit: int, where: str) -> cst.Module:
    try:
        return pyedit.add_import(module, from_module, name, limit)
    except pyedit.EditError as exc:
        raise Missing(f"{where}: {exc}") from exc


def _method_style(cls: cst.ClassDef, pattern: str) -> cst.FunctionDef | None:
    """The last method of `cls` whose name matches `pattern` (to copy its decorators)."""
    found = None
    for statement in cls.body.body:
        if isinstance(statement, cst.FunctionDef) and re.fullmatch(pattern, statement.name.value):
            found = statement
    return found


def _has_docstring(fn: cst.FunctionDef | None) -> bool:
    if fn is None or not isinstance(fn.body, cst.IndentedBlock) or not fn.body.body:
        return False
    first = fn.body.body[0]
    return (
        isinstance(first, cst.SimpleStatementLine)
        and isinstance(first.body[0], cst.Expr)
        and isinstance(first.body[0].value, cst.SimpleString)
    )


def _add_method(module: cst.Module, cls: cst.ClassDef, code: str) -> cst.Module:
    """Append the method `code` (unindented source) to `cls`, one blank line before it."""
    parsed = cst.parse_module(code).body[0]
    assert isinstance(parsed, cst.FunctionDef)
    method = parsed.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
    body = [*cls.body.body, method]
    return pyedit.replace(module, cls, cls.with_changes(body=cls.body.with_changes(body=body)))


def _storage_getter(
    module: cst.Module, cls_name: str, where: str
) -> tuple[cst.ClassDef, bool, bool]:
    """The class, whether `get_work_storage` is there, and whether its peers have docstrings."""
    cls = _class(module, cls_name, where)
    peer = _method_style(cls, r"get_\w+_storage")
    if peer is None:
        raise Missing(f"{where}: `class {cls_name}` has no `get_<namespace>_storage()` method")
    done = pyedit.find_function(cls.body.body, "get_work_storage") is not None
    return cls, done, _has_docstring(peer)


# --- the fragments ------------------------------------------------------------------------


RUNTIME_MEMBER = "workers/runtime"
"""The worker runtime's workspace member, rendered by the namespace owner."""


def edit_workspace(text: str, spec: Spec, limit: int) -> str:
    """Root `pyproject.toml`: `workers/<name>` in `[tool.uv.workspace] members`, and for
    the namespace owner `workers/runtime` (the engine) before it."""
    doc = tomlkit.parse(text)
    try:
        members = doc["tool"]["uv"]["workspace"]["members"]
    except KeyError as exc:
        raise Missing("pyproject.toml: no `members` array in [tool.uv.workspace]") from exc
    own = f"workers/{spec.worker_name}"
    present = [str(m) for m in members]
    if "workers/*" in present:
        return text
    changed = False
    if own not in present:
        members.append(own)
        changed = True
    if spec.namespace_absent and RUNTIME_MEMBER not in present:
        # Before the owner's own member, where a fresh copy puts it (an updated owner's
        # host then lists its members as one copied at the new version does).
        members.insert([str(m) for m in members].index(own), RUNTIME_MEMBER)
        changed = True
    return tomlkit.dumps(doc) if changed else text


def edit_tenantless(text: str, spec: Spec, limit: int) -> str:
    """Root `pyproject.toml`: the tenant-less storage methods in CTX-12 (the host's
    arch check, docs/host-contract.md).

    `claim_next`, `claim_many` when the rendered storage interface declares it, and every
    other abstract method of that interface that takes no `org_id` (`complete_items`).
    """
    doc = tomlkit.parse(text)
    try:
        tenantless = doc["tool"]["arch-check"]["options"]["CTX-12"]["tenantless"]
    except KeyError as exc:
        raise Missing(
            "pyproject.toml: no `tenantless` array in [tool.arch-check.options.CTX-12]"
        ) from exc
    base = f"{spec.pkg}.work.storage.WorkStorageInterface"
    methods = [f"{base}.claim_next"]
    if spec.storage_has_claim_many:
        methods.append(f"{base}.claim_many")
    methods += [
        f"{base}.{name}" for name in spec.storage_tenantless if f"{base}.{name}" not in methods
    ]
    present = [str(m) for m in tenantless]
    missing = [m for m in methods if m not in present]
    for method in missing:
        tenantless.append(method)
    return tomlkit.dumps(doc) if missing else text


def create_kinds(spec: Spec) -> str:
    """The kinds module as the namespace's first worker leaves it (docs/dev/generated-layout.md)."""
    names = spec.names
    kind, payload = spec.work_kind, names["payload_class"]

    def entry(value: str) -> str:
        # as `_dict_add` writes an entry whose line would pass the host's line length
        line = f"{pyedit.INDENT}WorkKind.{kind}: {value},"
        if len(line) > spec.line_length:
            value = f"(\n{pyedit.INDENT * 2}{value}\n{pyedit.INDENT})"
        return f"{pyedit.INDENT}WorkKind.{kind}: {value},\n"

    return (
        f"{KINDS_HEADER}\n\nfrom enum import StrEnum\n\nfrom pydantic import BaseModel\n\n"
        f"from .payloads.{names['kind_snake']} import {payload}\n"
        "from .policy import KindPolicy\n\n\n"
        f'class WorkKind(StrEnum):\n    {kind} = "{kind}"\n\n\n'
        "WORK_PAYLOADS: dict[WorkKind, type[BaseModel]] = {\n"
        f"{entry(payload)}}}\n"
        "WORK_POLICIES: dict[WorkKind, KindPolicy] = {\n"
        f"{entry(spec.policy)}}}\n"
    )


def edit_kinds(text: str, spec: Spec, limit: int) -> str:
    """`work/types/kinds.py`: the kind's member, payload import and both map entries."""
    where = f"{spec.om}/work/types/kinds.py"
    module = _parse(text, where)
    names = spec.names
    kind, payload = spec.work_kind, names["payload_class"]
    module = _enum_add(module, "WorkKind", kind, kind, where)
    module = _relative_import(module, f"payloads.{names['kind_snake']}", payload, where, limit)
    module = _dict_add(module, "WORK_PAYLOADS", f"WorkKind.{kind}", payload, where, limit)
    module = _dict_add(module, "WORK_POLICIES", f"WorkKind.{kind}", spec.policy, where, limit)
    return module.code


def _relative_import(
    module: cst.Module, sub: str, name: str, where: str, limit: int = 100
) -> cst.Module:
    """`from .<sub> import <name>`, sorted among the other one-dot relative imports, and
    wrapped in parentheses as ruff wraps it when one line would pass `limit` (characters);
    an existing one-line import of `name` that passes `limit` is wrapped the same way."""
    for i, statement in enumerate(module.body):
        node = pyedit._import_of(statement)
        if (
            isinstance(node, cst.ImportFrom)
            and len(node.relative) == 1
            and pyedit._dotted(node.module) == sub
            and not isinstance(node.names, cst.ImportStar)
            and any(pyedit._dotted(a.name) == name for a in node.names)
        ):
            present = [pyedit._dotted(a.name) for a in node.names]
            wanted = pyedit.from_import(f".{sub}", present, limit)
            if node.lpar is not None or "\n" not in wanted:
                return module
            body = list(module.body)
            body[i] = pyedit.stmt(wanted + "\n").with_changes(leading_lines=statement.leading_lines)
            return module.with_changes(body=body)
    new = pyedit.stmt(pyedit.from_import(f".{sub}", [name], limit) + "\n")
    body = list(module.body)
    relatives = [
        i
        for i, s in enumerate(body)
        if isinstance(node := pyedit._import_of(s), cst.ImportFrom) and len(node.relative) == 1
    ]
    if not relatives:
        raise Missing(
            f"{where}: no `from .<module> import ...` statement to sort the new import among"
        )
    for i in relatives:
        node = pyedit._import_of(body[i])
        assert isinstance(node, cst.ImportFrom)
        if pyedit._dotted(node.module).lower() > sub.lower():
            body.insert(i, new.with_changes(leading_lines=body[i].leading_lines))
            body[i + 1] = body[i + 1].with_changes(leading_lines=[])
            return module.with_changes(body=body)
    body.insert(relatives[-1] + 1, new)
    return module.with_changes(body=body)


def edit_roles(text: str, spec: Spec, limit: int) -> str:
    """`storage/roles.py`: `work_items` and `work_schedules` in the queue role and
    org-scoped, `work_lane_pauses` and `work_workers` in the queue role and shared by every
    tenant (new namespace; an update adds the later ones to a host that has the first)."""
    where = f"{spec.om}/storage/roles.py"
    module = _parse(text, where)
    if "QUEUE" not in pyedit.class_members(_class(module, "DatabaseRole", where)):
        raise Missing(f"{where}: `class DatabaseRole` has no `QUEUE` member")
    if "ORG" not in pyedit.class_members(_class(module, "TenancyScope", where)):
        raise Missing(f"{where}: `class TenancyScope` has no `ORG` member")
    module = _dict_add(module, "TABLE_ROLES", '"work_items"', "DatabaseRole.QUEUE", where)
    module = _dict_add(module, "TABLE_SCOPES", '"work_items"', "TenancyScope.ORG", where)
    module = _dict_add(module, "TABLE_ROLES", '"work_lane_pauses"', "DatabaseRole.QUEUE", where)
    module = _dict_add(module, "TABLE_SCOPES", '"work_lane_pauses"', "TenancyScope.GLOBAL", where)
    module = _dict_add(module, "TABLE_ROLES", '"work_schedules"', "DatabaseRole.QUEUE", where)
    module = _dict_add(module, "TABLE_SCOPES", '"work_schedules"', "TenancyScope.ORG", where)
    module = _dict_add(module, "TABLE_ROLES", '"work_workers"', "DatabaseRole.QUEUE", where)
    module = _dict_add(module, "TABLE_SCOPES", '"work_workers"', "TenancyScope.GLOBAL", where)
    return module.code


def edit_storage_root(text: str, spec: Spec, limit: int) -> str:
    """`storage/root.py`: the abstract `get_work_storage()` on `StorageRootInterface`."""
    where = f"{spec.om}/storage/root.py"
    module = _parse(text, where)
    cls, done, documented = _storage_getter(module, "StorageRootInterface", where)
    if done:
        return text
    doc = (
        '    """The `work` namespace\'s storage: the queue table."""\n'
        if documented
        else "    ...\n"
    )
    module = _add_method(
        module, cls, f"@abstractmethod\ndef get_work_storage(self) -> WorkStorageInterface:\n{doc}"
    )
    module = _import(module, f"{spec.pkg}.work.storage", "WorkStorageInterface", limit, where)
    return module.code


def edit_sql_root(text: str, spec: Spec, limit: int) -> str:
    """`storage/impl/sql.py`: the PostgreSQL or SQLite work storage by the funnel's dialect.

    Built once per root (a `cached_property`, as the interface promises one instance per
    root), placed after the root's other cached storages, and returned by the getter.
    """
    where = f"{spec.om}/storage/impl/sql.py"
    module = _parse(text, where)
    cls, done, documented = _storage_getter(module, "SqlStorageRoot", where)
    if "self._funnel" not in module.code_for_node(cls):
        raise Missing(f"{where}: `class SqlStorageRoot` keeps no `self._funnel`")
    if done:
        return text
    prop = pyedit.stmt(
        "@cached_property\n"
        "def _work(self) -> WorkStorageInterface:\n"
        '    if self._funnel.dialect == "postgresql":\n'
        f"        return {POSTGRES_STORAGE[1]}(self._funnel)\n"
        f"    return {SQLITE_STORAGE[1]}(self._funnel)\n"
    ).with_changes(leading_lines=[cst.EmptyLine(indent=False)])
    if pyedit.find_function(cls.body.body, "_work") is None:
        items = list(cls.body.body)
        cached = [
            i
            for i, s in enumerate(items)
            if isinstance(s, cst.FunctionDef)
            and any(
                "cached_property" in cst.Module([]).code_for_node(d.decorator) for d in s.decorators
            )
        ]
        getters = [
            i
            for i, s in enumerate(items)
            if isinstance(s, cst.FunctionDef) and re.fullmatch(r"get_\w+_storage", s.name.value)
        ]
        at = cached[-1] + 1 if cached else getters[0]
        items.insert(at, prop)
        module = pyedit.replace(
            module, cls, cls.with_changes(body=cls.body.with_changes(body=items))
        )
        cls = _class(module, "SqlStorageRoot", where)
    doc = '    """The `work` namespace\'s storage, built for the funnel\'s dialect."""\n'
    module = _add_method(
        module,
        cls,
        "def get_work_storage(self) -> WorkStorageInterface:\n"
        + (doc if documented else "")
        + "    return self._work\n",
    )
    module = _import(module, "functools", "cached_property", limit, where)
    module = _import(module, f"{spec.pkg}.work.storage", "WorkStorageInterface", limit, where)
    for mod, name in (POSTGRES_STORAGE, SQLITE_STORAGE):
        module = _import(module, f"{spec.pkg}.{mod}", name, limit, where)
    return module.code


def edit_memory_root(text: str, spec: Spec, limit: int) -> str:
    """`storage/impl/memory.py`: one memory work storage, kept for the root's lifetime."""
    where = f"{spec.om}/storage/impl/memory.py"
    module = _parse(text, where)
    cls, done, documented = _storage_getter(module, "MemoryStorageRoot", where)
    init = pyedit.find_function(cls.body.body, "__init__")
    if init is None or not isinstance(init.body, cst.IndentedBlock):
        raise Missing(f"{where}: `class MemoryStorageRoot` has no `__init__`")
    if done:
        return text
    keep = pyedit.stmt(f"self._work = {MEMORY_STORAGE[1]}()\n")
    body = pyedit.insert_after_last(
        init.body.body,
        keep,
        lambda s: pyedit.is_simple(cst.Assign)(s) and "self._" in cst.Module([]).code_for_node(s),
    )
    new_init = init.with_changes(body=init.body.with_changes(body=body))
    cls2 = pyedit.replace(cls, init, new_init)
    module = pyedit.replace(module, cls, cls2)
    cls2 = _class(module, "MemoryStorageRoot", where)
    doc = '    """The memory work storage this root keeps."""\n' if documented else ""
    module = _add_method(
        module,
        cls2,
        f"def get_work_storage(self) -> WorkStorageInterface:\n{doc}    return self._work\n",
    )
    module = _import(module, f"{spec.pkg}.work.storage", "WorkStorageInterface", limit, where)
    module = _import(module, f"{spec.pkg}.{MEMORY_STORAGE[0]}", MEMORY_STORAGE[1], limit, where)
    return module.code


def _call_name(node: cst.CSTNode | None) -> str:
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
        return node.func.value
    return ""


def _assign_of_call(body: list[cst.BaseStatement], callee: str) -> tuple[int, str, cst.Call] | None:
    for i, statement in enumerate(body):
        if pyedit.is_simple(cst.Assign)(statement):
            small = statement.body[0]  # type: ignore[attr-defined]
            target = small.targets[0].target
            if _call_name(small.value) == callee and isinstance(target, cst.Name):
                return i, target.value, small.value
    return None


def edit_om_root(text: str, spec: Spec, limit: int) -> str:
    """`om/root.py`: the work manager built before the relay, passed to it and to Managers."""
    where = f"{spec.om}/root.py"
    module = _parse(text, where)
    managers = _class(module, "Managers", where)
    if not isinstance(managers.body, cst.IndentedBlock):
        raise Missing(f"{where}: `class Managers` has its body on the `class` line")
    fn = pyedit.find_function(module.body, "build_managers")
    if fn is None or not isinstance(fn.body, cst.IndentedBlock):
        raise Missing(f"{where}: no top-level `def build_managers(storage, infra)`")
    params = [p.name.value for p in fn.params.params]
    if len(params) < 2:
        raise Missing(f"{where}: `build_managers` does not take (storage, infra)")
    storage, infra = params[0], params[1]
    body = list(fn.body.body)
    found = {
        c: _assign_of_call(body, c)
        for c in ("TenancyManagerImpl", "AuditManagerImpl", "OutboxRelayImpl")
    }
    for callee, hit in found.items():
        if hit is None:
            raise Missing(f"{where}: `build_managers` has no `<name> = {callee}(...)` assignment")
    returns = [
        i
        for i, s in enumerate(body)
        if pyedit.is_simple(cst.Return)(s) and _call_name(s.body[0].value) == "Managers"  # type: ignore[attr-defined]
    ]
    if not returns:
        raise Missing(f"{where}: `build_managers` does not end with `return Managers(...)`")
    # 1. the field
    if "work" not in pyedit.class_members(managers):
        field = pyedit.stmt("work: WorkManagerInterface\n")
        items = list(managers.body.body)
        at = len(items)
        last_field = -1
        for i, s in enumerate(items):
            if pyedit.is_simple(cst.AnnAssign)(s):
                if s.body[0].value is not None and at == len(items):  # type: ignore[attr-defined]
                    at = i  # a defaulted field: ours goes before it
                last_field = i
        at = min(at, last_field + 1) if last_field >= 0 else at
        items.insert(at, field)
        module = pyedit.replace(
            module, managers, managers.with_changes(body=managers.body.with_changes(body=items))
        )
        fn = pyedit.find_function(module.body, "build_managers")
        assert fn is not None and isinstance(fn.body, cst.IndentedBlock)
        body = list(fn.body.body)
    # 2. the assignment before the relay
    if _assign_of_call(body, "WorkManagerImpl") is None:
        tenancy = found["TenancyManagerImpl"][1]  # type: ignore[index]
        audit = found["AuditManagerImpl"][1]  # type: ignore[index]
        args = [
            f"{storage}.get_work_storage()",
            f"tenancy={tenancy}",
            f"audit={audit}",
            f"topics={infra}.topics",
        ]
        one = f"work = WorkManagerImpl({', '.join(args)})"
        code = (
            one
            if len(one) + 4 <= limit
            else "work = WorkManagerImpl(\n" + "".join(f"    {a},\n" for a in args) + ")"
        )
        relay_at = _assign_of_call(body, "OutboxRelayImpl")
        assert relay_at is not None
        body.insert(relay_at[0], pyedit.stmt(code + "\n"))
    # 3. work=work to the relay and to Managers
    for callee in ("OutboxRelayImpl", "Managers"):
        for i, s in enumerate(body):
            small = s.body[0] if isinstance(s, cst.SimpleStatementLine) else None
            value = getattr(small, "value", None)
            if isinstance(value, cst.Call) and _call_name(value) == callee:
                new_call = pyedit.call_add_kwarg(value, "work", "work")
                if new_call is not value:
                    new_stmt = pyedit.replace(s, value, new_call)
                    body[i] = pyedit.fit(module, new_stmt, _find_call(new_stmt, callee), 4, limit)
    module = pyedit.replace(module, fn, fn.with_changes(body=fn.body.with_changes(body=body)))
    module = _import(module, f"{spec.pkg}.work", "WorkManagerInterface", limit, where)
    module = _import(module, f"{spec.pkg}.work.impl.manager", "WorkManagerImpl", limit, where)
    return module.code


def _find_call(statement: cst.CSTNode, callee: str) -> cst.Call:
    found: list[cst.Call] = []

    class Finder(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if _call_name(node) == callee:
                found.append(node)

    statement.visit(Finder())
    return found[0]


def edit_relay(text: str, spec: Spec, limit: int) -> str:
    """`outbox/impl/relay.py`: the relay takes the work manager; the `work.` branch."""
    where = f"{spec.om}/outbox/impl/relay.py"
    module = _parse(text, where)
    cls = _class(module, "OutboxRelayImpl", where)
    init = pyedit.find_function(cls.body.body, "__init__")
    dispatch = pyedit.find_function(cls.body.body, "_dispatch")
    if init is None or not isinstance(init.body, cst.IndentedBlock):
        raise Missing(f"{where}: `class OutboxRelayImpl` has no `__init__`")
    if dispatch is None or not isinstance(dispatch.body, cst.IndentedBlock):
        raise Missing(f"{where}: `class OutboxRelayImpl` has no `_dispatch(self, row)`")
    if (
        not dispatch.body.body
        or not isinstance(dispatch.body.body[-1], cst.SimpleStatementLine)
        or not isinstance(dispatch.body.body[-1].body[0], cst.Raise)
    ):
        raise Missing(f"{where}: `OutboxRelayImpl._dispatch` does not end with a `raise`")
    row = dispatch.params.params[1].name.value if len(dispatch.params.params) > 1 else "row"
    new_cls = cls
    names = [p.name.value for p in (*init.params.params, *init.params.kwonly_params)]
    if "work" not in names:
        param = cst.Param(
            name=cst.Name("work"), annotation=cst.Annotation(pyedit.expr("WorkManagerInterface"))
        )
        params = init.params
        star = (
            params.star_arg
            if isinstance(params.star_arg, cst.Param | cst.ParamStar)
            else cst.ParamStar()
        )
        new_params = params.with_changes(
            star_arg=star, kwonly_params=[*params.kwonly_params, param]
        )
        new_init = _explode_params(init.with_changes(params=new_params))
        assign = pyedit.stmt("self._work = work\n")
        body = pyedit.insert_after_last(
            init.body.body,  # `_explode_params` changes the parameters only
            assign,
            lambda s: (
                pyedit.is_simple(cst.Assign)(s) and "self._" in cst.Module([]).code_for_node(s)
            ),
        )
        new_init = new_init.with_changes(body=init.body.with_changes(body=body))
        new_cls = pyedit.replace(new_cls, init, new_init)
    if 'startswith("work.")' not in module.code_for_node(dispatch):
        branch = pyedit.stmt(
            f'if {row}.kind.startswith("work."):\n'
            f"    await self._work.enqueue_relayed({row}.org_id, {row})\n"
            "    return\n"
        )
        items = list(dispatch.body.body)
        branch = branch.with_changes(leading_lines=dispatch.body.body[-1].leading_lines)
        items.insert(len(items) - 1, branch)
        current = pyedit.find_function(new_cls.body.body, "_dispatch")
        assert current is not None
        new_cls = pyedit.replace(
            new_cls, current, current.with_changes(body=current.body.with_changes(body=items))
        )
    if new_cls is cls:
        return text
    module = pyedit.replace(module, cls, new_cls)
    module = _import(module, f"{spec.pkg}.work", "WorkManagerInterface", limit, where)
    return module.code


def _explode_params(fn: cst.FunctionDef) -> cst.FunctionDef:
    """One parameter per line with a magic trailing comma (ruff format keeps it)."""
    p = fn.params
    ordered: list[tuple[str, cst.CSTNode]] = [("params", x) for x in p.params]
    if isinstance(p.star_arg, cst.Param | cst.ParamStar):
        ordered.append(("star_arg", p.star_arg))
    ordered += [("kwonly_params", x) for x in p.kwonly_params]
    rebuilt: dict[str, list[cst.CSTNode]] = {"params": [], "star_arg": [], "kwonly_params": []}
    for i, (slot, node) in enumerate(ordered):
        last = i == len(ordered) - 1
        comma = cst.Comma(whitespace_after=pyedit._nl_ws("" if last else pyedit.INDENT))
        changes: dict[str, object] = {"comma": comma}
        if isinstance(node, cst.Param):
            changes["whitespace_after_param"] = cst.SimpleWhitespace("")
        rebuilt[slot].append(node.with_changes(**changes))
    params = p.with_changes(
        params=rebuilt["params"],
        star_arg=rebuilt["star_arg"][0] if rebuilt["star_arg"] else p.star_arg,
        kwonly_params=rebuilt["kwonly_params"],
    )
    return fn.with_changes(params=params, whitespace_before_params=pyedit._nl_ws(pyedit.INDENT))


def edit_topics(text: str, spec: Spec, limit: int) -> str:
    """`infra/topics`: `Topics.WORK_AVAILABLE`, its payload and `TOPIC_PAYLOADS` entry."""
    where = f"infra/src/{spec.host_root}/infra/topics/__init__.py"
    module = _parse(text, where)
    module = _enum_add(module, "Topics", "WORK_AVAILABLE", "work.available", where)
    if pyedit.find_class(module, "WorkAvailablePayload") is None:
        anchor = pyedit.find_assignment(module, "TOPIC_PAYLOADS")
        if anchor is None:
            raise Missing(f"{where}: no top-level `TOPIC_PAYLOADS = {{...}}`")
        frozen = "ConfigDict(frozen=True)" in text
        code = (
            "class WorkAvailablePayload(BaseModel):\n"
            '    """Work of `kind` became available on `lane`; idle workers of that lane claim."""\n\n'
            + ("    model_config = ConfigDict(frozen=True)\n\n" if frozen else "")
            + "    lane: str\n    kind: str\n"
        )
        two = [cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)]
        body = list(module.body)
        at = body.index(anchor)
        comments = [line for line in anchor.leading_lines if line.comment is not None]
        body[at] = anchor.with_changes(leading_lines=[*two, *comments])
        body.insert(at, pyedit.stmt(code).with_changes(leading_lines=two))
        module = module.with_changes(body=body)
    module = _dict_add(
        module, "TOPIC_PAYLOADS", "Topics.WORK_AVAILABLE", "WorkAvailablePayload", where
    )
    return module.code


def edit_cache(text: str, spec: Spec, limit: int) -> str:
    """`infra/cache`: `CacheScope.WORKER_LIVENESS`, the scope the liveness key lives under."""
    where = f"infra/src/{spec.host_root}/infra/cache/__init__.py"
    module = _parse(text, where)
    return _enum_add(module, "CacheScope", "WORKER_LIVENESS", "worker_liveness", where).code


def edit_request_stage(text: str, spec: Spec, limit: int) -> str:
    """`om/tests/unit/test_request_stage.py`: the work manager's request-stage methods."""
    where = "om/tests/unit/test_request_stage.py"
    module = _parse(text, where)
    statement = pyedit.find_assignment(module, "REQUEST_STAGE_METHODS")
    if statement is None:
        raise Missing(f"{where}: no top-level `REQUEST_STAGE_METHODS = ...`")
    value = pyedit.assigned_value(statement)
    literal = value
    if isinstance(value, cst.Call) and len(value.args) == 1:
        literal = value.args[0].value
    if not isinstance(literal, cst.List | cst.Set | cst.Tuple) or not literal.elements:
        raise Missing(
            f"{where}: `REQUEST_STAGE_METHODS` is not a non-empty list, set or tuple literal"
        )
    sample = literal.elements[0].value
    new = literal
    for method in REQUEST_STAGE:
        if isinstance(sample, cst.SimpleString):
            inner = sample.evaluated_value
            # a bytes literal (b"...") is the host's choice: the new entries are bytes too
            dots = inner.count(".") if isinstance(inner, str) else inner.count(b".")
            prefix = f"{spec.pkg}.work." if dots > 1 else ""
            bytes_prefix = sample.prefix if isinstance(inner, bytes) else ""
            quote = sample.quote
            entry = f"{bytes_prefix}{quote}{prefix}WorkManagerInterface.{method}{quote}"
        elif isinstance(sample, cst.Tuple):
            entry = f'(WorkManagerInterface, "{method}")'
        else:
            entry = f"WorkManagerInterface.{method}"
        new = pyedit.sequence_append(new, entry)
    if new is literal:
        return text
    exploded = "\n" in module.code_for_node(literal)
    module = pyedit.replace(module, literal, new if exploded else pyedit.explode(new))
    if not isinstance(sample, cst.SimpleString):
        module = _import(module, f"{spec.pkg}.work", "WorkManagerInterface", limit, where)
    return module.code


def api_main(spec: Spec) -> str:
    """The host API's app module, where `create_app` mounts the work router."""
    return f"services/api/src/{spec.host_root}/services/api/main.py"


def _api_mount_problem(text: str, where: str) -> tuple[cst.Module, cst.FunctionDef, int] | str:
    """`create_app`, and the index in its body of the first `<app>.include_router(...)`
    line, or why the work router cannot be mounted after it."""
    try:
        module = _parse(text, where)
    except Missing as exc:
        return str(exc)
    fn = pyedit.find_function(module.body, "create_app")
    if fn is None or not isinstance(fn.body, cst.IndentedBlock):
        return f"{where}: no top-level `def create_app(...)`"
    for at, statement in enumerate(fn.body.body):
        if ".include_router(" in module.code_for_node(statement):
            return module, fn, at
    return f"{where}: `create_app` has no `<app>.include_router(...)` line"


def skip_api_mount(host: Path, spec: Spec) -> str | None:
    """Why the host's API does without the work router (None: it gets it): the router
    needs `services/api`'s `create_app` and the membership lookup `member_role` of the
    tenancy manager (docs/host-contract.md, "The work API")."""
    fix = "the work API is not mounted (docs/host-contract.md, The work API)"
    main = host / api_main(spec)
    if not main.is_file():
        return f"{api_main(spec)} does not exist: {fix}"
    tenancy = host / spec.om / "tenancy" / "manager.py"
    text = tenancy.read_text(encoding="utf-8") if tenancy.is_file() else ""
    for method in ("member_role", "grant_membership"):
        if f"def {method}(" not in text:
            return f"{spec.om}/tenancy/manager.py has no `{method}` (memberships): {fix}"
    found = _api_mount_problem(main.read_text(encoding="utf-8"), api_main(spec))
    return f"{found}: {fix}" if isinstance(found, str) else None


def edit_api_mount(text: str, spec: Spec, limit: int) -> str:
    """`services/api/.../main.py`: `mount_work(<app>)` after `create_app`'s first
    `<app>.include_router(...)` line, and its import."""
    where = api_main(spec)
    found = _api_mount_problem(text, where)
    if isinstance(found, str):
        raise Missing(found)
    module, fn, at = found
    body = fn.body
    if "mount_work(" not in module.code_for_node(fn) and isinstance(body, cst.IndentedBlock):
        receiver = module.code_for_node(body.body[at]).strip().split(".include_router(")[0]
        lines = list(body.body)
        lines.insert(at + 1, pyedit.stmt(f"mount_work({receiver})"))
        module = pyedit.replace(module, fn, fn.with_changes(body=body.with_changes(body=lines)))
    module = _import(module, f"{spec.host_root}.services.api.work", "mount_work", limit, where)
    return module.code


# --- text fragments between markers ------------------------------------------------------


def _between(text: str, start: str, end: str, line: str, where: str) -> str:
    lines = text.splitlines(keepends=True)
    try:
        i = next(n for n, l in enumerate(lines) if l.strip() == start)
        j = next(n for n, l in enumerate(lines) if n > i and l.strip() == end)
    except StopIteration as exc:
        raise Missing(f"{where}: no `{start}` ... `{end}` marker lines") from exc
    if any(l.rstrip("\n") == line for l in lines[i:j]):
        return text
    # after the region's last line, above the blank lines a markdown formatter may have put
    # before the end marker (docs/updating.md, "Formatters")
    while j - 1 > i and not lines[j - 1].strip():
        j -= 1
    lines.insert(j, line + "\n")
    return "".join(lines)


def dev_line(spec: Spec) -> str:
    """`run <name> <command...>`, the form scripts/dev.sh gives every process."""
    return f"run {spec.worker_name} uv run --all-packages {spec.worker_name} serve"


def edit_dev_script(text: str, spec: Spec, limit: int) -> str:
    """`scripts/dev.sh`: the worker started with the other local processes."""
    return _between(text, "# >>> processes", "# <<< processes", dev_line(spec), "scripts/dev.sh")


def env_block(spec: Spec, metrics_port: int = METRICS_PORT_BASE) -> str:
    """The `.env.example` block of one worker: a header, then `<PREFIX><FIELD>=<value>`."""
    prefix = spec.names["worker_env_prefix"]
    lines = [f"# --- worker {spec.worker_name} ---"]
    lines += [
        f"{prefix}{field.upper()}={value.format(lane=spec.lane, metrics_port=metrics_port)}"
        for field, value in WORKER_SETTINGS
    ]
    return "\n".join(lines) + "\n"


def edit_env(text: str, spec: Spec, limit: int) -> str:
    """`.env.example`: every field of the worker's settings under its prefix, local values."""
    header = f"# --- worker {spec.worker_name} ---"
    if any(line.strip() == header for line in text.splitlines()):
        return text
    others = sum(1 for line in text.splitlines() if line.startswith("# --- worker "))
    port = spec.metrics_port or METRICS_PORT_BASE + others  # answers before `metrics_port`
    sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
    return text + sep + env_block(spec, port)


def kind_env_block(spec: Spec) -> str:
    """The `.env.example` block of a kind added to a worker: a header naming both, then the
    kind's capacity under the worker's prefix (`host_workers.kind_env_regions` finds it)."""
    prefix = spec.names["worker_env_prefix"]
    return (
        f"{host_workers.kind_env_header(spec.work_kind, spec.worker_name)}\n"
        f"{prefix}KIND_CAPACITY__{spec.work_kind}={ADDED_KIND_CAPACITY}\n"
    )


def edit_kind_env(text: str, spec: Spec, limit: int) -> str:
    """`.env.example`: the added kind's block, after everything else."""
    header = host_workers.kind_env_header(spec.work_kind, spec.worker_name)
    if any(line.strip() == header for line in text.splitlines()):
        return text
    sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
    return text + sep + kind_env_block(spec)


def create_om_readme(spec: Spec) -> str:
    """A host without `om/README.md` gets one that starts the list of namespaces."""
    return f"# {spec.pkg}: the operational model\n\nOne namespace per folder:\n\n"


def edit_om_readme(text: str, spec: Spec, limit: int) -> str:
    """`om/README.md`: a link to the new namespace's README (one level below)."""
    target = f"src/{spec.host_root}/om/work/README.md"
    if f"]({target})" in text:
        return text
    lines = text.splitlines(keepends=True)
    link = re.compile(
        rf"^(\s*[-*] )\[[^\]]+\]\(src/{re.escape(spec.host_root)}/om/\w+/README\.md\)"
    )
    at = [n for n, l in enumerate(lines) if link.match(l)]
    entry = f"[work]({target}): the work queue, its items, kinds and statuses"
    if at:
        bullet = link.match(lines[at[-1]]).group(1)  # type: ignore[union-attr]
        lines.insert(at[-1] + 1, f"{bullet}{entry}\n")
        return "".join(lines)
    sep = "" if text.endswith("\n\n") or not text else ("\n" if text.endswith("\n") else "\n\n")
    return text + sep + f"- {entry}\n"


KINDS_START, KINDS_END = host_workers.KINDS_START, host_workers.KINDS_END
# prettier keeps the kinds list as the patcher writes it (work/README.md.jinja renders the same)
IGNORE_START, IGNORE_END = "<!-- prettier-ignore-start -->", "<!-- prettier-ignore-end -->"


def edit_work_readme(text: str, spec: Spec, limit: int) -> str:
    """`work/README.md` (existing namespace): the new kind named between the kind markers."""
    line = host_workers.kind_line(spec.work_kind, spec.worker_name)
    if KINDS_START not in text:
        sep = "" if text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
        text = (
            text + sep + f"## Kinds\n\n{IGNORE_START}\n{KINDS_START}\n{KINDS_END}\n{IGNORE_END}\n"
        )
    return _between(text, KINDS_START, KINDS_END, line, f"{spec.om}/work/README.md")


# --- the plan -----------------------------------------------------------------------------


def fragments(spec: Spec) -> list[Fragment]:
    """The fragments this worker applies, in order (namespace rows only for its owner); a
    kind added to a worker applies its kind's alone."""
    om = spec.om
    infra = f"infra/src/{spec.host_root}/infra"
    if spec.added_kind:
        return [
            Fragment(
                "work kind", lambda s: f"{om}/work/types/kinds.py", edit_kinds, create=create_kinds
            ),
            Fragment("kind env example", lambda s: ".env.example", edit_kind_env),
            Fragment("work readme", lambda s: f"{om}/work/README.md", edit_work_readme),
        ]
    plan = [
        Fragment("workspace member", lambda s: "pyproject.toml", edit_workspace),
        Fragment(
            "work kind", lambda s: f"{om}/work/types/kinds.py", edit_kinds, create=create_kinds
        ),
        Fragment("topic", lambda s: f"{infra}/topics/__init__.py", edit_topics),
        Fragment("cache scope", lambda s: f"{infra}/cache/__init__.py", edit_cache),
        Fragment("dev script", lambda s: "scripts/dev.sh", edit_dev_script),
        Fragment("env example", lambda s: ".env.example", edit_env),
    ]
    if spec.namespace_absent:
        plan += [
            Fragment("tenantless", lambda s: "pyproject.toml", edit_tenantless),
            Fragment("roles", lambda s: f"{om}/storage/roles.py", edit_roles),
            Fragment("storage root", lambda s: f"{om}/storage/root.py", edit_storage_root),
            Fragment("sql storage root", lambda s: f"{om}/storage/impl/sql.py", edit_sql_root),
            Fragment(
                "memory storage root", lambda s: f"{om}/storage/impl/memory.py", edit_memory_root
            ),
            Fragment("managers", lambda s: f"{om}/root.py", edit_om_root),
            Fragment("relay", lambda s: f"{om}/outbox/impl/relay.py", edit_relay),
            Fragment(
                "request stage", lambda s: "om/tests/unit/test_request_stage.py", edit_request_stage
            ),
            Fragment(
                "om readme", lambda s: "om/README.md", edit_om_readme, create=create_om_readme
            ),
            Fragment("work api mount", api_main, edit_api_mount, skip=skip_api_mount),
        ]
    else:
        plan.append(Fragment("work readme", lambda s: f"{om}/work/README.md", edit_work_readme))
    plan += [
        Fragment(edit.name, _fixed_path(edit.path), _deploy_edit(edit.edit))
        for edit in deploy.fragments(spec, WORKER_SETTINGS)
    ]
    # The host's update helpers: scripts/workers.py, the Makefile targets, the CI job
    # (extensions/lifecycle.py; docs/updating.md).
    plan += [
        Fragment(
            edit.name,
            _fixed_path(edit.path),
            _lifecycle_edit(edit.edit),
            create=_lifecycle_create(edit.create) if edit.create else None,
        )
        for edit in lifecycle.fragments(spec)
    ]
    return plan


def _fixed_path(path: str) -> Callable[[Spec], str]:
    """A fragment's `path` that is the same for every spec."""
    return lambda spec: path


def _lifecycle_create(make: Callable[[], str]) -> Callable[[Spec], str]:
    """A lifecycle fragment's content when its file is absent, as a patcher `create`."""
    return lambda spec: make()


def _lifecycle_edit(edit: Callable[[str], str]) -> Callable[[str, Spec, int], str]:
    """A lifecycle fragment (extensions/lifecycle.py) as a patcher edit, refusals as `Missing`."""

    def run(text: str, spec: Spec, limit: int) -> str:
        try:
            return edit(text)
        except lifecycle.Missing as exc:
            raise Missing(str(exc)) from exc

    return run


def _deploy_edit(edit: Callable[[str], str]) -> Callable[[str, Spec, int], str]:
    """A deployment fragment (extensions/deploy.py) as a patcher edit, its refusals as `Missing`."""

    def run(text: str, spec: Spec, limit: int) -> str:
        try:
            return edit(text)
        except deploy.Missing as exc:
            raise Missing(str(exc)) from exc

    return run


def line_length(host: Path) -> int:
    """`[tool.ruff] line-length` of the host (ruff's default 88 when unset).

    Parsed once per version of the file: copier's context hook asks on every render."""
    path = host / "pyproject.toml"
    try:
        stamp = path.stat()
    except OSError:
        return 88
    return _line_length_at(str(path), stamp.st_mtime_ns, stamp.st_size)


@functools.lru_cache(maxsize=16)
def _line_length_at(path: str, mtime_ns: int, size: int) -> int:
    """`line_length` of the pyproject.toml at `path` as of `mtime_ns` and `size`."""
    del mtime_ns, size  # part of the cache key only
    import tomllib

    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return 88
    return int(data.get("tool", {}).get("ruff", {}).get("line-length", 88))


def check_host(host: Path, spec: Spec) -> list[str]:
    """Every `<file>: <missing part>` that would stop a fragment ([] when all can apply)."""
    if MISSING_DEPS:
        return [f"copier's Python lacks the module {MISSING_DEPS!r}: {INSTALL_HINT}"]
    limit = line_length(host)
    spec = dataclasses.replace(spec, line_length=limit)
    problems: list[str] = []
    for fragment in fragments(spec):
        try:
            fragment.check(host, spec, limit)
        except Missing as exc:
            problems.append(str(exc))
    if not spec.namespace_absent and not (host / spec.om / "work" / "types" / "kinds.py").is_file():
        problems.append(f"{spec.om}/work/types/kinds.py: the file does not exist")
    problems += deploy.check_terraform(host, spec)
    return problems


def host_spec(host: Path, spec: Spec) -> Spec:
    """`spec` with what the host decides: its line length, whether its namespace has
    `claim_many`, and its storage interface's tenant-less methods."""
    storage = host / spec.om / "work" / "storage" / "__init__.py"
    text = storage.read_text(encoding="utf-8") if storage.is_file() else ""
    return dataclasses.replace(
        spec,
        storage_has_claim_many="def claim_many(" in text,
        storage_tenantless=tenantless_methods(text),
        line_length=line_length(host),
    )


def tenantless_methods(source: str) -> tuple[str, ...]:
    """The abstract methods of `WorkStorageInterface` in `source` without an `org_id`
    parameter, as the host's arch check (CTX-12) finds them; () for no such class."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ()
    names: list[str] = []
    for cls in tree.body:
        if not (isinstance(cls, ast.ClassDef) and cls.name == "WorkStorageInterface"):
            continue
        for node in cls.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            abstract = any(
                (isinstance(d, ast.Name) and d.id == "abstractmethod")
                or (isinstance(d, ast.Attribute) and d.attr == "abstractmethod")
                for d in node.decorator_list
            )
            args = node.args
            params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
            if abstract and "org_id" not in params:
                names.append(node.name)
    return tuple(names)


def existing(host: Path, spec: Spec) -> frozenset[str]:
    """The files the fragments edit that exist before they are applied, so that the report
    says `created` for the others."""
    spec = host_spec(host, spec)
    paths = (fragment.path(spec) for fragment in fragments(spec))
    return frozenset(path for path in paths if (host / path).exists())


def apply(host: Path, spec: Spec, *, skip: frozenset[str] = frozenset()) -> list[str]:
    """Apply every fragment, except to the files in `skip` (conflicted by the merge);
    returns the files changed. Raises `Missing` on the first gap."""
    spec = host_spec(host, spec)
    changed: list[str] = []
    for fragment in fragments(spec):
        if fragment.path(spec) in skip:
            continue
        if fragment.apply(host, spec, spec.line_length):
            changed.append(fragment.path(spec))
    return sorted(set(changed))


TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "template"
KIND_DIR = TEMPLATE_DIR.with_name("kind")  # a kind added to a worker (copier.yml `added_kind`)


def rendered_paths(answers: dict[str, Any]) -> list[str]:
    """Every host path copier writes for these answers (the template's path names rendered).

    `answers` holds the questions and the `ask: false` values (an answers file has them all).
    Jinja is copier's own dependency; a path with an empty segment is not rendered.
    """
    import jinja2

    names = naming.derive_names(
        worker_name=str(answers.get("worker_name") or ""),
        work_kind=str(answers.get("work_kind") or ""),
    )
    added = answers.get("added_kind") is True
    answers_file = host_workers.answers_path(
        str(answers.get("worker_name")), str(answers.get("work_kind")) if added else None
    )
    context = {**answers, **names, "_copier_conf": {"answers_file": answers_file}}
    env = jinja2.Environment(undefined=jinja2.ChainableUndefined)
    found: set[str] = set()
    root = KIND_DIR if added else TEMPLATE_DIR
    for path in sorted(root.rglob("*")):
        if path.is_dir() or "__pycache__" in path.parts:
            continue
        parts = [env.from_string(part).render(context) for part in path.relative_to(root).parts]
        parts[-1] = parts[-1].removesuffix(".jinja")
        if any(not part for part in parts) or path.suffix in {".pyc", ".pyo"}:
            continue
        found.add("/".join(parts))
    return sorted(found)


def touched_paths(host: Path, answers: dict[str, Any]) -> list[str]:
    """Every host path a copy with these answers writes (copier) or patches (fragments)."""
    spec = Spec.from_answers(answers)
    patched = {fragment.path(spec) for fragment in fragments(spec)} if not MISSING_DEPS else set()
    return sorted(set(rendered_paths(answers)) | patched)


def undo_copy(host: Path, paths: list[str]) -> list[str]:
    """Put every path a failed copy wrote back as committed (the copy's preflight found them
    all clean): tracked ones from `HEAD`, new ones deleted. Returns the paths put back."""
    import subprocess

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=host, capture_output=True, text=True, check=False)

    changed = [
        line[3:]
        for line in git(
            "status", "--porcelain", "--untracked-files=all", "--no-renames", "--", *paths
        ).stdout.splitlines()
        if line.strip()
    ]
    tracked = set(git("ls-tree", "-r", "--name-only", "HEAD", "--", *changed).stdout.split("\n"))
    restore = [p for p in changed if p in tracked]
    if restore:
        git("checkout", "HEAD", "--", *restore)
    for rel in changed:
        if rel in tracked:
            continue
        target = host / rel
        if target.is_file() or target.is_symlink():
            target.unlink()
        parent = target.parent
        while parent != host and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    return changed


# --- update: each region merged three ways ------------------------------------------------

# The labels of copier's own conflict markers, so the host helper finds ours the same way.
MERGE_LABELS = ("before updating", "last update", "after updating")


@dataclass(frozen=True)
class Previous:
    """The worker as the last copy or update left it: its answers and that template's
    patcher (loaded from the template repository at the recorded commit)."""

    answers: dict[str, Any]
    patcher: ModuleType


def committed_answers(host: Path, answers_file: str) -> dict[str, Any] | None:
    """The worker's answers as committed (`HEAD:<answers_file>`; copier updates only a clean
    tree), or None when that file is not in `HEAD`."""
    import subprocess

    import yaml

    shown = subprocess.run(
        ["git", "show", f"HEAD:{answers_file}"],
        cwd=host,
        capture_output=True,
        text=True,
        check=False,
    )
    if shown.returncode != 0:
        return None
    loaded = yaml.safe_load(shown.stdout)
    return loaded if isinstance(loaded, dict) else {}


def moved_lane(host: Path, answers_file: str, spec: Spec) -> list[str]:
    """The command that moves the items an update stranded, when it moved the worker's lane
    (`HEAD:<answers_file>` recorded another): items enqueued before wait on the old lane,
    which no worker claims any more. A copier task cannot count rows in the user's
    database; `serve` does, at start and every sweep pass. [] when the lane is unchanged."""
    before = committed_answers(host, answers_file)
    old = str(before.get("lane") or "default") if before else ""
    if not old or old == spec.lane:
        return []
    command = f"uv run --all-packages {spec.worker_name} items move --from-lane {old}"
    note = (
        f"the lane moved from {old} to {spec.lane}: items enqueued before wait on {old}, "
        f"unclaimed; once this release runs, move them: `{command} --dry-run`, then "
        "without --dry-run (with --operator NAME on a database server)"
    )
    return [note]


def previous_render(host: Path, answers_file: str) -> Previous | str:
    """The previous answers (the committed answers file: copier updates only a clean tree)
    and the patcher of the template version they record, or why they cannot be had.

    The template repository is the one this patcher runs from (copier's clone holds the
    recorded commit); its `extensions/` at that commit go to a temporary folder and load
    under names of their own, so the two versions never share a module.
    """
    import subprocess
    import tarfile
    import tempfile

    answers = committed_answers(host, answers_file)
    if answers is None:
        return f"{answers_file} is not committed"
    commit = str(answers.get("_commit") or "")
    repo = Path(__file__).resolve().parent.parent
    archive = subprocess.run(
        ["git", "archive", "--format=tar", f"{commit}^{{commit}}", "extensions"],
        cwd=repo,
        capture_output=True,
        check=False,
    )
    if not commit or archive.returncode != 0:
        return f"the template's commit {commit or '(none recorded)'} is not in {repo}"
    folder = Path(tempfile.mkdtemp(prefix="worker-template-previous-"))
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    path = folder / "extensions" / "patcher.py"
    key = f"_worker_template_previous_{hashlib.sha1(str(folder).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(key, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return Previous(answers, module)


def _apply_file(module: ModuleType, spec: Any, rel: str, text: str, limit: int) -> str:
    """`text` after every fragment of `module` (a patcher version) that edits `rel`."""
    for fragment in module.fragments(spec):
        if fragment.path(spec) == rel:
            text = fragment.edit(text, spec, limit)
    return text


def _skeleton(text: str, regions: list[Any]) -> str:
    """`text` without `regions`, still valid for the patchers' parsers: a class member
    gives way to `pass`, so a class that held only this worker's member keeps a body."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    starts = {r.start: r for r in regions}
    skip_to = -1
    for i, line in enumerate(lines):
        if i < skip_to:
            continue
        region = starts.get(i)
        if region is None:
            out.append(line)
            continue
        if region.key == "kind member":
            out.append(line[: len(line) - len(line.lstrip())] + "pass\n")
        skip_to = region.end
    return "".join(out)


def _texts(lines: list[str], regions: list[Any]) -> dict[str, str]:
    return {r.key: "".join(lines[r.start : r.end]) for r in regions}


def _replaced(lines: list[str], regions: list[Any], texts: dict[str, str]) -> str:
    """`lines` with each region's lines replaced by `texts[key]` ('' when absent: dropped)."""
    out: list[str] = []
    by_start = {r.start: r for r in regions}
    i = 0
    while i < len(lines):
        region = by_start.get(i)
        if region is None:
            out.append(lines[i])
            i += 1
            continue
        text = texts.get(region.key, "")
        if not text and region.gap and out and not out[-1].strip():
            out.pop()  # a dropped region takes its separating blank line along
        out.append(text)
        i = region.end
    return "".join(out)


def merge3(ours: str, base: str, theirs: str) -> tuple[str, bool]:
    """`git merge-file` of three texts: the merged text and whether it holds conflicts
    (marked as copier marks its own: `<<<<<<< before updating` ... `>>>>>>> after updating`)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="worker-template-merge-") as tmp:
        paths = []
        for name, text in (("ours", ours), ("base", base), ("theirs", theirs)):
            path = Path(tmp) / name
            path.write_text(text, encoding="utf-8")
            paths.append(str(path))
        labels = [arg for label in MERGE_LABELS for arg in ("-L", label)]
        done = subprocess.run(
            ["git", "merge-file", "-p", *labels, *paths],
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode < 0 or done.returncode > 127:
        raise RuntimeError(f"git merge-file failed: {done.stderr.strip()}")
    return done.stdout, done.returncode > 0


def merge_regions(host: Path, spec: Spec, previous: Previous) -> tuple[list[str], list[str]]:
    """Merge every line region of this worker three ways: the previous template's render
    (base), the host's text (ours), this template's render (theirs).

    Each render comes from running that version's patcher over the file with the worker's
    regions cut out (`_skeleton`) and finding the regions again, so both renders are of the
    same host; the base and theirs files are the host's file with only the regions' text
    swapped. A region the new template no longer renders is dropped when unedited; a region
    it adds is inserted afterwards by `apply`. Returns `(changed, conflicted)` paths; a
    conflicted file keeps copier's markers and is left out of `apply`.
    """
    old_spec = previous.patcher.Spec.from_answers(previous.answers)
    if (old_spec.worker_name, old_spec.work_kind) != (spec.worker_name, spec.work_kind):
        return [], []  # a rename: the helper moves the regions itself
    limit = spec.line_length
    fields = {f.name for f in dataclasses.fields(old_spec)}
    if "line_length" in fields:
        old_spec = dataclasses.replace(old_spec, line_length=limit)
    if "storage_has_claim_many" in fields:
        old_spec = dataclasses.replace(old_spec, storage_has_claim_many=spec.storage_has_claim_many)
    if "storage_tenantless" in fields:
        old_spec = dataclasses.replace(old_spec, storage_tenantless=spec.storage_tenantless)
    changed: list[str] = []
    conflicted: list[str] = []
    regions = (
        host_workers.kind_regions(spec.host_root, spec.worker_name, spec.work_kind)
        if spec.added_kind
        else host_workers.worker_regions(spec.host_root, spec.worker_name, spec.work_kind)
    )
    for rel, find in regions.items():
        path = host / rel
        if not path.is_file():
            continue
        ours = path.read_text(encoding="utf-8")
        lines = ours.splitlines(keepends=True)
        mine = find(lines)
        if not mine:
            continue
        skeleton = _skeleton(ours, mine)
        renders = []
        for module, version_spec in ((previous.patcher, old_spec), (sys.modules[__name__], spec)):
            try:
                rendered = _apply_file(module, version_spec, rel, skeleton, limit)
            except (previous.patcher.Missing, Missing) as exc:  # that version cannot render it
                print(f"worker-template patcher: {rel} not merged ({exc})", file=sys.stderr)
                break
            rendered_lines = rendered.splitlines(keepends=True)
            renders.append(_texts(rendered_lines, find(rendered_lines)))
        else:
            old_texts, new_texts = renders
            current = _texts(lines, mine)
            base = _replaced(lines, mine, {**current, **old_texts})
            theirs_texts = {
                key: new_texts.get(key, "" if key in old_texts else text)
                for key, text in current.items()
            }
            merged, conflict = merge3(ours, base, _replaced(lines, mine, theirs_texts))
            if merged != ours:
                path.write_text(merged, encoding="utf-8")
                changed.append(rel)
            if conflict:
                conflicted.append(rel)
    return changed, conflicted


def is_replay(folder: Path) -> bool:
    """True for copier's temporary update copies (folders named `copier._main.*`, or no git
    work tree)."""
    return folder.resolve().name.startswith("copier._main.") or not (folder / ".git").exists()


def recorded_commits(host: Path, answers: dict[str, Any]) -> list[str]:
    """The template versions the host's workers record (`_commit`, as committed, then as
    on disk, this worker's new one included): the versions whose template-owned files
    (scripts/workers.py, the Makefile block) an unedited host may hold."""
    commits: list[str] = []
    for path in sorted(host.glob("workers/*/.copier-answers.yml")):
        rel = str(path.relative_to(host))
        for recorded in (committed_answers(host, rel), _answers_on_disk(path)):
            if recorded and recorded.get("_commit"):
                commits.append(str(recorded["_commit"]))
    if answers.get("_commit"):
        commits.append(str(answers["_commit"]))
    return list(dict.fromkeys(commits))


def _answers_on_disk(path: Path) -> dict[str, Any] | None:
    import yaml

    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return loaded if isinstance(loaded, dict) else None


def stale_env(host: Path, answers_file: str, spec: Spec) -> list[str]:
    """What the host's own `.env` (local, never in git) still says that an update changed:
    the worker's `<PREFIX>LANE` at the lane recorded before (`HEAD:<answers_file>`) when the
    new answers moved it, and every other line still at the value the committed
    `.env.example` (`HEAD`, before the update) gave where the updated one gives another.
    A `.env` copied from the example does not follow it; nothing here writes `.env`. One
    line per finding; [] when there is no `.env` or nothing stale."""
    import subprocess

    env = host / ".env"
    if not env.is_file():
        return []
    values = host_workers.env_values(env.read_text(encoding="utf-8"))
    notes: list[str] = []
    before = committed_answers(host, answers_file)
    old = str(before.get("lane", "")) if before else ""
    key = f"{spec.names['worker_env_prefix']}LANE"
    if old and old != spec.lane and values.get(key) == old:
        notes.append(
            f".env still sets {key}={old}; the worker's lane is now {spec.lane} (see .env.example)"
        )
    example = host / ".env.example"
    shown = subprocess.run(
        ["git", "show", "HEAD:.env.example"], cwd=host, capture_output=True, text=True, check=False
    )
    if shown.returncode != 0 or not example.is_file():
        return notes
    reported = {note.split("=", 1)[0] for note in notes}
    notes += [
        note
        for note in host_workers.stale_defaults(
            values,
            host_workers.env_values(example.read_text(encoding="utf-8")),
            [host_workers.env_values(shown.stdout)],
        )
        if note.split("=", 1)[0] not in reported
    ]
    return notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operation", choices=["copy", "update"], required=True)
    parser.add_argument("--answers-file", required=True, help="relative to the destination")
    parser.add_argument("--host", default=".", help="the host root (default: the current folder)")
    args = parser.parse_args(argv)
    host = Path(args.host)
    if MISSING_DEPS:
        print(f"worker-template patcher: {INSTALL_HINT}", file=sys.stderr)
        return 1
    facts = hostfacts.discover_host(host)
    if not facts.is_host or (args.operation == "update" and is_replay(host)):
        return 0  # an update replay in a bare temporary folder: nothing to patch there
    import yaml

    answers = yaml.safe_load((host / args.answers_file).read_text(encoding="utf-8"))
    spec = Spec.from_answers(answers)
    merged: list[str] = []
    conflicted: list[str] = []
    if args.operation == "update":
        previous = previous_render(host, args.answers_file)
        if isinstance(previous, str):
            print(
                f"worker-template patcher: shared files not merged ({previous}); "
                "missing fragments are added, changed ones keep their text",
                file=sys.stderr,
            )
        else:
            merged, conflicted = merge_regions(host, host_spec(host, spec), previous)
    try:
        existed = existing(host, spec)
        overwritten = lifecycle.overwritten_edits(host, recorded_commits(host, answers))
        changed = apply(host, spec, skip=frozenset(conflicted))
    except Exception as exc:  # every failure of a copy is undone, whatever raised it
        if args.operation == "update" and isinstance(exc, Missing):
            print(f"worker-template patcher: skipped, {exc}", file=sys.stderr)
            return 0
        if args.operation == "update":
            raise
        undone = undo_copy(host, touched_paths(host, answers))
        print(
            f"worker-template patcher: {exc}; the copy was undone "
            f"({len(undone)} paths put back as committed)",
            file=sys.stderr,
        )
        return 1
    if args.operation == "update":
        for note in moved_lane(host, args.answers_file, spec):
            print(f"    note     {note}", file=sys.stderr)
    for path in sorted(set(changed) | set(merged)):
        print(f"    {'patched ' if path in existed else 'created '} {path}")
    for path in conflicted:
        print(f"    conflict {path}: resolve the markers, then `git add` it", file=sys.stderr)
    for note in overwritten:
        print(f"    overwrote {note}", file=sys.stderr)
    if args.operation == "update":
        for note in stale_env(host, args.answers_file, spec):
            print(f"    note     {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
