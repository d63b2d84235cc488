"""Nothing half-done (issue 12): every bad answer, host and destination is refused with one
line before a byte is written, on every copier operation that can set an answer; a copy
that fails after rendering is put back; the host helper never loses the user's work.

Each test asserts the refusal's line and that `git status --porcelain` is as it was.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import copier
import pytest
import yaml
from conftest import (
    REFERENCE_HOST,
    VENV_BIN,
    cli,
    commit_all,
    host_gate,
    load_extension,
    one_line,
    tree_state,
    uv_sync,
)
from copier.errors import UserMessageError

naming = load_extension("naming")
patcher = load_extension("patcher")
lifecycle = load_extension("lifecycle")

WORKER = "workers/shipment-notifier"
ANSWERS = f"{WORKER}/.copier-answers.yml"
PKG = f"{WORKER}/src/acme/workers/shipment_notifier"


def refused(render: Callable[..., Any], host: Path, **answers: Any) -> str:
    """The one-line refusal of a copy; the tree must be exactly as before."""
    before = tree_state(host)
    with pytest.raises(UserMessageError) as caught:
        render(host, **answers)
    assert tree_state(host) == before, "a refused copy must leave the tree as it was"
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- 1. the whole answer must match ----------------------------------------------------------


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ({"work_kind": "NOTIFY_SHIPMENT\n"}, "must be UPPER_SNAKE"),
        ({"worker_name": "shipment-notifier\n"}, "must be kebab-case"),
        ({"lane": "bulk\n"}, "must be snake_case"),
    ],
)
def test_an_answer_ending_in_a_newline_is_refused(
    make_host: Callable[..., Path],
    render: Callable[..., Any],
    answers: dict[str, str],
    expected: str,
) -> None:
    host = make_host(REFERENCE_HOST)
    assert expected in refused(render, host, **answers)


def test_every_answer_pattern_matches_the_whole_answer() -> None:
    for good, bad in (("shipment-notifier", "shipment-notifier\n"), ("a", "a\n")):
        assert naming.answer_problems(worker_name=good, work_kind="X", lane="default") == []
        assert naming.answer_problems(worker_name=bad, work_kind="X", lane="default")
    assert naming.answer_problems(worker_name="a", work_kind="X\n", lane="default")
    assert naming.answer_problems(worker_name="a", work_kind="X", lane="default\n")
    helper = load_extension("host_workers")
    assert not helper.WORKER_NAME.fullmatch("x\n")
    assert helper.version("v1.2.0\n") is None


def test_a_block_scalar_from_a_data_file_is_refused_in_one_line(
    make_host: Callable[..., Path], template_repo: Path, tmp_path: Path
) -> None:
    host = make_host(REFERENCE_HOST)
    data = tmp_path / "answers.yml"
    data.write_text("worker_name: shipment-notifier\nwork_kind: |\n  NOTIFY_SHIPMENT\n")
    done = cli(
        host, "copy", "--trust", "--defaults", "-r", "v0.0.2", "--data-file", str(data),
        str(template_repo), ".",
    )  # fmt: skip
    assert "work_kind 'NOTIFY_SHIPMENT\\n' must be UPPER_SNAKE" in one_line(done)
    assert tree_state(host) == ""


# --- 2. all or nothing ------------------------------------------------------------------------


def test_a_symlink_out_of_the_host_is_refused_before_rendering(
    make_host: Callable[..., Path], render: Callable[..., Any], tmp_path: Path
) -> None:
    host = make_host(REFERENCE_HOST)
    environments = host / "deployment/terraform/environments"
    outside = tmp_path / "environments-elsewhere"
    shutil.move(environments, outside)
    environments.symlink_to(outside, target_is_directory=True)
    commit_all(host, "environments live elsewhere")
    message = refused(render, host)
    assert message.startswith(
        f"deployment/terraform/environments is a symlink to {outside}, outside the host"
    )
    assert not (host / "om/src/acme/om/work").exists()
    assert not (host / WORKER).exists()


def test_a_copy_that_fails_after_rendering_is_put_back(
    make_host: Callable[..., Path],
    render: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every path the copy wrote or patched is put back: the planned paths cover them all."""
    host = make_host(REFERENCE_HOST)
    (host / "notes.txt").write_text("mine, uncommitted\n")
    render(host)
    assert len(tree_state(host).splitlines()) > 30

    def broken(*args: Any, **kwargs: Any) -> list[str]:
        raise RuntimeError("disk full")

    monkeypatch.setattr(patcher, "apply", broken)
    code = patcher.main(["--operation", "copy", "--answers-file", ANSWERS, "--host", str(host)])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "worker-template patcher: disk full; the copy was undone ("
    ), err
    assert tree_state(host) == "?? notes.txt\n"
    assert (host / "notes.txt").read_text() == "mine, uncommitted\n"


# --- 3. a destination that can be rolled back and reviewed --------------------------------------


def test_a_destination_that_is_not_a_git_work_tree_is_refused(
    tmp_path: Path, render: Callable[..., Any]
) -> None:
    host = tmp_path / "host"
    shutil.copytree(REFERENCE_HOST, host, ignore=shutil.ignore_patterns(".venv", "__pycache__"))
    before = sorted(str(p.relative_to(host)) for p in host.rglob("*"))
    with pytest.raises(UserMessageError) as caught:
        render(host)
    assert str(caught.value) == (
        f"{host} is not a git work tree: a copy must be reviewable and undoable; run "
        "`git init && git add -A && git commit -m 'Before the worker template'` first"
    )
    assert sorted(str(p.relative_to(host)) for p in host.rglob("*")) == before


def test_uncommitted_changes_in_a_file_the_copy_patches_are_refused(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host(REFERENCE_HOST)
    pyproject = host / "pyproject.toml"
    pyproject.write_text(pyproject.read_text() + "# my work in progress\n")
    message = refused(render, host)
    assert message == (
        "the copy would write or patch files with uncommitted changes (pyproject.toml); "
        "commit or stash them first (`git stash -u`), then copy again"
    )
    assert pyproject.read_text().endswith("# my work in progress\n")


def test_unrelated_uncommitted_files_neither_block_nor_get_touched(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host(REFERENCE_HOST)
    readme = host / "README.md"
    readme.write_text(readme.read_text() + "\nwork in progress\n")
    (host / "notes.txt").write_text("mine\n")
    render(host)
    assert readme.read_text().endswith("\nwork in progress\n")
    assert (host / "notes.txt").read_text() == "mine\n"
    assert (host / ANSWERS).is_file()


def test_restore_renders_into_its_scratch_folder_and_refuses_to_lose_work(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    """Case 9, and the helper's own scratch render (not a git work tree) keeps working."""
    host = make_host(REFERENCE_HOST)
    render(host)
    commit_all(host, "shipment-notifier")
    env = {**os.environ, "COPIER": str(VENV_BIN / "copier")}

    def restore(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "scripts/workers.py", "restore", "shipment-notifier", *args],
            cwd=host, env=env, capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip

    main = host / PKG / "main.py"
    rendered = main.read_text()
    main.write_text(rendered + "# my uncommitted edit\n")
    done = restore(str(main))
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"workers.py: {PKG}/main.py exists and has uncommitted changes; restore brings back a "
        "deleted file: delete it first, or overwrite it with FORCE=1 (make restore-worker-file) or "
        "--force (scripts/workers.py restore)"
    )
    assert main.read_text().endswith("# my uncommitted edit\n")
    handler = host / PKG / "handler.py"
    handler.write_text(handler.read_text() + "# my handler\n")
    for extra in ((), ("--force",)):
        done = restore(f"{PKG}/handler.py", *extra)
        assert done.returncode == 1 and "is yours" in done.stderr, done.stderr
        assert handler.read_text().endswith("# my handler\n")
    done = restore(f"{PKG}/main.py", "--force")
    assert done.returncode == 0, done.stderr
    assert main.read_text() == rendered
    main.unlink()
    done = restore(f"{PKG}/main.py")
    assert done.returncode == 0, done.stderr
    assert main.read_text() == rendered
    assert tree_state(host) == f" M {PKG}/handler.py\n"


# --- 4. accepted answers render a host whose gate passes ---------------------------------------

LIMIT = 100  # the reference host's [tool.ruff] line-length
AT_LIMIT = {  # the longest answers the reference host takes, all in one worker
    "worker_name": "w" + "a" * (LIMIT - naming.WORKER_MODULE_LINE - len("acme") - 1),
    "work_kind": "K" * (LIMIT - naming.KIND_CLASS_LINE),
    "lane": "l" * (LIMIT - naming.LANE_POLICY_LINE - (LIMIT - naming.KIND_CLASS_LINE)),
}
UNDERSCORED_KIND = "_".join(["K"] * 21)  # 41 characters (its class is 21)


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        (
            {"worker_name": AT_LIMIT["worker_name"] + "b"},
            "is 42 characters, at most 41 fit the host's line length 100",
        ),
        ({"work_kind": AT_LIMIT["work_kind"] + "K"}, "may have at most 41 characters"),
        ({"work_kind": UNDERSCORED_KIND + "_K"}, "is 43 characters, at most 41 fit"),
        (
            {"work_kind": AT_LIMIT["work_kind"], "lane": AT_LIMIT["lane"] + "l"},
            "is 25 characters, at most 24 fit beside the kind",
        ),
    ],
)
def test_answers_one_past_a_limit_are_refused(
    make_host: Callable[..., Path],
    render: Callable[..., Any],
    answers: dict[str, str],
    expected: str,
) -> None:
    host = make_host(REFERENCE_HOST)
    assert expected in refused(render, host, **answers)


def test_a_kind_the_outbox_cannot_hold_is_refused(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    """With a line length that fits any kind, `outbox.kind varchar(100)` holds `work.` + 95."""
    host = make_host(REFERENCE_HOST)
    pyproject = host / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("line-length = 100", "line-length = 400"))
    commit_all(host, "long lines")
    kind = "_".join(["K"] * 48)  # 95 characters
    assert naming.limit_problems(
        worker_name="a", work_kind=kind, lane="default", line_length=400, host_root="acme",
        outbox_kind_size=100,
    ) == []  # fmt: skip
    message = refused(render, host, work_kind=kind + "_K")
    assert message == (
        f"work_kind {kind + '_K'!r} is 97 characters, at most 95: the relay's row kind "
        f"'work.{(kind + '_K').lower()}' must fit the host's outbox.kind varchar(100)"
    )


def test_a_kind_deriving_the_names_of_another_is_refused(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host(REFERENCE_HOST)
    answers = host / "workers" / "sender" / ".copier-answers.yml"
    answers.parent.mkdir(parents=True)
    answers.write_text("worker_name: sender\nwork_kind: SEND_V2\n")
    commit_all(host, "a worker of SEND_V2")
    message = refused(render, host, work_kind="SEND_V_2")
    assert message == (
        "work_kind 'SEND_V_2' derives the class 'SendV2', as 'SEND_V2' (workers/sender) does; "
        "choose another kind"
    )


def test_a_worker_reading_another_workers_settings_variable_is_refused(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host(REFERENCE_HOST)
    answers = host / "workers" / "ship" / ".copier-answers.yml"
    answers.parent.mkdir(parents=True)
    answers.write_text("worker_name: ship\nwork_kind: SHIP\n")
    commit_all(host, "the worker ship")
    message = refused(render, host, worker_name="ship-completed")
    assert message == (
        "worker_name 'ship-completed' reads the settings variable SHIP_COMPLETED_RETENTION that "
        "the worker 'ship' reads too; choose another worker_name"
    )


@pytest.mark.slow
def test_answers_at_every_limit_render_a_host_whose_gate_passes(
    make_host: Callable[..., Path], render: Callable[..., Any], uv_env: dict[str, str]
) -> None:
    """The longest worker name, kind class and lane in one worker, the longest kind in a
    second, and a kind as long added to the first (`make add-kind`): the host's ruff,
    format, mypy and arch check pass."""
    host = make_host(REFERENCE_HOST)
    render(host, **AT_LIMIT)
    commit_all(host, "the longest names")
    render(host, worker_name="second", work_kind=UNDERSCORED_KIND)
    commit_all(host, "the longest kind")
    added = "J" * len(AT_LIMIT["work_kind"])
    render(host, **{**AT_LIMIT, "work_kind": added, "added_kind": True})
    commit_all(host, "the longest kind added to the first")
    synced = uv_sync(host, uv_env)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    host_gate(host, uv_env, "make", "lint", "format-check", "typecheck", "arch-check")


# --- 5. answers given on update are checked as on copy -----------------------------------------


def test_an_answer_given_on_update_is_checked_as_on_copy(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host(REFERENCE_HOST)
    render(host)
    commit_all(host, "shipment-notifier")
    for lane, expected in (
        ("Bulk Lane", "lane 'Bulk Lane' must be snake_case"),
        ("bulk\n", "lane 'bulk\\n' must be snake_case"),
        ("l" * 51, "is 51 characters, at most 50 fit beside the kind"),
    ):
        done = cli(
            host, "update", "--trust", "--defaults", "-a", ANSWERS, "--vcs-ref", ":current:",
            "-d", f"lane={lane}",
        )  # fmt: skip
        assert expected in one_line(done)
        assert tree_state(host) == ""
    recorded = yaml.safe_load((host / ANSWERS).read_text())
    assert recorded["lane"] == "default"
    copier.run_update(
        str(host), answers_file=ANSWERS, data={"lane": "bulk"}, vcs_ref="v0.0.2",
        unsafe=True, defaults=True, overwrite=True, quiet=True,
    )  # fmt: skip
    assert yaml.safe_load((host / ANSWERS).read_text())["lane"] == "bulk"


def test_fixed_answers_given_on_copy_or_update_cannot_skip_the_checks(
    make_host: Callable[..., Path], render: Callable[..., Any]
) -> None:
    host = make_host(REFERENCE_HOST)
    message = refused(render, host, worker_name="api", host_root="acme", namespace_absent=True)
    assert "worker_name 'api' collides with what the host has" in message
    render(host)
    commit_all(host, "shipment-notifier")
    done = cli(
        host, "update", "--trust", "--defaults", "-a", ANSWERS, "--vcs-ref", ":current:",
        "-d", "namespace_absent=false",
    )  # fmt: skip
    assert one_line(done) == (
        f"namespace_absent is fixed at the first copy (True in {ANSWERS}), not answered: "
        "drop -d namespace_absent=false"
    )
    assert tree_state(host) == ""


# --- 6. one line, and the helper's codes through make -------------------------------------------


def test_a_missing_worker_name_with_defaults_is_one_line(
    make_host: Callable[..., Path], template_repo: Path
) -> None:
    host = make_host(REFERENCE_HOST)
    done = cli(
        host, "copy", "--trust", "--defaults", "-r", "v0.0.2", "-d", "work_kind=X",
        str(template_repo), ".",
    )  # fmt: skip
    assert one_line(done) == "worker_name is required: add -d worker_name=shipment-notifier"
    assert tree_state(host) == ""


@pytest.mark.parametrize("code", [0, 1, 2, 3])
def test_make_targets_end_with_the_helpers_own_code(tmp_path: Path, code: int) -> None:
    (tmp_path / "Makefile").write_text(lifecycle.edit_makefile("all:\n\t@true\n"))
    fake = tmp_path / "fake.py"
    fake.write_text(f"import sys\nsys.exit({code})\n")
    for target in ("update-worker", "update-workers"):
        done = subprocess.run(
            ["make", "--no-print-directory", target, "NAME=x", f"WORKERS_PY={sys.executable} {fake}"],
            cwd=tmp_path, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if code == 0:
            assert done.returncode == 0 and done.stderr == "", done.stderr
            continue
        assert done.returncode == 2, "make's own code for any failed recipe"
        lines = done.stderr.strip().splitlines()
        assert lines[0] == (
            f"scripts/workers.py exited {code} (1 refused, 2 conflicts left to resolve, "
            "3 stopped after a worker's update)"
        )
        assert lines[-1].endswith(f"Error {code}"), lines
