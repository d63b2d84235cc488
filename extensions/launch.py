"""`copier copy <template> workers/<name>` and `copier update` run in a worker folder.

The template renders into the host root (`copier copy <template> . -d worker_name=x`), and
copier writes only inside the destination it was given. For the two forms people type from
a template like this one, the template runs the root form itself, in a second copier
process (`python -m copier`, the interpreter running copier):

- **The copy form.** For a destination `<host>/workers/<name>`, `_subdirectory` picks the
  `launcher` subtree, which renders nothing, and copier.yml's launch task runs
  `python launch.py copy '<plan>'`. The plan (`copy_plan`, JSON) holds the root copy's
  command: the template as the user gave it (`_copier_answers._src_path`, recorded as
  `_src_path`; `_copier_conf.src_path` is only copier's temporary clone), the commit the
  first process rendered (`-r <hash>`), every answer the user gave or was asked, and the
  host root as the destination. The context hook has already run every check of the root
  copy against the host in the prompt phase, so a refusal is one line with nothing written.
  When the root copy still fails, `main` puts back every host path it changed
  (`put_back`) and exits with its code: the copy is all or nothing.
- **The update form.** `copier update` in `workers/<name>` (or `copier update
  workers/<name>` from the root) cannot update the worker there: the worker's files live
  under the host root, and copier would diff its renders against the worker folder. The
  hook hands over instead (`hand_over_update`): it runs `copier update -a
  workers/<name>/.copier-answers.yml` from the host root with the same options and ends the
  process with that command's exit code, before copier has written anything.

Only the standard library: the task runs this file with copier's interpreter, outside the
hook, and the hook imports it as a sibling module.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

ANSWERS_NAME = ".copier-answers.yml"
WORKERS = "workers"
DEFAULT_CONFLICT = "inline"  # copier update's defaults, left out of the printed command
DEFAULT_CONTEXT_LINES = "3"


def worker_parent(dst: Path) -> Path | None:
    """The folder that holds `workers/` when `dst` is `<folder>/workers/<name>`, else None.

    `dst` is absolute (the hook resolves copier's destination). Whether that folder is a host
    root is the preflight's question: it refuses, in one line, a folder that is not.
    """
    return dst.parent.parent if dst.parent.name == WORKERS and dst.name else None


def answer_text(value: object) -> str:
    """`value` as copier's `-d key=value` reads it back: booleans as `true`/`false`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def data_args(answers: Mapping[str, object]) -> list[str]:
    """`-d key=value` for each answer, in order: `["-d", "lane=bulk", ...]`."""
    args: list[str] = []
    for key, value in answers.items():
        args += ["-d", f"{key}={answer_text(value)}"]
    return args


def repeated(flag: str, values: Iterable[object] | None) -> list[str]:
    """`[flag, v1, flag, v2, ...]` (copier's list options: `-x`, `--skip`)."""
    args: list[str] = []
    for value in values or ():
        args += [flag, str(value)]
    return args


def copy_plan(
    *,
    src: str,
    ref: str | None,
    host: Path,
    cwd: Path,
    answers: Mapping[str, object],
    quiet: bool = False,
    overwrite: bool = False,
    prereleases: bool = False,
    exclude: Iterable[object] | None = None,
    skip_if_exists: Iterable[object] | None = None,
) -> str:
    """The launch task's argument: the root copy of the copy form, as one JSON object.

    Shape: `{"host": "/abs/host", "cwd": "/abs/cwd",
    "command": ["-m", "copier", "copy", "--trust", "--defaults", "-r", "<hash>", ...,
    "-d", "worker_name=x", ..., "<src as given>", "<host, relative to cwd>"]}`. `command`
    runs with copier's interpreter in `cwd`, the folder copier was started from, so a
    relative template path means what it meant to the user. `answers` maps each question the
    user answered (asked or given with `-d`/`--data-file`) to its value; questions computed
    by an `ask: false` default are left out, so the root copy computes them as the root form
    would.
    """
    command = ["-m", "copier", "copy", "--trust", "--defaults"]
    if ref:
        command += ["-r", ref]
    if quiet:
        command.append("--quiet")
    if overwrite:
        command.append("--overwrite")
    if prereleases:
        command.append("--prereleases")
    command += repeated("-x", exclude) + repeated("--skip", skip_if_exists)
    command += data_args(answers)
    command += [src, os.path.relpath(host, cwd)]
    plan = {"host": str(host), "cwd": str(cwd), "command": command}
    return json.dumps(plan)


def update_command(
    *,
    answers_file: str,
    given: Mapping[str, object],
    ref: str | None,
    defaults: bool,
    skip_answered: bool = False,
    conflict: str | None = None,
    context_lines: object = None,
    pretend: bool = False,
    skip_tasks: bool = False,
    prereleases: bool = False,
    exclude: Iterable[object] | None = None,
    skip_if_exists: Iterable[object] | None = None,
) -> list[str]:
    """The root update that stands for `copier update` run in a worker folder, as copier's
    arguments: `["update", "--trust", ("--defaults",) ..., "-a",
    "workers/x/.copier-answers.yml"]`. `answers_file` is relative to the host root, `given`
    is copier's `-d` data as typed, `ref` the `--vcs-ref` the first process resolved (None:
    copier picks the newest tag again). `--quiet` is never passed on: copier forces it on in
    the pass that hands over, so the user's choice is not known there."""
    command = ["update", "--trust"]
    for flag, on in (
        ("--defaults", defaults),
        ("--skip-answered", skip_answered),
        ("--pretend", pretend),
        ("--skip-tasks", skip_tasks),
        ("--prereleases", prereleases),
    ):
        if on:
            command.append(flag)
    if ref:
        command += ["--vcs-ref", ref]
    if conflict and conflict != DEFAULT_CONFLICT:
        command += ["--conflict", conflict]
    if context_lines is not None and str(context_lines) != DEFAULT_CONTEXT_LINES:
        command += ["--context-lines", str(context_lines)]
    command += repeated("-x", exclude) + repeated("--skip", skip_if_exists)
    command += data_args(given)
    return [*command, "-a", answers_file]


def hand_over_update(host: Path, worker: str, command: list[str]) -> NoReturn:
    """Run `python -m copier <command>` in `host` and end this process with its exit code.

    Called by the context hook in the first render of `copier update` that targets the
    worker folder itself, before copier has written anything there. Prints one line first,
    naming the command that runs, so the user can run it themselves next time. Raises
    `SystemExit` (the code of the root update: 0 done, 1 refused, ...), also when copier
    runs through its Python API.
    """
    shown = shlex.join(["copier", *command])
    print(
        f"worker-template: workers/{worker} is a worker folder; updating it from the host "
        f"root instead: cd {shlex.quote(str(host))} && {shown}",
        file=sys.stderr,
        flush=True,
    )
    done = subprocess.run([sys.executable, "-m", "copier", *command], cwd=host, check=False)
    raise SystemExit(done.returncode)


def _git(host: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=host, capture_output=True, text=True, check=False)


def tree_entries(host: Path) -> set[str]:
    """`git status --porcelain` of `host` (every untracked file listed, no renames), as a set
    of lines like `" M pyproject.toml"` and `"?? workers/x/README.md"`."""
    out = _git(host, "status", "--porcelain", "--untracked-files=all", "--no-renames", "-z").stdout
    return {entry for entry in out.split("\0") if entry.strip()}


def put_back(host: Path, before: set[str]) -> list[str]:
    """Undo what a failed root copy changed in `host`: every path whose `git status` entry is
    not in `before` is restored from `HEAD` when `HEAD` has it, else deleted (with the
    folders it leaves empty). Returns those paths, sorted.

    Paths already changed before the copy are left alone: the copy's preflight refuses to
    write or patch a path with uncommitted changes, so the copy never touched them.
    """
    changed = sorted({entry[3:] for entry in tree_entries(host) - before})
    if not changed:
        return []
    tracked = set(_git(host, "ls-tree", "-r", "--name-only", "-z", "HEAD").stdout.split("\0"))
    restore = [path for path in changed if path in tracked]
    if restore:
        _git(host, "checkout", "HEAD", "--", *restore)
    for rel in changed:
        if rel in tracked:
            continue
        _git(host, "rm", "--cached", "--quiet", "--ignore-unmatch", "--", rel)
        target = host / rel
        if target.is_file() or target.is_symlink():
            target.unlink()
        parent = target.parent
        while parent != host and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    return changed


def run_plan(plan: Mapping[str, Any]) -> int:
    """Run the root copy of a `copy_plan`; on failure put the host back. Returns its code."""
    host = Path(plan["host"])
    before = tree_entries(host)
    done = subprocess.run(
        [sys.executable, *[str(part) for part in plan["command"]]], cwd=plan["cwd"], check=False
    )
    if done.returncode == 0:
        return 0
    undone = put_back(host, before)
    if undone:
        print(
            f"worker-template: the copy into {host} failed; {len(undone)} paths it wrote "
            "were put back as committed",
            file=sys.stderr,
        )
    return done.returncode


def main(argv: list[str] | None = None) -> int:
    """`launch.py copy '<plan>'`: the launch task of copier.yml. Exit code: the root copy's."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "copy":
        print("usage: launch.py copy '<plan as JSON>'", file=sys.stderr)
        return 2
    return run_plan(json.loads(args[1]))


if __name__ == "__main__":
    sys.exit(main())
