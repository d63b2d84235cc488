"""Carry a user's edits across a worker file whose template shape changed.

Release v0.2.0 moved the worker runtime into `workers/runtime` (docs/decisions/0017): a
worker's `settings.py` became a subclass of the engine's settings that states this
worker's defaults, and its `container.py` a subclass of the engine's container that names
its handlers. A 3-way text merge of a user's edit into files that changed this much is a
conflict on every line, so `lifecycle.py carry` moves the edits by their meaning instead:

- `settings.py`: each member of `class WorkerSettings` the user changed or added (a
  field's default, a new field, a validator) replaces the member of that name in the new
  class, or joins it;
- `container.py`: the body of the user's handler factory (`_handlers(managers)`: a handler
  built with more managers, a second kind) becomes the body of `make_handlers`;
- in both, a top-level definition the user added comes along, and so does every import
  the carried code uses (from the user's file).

An edit of what the engine owns now (a module constant, the engine's part of the
container, a removed member) cannot be carried: `edits` raises `Unsupported` naming it,
and the update stops before anything is written. Pure functions over source text (no I/O);
extensions/lifecycle.py runs them in copier's `_migrations` stages.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field

SETTINGS_CLASS = "WorkerSettings"
OLD_HANDLERS = "_handlers"
NEW_HANDLERS = "make_handlers"
CONTAINER_CLASS = "WorkerContainer"


class Unsupported(Exception):
    """An edit the carry cannot move; the message names the file's part and where its
    code lives now."""


@dataclass
class Edits:
    """What `edits` found: `imports` (source of each import statement the carried code
    needs), `defs` (top-level definitions the user added, as source), `members` (class
    member name -> source, for settings), `body` (the handler factory's body, for the
    container; None when unedited)."""

    imports: list[str] = field(default_factory=list)
    defs: list[str] = field(default_factory=list)
    members: dict[str, str] = field(default_factory=dict)
    body: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.defs or self.members or self.body is not None)


def _segment(source: str, node: ast.stmt) -> str:
    """`node`'s source lines, whole (decorators included), dedented to column 0."""
    lines = source.splitlines()
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    chunk = lines[first - 1 : node.end_lineno]
    indent = len(chunk[0]) - len(chunk[0].lstrip())
    return "\n".join(line[indent:] if line.strip() else "" for line in chunk)


def _key(node: ast.stmt) -> str | None:
    """The name a statement defines: a field, a method, a class, an assigned constant; None
    for a docstring or anything unnamed."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        return target.id if isinstance(target, ast.Name) else None
    return None


def _named(source: str, body: list[ast.stmt]) -> dict[str, str]:
    return {key: _segment(source, n) for n in body if (key := _key(n)) is not None}


def _class(tree: ast.Module, name: str, what: str) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise Unsupported(f"{what}: `class {name}` is gone")


def _function(tree: ast.Module | ast.ClassDef, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _imports(source: str, tree: ast.Module) -> dict[str, str]:
    """Each name a top-level import binds -> the import statement that binds only it."""
    bound: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                name = alias.asname or alias.name
                spelled = alias.name + (f" as {alias.asname}" if alias.asname else "")
                bound[name] = f"from {module} import {spelled}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                spelled = alias.name + (f" as {alias.asname}" if alias.asname else "")
                bound[name] = f"import {spelled}"
    return bound


def _used(code: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)}


def _needs(code: list[str], user: str, user_tree: ast.Module, what: str) -> list[str]:
    """The user's imports that `code` uses. A top-level name of the user's file `code` uses
    that neither an import nor `code` itself defines (a constant of the old file) is
    `Unsupported`: it lives in the engine now."""
    imports = _imports(user, user_tree)
    defined = {k for c in code for n in ast.parse(c).body if (k := _key(n))}
    top = {k for n in user_tree.body if (k := _key(n)) is not None}
    needed: list[str] = []
    for name in sorted(set().union(*(_used(c) for c in code)) if code else set()):
        if name in imports:
            needed.append(imports[name])
        elif name in top and name not in defined:
            raise Unsupported(
                f"{what}: your code uses `{name}`, which this file no longer defines "
                "(it is the engine's now, workers/runtime/)"
            )
    return needed


def _top_level_edits(
    old: ast.Module, old_src: str, user: ast.Module, user_src: str, owned: set[str], what: str
) -> list[str]:
    """The user's added top-level definitions; a changed or removed definition of the old
    file (other than `owned`, which the caller carries itself) is `Unsupported`."""
    old_named = _named(old_src, old.body)
    user_named = _named(user_src, user.body)
    for name, code in old_named.items():
        if name in owned:
            continue
        if name not in user_named:
            raise Unsupported(f"{what}: you removed `{name}`; the new version keeps no copy")
        if user_named[name] != code:
            raise Unsupported(
                f"{what}: you changed `{name}`, which moves into the engine "
                "(workers/runtime/); carry the change there by hand"
            )
    return [code for name, code in user_named.items() if name not in old_named]


def settings_edits(old: str, user: str) -> Edits:
    """The user's edits of a worker's `settings.py` (see the module docstring)."""
    what = "settings.py"
    old_tree, user_tree = ast.parse(old), ast.parse(user)
    old_cls = _class(old_tree, SETTINGS_CLASS, what)
    user_cls = _class(user_tree, SETTINGS_CLASS, what)
    defs = _top_level_edits(old_tree, old, user_tree, user, {SETTINGS_CLASS}, what)
    old_members, user_members = _named(old, old_cls.body), _named(user, user_cls.body)
    gone = [name for name in old_members if name not in user_members]
    if gone:
        raise Unsupported(
            f"{what}: you removed `{SETTINGS_CLASS}.{gone[0]}`; keep it or drop it after the update"
        )
    members = {n: c for n, c in user_members.items() if old_members.get(n) != c}
    code = [*defs, *members.values()]
    return Edits(imports=_needs(code, user, user_tree, what), defs=defs, members=members)


def container_edits(old: str, user: str) -> Edits:
    """The user's edits of a worker's `container.py` (see the module docstring)."""
    what = "container.py"
    old_tree, user_tree = ast.parse(old), ast.parse(user)
    old_fn, user_fn = _function(old_tree, OLD_HANDLERS), _function(user_tree, OLD_HANDLERS)
    if old_fn is None:
        raise Unsupported(f"{what}: the old version has no `{OLD_HANDLERS}`")
    if user_fn is None:
        raise Unsupported(f"{what}: you removed `{OLD_HANDLERS}`, where the handlers are built")
    defs = _top_level_edits(old_tree, old, user_tree, user, {OLD_HANDLERS}, what)
    body = None
    if _segment(user, user_fn) != _segment(old, old_fn):
        lines = user.splitlines()
        start = user_fn.body[0].lineno
        if isinstance(user_fn.body[0], ast.Expr) and isinstance(
            user_fn.body[0].value, ast.Constant
        ):
            start = (
                user_fn.body[1].lineno
                if len(user_fn.body) > 1
                else user_fn.body[0].end_lineno or start
            )
        chunk = lines[start - 1 : user_fn.end_lineno]
        indent = min(len(line) - len(line.lstrip()) for line in chunk if line.strip())
        body = "\n".join(line[indent:] if line.strip() else "" for line in chunk)
    code = [*defs, *([body] if body is not None else [])]
    needs = _needs(code, user, user_tree, what)
    return Edits(imports=needs, defs=defs, body=body)


def _indent(code: str, spaces: int) -> list[str]:
    pad = " " * spaces
    return [pad + line if line else "" for line in code.splitlines()]


def _section(module: str, host_root: str) -> int:
    """isort's sections: 0 `__future__`, 1 standard library, 2 third party, 3 the host's
    packages, 4 relative."""
    if module == "__future__":
        return 0
    if module.startswith("."):
        return 4
    top = module.split(".")[0]
    if top == host_root:
        return 3
    return 1 if top in sys.stdlib_module_names else 2


def _by_type(name: str) -> tuple[int, str]:
    """ruff's (isort's) `order-by-type`: constants, then classes, then the rest."""
    bare = name.split(" as ")[0]
    if bare.isupper() and len(bare) > 1:
        return (0, bare.lower())
    return (1 if bare[:1].isupper() else 2, bare.lower())


def _add_imports(source: str, imports: list[str], host_root: str, line_length: int) -> str:
    """`source` with each statement of `imports` whose name it does not bind yet: the
    top-level import block rewritten in isort's layout (sections apart by one blank line,
    `import x` before `from x import`, modules in order, names of one module joined and
    wrapped past `line_length`).
    Raises `Unsupported` when the imports are not one block at the top."""
    tree = ast.parse(source)
    bound = _imports(source, tree)
    missing = [s for s in imports if _binds(s) not in bound]
    if not missing:
        return source
    nodes = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    lines = source.splitlines()
    first, last = nodes[0].lineno, nodes[-1].end_lineno or nodes[-1].lineno
    between = [n for n in tree.body if first <= n.lineno <= last and n not in nodes]
    if between:
        raise Unsupported("the file's imports are not one block; add the imports by hand")
    plain: set[tuple[str, str]] = set()  # (module, "name [as alias]") of `import x`
    froms: dict[str, set[str]] = {}
    for node in [*nodes, *(ast.parse(s).body[0] for s in missing)]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                plain.add(
                    (alias.name, alias.name + (f" as {alias.asname}" if alias.asname else ""))
                )
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                froms.setdefault(module, set()).add(
                    alias.name + (f" as {alias.asname}" if alias.asname else "")
                )
    statements: list[tuple[int, int, str, str]] = [
        (_section(module, host_root), 0, module.lower(), f"import {spelled}")
        for module, spelled in plain
    ]
    for module, spelled_names in froms.items():
        ordered = sorted(spelled_names, key=_by_type)
        statement = f"from {module} import {', '.join(ordered)}"
        if len(statement) > line_length:  # as ruff format wraps it
            statement = "\n".join([f"from {module} import (", *(f"    {n}," for n in ordered), ")"])
        statements.append((_section(module, host_root), 1, module.lower(), statement))
    block: list[str] = []
    previous = None
    for section, _kind, _module, statement in sorted(statements):
        if previous is not None and section != previous:
            block.append("")
        block.append(statement)
        previous = section
    lines[first - 1 : last] = block
    return "\n".join(lines) + "\n"


def _binds(statement: str) -> str:
    """The name an import statement of one name binds."""
    node = ast.parse(statement).body[0]
    assert isinstance(node, ast.Import | ast.ImportFrom)
    alias = node.names[0]
    if isinstance(node, ast.Import):
        return alias.asname or alias.name.split(".")[0]
    return alias.asname or alias.name


def _insert_defs(source: str, defs: list[str], before_class: str) -> str:
    if not defs:
        return source
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == before_class)
    first = min([cls.lineno, *(d.lineno for d in cls.decorator_list)])
    lines = source.splitlines()
    block: list[str] = []
    for code in defs:
        block += [*code.splitlines(), "", ""]
    lines[first - 1 : first - 1] = block
    return "\n".join(lines) + "\n"


def apply_settings(new: str, edits: Edits, host_root: str, line_length: int = 88) -> str:
    """The new `settings.py` with `edits` (from `settings_edits`) in it."""
    text = _add_imports(new, edits.imports, host_root, line_length)
    text = _insert_defs(text, edits.defs, SETTINGS_CLASS)
    for name, code in edits.members.items():
        tree = ast.parse(text)
        cls = _class(tree, SETTINGS_CLASS, "settings.py")
        lines = text.splitlines()
        target = next((n for n in cls.body if _key(n) == name), None)
        if target is None:
            end = cls.end_lineno or cls.lineno
            lines[end:end] = (
                ["", *_indent(code, 4)] if "\n" in code or "def " in code else _indent(code, 4)
            )
        else:
            first = min([target.lineno, *(d.lineno for d in getattr(target, "decorator_list", []))])
            lines[first - 1 : target.end_lineno] = _indent(code, 4)
        text = "\n".join(lines) + "\n"
    return text


def apply_container(new: str, edits: Edits, host_root: str, line_length: int = 88) -> str:
    """The new `container.py` with `edits` (from `container_edits`) in it."""
    text = _add_imports(new, edits.imports, host_root, line_length)
    text = _insert_defs(text, edits.defs, CONTAINER_CLASS)
    if edits.body is not None:
        tree = ast.parse(text)
        cls = _class(tree, CONTAINER_CLASS, "container.py")
        fn = _function(cls, NEW_HANDLERS)
        if fn is None:
            raise Unsupported(f"container.py: the new version has no `{NEW_HANDLERS}`")
        lines = text.splitlines()
        start = fn.body[0].lineno
        if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant):
            start = (fn.body[0].end_lineno or start) + 1
        lines[start - 1 : fn.end_lineno] = _indent(edits.body, 8)
        text = "\n".join(lines) + "\n"
    return text
