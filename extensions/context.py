"""Copier context hook: derived names and host facts, computed once per render.

The hook runs on every Jinja render (copier-facts §7), in the prompt and render phases of
copy and of all three update passes. It must stay cheap, pure and replay-safe: during
update replays the destination is a bare temporary folder, so host facts come from the
recorded answers there, never from the folder.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from copier_template_extensions import ContextHook

sys.path.insert(0, str(Path(__file__).resolve().parent))

from naming import derive_names  # noqa: E402
from hostfacts import discover_host  # noqa: E402


class ContextUpdater(ContextHook):
    """Adds `_host` (discovered host facts) and the derived names to the Jinja context."""

    def hook(self, context: dict[str, Any]) -> None:
        conf = context.get("_copier_conf")
        dst = Path(str(getattr(conf, "dst_path", None) or conf["dst_path"])) if conf else Path(".")
        context["_host"] = discover_host(dst)
        names = derive_names(
            worker_name=str(context.get("worker_name") or ""),
            work_kind=str(context.get("work_kind") or ""),
        )
        context.update(names)
