"""The engine's files render from their plain-Python source in `engine/` (docs/decisions/0029).

`engine/` is the engine as it stands in a host whose package root is `acme`: ruff, mypy
and pytest read it there (`make engine-check`). A template file `<path>.py.jinja` that
holds `{{ engine_source("<engine path>") }}` renders that source with the host's root:
`acme` as a whole word (imports, `acme-test`) becomes `host_root`, and the `ACME_`
environment prefix becomes its upper case. The source is read as text, never parsed as a
template, so braces in Python stay as written.
"""

from __future__ import annotations

import re
from pathlib import Path

from jinja2 import Environment, pass_context
from jinja2.ext import Extension
from jinja2.runtime import Context

ENGINE = Path(__file__).resolve().parent.parent / "engine"
SOURCE_ROOT = "acme"
_ROOT_WORD = re.compile(r"(?<![A-Za-z0-9_])acme(?![A-Za-z0-9_])")
_ENV_PREFIX = re.compile(r"(?<![A-Za-z0-9_])ACME_")


def rewrite_root(source: str, host_root: str) -> str:
    """`source` (written for the root `acme`) as it reads in a host whose root is `host_root`."""
    source = _ROOT_WORD.sub(host_root, source)
    return _ENV_PREFIX.sub(f"{host_root.upper()}_", source)


def read_engine(path: str) -> str:
    """The text of `engine/<path>`; ValueError for a path outside `engine/`."""
    file = (ENGINE / path).resolve()
    if not file.is_relative_to(ENGINE):
        raise ValueError(f"engine_source: {path!r} is outside engine/")
    return file.read_text(encoding="utf-8")


@pass_context
def engine_source(context: Context, path: str) -> str:
    """`engine/<path>` rewritten for the render's `host_root`."""
    return rewrite_root(read_engine(path), str(context["host_root"]))


class EngineSourceExtension(Extension):
    """Adds the `engine_source(path)` global to copier's Jinja environment."""

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        environment.globals["engine_source"] = engine_source
