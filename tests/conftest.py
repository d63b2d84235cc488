"""Fixtures for the template's own tests.

- `template_repo` (session): the template's working tree (tracked and untracked files,
  minus ignored ones) committed into a temporary git repository and tagged `v0.0.1`; a
  second commit that changes one rendered file is tagged `v0.0.2`, for update tests. So
  uncommitted template changes render, and the repo under test is never touched.
- `template_history` (session): the same snapshot tagged `v0.0.1`, then a scripted release
  `v0.0.2` (`release_change`): a changed line in a worker-owned file, changes to the
  protected files, a renamed worker file with its `_migrations` step, and a change next to
  the `WorkKind` import of the namespace. tests/test_update.py updates across it.
- `make_host` (factory): a fresh git-initialised copy of `tests/fixtures/reference-host/`
  (or another fixture folder), committed, ready to render into.
- `render` (factory): `copier.run_copy` of the template into a host with the answers given.
- `uv_env` (session): the environment for `uv` in rendered hosts; every sync is offline,
  from the cache `make setup` warmed (nothing downloads at test time).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import copier
import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
REFERENCE_HOST = FIXTURES / "reference-host"
VENV_BIN = Path(sys.executable).parent
IGNORE = shutil.ignore_patterns(
    ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "*.pyc", ".terraform"
)
GIT_ENV = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
}
# the marker the v0.0.2 commit adds, so an update has something to bring
UPDATE_MARKER = "# template v0.0.2"


# What a host receives of the engine's tests (issue 30): the storage contract over its own
# storages, the seed's manager and relay cases; the rest runs only in `make engine-check`.
HOST_TESTS = {
    "om/tests/work_fixtures.py",
    "om/tests/contracts/work_storage.py",
    "om/tests/contracts/work_storage_base.py",
    "om/tests/contracts/work_storage_cancel.py",
    "om/tests/contracts/work_storage_claim.py",
    "om/tests/contracts/work_storage_lanes.py",
    "om/tests/contracts/work_storage_order.py",
    "om/tests/contracts/work_storage_roster.py",
    "om/tests/contracts/work_storage_rows.py",
    "om/tests/contracts/work_storage_schedules.py",
    "om/tests/contracts/work_storage_sweep.py",
    "om/tests/unit/test_work_storage.py",
    "om/tests/integration/test_work_storage_postgres.py",
    "om/tests/unit/test_work_manager.py",
    "om/tests/unit/test_outbox_relay_work.py",
    # the work API's roles, guard and audit entries, over the host's own API (issue 34)
    "services/api/tests/test_work_api.py",
}


ADMIN_URL = os.environ.get("ACME_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Run the reference host's own `scripts/infra-up.sh` once, before any test (in the
    xdist controller only): it creates the host's database roles, and two hosts' test
    sessions creating a missing role at the same moment would race (`CREATE ROLE` fails
    on the second with a unique violation). A failure is left for the tests that need the
    database to report."""
    if hasattr(session.config, "workerinput"):
        return
    subprocess.run(
        ["bash", "scripts/infra-up.sh"],
        cwd=REFERENCE_HOST,
        capture_output=True,
        check=False,
        timeout=120,
    )


def git(cwd: Path, *args: str) -> str:
    """Run git in `cwd` and return its stdout; raises on failure."""
    done = subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed in {cwd}:\n{done.stderr}")
    return done.stdout


def commit_all(cwd: Path, message: str) -> None:
    git(cwd, "add", "-A")
    git(cwd, "commit", "-q", "--no-verify", "--allow-empty", "-m", message)


def tree_state(cwd: Path) -> str:
    """`git status --porcelain --untracked-files=all`: '' for a clean tree."""
    return git(cwd, "status", "--porcelain", "--untracked-files=all")


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`copier <args>` run as a user runs it, in `cwd`."""
    return subprocess.run(
        [sys.executable, "-m", "copier", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """A refusal: exit 1, no traceback, exactly one line on stderr (copier's own
    `Keeping template version` note on update aside); returns that line."""
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [
        line
        for line in done.stderr.strip().splitlines()
        if not line.startswith("Keeping template version")
    ]
    assert len(lines) == 1, done.stderr
    return lines[0]


def load_extension(name: str) -> ModuleType:
    """Import `extensions/<name>.py` the way the hook does (a unique module name)."""
    key = f"_worker_template_tests_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, REPO / "extensions" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


def _working_tree_files() -> list[str]:
    out = git(REPO, "ls-files", "--cached", "--others", "--exclude-standard", "-z")
    return [f for f in out.split("\0") if f and (REPO / f).is_file()]


def copy_working_tree(dst: Path) -> None:
    """Every file of the template's working tree (tracked, or untracked and not ignored)
    into `dst`, as it is on disk; no virtualenv or bytecode."""
    for rel in _working_tree_files():
        if "/.venv/" in f"/{rel}" or "__pycache__" in rel:
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, target)


def snapshot_template(dst: Path) -> Path:
    """Copy the template's working tree into `dst`, git-initialised, committed, tagged `v0.0.1`."""
    dst.mkdir(parents=True)
    copy_working_tree(dst)
    git(dst, "init", "-q", "-b", "main")
    commit_all(dst, "template snapshot")
    git(dst, "tag", "v0.0.1")
    return dst


@pytest.fixture(scope="session")
def template_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working tree as a git repo tagged `v0.0.1`, then `v0.0.2` (one rendered change)."""
    dst = snapshot_template(tmp_path_factory.mktemp("template") / "worker-template")
    answers = dst / "template" / "{{ _copier_conf.answers_file }}.jinja"
    answers.write_text(f"{UPDATE_MARKER}\n" + answers.read_text(encoding="utf-8"), encoding="utf-8")
    commit_all(dst, "a change to bring by update")
    git(dst, "tag", "v0.0.2")
    return dst


# The scripted release v0.0.2 of `template_history` (paths inside the template repo).
WORKER_TPL = "template/workers/{{ worker_name }}"
PKG_TPL = f"{WORKER_TPL}/src/{{{{ host_root }}}}/workers/{{{{ worker_module }}}}"
PAYLOAD_TPL = "template/om/src/{{ host_root }}/om/work/types/payloads/{{ kind_snake }}.py.jinja"
NAMESPACE_ENGINE = "engine/om/src/acme/om/work"  # its plain source (docs/decisions/0029)
RELEASE_LINE = "Changed in template v0.0.2."
RELEASE_PROTECTED = "# template v0.0.2: a change copier must not bring into a user-owned file"
RELEASE_KINDS = "# template v0.0.2: the kinds come from the patcher-owned module below"
RENAMED_FROM = "workers/{worker_name}/README.md"
RENAMED_TO = "workers/{worker_name}/docs/README.md"
RELEASE_MIGRATION = f"""_migrations:
  - version: v0.0.2
    command:
      - "{{{{ _copier_python }}}}"
      - "{{{{ _copier_conf.src_path }}}}/extensions/lifecycle.py"
      - move
      - --answers-file
      - "{{{{ _copier_conf.answers_file }}}}"
      - --from
      - "{RENAMED_FROM}"
      - --to
      - "{RENAMED_TO}"
"""


def release_change(repo: Path) -> None:
    """The scripted template change of release v0.0.2, applied to a template git repo.

    - `main.py`: its first line changed (a worker-owned, copier-merged file);
    - `handler.py`, `test_handler.py` and the payload model: a line appended (they are in
      `_skip_if_exists`, so no update may bring it);
    - the worker's `README.md` moved to `docs/README.md`, with the `_migrations` step;
    - the namespace's `types/work_item.py`: a comment above `from .kinds import ... WorkKind`.
    """
    main = repo / PKG_TPL / "main.py.jinja"
    lines = main.read_text(encoding="utf-8").splitlines(keepends=True)
    assert lines[0].startswith('"""'), lines[0]
    lines[0] = f'"""{RELEASE_LINE} ' + lines[0][3:]
    main.write_text("".join(lines), encoding="utf-8")
    for rel in (
        f"{PKG_TPL}/{{% if not maintenance %}}handler.py{{% endif %}}.jinja",
        f"{WORKER_TPL}/tests/test_handler.py.jinja",
        PAYLOAD_TPL,
    ):
        path = repo / rel
        path.write_text(
            path.read_text(encoding="utf-8") + f"{RELEASE_PROTECTED}\n", encoding="utf-8"
        )
    (repo / WORKER_TPL / "docs").mkdir()
    git(repo, "mv", f"{WORKER_TPL}/README.md.jinja", f"{WORKER_TPL}/docs/README.md.jinja")
    config = repo / "copier.yml"
    text = config.read_text(encoding="utf-8")
    assert text.count("\n_migrations:\n") == 1
    config.write_text(
        text.replace("\n_migrations:\n", "\n" + RELEASE_MIGRATION, 1), encoding="utf-8"
    )
    item = repo / NAMESPACE_ENGINE / "types" / "work_item.py"
    text = item.read_text(encoding="utf-8")
    anchor = "from .kinds import"
    assert text.count(anchor) == 1
    item.write_text(text.replace(anchor, f"{RELEASE_KINDS}\n{anchor}"), encoding="utf-8")


@pytest.fixture(scope="session")
def template_history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working tree tagged `v0.0.1`, then the scripted release tagged `v0.0.2`."""
    repo = snapshot_template(tmp_path_factory.mktemp("history") / "worker-template")
    release_change(repo)
    commit_all(repo, "release v0.0.2: scripted template change")
    git(repo, "tag", "v0.0.2")
    return repo


RELEASE_0_1_0 = "e75b510"
"""The template's 0.1.0 release, a commit of this repository (tags do not survive here)."""


def release_history(dst: Path) -> Path:
    """This repository cloned into `dst`: the 0.1.0 release (`RELEASE_0_1_0`) tagged
    `v0.1.0`, then the working tree, uncommitted changes included, tagged `v0.2.0`."""
    subprocess.run(
        ["git", "clone", "-q", "--no-checkout", str(REPO), str(dst)], check=True, timeout=120
    )
    git(dst, "checkout", "-q", "-B", "main", RELEASE_0_1_0)
    git(dst, "tag", "v0.1.0")
    for old in git(dst, "ls-files", "-z").split("\0"):
        if old:
            (dst / old).unlink()
    copy_working_tree(dst)
    commit_all(dst, "the working tree")
    git(dst, "tag", "v0.2.0")
    return dst


def copy_host(dst: Path, source: Path = REFERENCE_HOST) -> Path:
    """A committed git copy of a host fixture at `dst` (plain function: module- and
    session-scoped fixtures call it too)."""
    shutil.copytree(source, dst, ignore=IGNORE, symlinks=True)
    git(dst, "init", "-q", "-b", "main")
    commit_all(dst, "host")
    return dst


def copy_template(template: Path, dst: Path, ref: str, **answers: Any) -> Any:
    """`copier copy` of the template at `ref` into the host `dst`, in-process, unprompted."""
    return copier.run_copy(
        str(template), str(dst), data=answers, vcs_ref=ref, unsafe=True, defaults=True, quiet=True
    )


@pytest.fixture
def make_host(tmp_path: Path) -> Callable[..., Path]:
    """Factory: a committed git copy of a host fixture (`reference-host` by default)."""

    def make(source: Path = REFERENCE_HOST, name: str = "host") -> Path:
        return copy_host(tmp_path / name, source)

    return make


DEFAULT_ANSWERS = {"worker_name": "shipment-notifier", "work_kind": "NOTIFY_SHIPMENT"}


@pytest.fixture
def render(template_repo: Path) -> Callable[..., Any]:
    """Factory: `copier copy` the template (at `vcs_ref`) into `dst` with `answers`."""

    def run(dst: Path, vcs_ref: str = "v0.0.2", **answers: Any) -> Any:
        return copy_template(template_repo, dst, vcs_ref, **{**DEFAULT_ANSWERS, **answers})

    return run


@pytest.fixture(scope="session")
def uv_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Environment for `uv` in rendered hosts; `warm()` flips it to offline after one sync."""
    env = {
        **os.environ,
        "UV_LINK_MODE": "copy",
        "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR", str(Path.home() / ".cache" / "uv")),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("VIRTUAL_ENV", None)
    # A rendered host's venv is fresh per test: let its first process write the bytecode
    # the next ones read (a shell with PYTHONDONTWRITEBYTECODE set compiles every import of
    # every worker process the host's tests start, about a third of their CPU time).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    yield env


def uv_sync(host: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`uv sync --all-packages` in `host`, offline: nothing downloads at test time.

    `make setup` warms the uv cache with every package a rendered host locks (it syncs the
    reference host once), so a render resolves and installs from the cache alone.
    """
    done = subprocess.run(
        ["uv", "sync", "--all-packages", "--offline", "--quiet"],
        cwd=host,
        env={**env, "UV_OFFLINE": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        done.stderr += "\n(the uv cache lacks a package: run `make setup` first)"
    return done


def host_gate(host: Path, env: dict[str, str], *command: str, timeout: float = 1200) -> str:
    """Run a host command offline (`make check`, `uv run ... pytest ...`) and return its
    output; raises `AssertionError` with the output's tail when it fails."""
    done = subprocess.run(
        list(command),
        cwd=host,
        env={**env, "UV_OFFLINE": "1"},
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    return done.stdout
