"""`lifecycle.py retire` over real template history (issue 11, item 4).

`retire_history`: the template's working tree tagged `v0.0.1`, then a scripted release
`v0.0.2` that stops rendering the worker's `loop.py` and `tests/test_loop.py` (their code
moving into code all workers share) with a before-stage `_migrations` entry:

    lifecycle.py retire --answers-file ... --path .../loop.py --path .../test_loop.py --note ...

The base host holds worker A (`shipment-notifier`) copied at `v0.0.1` and committed. Each
test updates a copy of it through the host helper (`scripts/workers.py update`), as a user
would: an unedited file goes, an edited one stops the update with one line and nothing
written, and following that line lets the next update through.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import (
    VENV_BIN,
    commit_all,
    copy_host,
    copy_template,
    git,
    load_extension,
    snapshot_template,
    tree_state,
)

lifecycle = load_extension("lifecycle")

A = "shipment-notifier"
A_ANSWERS = {"worker_name": A, "work_kind": "NOTIFY_SHIPMENT"}
PKG = f"workers/{A}/src/acme/workers/shipment_notifier"
LOOP = f"{PKG}/loop.py"
TEST_LOOP = f"workers/{A}/tests/test_loop.py"
ANSWERS = f"workers/{A}/.copier-answers.yml"
PATTERNS = [
    "workers/{worker_name}/src/{host_root}/workers/{worker_module}/loop.py",
    "workers/{worker_name}/tests/test_loop.py",
]
NOTE = "the claim loop is now om/src/{host_root}/om/work/engine/loop.py"
PKG_TPL = "template/workers/{{ worker_name }}/src/{{ host_root }}/workers/{{ worker_module }}"
RETIRE_MIGRATION = f"""_migrations:
  - version: v0.0.2
    when: "{{{{ _stage == 'before' }}}}"
    command:
      - "{{{{ _copier_python }}}}"
      - "{{{{ _copier_conf.src_path }}}}/extensions/lifecycle.py"
      - retire
      - --answers-file
      - "{{{{ _copier_conf.answers_file }}}}"
      - --path
      - "{PATTERNS[0]}"
      - --path
      - "{PATTERNS[1]}"
      - --note
      - "{NOTE}"
"""


@pytest.fixture(scope="session")
def retire_history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working tree tagged `v0.0.1`; `v0.0.2` retires `loop.py` and its test."""
    repo = snapshot_template(tmp_path_factory.mktemp("retire-history") / "worker-template")
    git(
        repo,
        "rm",
        "-q",
        f"{PKG_TPL}/loop.py.jinja",
        "template/workers/{{ worker_name }}/tests/test_loop.py.jinja",
    )
    config = repo / "copier.yml"
    text = config.read_text(encoding="utf-8")
    assert text.count("\n_migrations:\n") == 1
    config.write_text(
        text.replace("\n_migrations:\n", "\n" + RETIRE_MIGRATION, 1), encoding="utf-8"
    )
    commit_all(repo, "release v0.0.2: the loop moves into shared code")
    git(repo, "tag", "v0.0.2")
    return repo


@pytest.fixture(scope="session")
def retire_base(retire_history: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Reference host + worker A copied at v0.0.1, committed."""
    host = copy_host(tmp_path_factory.mktemp("retire-base") / "host")
    copy_template(retire_history, host, "v0.0.1", **A_ANSWERS)
    commit_all(host, f"add {A}")
    return host


@pytest.fixture
def host(retire_base: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "host"
    shutil.copytree(retire_base, dst, symlinks=True)
    return dst


def helper(host: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python3 scripts/workers.py ...` in the host, as the Makefile runs it."""
    env = {**os.environ, "COPIER": str(VENV_BIN / "copier")}
    env.pop("GITHUB_ACTIONS", None)
    return subprocess.run(
        [sys.executable, "scripts/workers.py", *args],
        cwd=host,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def recorded(host: Path) -> dict[str, Any]:
    return dict(yaml.safe_load((host / ANSWERS).read_text()))


def test_unedited_retired_files_go_with_the_update(host: Path) -> None:
    assert (host / LOOP).is_file() and (host / TEST_LOOP).is_file()
    done = helper(host, "update", A)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (host / LOOP).exists() and not (host / TEST_LOOP).exists()
    assert recorded(host)["_commit"] == "v0.0.2"
    said = f"migrate  retired {LOOP}, {TEST_LOOP}: unedited, the update removes them"
    assert done.stdout.count(said) == 1, done.stdout  # once: not again in copier's replays


def test_an_edited_retired_file_stops_the_update_with_one_line(host: Path) -> None:
    loop = host / LOOP
    edited = loop.read_text() + "# our tweak to the claim loop\n"
    loop.write_text(edited)
    commit_all(host, "our loop tweak")
    head = git(host, "rev-parse", "HEAD")
    done = helper(host, "update", A)
    assert done.returncode == 1, done.stdout + done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith(LOOP)]
    assert len(ours) == 1, done.stderr
    line = ours[0]
    assert line.startswith(
        f"{LOOP}: you changed it since template v0.0.1, and template v0.0.2 removes it"
    )
    assert "(the claim loop is now om/src/acme/om/work/engine/loop.py)" in line
    assert "Nothing was updated." in line and "`git rm` it, commit" in line
    assert TEST_LOOP not in line, "the unedited test is not named"
    assert tree_state(host) == "", "nothing written"
    assert git(host, "rev-parse", "HEAD") == head
    assert recorded(host)["_commit"] == "v0.0.1"
    assert loop.read_text() == edited
    # what the line says to do: carry the change elsewhere, `git rm` the file, commit, update
    git(host, "rm", "-q", LOOP)
    commit_all(host, "the tweak lives in our own module now")
    again = helper(host, "update", A)
    assert again.returncode == 0, again.stdout + again.stderr
    assert recorded(host)["_commit"] == "v0.0.2"
    assert not (host / LOOP).exists() and not (host / TEST_LOOP).exists()
    assert f"migrate  retired {TEST_LOOP}: unedited" in again.stdout


def test_retire_changes_nothing_outside_the_real_host_and_refuses_its_misuse(
    host: Path,
) -> None:
    loop = host / LOOP
    loop.write_text(loop.read_text() + "# edited\n")
    commit_all(host, "edited")
    replay = host.parent / "copier._main.old_copy.x"
    shutil.copytree(host, replay, symlinks=True)
    decided = lifecycle.retire(replay, ANSWERS, PATTERNS, "v0.0.1", "v0.0.2")
    assert decided == lifecycle.Retired(True, "skipped: not the real host")
    after = lifecycle.retire(host, ANSWERS, PATTERNS, "v0.0.1", "v0.0.2", stage="after")
    assert not after.proceed and "_stage == 'before'" in after.message
    assert "\n" not in after.message
    unknown = lifecycle.retire(host, ANSWERS, ["workers/{nope}/loop.py"], "v0.0.1")
    assert not unknown.proceed and "unknown placeholder" in unknown.message
    git(host, "rm", "-q", LOOP, TEST_LOOP)
    commit_all(host, "both gone")
    gone = lifecycle.retire(host, ANSWERS, PATTERNS, "v0.0.1", "v0.0.2")
    assert gone.proceed and gone.message.startswith("skipped:"), gone


def test_retire_command_line_exits_1_with_one_line(
    host: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = host / LOOP
    loop.write_text(loop.read_text() + "# edited\n")
    commit_all(host, "edited")
    monkeypatch.setenv("STAGE", "before")
    monkeypatch.setenv("VERSION_FROM", "v0.0.1")
    monkeypatch.setenv("VERSION_TO", "v0.0.2")
    argv = ["retire", "--answers-file", ANSWERS, "--host", str(host)]
    assert lifecycle.main([*argv, "--path", PATTERNS[0]]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith(f"{LOOP}: you changed it")
    assert lifecycle.main([*argv, "--path", PATTERNS[1]]) == 0
    out, err = capsys.readouterr()
    assert (
        err == ""
        and out == f"    migrate  retired {TEST_LOOP}: unedited, the update removes them\n"
    )
