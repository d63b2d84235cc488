"""The reference host's `make dev` (scripts/dev.sh): it stops every process it started, and
what they started, whichever way it ends (a failed start, SIGTERM to `make`), so that
the next `make dev` finds its ports free (docs/host-contract.md, `scripts/dev.sh`).

The processes are small Python programs that record their pids; "gone" is checked by pid
in /proc (a zombie that only waits for its reaping counts as gone).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REFERENCE_HOST = REPO / "tests" / "fixtures" / "reference-host"

PROCESS = """\
import os, signal, socket, subprocess, sys, time
from pathlib import Path

name, mode = sys.argv[1], sys.argv[2]
pids = Path(os.environ["DEV_TEST_PIDS"])
if mode == "ignores-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "with-child":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    (pids / f"{name}-child").write_text(str(child.pid))
if mode.startswith("binds:"):
    while len(list(pids.iterdir())) < int(os.environ["DEV_TEST_WAIT_FOR"]):
        time.sleep(0.05)
    socket.socket().bind(("127.0.0.1", int(mode.split(":")[1])))  # taken: exits 1
(pids / name).write_text(str(os.getpid()))
print("ready", flush=True)
time.sleep(300)
"""


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def _pids(folder: Path) -> dict[str, int]:
    return {path.name: int(path.read_text()) for path in folder.iterdir() if path.read_text()}


@pytest.fixture
def pids(tmp_path: Path) -> Iterator[Path]:
    """The folder the processes record their pids in; whatever is left is killed after."""
    folder = tmp_path / "pids"
    folder.mkdir()
    yield folder
    for pid in _pids(folder).values():
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


def _host(tmp_path: Path, *lines: str) -> Path:
    """The reference host's Makefile and scripts/dev.sh, with `lines` as its processes."""
    host = tmp_path / "host"
    (host / "scripts").mkdir(parents=True)
    shutil.copyfile(REFERENCE_HOST / "Makefile", host / "Makefile")
    dev = (REFERENCE_HOST / "scripts" / "dev.sh").read_text()
    head, _, rest = dev.partition("# >>> processes\n")
    _, _, tail = rest.partition("# <<< processes\n")
    runs = "".join(f"{line}\n" for line in lines)
    (host / "scripts" / "dev.sh").write_text(
        f"{head}# >>> processes\n{runs}# <<< processes\n{tail}"
    )
    (host / "process.py").write_text(PROCESS)
    return host


def _run(name: str, mode: str) -> str:
    return f"run {name} {sys.executable} process.py {name} {mode}"


def _wait_for(folder: Path, count: int, deadline_s: float = 20.0) -> dict[str, int]:
    deadline = time.monotonic() + deadline_s
    while len(found := _pids(folder)) < count:
        assert time.monotonic() < deadline, f"only {sorted(found)} started"
        time.sleep(0.05)
    return found


def _all_gone(found: dict[str, int], within_s: float) -> list[str]:
    """The names whose process is still running after `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while (left := [name for name, pid in found.items() if not _gone(pid)]) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    return left


def test_a_process_that_fails_to_start_stops_every_other(tmp_path: Path, pids: Path) -> None:
    """The worker's port is taken: it exits 1, and the API and its child go with it."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        host = _host(tmp_path, _run("api", "with-child"), _run("worker", f"binds:{port}"))
        env = {**os.environ, "DEV_TEST_PIDS": str(pids), "DEV_TEST_WAIT_FOR": "2"}

        done = subprocess.run(
            ["bash", "scripts/dev.sh"],
            check=False,
            cwd=host,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert done.returncode == 1, done.stderr
    assert "Address already in use" in done.stdout
    found = _pids(pids)
    assert set(found) == {"api", "api-child"}
    assert _all_gone(found, within_s=5) == []


def test_sigterm_to_make_stops_every_process_and_kills_one_that_ignores_it(
    tmp_path: Path, pids: Path
) -> None:
    host = _host(
        tmp_path,
        _run("api", "with-child"),
        _run("worker", "serves"),
        _run("stubborn", "ignores-term"),
    )
    env = {**os.environ, "DEV_TEST_PIDS": str(pids), "DEV_STOP_GRACE_S": "2"}
    make = subprocess.Popen(
        ["make", "dev"], cwd=host, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        found = _wait_for(pids, 4)
        make.send_signal(signal.SIGTERM)
        _, err = make.communicate(timeout=30)
    finally:
        if make.poll() is None:
            make.kill()

    assert _all_gone(found, within_s=5) == []
    assert b"still running after 2 s (DEV_STOP_GRACE_S): SIGKILL" in err


def test_a_second_signal_during_the_stop_does_not_cut_it_short(tmp_path: Path, pids: Path) -> None:
    """Ctrl-C twice, or make passing on a TERM its group also got: the stop still waits its
    grace and SIGKILLs what ignores SIGTERM."""
    host = _host(tmp_path, _run("api", "serves"), _run("stubborn", "ignores-term"))
    env = {**os.environ, "DEV_TEST_PIDS": str(pids), "DEV_STOP_GRACE_S": "2"}
    dev = subprocess.Popen(
        ["bash", "scripts/dev.sh"],
        cwd=host,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        found = _wait_for(pids, 2)
        os.killpg(dev.pid, signal.SIGTERM)
        time.sleep(0.5)  # inside the stop's grace
        os.killpg(dev.pid, signal.SIGTERM)
        _, err = dev.communicate(timeout=30)
    finally:
        if dev.poll() is None:
            dev.kill()

    assert _all_gone(found, within_s=5) == []
    assert b"still running after 2 s (DEV_STOP_GRACE_S): SIGKILL" in err
