"""Host discovery: what the destination repository holds, read once per folder and cached.

The context hook runs more than a hundred times per render (copier calls it on every Jinja
render), so every
fact is computed once per resolved destination. Nothing here raises for a folder that is not
a host: callers get the facts and the list of what is missing, and decide.

Only the standard library and PyYAML (a dependency of copier itself) are used.
"""

from __future__ import annotations

import ast
import os
import re
import tomllib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

_ENUM_CLASS = re.compile(
    r"^class\s+WorkKind\b[^\n]*:\n((?:[ \t]+[^\n]*\n|[ \t]*\n)*)", re.MULTILINE
)
_ENUM_MEMBER = re.compile(r"^[ \t]+([A-Z][A-Z0-9_]*)\s*=", re.MULTILINE)

ANSWERS_NAME = ".copier-answers.yml"
METRICS_PORT_BASE = 9100


@dataclass(frozen=True)
class HostFacts:
    """What one destination folder holds.

    `problems` lists, one sentence each, what keeps the folder from being a host root
    (empty for a host). `root` is the package root (`acme`) or '' when not exactly one
    `om/src/<root>/om/__init__.py` exists. `kinds` maps each work kind already in use to
    who holds it (`workers/<name>` or the kinds module). `workers` maps each worker folder
    name with an answers file to its recorded answers.
    """

    path: Path
    problems: tuple[str, ...]
    root: str
    namespace_absent: bool
    queue_head: str
    kinds: dict[str, str] = field(default_factory=dict)
    workers: dict[str, dict[str, object]] = field(default_factory=dict)

    @property
    def is_host(self) -> bool:
        return not self.problems

    @property
    def taken_metrics_ports(self) -> set[int]:
        """The local metrics ports recorded workers hold (see `next_metrics_port`)."""
        taken: set[int] = set()
        for index, answers in enumerate(self.workers.values()):
            port = answers.get("metrics_port")
            taken.add(port if isinstance(port, int) else METRICS_PORT_BASE + index)
        return taken

    @property
    def next_metrics_port(self) -> int:
        """The first local metrics port no recorded worker holds, from `METRICS_PORT_BASE`.

        A worker recorded without a `metrics_port` answer (older template versions) is
        taken to hold the port its position gave it in `.env.example`.
        """
        taken = self.taken_metrics_ports
        port = METRICS_PORT_BASE
        while port in taken:
            port += 1
        return port


def host_problems(path: Path) -> tuple[list[str], str]:
    """What keeps `path` from being a host root, and the package root when there is one.

    A host root has a `pyproject.toml` with `[tool.uv.workspace]` and exactly one
    `om/src/<root>/om/__init__.py` (docs/host-contract.md, Workspace).
    """
    problems: list[str] = []
    pyproject = path / "pyproject.toml"
    if not pyproject.is_file():
        problems.append("no pyproject.toml")
    else:
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            problems.append(f"pyproject.toml does not parse ({exc})")
        else:
            if "workspace" not in data.get("tool", {}).get("uv", {}):
                problems.append("pyproject.toml has no [tool.uv.workspace] table")
    roots = sorted(p.parent.parent.name for p in path.glob("om/src/*/om/__init__.py"))
    if not roots:
        problems.append("no om/src/<root>/om/__init__.py")
    elif len(roots) > 1:
        listed = ", ".join(f"om/src/{r}/om/__init__.py" for r in roots)
        problems.append(f"more than one om package ({listed}); expected exactly one")
    return problems, roots[0] if len(roots) == 1 else ""


def enclosing_host(path: Path) -> Path | None:
    """The nearest proper ancestor of `path` that is a host root, or None."""
    for parent in path.resolve().parents:
        problems, _ = host_problems(parent)
        if not problems:
            return parent
    return None


def literal_assignments(text: str, names: tuple[str, ...]) -> dict[str, object]:
    """The module-level `name = <literal>` (or `name: T = <literal>`) of `names` in `text`;
    an assignment whose value is not a literal, or a file that does not parse, is left out."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in names:
            try:
                found[target.id] = ast.literal_eval(value)
            except ValueError:
                continue
    return found


def revision_graph(versions: Path) -> dict[str, tuple[str, ...]]:
    """Each revision of one alembic history folder and the revisions it follows.

    Reads the literal `revision = "..."` and `down_revision = ...` of each `*.py` in
    `versions` (the layout of docs/host-contract.md, Migrations): `down_revision` is a
    revision, None (a base) or a tuple of revisions (a merge revision).
    """
    graph: dict[str, tuple[str, ...]] = {}
    for path in sorted(versions.glob("*.py")):
        found = literal_assignments(path.read_text(encoding="utf-8"), ("revision", "down_revision"))
        rev, down = found.get("revision"), found.get("down_revision")
        if not isinstance(rev, str) or not rev:
            continue
        if isinstance(down, str):
            graph[rev] = (down,) if down else ()
        elif isinstance(down, tuple | list):
            graph[rev] = tuple(d for d in down if isinstance(d, str) and d)
        else:
            graph[rev] = ()
    return graph


def graph_heads(graph: dict[str, tuple[str, ...]]) -> list[str]:
    """The revisions of `graph` no other revision follows, sorted."""
    parents = {down for downs in graph.values() for down in downs}
    return sorted(rev for rev in graph if rev not in parents)


def queue_head(versions: Path) -> str:
    """The single head revision of one alembic history folder, '' when it has none.

    With several heads, ''. A merge revision (`down_revision` a tuple) joins its parents.
    """
    heads = graph_heads(revision_graph(versions))
    return heads[0] if len(heads) == 1 else ""


def kinds_in_module(path: Path) -> list[str]:
    """The member names of `class WorkKind` in one Python file ([] when absent)."""
    if not path.is_file():
        return []
    match = _ENUM_CLASS.search(path.read_text(encoding="utf-8"))
    return _ENUM_MEMBER.findall(match.group(1)) if match else []


def _normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def name_collisions(path: Path, root: str, worker: str) -> list[str]:
    """What a worker named `worker` would overwrite or duplicate outside its own folder.

    Its image `deployment/docker/<worker>.Dockerfile` must not be another service's, and
    its distribution `<root>-<worker>` must not be the name of a workspace member already
    there (`om`, `infra`, `services/*` ...: uv refuses two members of one name), and its
    settings prefix must not be the host's (`<ROOT>_`, a worker named like the root). Returns
    one `<file> (<what>)` entry per collision; [] when there is none.
    """
    found: list[str] = []
    if worker.replace("-", "_") == root:
        found.append(f"the host's package root {root!r} (its settings prefix {root.upper()}_)")
    dockerfile = Path("deployment") / "docker" / f"{worker}.Dockerfile"
    if (path / dockerfile).is_file():
        found.append(f"{dockerfile} (another image of that name)")
    wanted = _normalized(f"{root}-{worker}")
    for pyproject in sorted(path.glob("*/pyproject.toml")) + sorted(
        path.glob("*/*/pyproject.toml")
    ):
        try:
            name = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["name"]
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, TypeError):
            continue
        if isinstance(name, str) and _normalized(name) == wanted:
            found.append(f"{pyproject.relative_to(path)} (the distribution {name})")
    return found


_OUTBOX_KIND = re.compile(r"\bkind\s+(?:TYPE\s+)?varchar\s*\(\s*(\d+)\s*\)", re.IGNORECASE)


def outbox_kind_size(path: Path) -> int | None:
    """The size of the host's `outbox.kind` column (`varchar(N)`) from its SQL migrations,
    the last one that sets it winning; None when no migration sizes it (an unbounded text).

    Read once per set of file versions: copier's context hook asks on every render."""
    files = sorted(path.glob("om/migrations/sql/*/*outbox*.up.sql"), key=lambda p: p.name)
    return _outbox_kind_size_of(tuple((str(sql), _mtime_ns(str(sql))) for sql in files))


@lru_cache(maxsize=16)
def _outbox_kind_size_of(files: tuple[tuple[str, int | None], ...]) -> int | None:
    """`outbox_kind_size` over `files`, (path, modification time) in migration order."""
    size: int | None = None
    for sql, _ in files:
        try:
            text = Path(sql).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        for match in _OUTBOX_KIND.finditer(text):
            size = int(match.group(1))
    return size


def recorded_workers(path: Path) -> dict[str, dict[str, object]]:
    """`workers/<name>/.copier-answers.yml` of every worker, parsed ({} for unreadable)."""
    found: dict[str, dict[str, object]] = {}
    for answers in sorted(path.glob(f"workers/*/{ANSWERS_NAME}")):
        try:
            data = yaml.safe_load(answers.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError):
            data = None
        found[answers.parent.name] = data if isinstance(data, dict) else {}
    return found


@lru_cache(maxsize=32)
def _discover(dst: str, fingerprint: tuple[object, ...]) -> HostFacts:
    del fingerprint  # part of the cache key only
    path = Path(dst)
    problems, root = host_problems(path)
    workers = recorded_workers(path)
    kinds: dict[str, str] = {}
    namespace_absent = True
    if root:
        work = path / "om" / "src" / root / "om" / "work"
        namespace_absent = not (work / "__init__.py").is_file()
        for module in ("types/kinds.py", "types/work_item.py"):
            for kind in kinds_in_module(work / module):
                kinds.setdefault(kind, f"om/src/{root}/om/work/{module}")
    for name, answers in workers.items():
        recorded = answers.get("work_kind")
        if isinstance(recorded, str):
            kinds[recorded] = f"workers/{name}"
    for added in sorted(path.glob("workers/*/.copier-answers.*.yml")):  # kinds added to one
        try:
            data = yaml.safe_load(added.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError, OSError):
            continue
        if isinstance(data, dict) and isinstance(data.get("work_kind"), str):
            kinds[data["work_kind"]] = f"workers/{added.parent.name}"
    return HostFacts(
        path=path,
        problems=tuple(problems),
        root=root,
        namespace_absent=namespace_absent,
        queue_head=queue_head(path / "om" / "migrations" / "versions" / "queue"),
        kinds=kinds,
        workers=workers,
    )


def _subfolders(folder: str) -> list[str]:
    try:
        with os.scandir(folder) as entries:
            return sorted(entry.name for entry in entries if entry.is_dir())
    except OSError:
        return []


def _mtime_ns(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _fingerprint(path: Path) -> tuple[object, ...]:
    """Cheap stamp of the files discovery reads, so a changed host is read again.

    Every render calls it (copier's context hook runs per file), so it lists folders with
    `os.scandir` and stats files with `os.stat`: a tenth of `Path.glob`'s cost.
    """
    root = str(path)
    candidates = [os.path.join(root, "pyproject.toml")]
    workers = os.path.join(root, "workers")
    candidates += [os.path.join(workers, name, ANSWERS_NAME) for name in _subfolders(workers)]
    sources = os.path.join(root, "om", "src")
    for package in _subfolders(sources):
        om = os.path.join(sources, package, "om")
        candidates += [
            os.path.join(om, "work", "types", "kinds.py"),
            os.path.join(om, "work", "__init__.py"),
            os.path.join(om, "__init__.py"),
        ]
    candidates.append(os.path.join(root, "om", "migrations", "versions", "queue"))
    return tuple((candidate, _mtime_ns(candidate)) for candidate in candidates)


def discover_host(dst: Path) -> HostFacts:
    """Host facts for the destination, cached per resolved path and file stamps."""
    path = dst.resolve()
    return _discover(str(path), _fingerprint(path))


def forget() -> None:
    """Drop cached facts (tests render many hosts in one process)."""
    _discover.cache_clear()
