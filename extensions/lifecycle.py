"""The worker lifecycle in the host: update helpers (fragments) and path-rename migrations.

Fragments (applied by extensions/patcher.py with the others, idempotent, template-owned):

- `scripts/workers.py`: the host helper (extensions/host_workers.py, copied verbatim). It
  runs `copier update` from the host root with a worker's answers file and the right
  `--vcs-ref`, reports conflicts, and removes, renames and restores workers.
- `Makefile`: the targets `update-worker`, `update-workers`, `check-update`, `remove-worker`,
  `rename-worker`, `restore-worker-file`, `check-worker-env`, in one block between
  `# >>> worker-template` and `# <<< worker-template`. The block is the template's: each patcher run writes the current
  version of it, so `copier update` brings improvements.
- `.github/workflows/ci.yml`: a `worker-template-updates` job that runs `make check-update`
  (added once; the host owns it from then on).

A host file without what a fragment needs (no Makefile, a Makefile that defines one of the
targets itself, a `scripts/workers.py` that is not ours, a CI workflow without `jobs`) is
refused before rendering, `<file>: <missing part>`.

The migration command, for a release that moves a rendered path (copier.yml `_migrations`,
after stage; docs/updating.md, "Releases"):

    python extensions/lifecycle.py move --answers-file <file> --from <old> --to <new>

`<old>`/`<new>` may hold `{worker_name}`, `{worker_module}`, `{host_root}`, `{kind_snake}`
(copier does not render answers in `_migrations`, so the script reads them).
Copier deletes the old path (the new template no longer has it) and writes the new one as
the template renders it; the command 3-way merges the user's old file (from git `HEAD`)
into the new one, with the old template's rendering of the old path as the base, so a
user's edit survives the move and an overlapping one gives copier's inline markers.

The migration command, for a release that stops rendering a file because its code moves
into code all workers share (copier.yml `_migrations`, before stage):

    python extensions/lifecycle.py retire --answers-file <file> --path <path> [--path ...]
                                          [--note <where the code went>]

Copier would delete the file on update, edits included. Before it writes anything, the
command compares the user's copy with the old release's rendering of it: unedited (or
absent, or never rendered for these answers), the update goes on and copier deletes it;
edited, the command prints one line naming the file(s) and what to do, and exits 1, so
copier stops with nothing written.

The migration command, for a release that changes the shape of a worker file the user
edits (v0.2.0: `settings.py` and `container.py` became subclasses of the worker runtime's;
docs/decisions/0017), run in both stages:

    python extensions/lifecycle.py carry --answers-file <file> --path <path> [--path ...]

Before, an edit the carry cannot move (extensions/carry.py) stops the update with one line;
a movable one is set aside (the file goes back to the old release's rendering, so copier's
merge writes the new shape cleanly). After, the edits (from git `HEAD`) go into the new
shape.

The migration command, for a release that renders its markdown tables aligned where the
old one rendered them unpadded (v0.2.0; extensions/formatting.py), before stage:

    python extensions/lifecycle.py compact --answers-file <file> --path <path> [--path ...]
                                           [--owner-path <path> ...]

A host whose formatter (prettier) aligned those tables would see each one in conflict: the
old rendering, the user's copy and the new rendering all differ on every row. The command
writes the user's tables back unpadded, in the working tree and the index (copier diffs
the index), so only the user's own edits remain to merge; the new rendering is aligned
again. Run in both stages: after, it puts those index entries back to `HEAD`. `--owner-path` names a file only the `work` namespace's owner renders.

Two more stop a worker other than the namespace owner until the owner's update brought
what its new version needs (before stage, nothing written): `needs-engine --api <n>` (the
worker runtime, v0.2.0) and `needs-owner --path <path> [--path ...]` (files the owner
renders: v0.2.0, the Terraform worker module, docs/decisions/0031).

Two more carry a worker's Terraform files across v0.2.0 (docs/decisions/0031):
`carry-terraform` (both stages) does for `environments/<env>/worker_<module>.tf` what `carry`
does for settings.py, the settings values and sizes a user changed going into the short
instance, any other edit stopping the update; `terraform-moves` (after stage) writes the
`moved` blocks from the addresses the old file declared into `worker_<module>.moved.tf`
beside it, once, so only a host whose state predates the module has them.

All these commands act only in the real host (a git work tree outside copier's temporary
folders, `is_real_host`): copier 9.19.1 runs `_migrations` in the real destination only,
but a replay that ran them would find no host to change, and they must stay replay-safe.
The guard scripts/release_guard.py reads these commands' arguments (`build_parser`) to
tell which released paths a `_migrations` entry carries across.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import hashlib
import importlib.util
import os
import re
import runpy
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

HELPER_SOURCE = Path(__file__).resolve().with_name("host_workers.py")
HELPER_PATH = "scripts/workers.py"
HELPER_MARK = "# worker-template: host helper"
MAKEFILE = "Makefile"
MAKE_START = "# >>> worker-template"
MAKE_END = "# <<< worker-template"
MAKE_TARGETS = (
    "update-worker",
    "update-workers",
    "check-update",
    "remove-worker",
    "add-kind",
    "remove-kind",
    "rename-worker",
    "restore-worker-file",
    "check-worker-env",
)
CI_WORKFLOW = ".github/workflows/ci.yml"
CI_JOB = "worker-template-updates"
REPLAY_PREFIX = "copier._main."

MAKE_BLOCK = f"""{MAKE_START} (written by the worker template; `copier update` replaces this block)
# Workers made by the worker template: docs/updating.md in the template explains each target.
# make exits 2 on any failure; the last line names the helper's own code (docs/updating.md).
WORKERS_PY ?= python3 scripts/workers.py
WORKERS_EXIT = code=$$?; [ $$code -eq 0 ] || echo "scripts/workers.py exited $$code \
(1 refused, 2 conflicts left to resolve, 3 stopped after a worker's update)" >&2; exit $$code
.PHONY: {" ".join(MAKE_TARGETS)}

update-worker:  ## copier update of one worker: NAME=<worker> [REF=<template ref>]
\t@$(WORKERS_PY) update "$(NAME)" $(if $(REF),--ref "$(REF)"); $(WORKERS_EXIT)

update-workers:  ## every worker, one at a time; COMMIT=1 commits each worker's update
\t@$(WORKERS_PY) update-all $(if $(filter 1 yes true,$(COMMIT)),--commit); $(WORKERS_EXIT)

check-update:  ## list the workers behind the template (STRICT=1 fails when any is)
\t@$(WORKERS_PY) check-update; $(WORKERS_EXIT)

remove-worker:  ## NAME=<worker>: its files, kinds and fragments removed
\t@$(WORKERS_PY) remove "$(NAME)"; $(WORKERS_EXIT)

add-kind:  ## NAME=<worker> KIND=<KIND>: the worker handles one more kind
\t@$(WORKERS_PY) add-kind "$(NAME)" "$(KIND)"; $(WORKERS_EXIT)

remove-kind:  ## NAME=<worker> KIND=<KIND>: a kind added to it, taken away
\t@$(WORKERS_PY) remove-kind "$(NAME)" "$(KIND)"; $(WORKERS_EXIT)

rename-worker:  ## NAME=<worker> TO=<new-name>
\t@$(WORKERS_PY) rename "$(NAME)" "$(TO)"; $(WORKERS_EXIT)

restore-worker-file:  ## NAME=<worker> FILE=<path> [FORCE=1]: a deleted worker file rendered again
\t@$(WORKERS_PY) restore "$(NAME)" "$(FILE)" $(if $(filter 1 yes true,$(FORCE)),--force); $(WORKERS_EXIT)

check-worker-env:  ## lines of your .env still at a default .env.example has since changed
\t@$(WORKERS_PY) check-env
{MAKE_END}
"""


class Missing(Exception):
    """A host file lacks what a lifecycle fragment needs; str() is `<file>: <missing part>`."""


@dataclass(frozen=True)
class Edit:
    """One lifecycle fragment: the host file, the edit, and the content when it is absent."""

    name: str
    path: str
    edit: Callable[[str], str]
    create: Callable[[], str] | None = None


class SpecLike(Protocol):
    @property
    def worker_name(self) -> str: ...


# `_sibling("naming")`: extensions/naming.py, loaded once per template checkout (siblings.py).
_sibling: Callable[[str], ModuleType] = functools.partial(
    runpy.run_path(str(Path(__file__).with_name("siblings.py")))["load"], __file__
)


# --- fragments -------------------------------------------------------------------------------


def helper_text() -> str:
    """The host helper as the template ships it."""
    return HELPER_SOURCE.read_text(encoding="utf-8")


def edit_helper(text: str) -> str:
    """`scripts/workers.py`: the template's current helper (refuses a file that is not ours)."""
    if HELPER_MARK not in text.splitlines()[:3] and HELPER_MARK not in text[:300]:
        raise Missing(f"{HELPER_PATH}: exists and is not the worker template's helper")
    return helper_text()


def edit_makefile(text: str) -> str:
    """`Makefile`: the worker-template block, appended once and kept current."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, l in enumerate(lines) if l.startswith(MAKE_START)]
    ends = [i for i, l in enumerate(lines) if l.strip() == MAKE_END]
    outside = lines
    if starts and ends and ends[0] > starts[0]:
        outside = lines[: starts[0]] + lines[ends[0] + 1 :]
    defined = [
        t for t in MAKE_TARGETS if any(re.match(rf"^{re.escape(t)}\s*::?(?!=)", l) for l in outside)
    ]
    if defined:
        raise Missing(
            f"{MAKEFILE}: defines {', '.join(defined)} itself (outside the "
            f"`{MAKE_START}` block); rename those targets"
        )
    if starts and ends and ends[0] > starts[0]:
        return "".join(lines[: starts[0]]) + MAKE_BLOCK + "".join(lines[ends[0] + 1 :])
    if starts or ends:
        raise Missing(f"{MAKEFILE}: a `{MAKE_START}` marker without its `{MAKE_END}` (or reverse)")
    sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
    return text + sep + MAKE_BLOCK


def edit_ci(text: str) -> str:
    """`ci.yml`: a job that lists the workers behind the template (added once)."""
    deploy = _sibling("deploy")
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    try:
        yaml, data = deploy.load(text, CI_WORKFLOW)
    except deploy.Missing as exc:
        raise Missing(str(exc)) from exc
    jobs = data.get("jobs")
    if not isinstance(jobs, CommentedMap):
        raise Missing(f"{CI_WORKFLOW}: no `jobs` mapping")
    if CI_JOB in jobs:
        return text
    step_checkout = CommentedMap([("uses", "actions/checkout@v4")])
    step_check = CommentedMap(
        [("name", "Workers behind the worker template"), ("run", "make check-update")]
    )
    job = CommentedMap(
        [
            ("runs-on", "ubuntu-24.04"),
            ("timeout-minutes", 5),
            ("steps", CommentedSeq([step_checkout, step_check])),
        ]
    )
    jobs[CI_JOB] = job
    jobs.yaml_set_comment_before_after_key(CI_JOB, before="\n")
    return str(deploy._dump(yaml, data))


def make_block(text: str) -> str | None:
    """The worker-template block of a Makefile's `text` (markers included), or None."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, l in enumerate(lines) if l.startswith(MAKE_START)]
    ends = [i for i, l in enumerate(lines) if l.strip() == MAKE_END]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        return None
    return "".join(lines[starts[0] : ends[0] + 1])


def shipped_at(commit: str) -> tuple[str, str] | None:
    """The helper and the Makefile block the template wrote at `commit` (of the template
    repository this file runs from), or None when that commit or its files are not there."""
    repo = HELPER_SOURCE.parent.parent
    helper = _git(repo, "show", f"{commit}:extensions/host_workers.py")
    source = _git(repo, "show", f"{commit}:extensions/lifecycle.py")
    if helper.returncode != 0 or source.returncode != 0:
        return None
    # the sibling loader beside it, in the versions that read one (extensions/siblings.py)
    siblings = _git(repo, "show", f"{commit}:extensions/siblings.py")
    digest = hashlib.sha1(source.stdout.encode()).hexdigest()[:12]
    key = f"_worker_template_shipped_{digest}"
    module = sys.modules.get(key)
    if module is None:
        with tempfile.TemporaryDirectory(prefix="worker-template-shipped-") as tmp:
            path = Path(tmp) / "lifecycle.py"
            path.write_text(source.stdout, encoding="utf-8")
            if siblings.returncode == 0:
                path.with_name("siblings.py").write_text(siblings.stdout, encoding="utf-8")
            spec = importlib.util.spec_from_file_location(key, path)
            if spec is None or spec.loader is None:
                return None
            module = importlib.util.module_from_spec(spec)
            sys.modules[key] = module  # its dataclasses look their module up by name
            try:
                spec.loader.exec_module(module)
            except (ImportError, SyntaxError, NameError, AttributeError):  # unknown: not shipped
                del sys.modules[key]
                return None
    block = getattr(module, "MAKE_BLOCK", None)
    return (helper.stdout, block) if isinstance(block, str) else None


def overwritten_edits(host: Path, commits: list[str]) -> list[str]:
    """The template-owned host files (`scripts/workers.py`, the Makefile block) whose text
    is none the template wrote, at `commits` (the workers' recorded versions) or now: the
    user edited them, and applying the fragments replaces the edit. One line each,
    `<path>: <what to do>`, for the patcher to print as `overwrote <path>: ...`."""
    helper_path, makefile = host / HELPER_PATH, host / MAKEFILE
    helper = helper_path.read_text(encoding="utf-8") if helper_path.is_file() else None
    block = make_block(makefile.read_text(encoding="utf-8")) if makefile.is_file() else None
    helper_edited = helper is not None and helper != helper_text()
    block_edited = block is not None and block != MAKE_BLOCK
    for commit in dict.fromkeys(commits):
        if not (helper_edited or block_edited):
            break
        shipped = shipped_at(commit)
        if shipped is not None:
            helper_edited = helper_edited and helper != shipped[0]
            block_edited = block_edited and block != shipped[1]
    found: list[str] = []
    if helper_edited:
        found.append(
            f"{HELPER_PATH}: your edits were replaced by the template's helper, which every "
            f"copy and update rewrites (git diff {HELPER_PATH} shows them); keep your own "
            "code in another file"
        )
    if block_edited:
        found.append(
            f"{MAKEFILE}: your edits in the `{MAKE_START}` block were replaced by the "
            f"template's, which every copy and update rewrites (git diff {MAKEFILE} shows "
            "them); put your own targets outside the block"
        )
    return found


def fragments(spec: SpecLike) -> list[Edit]:
    """The lifecycle fragments, the same for every worker (so applying them again is a no-op)."""
    return [
        Edit("workers helper", HELPER_PATH, edit_helper, create=helper_text),
        Edit("make targets", MAKEFILE, edit_makefile),
        Edit("ci check-update", CI_WORKFLOW, edit_ci),
    ]


# --- the path-move migration -------------------------------------------------------------------


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)


def _yaml() -> Any:
    """PyYAML, copier's own dependency (imported by name: mypy needs no stubs for it)."""
    return importlib.import_module("yaml")


def is_real_host(folder: Path) -> bool:
    """Not one of copier's temporary copies, and a git work tree (copier runs update replays
    in temporary folders that are no git work tree)."""
    resolved = folder.resolve()
    if any(p.name.startswith(REPLAY_PREFIX) for p in (resolved, *resolved.parents)):
        return False
    return (resolved / ".git").exists()


def names(answers: dict[str, Any]) -> dict[str, str]:
    """What a path pattern may name: every answer (not `_`-keys) and every derived name.

    `{"worker_name": "shipment-notifier", "worker_module": "shipment_notifier",
    "host_root": "acme", "kind_snake": "notify_shipment", ...}`, all values as strings.
    """
    naming = _sibling("naming")
    derived = naming.derive_names(
        worker_name=str(answers.get("worker_name", "")), work_kind=str(answers.get("work_kind", ""))
    )
    return {**{k: str(v) for k, v in answers.items() if not k.startswith("_")}, **derived}


def render_old(answers: dict[str, Any], src: str, ref: str, dst: Path) -> None:
    """Render the template at `ref` with `answers` into the empty folder `dst`.

    The recorded `host_root` skips the copy checks (copier.yml), and no task runs (they
    act on a real host only), so this renders files and nothing else.
    """
    import copier

    data = {k: v for k, v in answers.items() if not k.startswith("_")}
    copier.run_copy(
        src,
        str(dst),
        data=data,
        vcs_ref=ref,
        defaults=True,
        unsafe=True,
        quiet=True,
        skip_tasks=True,
    )


def move(host: Path, answers_file: str, old_pattern: str, new_pattern: str, ref_from: str) -> str:
    """Carry the user's version of a moved path into its new place; returns what it did.

    `answers_file` is relative to `host`; `old_pattern`/`new_pattern` are paths from the
    host root with `{placeholders}` (`names`); `ref_from` is the old template version
    (copier's `$VERSION_FROM`, else the recorded `_commit`). Never raises for a missing
    file: it returns `skipped: <why>`.
    """
    if not is_real_host(host):
        return "skipped: not the real host"
    recorded = _git(host, "show", f"HEAD:{answers_file}")
    if recorded.returncode != 0:
        return f"skipped: {answers_file} is not in HEAD"
    before = _yaml().safe_load(recorded.stdout) or {}
    fill = names(before)
    old, new = old_pattern.format(**fill), new_pattern.format(**fill)
    user = _git(host, "show", f"HEAD:{old}")
    target = host / new
    if user.returncode != 0:
        return f"skipped: {old} is not in HEAD"
    if not target.is_file():
        return f"skipped: the template does not render {new}"
    src = str(before.get("_src_path", ""))
    ref = ref_from or str(before.get("_commit", ""))
    with tempfile.TemporaryDirectory(prefix="worker-template.move.") as tmp:
        base_dir = Path(tmp) / "old"
        render_old(before, src, ref, base_dir)
        base = base_dir / old
        if not base.is_file():
            return f"skipped: the old template did not render {old}"
        mine = Path(tmp) / "mine"
        mine.write_text(user.stdout, encoding="utf-8")
        merged = subprocess.run(
            [
                "git",
                "merge-file",
                "-L",
                "before updating",
                "-L",
                "last update",
                "-L",
                "after updating",
                str(mine),
                str(base),
                str(target),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        target.write_text(mine.read_text(encoding="utf-8"), encoding="utf-8")
    if merged.returncode > 0:
        return f"moved {old} -> {new} with {merged.returncode} conflict(s): resolve the markers"
    return f"moved {old} -> {new}, your edits kept"


# --- the retire migration -----------------------------------------------------------------------


@dataclass(frozen=True)
class Retired:
    """What `retire` decided: `proceed` False stops the update; `message` is one line."""

    proceed: bool
    message: str


def _recorded_paths(
    host: Path, answers_file: str, patterns: list[str], command: str
) -> tuple[dict[str, Any], list[str]] | Retired:
    """The worker's answers as recorded in `HEAD` and `patterns` filled from them; a
    `Retired` to return instead when there is nothing to do (no answers in `HEAD`) or the
    entry is wrong (a placeholder `names` does not know)."""
    recorded = _git(host, "show", f"HEAD:{answers_file}")
    if recorded.returncode != 0:
        return Retired(True, f"skipped: {answers_file} is not in HEAD")
    before = _yaml().safe_load(recorded.stdout) or {}
    fill = names(before)
    try:
        return before, [pattern.format(**fill) for pattern in patterns]
    except (KeyError, IndexError) as exc:
        return Retired(False, f"{command}: unknown placeholder {exc} in {' '.join(patterns)}")


def retire(
    host: Path,
    answers_file: str,
    patterns: list[str],
    ref_from: str,
    ref_to: str = "",
    note: str = "",
    stage: str = "before",
) -> Retired:
    """Let copier delete retired files only where the user never edited them.

    `patterns` are paths from the host root with `{placeholders}` (`names`), filled from
    the answers recorded in `HEAD:<answers_file>`. Each file is compared, byte for byte,
    with the old template's rendering of it (`ref_from`, copier's `$VERSION_FROM`, else the
    recorded `_commit`; rendered with the recorded answers). A file the user deleted, or
    that the old template did not render for these answers (the user's own), is no
    concern of the update. Returns `Retired(True, ...)` to go on and `Retired(False, line)`
    with the edited files and what to do; a pattern naming an unknown placeholder and a
    run in copier's `after` stage (the files are already gone) also refuse, since both are
    mistakes in the template's `_migrations` entry. Never raises for a missing file.
    """
    if not is_real_host(host):
        return Retired(True, "skipped: not the real host")
    if stage == "after":
        return Retired(
            False,
            f"retire {' '.join(patterns)}: runs before copier deletes the files; the template's "
            "`_migrations` entry needs `when: \"{{ _stage == 'before' }}\"` (report it to "
            "the template's maintainers); `git checkout -- . && git clean -fd` undoes this update",
        )
    found = _recorded_paths(host, answers_file, patterns, "retire")
    if isinstance(found, Retired):
        return found
    before, paths = found
    fill = names(before)
    present = [path for path in paths if (host / path).is_file()]
    if not present:
        return Retired(True, f"skipped: {', '.join(paths)} not in the worker")
    src = str(before.get("_src_path", ""))
    ref = ref_from or str(before.get("_commit", ""))
    edited: list[str] = []
    unedited: list[str] = []
    with tempfile.TemporaryDirectory(prefix="worker-template.retire.") as tmp:
        old = Path(tmp) / "old"
        render_old(before, src, ref, old)
        for path in present:
            base = old / path
            if not base.is_file():
                continue  # never rendered for these answers: the user's file, copier keeps it
            if (host / path).read_bytes() == base.read_bytes():
                unedited.append(path)
            else:
                edited.append(path)
    if edited:
        them = "it" if len(edited) == 1 else "them"
        release = f"template {ref_to}" if ref_to else "the new template version"
        try:
            said = note.format(**fill)
        except (KeyError, IndexError, ValueError):
            said = note
        where = f" ({said})" if said else " (the template's CHANGELOG says where)"
        return Retired(
            False,
            f"{', '.join(edited)}: you changed {them} since template {ref}, and {release} "
            f"removes {them}: its code moves into code all workers share{where}. Nothing was "
            f"updated. Carry your change over to that code, `git rm` {them}, commit, and run "
            "the update again.",
        )
    if not unedited:
        return Retired(True, f"skipped: the old template did not render {', '.join(present)}")
    return Retired(True, f"retired {', '.join(unedited)}: unedited, the update removes them")


# --- the carry migration -------------------------------------------------------------------------


def _carry_one(carry: ModuleType, path: str, old: str, user: str) -> Any:
    """The user's edits of `path` (by its file name: settings.py or container.py)."""
    if path.endswith("/settings.py"):
        return carry.settings_edits(old, user)
    if path.endswith("/container.py"):
        return carry.container_edits(old, user)
    raise ValueError(f"carry: no carry for {path} (settings.py and container.py only)")


class CarryRefused(Exception):
    """An edit that cannot be carried: before the update, the whole line to print; after
    it, the reason the new version cannot take it."""


def _carry_across(
    host: Path,
    before: dict[str, Any],
    ref: str,
    users: dict[str, str],
    stage: str,
    read: Callable[[str, str, str], Any],
    apply: Callable[[str, str, Any], str],
) -> Retired:
    """The two stages of a carry over `users` (path -> the user's text at HEAD).

    Each path the user edited (against the old template's rendering at `ref`) gives its
    edits by `read(path, old, user)` (None: nothing to carry). Before: the file goes back
    to the old rendering in the working tree and the index, so copier's merge writes the
    new version clean. After: `apply(path, new, edits)` puts the edits into what copier
    wrote, and the index goes back to HEAD. A `CarryRefused` stops the update."""
    done: list[str] = []
    with tempfile.TemporaryDirectory(prefix="worker-template.carry.") as tmp:
        old = Path(tmp) / "old"
        render_old(before, str(before.get("_src_path", "")), ref, old)
        for path, user in users.items():
            base = old / path
            if not base.is_file() or base.read_text(encoding="utf-8") == user:
                continue
            try:
                edits = read(path, base.read_text(encoding="utf-8"), user)
            except CarryRefused as refused:
                return Retired(False, str(refused))
            if edits is None:
                continue
            target = host / path
            if stage == "before":
                target.write_text(base.read_text(encoding="utf-8"), encoding="utf-8")
                _git(host, "add", "--", path)
            elif target.is_file():
                _git(host, "reset", "-q", "--", path)
                try:
                    carried = apply(path, target.read_text(encoding="utf-8"), edits)
                except CarryRefused as refused:
                    return Retired(
                        False,
                        f"{path}: your edits could not be carried into the new version "
                        f"({refused}); they are in `git show HEAD:{path}`: put them back by "
                        "hand, or undo the update with `git checkout -- . && git clean -fd`",
                    )
                target.write_text(carried, encoding="utf-8")
            else:
                continue
            done.append(path)
    if not done:
        return Retired(True, "skipped: no edits to carry")
    verb = "will carry your edits of" if stage == "before" else "carried your edits into"
    return Retired(True, f"{verb} {', '.join(done)}")


def carry_edits(
    host: Path, answers_file: str, patterns: list[str], ref_from: str, stage: str
) -> Retired:
    """Carry the user's edits of the files `patterns` names across the runtime move
    (extensions/carry.py says what moves and how), in copier's two migration stages.

    Before: each file the user edited (HEAD against the old template's rendering, as
    `retire` compares) is checked; an edit that cannot be carried stops the update, its
    line naming the file and the part, with nothing written. Otherwise the file is put
    back to the old rendering, in the working tree and the index, so copier's merge writes
    the new version without conflicts. After: the edits (read again from HEAD) go into the
    new version copier wrote, and the index is reset to HEAD. Returns `Retired(True, what
    it did)`, or `Retired(False, line)` to stop.
    """
    if not is_real_host(host):
        return Retired(True, "skipped: not the real host")
    found = _recorded_paths(host, answers_file, patterns, "carry")
    if isinstance(found, Retired):
        return found
    before, paths = found
    users = {path: _git(host, "show", f"HEAD:{path}") for path in paths}
    present = [path for path, shown in users.items() if shown.returncode == 0]
    if not present:
        return Retired(True, f"skipped: {', '.join(paths)} not in HEAD")
    carry = _sibling("carry")
    root = str(before.get("host_root", ""))
    length = int(_sibling("patcher").line_length(host))

    def read(path: str, old: str, user: str) -> Any:
        try:
            edits = _carry_one(carry, path, old, user)
        except carry.Unsupported as exc:
            raise CarryRefused(
                f"{path}: {exc}. Nothing was updated. Undo that change (or move it by hand "
                "after the update), commit, and run the update again."
            ) from exc
        return None if edits.empty else edits

    def apply(path: str, new: str, edits: Any) -> str:
        put = carry.apply_settings if path.endswith("/settings.py") else carry.apply_container
        try:
            return str(put(new, edits, root, length))
        except carry.Unsupported as exc:  # the new version is not the shape expected
            raise CarryRefused(str(exc)) from exc

    ref = ref_from or str(before.get("_commit", ""))
    return _carry_across(
        host, before, ref, {p: users[p].stdout for p in present}, stage, read, apply
    )


# --- the compact migration -----------------------------------------------------------------------


def compact(
    host: Path,
    answers_file: str,
    patterns: list[str],
    owner_patterns: list[str],
    stage: str = "before",
) -> Retired:
    """Put the tables of the worker's rendered markdown files back in the unpadded layout
    releases before 0.2.0 rendered (extensions/formatting.py `compact_tables`), in the
    working tree and the index (copier diffs the index), so a formatter's alignment is no
    edit to merge. After the merge (`stage` "after"), the index entries it staged go back
    to `HEAD`, except where copier left the file unmerged.

    `patterns` and `owner_patterns` are paths with `{placeholders}` filled from the answers
    recorded in `HEAD:<answers_file>`; `owner_patterns` count only when this worker owns
    the `work` namespace. Missing files are skipped; never raises for one.
    """
    if not is_real_host(host):
        return Retired(True, "skipped: not the real host")
    found = _recorded_paths(host, answers_file, [*patterns, *owner_patterns], "compact")
    if isinstance(found, Retired):
        return found
    before, paths = found
    if before.get("namespace_absent") is not True:
        paths = paths[: len(patterns)]
    if stage == "after":
        for path in paths:
            if not _git(host, "ls-files", "--unmerged", "--", path).stdout.strip():
                _git(host, "reset", "-q", "--", path)
        return Retired(True, "the index is back at HEAD")
    formatting = _sibling("formatting")
    done: list[str] = []
    for path in paths:
        target = host / path
        if not target.is_file():
            continue
        text = target.read_text(encoding="utf-8")
        unpadded = formatting.compact_tables(text)
        if unpadded != text:
            target.write_text(unpadded, encoding="utf-8")
            _git(host, "add", "--", path)
            done.append(path)
    if not done:
        return Retired(True, "skipped: no aligned tables")
    return Retired(True, f"unpadded the tables of {', '.join(done)}; the update aligns them again")


# --- the engine-first migration ------------------------------------------------------------------

RUNTIME_INIT = "workers/runtime/src/{host_root}/workers/runtime/__init__.py"
"""The worker runtime's package, which holds its `API_VERSION` (docs/decisions/0017)."""


def engine_api(host: Path, host_root: str) -> int | None:
    """The host's worker runtime API version (`API_VERSION = <n>` in its `__init__.py`), or
    None when the host has no worker runtime."""
    init = host / RUNTIME_INIT.format(host_root=host_root)
    if not init.is_file():
        return None
    found = re.search(r"^API_VERSION = (\d+)", init.read_text(encoding="utf-8"), re.MULTILINE)
    return int(found.group(1)) if found else 0


def _namespace_owner(host: Path) -> str:
    """The name of the worker whose answers say it owns the `work` namespace."""
    return next(
        (
            path.parent.name
            for path in sorted(host.glob("workers/*/.copier-answers.yml"))
            if (_yaml().safe_load(path.read_text(encoding="utf-8")) or {}).get("namespace_absent")
            is True
        ),
        "<the worker that owns the work namespace>",
    )


def needs_owner(host: Path, answers_file: str, paths: list[str]) -> Retired:
    """Stop the update of a worker whose new version reads files only the owner of the
    `work` namespace renders (`paths`, relative to the host; v0.2.0: the Terraform worker
    module, docs/decisions/0031) while one is absent: the owner goes first. The owner
    itself, and a host that has them all, go on. Before stage, nothing written."""
    if not is_real_host(host):
        return Retired(True, "skipped: not the real host")
    recorded = _git(host, "show", f"HEAD:{answers_file}")
    before = _yaml().safe_load(recorded.stdout) if recorded.returncode == 0 else None
    if not isinstance(before, dict) or before.get("namespace_absent") is True:
        return Retired(True, "skipped: this worker renders them")
    absent = [path for path in paths if not (host / path).exists()]
    if not absent:
        return Retired(True, "the owner's files are there")
    return Retired(
        False,
        f"{before.get('worker_name')}: the new version reads {', '.join(absent)}, which the "
        "worker that owns the work namespace brings: run "
        f"`make update-worker NAME={_namespace_owner(host)}` first (or `make update-workers`, "
        "which starts with it). Nothing was updated.",
    )


def needs_engine(host: Path, answers_file: str, api: int) -> Retired:
    """Stop the update of a worker whose new version runs on the worker runtime at API `api`
    or newer while the host's runtime is older or absent: the owner of the `work` namespace
    renders it, so the owner goes first. The owner itself, and a host whose runtime is new
    enough, go on. Read before copier writes anything (before stage)."""
    if not is_real_host(host):
        return Retired(True, "skipped: not the real host")
    recorded = _git(host, "show", f"HEAD:{answers_file}")
    before = _yaml().safe_load(recorded.stdout) if recorded.returncode == 0 else None
    if not isinstance(before, dict) or before.get("namespace_absent") is True:
        return Retired(True, "skipped: this worker renders the worker runtime")
    have = engine_api(host, str(before.get("host_root", "")))
    if have is not None and have >= api:
        return Retired(True, f"the worker runtime is at API {have}")
    owner = _namespace_owner(host)
    state = "does not have yet" if have is None else f"has only at API {have}"
    return Retired(
        False,
        f"{before.get('worker_name')}: the new version runs on the worker runtime "
        f"(workers/runtime, API {api}), which this host {state}; the worker that owns "
        f"the work namespace brings it: run `make update-worker NAME={owner}` first (or "
        "`make update-workers`, which starts with it). Nothing was updated.",
    )


# --- Terraform state moves (v0.2.0, docs/decisions/0031) -----------------------------------

TERRAFORM_ENVIRONMENTS = ("staging", "production")
# What each worker's `environments/<env>/worker_<module>.tf` declared itself before the worker
# module: `<type>.<module>_<name>` then, `module.worker_<module>.<type>.<name>` in the module
# (count and for_each keys kept: the same switch, the same map).
TERRAFORM_MOVES: tuple[tuple[str, str], ...] = (
    ("aws_cloudwatch_log_metric_filter", "queue_stats"),
    ("aws_appautoscaling_policy", "backlog"),
    ("aws_appautoscaling_policy", "oldest_item_age"),
    ("aws_cloudwatch_metric_alarm", "scale_out_on_age"),
    ("aws_cloudwatch_metric_alarm", "backlog_age"),
    ("aws_cloudwatch_metric_alarm", "queue_stats_missing"),
    ("aws_cloudwatch_metric_alarm", "claims_failing"),
    ("aws_cloudwatch_metric_alarm", "lease_renewals_failing"),
    ("aws_cloudwatch_metric_alarm", "completions_failing"),
    ("aws_cloudwatch_metric_alarm", "wake_ups_down"),
    ("aws_cloudwatch_metric_alarm", "dead_letters_unaudited"),
)
# The namespace owner's alarms on the database and the outbox: one instance then, `[0]` of
# the module's `count = var.namespace_alarms ? 1 : 0` now.
OWNER_TERRAFORM_MOVES: tuple[str, ...] = (
    "snapshot_age",
    "stranded",
    "outbox_failing",
    "outbox_dead_letters",
)


def terraform_moves(worker_name: str, module: str, owner: bool) -> str:
    """The `moved` blocks of one worker's environment (`worker_<module>.moved.tf`): every
    address its file declared before the worker module, to the module instance's."""
    pairs = [(f"module.{module}", f"module.worker_{module}.module.service")]
    pairs += [
        (f"{kind}.{module}_{name}", f"module.worker_{module}.{kind}.{name}")
        for kind, name in TERRAFORM_MOVES
    ]
    if owner:
        pairs += [
            (
                f"aws_cloudwatch_metric_alarm.{module}_{name}",
                f"module.worker_{module}.aws_cloudwatch_metric_alarm.{name}[0]",
            )
            for name in OWNER_TERRAFORM_MOVES
        ]
    header = (
        f"# Moves the {worker_name} worker's Terraform state from the addresses its\n"
        f"# worker_{module}.tf declared itself before template 0.2 (the service module instance,\n"
        "# metric filters, scaling policies and alarms) into its worker module instance, so the\n"
        "# first `terraform plan` after the update moves each of them and destroys nothing\n"
        "# (docs/decisions/0031 of the worker template). Written once, by the update from before\n"
        "# 0.2; the template never renders or changes it. Delete it once this environment's\n"
        "# state has been applied with it: the moves are done then.\n"
    )
    blocks = [f"moved {{\n  from = {old}\n  to   = {new}\n}}\n" for old, new in pairs]
    return header + "\n" + "\n".join(blocks)


def write_terraform_moves(host: Path, answers_file: str) -> Retired:
    """After stage of the update from before v0.2.0: beside each of the worker's
    `environments/<env>/worker_<module>.tf`, its `worker_<module>.moved.tf`
    (`terraform_moves`), unless one is there. A fresh copy has none: no state to move."""
    if not is_real_host(host):
        return Retired(True, "skipped: not the real host")
    answers = _yaml().safe_load((host / answers_file).read_text(encoding="utf-8")) or {}
    derived = names(answers)
    module = derived["worker_module"]
    owner = answers.get("namespace_absent") is True
    written = []
    for env in TERRAFORM_ENVIRONMENTS:
        folder = host / "deployment" / "terraform" / "environments" / env
        target = folder / f"worker_{module}.moved.tf"
        if not (folder / f"worker_{module}.tf").is_file() or target.exists():
            continue
        target.write_text(terraform_moves(derived["worker_name"], module, owner), encoding="utf-8")
        written.append(str(target.relative_to(host)))
    if not written:
        return Retired(True, "no Terraform state moves to write")
    return Retired(True, f"wrote {', '.join(written)}: the Terraform state moves")


# What a user may have edited in a worker's Terraform file before 0.2 that the update carries:
# a value of its settings map (`<PREFIX><FIELD> = "..."`, a string literal) and the sizes
# of its module block. Everything else the old file held is the module's now.
TERRAFORM_SIZES = ("desired_count", "max_count", "log_retention_days")
_TF_SIZE = re.compile(rf"^(  ({'|'.join(TERRAFORM_SIZES)})\s*=\s*)(\S.*)$")
_TF_LITERAL = re.compile(r'^"[^"\\$%]*"$')


@dataclass
class TerraformEdits:
    """A user's edits of a worker's Terraform file: settings by field, sizes by name."""

    settings: dict[str, str]
    sizes: dict[str, str]

    @property
    def empty(self) -> bool:
        return not self.settings and not self.sizes


def _tf_settings(text: str, prefix: str) -> dict[str, tuple[int, str]]:
    """`{FIELD: (line index, value)}` of the `<PREFIX><FIELD> = value` lines."""
    pattern = re.compile(rf"^\s+{re.escape(prefix)}([A-Z0-9_]+)\s*=\s*(\S.*)$")
    found = {}
    for index, line in enumerate(text.splitlines()):
        match = pattern.match(line)
        if match:
            found[match.group(1)] = (index, match.group(2))
    return found


def _tf_sizes(text: str) -> dict[str, tuple[int, str]]:
    found = {}
    for index, line in enumerate(text.splitlines()):
        match = _TF_SIZE.match(line)
        if match:
            found[match.group(2)] = (index, match.group(3))
    return found


def terraform_edits(old: str, user: str, prefix: str) -> TerraformEdits:
    """The user's edits (`user` against the old template's rendering `old`) of a worker's
    Terraform file from before 0.2 that the new file can take: a settings value changed or
    added as a string literal, a size changed. Raises `ValueError` naming any other edit
    (a line changed, added or removed elsewhere, a setting removed or set to an expression)."""
    base_settings, user_settings = _tf_settings(old, prefix), _tf_settings(user, prefix)
    base_sizes, user_sizes = _tf_sizes(old), _tf_sizes(user)
    removed = sorted(set(base_settings) - set(user_settings))
    if removed:
        raise ValueError(f"the setting {prefix}{removed[0]} is gone from it")
    settings = {}
    for field, (_, value) in user_settings.items():
        if field in base_settings and base_settings[field][1] == value:
            continue
        if not _TF_LITERAL.match(value):
            raise ValueError(f"{prefix}{field} is set to {value}, not a plain string")
        settings[field] = value
    sizes = {
        name: value
        for name, (_, value) in user_sizes.items()
        if name in base_sizes and base_sizes[name][1] != value
    }
    # the rest must be the old rendering, line for line: user's lines of carried values and
    # added settings out, base values back
    carried = {index for field, (index, _) in user_settings.items() if field not in base_settings}
    lines = user.splitlines()
    for field, (index, _) in user_settings.items():
        if field in base_settings:
            lines[index] = old.splitlines()[base_settings[field][0]]
    for name, (index, _) in user_sizes.items():
        if name in base_sizes:
            lines[index] = old.splitlines()[base_sizes[name][0]]
    rest = [line for index, line in enumerate(lines) if index not in carried]
    if set(user_sizes) != set(base_sizes) or rest != old.splitlines():
        diff = [
            line
            for line in difflib.unified_diff(old.splitlines(), rest, lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---")) and line[1:].strip()
        ]
        added = [line[1:].strip() for line in diff if line.startswith("+")]
        removed = [line[1:].strip() for line in diff if line.startswith("-")]
        if added:
            raise ValueError(f"its line `{added[0]}` is the module's now")
        raise ValueError(
            f"the line `{removed[0] if removed else ''}` it dropped is the module's now"
        )
    return TerraformEdits(settings, sizes)


def apply_terraform_edits(new: str, edits: TerraformEdits) -> str:
    """The new worker file (`module "worker_<module>"`, its `settings = { ... }` map) with
    the user's sizes and settings in it, `terraform fmt`'s alignment kept."""
    lines = new.splitlines(keepends=True)
    for index, line in enumerate(lines):
        match = _TF_SIZE.match(line.rstrip("\n"))
        if match and match.group(2) in edits.sizes:
            lines[index] = f"{match.group(1)}{edits.sizes[match.group(2)]}\n"
    if not edits.settings:
        return "".join(lines)
    start = next(i for i, line in enumerate(lines) if re.match(r"^  settings\s*=\s*\{", line))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].strip() == "}")
    entries: dict[str, str] = {}
    for line in lines[start + 1 : end]:
        key, _, value = line.strip().partition("=")
        entries[key.strip()] = value.strip()
    entries.update(edits.settings)
    width = max(len(key) for key in entries)
    body = [f"    {key.ljust(width)} = {value}\n" for key, value in entries.items()]
    return "".join(lines[: start + 1] + body + lines[end:])


def carry_terraform(host: Path, answers_file: str, ref_from: str, stage: str) -> Retired:
    """Carry the user's edits of the worker's Terraform files across 0.2 (the settings
    map's values and the sizes; `terraform_edits`), in copier's two migration stages, as
    `carry_edits` does for settings.py: before, an edit the new file cannot take stops the
    update naming the file, nothing written; else the file goes back to the old rendering
    (working tree and index), so copier's merge writes the new one clean. After, the edits
    (read again from HEAD) go into it and the index goes back to HEAD."""
    if not is_real_host(host):
        return Retired(True, "skipped: not the real host")
    recorded = _git(host, "show", f"HEAD:{answers_file}")
    if recorded.returncode != 0:
        return Retired(True, f"skipped: {answers_file} is not in HEAD")
    before = _yaml().safe_load(recorded.stdout) or {}
    derived = names(before)
    module, prefix = derived["worker_module"], derived["worker_env_prefix"]
    paths = [
        f"deployment/terraform/environments/{env}/worker_{module}.tf"
        for env in TERRAFORM_ENVIRONMENTS
    ]
    users = {path: _git(host, "show", f"HEAD:{path}") for path in paths}
    present = [path for path, shown in users.items() if shown.returncode == 0]
    if not present:
        return Retired(True, "skipped: no Terraform file in HEAD")
    ref = ref_from or str(before.get("_commit", ""))

    def read(path: str, old: str, user: str) -> TerraformEdits:
        try:
            return terraform_edits(old, user, prefix)
        except ValueError as exc:
            raise CarryRefused(
                f"{path}: you changed it since template {ref}, and {exc} (the worker "
                'module, deployment/terraform/modules/worker; docs/updating.md, "To 0.2, '
                'Terraform"). Nothing was updated. Undo that change, commit, run the '
                "update again, then make the change in the module or in the instance's "
                "`settings`."
            ) from exc

    def apply(path: str, new: str, edits: TerraformEdits) -> str:
        try:
            return apply_terraform_edits(new, edits)
        except StopIteration as exc:
            raise CarryRefused("the new file has no `settings` map") from exc

    return _carry_across(
        host, before, ref, {p: users[p].stdout for p in present}, stage, read, apply
    )


# --- what copier's merge left ------------------------------------------------------------------


def left_conflicts(host: Path) -> str | None:
    """The one line naming what copier's merge left to resolve in `host` (unmerged paths,
    `*.rej` files, conflict markers), or None: nothing left, not a real host, or the
    update run by `make update-worker`. Copier itself exits 0 and names none of them."""
    helper = _sibling("host_workers")
    if os.environ.get(helper.HELPER_REPORTS) or not is_real_host(host):
        return None
    found = helper.conflicts(host)
    if not found:
        return None
    return (
        f"worker-template: the update left {len(found)} conflict(s) to resolve: "
        f"{', '.join(found)}; resolve the markers (docs/updating.md), `git add` the files, "
        "then commit"
    )


# --- command line ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line of the migrations (`move`, `retire`); the release guard parses
    `_migrations` entries with it, so both read the same arguments."""
    parser = argparse.ArgumentParser(
        prog="lifecycle.py", description=(__doc__ or "").splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("move", help="carry the user's edits across a path the release moves")
    p.add_argument("--answers-file", required=True)
    p.add_argument("--from", dest="old", required=True)
    p.add_argument("--to", dest="new", required=True)
    p.add_argument("--host", default=".")
    p = sub.add_parser(
        "retire", help="stop the update when the user edited a file the release removes"
    )
    p.add_argument("--answers-file", required=True)
    p.add_argument("--path", dest="paths", action="append", required=True)
    p.add_argument("--note", default="", help="where the file's code went (one short phrase)")
    p.add_argument("--host", default=".")
    p = sub.add_parser(
        "needs-engine", help="stop a worker's update until the owner brought the engine"
    )
    p.add_argument("--answers-file", required=True)
    p.add_argument("--api", type=int, required=True, help="the runtime API the worker needs")
    p.add_argument("--host", default=".")
    p = sub.add_parser(
        "needs-owner", help="stop a worker's update until the owner brought the files it reads"
    )
    p.add_argument("--answers-file", required=True)
    p.add_argument("--path", dest="paths", action="append", required=True)
    p.add_argument("--host", default=".")
    p = sub.add_parser(
        "carry",
        help="carry the user's edits of settings.py and container.py across the runtime move",
    )
    p.add_argument("--answers-file", required=True)
    p.add_argument("--path", dest="paths", action="append", required=True)
    p.add_argument("--host", default=".")
    p = sub.add_parser(
        "compact", help="unpad the tables a formatter aligned, so an update merges them"
    )
    p.add_argument("--answers-file", required=True)
    p.add_argument("--path", dest="paths", action="append", required=True)
    p.add_argument("--owner-path", dest="owner_paths", action="append", default=[])
    p.add_argument("--host", default=".")
    p = sub.add_parser(
        "terraform-moves", help="write the worker's Terraform `moved` blocks (from before 0.2)"
    )
    p.add_argument("--answers-file", required=True)
    p.add_argument("--host", default=".")
    p = sub.add_parser(
        "carry-terraform", help="carry the user's settings and sizes across the 0.2 Terraform"
    )
    p.add_argument("--answers-file", required=True)
    p.add_argument("--host", default=".")
    p = sub.add_parser("conflicts", help="name what copier's merge left to resolve")
    p.add_argument("--host", default=".")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one migration; 0 done or nothing to do, 1 `retire` or `carry` refused (its line
    on stderr)."""
    args = build_parser().parse_args(argv)
    env = os.environ.get
    if args.command == "move":
        result = move(
            Path(args.host), args.answers_file, args.old, args.new, env("VERSION_FROM", "")
        )
        print(f"    migrate  {result}")
        return 0
    if args.command == "conflicts":
        line = left_conflicts(Path(args.host))
        if line:
            print(line, file=sys.stderr)
        return 0
    if args.command == "needs-engine":
        decided = needs_engine(Path(args.host), args.answers_file, args.api)
    elif args.command == "needs-owner":
        decided = needs_owner(Path(args.host), args.answers_file, list(args.paths))
    elif args.command == "terraform-moves":
        decided = write_terraform_moves(Path(args.host), args.answers_file)
    elif args.command == "carry-terraform":
        decided = carry_terraform(
            Path(args.host), args.answers_file, env("VERSION_FROM", ""), env("STAGE", "before")
        )
    elif args.command == "compact":
        decided = compact(
            Path(args.host),
            args.answers_file,
            list(args.paths),
            args.owner_paths,
            env("STAGE", "before"),
        )
    elif args.command == "retire":
        decided = retire(
            Path(args.host),
            args.answers_file,
            list(args.paths),
            env("VERSION_FROM", ""),
            env("VERSION_TO", ""),
            args.note,
            env("STAGE", "before"),
        )
    else:
        decided = carry_edits(
            Path(args.host), args.answers_file, list(args.paths), env("VERSION_FROM", ""),
            env("STAGE", "before"),
        )  # fmt: skip
    if not decided.proceed:
        print(decided.message, file=sys.stderr, flush=True)
        return 1
    print(f"    migrate  {decided.message}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
