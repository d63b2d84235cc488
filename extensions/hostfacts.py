"""Host discovery: what the destination repository holds, read once and cached."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any

_REVISION = re.compile(r"^revision\s*(?::\s*str\s*)?=\s*['\"]([^'\"]+)['\"]", re.M)
_DOWN = re.compile(r"^down_revision\s*(?::[^=]+)?=\s*['\"]?([^'\"\n]*)['\"]?", re.M)


@lru_cache(maxsize=16)
def _discover(dst: str) -> dict[str, Any]:
    root_dir = Path(dst)
    candidates = sorted(p.parent.name for p in root_dir.glob("om/src/*/om/__init__.py"))
    root = candidates[0] if len(candidates) == 1 else ""
    namespace_absent = not (root and (root_dir / f"om/src/{root}/om/work/__init__.py").exists())
    return {
        "is_host": bool(root) and (root_dir / "pyproject.toml").is_file(),
        "root": root,
        "roots": candidates,
        "namespace_absent": namespace_absent,
        "queue_head": queue_head(root_dir / "om/migrations/versions/queue"),
    }


def queue_head(versions: Path) -> str:
    """The head revision of one alembic history folder, '' when it holds none."""
    revisions: dict[str, str] = {}
    for path in versions.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        rev = _REVISION.search(text)
        down = _DOWN.search(text)
        if rev:
            revisions[rev.group(1)] = (down.group(1).strip() if down else "") or ""
    parents = {d for d in revisions.values() if d and d != "None"}
    heads = sorted(r for r in revisions if r not in parents)
    return heads[0] if len(heads) == 1 else ""


def discover_host(dst: Path) -> dict[str, Any]:
    """Host facts for the destination (cached per resolved path)."""
    return dict(_discover(str(dst.resolve())))
