"""Stranded items (issue 29, items 1 and 9; docs/operations.md, "Stranded items").

One host, one worker, the embedded database, a real `serve`:

- an item enqueued before `copier update -d lane=bulk` waits on `default`; the update names
  the command that moves it, `serve` reports it at start and in its `queue stats` line
  (`stranded=1`), and `items move` gets it processed;
- a `BOGUS_KIND` row (a kind no worker declares) shows in `items list --any-kind`, in the
  stats line and in the log within one sweep interval, and `items discard` removes it.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import commit_all, copy_host, copy_template, uv_sync
from test_fragment_update import update
from work_network import free_port

NAME = "shipment-notifier"
KIND = "NOTIFY_SHIPMENT"
SWEEP_INTERVAL_S = 1.0
EMBEDDED_DB = ".local/acme.sqlite3"


@pytest.fixture
def worker_env(uv_env: dict[str, str]) -> dict[str, str]:
    """Embedded (no database or Redis URL), text logs, a sweep every second."""
    env = {k: v for k, v in uv_env.items() if not k.startswith(("ACME_", "SHIPMENT_NOTIFIER_"))}
    return env | {
        "UV_OFFLINE": "1",
        "SHIPMENT_NOTIFIER_SWEEP_INTERVAL": str(SWEEP_INTERVAL_S),
        "SHIPMENT_NOTIFIER_POLL_INTERVAL": "0.5",
        "SHIPMENT_NOTIFIER_METRICS_HOST": "127.0.0.1",
        "SHIPMENT_NOTIFIER_METRICS_PORT": str(free_port()),
    }


def _cli(host: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["uv", "run", "--all-packages", "--offline", NAME, *args],
        cwd=host,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


class _Serve:
    """`<worker> serve` in its own session, its log in a file read as it grows."""

    def __init__(self, host: Path, env: dict[str, str], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            ["uv", "run", "--all-packages", "--offline", NAME, "serve"],
            cwd=host,
            env=env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, *, after: int = 0, timeout_s: float = 60.0) -> re.Match[str]:
        """The first match of `pattern` in the log past character `after`, waiting for it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = re.compile(pattern, re.MULTILINE).search(self.text(), after)
            if found:
                return found
            assert self.proc.poll() is None, self.text()[-4000:]
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} within {timeout_s} s:\n{self.text()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[list[_Serve]]:
    started: list[_Serve] = []
    yield started
    for serve in started:
        serve.stop()


def _store_bogus_row(host: Path, like: str) -> str:
    """A copy of the row `like` (an item id as the CLI prints it) under a new id, of kind
    `BOGUS_KIND`: a row an older release or a hand-written INSERT left. Its new id."""
    with sqlite3.connect(host / EMBEDDED_DB) as db:
        db.row_factory = sqlite3.Row
        rows = [dict(r) for r in db.execute("SELECT * FROM work_items")]
        (row,) = [r for r in rows if str(r["id"]).replace("-", "") == like.replace("-", "")]
        new = uuid.uuid4()
        row["id"] = new.hex if len(str(row["id"])) == 32 else str(new)
        row.update(kind="BOGUS_KIND", status="AVAILABLE", idempotency_key=None)
        names = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        db.execute(f"INSERT INTO work_items ({names}) VALUES ({marks})", list(row.values()))
    return str(new)


def test_items_a_lane_change_or_an_unknown_kind_strand_are_reported_moved_and_discarded(
    template_repo: Path,
    tmp_path: Path,
    worker_env: dict[str, str],
    serving: list[_Serve],
    capfd: pytest.CaptureFixture[str],
) -> None:
    host = copy_host(tmp_path / "host")
    copy_template(template_repo, host, "v0.0.1", worker_name=NAME, work_kind=KIND)
    commit_all(host, f"add {NAME}")
    synced = uv_sync(host, worker_env)
    assert synced.returncode == 0, synced.stderr
    commit_all(host, "lock")  # copier updates only a clean tree
    payload = f'{{"record_id": "{uuid.uuid4()}"}}'
    enqueued = _cli(host, worker_env, "enqueue", "--create-tenant", "demo", "--payload", payload)
    org = enqueued.stdout.split("\t")[1]
    item_id = enqueued.stdout.splitlines()[-1].split()[1].split("\t")[0]
    capfd.readouterr()

    update(host, NAME, "v0.0.2", lane="bulk")
    commit_all(host, f"{NAME} on lane bulk")
    said = capfd.readouterr().err
    assert "items move --from-lane default --dry-run" in said, said
    assert "the lane moved from default to bulk" in said

    # serve reports the item at start (its first sweep pass runs at once) and in its line
    serve = _Serve(host, worker_env, tmp_path / "serve.log")
    serving.append(serve)
    serve.wait_for(
        rf"stranded items, waiting where no worker claims them: {KIND} on default: 1 "
        r"\(its workers claim on bulk\)"
    )
    serve.wait_for(r"queue stats lane=bulk .* stranded=1$")

    # an unknown kind's row: listed, counted and named within one sweep interval
    bogus = _store_bogus_row(host, item_id)
    stored_at, mark = time.monotonic(), len(serve.text())
    serve.wait_for(r"queue stats lane=bulk .* stranded=2$", after=mark)
    within_s = time.monotonic() - stored_at
    assert within_s <= SWEEP_INTERVAL_S + 2.0, within_s
    assert "BOGUS_KIND on default: 1 (no worker declares this kind)" in serve.text()[mark:]
    listed = _cli(host, worker_env, "items", "list", "--any-kind").stdout.splitlines()
    columns = {line.split("\t")[0].replace("-", ""): line.split("\t") for line in listed}
    assert columns[bogus.replace("-", "")][2:5] == ["AVAILABLE", "BOGUS_KIND", "default"]
    assert columns[item_id.replace("-", "")][2:5] == ["AVAILABLE", KIND, "default"]

    # the move gets the item processed by the running worker; the discard removes the row
    moved = _cli(host, worker_env, "items", "move", "--from-lane", "default")
    assert moved.stdout.startswith(f"moved      {item_id}\t{org}\t{KIND}\tdefault\tbulk")
    deadline = time.monotonic() + 30
    done = ""
    while not done and time.monotonic() < deadline:
        done = _cli(host, worker_env, "items", "list", "--status", "COMPLETED").stdout
        time.sleep(0.2)
    assert done.startswith(f"{item_id}\t{org}\tCOMPLETED\t{KIND}\tbulk\t"), done
    _cli(host, worker_env, "items", "discard", bogus, "--org", org)
    mark = len(serve.text())
    serve.wait_for(r"queue stats lane=bulk .* stranded=0$", after=mark)
    listed = _cli(host, worker_env, "items", "list", "--any-kind").stdout
    assert bogus not in listed and f"{item_id}\t" in listed
