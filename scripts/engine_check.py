"""`make engine-check`: ruff, format, strict mypy and the engine's tests, read from `engine/`.

The engine imports its host (`acme.om.context`, `acme.infra.container`, ...), so its tests
run inside one: `.cache/engine-host`, the reference host with two workers rendered, built
once and again only when the template's other files, the extensions or the reference host
change. Every file of `engine/` is linked into it at its own path, so an edit of the engine
is checked with no render (docs/decisions/0029).

Exit status: 0 when every check passed; 1 with the failing check's output otherwise.
Environment: `ENGINE_CHECK_NO_PG=1` runs without PostgreSQL and Redis (the integration
tests are deselected); otherwise they are started as `make test` starts them, and a
missing one fails the check. `ENGINE_CHECK_ARGS` adds pytest arguments (shell-quoted).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import copier

REPO = Path(__file__).resolve().parent.parent
ENGINE = REPO / "engine"
HOST = REPO / ".cache" / "engine-host"
REFERENCE_HOST = REPO / "tests" / "fixtures" / "reference-host"
WORKER = {"worker_name": "shipment-notifier", "work_kind": "NOTIFY_SHIPMENT"}
# A second kind in the host, for the engine's tests of a process that runs several.
SECOND_WORKER = {"worker_name": "invoice-mailer", "work_kind": "SEND_INVOICE"}
_SKIPPED_PARTS = {".venv", "__pycache__", ".mypy_cache", ".ruff_cache", "node_modules", ".git"}
_GIT = {
    "GIT_AUTHOR_NAME": "engine-check",
    "GIT_AUTHOR_EMAIL": "engine-check@localhost",
    "GIT_COMMITTER_NAME": "engine-check",
    "GIT_COMMITTER_EMAIL": "engine-check@localhost",
}


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not _SKIPPED_PARTS & set(p.parts))


def host_key() -> str:
    """A digest of everything the rendered host depends on besides `engine/` itself."""
    digest = hashlib.sha256()
    for root in (REPO / "template", REPO / "extensions", REFERENCE_HOST):
        for path in _files(root):
            digest.update(path.relative_to(REPO).as_posix().encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    digest.update((REPO / "copier.yml").read_bytes())
    digest.update(repr((WORKER, SECOND_WORKER)).encode())
    return digest.hexdigest()


def _locked_version(package: str) -> str:
    """`package`'s version in the template's own uv.lock (what `make setup` cached)."""
    lock = tomllib.loads((REPO / "uv.lock").read_text(encoding="utf-8"))
    return str(next(p["version"] for p in lock["package"] if p["name"] == package))


def _run(
    command: list[str], cwd: Path, env: dict[str, str] | None = None, *, quiet: bool = False
) -> None:
    """Run `command`; SystemExit naming it when it fails. `quiet`: its output only then."""
    done = subprocess.run(command, cwd=cwd, env=env, check=False, capture_output=quiet, text=True)
    if done.returncode != 0:
        if quiet:
            print(done.stdout[-4000:], done.stderr[-2000:], sep="\n", file=sys.stderr)
        raise SystemExit(f"engine-check: `{' '.join(command)}` failed in {cwd}")


def _uv_env() -> dict[str, str]:
    env = {**os.environ, "UV_OFFLINE": "1", "UV_LINK_MODE": "copy", **_GIT}
    env.pop("VIRTUAL_ENV", None)
    # Set by `python -m uv` (the Makefile's uv where none is on PATH): it would point every
    # `uv pip` below at that interpreter instead of the host's environment.
    env.pop("UV_INTERNAL__PARENT_INTERPRETER", None)
    return env


def build_host() -> None:
    """Render the reference host with two workers into `.cache/engine-host` (when stale)."""
    key = host_key()
    stamp = HOST / ".engine-host-key"
    if stamp.is_file() and stamp.read_text() == key:
        return
    print("engine-check: rendering the host the engine runs in (once per template change)")
    shutil.rmtree(HOST, ignore_errors=True)
    shutil.copytree(
        REFERENCE_HOST, HOST, ignore=shutil.ignore_patterns(*_SKIPPED_PARTS), symlinks=True
    )
    env = _uv_env()
    for command in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"]):
        _run(command, HOST, env)
    _run(["git", "commit", "-q", "-m", "host"], HOST, env)
    with tempfile.TemporaryDirectory() as scratch:
        # The template as it is on disk, uncommitted edits included, outside any git tree.
        template = Path(scratch) / "worker-template"
        for name in ("copier.yml", "template", "extensions", "engine", "launcher"):
            source = REPO / name
            if source.is_dir():
                shutil.copytree(
                    source, template / name, ignore=shutil.ignore_patterns("__pycache__")
                )
            elif source.is_file():
                template.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, template / name)
        for worker in (WORKER, SECOND_WORKER):
            copier.run_copy(
                str(template), str(HOST), data=worker, unsafe=True, defaults=True, quiet=True
            )
            for command in (["git", "add", "-A"], ["git", "commit", "-q", "-m", "worker"]):
                _run(command, HOST, env)
    _run(["uv", "sync", "--all-packages", "--offline", "--quiet"], HOST, env)
    stamp.write_text(key)


def install_xdist() -> None:
    """pytest-xdist for the check's own run, into the host's environment (every run: a
    host built before it was there heals); from the uv cache, never into a user's host."""
    xdist = f"pytest-xdist=={_locked_version('pytest-xdist')}"
    python = str(HOST / ".venv" / "bin" / "python")
    _run(
        ["uv", "pip", "install", "--offline", "--quiet", "--python", python, xdist], HOST, _uv_env()
    )


def link_engine() -> list[Path]:
    """Link every file of `engine/` into the host at its own path; return the test files."""
    for path in HOST.rglob("*.py"):
        if path.is_symlink() and ENGINE in Path(os.readlink(path)).parents:
            path.unlink()  # an engine file since moved or removed
    tests = []
    for source in _files(ENGINE):
        rel = source.relative_to(ENGINE)
        target = HOST / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        target.symlink_to(source)
        if "tests" in rel.parts and rel.name.startswith("test_"):
            tests.append(rel)
    return tests


def main() -> int:
    no_pg = os.environ.get("ENGINE_CHECK_NO_PG") == "1"
    if not no_pg:
        _run(["bash", "scripts/services.sh"], REPO)
    build_host()
    install_xdist()
    tests = link_engine()
    env = _uv_env()
    config = str(HOST / "pyproject.toml")
    _run(["uv", "run", "--quiet", "ruff", "check", "--config", config, str(ENGINE)], HOST, env)
    _run(
        ["uv", "run", "--quiet", "ruff", "format", "--check", "--config", config, str(ENGINE)],
        HOST,
        env,
    )
    _run(["make", "-s", "typecheck"], HOST, env)
    if not no_pg:
        # The host's fixtures create its test roles when absent; once, before the workers
        # of the parallel run would race to.
        probe = "om/tests/integration/test_work_privileges_postgres.py"
        _run(["uv", "run", "--quiet", "pytest", "-q", "--setup-only", probe], HOST, env, quiet=True)
    # The first worker's own tests (the second is there for its kind; its tests are alike).
    worker_tests = [(HOST / "workers" / WORKER["worker_name"] / "tests").relative_to(HOST)]
    selection = ["-m", "not integration"] if no_pg else []
    extra = shlex.split(os.environ.get("ENGINE_CHECK_ARGS", ""))
    _run(
        [
            "uv",
            "run",
            "--quiet",
            "pytest",
            "-q",
            "-n",
            "auto",
            # A file's tests share one process: the worker-process tests run one at a time.
            "--dist",
            "loadfile",
            *selection,
            *extra,
            *map(str, tests),
            *map(str, worker_tests),
        ],
        HOST,
        env,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
