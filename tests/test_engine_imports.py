"""The engine's modules import one another without a circle (issue 30).

Every import statement of `engine/` counts, at module level or inside a function, under
`TYPE_CHECKING` or not: an import made late to dodge a circle is still a circle. The
console command is the top: `entry.console` imports `cli`, which imports the server and
the operator commands; `worker.py` (configuration) imports none of them.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

from conftest import REPO

SOURCES = (
    REPO / "engine/workers/runtime/src",
    REPO / "engine/om/src",
)


def module_name(source_root: Path, path: Path) -> str:
    """`acme.workers.runtime.cli` for `<source_root>/acme/workers/runtime/cli.py`."""
    parts = list(path.relative_to(source_root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def engine_modules() -> dict[str, Path]:
    """Every engine module by its dotted name (the reference host's root, `acme`)."""
    return {
        module_name(root, path): path for root in SOURCES for path in sorted(root.rglob("*.py"))
    }


def imported(path: Path, known: Mapping[str, Path]) -> set[str]:
    """The engine modules `path` imports: `from a.b import c` names `a.b.c` when that is
    a module of its own, else `a.b`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                if child in known:
                    found.add(child)
                elif node.module in known:
                    found.add(node.module)
    return found


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Each circle a depth-first walk of `graph` meets, as the modules along it."""
    found: list[list[str]] = []
    state: dict[str, str] = {}  # "open" while on the walk's path, "done" after

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                found.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def test_the_engine_imports_without_a_circle() -> None:
    known = engine_modules()
    assert "acme.workers.runtime.cli" in known and "acme.om.work.manager" in known
    graph = {name: imported(path, known) - {name} for name, path in known.items()}
    assert circles(graph) == []


def test_the_walk_names_each_circle_it_meets() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c", "a"]]


def test_configuration_imports_neither_the_command_nor_the_server() -> None:
    known = engine_modules()
    worker = imported(known["acme.workers.runtime.worker"], known)
    assert not worker & {
        "acme.workers.runtime.cli",
        "acme.workers.runtime.commands",
        "acme.workers.runtime.entry",
        "acme.workers.runtime.server",
    }
