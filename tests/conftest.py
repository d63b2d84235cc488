"""Fixtures for the template's own tests.

- `template_repo` (session): the template's working tree (tracked and untracked files,
  minus ignored ones) committed into a temporary git repository and tagged `v0.0.1`; a
  second commit that changes one rendered file is tagged `v0.0.2`, for update tests. So
  uncommitted template changes render, and the repo under test is never touched.
- `make_host` (factory): a fresh git-initialised copy of `tests/fixtures/reference-host/`
  (or another fixture folder), committed, ready to render into.
- `render` (factory): `copier.run_copy` of the template into a host with the answers given.
- `uv_env` (session): the environment for `uv` in rendered hosts; the first sync of the
  session may reach the index, every later one runs with `UV_OFFLINE=1` from the cache.
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
PATCHER_HOST = FIXTURES / "patcher" / "host"
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


@pytest.fixture(scope="session")
def template_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working tree as a git repo tagged `v0.0.1`, then `v0.0.2` (one rendered change)."""
    dst = tmp_path_factory.mktemp("template") / "worker-template"
    dst.mkdir()
    for rel in _working_tree_files():
        if "/.venv/" in f"/{rel}" or "__pycache__" in rel:
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, target)
    git(dst, "init", "-q", "-b", "main")
    commit_all(dst, "template snapshot")
    git(dst, "tag", "v0.0.1")
    answers = dst / "template" / "{{ _copier_conf.answers_file }}.jinja"
    answers.write_text(f"{UPDATE_MARKER}\n" + answers.read_text(encoding="utf-8"), encoding="utf-8")
    commit_all(dst, "a change to bring by update")
    git(dst, "tag", "v0.0.2")
    return dst


@pytest.fixture
def make_host(tmp_path: Path) -> Callable[..., Path]:
    """Factory: a committed git copy of a host fixture (`reference-host` by default)."""

    def make(source: Path = REFERENCE_HOST, name: str = "host") -> Path:
        if not (source / "pyproject.toml").is_file():
            pytest.skip(f"{source} is not there yet")
        host = tmp_path / name
        shutil.copytree(source, host, ignore=IGNORE, symlinks=True)
        git(host, "init", "-q", "-b", "main")
        commit_all(host, "host")
        return host

    return make


DEFAULT_ANSWERS = {"worker_name": "shipment-notifier", "work_kind": "NOTIFY_SHIPMENT"}


@pytest.fixture
def render(template_repo: Path) -> Callable[..., Any]:
    """Factory: `copier copy` the template (at `vcs_ref`) into `dst` with `answers`."""

    def run(dst: Path, vcs_ref: str = "v0.0.2", **answers: Any) -> Any:
        data = {**DEFAULT_ANSWERS, **answers}
        return copier.run_copy(
            str(template_repo),
            str(dst),
            data=data,
            vcs_ref=vcs_ref,
            unsafe=True,
            defaults=True,
            quiet=True,
        )

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
    yield env


def uv_sync(host: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`uv sync --all-packages` in `host`: offline from the cache when it has everything,
    otherwise once more online (the session's warm-up), then offline from then on."""
    cmd = ["uv", "sync", "--all-packages", "--quiet"]
    done = subprocess.run(
        cmd, cwd=host, env={**env, "UV_OFFLINE": "1"}, capture_output=True, text=True, check=False
    )
    if done.returncode != 0 and not env.get("UV_OFFLINE"):
        done = subprocess.run(cmd, cwd=host, env=env, capture_output=True, text=True, check=False)
        if done.returncode == 0:
            env["UV_OFFLINE"] = "1"
    return done
