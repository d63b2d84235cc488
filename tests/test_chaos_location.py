"""Where the chaos harness (scripts/chaos.py) keeps its private PostgreSQL cluster: never
inside the clone, which may sit where the server's OS user cannot enter.

Run as root (as `make test` often is), the server runs as `postgres`, and pytest's own
temporary folder (`/tmp/pytest-of-root`, mode 700) is such a place: the clone copied into
it is a clone under a closed home folder. Run as another user, the server runs as that
user and the same tests hold.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import asyncpg
import pytest

REPO = Path(__file__).resolve().parents[1]


def _clone_under_a_closed_folder(tmp_path: Path) -> tuple[Path, ModuleType]:
    """The harness's scripts copied into `<tmp_path>/closed/clone` (`closed` of mode 700),
    and its module imported from there, so that its clone is that folder."""
    closed = tmp_path / "closed"
    scripts = closed / "clone" / "scripts"
    scripts.mkdir(parents=True)
    closed.chmod(0o700)
    for name in ("chaos.py", "demo.py"):
        shutil.copyfile(REPO / "scripts" / name, scripts / name)
    key = f"_chaos_location_{tmp_path.name}"
    spec = importlib.util.spec_from_file_location(key, scripts / "chaos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return scripts.parent, module


async def _answers(url: str) -> int:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        return int(await conn.fetchval("SELECT 1"))
    finally:
        await conn.close()


def test_the_cluster_runs_from_a_clone_its_server_user_cannot_enter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    clone, chaos = _clone_under_a_closed_folder(tmp_path)
    monkeypatch.chdir(clone)  # as `make chaos` runs: the server's tools start from here
    run = chaos.ChaosRun(argparse.Namespace(seed=1), clone / ".chaos" / "run-test")
    legacy = clone / ".chaos" / "pg"  # where an earlier release kept it, left behind
    try:
        run.pg.init()
        run.pg.start()
        assert asyncio.run(_answers(run.pg.url(database="postgres"))) == 1
        (legacy / "data").mkdir(parents=True)
        chaos.remove_leftovers()
    finally:
        run.teardown()

    assert "could not change directory" not in capfd.readouterr().err
    assert clone not in run.pg.root.parents
    assert not run.pg.root.exists()  # the teardown removed it
    assert not legacy.exists()


def test_a_temporary_folder_the_server_cannot_use_is_refused_before_anything_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`TMPDIR` closed to the server's user (root: under pytest's mode-700 folder) or not
    writable at all (another user: mode 500): one line naming TMPDIR, nothing left."""
    clone, chaos = _clone_under_a_closed_folder(tmp_path)
    closed_tmp = tmp_path / "tmp"
    closed_tmp.mkdir(mode=0o500)
    monkeypatch.setattr(tempfile, "tempdir", str(closed_tmp))

    with pytest.raises(SystemExit) as refused:
        chaos.ChaosRun(argparse.Namespace(seed=1), clone / ".chaos" / "run-test")

    line = str(refused.value.code)
    assert line.startswith("chaos: ")
    assert "set TMPDIR to a " in line
    assert "\n" not in line
    assert list(closed_tmp.iterdir()) == []
    assert not (clone / ".chaos").exists()
