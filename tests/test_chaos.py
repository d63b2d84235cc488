"""The chaos harness's own parts (scripts/chaos.py): what decides its verdict must catch the
violations it exists to find, and its half-open proxy must be half-open.

The whole harness runs in `make test` after pytest (its 1,000-item smoke, alone on the
machine since its bounds are timings); these tests only hold the pieces it trusts.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def _chaos() -> ModuleType:
    key = "_worker_template_tests_chaos"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, REPO / "scripts" / "chaos.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]


chaos = _chaos()
ITEM = uuid.uuid4()
A, B = uuid.uuid4(), uuid.uuid4()


def _change(old: str, new: str, old_token: Any, new_token: Any, at: float) -> dict[str, Any]:
    return {
        "item_id": ITEM,
        "old_status": old,
        "new_status": new,
        "old_token": old_token,
        "new_token": new_token,
        "at": at,
    }


def _run(token: Any, pid: int, started: float, ended: float | None) -> dict[str, Any]:
    return {"item_id": ITEM, "claim_token": token, "pid": pid, "started": started, "ended": ended}


def test_a_second_completion_is_seen() -> None:
    transitions = [
        _change("AVAILABLE", "CLAIMED", None, A, 1.0),
        _change("CLAIMED", "COMPLETED", A, None, 2.0),
        _change("COMPLETED", "CLAIMED", None, B, 3.0),
        _change("CLAIMED", "COMPLETED", B, None, 4.0),
    ]
    assert chaos.changes_to("COMPLETED", transitions) == {ITEM: [A, B]}
    assert chaos.changes_to("FAILED", transitions) == {}


def test_an_exit_s_cause_is_the_last_line_its_process_logged() -> None:
    traceback = (
        "2026-01-01 00:00:00,000 INFO    acme.infra.boot: booted shipment-notifier\n"
        "Traceback (most recent call last):\n"
        '  File "server.py", line 1, in serve\n'
        "asyncpg.exceptions.CannotConnectNowError: the database system is starting up\n\n"
    )
    assert chaos.exit_cause(traceback) == (
        "asyncpg.exceptions.CannotConnectNowError: the database system is starting up"
    )
    refusal = "shipment-notifier: the database was unavailable for 300 s, past ...\n"
    assert chaos.exit_cause(refusal) == refusal.strip()
    assert chaos.exit_cause("") == "(empty log)"
    assert len(chaos.exit_cause("x" * 1000)) == 300


def test_an_execution_killed_mid_run_ends_at_the_kill_and_overlaps_nothing() -> None:
    # A is claimed at 1, its process killed at 3; the sweep hands it back at 9; B runs 10-11.
    transitions = [
        _change("AVAILABLE", "CLAIMED", None, A, 1.0),
        _change("CLAIMED", "AVAILABLE", A, None, 9.0),
        _change("AVAILABLE", "CLAIMED", None, B, 10.0),
        _change("CLAIMED", "COMPLETED", B, None, 11.5),
    ]
    ledger = [_run(A, 100, 1.1, None), _run(B, 200, 10.1, 11.0)]
    runs = chaos.executions(ledger, transitions, {100: 3.0})
    assert runs[ITEM] == [(1.1, 3.0, 100), (10.1, 11.0, 200)]
    assert chaos.overlapping(runs) == []


def test_an_execution_that_raised_ends_when_its_failure_is_written() -> None:
    transitions = [
        _change("AVAILABLE", "CLAIMED", None, A, 1.0),
        _change("CLAIMED", "AVAILABLE", A, None, 2.0),  # the failure, requeued with backoff
        _change("AVAILABLE", "CLAIMED", None, B, 4.0),
    ]
    ledger = [_run(A, 100, 1.1, None), _run(B, 100, 4.1, 4.5)]
    runs = chaos.executions(ledger, transitions, {})
    assert runs[ITEM][0] == (1.1, 2.0, 100)
    assert chaos.overlapping(runs) == []


def _blocked_loop_overlaps() -> list[dict[str, Any]]:
    """The blocked loop: A's lease passes while process 100 sleeps in it (A started at 1.1),
    B runs the item in process 200 at 7.6, A returns at 12."""
    transitions = [
        _change("AVAILABLE", "CLAIMED", None, A, 1.0),
        _change("CLAIMED", "AVAILABLE", A, None, 7.0),
        _change("AVAILABLE", "CLAIMED", None, B, 7.5),
        _change("CLAIMED", "COMPLETED", B, None, 8.0),
    ]
    ledger = [_run(A, 100, 1.1, 12.0), _run(B, 200, 7.6, 7.9)]
    return chaos.overlapping(chaos.executions(ledger, transitions, {}))


def test_a_run_still_inside_its_handler_when_the_next_starts_is_an_overlap() -> None:
    found = _blocked_loop_overlaps()
    assert len(found) == 1
    assert found[0]["overlap_s"] == pytest.approx(0.3)


def test_an_execution_that_never_ended_overlaps_every_later_one() -> None:
    ledger = [_run(A, 100, 1.0, None), _run(B, 200, 50.0, 51.0)]
    found = chaos.overlapping(chaos.executions(ledger, [], {}))
    assert [f["second"][2] for f in found] == [200]


def test_the_proxy_silences_open_connections_and_lets_new_ones_through() -> None:
    async def scenario() -> None:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
            writer.close()

        upstream = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = upstream.sockets[0].getsockname()[1]
        proxy = chaos.SilencingProxy(port, chaos.free_port())
        await proxy.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.read(4), 2) == b"ping"
            assert proxy.silence() == 1
            writer.write(b"ping")
            await writer.drain()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(reader.read(4), 0.5)
            assert not reader.at_eof()  # open, and silent: half-open
            fresh_reader, fresh_writer = await asyncio.open_connection("127.0.0.1", proxy.port)
            fresh_writer.write(b"pong")
            assert await asyncio.wait_for(fresh_reader.read(4), 2) == b"pong"
            writer.close()
            fresh_writer.close()
        finally:
            await proxy.close()
            upstream.close()

    asyncio.run(scenario())


def _soak_samples(minutes: int, pg_at_last: int) -> list[dict[str, Any]]:
    """Every 30 s, per worker: flat figures, but worker 0's pool at `pg_at_last`
    connections (and as many more fds) through the last minute."""
    samples = []
    for step in range(minutes * 2):
        t = step * 30.0 + 1
        for slot in range(chaos.SLOTS):
            pg = pg_at_last if slot == 0 and t / 60 >= minutes - 1 else 10
            samples.append(
                {"t": t, "slot": slot, "pid": 100 + slot, "rss_mb": 100.0, "fds": 8 + pg}
                | {"pg_connections": pg, "redis_connections": 2, "tasks": 6.0}
            )
    return samples


def _latency(minutes: int, late_p95_ms: float) -> dict[int, dict[str, float]]:
    return {
        m: {"p50_ms": 15.0, "p95_ms": 40.0 if m <= minutes - 5 else late_p95_ms}
        | {"p99_ms": 60.0, "claims": 6000}
        for m in range(1, minutes + 1)
    }


def _burst(pg_peak: int) -> list[dict[str, Any]]:
    return [
        {"t": 0.0, "slot": slot, "pid": 100 + slot, "rss_mb": 100.0, "fds": 8 + pg_peak}
        | {"pg_connections": pg_peak, "redis_connections": 2, "tasks": 16.0}
        for slot in range(chaos.SLOTS)
    ]


@pytest.mark.parametrize(
    ("burst_peak", "late_p95_ms", "failures"),
    [
        (17, 40.0, []),  # the pool kept what the burst opened: no growth
        (12, 40.0, ["fds grew", "pg_connections grew"]),  # past the burst's peak: growth
        (17, 400.0, ["claim latency p95 grew"]),  # claims slower at the end
    ],
)
def test_the_soak_tells_a_pool_that_filled_from_a_leak_and_sees_latency_grow(
    tmp_path: Path, burst_peak: int, late_p95_ms: float, failures: list[str]
) -> None:
    fleet = chaos.Fleet(tmp_path, {}, tmp_path)
    report = chaos._soak_report(
        _soak_samples(10, 17),
        _burst(burst_peak),
        [],
        _latency(10, late_p95_ms),
        fleet,
        200.0,
        100.0,
        10,
    )
    assert report["ok"] is (not failures)
    assert len(report["failures"]) == len(failures)
    for failure, expected in zip(report["failures"], failures, strict=True):
        assert expected in failure


def test_an_overlap_of_an_item_in_flight_when_the_loop_blocked_is_the_faults_own() -> None:
    # Process 100's loop blocks at 1.2 while it runs A (started 1.1, the blocked item's
    # neighbour): A cannot renew its lease, B runs it elsewhere at 7.6. The same overlap in
    # another process, or one that started after the block began, is not the fault's.
    (found,) = _blocked_loop_overlaps()
    assert chaos.in_blocked_loop(found, [(100, 1.2)])
    assert not chaos.in_blocked_loop(found, [(300, 1.2)])  # another process blocked
    assert not chaos.in_blocked_loop(found, [(100, 0.5)])  # blocked before A started
    assert not chaos.in_blocked_loop(found, [])
