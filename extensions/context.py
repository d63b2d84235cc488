"""Copier context hook: derived names, host facts, and the checks that run before rendering.

The hook runs on every Jinja render (copier 9.19.1 calls a context hook for each one), in
the prompt and render phases of a copy and of all three update passes, so it only adds
cheap values to the context:

- the derived names (`worker_module`, `kind_class`, ...; extensions/naming.py);
- `_host`: facts about the destination (extensions/hostfacts.py), read by the defaults of
  the `ask: false` questions and by nothing else, since update replays run in bare folders;
- `_preflight()`: the one place that refuses a copy. copier.yml calls it from the default
  of `host_root`, the first `ask: false` question, so it runs in the prompt phase of
  `copier copy` after the three answers are known and before any file is written. It
  raises `copier.errors.UserMessageError` (one red line, exit 1, nothing written).

Why a default and not a `validator`: copier turns any exception raised while a validator
renders into a `ValueError` with a traceback (copier/_user_data.py `validate_answer`),
while an exception from a default propagates as raised. Why it cannot fire on update:
every update pass takes `host_root` from the recorded answers (the old replay from its
`data`, the real pass from the answers file, the new replay from `data` again), so copier
never renders that default there (copier/_main.py `_ask`). As a second guard `_preflight`
returns the recorded value in copier's temporary folders (`copier._main.*_copy.*`).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import runpy
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from copier.errors import UserMessageError
from copier_template_extensions import ContextHook

# `_sibling("naming")`: extensions/naming.py, loaded once per template checkout (siblings.py).
_sibling: Callable[[str], ModuleType] = functools.partial(
    runpy.run_path(str(Path(__file__).with_name("siblings.py")))["load"], __file__
)


if TYPE_CHECKING:
    import hostfacts
    import launch
    import naming
    import patcher
else:
    naming = _sibling("naming")
    hostfacts = _sibling("hostfacts")
    patcher = _sibling("patcher")
    launch = _sibling("launch")

REPLAY_PREFIX = "copier._main."


def _yaml() -> Any:
    """PyYAML, copier's own dependency (imported by name: mypy needs no stubs for it)."""
    return importlib.import_module("yaml")


def _conf(context: dict[str, Any], key: str) -> Any:
    conf = context.get("_copier_conf")
    if conf is None:
        return None
    try:
        return conf[key]
    except (KeyError, TypeError):
        return getattr(conf, key, None)


def destination(context: dict[str, Any]) -> Path:
    """The destination folder as copier was given it, resolved against the cwd."""
    return _resolved(str(_conf(context, "dst_path") or "."), os.getcwd())


@lru_cache(maxsize=32)
def _resolved(path: str, cwd: str) -> Path:
    """`path` resolved against `cwd` (cached: the hook asks on every render)."""
    return (Path(cwd) / path).resolve()


# Template sources copier reads as URLs or shorthands, never as local folders.
_REMOTE_SOURCE = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|git@|gh:|gl:|git\+)", re.IGNORECASE)


def absolute_source(src: str, cwd: str) -> str | None:
    """The absolute form of a template given as a relative local path (`../worker-template`
    from `/src/host` gives `/src/worker-template`); None for a URL, a shorthand, an absolute
    or `~` path, or a path that names no folder from `cwd`.

    Copier records `_src_path` as typed and resolves it against the folder each later
    command runs in: from `workers/<x>` a relative path finds no template, and copier says
    only "Updating is only supported in git-tracked templates". So a copy records it absolute.
    """
    if not src or _REMOTE_SOURCE.match(src) or src.startswith("~") or Path(src).is_absolute():
        return None
    folder = (Path(cwd) / src).resolve()
    return str(folder) if folder.is_dir() else None


def record_absolute_source(context: dict[str, Any]) -> None:
    """Rewrite a relative `_src_path` in the answers copier is about to record (the
    `_copier_answers` the answers file renders) to its absolute form (`absolute_source`)."""
    answers = context.get("_copier_answers")
    if not isinstance(answers, dict):
        return
    absolute = absolute_source(str(answers.get("_src_path") or ""), os.getcwd())
    if absolute is not None:
        answers["_src_path"] = absolute


def is_replay_folder(path: Path) -> bool:
    """Copier's temporary old/new copies during `copier update` (folders named `copier._main.*`)."""
    return path.name.startswith(REPLAY_PREFIX) or any(
        p.name.startswith(REPLAY_PREFIX) for p in path.parents
    )


def launch_host(dst: Path) -> Path | None:
    """The folder the copy form renders into: `<host>` for a destination `<host>/workers/<x>`
    that is not itself a host root (a host may live in a folder named `workers`); None for
    every other destination. Whether `<host>` is a host root is the preflight's check.

    The answer picks copier.yml's `_subdirectory` (`launcher`, which renders nothing, when
    not None) and runs its launch task (extensions/launch.py). It is the same for an update
    replay of such a folder (`copier._main.old_copy.*/workers/<x>`), so all three passes of
    an update pick the same subtree.
    """
    parent: Path | None = launch.worker_parent(dst)
    if parent is None or hostfacts.discover_host(dst).is_host:
        return None
    return parent


def target(context: dict[str, Any]) -> Path:
    """The folder the checks and host facts read: the host root of the copy form
    (`launch_host`), else the destination; an update replay is always its own folder."""
    dst = destination(context)
    host = None if is_replay_folder(dst) else launch_host(dst)
    return dst if host is None else host


def copier_operation() -> str | None:
    """'copy' or 'update': the operation copier runs, None when this copier does not say.

    Copier 9.19.1 gives `_copier_operation` to tasks, migrations and `_exclude` only; the
    context hook reads the context variable copier sets for them (`copier._main._operation`,
    private: a copier that renames it gives None, and the callers then refuse in one line).
    The update's replays and its real pass all see 'update'.
    """
    try:
        from copier._main import _operation
    except ImportError:
        return None
    value = _operation.get(None)
    return str(value) if value else None


def preflight(context: dict[str, Any]) -> str:
    """Check the answers and the host; return the host's package root.

    Raises `UserMessageError` with every problem on one line: an answer that breaks its
    format or gives a Python keyword, a destination that is not a host root (naming what
    is missing) or is a worker folder (naming the command to run instead), a worker that
    already exists (naming the `copier update` command), a worker name whose image or
    distribution the host already has, a kind another worker holds, a name another kind or
    worker already derives (`derived_collisions`), an answer past a length limit of the
    host (naming.py `limit_problems`), a host file missing a structure a fragment needs
    (extensions/patcher.py `check_host`), a path the copy writes through a symlink that
    leaves the host, and a destination that is not a git work tree or whose files the copy
    writes or patches have uncommitted changes (the copy is all or nothing).
    """
    dst = target(context)
    recorded = context.get("host_root") or (_conf(context, "data") or {}).get("host_root")
    if is_replay_folder(dst) or str(context.get("_copier_phase", "prompt")) != "prompt":
        return str(recorded or "")
    worker = str(context.get("worker_name") or "")
    kind = str(context.get("work_kind") or "")
    lane = str(context.get("lane") or "")
    problems = naming.answer_problems(worker_name=worker, work_kind=kind, lane=lane)
    problems += naming.boolean_problems(
        dict(_conf(context, "data") or {}), ("maintenance", "container")
    )
    if problems:
        raise UserMessageError("; ".join(problems))
    facts = hostfacts.discover_host(dst)
    given = (_conf(context, "data") or {}).get("host_root")
    if given and facts.is_host and given != facts.root:
        raise UserMessageError(
            f"host_root is discovered from the host ({facts.root!r}), not answered: "
            f"drop -d host_root={given}"
        )
    if not facts.is_host:
        host = hostfacts.enclosing_host(dst)
        if host is not None:
            raise UserMessageError(inside_host(context, dst, host, worker, kind, lane))
        raise UserMessageError(
            f"{dst} is not a host root: {'; '.join(facts.problems)} "
            "(see docs/host-contract.md; run copier from the root of the monorepo)"
        )
    if context.get("added_kind") is True:
        return kind_preflight(context, dst, facts, worker, kind, lane)
    answers = Path("workers") / worker / hostfacts.ANSWERS_NAME
    if (dst / answers).is_file():
        raise UserMessageError(
            f"worker {worker!r} already exists ({answers}); to bring it to a newer template "
            f"version run: copier update --trust --defaults -a {answers}"
        )
    folder = dst / "workers" / worker
    if folder.exists() and any(folder.iterdir()):
        raise UserMessageError(
            f"workers/{worker}/ already exists and was not made by this template "
            f"(no {answers}); choose another worker_name"
        )
    fixed = fixed_answer_problems(dict(_conf(context, "data") or {}), facts)
    if fixed:
        raise UserMessageError("; ".join(fixed))
    collisions = hostfacts.name_collisions(dst, facts.root, worker)
    if collisions:
        raise UserMessageError(
            f"worker_name {worker!r} collides with what the host has: "
            f"{'; '.join(collisions)}; choose another worker_name"
        )
    holder = facts.kinds.get(kind)
    if holder is not None:
        raise UserMessageError(
            f"work_kind {kind!r} is already taken ({holder}); each kind has exactly one worker, "
            "choose another kind"
        )
    clashes = derived_collisions(dst, facts, worker, kind)
    if clashes:
        raise UserMessageError("; ".join(clashes))
    limits = naming.limit_problems(
        worker_name=worker,
        work_kind=kind,
        lane=lane,
        line_length=patcher.line_length(dst),
        host_root=facts.root,
        outbox_kind_size=hostfacts.outbox_kind_size(dst),
    )
    if limits:
        raise UserMessageError("; ".join(limits))
    spec = patcher.Spec(
        worker_name=worker,
        work_kind=kind,
        lane=lane,
        host_root=facts.root,
        namespace_absent=facts.namespace_absent,
        container=bool(context.get("container")),
    )
    missing = patcher.check_host(dst, spec)
    if missing:
        raise UserMessageError(
            "the host lacks what the worker's fragments need: " + "; ".join(missing)
        )
    copy_answers = {
        "worker_name": worker,
        "work_kind": kind,
        "lane": lane,
        "maintenance": context.get("maintenance"),
        "container": bool(context.get("container")),
        "host_root": facts.root,
        "namespace_absent": facts.namespace_absent,
        "migration_stamp": str((_conf(context, "data") or {}).get("migration_stamp") or "0" * 14),
    }
    paths = patcher.touched_paths(dst, copy_answers)
    for problem in (symlink_problems(dst, paths), worktree_problems(dst, paths)):
        if problem:
            raise UserMessageError(problem)
    return str(facts.root)


def kind_preflight(
    context: dict[str, Any], dst: Path, facts: Any, worker: str, kind: str, lane: str
) -> str:
    """The checks of a kind added to the existing worker `worker` (copier.yml `added_kind`,
    `make add-kind`); returns the host's package root, or raises `UserMessageError` in one
    line: no such worker, a worker that predates added kinds, the kind taken (by any worker,
    this one included), a lane other than the worker's, a name the kind derives that the
    host has, a host file a fragment needs, uncommitted files the copy writes."""
    answers = dst / "workers" / worker / hostfacts.ANSWERS_NAME
    recorded = _recorded_answers(answers)
    if recorded is None:
        known = ", ".join(sorted(facts.workers)) or "none"
        raise UserMessageError(
            f"added_kind: no worker {worker!r} to add {kind} to (workers: {known}); "
            f"add a worker with copier copy ... -d worker_name={worker} -d work_kind={kind}"
        )
    holder = facts.kinds.get(kind)
    if holder is not None:
        raise UserMessageError(
            f"work_kind {kind!r} is already handled ({holder}); a kind has one worker: remove "
            "it there first (make remove-kind, or make remove-worker for a worker's own kind)"
        )
    module = naming.derive_names(worker_name=worker, work_kind=kind)["worker_module"]
    package = dst / "workers" / worker / "src" / facts.root / "workers" / module / "kinds"
    if not (package / "__init__.py").is_file():
        raise UserMessageError(
            f"worker {worker} predates kinds added to a worker: make update-worker "
            f"NAME={worker}, commit, then add the kind"
        )
    own_lane = str(recorded.get("lane") or "default")
    if lane != own_lane:
        raise UserMessageError(
            f"lane {lane!r}: a kind added to {worker} is claimed on its lane, {own_lane!r}; "
            f"drop -d lane or give -d lane={own_lane}"
        )
    own = settings_clashes(worker, facts.workers)  # the worker's own names: it exists
    clashes = [c for c in derived_collisions(dst, facts, worker, kind) if c not in own]
    if clashes:
        raise UserMessageError("; ".join(clashes))
    spec = patcher.Spec(
        worker_name=worker, work_kind=kind, lane=lane, host_root=facts.root,
        namespace_absent=False, added_kind=True,
    )  # fmt: skip
    missing = patcher.check_host(dst, spec)
    if missing:
        raise UserMessageError(
            "the host lacks what the kind's fragments need: " + "; ".join(missing)
        )
    copy_answers = {
        "worker_name": worker,
        "work_kind": kind,
        "lane": lane,
        "host_root": facts.root,
        "added_kind": True,
    }
    paths = patcher.touched_paths(dst, copy_answers)
    for problem in (symlink_problems(dst, paths), worktree_problems(dst, paths)):
        if problem:
            raise UserMessageError(problem)
    return str(facts.root)


def symlink_problems(dst: Path, paths: list[str]) -> str:
    """'' when no path the copy writes or patches goes through a symlink that leaves `dst`;
    else one sentence naming the first (copier would stop part way with ForbiddenPathError)."""
    top = dst.resolve()
    seen: set[Path] = set()
    for rel in paths:
        current = dst
        for part in Path(rel).parts:
            current = current / part
            if current in seen:
                continue
            seen.add(current)
            if not current.is_symlink():
                if not current.exists():
                    break
                continue
            target = current.resolve()
            if target != top and top not in target.parents:
                return (
                    f"{current.relative_to(dst)} is a symlink to {target}, outside the host: "
                    f"the copy writes {rel} through it and copier refuses that part way; "
                    "replace the symlink with the folder or file itself, commit, then copy again"
                )
    return ""


def worktree_problems(dst: Path, paths: list[str]) -> str:
    """'' when `dst` is a git work tree in which every path the copy writes or patches is
    committed (a failed copy can then be put back, and the result reviewed as one diff);
    else one sentence naming the fix. Other uncommitted files neither block nor get touched."""
    import subprocess

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=dst, capture_output=True, text=True, check=False)

    inside = git("rev-parse", "--is-inside-work-tree")
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        return (
            f"{dst} is not a git work tree: a copy must be reviewable and undoable; run "
            "`git init && git add -A && git commit -m 'Before the worker template'` first"
        )
    status = git("status", "--porcelain", "--untracked-files=all", "--no-renames", "--", *paths)
    dirty = [line[3:] for line in status.stdout.splitlines() if line.strip()]
    if not dirty:
        return ""
    listed = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
    return (
        f"the copy would write or patch files with uncommitted changes ({listed}); "
        "commit or stash them first (`git stash -u`), then copy again"
    )


def derived_collisions(dst: Path, facts: Any, worker: str, kind: str) -> list[str]:
    """The names derived from `worker`/`kind` that another kind or worker of the host
    already derives: the kind's class (`SEND_V2` and `SEND_V_2` both give `SendV2`), its
    payload module, an existing payload file, and the worker's settings variables."""
    problems: list[str] = []
    names = naming.derive_names(worker_name=worker, work_kind=kind)
    for other, holder in sorted(facts.kinds.items()):
        if other == kind:
            continue
        theirs = naming.derive_names(worker_name="x", work_kind=other)
        for key, what in (("kind_class", "the class"), ("kind_snake", "the payload module")):
            if theirs[key] == names[key]:
                problems.append(
                    f"work_kind {kind!r} derives {what} {names[key]!r}, as {other!r} ({holder}) "
                    "does; choose another kind"
                )
                break
    payload = Path("om/src") / facts.root / "om/work/types/payloads" / f"{names['kind_snake']}.py"
    if not problems and (dst / payload).exists():
        problems.append(
            f"work_kind {kind!r}: {payload} already exists and would be kept as it is "
            "(a file the user owns); choose another kind or remove that file"
        )
    return problems + settings_clashes(worker, facts.workers)


def settings_clashes(worker: str, others: Iterable[str]) -> list[str]:
    """One sentence per worker of `others` that reads a settings variable `worker` would
    read too (`SHIP_COMPLETED_RETENTION` is `ship`'s and `ship-completed`'s)."""
    problems: list[str] = []
    mine = naming.setting_variables(worker, patcher.WORKER_SETTINGS)
    for other in sorted(others):
        shared = mine & naming.setting_variables(other, patcher.WORKER_SETTINGS)
        if shared:
            problems.append(
                f"worker_name {worker!r} reads the settings variable {min(shared)} that "
                f"the worker {other!r} reads too; choose another worker_name"
            )
    return problems


def rename_collisions(dst: Path, facts: Any, old: str, new: str) -> list[str]:
    """What a rename of `old` to `new` would clash with, as a copy of `new` checks it: the
    image, distribution and settings prefix the host has (`hostfacts.name_collisions`), and
    the settings variables another worker (not `old`) reads."""
    problems = [
        f"worker_name {new!r} collides with what the host has: {problem}; choose another name"
        for problem in hostfacts.name_collisions(dst, facts.root, new)
    ]
    return problems + settings_clashes(new, (w for w in facts.workers if w != old))


STAMP = re.compile(r"\d{14}")


def fixed_answer_problems(given: dict[str, Any], facts: Any) -> list[str]:
    """What is wrong with `ask: false` answers given with `-d` (`given` is copier's data).

    They are discovered from the host or computed, not answered (docs/answers.md): a
    discovered one must equal what the host says, `migration_stamp` must be a UTC stamp,
    and `metrics_port` a port no recorded worker holds. [] when nothing is wrong.
    """
    problems: list[str] = []
    for answer, discovered in (
        ("namespace_absent", facts.namespace_absent),
        ("queue_down_revision", facts.queue_head),
    ):
        if answer in given and str(given[answer]).lower() != str(discovered).lower():
            problems.append(
                f"{answer} is discovered from the host ({discovered!r}), not answered: "
                f"drop -d {answer}={given[answer]}"
            )
    stamp = given.get("migration_stamp")
    if stamp is not None and not STAMP.fullmatch(str(stamp)):
        problems.append(f"migration_stamp {stamp!r} must be a UTC stamp YYYYMMDDHHMMSS")
    port = given.get("metrics_port")
    if port is not None:
        try:
            number = int(str(port))
        except ValueError:
            number = 0
        if not 1024 <= number <= 65535:
            problems.append(f"metrics_port {port!r} must be a port from 1024 to 65535")
        elif number in facts.taken_metrics_ports:
            problems.append(
                f"metrics_port {number} is held by another worker; leave it out "
                f"(the next free one is {facts.next_metrics_port})"
            )
    return problems


def _inside_worker_folder(dst: Path) -> Path | None:
    """The host root when `dst` is a rendered worker's folder (`<host>/workers/<name>` with
    its answers file), else None.

    Left to itself, `copier update` run there would render into the worker folder, change
    nothing and exit 0 (copier writes only inside its destination); `worker_folder` hands
    over or refuses instead.
    """
    if not (dst / hostfacts.ANSWERS_NAME).is_file() or dst.parent.name != "workers":
        return None
    host = dst.parent.parent
    return host if hostfacts.discover_host(host).is_host else None


def worker_folder(context: dict[str, Any], dst: Path, host: Path) -> None:
    """Copier runs with a worker's folder as its destination: never returns.

    On `copier update` (run in `workers/<x>`, or `copier update workers/<x>` from the host
    root) it runs the root update of that worker with the same options and ends the process
    with its exit code (launch.py `hand_over_update`, `SystemExit`). On `copier copy` it
    raises `UserMessageError`: the worker exists, and the line names the update command.
    With a copier that does not tell the operation, the same one line names the update.
    """
    answers = f"workers/{dst.name}/{hostfacts.ANSWERS_NAME}"
    operation = copier_operation()
    if operation == "update":
        command = launch.update_command(
            answers_file=answers,
            given=dict(_conf(context, "data") or {}),
            ref=None if _conf(context, "vcs_ref") is None else str(_conf(context, "vcs_ref")),
            defaults=bool(_conf(context, "defaults")),
            skip_answered=bool(_conf(context, "skip_answered")),
            conflict=_conf(context, "conflict"),
            context_lines=_conf(context, "context_lines"),
            pretend=bool(_conf(context, "pretend")),
            skip_tasks=bool(_conf(context, "skip_tasks")),
            prereleases=bool(_conf(context, "use_prereleases")),
            exclude=_conf(context, "exclude"),
            skip_if_exists=_conf(context, "skip_if_exists"),
        )
        launch.hand_over_update(host, dst.name, command)
    update = f"cd {host} && copier update --trust --defaults -a {answers}"
    if operation == "copy":
        raise UserMessageError(
            f"worker {dst.name!r} already exists ({answers}); to bring it to a newer "
            f"template version run: {update}"
        )
    raise UserMessageError(
        f"{dst} is a worker folder: copier must run from the host root, with the "
        f"worker's answers file. Run instead: {update}"
    )


@lru_cache(maxsize=4)
def computed_questions(config: Path) -> frozenset[str]:
    """The questions of the template config `config` (copier.yml) that are never asked
    (`ask: false`): their values come from their defaults, which the root copy computes."""
    data = _yaml().safe_load(config.read_text(encoding="utf-8")) or {}
    return frozenset(
        key
        for key, spec in data.items()
        if not str(key).startswith("_") and isinstance(spec, dict) and spec.get("ask") is False
    )


def launch_plan(context: dict[str, Any]) -> str:
    """The launch task's argument for the copy form (launch.py `copy_plan`, JSON).

    Holds the template as the user gave it (`_copier_answers._src_path`), the commit this
    copy rendered (`_copier_conf.vcs_ref_hash`; `HEAD` again for a local template copied
    with `-r HEAD`, whose uncommitted changes copier adds), every answer given (`-d`, as typed) or
    asked, the host root, the folder copier runs in, and copier's options that a copy
    passes on. Raises `UserMessageError` outside the copy form.
    """
    dst = destination(context)
    host = launch_host(dst)
    if host is None:
        raise UserMessageError(f"{dst} is not a folder under workers/ of a host root")
    given = dict(_conf(context, "data") or {})
    recorded = dict(context.get("_copier_answers") or {})
    computed = computed_questions(Path(str(_conf(context, "src_path"))) / "copier.yml")
    answers: dict[str, object] = {
        key: value
        for key, value in recorded.items()
        if not key.startswith("_") and key not in computed
    }
    answers.update(given)
    src = str(recorded.get("_src_path") or _conf(context, "src_path"))
    ref = _conf(context, "vcs_ref_hash")
    if str(_conf(context, "vcs_ref")) == "HEAD" and Path(src).expanduser().is_dir():
        # copier adds a local template's uncommitted changes for `-r HEAD` only, as a commit
        # in its own temporary clone: the root copy asks for them the same way
        ref = "HEAD"
    plan: str = launch.copy_plan(
        src=src,
        ref=ref,
        host=host,
        cwd=Path.cwd(),
        answers=answers,
        quiet=bool(_conf(context, "quiet")),
        overwrite=bool(_conf(context, "overwrite")),
        prereleases=bool(_conf(context, "use_prereleases")),
        exclude=_conf(context, "exclude"),
        skip_if_exists=_conf(context, "skip_if_exists"),
    )
    return plan


class ContextUpdater(ContextHook):
    """Adds the derived names, `added_kind_capacity`, `_host`, `_launch` and the helpers
    copier.yml calls (`_preflight`, `_required`, `_launch_plan`) to every render's context."""

    def hook(self, context: dict[str, Any]) -> None:
        record_absolute_source(context)
        context.update(
            naming.derive_names(
                worker_name=str(context.get("worker_name") or ""),
                work_kind=str(context.get("work_kind") or ""),
            )
        )
        # An added kind's capacity, as its `.env.example` line and its Terraform files say it.
        context["added_kind_capacity"] = patcher.ADDED_KIND_CAPACITY
        dst = destination(context)
        replay = is_replay_folder(dst)
        # Tasks and the closing message come after the checks: the copy form's root copy has
        # written workers/<x>/.copier-answers.yml by the time copier renders its message.
        before_tasks = str(context.get("_copier_phase", "prompt")) not in ("tasks", "undefined")
        host = _inside_worker_folder(dst) if before_tasks and not replay else None
        if host is not None:
            worker_folder(context, dst, host)
        context["_launch_host"] = str(launch_host(dst) or "")
        context["_launch"] = bool(context["_launch_host"])
        checked = target(context)
        if not replay:
            if context["_launch"] and _conf(context, "skip_tasks"):
                raise UserMessageError(
                    f"copier copy into workers/{dst.name} runs the copy as a task: drop "
                    "--skip-tasks (with it nothing would be copied)"
                )
            problems = _checked_once(context, checked)
            if problems:
                raise UserMessageError("; ".join(problems))
        context["_host"] = hostfacts.discover_host(checked)
        context["_preflight"] = lambda: preflight_once(context)
        context["_required"] = lambda question: required(context, question)
        context["_launch_plan"] = lambda: launch_plan(context)


def inside_host(
    context: dict[str, Any], dst: Path, host: Path, worker: str, kind: str, lane: str
) -> str:
    """The refusal of a destination inside a host that is neither its root nor a
    `workers/<name>` folder of it, with the command to run instead."""
    src = context.get("_src_path") or _conf(context, "src_path") or "<template>"
    return (
        f"{dst} is inside the host {host}, not its root: the template renders into "
        f"the host root. Run instead: cd {host} && copier copy --trust --defaults {src} . "
        f"-d worker_name={worker or '<name>'} -d work_kind={kind or '<KIND>'}"
        + (f" -d lane={lane}" if lane and lane != "default" else "")
    )


def required(context: dict[str, Any], question: str) -> str:
    """The default of a question without one: '' when copier prompts (the prompt then asks),
    a one-line refusal with `--defaults` (copier would raise `Question ... is required`).

    `worker_name` has one in the copy form: the destination's name (`workers/<x>` gives x).
    """
    dst = destination(context)
    if question == "worker_name" and not is_replay_folder(dst) and launch_host(dst):
        return dst.name
    if _conf(context, "defaults"):
        # A wrong folder is the first thing to fix: say so before asking for an answer.
        checked = target(context)
        if not is_replay_folder(checked) and not hostfacts.discover_host(checked).is_host:
            host = hostfacts.enclosing_host(checked)
            if host is not None:
                raise UserMessageError(
                    inside_host(
                        context,
                        checked,
                        host,
                        str(context.get("worker_name") or ""),
                        str(context.get("work_kind") or ""),
                        str(context.get("lane") or ""),
                    )
                )
        example = {"worker_name": "shipment-notifier", "work_kind": "NOTIFY_SHIPMENT"}
        raise UserMessageError(
            f"{question} is required: add -d {question}={example.get(question, '<value>')}"
        )
    return ""


_PREFLIGHT_PASSED: dict[str, str] = {}


def preflight_once(context: dict[str, Any]) -> str:
    """`preflight`, once per copier run for the same destination and answers: copier.yml
    calls it from two defaults and the hook from every render until the answers are in."""
    key = repr(
        (
            str(target(context)),
            sorted(dict(_conf(context, "data") or {}).items()),
            str(context.get("_copier_phase", "prompt")),
            [context.get(name) for name in ("worker_name", "work_kind", "lane", "maintenance")],
            context.get("host_root"),
        )
    )
    if key not in _PREFLIGHT_PASSED:
        _PREFLIGHT_PASSED[key] = preflight(context)
    return _PREFLIGHT_PASSED[key]


FIXED = ("host_root", "namespace_absent", "migration_stamp", "metrics_port", "queue_down_revision")


def _recorded_answers(path: Path) -> dict[str, Any] | None:
    """The answers file of the worker being updated; None on a copy (no such file yet).

    Read once per file version: the hook asks on every render (see `_answers_at`)."""
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return None
    answers = _answers_at(str(path), stamp)
    return None if answers is None else dict(answers)


@lru_cache(maxsize=16)
def _answers_at(path: str, stamp: int) -> dict[str, Any] | None:
    """The parsed answers file at `path` as of modification time `stamp` (ns); None when it
    is unreadable or not a mapping. Callers copy the result (it is shared)."""
    yaml = _yaml()
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


# Set by the host helper's rename (`scripts/workers.py rename old new`) to `old>new` while it
# runs `copier update -d worker_name=new`: the one update that may change the name.
RENAME_ENV = "WORKER_TEMPLATE_RENAME"


_CHECKING: list[bool] = [False]  # True while the hook checks the answers (see below)
_ANSWER_PROBLEMS: dict[str, list[str]] = {}


def _checked_once(context: dict[str, Any], dst: Path) -> list[str]:
    """`given_answer_problems`, once per copier run for the same answers and destination.

    The hook runs on every render (about 1,800 in a copy), and reading
    `_copier_conf.answers_file` renders that name, which runs the hook again: the nested
    run skips the check, and a later render with the same answers reuses its result. A run
    loads this module afresh (copier-template-extensions imports it from the run's clone).
    """
    if _CHECKING[0]:
        return []
    given = dict(_conf(context, "data") or {})
    key = repr(
        (
            str(dst),
            sorted(given.items()),
            copier_operation(),
            os.environ.get(RENAME_ENV),
            [context.get(name) for name in ("worker_name", "work_kind", "lane", "maintenance")],
        )
    )
    if key in _ANSWER_PROBLEMS:
        return _ANSWER_PROBLEMS[key]
    _CHECKING[0] = True
    try:
        problems = given_answer_problems(context, dst)
    finally:
        _CHECKING[0] = False
    _ANSWER_PROBLEMS[key] = problems
    return problems


def given_answer_problems(context: dict[str, Any], dst: Path) -> list[str]:
    """The rules the answers given with `-d`/`--data-file` break, on every operation.

    The preflight checks a copy's answers; `copier update -d lane=...` never reaches it
    (its `host_root` is recorded), so the hook checks every given answer on each render of
    the real destination: the format, the keywords and, in a host, the length limits.
    """
    given = dict(_conf(context, "data") or {})
    placeholders = {"worker_name": "worker", "work_kind": "WORK", "lane": "default"}
    values = {key: str(given.get(key, default)) for key, default in placeholders.items()}
    problems: list[str] = [
        problem
        for problem in naming.answer_problems(**values)
        if any(problem.startswith(f"{key} ") for key in given)
    ]
    problems += naming.boolean_problems(given, ("maintenance", "container"))
    stamp = given.get("migration_stamp")
    if stamp is not None and not STAMP.fullmatch(str(stamp)):
        problems.append(f"migration_stamp {stamp!r} must be a UTC stamp YYYYMMDDHHMMSS")
    facts = hostfacts.discover_host(dst)
    if not facts.is_host:
        return problems  # the helper's scratch renders (restore) give every recorded answer
    recorded = _recorded_answers(dst / str(_conf(context, "answers_file") or ""))
    for key in FIXED:
        if key in given and recorded is not None and str(given[key]) != str(recorded.get(key)):
            problems.append(
                f"{key} is fixed at the first copy ({recorded.get(key)!r} in "
                f"{_conf(context, 'answers_file')}), not answered: drop -d {key}={given[key]}"
            )
    old_kind = recorded.get("work_kind") if recorded is not None else None
    changed_kind = "work_kind" in given and str(given["work_kind"]) != str(old_kind)
    if recorded is not None and changed_kind and copier_operation() != "copy":
        problems.append(
            f"work_kind cannot change at update: items queued as {old_kind} would be claimed "
            f"by no worker; add a worker for {given['work_kind']} with copier copy, drain or "
            f"discard the {old_kind} items, then make remove-worker NAME={recorded['worker_name']}"
        )
    old_name = recorded.get("worker_name") if recorded is not None else None
    renamed = "worker_name" in given and str(given["worker_name"]) != str(old_name)
    renaming = os.environ.get(RENAME_ENV) == f"{old_name}>{given.get('worker_name')}"
    if recorded is not None and renamed and copier_operation() != "copy" and not renaming:
        problems.append(
            f"worker_name cannot change at update: rename with make rename-worker "
            f"NAME={old_name} TO={given['worker_name']} (it moves the worker's files, answers "
            "and your edits in shared files)"
        )
    if recorded is not None and renamed and renaming:
        problems += rename_collisions(dst, facts, str(old_name), str(given["worker_name"]))
    # copier asks in turn; lane has a default, so the check need not wait for it
    answered = context.get("worker_name") and context.get("work_kind")
    if recorded is None and "host_root" in given and "namespace_absent" in given and answered:
        lane = context.get("lane") or given.get("lane") or "default"
        preflight_once({**context, "lane": lane})  # both defaults that run it are given
    if problems or not any(key in given for key in placeholders):
        return problems
    current = {key: str(given.get(key) or context.get(key) or "") for key in placeholders}
    limits = naming.limit_problems(
        worker_name=current["worker_name"],
        work_kind=current["work_kind"],
        lane=current["lane"] or "default",
        line_length=patcher.line_length(dst),
        host_root=facts.root,
        outbox_kind_size=hostfacts.outbox_kind_size(dst),
    )
    return [p for p in limits if any(p.startswith(f"{key} ") for key in given)]
