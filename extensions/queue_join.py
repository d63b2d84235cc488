"""Join the template's queue revisions with the host's own, so the queue role keeps one head.

Run by copier as a task in the destination after the patcher (copier.yml `_tasks`):

    python <template>/extensions/queue_join.py --operation update --answers-file workers/<name>/.copier-answers.yml

The template's revisions of the `queue` role form one fixed chain: `<stamp>` (work_items),
then `<stamp>_<change>` for each release that changes the queue's schema, each following
the one before it (docs/decisions/0012). A host may add its own queue revisions after any
of them. When an update then brings a newer template revision, the role has two heads:
the template's and the host's, and `alembic upgrade head` refuses to choose. This task
finds that case and writes one merge revision,
`om/migrations/versions/queue/<template head>_join.py`, whose `down_revision` names both
heads: the role has one head again, and a database at the host's head gets the template's
revision and the merge on its next `make migrate`. The file changes no schema and belongs
to the host once written (commit it with the update).

The task writes nothing when the role has one head, when the template's newest revision
is not a head (the host's revisions already follow it, or a join was written before), in
copier's update replays (bare temporary folders), and for a worker that does not own the
`work` namespace. When the host's own revisions have several heads besides the template's,
it writes nothing and says so: which of them to join is the host's decision.

Only the standard library and PyYAML (a dependency of copier itself) are used.
"""

from __future__ import annotations

import argparse
import functools
import runpy
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

VERSIONS = Path("om/migrations/versions/queue")
LINE_LENGTH = 100  # the host's ruff line length (docs/host-contract.md)


# `_sibling("naming")`: extensions/naming.py, loaded once per template checkout (siblings.py).
_sibling: Callable[[str], ModuleType] = functools.partial(
    runpy.run_path(str(Path(__file__).with_name("siblings.py")))["load"], __file__
)


if TYPE_CHECKING:
    import hostfacts
else:
    hostfacts = _sibling("hostfacts")


def template_files(versions: Path, stamp: str) -> list[Path]:
    """The template's revision files of the queue role: `<stamp>_work_items*.py`."""
    return sorted(versions.glob(f"{stamp}_work_items*.py"))


def template_head(versions: Path, stamp: str) -> str:
    """The newest revision of the template's chain in `versions`, '' when it has none.

    The chain is the revisions of `template_files`; its newest is the one no other
    revision of the chain follows.
    """
    chain: dict[str, tuple[str, ...]] = {}
    for path in template_files(versions, stamp):
        found = hostfacts.literal_assignments(
            path.read_text(encoding="utf-8"), ("revision", "down_revision")
        )
        rev, down = found.get("revision"), found.get("down_revision")
        if isinstance(rev, str) and rev:
            chain[rev] = (down,) if isinstance(down, str) and down else ()
    heads = hostfacts.graph_heads(chain)
    return heads[0] if len(heads) == 1 else ""


@dataclass(frozen=True)
class Plan:
    """What the queue role needs: `join` (the revisions a merge revision follows, the
    template's last) or nothing, and why (`reason`, one line for the user). `warn` when
    the role is left with several heads the user must join."""

    join: tuple[str, ...]
    reason: str
    warn: bool = False

    @property
    def revision(self) -> str:
        return f"{self.join[-1]}_join" if self.join else ""


def plan(versions: Path, stamp: str) -> Plan:
    """Whether the queue role in `versions` needs a join of the template's head, and of what."""
    newest = template_head(versions, stamp)
    if not newest:
        return Plan((), "no template revision of the queue role here")
    heads = hostfacts.graph_heads(hostfacts.revision_graph(versions))
    if newest not in heads:
        return Plan((), f"the template's {newest} is followed already")
    others = [head for head in heads if head != newest]
    if not others:
        return Plan((), f"one head, {newest}")
    if len(others) > 1:
        return Plan(
            (),
            f"the queue role has several heads of its own ({', '.join(others)}) besides the "
            f"template's {newest}; join them with `alembic merge` (the template's updating "
            "guide, Schema changes)",
            warn=True,
        )
    return Plan((others[0], newest), f"joins {others[0]} and the template's {newest}")


def join_source(revision: str, parents: tuple[str, ...]) -> str:
    """The merge revision `revision` following `parents`, formatted as ruff formats it."""
    down = "down_revision = (" + ", ".join(f'"{p}"' for p in parents) + ")"
    if len(down) > LINE_LENGTH:
        down = "down_revision = (\n" + "".join(f'    "{p}",\n' for p in parents) + ")"
    return f'''"""Joins the work queue's revisions from the worker template with this host's own.

The queue role had two heads, the template's newest revision and this host's; this merge
revision makes them one again and changes no schema. The template's update wrote it; it is
this host's file from now on.

Revision ID: {revision}
Revises: {", ".join(parents)}
"""

revision = "{revision}"
{down}


def upgrade() -> None:
    """A merge point: nothing to apply."""


def downgrade() -> None:
    """A merge point: nothing to undo."""
'''


def join(host: Path, stamp: str) -> tuple[Path | None, Plan]:
    """Write the join the queue role of `host` needs, if any. Returns its path (None when
    nothing was written) and the plan. An existing file of the join's name is never
    overwritten."""
    versions = host / VERSIONS
    if not versions.is_dir():
        return None, Plan((), "no queue revisions here")
    needed = plan(versions, stamp)
    if not needed.join:
        return None, needed
    path = versions / f"{needed.revision}.py"
    if path.exists():
        return None, Plan(
            (), f"{path.relative_to(host)} exists already; it is left as it is", warn=True
        )
    path.write_text(join_source(needed.revision, needed.join), encoding="utf-8")
    return path, needed


def is_replay(folder: Path) -> bool:
    """True for copier's temporary update copies (bare folders, no git work tree)."""
    return folder.resolve().name.startswith("copier._main.") or not (folder / ".git").exists()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operation", choices=["copy", "update"], required=True)
    parser.add_argument("--answers-file", required=True, help="relative to the destination")
    parser.add_argument("--host", default=".", help="the host root (default: the current folder)")
    args = parser.parse_args(argv)
    host = Path(args.host)
    answers_file = host / args.answers_file
    if is_replay(host) or not answers_file.is_file():
        return 0  # an update replay in a bare temporary folder: no host revisions there
    import yaml

    answers = yaml.safe_load(answers_file.read_text(encoding="utf-8")) or {}
    stamp = str(answers.get("migration_stamp") or "")
    if answers.get("namespace_absent") is not True or not stamp:
        return 0  # only the worker that owns the work namespace renders its revisions
    written, why = join(host, stamp)
    if written is not None:
        print(f"    joined   {written.relative_to(host)} ({why.reason}: one head)")
    elif why.warn:
        print(f"worker-template: the queue role was not joined: {why.reason}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
