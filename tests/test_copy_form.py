"""`copier copy <template> workers/x` works as written, and `copier update` in a worker folder
updates that worker (issue 11, item 5).

Copier writes only inside its destination; for `workers/<x>` the template renders its empty
`launcher` subtree and a task runs the root copy into the host (extensions/launch.py). Every
copy here goes through copier's CLI from the host root, as a user types it, with the
template as a local path and as a `file://` URL of a bare clone (no network).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import (
    REFERENCE_HOST,
    UPDATE_MARKER,
    cli,
    commit_all,
    git,
    load_extension,
    one_line,
    snapshot_template,
    tree_state,
)

launch = load_extension("launch")
context = load_extension("context")

NAME = "shipment-notifier"
KIND = "NOTIFY_SHIPMENT"
ANSWERS = f"workers/{NAME}/.copier-answers.yml"
# The one answer two copies made at different seconds differ in: the migration's UTC stamp
# (its file names carry it). Both forms get the same one, so every byte can be compared.
STAMP = "20250101000000"


def files(host: Path) -> dict[str, tuple[bytes, bool]]:
    """Every file of `host` outside `.git`: its bytes and whether it is executable."""
    found: dict[str, tuple[bytes, bool]] = {}
    for path in sorted(host.rglob("*")):
        rel = path.relative_to(host)
        if rel.parts[0] == ".git" or not path.is_file():
            continue
        found[rel.as_posix()] = (path.read_bytes(), os.access(path, os.X_OK))
    return found


@pytest.fixture(scope="session")
def bare_url(template_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """`file://` URL of a bare clone of the template snapshot (tags `v0.0.1`, `v0.0.2`)."""
    bare = tmp_path_factory.mktemp("remote") / "worker-template.git"
    git(template_repo.parent, "clone", "--quiet", "--bare", str(template_repo), str(bare))
    return bare.as_uri()


@pytest.fixture
def source(request: pytest.FixtureRequest, template_repo: Path, bare_url: str) -> str:
    """The template as the user gives it: an absolute local path or a `file://` URL."""
    return bare_url if request.param == "url" else str(template_repo)


# --- the copy form -------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["path", "url"], indirect=True)
def test_the_workers_form_makes_the_same_host_as_the_root_form(
    make_host: Callable[..., Path], source: str
) -> None:
    folder_form = make_host(REFERENCE_HOST, name="folder-form")
    root_form = make_host(REFERENCE_HOST, name="root-form")
    given = ("-d", f"work_kind={KIND}", "-d", f"migration_stamp={STAMP}")

    done = cli(folder_form, "copy", "--trust", "--defaults", *given, source, f"workers/{NAME}")
    assert done.returncode == 0, done.stderr[-4000:]
    done = cli(root_form, "copy", "--trust", "--defaults", "-d", f"worker_name={NAME}", *given,
               source, ".")  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]

    made, expected = files(folder_form), files(root_form)
    assert sorted(made) == sorted(expected)
    assert [rel for rel in expected if made[rel] != expected[rel]] == []
    assert tree_state(folder_form) == tree_state(root_form)
    recorded = yaml.safe_load((folder_form / ANSWERS).read_text())
    assert recorded["_src_path"] == source, "the template as the user gave it, not copier's clone"
    assert recorded["_commit"] == "v0.0.2"
    assert recorded["worker_name"] == NAME


@pytest.mark.parametrize("form", ["workers folder", "host root"])
def test_a_relative_template_path_is_recorded_absolute_and_updates(
    make_host: Callable[..., Path], template_repo: Path, form: str
) -> None:
    """Issue 29, item 12: copier resolves `_src_path` against the folder each command runs
    in, so `../worker-template` recorded as typed broke `copier update` in `workers/<x>`."""
    host = make_host(REFERENCE_HOST)
    relative = os.path.relpath(template_repo, host)
    assert not Path(relative).is_absolute()
    where = (f"workers/{NAME}",) if form == "workers folder" else (".", "-d", f"worker_name={NAME}")
    done = cli(host, "copy", "--trust", "--defaults", "-r", "v0.0.1", "-d", f"work_kind={KIND}",
               relative, *where)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert yaml.safe_load((host / ANSWERS).read_text())["_src_path"] == str(template_repo)
    commit_all(host, NAME)

    done = cli(host / "workers" / NAME, "update", "--trust", "--defaults")
    assert done.returncode == 0, done.stderr[-4000:]
    recorded = yaml.safe_load((host / ANSWERS).read_text())
    assert recorded["_commit"] == "v0.0.2" and recorded["_src_path"] == str(template_repo)


def test_worker_name_given_with_d_wins_over_the_folder_name(
    make_host: Callable[..., Path], template_repo: Path
) -> None:
    host = make_host(REFERENCE_HOST)
    done = cli(host, "copy", "--trust", "--defaults", "--quiet", "-d", "worker_name=invoice-mailer",
               "-d", "work_kind=SEND_INVOICE", str(template_repo), f"workers/{NAME}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    assert (
        yaml.safe_load((host / "workers/invoice-mailer/.copier-answers.yml").read_text())[
            "worker_name"
        ]
        == "invoice-mailer"
    )
    assert not (host / "workers" / NAME).exists(), "copier must not leave the folder it was given"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ("--defaults", f"workers/{NAME}"),
            "work_kind is required: add -d work_kind=NOTIFY_SHIPMENT",
        ),
        (
            ("--defaults", "-d", f"work_kind={KIND}", "workers/Shipment_Notifier"),
            "worker_name 'Shipment_Notifier' must be kebab-case",
        ),
        (
            ("--defaults", "-d", f"work_kind={KIND}", "--skip-tasks", f"workers/{NAME}"),
            f"copier copy into workers/{NAME} runs the copy as a task: drop --skip-tasks",
        ),
        (  # the root form keeps refusing a missing name
            ("--defaults", "-d", f"work_kind={KIND}", "."),
            "worker_name is required: add -d worker_name=shipment-notifier",
        ),
    ],
)
def test_a_refused_copy_is_one_line_and_writes_nothing(
    make_host: Callable[..., Path], template_repo: Path, args: tuple[str, ...], expected: str
) -> None:
    host = make_host(REFERENCE_HOST)
    *options, destination = args
    done = cli(host, "copy", "--trust", *options, str(template_repo), destination)
    assert one_line(done).startswith(expected)
    assert tree_state(host) == ""
    assert not (host / "workers").exists()


def test_a_workers_folder_outside_a_host_is_refused(tmp_path: Path, template_repo: Path) -> None:
    folder = tmp_path / "not-a-host"
    folder.mkdir()
    git(folder, "init", "-q")
    done = cli(folder, "copy", "--trust", "--defaults", "-d", f"work_kind={KIND}",
               str(template_repo), f"workers/{NAME}")  # fmt: skip
    assert one_line(done).startswith(f"{folder} is not a host root: no pyproject.toml")
    assert sorted(p.name for p in folder.iterdir()) == [".git"]


def test_copying_a_worker_that_exists_names_the_update(
    make_host: Callable[..., Path], template_repo: Path
) -> None:
    host = make_host(REFERENCE_HOST)
    (host / "workers" / NAME).mkdir(parents=True)
    (host / ANSWERS).write_text(f"worker_name: {NAME}\nwork_kind: {KIND}\n")
    commit_all(host, "a worker")
    done = cli(host, "copy", "--trust", "--defaults", "-d", "work_kind=OTHER",
               str(template_repo), f"workers/{NAME}")  # fmt: skip
    assert one_line(done) == (
        f"worker '{NAME}' already exists ({ANSWERS}); to bring it to a newer template version "
        f"run: cd {host} && copier update --trust --defaults -a {ANSWERS}"
    )
    assert tree_state(host) == ""


def failing_template(dst: Path) -> Path:
    """The template with one more task, run by the root copy only, that fails after the
    render and the patcher: a copy that breaks half way, tagged `v0.0.2`."""
    repo = snapshot_template(dst)
    config = repo / "copier.yml"
    data = yaml.safe_load(config.read_text())
    data["_tasks"].append(
        {
            "command": ["{{ _copier_python }}", "-c", "import sys; sys.exit('the disk is full')"],
            "when": "{{ not _launch and _copier_operation == 'copy' }}",
        }
    )
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    commit_all(repo, "a task that fails")
    git(repo, "tag", "v0.0.2")
    return repo


def test_a_root_copy_that_fails_half_way_leaves_nothing(
    make_host: Callable[..., Path], tmp_path: Path
) -> None:
    template = failing_template(tmp_path / "failing-template")
    host = make_host(REFERENCE_HOST)
    readme = host / "README.md"
    readme.write_text(readme.read_text() + "\nmy work in progress\n")
    (host / "notes.txt").write_text("mine\n")
    before = files(host)
    state = tree_state(host)

    done = cli(host, "copy", "--trust", "--defaults", "-d", f"work_kind={KIND}",
               str(template), f"workers/{NAME}")  # fmt: skip

    assert done.returncode == 1, done.stderr[-4000:]
    assert "Traceback" not in done.stderr
    assert "the disk is full" in done.stderr.splitlines()
    assert "paths it wrote were put back as committed" in done.stderr
    assert tree_state(host) == state
    assert files(host) == before
    assert not (host / "workers").exists()


# --- copier update in a worker folder ----------------------------------------------------------


@pytest.mark.parametrize("where", ["in the worker folder", "from the root"])
def test_copier_update_of_a_worker_folder_updates_that_worker(
    make_host: Callable[..., Path], render: Callable[..., Any], where: str
) -> None:
    host = make_host(REFERENCE_HOST)
    render(host, vcs_ref="v0.0.1")
    commit_all(host, NAME)
    cwd, args = (
        (host / "workers" / NAME, ()) if where != "from the root" else (host, (f"workers/{NAME}",))
    )
    (host / "notes.txt").write_text("uncommitted\n")

    refused = cli(cwd, "update", "--trust", "--defaults", *args)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert refused.stderr.strip().splitlines()[-1].startswith("Destination repository is dirty")
    assert tree_state(host) == "?? notes.txt\n"

    (host / "notes.txt").unlink()
    done = cli(cwd, "update", "--trust", "--defaults", *args)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (
        f"workers/{NAME} is a worker folder; updating it from the host root instead: "
        f"cd {host} && copier update --trust --defaults -a {ANSWERS}"
    ) in done.stderr
    assert tree_state(host) == f" M {ANSWERS}\n"
    text = (host / ANSWERS).read_text()
    assert text.startswith(UPDATE_MARKER) and yaml.safe_load(text)["_commit"] == "v0.0.2"


# --- extensions/launch.py ----------------------------------------------------------------------


def test_only_a_folder_directly_in_workers_launches(tmp_path: Path) -> None:
    assert launch.worker_parent(tmp_path / "workers" / NAME) == tmp_path
    assert launch.worker_parent(tmp_path / "workers") is None
    assert launch.worker_parent(tmp_path / "workers" / NAME / "src") is None
    host = tmp_path / "workers" / "acme"  # a host root that lives in a folder named workers
    shutil.copytree(REFERENCE_HOST, host, ignore=shutil.ignore_patterns(".venv"))
    assert context.launch_host(host) is None
    assert context.launch_host(host / "workers" / NAME) == host


def test_the_copy_plan_passes_answers_as_copier_reads_them(tmp_path: Path) -> None:
    import json

    plan = json.loads(
        launch.copy_plan(
            src="gh:acme/worker-template",
            ref="abc123",
            host=tmp_path / "host",
            cwd=tmp_path,
            answers={"worker_name": NAME, "maintenance": False, "container": True},
            quiet=True,
        )
    )
    assert plan["cwd"] == str(tmp_path)
    assert plan["command"] == [
        "-m", "copier", "copy", "--trust", "--defaults", "-r", "abc123", "--quiet",
        "-d", f"worker_name={NAME}", "-d", "maintenance=false", "-d", "container=true",
        "gh:acme/worker-template", "host",
    ]  # fmt: skip


def test_the_update_command_leaves_copiers_defaults_out() -> None:
    command = launch.update_command(
        answers_file=ANSWERS, given={"lane": "bulk"}, ref=None, defaults=True,
        conflict="inline", context_lines=3,
    )  # fmt: skip
    assert command == ["update", "--trust", "--defaults", "-d", "lane=bulk", "-a", ANSWERS]
    command = launch.update_command(
        answers_file=ANSWERS, given={}, ref="v0.0.1", defaults=False, conflict="rej",
        context_lines=1, skip_answered=True,
    )  # fmt: skip
    assert command == [
        "update", "--trust", "--skip-answered", "--vcs-ref", "v0.0.1", "--conflict", "rej",
        "--context-lines", "1", "-a", ANSWERS,
    ]  # fmt: skip


def test_put_back_undoes_only_what_changed_after_the_snapshot(
    make_host: Callable[..., Path],
) -> None:
    host = make_host(REFERENCE_HOST)
    readme = host / "README.md"
    readme.write_text("my edit\n")
    (host / "notes.txt").write_text("mine\n")
    before = launch.tree_entries(host)
    pyproject = host / "pyproject.toml"
    committed = pyproject.read_text()
    pyproject.write_text(committed + "# written by the copy\n")
    (host / "workers" / NAME / "src").mkdir(parents=True)
    (host / "workers" / NAME / "src" / "main.py").write_text("print()\n")

    assert launch.put_back(host, before) == ["pyproject.toml", f"workers/{NAME}/src/main.py"]
    assert pyproject.read_text() == committed
    assert not (host / "workers").exists()
    assert readme.read_text() == "my edit\n"
    assert (host / "notes.txt").read_text() == "mine\n"
    assert launch.put_back(host, before) == []


def test_the_operation_is_unknown_outside_copier() -> None:
    """The hook reads copier's operation from a private context variable; outside a copier
    run it has none (and a copier without it gives None too: the callers then refuse)."""
    assert context.copier_operation() is None
