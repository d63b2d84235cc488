"""Release guard: no rendered path of the last release disappears without a migration.

Copier deletes every file the new template version no longer renders, the user's edits
included, exits 0 and says nothing (docs/updating.md, "Copier's limits"). A release that moves or drops a
rendered path therefore needs a `_migrations` entry in copier.yml that carries the user's
copy across: `lifecycle.py move` (3-way merge into the new path, after stage) or
`lifecycle.py retire` (stops the update when the user edited the file, before stage).

The manifest (`release/manifest.json`) records, for the last release, the paths the
template renders for a few fixed sample answers (`SCENARIOS`):

    {"release": {"version": "v0.1.0", "commit": "<40 hex>"},
     "questions": {"<question>": "<type>", ...},            # the release's questions
     "scenarios": [{"name": "owner", "answers": {...}, "paths": ["workers/...", ...]}, ...]}

`check` renders the working tree with each scenario's answers and reports every manifest
path the tree no longer renders unless a `_migrations` entry that copier runs for a worker
at that release (its `version` above the release's, or none) covers it: a `move` whose
`--from` fills to that path (and whose `--to` the tree renders), in the after stage, or a
`retire` whose `--path` does, in the before stage.

    python scripts/release_guard.py build --commit <rev> --version vX.Y.Z   (make release-manifest)
    python scripts/release_guard.py check [--template DIR]                  (make release-check)

`check` exits 0 clean, 1 with one line per gap; `build` exits 1 when the commit's
CHANGELOG has no `## [X.Y.Z]` section or the scenarios leave a pair of boolean answers
untried. Tests: tests/test_release_guard.py (part of `make test`).
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import itertools
import json
import re
import runpy
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "release" / "manifest.json"
ABOUT = (
    "Paths the last release renders for fixed sample answers; scripts/release_guard.py "
    "checks the template against them. Regenerate when a release is cut: make "
    "release-manifest VERSION=vX.Y.Z COMMIT=<release commit> (docs/updating.md, Releases)."
)
STAMP = "20260101000000"

# Sample answers: each answer that shapes a path takes a distinct, recognisable value
# (`worker_name` and `worker_module` differ by `-`/`_`, so a pattern that swaps them shows),
# and the booleans that gate paths (the namespace subtree, the handler variants, the
# container files) take every pair of values across the four scenarios (pairwise cover,
# `pairwise_gaps`). Every answer is given, `ask: false` ones too, so no default ever runs
# the host checks: the renders need no host.
SCENARIOS: list[dict[str, Any]] = [
    {
        "name": "owner",
        "answers": {
            "worker_name": "shipment-notifier",
            "work_kind": "NOTIFY_SHIPMENT",
            "lane": "default",
            "maintenance": False,
            "container": False,
            "host_root": "acme",
            "namespace_absent": True,
            "migration_stamp": STAMP,
            "metrics_port": 9101,
            "queue_down_revision": "",
        },
    },
    {
        "name": "owner-maintenance-container",
        "answers": {
            "worker_name": "queue-sweeper",
            "work_kind": "NOOP",
            "lane": "default",
            "maintenance": True,
            "container": True,
            "host_root": "acme",
            "namespace_absent": True,
            "migration_stamp": STAMP,
            "metrics_port": 9101,
            "queue_down_revision": "",
        },
    },
    {
        "name": "second-container",
        "answers": {
            "worker_name": "invoice-mailer",
            "work_kind": "SEND_INVOICE",
            "lane": "bulk",
            "maintenance": False,
            "container": True,
            "host_root": "acme",
            "namespace_absent": False,
            "migration_stamp": STAMP,
            "metrics_port": 9102,
            "queue_down_revision": "",
        },
    },
    {
        "name": "second-maintenance",
        "answers": {
            "worker_name": "ledger-sweeper",
            "work_kind": "SWEEP_LEDGER",
            "lane": "default",
            "maintenance": True,
            "container": False,
            "host_root": "acme",
            "namespace_absent": False,
            "migration_stamp": STAMP,
            "metrics_port": 9103,
            "queue_down_revision": "",
        },
    },
]
# The placeholders a `_migrations` path may use that a suggestion names (longest value first).
SUGGESTED = ("worker_name", "worker_module", "kind_snake", "host_root", "migration_stamp")


class GuardError(Exception):
    """The guard cannot run (bad manifest, commit not found, CHANGELOG without the version)."""


def _load(name: str) -> ModuleType:
    """`extensions/<name>.py` of this checkout, under a name unique to it (the extensions'
    own loader, extensions/siblings.py)."""
    siblings = runpy.run_path(str(REPO / "extensions" / "siblings.py"))
    module: ModuleType = siblings["load"](str(REPO / "extensions" / "siblings.py"), name)
    return module


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=False)


def _yaml_load(text: str) -> Any:
    yaml: Any = importlib.import_module("yaml")
    return yaml.safe_load(text)


# --- rendering --------------------------------------------------------------------------------


def export_commit(repo: Path, commit: str, dst: Path) -> str:
    """The template at `commit` (a plain folder, no git) into `dst`; returns the full hash.

    Raises `GuardError` when the clone lacks the commit (a shallow checkout).
    """
    full = _git(repo, "rev-parse", "--verify", f"{commit}^{{commit}}")
    if full.returncode != 0:
        raise GuardError(f"commit {commit} is not in {repo} (a shallow clone? fetch it first)")
    sha = full.stdout.decode().strip()
    archive = _git(repo, "archive", "--format=tar", sha)
    if archive.returncode != 0:
        raise GuardError(f"git archive {sha}: {archive.stderr.decode().strip()}")
    dst.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dst, filter="data")
    return sha


def export_working_tree(template: Path, dst: Path) -> None:
    """The template's working tree (tracked and untracked files, not ignored ones) into `dst`.

    A folder that is not a git work tree is copied whole (minus virtualenvs and caches).
    """
    listed = _git(template, "ls-files", "--cached", "--others", "--exclude-standard", "-z")
    if listed.returncode != 0:
        shutil.copytree(
            template,
            dst,
            ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", ".*_cache", ".cache"),
        )
        return
    for rel in listed.stdout.decode().split("\0"):
        source = template / rel
        if not rel or not source.is_file() or "__pycache__" in rel:
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def render_paths(template: Path, answers: Mapping[str, Any]) -> list[str]:
    """The files copier renders from the plain folder `template` for `answers`, sorted.

    Paths are relative to the destination, `/`-separated. Renders into an empty scratch
    folder: the patcher leaves a folder that is not a host alone (copier.yml `_tasks`).
    """
    import copier

    with tempfile.TemporaryDirectory(prefix="worker-template.guard.") as tmp:
        copier.run_copy(
            str(template), tmp, data=dict(answers), defaults=True, unsafe=True, quiet=True
        )
        root = Path(tmp)
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def questions(template: Path) -> dict[str, str]:
    """The template's questions and their types (`copier.yml`, keys without `_`)."""
    config = _yaml_load((template / "copier.yml").read_text(encoding="utf-8")) or {}
    return {
        key: str(spec.get("type", "str")) if isinstance(spec, dict) else "str"
        for key, spec in config.items()
        if not key.startswith("_")
    }


def pairwise_gaps(asked: Mapping[str, str], scenarios: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every pair of boolean questions whose four value pairs the scenarios do not all try.

    Returns lines like `maintenance=True with container=False`; [] when covered. A lone
    boolean question must take both values.
    """
    bools = sorted(name for name, kind in asked.items() if kind == "bool")
    tried = [dict(s["answers"]) for s in scenarios]
    gaps = [
        f"{name}={value}"
        for name in bools
        for value in (True, False)
        if not any(t.get(name) is value for t in tried)
    ]
    for a, b in itertools.combinations(bools, 2):
        for va, vb in itertools.product((True, False), repeat=2):
            if not any(t.get(a) is va and t.get(b) is vb for t in tried):
                gaps.append(f"{a}={va} with {b}={vb}")
    return gaps


def changelog_has(template: Path, version: str) -> bool:
    """Whether the template's CHANGELOG.md has a `## [X.Y.Z]` section for `version`."""
    changelog = template / "CHANGELOG.md"
    number = version.removeprefix("v")
    return changelog.is_file() and bool(
        re.search(rf"(?m)^## \[{re.escape(number)}\]", changelog.read_text(encoding="utf-8"))
    )


def build(repo: Path, commit: str, version: str) -> dict[str, Any]:
    """The manifest of the release `version` at `commit` of `repo` (see the module docstring).

    Raises `GuardError` when the commit is missing, its CHANGELOG has no section for the
    version, or the scenarios leave a pair of the release's boolean answers untried.
    """
    with tempfile.TemporaryDirectory(prefix="worker-template.release.") as tmp:
        tree = Path(tmp) / "template"
        sha = export_commit(repo, commit, tree)
        if not changelog_has(tree, version):
            raise GuardError(f"CHANGELOG.md at {sha[:7]} has no `## [{version.removeprefix('v')}]`")
        asked = questions(tree)
        gaps = pairwise_gaps(asked, SCENARIOS)
        if gaps:
            raise GuardError(f"add scenarios to SCENARIOS that try {'; '.join(gaps)}")
        scenarios = [
            {
                "name": s["name"],
                "answers": s["answers"],
                "paths": render_paths(tree, s["answers"]),
            }
            for s in SCENARIOS
        ]
    return {
        "about": ABOUT,
        "release": {"version": version, "commit": sha},
        "questions": asked,
        "scenarios": scenarios,
    }


def dump(manifest: Mapping[str, Any]) -> str:
    """The manifest as committed: JSON, two-space indent, one path a line."""
    return json.dumps(manifest, indent=2) + "\n"


def load_manifest(path: Path = MANIFEST) -> dict[str, Any]:
    """Read and sanity-check a manifest; `GuardError` names what is wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GuardError(f"{path}: {exc}") from exc
    release = data.get("release") if isinstance(data, dict) else None
    if not isinstance(release, dict) or not re.fullmatch(
        r"[0-9a-f]{40}", str(release.get("commit", ""))
    ):
        raise GuardError(f"{path}: no release commit (regenerate: make release-manifest)")
    if not data.get("scenarios"):
        raise GuardError(f"{path}: no scenarios (regenerate: make release-manifest)")
    return dict(data)


# --- migrations ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One `lifecycle.py move|retire` entry of `_migrations`.

    `kind` is `move` or `retire`; `sources` the path patterns it carries (`--from`, or each
    `--path`); `target` the `--to` pattern of a move; `version` the entry's (None: every
    update); `stages` the stages its `when` selects; `index` its position in `_migrations`.
    """

    index: int
    kind: str
    sources: tuple[str, ...]
    target: str | None
    version: str | None
    stages: frozenset[str]


def _truthy(rendered: str) -> bool:
    return rendered.strip().lower() in {"true", "1", "yes", "y", "on"}


def _stages(when: str | None) -> frozenset[str]:
    """The stages (`before`, `after`) a migration's `when` selects (default: after)."""
    import jinja2

    if when is None:
        return frozenset({"after"})
    template = jinja2.Environment().from_string(str(when))
    return frozenset(
        stage
        for stage in ("before", "after")
        if _truthy(template.render(_stage=stage, _copier_operation="update"))
    )


def steps(config_text: str) -> list[Step]:
    """The `lifecycle.py move|retire` entries of a copier.yml's `_migrations`.

    Entries running anything else (`lifecycle.py carry` too) are left out; one whose arguments `lifecycle.py` would
    refuse raises `GuardError` naming its position.
    """
    import shlex

    parser = _load("lifecycle").build_parser()
    config = _yaml_load(config_text) or {}
    found: list[Step] = []
    for index, entry in enumerate(config.get("_migrations") or []):
        spec = entry if isinstance(entry, dict) else {"command": entry}
        command = spec.get("command", [])
        parts = shlex.split(command) if isinstance(command, str) else [str(p) for p in command]
        at = next((i for i, p in enumerate(parts) if p.endswith("lifecycle.py")), None)
        if at is None:
            continue
        try:
            args = parser.parse_args(parts[at + 1 :])
        except SystemExit as exc:
            raise GuardError(
                f"_migrations[{index}]: lifecycle.py refuses {' '.join(parts[at + 1 :])}"
            ) from exc
        if args.command not in ("move", "retire"):
            continue  # `carry` keeps its paths: nothing leaves the render
        version = spec.get("version")
        found.append(
            Step(
                index=index,
                kind=args.command,
                sources=(args.old,) if args.command == "move" else tuple(args.paths),
                target=args.new if args.command == "move" else None,
                version=None if version is None else str(version),
                stages=_stages(spec.get("when")),
            )
        )
    return found


def runs_after(step: Step, release: str) -> bool:
    """Whether copier runs `step` for a worker at `release` (PEP 440, as copier compares)."""
    from packaging.version import parse

    return step.version is None or parse(step.version) > parse(release)


def pattern_of(path: str, fill: Mapping[str, str]) -> str:
    """A rendered path back to a `_migrations` pattern (`workers/{worker_name}/...`)."""
    for name in sorted(SUGGESTED, key=lambda n: -len(fill.get(n, ""))):
        value = fill.get(name, "")
        if value:
            path = path.replace(value, "{" + name + "}")
    return path


# --- the check ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rendered:
    """One scenario of the manifest next to what the checked tree renders for it."""

    name: str
    answers: dict[str, Any]
    released: frozenset[str]
    now: frozenset[str]

    @property
    def gone(self) -> list[str]:
        return sorted(self.released - self.now)


def render_tree(manifest: Mapping[str, Any], template: Path) -> list[Rendered]:
    """Render the working tree of `template` for every scenario of `manifest`.

    Raises `GuardError` naming the scenario when copier cannot render it (a new question
    without a default, say: an update with `--defaults` would fail the same way).
    """
    rendered: list[Rendered] = []
    with tempfile.TemporaryDirectory(prefix="worker-template.tree.") as tmp:
        tree = Path(tmp) / "template"
        export_working_tree(template, tree)
        for s in manifest["scenarios"]:
            try:
                now = render_paths(tree, s["answers"])
            except Exception as exc:  # copier's errors share no base class worth naming
                raise GuardError(
                    f"scenario {s['name']}: copier cannot render the template with the "
                    f"manifest's answers: {type(exc).__name__}: {exc}"
                ) from exc
            rendered.append(
                Rendered(
                    name=str(s["name"]),
                    answers=dict(s["answers"]),
                    released=frozenset(s["paths"]),
                    now=frozenset(now),
                )
            )
    return rendered


def gaps(manifest: Mapping[str, Any], rendered: list[Rendered], found: list[Step]) -> list[str]:
    """One line per released path the tree drops without a step that carries it across.

    Each line names the path as a pattern, the scenarios it is gone in, and what to add;
    a step that would match but never runs for the release (its version, its stage) or
    moves to a path the tree does not render is named in the line.
    """
    release = str(manifest["release"]["version"])
    commit = str(manifest["release"]["commit"])[:7]
    names = _load("lifecycle").names
    problems: dict[str, list[str]] = {}
    hints: dict[str, set[str]] = {}
    for scenario in rendered:
        fill = names(scenario.answers)
        for path in scenario.gone:
            covered = False
            why: set[str] = set()
            for step in found:
                try:
                    if path not in {s.format(**fill) for s in step.sources}:
                        continue
                    target = step.target.format(**fill) if step.target else None
                except (KeyError, IndexError):
                    why.add(f"_migrations[{step.index}] names an unknown placeholder")
                    continue
                stage = "after" if step.kind == "move" else "before"
                if not runs_after(step, release):
                    why.add(
                        f"_migrations[{step.index}] has version {step.version}, which does not "
                        f"run for workers at {release}"
                    )
                elif stage not in step.stages:
                    why.add(
                        f"_migrations[{step.index}] ({step.kind}) must run in the {stage} "
                        f"stage (`when`)"
                    )
                elif target is not None and target not in scenario.now:
                    why.add(
                        f"_migrations[{step.index}] moves it to {step.target}, which the "
                        "template does not render"
                    )
                else:
                    covered = True
            if covered:
                continue
            key = pattern_of(path, fill)
            problems.setdefault(key, []).append(scenario.name)
            hints.setdefault(key, set()).update(why)
    lines = []
    for key, where in problems.items():
        hint = "; ".join(sorted(hints[key]))
        lines.append(
            f"{key}: rendered by release {release} ({commit}) for {', '.join(where)}, gone "
            "from the template, and no `_migrations` entry carries it: add `lifecycle.py move "
            f"--from {key} --to <new path>` or a before-stage `lifecycle.py retire --path "
            f"{key}` (docs/updating.md, Releases)" + (f" [{hint}]" if hint else "")
        )
    return lines


def check(template: Path = REPO, manifest_path: Path = MANIFEST) -> list[str]:
    """The gaps between the manifest and the working tree of `template` ([] when none)."""
    manifest = load_manifest(manifest_path)
    found = steps((template / "copier.yml").read_text(encoding="utf-8"))
    return gaps(manifest, render_tree(manifest, template), found)


def main(argv: list[str] | None = None) -> int:
    """`build` writes the manifest; `check` prints the gaps (exit 1 when any)."""
    parser = argparse.ArgumentParser(
        prog="scripts/release_guard.py", description=(__doc__ or "").splitlines()[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="write the manifest of a release")
    p.add_argument("--commit", required=True, help="the release commit (tags do not survive)")
    p.add_argument("--version", required=True, help="the release's version, vX.Y.Z")
    p.add_argument("--out", type=Path, default=MANIFEST)
    p = sub.add_parser("check", help="the template's paths against the manifest")
    p.add_argument("--template", type=Path, default=REPO)
    p.add_argument("--manifest", type=Path, default=MANIFEST)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            if not re.fullmatch(r"v\d+\.\d+\.\d+", args.version):
                raise GuardError(f"--version {args.version!r}: give vMAJOR.MINOR.PATCH")
            manifest = build(REPO, args.commit, args.version)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(dump(manifest), encoding="utf-8")
            counts = ", ".join(f"{s['name']} {len(s['paths'])}" for s in manifest["scenarios"])
            print(f"{args.out}: release {args.version} at {manifest['release']['commit'][:7]}")
            print(f"  paths per scenario: {counts}")
            return 0
        problems = check(args.template.resolve(), args.manifest)
    except GuardError as exc:
        print(f"release_guard.py: {exc}", file=sys.stderr)
        return 1
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        return 1
    print("release guard: every path of the last release is still rendered or migrated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
