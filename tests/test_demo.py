"""`make demo` (scripts/demo.py) stops everything it started, however it is stopped, and
refuses a port already taken instead of taking a left-over process's health checks as its
own (a fresh-user trial left an API and a worker running after a SIGTERM, and the next
`--serve` run then printed 200/200 and exited 0 with its own processes dead)."""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO
from work_network import free_port

pytestmark = pytest.mark.slow
DEMO = REPO / "scripts" / "demo.py"


def _demo(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(DEMO), "--backend", "embedded", "--count", "5", *args],
        cwd=REPO,
        env={**os.environ, "DEMO_DIR": str(tmp_path / "demo")},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_a_port_left_in_time_wait_is_free_and_a_listened_one_is_not() -> None:
    """The last demo's closed connections leave its ports in TIME_WAIT for a minute: a
    back-to-back run was refused for it (a fresh-user trial) until the probe bound with
    SO_REUSEADDR, as the servers do."""
    sys.path.insert(0, str(REPO / "scripts"))
    demo = importlib.import_module("demo")
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as every server does
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert demo.port_in_use(port)
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server closes first: its side of the port in TIME_WAIT
            client.recv(1)
    assert not demo.port_in_use(port)


def test_a_port_in_use_is_refused_in_one_line_before_anything_is_written(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        demo = _demo(tmp_path, "--metrics-port", str(port))
        output, _ = demo.communicate(timeout=60)
    assert demo.returncode != 0
    assert output.strip().splitlines()[-1] == (
        f"demo: port {port} on 127.0.0.1 is in use (a demo, worker or API left running? "
        "stop it, or choose another with --metrics-port or DEMO_PORT)"
    )
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])
def test_a_serving_demo_stopped_by_a_signal_stops_its_worker_and_api(
    tmp_path: Path, stop: signal.Signals
) -> None:
    metrics, api = free_port(), free_port()
    demo = _demo(tmp_path, "--serve", "--metrics-port", str(metrics), "--api-port", str(api))
    assert demo.stdout is not None
    seen = []
    try:
        for line in demo.stdout:
            seen.append(line)
            if "dashboard  http://" in line:
                break
        assert _listening(metrics) and _listening(api), "".join(seen)
        demo.send_signal(stop)
        output, _ = demo.communicate(timeout=90)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert "stopping the API with SIGTERM" in output
    assert "stopping shipment-notifier with SIGTERM (drain)" in output
    deadline = time.monotonic() + 10
    while (_listening(metrics) or _listening(api)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _listening(metrics) and not _listening(api), "a process of the demo left running"
