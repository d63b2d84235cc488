"""The release guard (scripts/release_guard.py): the last release's rendered paths stay
rendered, or a `_migrations` entry carries each one across (issue 11, item 4).

`release/manifest.json` lists what release v0.1.0 (commit e75b510) renders for four sample
answer sets. The guard renders the working tree with the same answers and reports every
released path it no longer renders unless a `lifecycle.py move` (after stage) or
`lifecycle.py retire` (before stage) entry that runs for workers at that release covers it.
A scripted release that moves `container.py` without a migration proves the guard fails.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import REPO, commit_all, git, snapshot_template

MOVED_FROM = "workers/{worker_name}/src/{host_root}/workers/{worker_module}/container.py"
MOVED_TO = "workers/{worker_name}/src/{host_root}/workers/{worker_module}/wiring/container.py"
PKG_TPL = "template/workers/{{ worker_name }}/src/{{ host_root }}/workers/{{ worker_module }}"


def _guard() -> ModuleType:
    key = "_worker_template_tests_release_guard"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, REPO / "scripts" / "release_guard.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


guard = _guard()


def manifest() -> dict[str, object]:
    return guard.load_manifest()  # type: ignore[no-any-return]


def migrations(*entries: str) -> str:
    """A copier.yml holding only `_migrations` (what `guard.steps` reads): `entries`, then
    the working tree's own (those of the runtime move, which the scripted release keeps)."""
    own = guard._yaml_load((REPO / "copier.yml").read_text())["_migrations"]
    return "_migrations:\n" + "".join(entries) + guard_yaml_dump(own)


def guard_yaml_dump(entries: list[object]) -> str:
    """`entries` as the items of a YAML list, indented as `_migrations` items are."""
    import yaml

    text = yaml.safe_dump(entries, sort_keys=False, width=1000)
    return "".join(f"  {line}\n" for line in text.splitlines())


def lifecycle_entry(*args: str, version: str | None = "v0.2.0", when: str | None = None) -> str:
    lines = ["  - command:\n"]
    lines += [
        '      - "{{ _copier_python }}"\n',
        '      - "{{ _copier_conf.src_path }}/extensions/lifecycle.py"\n',
    ]
    lines += [f'      - "{a}"\n' for a in args]
    if version is not None:
        lines.append(f"    version: {version}\n")
    if when is not None:
        lines.append(f'    when: "{when}"\n')
    return "".join(lines)


STATS = MOVED_TO.replace("container.py", "handlers.py")
MOVE = ("move", "--answers-file", "{{ _copier_conf.answers_file }}", "--from", MOVED_FROM)
RETIRE = ("retire", "--answers-file", "{{ _copier_conf.answers_file }}", "--path", MOVED_FROM)
BEFORE = "{{ _stage == 'before' }}"


# --- the manifest --------------------------------------------------------------------------------


def test_manifest_names_the_release_and_tries_every_pair_of_booleans() -> None:
    data = manifest()
    release = data["release"]
    assert isinstance(release, dict) and set(release) == {"version", "commit"}
    assert re.fullmatch(r"v\d+\.\d+\.\d+", release["version"])
    assert re.fullmatch(r"[0-9a-f]{40}", release["commit"])
    scenarios = data["scenarios"]
    assert isinstance(scenarios, list)
    assert [s["name"] for s in scenarios] == [s["name"] for s in guard.SCENARIOS]
    assert [s["answers"] for s in scenarios] == [s["answers"] for s in guard.SCENARIOS]
    assert guard.pairwise_gaps(data["questions"], scenarios) == []
    assert guard.pairwise_gaps({"maintenance": "bool"}, guard.SCENARIOS) == []
    for s in scenarios:
        name, owner = s["answers"]["worker_name"], s["answers"]["namespace_absent"]
        assert f"workers/{name}/.copier-answers.yml" in s["paths"], s["name"]
        assert ("om/src/acme/om/work/manager.py" in s["paths"]) is owner, s["name"]
        assert s["paths"] == sorted(set(s["paths"])), "sorted, no duplicates"


def test_pairwise_gaps_names_the_untried_values() -> None:
    asked = {"a": "bool", "b": "bool", "name": "str"}
    tried = [{"answers": {"a": True, "b": False}}, {"answers": {"a": False, "b": True}}]
    gaps = guard.pairwise_gaps(asked, tried)
    assert gaps == ["a=True with b=True", "a=False with b=False"]
    assert guard.pairwise_gaps({"c": "bool"}, tried) == ["c=True", "c=False"]


def release_commit() -> str:
    """The manifest's release commit; skips the test when this clone lacks it (shallow)."""
    commit = str(manifest()["release"]["commit"])  # type: ignore[index]
    found = subprocess.run(
        ["git", "cat-file", "-t", commit], cwd=REPO, capture_output=True, text=True, check=False
    )
    if found.stdout.strip() != "commit":
        pytest.skip(f"the release commit {commit[:7]} is not in this clone (shallow checkout)")
    return commit


def test_manifest_is_what_make_release_manifest_builds() -> None:
    """The committed file is the generator's output for the release commit, byte for byte
    (so its paths are what that commit renders, and its CHANGELOG has the version)."""
    commit = release_commit()
    version = str(manifest()["release"]["version"])  # type: ignore[index]
    built = guard.build(REPO, commit[:7], version)
    assert built["release"]["commit"] == commit
    assert guard.dump(built) == (REPO / "release" / "manifest.json").read_text()


def test_build_refuses_a_version_the_changelog_does_not_describe() -> None:
    with pytest.raises(guard.GuardError, match=r"no `## \[99\.0\.0\]`"):
        guard.build(REPO, release_commit(), "v99.0.0")
    with pytest.raises(guard.GuardError, match="is not in"):
        guard.build(REPO, "0" * 40, "v0.1.0")


# --- the guard on the template -------------------------------------------------------------------


def test_the_template_renders_every_path_of_the_last_release() -> None:
    """The guard itself: the working tree against release/manifest.json."""
    assert guard.check(REPO) == []


@pytest.fixture(scope="module")
def moved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[object]]:
    """A scripted release: the working tree, then `container.py` moved to `wiring/`
    with no `_migrations` entry; the template repo and its renders per scenario."""
    repo = snapshot_template(tmp_path_factory.mktemp("guard") / "worker-template")
    (repo / PKG_TPL / "wiring").mkdir()
    git(repo, "mv", f"{PKG_TPL}/container.py.jinja", f"{PKG_TPL}/wiring/container.py.jinja")
    commit_all(repo, "release v0.3.0: the container moved, no migration")
    return repo, guard.render_tree(manifest(), repo)


def test_a_release_that_moves_a_file_without_a_migration_fails_the_guard(
    moved: tuple[Path, list[object]],
) -> None:
    repo, rendered = moved
    lines = guard.gaps(manifest(), rendered, guard.steps((repo / "copier.yml").read_text()))
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith(f"{MOVED_FROM}: rendered by release v0.1.0 (e75b510) for ")
    for s in guard.SCENARIOS:
        assert s["name"] in line
    assert f"lifecycle.py move --from {MOVED_FROM} --to <new path>" in line


def test_a_move_or_retire_entry_that_runs_for_the_release_satisfies_the_guard(
    moved: tuple[Path, list[object]],
) -> None:
    _, rendered = moved
    for config in (
        migrations(lifecycle_entry(*MOVE, "--to", MOVED_TO)),
        migrations(lifecycle_entry(*MOVE, "--to", MOVED_TO, version=None)),
        migrations(lifecycle_entry(*RETIRE, "--path", "x.py", when=BEFORE)),
        migrations(lifecycle_entry(*RETIRE, version="v0.1.1", when="true")),
    ):
        assert guard.gaps(manifest(), rendered, guard.steps(config)) == [], config


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        (
            lifecycle_entry(*MOVE, "--to", MOVED_TO, version="v0.1.0"),
            "_migrations[0] has version v0.1.0, which does not run for workers at v0.1.0",
        ),
        (
            lifecycle_entry(*MOVE, "--to", MOVED_TO, when=BEFORE),
            "_migrations[0] (move) must run in the after stage",
        ),
        (
            lifecycle_entry(*MOVE, "--to", STATS),
            f"_migrations[0] moves it to {STATS}, which the template does not render",
        ),
        (lifecycle_entry(*RETIRE), "_migrations[0] (retire) must run in the before stage"),
        (
            lifecycle_entry(
                "move", "--answers-file", "a.yml", "--from", "{workers}/container.py", "--to", "x"
            ),
            "_migrations[0] names an unknown placeholder",
        ),
        (
            lifecycle_entry(
                "move",
                "--answers-file",
                "a.yml",
                "--from",
                "workers/{worker_name}/README.md",
                "--to",
                "workers/{worker_name}/docs/README.md",
            ),
            "",
        ),
    ],
    ids=[
        "version-too-old",
        "move-before",
        "move-to-nowhere",
        "retire-after",
        "placeholder",
        "unrelated",
    ],
)
def test_an_entry_that_does_not_carry_the_path_leaves_the_gap(
    moved: tuple[Path, list[object]], entry: str, why: str
) -> None:
    _, rendered = moved
    lines = guard.gaps(manifest(), rendered, guard.steps(migrations(entry)))
    assert len(lines) == 1 and lines[0].startswith(MOVED_FROM), lines
    assert why in lines[0]
    if not why:
        assert not lines[0].endswith("]"), "no hint for an entry about another path"


def test_steps_refuses_an_entry_lifecycle_would_refuse() -> None:
    with pytest.raises(guard.GuardError, match=r"_migrations\[0\]: lifecycle.py refuses"):
        guard.steps(migrations(lifecycle_entry("move", "--from", "a")))
    other = "_migrations:\n  - version: v9.0.0\n    command: echo hi\n"
    assert guard.steps(other) == []
    carry = lifecycle_entry("carry", "--answers-file", "a.yml", "--path", "x/settings.py")
    assert guard.steps("_migrations:\n" + carry) == [], "carry keeps its paths"


def test_check_command_prints_one_line_per_gap_and_exits_1(tmp_path: Path) -> None:
    """The command line, on a one-scenario manifest with a path no release renders."""
    data = manifest()
    owner = dict(data["scenarios"][0])  # type: ignore[index]
    owner["paths"] = [*owner["paths"], "workers/shipment-notifier/gone.py"]
    small = tmp_path / "manifest.json"
    small.write_text(json.dumps({**data, "scenarios": [owner]}))
    done = subprocess.run(
        [sys.executable, "scripts/release_guard.py", "check", "--manifest", str(small)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("workers/{worker_name}/gone.py: "), lines
    assert "for owner," in lines[0]


def test_a_scenario_copier_cannot_render_is_named() -> None:
    broken = {"scenarios": [{"name": "no-worker-name", "answers": {"work_kind": "X"}, "paths": []}]}
    with pytest.raises(guard.GuardError, match="scenario no-worker-name: copier cannot render"):
        guard.render_tree(broken, REPO)
