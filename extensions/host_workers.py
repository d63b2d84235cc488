#!/usr/bin/env python3
# worker-template: host helper (written by the template's patcher; `copier update` replaces it)
"""Update, check, remove, rename and restore the workers made by the worker template.

Run from anywhere inside the host repository (the Makefile targets call it):

    python3 scripts/workers.py update <name> [--ref REF]   one worker (make update-worker NAME=x)
    python3 scripts/workers.py update-all [--commit]       every worker (make update-workers)
    python3 scripts/workers.py check-update                workers behind the template
    python3 scripts/workers.py remove <name>               fragments reversed, files removed
    python3 scripts/workers.py add-kind <name> <KIND>      a kind added to a worker (copier copy)
    python3 scripts/workers.py remove-kind <name> <KIND>   that kind's fragments and files removed
    python3 scripts/workers.py rename <old> <new>          files, answers and fragments moved
    python3 scripts/workers.py restore <name> <path> [--force]  a deleted worker file rendered again
    python3 scripts/workers.py check-env                   .env lines at a default since changed

`update` runs `copier update` from the host root with the worker's answers file
(`workers/<name>/.copier-answers.yml`; copier cannot find it otherwise) and the right
`--vcs-ref`: the newest release tag, or the template's HEAD when the worker was copied from
a commit past that tag (a plain update would refuse it as a downgrade). It then looks for
unmerged paths, `*.rej` files and conflict markers, counting untracked files as changes.

Exit codes: 0 done; 1 refused or copier failed; 2 conflicts left to resolve; 3 stopped
with one worker's update left uncommitted (`update-all` without `--commit`).

Standard library only: it runs with the host's `python3`, copier is the `copier` on PATH
(or `$COPIER`). See docs/updating.md in the worker template.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ANSWERS = ".copier-answers.yml"
TERRAFORM_ENVIRONMENTS = "deployment/terraform/environments"
CONFLICT_MARKERS = ("<<<<<<< before updating", ">>>>>>> after updating")
UNMERGED = {"DD", "AU", "UD", "UA", "DU", "AA", "UU"}
TAG = re.compile(r"v?(\d+(?:\.\d+)+)")  # at least MAJOR.MINOR: `1772851` is a short hash
DESCRIBED = re.compile(r"(?P<tag>.+)-(?P<count>\d+)-g(?P<hash>[0-9a-f]+)")
WORKER_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")

OK, REFUSED, CONFLICTS, STOPPED = 0, 1, 2, 3


class RefusedError(Exception):
    """A precondition failed; the message says what to do."""


# --- small helpers --------------------------------------------------------------------------


def git(root: Path, *args: str, check: bool = True) -> str:
    """Run git in `root`; stdout, or `RefusedError` with git's message when `check` fails."""
    done = subprocess.run(["git", *args], check=False, cwd=root, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RefusedError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def host_root() -> Path:
    """The top of the git repository holding the current folder."""
    top = git(Path.cwd(), "rev-parse", "--show-toplevel").strip()
    return Path(top)


def copier_cmd() -> list[str]:
    """The copier command: `$COPIER` (split like a shell would) or `copier`; `RefusedError`
    naming `COPIER` when no such program is on PATH."""
    command = shlex.split(os.environ.get("COPIER", "copier"))
    if not command or shutil.which(command[0]) is None:
        raise RefusedError(
            f"no copier command {command[0] if command else '(empty)'!r} on PATH: install "
            "copier, or set COPIER to its path (for example COPIER=<template>/.venv/bin/copier)"
        )
    return command


def read_answers(path: Path) -> dict[str, object]:
    """The top-level scalars of a copier answers file (the YAML copier writes).

    Values are strings, except `true`/`false` (bool) and plain integers.
    """
    answers: dict[str, object] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z_][\w]*):\s*(.*)$", line)
        if not match:
            continue
        key, raw = match.group(1), match.group(2).strip()
        if raw[:1] == "'" and raw[-1:] == "'" and len(raw) >= 2:
            value: object = raw[1:-1].replace("''", "'")
        elif raw[:1] == '"' and raw[-1:] == '"' and len(raw) >= 2:
            value = raw[1:-1].encode().decode("unicode_escape")
        elif raw in {"true", "false"}:
            value = raw == "true"
        elif re.fullmatch(r"-?\d+", raw):
            value = int(raw)
        else:
            value = raw
        answers[key] = value
    return answers


def answers_path(worker: str, kind: str | None = None) -> str:
    """`workers/<worker>/.copier-answers.yml`, or for a kind added to it (`add-kind`)
    `workers/<worker>/.copier-answers.<kind in lower case>.yml` (copier.yml `_answers_file`)."""
    suffix = f".{kind.lower()}" if kind else ""
    return f"workers/{worker}/.copier-answers{suffix}.yml"


def added_kinds(root: Path, name: str) -> dict[str, Path]:
    """The kinds added to worker `name` (`add-kind`), each with its answers file."""
    found: dict[str, Path] = {}
    for path in sorted((root / "workers" / name).glob(".copier-answers.*.yml")):
        answers = read_answers(path)
        if answers.get("added_kind") is True and answers.get("work_kind"):
            found[str(answers["work_kind"])] = path
    return found


def answers_file(root: Path, name: str) -> Path:
    """`workers/<name>/.copier-answers.yml`, or `RefusedError` naming the workers there are."""
    path = root / "workers" / name / ANSWERS
    known = ", ".join(all_workers(root)) or "none"
    if not name:
        raise RefusedError(f"name the worker: NAME=<worker> with make (workers: {known})")
    if not path.is_file():
        raise RefusedError(f"no worker {name!r} (workers made by the template: {known})")
    return path


def all_workers(root: Path) -> list[str]:
    """Every worker folder with an answers file, sorted."""
    return sorted(p.parent.name for p in root.glob(f"workers/*/{ANSWERS}"))


def changes(root: Path) -> list[str]:
    """`git status --porcelain` lines, untracked files included (one per file)."""
    out = git(root, "status", "--porcelain", "--untracked-files=all")
    return [line for line in out.splitlines() if line.strip()]


def require_clean(root: Path) -> None:
    """Copier refuses to update a dirty tree: say so before calling it."""
    dirty = changes(root)
    if dirty:
        listed = ", ".join(line[3:] for line in dirty[:5]) + (" ..." if len(dirty) > 5 else "")
        raise RefusedError(
            f"the host has uncommitted changes ({listed}); copier updates only a clean tree: "
            "commit or stash them first"
        )


KINDS_START, KINDS_END = "<!-- >>> kinds -->", "<!-- <<< kinds -->"
_CONFLICT_LINE = re.compile(r"^(<{7}|={7}|>{7})( |$)")


def kind_line(kind: str, worker: str) -> str:
    """One worker's line in the kinds list of `work/README.md` (no newline); the template's
    own `work/README.md.jinja` renders the namespace owner's line the same way."""
    return f"- `{kind}`, handled by the `{worker}` worker"


def kind_entries(root: Path) -> dict[str, str]:
    """Every worker's kind and name as `work/README.md` lists them: the namespace owner
    first, then the others in the order they were copied (their `metrics_port` answers)."""
    rows: list[tuple[bool, int, str, bool, str]] = []
    for path in sorted(root.glob(f"workers/*/{ANSWERS}")):
        answers = read_answers(path)
        kind, port = answers.get("work_kind"), answers.get("metrics_port")
        if not kind:
            continue
        owner = answers.get("namespace_absent") is True
        order = port if isinstance(port, int) else 1 << 30
        name = str(answers.get("worker_name", path.parent.name))
        rows.append((not owner, order, name, False, str(kind)))
        # the kinds added to it follow its own, in the order of their names
        rows += [(not owner, order, name, True, added) for added in added_kinds(root, name)]
    return {kind: name for _, _, name, _, kind in sorted(rows)}


def kinds_region(root: Path) -> list[str]:
    """The lines between the kind markers of `work/README.md`: every worker's kind line
    (`kind_entries`), each ending in a newline."""
    return [f"{kind_line(kind, name)}\n" for kind, name in kind_entries(root).items()]


def rebuild_kinds(root: Path, path: Path) -> bool:
    """Write the kinds region of `work/README.md` at `path` from every worker's answers;
    whether the file changed (False when it has no single pair of kind markers)."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    starts = [n for n, line in enumerate(lines) if line.strip() == KINDS_START]
    ends = [n for n, line in enumerate(lines) if line.strip() == KINDS_END]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        return False
    lines[starts[0] + 1 : ends[0]] = kinds_region(root)
    if "".join(lines) == text:
        return False
    path.write_text("".join(lines), encoding="utf-8")
    return True


# Files copier renders for one worker that the other workers add their fragments to, and
# how each is rebuilt with every worker's fragments (restore renders one worker only).
SHARED_RENDERED: dict[str, Callable[[Path, Path], bool]] = {
    "om/src/*/om/work/README.md": rebuild_kinds,
}


def settle_kinds(root: Path) -> list[str]:
    """Rebuild a kinds region of `work/README.md` that copier's merge left with conflict
    markers; the path when it did.

    The namespace owner renders the file and every other worker adds its line between the
    kind markers, so when the owner's own line changes next to another worker's (a rename),
    copier's three-way merge, which runs after the template's tasks, conflicts inside the
    region. Nothing but the workers' answers decides the region (`kind_entries`), so it is
    written from them. Markers elsewhere in the file stay for the user; when none is left,
    git's unmerged entry of the file is cleared (`git reset -- <file>`: the change stays
    unstaged, as every update's does).
    """
    settled: list[str] = []
    for path in sorted(root.glob("om/src/*/om/work/README.md")):
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        starts = [n for n, line in enumerate(lines) if line.strip() == KINDS_START]
        ends = [n for n, line in enumerate(lines) if line.strip() == KINDS_END]
        if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
            continue
        i, j = starts[0], ends[0]
        if not any(_CONFLICT_LINE.match(line) for line in lines[i + 1 : j]):
            continue
        lines[i + 1 : j] = kinds_region(root)
        path.write_text("".join(lines), encoding="utf-8")
        rel = str(path.relative_to(root))
        if not any(_CONFLICT_LINE.match(line) for line in lines):
            git(root, "reset", "-q", "--", rel, check=False)
        settled.append(rel)
    return settled


# Set on the copier runs this helper starts: the template's own conflicts line (lifecycle.py
# `conflicts`) stays quiet, as this helper lists them itself and exits 2.
HELPER_REPORTS = "WORKER_TEMPLATE_HELPER"


def conflicts(root: Path) -> list[str]:
    """Paths left unmerged, `*.rej` files, and files holding copier's conflict markers."""
    found: list[str] = []
    out = git(root, "status", "--porcelain", "--untracked-files=all", "--ignored")
    for line in out.splitlines():
        code, path = line[:2], line[3:].strip('"')
        if code in UNMERGED:
            found.append(f"{path} (unmerged)")
        elif path.endswith(".rej"):
            found.append(f"{path} (rejected hunks)")
        elif code != "!!" and code.strip() != "D":
            file = root / path
            if file.is_file():
                try:
                    text = file.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    continue
                if any(line.rstrip() in CONFLICT_MARKERS for line in text.splitlines()):
                    found.append(f"{path} (conflict markers)")
    return list(dict.fromkeys(found))


# --- versions -------------------------------------------------------------------------------


def version(tag: str) -> tuple[int, ...] | None:
    """`v1.2.3` / `1.2.3` as a tuple; None for a ref that is not a release tag."""
    match = TAG.fullmatch(tag)
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


# Template sources git and copier read as URLs or shorthands, never as local folders.
REMOTE_SOURCE = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|git@|gh:|gl:|git\+)", re.IGNORECASE)


def template_source(root: Path, path: Path, answers: dict[str, object]) -> str:
    """The template a worker's answers record (`_src_path`), a relative local path made
    absolute against the host root, where this helper runs copier; '' when none is recorded.

    Copies made before the template recorded local paths absolute may hold `../template`;
    copier resolves it against the folder it runs in, so one that names no folder from the
    host root is refused here, naming the fix, instead of copier's misleading "Updating is
    only supported in git-tracked templates".
    """
    src = str(answers.get("_src_path", ""))
    if not src or REMOTE_SOURCE.match(src) or src.startswith("~") or Path(src).is_absolute():
        return src
    folder = (root / src).resolve()
    if not folder.is_dir():
        raise RefusedError(
            f"{path.relative_to(root)} records the template as {src}, a relative path that "
            f"names no folder from the host root {root}; write the template's absolute path "
            "(or URL) on its `_src_path:` line, commit, and run again"
        )
    return str(folder)


def remote_refs(src: str, root: Path) -> dict[str, str]:
    """`git ls-remote` of the template: ref name -> commit (peeled tags win)."""
    out = git(root, "ls-remote", src, check=False)
    refs: dict[str, str] = {}
    for line in out.splitlines():
        sha, _, ref = line.partition("\t")
        if ref.endswith("^{}"):
            refs[ref[:-3]] = sha
        else:
            refs.setdefault(ref, sha)
    return refs


def known_ref(ref: str, refs: dict[str, str], src: str, root: Path) -> bool:
    """Whether `ref` names something in the template at `src` whose refs are `refs` (`git
    ls-remote` output): copier's `:current:` (the worker's own version), `HEAD`, a tag, a
    branch, or a commit. A commit hash (7 to 40 hexadecimal digits) of a template in a local
    folder is looked up in it; of a remote one, `ls-remote` lists only the commits refs
    point at, so any other hash is left to copier's checkout to verify."""
    if ref in {":current:", "HEAD"} or any(
        name in refs for name in (ref, f"refs/tags/{ref}", f"refs/heads/{ref}")
    ):
        return True
    if not re.fullmatch(r"[0-9a-f]{7,40}", ref):
        return False
    local = Path(src).expanduser()
    if not local.is_absolute():
        local = root / local
    if local.is_dir():
        found = subprocess.run(
            ["git", "-C", str(local), "cat-file", "-e", ref + "^{commit}"],
            check=False,
            capture_output=True,
        )
        return found.returncode == 0
    return True


def latest_release(refs: dict[str, str]) -> tuple[str, tuple[int, ...]] | None:
    """The highest release tag among the template's refs, with its version."""
    released = [
        (tag, parsed)
        for ref in refs
        if ref.startswith("refs/tags/")
        and (parsed := version(tag := ref.removeprefix("refs/tags/"))) is not None
    ]
    return max(released, key=lambda pair: pair[1]) if released else None


def latest_tag(refs: dict[str, str]) -> str | None:
    """The highest release tag among the template's refs."""
    newest = latest_release(refs)
    return newest[0] if newest else None


def target_ref(recorded: str, refs: dict[str, str]) -> str:
    """The `--vcs-ref` an update of a worker at `recorded` (its `_commit`) should use.

    The newest release tag, unless the worker is already past it: a copy made from a
    commit after the newest tag (`copier copy -r HEAD`, recorded as `v1.2.0-3-gabc1234`)
    or from an untagged template (a bare hash) follows the template's HEAD, since copier
    refuses to go from `1.2.0.post3` back to `1.2.0` ("Downgrades are not supported").
    """
    release = latest_release(refs)
    if release is None:
        return "HEAD"
    newest, newest_version = release
    exact = version(recorded)
    if exact is not None:
        return newest if newest_version >= exact else "HEAD"
    described = DESCRIBED.fullmatch(recorded)
    if described and (base := version(described.group("tag"))) is not None:
        return newest if newest_version > base else "HEAD"
    return newest  # a bare hash: copier reads it as 0.0.0.postN, any release is newer


def is_behind(recorded: str, target: str, refs: dict[str, str]) -> bool:
    """Whether `target` names another template commit than the recorded `_commit`
    (a worker recorded at a bare hash that a tag now names is not behind that tag)."""
    if target != "HEAD":
        if target == recorded:
            return False
        tagged = refs.get(f"refs/tags/{target}", "")
        described = DESCRIBED.fullmatch(recorded)
        short = described.group("hash") if described else recorded
        at_tag = version(recorded) is None and len(short) >= 7 and tagged.startswith(short)
        return not at_tag
    head = refs.get("HEAD", "")
    described = DESCRIBED.fullmatch(recorded)
    short = described.group("hash") if described else recorded
    if version(recorded) is not None:
        tagged = refs.get(f"refs/tags/{recorded}", "")
        return not head or head != tagged
    return not head or not head.startswith(short)


# --- update ---------------------------------------------------------------------------------


def update(root: Path, name: str, ref: str | None = None, *, commit: bool = False) -> int:
    """`copier update` of one worker from the host root, then of each kind added to it to
    the same version (each needs a clean tree: with `commit` each step is committed, else
    the user commits and runs it again); see the module docstring."""
    path = answers_file(root, name)
    require_clean(root)
    copier_cmd()
    answers = read_answers(path)
    recorded = str(answers.get("_commit", ""))
    src = template_source(root, path, answers)
    if not src or not recorded:
        raise RefusedError(f"{path.relative_to(root)} has no _src_path/_commit: not made by copier")
    refs = remote_refs(src, root)
    if ref is None:
        ref = target_ref(recorded, refs)
    elif refs and not known_ref(ref, refs, src, root):
        tags = sorted(
            (r.removeprefix("refs/tags/") for r in refs if r.startswith("refs/tags/")),
            key=lambda tag: version(tag) or (),
        )
        newest = ", ".join(tags[-3:]) or "none"
        raise RefusedError(
            f"--ref {ref}: the template at {src} has no such tag, branch or commit (newest tags: "
            f"{newest}); give a tag, a branch, a commit, HEAD or :current:"
        )
    print(f"==> worker {name}: updating from {recorded} to {ref} ({src})", flush=True)
    status = _copier_update(root, path, ref, f"worker {name}")
    if status != OK:
        return status
    after = str(read_answers(path).get("_commit", recorded))
    pending = [
        kind
        for kind, kind_path in added_kinds(root, name).items()
        if read_answers(kind_path).get("_commit") != after
    ]
    if pending and commit:
        _commit(root, f"Update worker {name} to template {after}")
    if pending and changes(root):
        print(
            f"==> worker {name}: commit, then run the update again: it brings the kinds added "
            f"to it ({', '.join(pending)}) to {after} (copier updates a clean tree only)"
        )
        return OK
    for kind in pending:
        kind_path = added_kinds(root, name)[kind]
        print(f"==> kind {kind} of worker {name}: updating to {after}", flush=True)
        status = _copier_update(root, kind_path, after, f"kind {kind} of worker {name}")
        if status != OK:
            return status
        if commit and changes(root):
            _commit(root, f"Update kind {kind} of worker {name} to template {after}")
        elif changes(root) and kind != pending[-1]:
            print(f"==> kind {kind}: commit, then run the update again for the next kind")
            return OK
    return OK


def _commit(root: Path, message: str) -> None:
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)
    print(f"==> committed: {message}")


def _copier_update(root: Path, path: Path, ref: str, what: str) -> int:
    """`copier update` of one answers file (a worker's or an added kind's) to `ref`, then
    the conflicts it left reported; OK, REFUSED (copier failed) or CONFLICTS."""
    cmd = [
        *copier_cmd(),
        "update",
        "--trust",
        "--defaults",
        "--conflict",
        "inline",
        "--vcs-ref",
        ref,
        "--answers-file",
        str(path.relative_to(root)),
    ]
    env = {**os.environ, HELPER_REPORTS: "1"}
    recorded = str(read_answers(path).get("_commit", ""))
    done = subprocess.run(cmd, check=False, cwd=root, env=env)
    if done.returncode != 0:
        print(f"==> {what}: copier update failed (exit {done.returncode})", file=sys.stderr)
        return REFUSED
    for settled in settle_kinds(root):
        print(f"    settled  {settled}: the kinds list written from the workers' answers")
    found = conflicts(root)
    changed = changes(root)
    if found:
        print(f"==> {what}: {len(found)} conflict(s) to resolve:", file=sys.stderr)
        for item in found:
            print(f"      {item}", file=sys.stderr)
        print(
            "    Resolve the markers (docs/updating.md), `git add` the files, then commit.",
            file=sys.stderr,
        )
        return CONFLICTS
    after = str(read_answers(path).get("_commit", recorded))
    if changed:
        print(f"==> {what}: {after}, {len(changed)} file(s) changed (untracked included)")
    else:
        print(f"==> {what}: up to date at {after}")
    return OK


def update_order(root: Path) -> list[str]:
    """The workers in the order `update_all` updates them.

    First the worker that owns the `work` namespace (`namespace_absent: true` in its
    answers): every other worker calls the namespace's code, so it moves to the new
    version first. Then the others in the order they were copied, which is the order of
    their `metrics_port` answers (each copy takes the first port no other worker holds);
    workers without a port answer come last, and ties go by name.
    """

    def key(name: str) -> tuple[bool, bool, int, str]:
        answers = read_answers(root / "workers" / name / ANSWERS)
        port = answers.get("metrics_port")
        has_port = isinstance(port, int) and not isinstance(port, bool)
        return (
            answers.get("namespace_absent") is not True,
            not has_port,
            port if has_port and isinstance(port, int) else 0,
            name,
        )

    return sorted(all_workers(root), key=key)


def update_all(root: Path, commit: bool) -> int:
    """Update every worker in turn (`update_order`); stops after the first one left
    uncommitted, or at the first worker whose update fails or leaves conflicts."""
    names = update_order(root)
    if not names:
        print("no workers made by the worker template")
        return OK
    require_clean(root)
    for i, name in enumerate(names):
        status = update(root, name, commit=commit)
        if status != OK:
            return status
        if not changes(root):
            continue
        if commit:
            after = read_answers(answers_file(root, name)).get("_commit", "")
            _commit(root, f"Update worker {name} to template {after}")
            continue
        rest = names[i + 1 :]
        if rest:
            print(
                f"==> stopped after {name}: copier needs a clean tree for the next worker "
                f"({', '.join(rest)}). Review and commit, then run again, or pass COMMIT=1 "
                "to commit each worker's update."
            )
            return STOPPED
    return OK


def check_update(root: Path) -> int:
    """Print each worker's recorded template version and whether a newer one exists."""
    behind = 0
    annotate = os.environ.get("GITHUB_ACTIONS") == "true"
    for name in all_workers(root):
        answers = read_answers(root / "workers" / name / ANSWERS)
        recorded = str(answers.get("_commit", ""))
        try:
            src = template_source(root, root / "workers" / name / ANSWERS, answers)
        except RefusedError as exc:
            print(f"{name}: {recorded}, template unreachable: {exc}")
            continue
        refs = remote_refs(src, root) if src else {}
        if not refs:
            print(f"{name}: {recorded}, template {src or '?'} unreachable")
            continue
        target = target_ref(recorded, refs)
        if is_behind(recorded, target, refs):
            behind += 1
            print(f"{name}: {recorded} -> {target} (behind; make update-worker NAME={name})")
            if annotate:
                print(f"::warning::worker {name} is behind the template ({recorded} -> {target})")
        else:
            print(f"{name}: {recorded} (up to date)")
    if behind and os.environ.get("STRICT") in {"1", "true", "yes"}:
        return REFUSED
    return OK


# --- reversing one worker's fragments -------------------------------------------------------


def names_of(worker: str, kind: str) -> dict[str, str]:
    """The derived names the template uses (extensions/naming.py `derive_names`)."""
    module = worker.replace("-", "_")
    kind_class = "".join(p.capitalize() for p in kind.split("_") if p)
    return {
        "worker_module": module,
        "worker_env_prefix": module.upper() + "_",
        "kind_snake": kind.lower(),
        "payload_class": f"{kind_class}Payload",
    }


def _write(path: Path, old: str, new: str, touched: list[str], root: Path) -> None:
    if new != old:
        path.write_text(new, encoding="utf-8")
        touched.append(str(path.relative_to(root)))


def drop_member(text: str, member: str) -> str:
    """`pyproject.toml`: `"<member>"` out of the workspace members (inline or one per line)."""
    quoted = rf"""["']{re.escape(member)}["']"""
    text = re.sub(rf"^[ \t]*{quoted},?[ \t]*\n", "", text, flags=re.MULTILINE)
    text = re.sub(rf",[ \t]*{quoted}", "", text)
    return re.sub(rf"{quoted},[ \t]*", "", text)


IMAGE_LINE_WIDTH = 80  # prettier's default width, as extensions/deploy.py `add_image` keeps it
_IMAGE_KEY = re.compile(r"^(?P<indent>[ \t]*)image:[ \t]*(?P<rest>.*?)[ \t]*$")
_BLOCK_ITEM = re.compile(r"^(?P<indent>[ \t]*)-[ \t]+(?P<item>.*?)[ \t]*$")


def _image_list(lines: list[str], n: int) -> tuple[list[str], int, str, str] | None:
    """The `image:` list at line `n`: its entries, the index after it, the key's indent and
    its block items' ('' for a flow list). A flow list may wrap, as prettier writes it."""
    found = _IMAGE_KEY.match(lines[n].rstrip("\r\n"))
    if found is None:
        return None
    end, rest = n + 1, found["rest"]
    if not rest and end < len(lines) and lines[end].strip().startswith("["):
        rest, end = lines[end].strip(), end + 1
    if rest.startswith("["):
        while "]" not in rest and end < len(lines):
            rest, end = f"{rest} {lines[end].strip()}", end + 1
        body = rest[1 : rest.index("]")] if "]" in rest else rest[1:]
        return [i.strip() for i in body.split(",") if i.strip()], end, found["indent"], ""
    if rest:
        return None  # a scalar or an anchor: not a list of images
    items: list[str] = []
    indent = ""
    while end < len(lines) and (item := _BLOCK_ITEM.match(lines[end].rstrip("\r\n"))):
        items.append(item["item"])
        indent = indent or item["indent"]
        end += 1
    return (items, end, found["indent"], indent) if items else None


def drop_image(text: str, image: str) -> str:
    """A workflow: `<image>` out of every `image:` list (flow `[a, b]`, wrapped over lines or
    not, or block `- b`). A list it changes is written flow when that fits in 80 columns,
    one entry a line otherwise (extensions/deploy.py `add_image` writes them so)."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    n = 0
    while n < len(lines):
        found = _image_list(lines, n)
        if found is None:
            out.append(lines[n])
            n += 1
            continue
        items, end, indent, block_indent = found
        kept = [i for i in items if i.strip("'\"") != image]
        if kept == items:
            out += lines[n:end]
        else:
            flow = f"{indent}image: [{', '.join(kept)}]"
            if len(flow) <= IMAGE_LINE_WIDTH:
                out.append(flow + "\n")
            else:
                item_indent = block_indent or indent + "  "
                out += [f"{indent}image:\n", *(f"{item_indent}- {i}\n" for i in kept)]
        n = end
    return "".join(out)


# --- regions: where a worker's fragments live in the files workers share ------------------
#
# Each fragment the patcher writes for one worker into a shared file is a *region*: whole
# lines it can find again by structural identity (the env block's header, the worker's
# `run` line, the kind's enum member, import and map entries, the compose service). The
# patcher's update merges each region three ways (old render, the user's text, new render);
# `remove` and `rename` cut the same regions. One table, `worker_regions`, names them all,
# so an edit and its reverse cannot drift apart.


@dataclass(frozen=True)
class Region:
    """Lines `[start, end)` of a file that hold one fragment; `key` names the fragment.

    `gap` is how many blank lines right before `start` separate it from what precedes
    (cut along with the region when the worker goes, so the file keeps its spacing).
    """

    key: str
    start: int
    end: int
    gap: int = 0


def _balanced_end(lines: list[str], start: int) -> int:
    """One past the line where the brackets opened on `lines[start]` and after are closed."""
    depth = 0
    for i in range(start, len(lines)):
        code = lines[i].split("#", 1)[0]
        depth += sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")
        if depth <= 0:
            return i + 1
    return len(lines)


def _gap(lines: list[str], start: int) -> int:
    return 1 if start > 0 and not lines[start - 1].strip() else 0


def env_regions(lines: list[str], worker: str) -> list[Region]:
    """`.env.example`: `# --- worker <name> ---` and the lines after it up to a blank line
    or the next `# --- ` header."""
    header = f"# --- worker {worker} ---"
    for i, line in enumerate(lines):
        if line.strip() == header:
            end = i + 1
            while end < len(lines) and lines[end].strip() and not lines[end].startswith("# --- "):
                end += 1
            return [Region("env block", i, end, _gap(lines, i))]
    return []


def kind_env_header(kind: str, worker: str) -> str:
    """The header of a kind's `.env.example` block when the kind was added to `worker`."""
    return f"# --- kind {kind} of worker {worker} ---"


def kind_env_regions(lines: list[str], kind: str, worker: str) -> list[Region]:
    """`.env.example`: an added kind's header and the lines after it up to a blank line or
    the next `# --- ` header."""
    header = kind_env_header(kind, worker)
    for i, line in enumerate(lines):
        if line.strip() == header:
            end = i + 1
            while end < len(lines) and lines[end].strip() and not lines[end].startswith("# --- "):
                end += 1
            return [Region("kind env block", i, end, _gap(lines, i))]
    return []


def dev_regions(lines: list[str], worker: str) -> list[Region]:
    """`scripts/dev.sh`: the worker's `run <name> ...` line."""
    return [
        Region("dev script", i, i + 1)
        for i, line in enumerate(lines)
        if re.match(rf"run {re.escape(worker)}\s", line)
    ]


def work_readme_regions(lines: list[str], kind: str, worker: str) -> list[Region]:
    """`work/README.md`: the kind's line in the kinds list (``- `KIND`, ... `worker` ...``:
    a rename briefly lists the kind twice, once per worker name)."""
    entry = re.compile(rf"- `{re.escape(kind)}`[,\s].*`{re.escape(worker)}`")
    return [Region("work readme", i, i + 1) for i, line in enumerate(lines) if entry.match(line)]


def kinds_regions(lines: list[str], kind: str, kind_snake: str, payload_class: str) -> list[Region]:
    """`work/types/kinds.py`: the `WorkKind` member, the payload import (one line or
    parenthesised) and the `WORK_PAYLOADS` and `WORK_POLICIES` entries (one line or
    wrapped, however the value is written)."""
    found: list[Region] = []
    member = re.compile(rf"\s+{re.escape(kind)}\s*=\s*[\"']{re.escape(kind)}[\"']\s*(#.*)?$")
    imports = re.compile(rf"from \.payloads\.{re.escape(kind_snake)} import\b")
    entry = re.compile(rf"\s+WorkKind\.{re.escape(kind)}\s*:")
    where = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if re.match(r"[A-Z_]+\b.*=\s*\{\s*$", line):
            where = line.split(":", 1)[0].split("=", 1)[0].strip()
        elif line.startswith("}"):
            where = ""
        if member.match(line):
            found.append(Region("kind member", i, i + 1))
        elif imports.match(line):
            end = _balanced_end(lines, i)
            found.append(Region("kind import", i, end))
            i = end
            continue
        elif where in ("WORK_PAYLOADS", "WORK_POLICIES") and entry.match(line):
            end = _balanced_end(lines, i)
            found.append(Region(f"kind entry {where}", i, end))
            i = end
            continue
        i += 1
    return found


def compose_regions(lines: list[str], worker: str) -> list[Region]:
    """`docker-compose.full.yml`: the service `<worker>` (its key and everything indented
    below it)."""
    key = re.compile(rf"^(\s+){re.escape(worker)}:\s*$")
    for i, line in enumerate(lines):
        match = key.match(line)
        if not match:
            continue
        indent = len(match.group(1))
        end = i + 1
        while end < len(lines) and (
            not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent
        ):
            end += 1
        while end > i + 1 and not lines[end - 1].strip():
            end -= 1
        return [Region("compose service", i, end, _gap(lines, i))]
    return []


def worker_regions(
    host_root: str, worker: str, kind: str
) -> dict[str, Callable[[list[str]], list[Region]]]:
    """Every shared file that holds line regions of this worker, with the function that
    finds them (keyed by path from the host root)."""
    names = names_of(worker, kind)
    work = f"om/src/{host_root}/om/work"
    return {
        ".env.example": lambda lines: env_regions(lines, worker),
        "scripts/dev.sh": lambda lines: dev_regions(lines, worker),
        f"{work}/README.md": lambda lines: work_readme_regions(lines, kind, worker),
        f"{work}/types/kinds.py": lambda lines: kinds_regions(
            lines, kind, names["kind_snake"], names["payload_class"]
        ),
        "deployment/local/docker-compose.full.yml": lambda lines: compose_regions(lines, worker),
    }


def kind_regions(
    host_root: str, worker: str, kind: str
) -> dict[str, Callable[[list[str]], list[Region]]]:
    """Every shared file that holds line regions of a kind added to `worker` (`add-kind`):
    its `.env.example` block, its line in `work/README.md`, its rows in `kinds.py`."""
    names = names_of(worker, kind)
    work = f"om/src/{host_root}/om/work"
    return {
        ".env.example": lambda lines: kind_env_regions(lines, kind, worker),
        f"{work}/README.md": lambda lines: work_readme_regions(lines, kind, worker),
        f"{work}/types/kinds.py": lambda lines: kinds_regions(
            lines, kind, names["kind_snake"], names["payload_class"]
        ),
    }


def cut_regions(text: str, regions: list[Region], *, with_gap: bool = True) -> str:
    """`text` without the lines of `regions` (and, with `with_gap`, the blank line before
    each region that had one)."""
    lines = text.splitlines(keepends=True)
    drop: set[int] = set()
    for region in regions:
        drop.update(range(region.start - (region.gap if with_gap else 0), region.end))
    return "".join(line for i, line in enumerate(lines) if i not in drop)


def env_port(text: str, worker: str, prefix: str) -> str | None:
    """The `<PREFIX>METRICS_PORT` value in the worker's `.env.example` block, if any."""
    lines = text.splitlines(keepends=True)
    for region in env_regions(lines, worker):
        for line in lines[region.start : region.end]:
            if line.startswith(f"{prefix}METRICS_PORT="):
                return line.split("=", 1)[1].strip()
    return None


def _cut_found(text: str, find: Callable[[list[str]], list[Region]]) -> str:
    return cut_regions(text, find(text.splitlines(keepends=True)))


def reverse_fragments(
    root: Path, answers: dict[str, object], *, keep_kind: bool = False
) -> list[str]:
    """Undo the patcher's per-worker edits in the host files many workers share.

    The workspace member and the deploy matrix entries (parts of one line), then every
    region of `worker_regions`: the `.env.example` block, the `scripts/dev.sh` line, the
    compose service, the kind's line in `work/README.md` and (unless `keep_kind`) its
    member, payload import and map entries in `work/types/kinds.py`, wrapped or not.
    Shared additions (the topic, the cache scope, the namespace's own rows) stay. Returns
    the files changed.
    """
    worker, kind = str(answers["worker_name"]), str(answers["work_kind"])
    pkg = str(answers["host_root"])
    touched: list[str] = []
    edits: list[tuple[str, Callable[[str], str]]] = [
        ("pyproject.toml", lambda t: drop_member(t, f"workers/{worker}")),
        (".github/workflows/deploy-staging.yml", lambda t: drop_image(t, worker)),
        (".github/workflows/deploy-production.yml", lambda t: drop_image(t, worker)),
    ]
    kinds_path = f"om/src/{pkg}/om/work/types/kinds.py"
    for rel, find in worker_regions(pkg, worker, kind).items():
        if keep_kind and rel == kinds_path:
            continue
        edits.append((rel, functools.partial(_cut_found, find=find)))
    for rel, edit in edits:
        path = root / rel
        if path.is_file():
            old = path.read_text(encoding="utf-8")
            _write(path, old, edit(old), touched, root)
    return touched


def worker_files(root: Path, answers: dict[str, object]) -> list[Path]:
    """The files copier rendered for this worker alone (its folder, image, Terraform), and
    the Terraform state moves an update from before 0.2 wrote beside them."""
    worker = str(answers["worker_name"])
    module = names_of(worker, str(answers["work_kind"]))["worker_module"]
    found = [root / "workers" / worker, root / "deployment" / "docker" / f"{worker}.Dockerfile"]
    found += sorted(root.glob(f"deployment/terraform/environments/*/worker_{module}.tf"))
    found += sorted(root.glob(f"deployment/terraform/environments/*/worker_{module}.moved.tf"))
    return [p for p in found if p.exists()]


def _set_answer(text: str, key: str, line: str) -> str:
    """Replace the `key: ...` line of an answers file by `line`."""
    return re.sub(rf"^{re.escape(key)}:.*$", line.rstrip("\n"), text, count=1, flags=re.MULTILINE)


# --- kinds added to a worker ---------------------------------------------------------------


def kind_module(root: Path, answers: dict[str, object]) -> Path:
    """The worker's `kinds/` package, where each added kind's handler module goes."""
    names = names_of(str(answers["worker_name"]), str(answers["work_kind"]))
    package = f"src/{answers['host_root']}/workers/{names['worker_module']}/kinds"
    return root / "workers" / str(answers["worker_name"]) / package


def add_kind(root: Path, name: str, kind: str) -> int:
    """`copier copy` of the kind subtree for worker `name` at the worker's own template
    version (copier.yml `added_kind`): the kind's answers file, files and fragments."""
    path = answers_file(root, name)
    holder = kind_entries(root).get(kind)
    if holder is not None:
        own = read_answers(answers_file(root, holder)).get("work_kind") == kind
        remove = (
            f"it is that worker's own kind: make remove-worker NAME={holder}"
            if own
            else f"make remove-kind NAME={holder} KIND={kind}"
        )
        raise RefusedError(
            f"kind {kind} is already handled by the {holder} worker; a kind has one worker "
            f"(remove it there first: {remove})"
        )
    require_clean(root)
    answers = read_answers(path)
    if not kind_module(root, answers).joinpath("__init__.py").is_file():
        raise RefusedError(
            f"worker {name} predates kinds added to a worker: update it first "
            f"(make update-worker NAME={name}), commit, then add the kind"
        )
    src = template_source(root, path, answers)
    commit = str(answers.get("_commit") or "")
    if not src or not commit:
        raise RefusedError(f"{path.relative_to(root)} has no _src_path/_commit: not made by copier")
    lane = str(answers.get("lane") or "default")
    print(f"==> kind {kind}: adding it to worker {name} at {commit} ({src})", flush=True)
    cmd = [*copier_cmd(), "copy", "--trust", "--defaults", "--vcs-ref", commit]
    for key, value in (
        ("worker_name", name),
        ("work_kind", kind),
        ("lane", lane),
        ("added_kind", "true"),
    ):
        cmd += ["--data", f"{key}={value}"]
    done = subprocess.run([*cmd, src, "."], check=False, cwd=root)
    if done.returncode != 0:
        print(f"==> kind {kind}: copier copy failed (exit {done.returncode})", file=sys.stderr)
        return REFUSED
    print(
        f"==> kind {kind} added to worker {name}: its handler is "
        f"{kind_module(root, answers).relative_to(root)}/{kind.lower()}.py; review, "
        "`uv sync --all-packages`, commit"
    )
    return OK


def _kind_files(root: Path, worker: str, kind: str, answers: dict[str, object]) -> list[Path]:
    """The files the kind subtree rendered for `kind` of `worker` (the kind's answers too,
    and its settings in each environment's Terraform: `kind_settings_files`)."""
    snake = names_of(worker, kind)["kind_snake"]
    work = root / "om" / "src" / str(answers["host_root"]) / "om" / "work"
    return [
        work / "enqueuers" / f"{snake}.py",
        work / "types" / "payloads" / f"{snake}.py",
        root / "om" / "tests" / "unit" / f"test_enqueue_{snake}.py",
        kind_module(root, answers) / f"{snake}.py",
        root / "workers" / worker / "tests" / f"test_kind_{snake}.py",
        *kind_settings_files(root, worker, kind),
        root / answers_path(worker, kind),
    ]


def kind_settings_files(root: Path, worker: str, kind: str) -> list[Path]:
    """The Terraform settings of `kind` added to `worker`, one file per environment:
    `deployment/terraform/environments/<env>/kinds/<worker>/<kind_snake>.yml`, which the
    worker file merges into its module instance's `kind_settings` (docs/decisions/0042)."""
    snake = names_of(worker, kind)["kind_snake"]
    return sorted(root.glob(f"{TERRAFORM_ENVIRONMENTS}/*/kinds/{worker}/{snake}.yml"))


def _drop_empty_kind_folders(root: Path, worker: str) -> None:
    """Remove `kinds/<worker>/` of each environment once its last kind's file is gone, and
    `kinds/` when that leaves it empty: the folders the kind subtree's copy created."""
    for folder in sorted(root.glob(f"{TERRAFORM_ENVIRONMENTS}/*/kinds/{worker}")):
        for empty in (folder, folder.parent):
            if empty.is_dir() and not any(empty.iterdir()):
                empty.rmdir()


def _remove_kind(root: Path, worker: str, kind: str, path: Path) -> list[str]:
    """Cut the kind's regions (`kind_regions`) and delete its files; the paths changed."""
    answers = read_answers(path)
    touched: list[str] = []
    for rel, find in kind_regions(str(answers["host_root"]), worker, kind).items():
        target = root / rel
        if target.is_file():
            old = target.read_text(encoding="utf-8")
            _write(target, old, _cut_found(old, find), touched, root)
    for target in _kind_files(root, worker, kind, answers):
        if target.is_file():
            target.unlink()
            touched.append(str(target.relative_to(root)))
    _drop_empty_kind_folders(root, worker)
    return touched


def remove_kind(root: Path, name: str, kind: str) -> int:
    """Take a kind added to worker `name` away: its fragments and its files."""
    answers_file(root, name)
    added = added_kinds(root, name)
    if kind not in added:
        known = ", ".join(added) or "none"
        raise RefusedError(f"no kind {kind} added to worker {name} (kinds added to it: {known})")
    require_clean(root)
    touched = _remove_kind(root, name, kind, added[kind])
    print(f"==> kind {kind} removed from worker {name}; review with `git status`, then commit:")
    for item in touched:
        print(f"      {item}")
    print(
        f"==> items of {kind} still in a database stay there, stranded: `uv run --all-packages "
        f"{name} items list --any-kind` lists them and `... items discard ID --org ORG` "
        "removes each (docs/updating.md)"
    )
    return OK


def remove(root: Path, name: str) -> int:
    """Remove a worker: its files, its kind, its fragments; hand the namespace on if it owns it."""
    path = answers_file(root, name)
    require_clean(root)
    answers = read_answers(path)
    kinds_gone = [
        touched
        for kind, kind_path in added_kinds(root, name).items()
        for touched in _remove_kind(root, name, kind, kind_path)
    ]
    others = [w for w in all_workers(root) if w != name]
    if answers.get("namespace_absent") is True:
        if not others:
            raise RefusedError(
                f"{name} owns the work namespace and is the last worker: removing it would "
                "leave a namespace without kinds. Revert the commit that added it, or follow "
                "'Removing the last worker' in docs/updating.md"
            )
        heir = others[0]
        heir_path = root / "workers" / heir / ANSWERS
        heir_answers = read_answers(heir_path)
        if heir_answers.get("_commit") != answers.get("_commit"):
            raise RefusedError(
                f"{name} owns the work namespace; it passes to {heir}, which must be at the same "
                f"template version first ({heir_answers.get('_commit')} vs "
                f"{answers.get('_commit')}): "
                f"make update-worker NAME={heir} (and NAME={name}), commit, then remove"
            )
        text = heir_path.read_text(encoding="utf-8")
        mine = path.read_text(encoding="utf-8")
        for key in ("migration_stamp", "queue_down_revision"):
            line = re.search(rf"^{key}:.*$", mine, re.MULTILINE)
            if line:
                text = _set_answer(text, key, line.group(0))
        text = _set_answer(text, "namespace_absent", "namespace_absent: true")
        heir_path.write_text(text, encoding="utf-8")
        print(f"==> the work namespace now belongs to {heir} (workers/{heir}/{ANSWERS})")
    touched = reverse_fragments(root, answers)
    payload = (
        root
        / "om"
        / "src"
        / str(answers["host_root"])
        / "om"
        / "work"
        / "types"
        / "payloads"
        / f"{names_of(name, str(answers['work_kind']))['kind_snake']}.py"
    )
    kind_snake = names_of(name, str(answers["work_kind"]))["kind_snake"]
    per_kind = [  # the kind's files in the namespace (payload, enqueuer, their tests)
        p
        for p in (root / "om").rglob(f"*{kind_snake}.py")
        if p.stem == kind_snake or p.stem.endswith(f"_{kind_snake}")
    ]
    for target in [*worker_files(root, answers), payload, *per_kind]:
        if not target.exists():
            continue
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        touched.append(str(target.relative_to(root)))
    print(f"==> worker {name} removed; review with `git status`, then commit:")
    for item in dict.fromkeys(kinds_gone + touched):
        print(f"      {item}")
    kind = answers["work_kind"]
    print(
        f"==> items of {kind} still in a database stay there, stranded: the other workers' "
        f"`serve` names them; `uv run --all-packages {others[0]} items list --any-kind` "
        f"lists them and `... items discard ID --org ORG` removes each (docs/updating.md)"
    )
    return OK


# --- rename ---------------------------------------------------------------------------------


def substitutions(old: str, new: str, package_root: str = "") -> list[tuple[re.Pattern[str], str]]:
    """The name forms the template derives from `worker_name`, old to new (whole words).

    `package_root` adds the distribution and image name `<root>-<worker>`, which the
    whole-word form alone misses (a `-` precedes the worker name there).
    """
    forms = [
        *([(f"{package_root}-{old}", f"{package_root}-{new}")] if package_root else []),
        (old, new),
        (old.replace("-", "_"), new.replace("-", "_")),
        # the Terraform module instance, `module "worker_<module>"` (docs/decisions/0031)
        ("worker_" + old.replace("-", "_"), "worker_" + new.replace("-", "_")),
        (old.replace("-", "_").upper() + "_", new.replace("-", "_").upper() + "_"),
    ]
    return [
        (
            re.compile(
                rf"(?<![\w-]){re.escape(a)}(?![\w-])"
                if not a.endswith("_")
                else rf"(?<![\w]){re.escape(a)}"
            ),
            b,
        )
        for a, b in dict(forms).items()
    ]


def substitute(text: str, subs: list[tuple[re.Pattern[str], str]]) -> str:
    for pattern, replacement in subs:
        text = pattern.sub(replacement, text)
    return text


def carry_regions(
    root: Path,
    host_root: str,
    kind: str,
    old: str,
    new: str,
    subs: list[tuple[re.Pattern[str], str]],
) -> list[str]:
    """In every shared file, each region the patcher just wrote for `new` takes the text of
    the same region of `old`, its name forms replaced (`subs`): a rename keeps the user's
    edits in the `.env.example` block and the compose service, and the old metrics port.
    The kind's regions in `kinds.py` are the same lines under both names and stay. Returns
    the files changed; the old regions are cut afterwards (`reverse_fragments`)."""
    touched: list[str] = []
    old_regions = worker_regions(host_root, old, kind)
    kinds_path = f"om/src/{host_root}/om/work/types/kinds.py"
    for rel, find_new in worker_regions(host_root, new, kind).items():
        path = root / rel
        if rel == kinds_path or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        before = {r.key: "".join(lines[r.start : r.end]) for r in old_regions[rel](lines)}
        for region in sorted(find_new(lines), key=lambda r: r.start, reverse=True):
            if region.key in before:
                carried = substitute(before[region.key], subs)
                lines[region.start : region.end] = carried.splitlines(keepends=True)
        _write(path, text, "".join(lines), touched, root)
    return touched


def rename(root: Path, old: str, new: str) -> int:
    """Rename a worker: copier re-renders it under the new name, user edits carried over.

    1. `copier update --vcs-ref :current: -d worker_name=<new>` (same template version):
       copier moves every rendered file to its new path, re-applies the fragments for the
       new name, and leaves the answers file behind.
    2. Each file the update deleted whose content differed from the freshly rendered file
       at its new path (after the old names are replaced by the new) is kept in the user's
       version: the handler, its test, and any other edit survive; files the user added
       under the old folder move along.
    3. The answers file moves to `workers/<new>/`; each region of the new name in a shared
       file takes the old name's region, names replaced (`carry_regions`: your edits there
       and the old metrics port survive), then the old name's fragments are reversed.
    """
    path = answers_file(root, old)
    if not WORKER_NAME.fullmatch(new):
        raise RefusedError(
            f"worker_name {new!r} must be kebab-case (lowercase letters and digits, starting "
            "with a letter, words joined by '-', e.g. shipment-notifier)"
        )
    if (root / "workers" / new).exists():
        raise RefusedError(f"workers/{new} already exists; choose another name")
    added = added_kinds(root, old)
    if added:
        raise RefusedError(
            f"{old} has kinds added to it ({', '.join(added)}), which a rename does not move "
            f"yet: make remove-kind NAME={old} KIND=<kind> for each, rename, then add them again"
        )
    require_clean(root)
    answers = read_answers(path)
    rel = str(path.relative_to(root))
    cmd = [
        *copier_cmd(),
        "update",
        "--trust",
        "--defaults",
        "--conflict",
        "inline",
        "--vcs-ref",
        ":current:",
        "--answers-file",
        rel,
        "--data",
        f"worker_name={new}",
    ]
    print(f"==> renaming worker {old} to {new}", flush=True)
    env = {**os.environ, "WORKER_TEMPLATE_RENAME": f"{old}>{new}", HELPER_REPORTS: "1"}
    if subprocess.run(cmd, check=False, cwd=root, env=env).returncode != 0:
        print(
            "==> copier update failed; `git checkout . && git clean -fd` undoes it", file=sys.stderr
        )
        return REFUSED
    subs = substitutions(old, new, str(answers["host_root"]))
    kept: list[str] = []
    for line in changes(root):
        code, file = line[:2], line[3:]
        if code.strip() != "D" or file == rel:
            continue
        target = root / substitute(file, subs)
        user = git(root, "show", f"HEAD:{file}")
        mine = substitute(user, subs)
        if target == root / file:
            continue
        if not target.exists() or target.read_text(encoding="utf-8") != mine:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(mine, encoding="utf-8")
            kept.append(str(target.relative_to(root)))
    leftover = root / "workers" / old
    # What git ignores there (bytecode, caches) is regenerated, not the user's: it goes.
    ignored = set(
        git(root, "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--",
            f"workers/{old}").split("\0")
    )  # fmt: skip
    strays = [
        p for p in leftover.rglob("*")
        if p.is_file() and p.name != ANSWERS and str(p.relative_to(root)) not in ignored
    ]  # fmt: skip
    for stray in sorted(strays):
        target = root / substitute(str(stray.relative_to(root)), subs)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(stray, target)
        kept.append(str(target.relative_to(root)))
    new_answers = root / "workers" / new / ANSWERS
    new_answers.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(path, new_answers)
    shutil.rmtree(leftover, ignore_errors=True)
    carry_regions(root, str(answers["host_root"]), str(answers["work_kind"]), old, new, subs)
    reverse_fragments(root, {**answers, "worker_name": old}, keep_kind=True)
    for settled in settle_kinds(root):
        print(f"    settled  {settled}: the kinds list written from the workers' answers")
    print(f"==> worker {old} is now {new}; review with `git status`, then commit.")
    for item in kept:
        print(f"      kept your version: {item}")
    found = conflicts(root)
    return CONFLICTS if found else OK


# --- the developer's .env ----------------------------------------------------------------


ENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def env_values(text: str) -> dict[str, str]:
    """`KEY=value` lines of a dotenv file (`export ` allowed, comments skipped, the value as
    written, quotes included); a key set twice keeps its last value, as the shell does."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        found = ENV_LINE.match(line)
        if found:
            values[found.group(1)] = found.group(2).strip()
    return values


def stale_defaults(
    env: dict[str, str], example: dict[str, str], earlier: list[dict[str, str]]
) -> list[str]:
    """The keys `env` (the developer's `.env`) still holds at a value an earlier
    `.env.example` gave (`earlier`, newest first) while the current `example` gives another:
    one line each, `KEY=old ... KEY=new`. A value the examples never held is the developer's
    own choice and is not reported."""
    found: list[str] = []
    for key, value in env.items():
        now = example.get(key)
        if now is None or value == now:
            continue
        if any(old.get(key) == value for old in earlier):
            found.append(f".env still sets {key}={value}; .env.example now says {key}={now}")
    return found


def check_env(root: Path) -> int:
    """Compare `.env` with `.env.example` and its git history: 1 (each stale line printed)
    when `.env` keeps a default the example has since changed; `.env` is never written."""
    env_path, example_path = root / ".env", root / ".env.example"
    for missing in (path.name for path in (env_path, example_path) if not path.is_file()):
        print(f"check-worker-env: no {missing} in the host root, nothing to compare")
        return OK
    commits = git(root, "log", "--format=%H", "-n", "200", "--", ".env.example", check=False)
    earlier = [
        env_values(git(root, "show", f"{commit}:.env.example", check=False))
        for commit in commits.split()
    ]
    stale = stale_defaults(
        env_values(env_path.read_text(encoding="utf-8")),
        env_values(example_path.read_text(encoding="utf-8")),
        earlier,
    )
    for line in stale:
        print(line)
    if stale:
        print(
            f"check-worker-env: {len(stale)} line(s) of .env hold a default .env.example has "
            "since changed; edit .env (keep a line you set on purpose)",
            file=sys.stderr,
        )
        return REFUSED
    print("check-worker-env: .env holds no default .env.example has since changed")
    return OK


# --- restore --------------------------------------------------------------------------------


# The files the user owns once generated (copier.yml `_skip_if_exists`): never overwritten.
USER_OWNED = (
    "workers/*/src/*/workers/*/handler.py",
    "workers/*/tests/test_handler.py",
    "om/src/*/om/work/types/payloads/*.py",
)


def namespace_owner(root: Path) -> str | None:
    """The worker that owns the `work` namespace (`namespace_absent: true` in its answers)."""
    for name in all_workers(root):
        if read_answers(root / "workers" / name / ANSWERS).get("namespace_absent") is True:
            return name
    return None


def restore(root: Path, name: str, file: str, force: bool = False) -> int:
    """Render the worker at its recorded template version and write back one file.

    Copier never recreates a file the user deleted (unless it is in `_skip_if_exists`); this
    brings back the exact rendering of the recorded `_commit`, so later updates merge it.
    A path that exists is refused (`force` overwrites it, saying so), and a file the user
    owns (`USER_OWNED`) is never overwritten: copier recreates those itself. A file other
    workers add fragments to (`SHARED_RENDERED`) gets every worker's, and a file only the
    namespace owner renders is refused from another worker, naming the owner.
    """
    path = answers_file(root, name)
    target = (root / file).resolve()  # a path from the host root, or an absolute one
    try:
        file = str(target.relative_to(root.resolve()))
    except ValueError:
        raise RefusedError(f"{file} is outside the host {root}") from None
    owned = any(Path(file).match(pattern) for pattern in USER_OWNED)
    if target.exists() and owned:
        raise RefusedError(
            f"{file} is yours (the template never overwrites it); to start it over, delete it "
            "and run `copier update` or this command again"
        )
    if target.exists() and not force:
        status = git(root, "status", "--porcelain", "--", file, check=False).strip()
        state = {"": "", "??": " and is not tracked by git"}.get(
            status[:2], " and has uncommitted changes"
        )
        raise RefusedError(
            f"{file} exists{state}; restore brings back a deleted file: delete it first, or "
            "overwrite it with FORCE=1 (make restore-worker-file) or --force "
            "(scripts/workers.py restore)"
        )
    answers = read_answers(path)
    src = template_source(root, path, answers)
    data = {k: v for k, v in answers.items() if not k.startswith("_")}
    with tempfile.TemporaryDirectory(prefix="worker-template.restore.") as tmp:
        data_file = Path(tmp) / "data.yml"
        data_file.write_text(
            "".join(f"{k}: {_yaml_scalar(v)}\n" for k, v in data.items()), encoding="utf-8"
        )
        out = Path(tmp) / "render"
        cmd = [
            *copier_cmd(),
            "copy",
            "--trust",
            "--defaults",
            "--quiet",
            "--vcs-ref",
            str(answers["_commit"]),
            "--data-file",
            str(data_file),
            src,
            str(out),
        ]
        done = subprocess.run(cmd, check=False, cwd=root, capture_output=True, text=True)
        if done.returncode != 0:
            raise RefusedError(
                f"could not render {name} at {answers['_commit']}: {done.stderr.strip()}"
            )
        source = out / file
        owner = namespace_owner(root)
        # what the owner renders
        namespace_file = file.startswith(
            ("om/", "workers/runtime/", "deployment/terraform/modules/worker/")
        )
        if not source.is_file() and namespace_file and owner is not None and owner != name:
            raise RefusedError(
                f"{name} does not render {file}; the `work` namespace's files are rendered by "
                f"the worker that owns it: make restore-worker-file NAME={owner} FILE={file}"
            )
        if not source.is_file():
            raise RefusedError(f"the template does not render {file} for {name}")
        before = target.read_bytes() if target.is_file() else None
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    for pattern, rebuild in SHARED_RENDERED.items():
        if Path(file).match(pattern) and rebuild(root, target):
            print(f"    rebuilt  {file}: every worker's fragments put back")
    if before is not None and before != target.read_bytes():
        print(
            f"    overwrote {file}: your version was replaced by the template's "
            f"(git diff -- {file} shows what changed)"
        )
    print(f"==> restored {file} as the template rendered it at {answers['_commit']}")
    return OK


def _yaml_scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


# --- command line ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/workers.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("update", help="copier update of one worker")
    p.add_argument("name")
    p.add_argument("--ref", default=None, help="template ref (default: see the docstring)")
    p = sub.add_parser("update-all", help="copier update of every worker, one at a time")
    p.add_argument("--commit", action="store_true", help="commit each worker's update")
    sub.add_parser("check-update", help="list the workers behind the template")
    p = sub.add_parser("remove", help="remove a worker and its fragments")
    p.add_argument("name")
    p = sub.add_parser("add-kind", help="add a kind to an existing worker")
    p.add_argument("name")
    p.add_argument("kind", help="UPPER_SNAKE, e.g. SEND_RECEIPT")
    p = sub.add_parser("remove-kind", help="take a kind added to a worker away")
    p.add_argument("name")
    p.add_argument("kind")
    p = sub.add_parser("rename", help="rename a worker")
    p.add_argument("old")
    p.add_argument("new")
    sub.add_parser("check-env", help="lines of .env at a default .env.example has changed")
    p = sub.add_parser("restore", help="render a deleted worker file again")
    p.add_argument("name")
    p.add_argument("file", help="path from the host root, e.g. workers/x/README.md")
    p.add_argument("--force", action="store_true", help="overwrite the file when it exists")
    args = parser.parse_args(argv)
    try:
        root = host_root()
        if args.command == "update":
            return update(root, args.name, args.ref or None)
        if args.command == "update-all":
            return update_all(root, args.commit)
        if args.command == "check-update":
            return check_update(root)
        if args.command == "remove":
            return remove(root, args.name)
        if args.command == "add-kind":
            return add_kind(root, args.name, args.kind)
        if args.command == "remove-kind":
            return remove_kind(root, args.name, args.kind)
        if args.command == "rename":
            return rename(root, args.old, args.new)
        if args.command == "check-env":
            return check_env(root)
        return restore(root, args.name, args.file, args.force)
    except RefusedError as exc:
        print(f"workers.py: {exc}", file=sys.stderr)
        return REFUSED


if __name__ == "__main__":
    sys.exit(main())
