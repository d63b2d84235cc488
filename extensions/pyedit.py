"""Structural edits of Python sources with libcst, shaped so ruff leaves the result alone.

Every helper takes and returns libcst nodes and changes nothing when its edit is already
there, so the host patcher can run any number of times. The formatting rules follow
`ruff format` (black style): a collection that is already exploded gets one more element
in the same style; a one-line collection that would pass the line length is exploded one
element per line with a magic trailing comma, which `ruff format` keeps. Imports go into
the isort group that already holds their top-level package, in ruff's default order
(`order-by-type`, case-insensitive, `from` imports after plain ones).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TypeVar, cast

import libcst as cst

INDENT = "    "

NodeT = TypeVar("NodeT", bound=cst.CSTNode)


class EditError(Exception):
    """A host file lacks the structure an edit needs; the message names the part."""


# --- small builders ---------------------------------------------------------------------


def expr(code: str) -> cst.BaseExpression:
    return cst.parse_expression(code)


def stmt(code: str) -> cst.SimpleStatementLine | cst.BaseCompoundStatement:
    return cst.parse_statement(code)


def code_of(module: cst.Module, node: cst.CSTNode) -> str:
    return module.code_for_node(node)


def replace(tree: NodeT, old: cst.CSTNode, new: cst.CSTNode) -> NodeT:
    """`tree` with `old`, a node inside it (never `tree` itself), replaced by `new`."""
    # libcst types the result `tree`'s type | `new`'s: the latter only when `old` is `tree`.
    return cast(NodeT, tree.deep_replace(old, new))


def _nl_ws(last_line: str) -> cst.ParenthesizedWhitespace:
    """A newline plus the enclosing block's indentation plus `last_line`."""
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(),
        empty_lines=[],
        indent=True,
        last_line=cst.SimpleWhitespace(last_line),
    )


def _is_exploded(ws: cst.BaseParenthesizableWhitespace) -> bool:
    return isinstance(ws, cst.ParenthesizedWhitespace)


# --- collections: dict entries, call arguments, list elements ------------------------------


def _comma_ws(el: cst.CSTNode) -> cst.BaseParenthesizableWhitespace | None:
    comma = getattr(el, "comma", cst.MaybeSentinel.DEFAULT)
    return comma.whitespace_after if isinstance(comma, cst.Comma) else None


def _append_elements(
    elements: Sequence[cst.CSTNode],
    new: cst.CSTNode,
    opening_ws: cst.BaseParenthesizableWhitespace,
    closing_ws: cst.BaseParenthesizableWhitespace | None,
) -> tuple[list[cst.CSTNode], cst.BaseParenthesizableWhitespace, bool]:
    """Append `new` to `elements` (dict elements, args, list elements).

    Returns the new elements, the whitespace after the opening bracket, and whether the
    result is exploded (one element per line). An exploded collection stays exploded with
    the same per-line whitespace; a one-line one stays one line (the caller explodes it
    when the statement gets too long).
    """
    elements = list(elements)
    exploded = _is_exploded(opening_ws) or any(
        _is_exploded(ws) for ws in map(_comma_ws, elements) if ws is not None
    )
    if not exploded:
        if elements:
            last = elements[-1]
            elements[-1] = last.with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            )
        if hasattr(new, "comma"):
            new = new.with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return [*elements, new], opening_ws, False
    between: cst.BaseParenthesizableWhitespace = _nl_ws(INDENT)
    for el in elements[:-1]:
        ws = _comma_ws(el)
        if ws is not None and _is_exploded(ws):
            between = ws
            break
    if elements:
        last = elements[-1]
        last_ws = _comma_ws(last)
        closing = last_ws if last_ws is not None else (closing_ws or _nl_ws(""))
        elements[-1] = last.with_changes(comma=cst.Comma(whitespace_after=between))
    else:
        closing = _nl_ws("")
        opening_ws = _nl_ws(INDENT)
    new = new.with_changes(comma=cst.Comma(whitespace_after=closing))
    return [*elements, new], opening_ws, True


def explode(node: cst.CSTNode) -> cst.CSTNode:
    """One element per line with a magic trailing comma (Dict, List, Set, Tuple, Call)."""
    items: list[cst.CSTNode]
    if isinstance(node, cst.Call):
        items = list(node.args)
    elif isinstance(node, cst.Dict | cst.List | cst.Set | cst.Tuple):
        items = list(node.elements)
    else:
        raise TypeError(type(node).__name__)
    rebuilt = []
    for i, item in enumerate(items):
        closing = i == len(items) - 1
        changes: dict[str, object] = {
            "comma": cst.Comma(whitespace_after=_nl_ws("" if closing else INDENT))
        }
        if isinstance(item, cst.Arg):
            changes["whitespace_after_arg"] = cst.SimpleWhitespace("")
        rebuilt.append(item.with_changes(**changes))
    if isinstance(node, cst.Call):
        return node.with_changes(
            args=rebuilt,
            whitespace_before_args=_nl_ws(INDENT) if rebuilt else node.whitespace_before_args,
        )
    if isinstance(node, cst.Dict | cst.Set):
        brace = node.lbrace.with_changes(whitespace_after=_nl_ws(INDENT))
        rbrace = node.rbrace.with_changes(whitespace_before=cst.SimpleWhitespace(""))
        return node.with_changes(elements=rebuilt, lbrace=brace, rbrace=rbrace)
    if isinstance(node, cst.List):
        bracket = node.lbracket.with_changes(whitespace_after=_nl_ws(INDENT))
        rbracket = node.rbracket.with_changes(whitespace_before=cst.SimpleWhitespace(""))
        return node.with_changes(elements=rebuilt, lbracket=bracket, rbracket=rbracket)
    lpar = [p.with_changes(whitespace_after=_nl_ws(INDENT)) for p in node.lpar]
    return node.with_changes(elements=rebuilt, lpar=lpar)


def dict_append(node: cst.Dict, key: str, value: str) -> cst.Dict:
    """`node` with `key: value` appended (both Python source); unchanged if the key is there."""
    key_node = expr(key)
    for el in node.elements:
        if isinstance(el, cst.DictElement) and el.key.deep_equals(key_node):
            return node
    elements, opening, _ = _append_elements(
        node.elements,
        cst.DictElement(key=key_node, value=expr(value)),
        node.lbrace.whitespace_after,
        node.rbrace.whitespace_before,
    )
    return node.with_changes(
        elements=elements, lbrace=node.lbrace.with_changes(whitespace_after=opening)
    )


def sequence_append(
    node: cst.List | cst.Set | cst.Tuple, value: str
) -> cst.List | cst.Set | cst.Tuple:
    """A list, set or tuple literal with `value` appended; unchanged if already present."""
    value_node = expr(value)
    if any(el.value.deep_equals(value_node) for el in node.elements):
        return node
    if isinstance(node, cst.List):
        opening_ws = node.lbracket.whitespace_after
    elif isinstance(node, cst.Set):
        opening_ws = node.lbrace.whitespace_after
    else:
        opening_ws = node.lpar[0].whitespace_after if node.lpar else cst.SimpleWhitespace("")
    elements, opening, _ = _append_elements(
        node.elements, cst.Element(value=value_node), opening_ws, None
    )
    if isinstance(node, cst.List):
        return node.with_changes(
            elements=elements, lbracket=node.lbracket.with_changes(whitespace_after=opening)
        )
    if isinstance(node, cst.Set):
        return node.with_changes(
            elements=elements, lbrace=node.lbrace.with_changes(whitespace_after=opening)
        )
    return node.with_changes(elements=elements)


def call_add_kwarg(node: cst.Call, name: str, value: str) -> cst.Call:
    """`node` with the keyword argument `name=value`; unchanged if `name` is passed."""
    if any(a.keyword is not None and a.keyword.value == name for a in node.args):
        return node
    new = cst.Arg(
        keyword=cst.Name(name),
        value=expr(value),
        equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        ),
    )
    args, opening, _ = _append_elements(node.args, new, node.whitespace_before_args, None)
    if not _is_exploded(opening) and args:
        # a one-line call keeps no whitespace before its closing parenthesis
        args[-1] = args[-1].with_changes(whitespace_after_arg=cst.SimpleWhitespace(""))
    return node.with_changes(args=args, whitespace_before_args=opening)


def fit(
    module: cst.Module, statement: cst.BaseStatement, target: cst.CSTNode, indent: int, limit: int
) -> cst.BaseStatement:
    """`statement` with `target` (a node inside it) exploded when a line passes `limit`."""
    text = code_of(module, statement)
    if all(indent + len(line) <= limit for line in text.splitlines()):
        return statement
    if any(isinstance(ws, cst.ParenthesizedWhitespace) for ws in _bracket_ws(target)):
        return statement
    return replace(statement, target, explode(target))


def _bracket_ws(node: cst.CSTNode) -> list[cst.BaseParenthesizableWhitespace]:
    if isinstance(node, cst.Call):
        return [node.whitespace_before_args]
    if isinstance(node, cst.Dict | cst.Set):
        return [node.lbrace.whitespace_after]
    if isinstance(node, cst.List):
        return [node.lbracket.whitespace_after]
    return []


# --- imports --------------------------------------------------------------------------------


def _dotted(node: cst.BaseExpression | None) -> str:
    if node is None:
        return ""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    raise TypeError(type(node).__name__)


def _import_of(statement: cst.CSTNode) -> cst.Import | cst.ImportFrom | None:
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Import | cst.ImportFrom):
            return small
    return None


def _module_key(node: cst.Import | cst.ImportFrom) -> tuple[int, int, str, str]:
    if isinstance(node, cst.Import):
        name = _dotted(node.names[0].name)
        return (0, 0, name.lower(), name)
    name = _dotted(node.module)
    return (1, -len(node.relative), name.lower(), name)


def _member_key(name: str) -> tuple[int, str, str]:
    if len(name) > 1 and name.isupper():
        kind = 0
    elif name[:1].isupper():
        kind = 1
    else:
        kind = 2
    return (kind, name.lower(), name)


def _section(node: cst.Import | cst.ImportFrom) -> str:
    if isinstance(node, cst.ImportFrom) and node.relative:
        return "."
    name = _dotted(node.names[0].name if isinstance(node, cst.Import) else node.module)
    top = name.split(".")[0]
    if top == "__future__":
        return "__future__"
    return "stdlib" if top in sys.stdlib_module_names else top


def has_import(module: cst.Module, from_module: str, name: str) -> bool:
    for statement in module.body:
        node = _import_of(statement)
        if (
            isinstance(node, cst.ImportFrom)
            and not node.relative
            and _dotted(node.module) == from_module
            and not isinstance(node.names, cst.ImportStar)
            and any(_dotted(a.name) == name for a in node.names)
        ):
            return True
    return False


def from_import(from_module: str, names: Sequence[str], limit: int) -> str:
    """`from <from_module> import <names>` as ruff writes it: the names sorted, on one line
    when it fits `limit` (characters), else one name a line in parentheses."""
    ordered = sorted(names, key=_member_key)
    text = f"from {from_module} import " + ", ".join(ordered)
    if len(text) <= limit:
        return text
    inner = "".join(f"{INDENT}{n},\n" for n in ordered)
    return f"from {from_module} import (\n{inner})"


def add_import(module: cst.Module, from_module: str, name: str, limit: int) -> cst.Module:
    """`module` with `from <from_module> import <name>` (absolute), placed as ruff sorts it.

    Joins an existing `from <from_module> import ...` when there is one; otherwise the new
    statement goes into the import group that holds its top-level package (a group ends
    at a blank line), after the group of the standard library when there is none.
    """
    if has_import(module, from_module, name):
        return module
    body = list(module.body)
    for i, statement in enumerate(body):
        node = _import_of(statement)
        if (
            isinstance(node, cst.ImportFrom)
            and not node.relative
            and _dotted(node.module) == from_module
            and not isinstance(node.names, cst.ImportStar)
        ):
            names = [*(_dotted(a.name) for a in node.names), name]
            text = from_import(from_module, names, limit)
            new = cst.parse_statement(text).with_changes(leading_lines=statement.leading_lines)
            body[i] = new
            return module.with_changes(body=body)
    new_node = cst.parse_statement(from_import(from_module, [name], limit))
    new_import = _import_of(new_node)
    assert new_import is not None
    section = _section(new_import)
    key = _module_key(new_import)
    imports = [(i, node) for i, s in enumerate(body) if (node := _import_of(s)) is not None]
    if not imports:
        raise EditError("has no import statements to place a new import among")
    same = [(i, n) for i, n in imports if _section(n) == section]
    if same:
        for i, node in same:
            if _module_key(node) > key:
                body.insert(i, new_node.with_changes(leading_lines=body[i].leading_lines))
                body[i + 1] = body[i + 1].with_changes(leading_lines=[])
                return module.with_changes(body=body)
        last = same[-1][0]
        body.insert(last + 1, new_node)
        return module.with_changes(body=body)
    # a new group: after the last group of another absolute package, before relative ones
    absolute = [(i, n) for i, n in imports if _section(n) not in {".", "__future__"}]
    at = (absolute[-1][0] if absolute else imports[-1][0]) + 1
    body.insert(at, new_node.with_changes(leading_lines=[cst.EmptyLine(indent=False)]))
    if (
        at + 1 < len(body)
        and _import_of(body[at + 1]) is not None
        and not body[at + 1].leading_lines
    ):
        body[at + 1] = body[at + 1].with_changes(leading_lines=[cst.EmptyLine(indent=False)])
    return module.with_changes(body=body)


# --- finding things -------------------------------------------------------------------------


def find_class(module: cst.Module, name: str) -> cst.ClassDef | None:
    for statement in module.body:
        if isinstance(statement, cst.ClassDef) and statement.name.value == name:
            return statement
    return None


def find_function(body: Sequence[cst.CSTNode], name: str) -> cst.FunctionDef | None:
    for statement in body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
            return statement
    return None


def find_assignment(module: cst.Module, name: str) -> cst.SimpleStatementLine | None:
    """The top-level `name = ...` or `name: T = ...` statement."""
    for statement in module.body:
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            small = statement.body[0]
            if (
                isinstance(small, cst.AnnAssign)
                and isinstance(small.target, cst.Name)
                and small.target.value == name
            ):
                return statement
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                target = small.targets[0].target
                if isinstance(target, cst.Name) and target.value == name:
                    return statement
    return None


def assigned_value(statement: cst.SimpleStatementLine) -> cst.BaseExpression | None:
    small = statement.body[0]
    if isinstance(small, cst.AnnAssign | cst.Assign):
        return small.value
    return None


def class_members(node: cst.ClassDef) -> list[str]:
    """Names assigned in the class body (`X = ...` and `x: T`)."""
    names: list[str] = []
    for statement in node.body.body:
        if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
            small = statement.body[0]
            if isinstance(small, cst.Assign) and isinstance(small.targets[0].target, cst.Name):
                names.append(small.targets[0].target.value)
            elif isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                names.append(small.target.value)
    return names


def _is_docstring(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )


def insert_after_last(
    body: Sequence[cst.BaseStatement],
    new: cst.BaseStatement,
    where: Callable[[cst.BaseStatement], bool],
) -> list[cst.BaseStatement]:
    """`body` with `new` after the last statement `where` accepts (after a docstring, else).

    The new statement copies no blank lines: it joins the run it follows.
    """
    items = list(body)
    last = -1
    for i, statement in enumerate(items):
        if where(statement):
            last = i
    if last < 0:
        last = 0 if items and _is_docstring(items[0]) else -1
        new = new.with_changes(leading_lines=[cst.EmptyLine(indent=False)]) if last == 0 else new
    items.insert(last + 1, new)
    return items


def is_simple(kind: type[cst.CSTNode]) -> Callable[[cst.BaseStatement], bool]:
    def check(statement: cst.BaseStatement) -> bool:
        return (
            isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and isinstance(statement.body[0], kind)
        )

    return check
