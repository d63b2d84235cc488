"""Rendered markdown and YAML in the layout prettier 3 writes, so a host's formatter run
changes nothing the template wrote and an update merges against the user's copy line by
line (docs/updating.md, "Formatters"; docs/decisions/0027).

- `md_table`: a Jinja filter over a GFM pipe table (`{% filter md_table %}...{% endfilter %}`)
  that pads every column to its widest cell, as prettier's markdown printer does;
- `answers_yaml`: the answers file with prettier's quotes (double, unless the value holds
  more double quotes than single ones) and two-space indents;
- `compact_tables`: the inverse of `md_table`, the layout the template rendered before
  (`| a | b |`, `|---|---|`); extensions/lifecycle.py `compact` puts a formatted copy back
  into it before an update from such a release, so the update's 3-way merge sees no edit.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Any

import yaml
from jinja2 import Environment
from jinja2.ext import Extension

_DELIMITER_CELL = re.compile(r"^:?-+:?$")
_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def _width(text: str) -> int:
    """Columns `text` takes in a monospace font (East Asian wide and full-width count 2),
    the measure prettier pads by (its `getStringWidth`)."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _cells(line: str) -> list[str]:
    """The cells of one table row, stripped; `\\|` stays inside its cell (GFM)."""
    body = line.strip()
    body = body.removeprefix("|")
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    return [cell.strip() for cell in _UNESCAPED_PIPE.split(body)]


def _is_table(lines: list[str]) -> bool:
    """A header row, then a delimiter row of as many `---` cells (GFM)."""
    if len(lines) < 2 or "|" not in lines[0]:
        return False
    delimiter = _cells(lines[1])
    return len(delimiter) == len(_cells(lines[0])) and all(
        _DELIMITER_CELL.match(cell) for cell in delimiter
    )


def _align(lines: list[str]) -> list[str]:
    """One table's rows padded to the widest cell of each column (at least 3), its
    delimiter row `| --- |` with its alignment colons, as prettier prints them."""
    rows = [_cells(line) for line in lines]
    header, delimiter, body = rows[0], rows[1], rows[2:]
    columns = max(len(row) for row in rows)  # a short row stays short, as prettier keeps it
    delimiter += [""] * (columns - len(delimiter))
    colons = [(cell.startswith(":"), cell.endswith(":")) for cell in delimiter]
    widths = [
        max(3, *(_width(row[c]) for row in [header, *body] if c < len(row))) for c in range(columns)
    ]

    def pad(cell: str, c: int) -> str:
        space = widths[c] - _width(cell)
        left = {(False, True): space, (True, True): space // 2}.get(colons[c], 0)
        return " " * left + cell + " " * (space - left)

    def rule(c: int) -> str:
        left, right = colons[c]
        return (":" if left else "") + "-" * (widths[c] - left - right) + (":" if right else "")

    out = ["| " + " | ".join(pad(cell, c) for c, cell in enumerate(header)) + " |"]
    out.append("| " + " | ".join(rule(c) for c in range(len(header))) + " |")
    out += ["| " + " | ".join(pad(cell, c) for c, cell in enumerate(row)) + " |" for row in body]
    return out


def _compact(lines: list[str]) -> list[str]:
    """One table in the layout releases before 0.2.0 rendered: `| a | b |`, `|---|---|`."""
    rows = [_cells(line) for line in lines]
    rule = [(":" if c.startswith(":") else "") + "---" + (":" if c.endswith(":") else "")
            for c in rows[1]]  # fmt: skip
    return [
        "| " + " | ".join(rows[0]) + " |",
        "|" + "|".join(rule) + "|",
        *("| " + " | ".join(row) + " |" for row in rows[2:]),
    ]


def _tables(text: str, layout: Callable[[list[str]], list[str]]) -> str:
    """`text` with every pipe table (a run of lines starting with `|`, outside code
    fences) laid out by `layout`; everything else, the line endings included, unchanged."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    fence = ""
    n = 0
    while n < len(lines):
        stripped = lines[n].strip()
        if stripped.startswith(("```", "~~~")):
            fence = "" if fence and stripped.startswith(fence) else (fence or stripped[:3])
        if fence or not stripped.startswith("|"):
            out.append(lines[n])
            n += 1
            continue
        end = n
        while end < len(lines) and lines[end].strip().startswith("|"):
            end += 1
        block = [line.rstrip("\r\n") for line in lines[n:end]]
        if _is_table(block):
            laid = layout(block)
            last = lines[end - 1][len(block[-1]) :]  # the table's own last line ending
            out += [f"{line}\n" for line in laid[:-1]] + [laid[-1] + last]
        else:
            out += lines[n:end]
        n = end
    return "".join(out)


def md_table(text: str) -> str:
    """Every GFM pipe table in `text` aligned as prettier 3 aligns it; other lines kept."""
    return _tables(text, _align)


def compact_tables(text: str) -> str:
    """Every GFM pipe table in `text` unpadded (`md_table`'s inverse for a table the
    template rendered before 0.2.0); other lines kept."""
    return _tables(text, _compact)


class _PrettierQuotes(yaml.SafeDumper):
    """PyYAML's safe dumper with prettier's preference for double quotes and its
    indented block sequences."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)

    def choose_scalar_style(self) -> str:
        style = str(super().choose_scalar_style())
        value = str(self.event.value) if isinstance(self.event, yaml.ScalarEvent) else ""
        if style == "'" and value.count('"') <= value.count("'"):
            return '"'
        return style


def answers_yaml(answers: dict[str, Any]) -> str:
    """The answers as block YAML, keys sorted (copier's `to_nice_yaml` order), quoted only
    where YAML needs it and then in double quotes, nested levels indented by two spaces."""
    return yaml.dump(
        answers,
        Dumper=_PrettierQuotes,
        indent=2,
        width=1 << 16,
        allow_unicode=True,
        default_flow_style=False,
        sort_keys=True,
    )


class FormattingExtension(Extension):
    """Adds the `md_table` and `answers_yaml` filters (copier.yml `_jinja_extensions`)."""

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        environment.filters["md_table"] = md_table
        environment.filters["answers_yaml"] = answers_yaml
