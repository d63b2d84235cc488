"""The console command: its refusals at start (one line naming what to change), and the
operator surface: no write it was not asked for, and every write names who asked."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import io
import json
import logging
import os
import re
import socket
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import TypeVar, cast
from uuid import UUID, uuid4

import httpx
import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.engine import make_url
from work_fixtures import store_row, stored_row
from work_network import free_port

from acme.infra.cache import CacheScope
from acme.infra.container import Infra
from acme.infra.topics import WorkAvailablePayload
from acme.om.audit import AuditEntry
from acme.om.context import RequestContext
from acme.om.types import EMPTY_UUID
from acme.om.work.impl.operator_commands import LANE_SUBJECT_TYPE, lane_subject_id
from acme.om.work.types.lanes import LanePause, QueueSummary
from acme.om.work.types.work_item import WorkItem, WorkStatus
from acme.workers.runtime import API_VERSION, OWNER
from acme.workers.runtime.commands import ENQUEUED_ACTION
from acme.workers.runtime.container import RuntimeContainer
from acme.workers.runtime.entry import GC_YOUNG_THRESHOLD, console
from acme.workers.runtime.errors import escape_log_output
from acme.workers.runtime.server import _bind, _describe, _warn_unanswered_redis, create_app
from acme.workers.runtime.settings import INFRA_PREFIX
from acme.workers.runtime.state import LoopState, liveness_key
from acme.workers.runtime.testing import (
    APP,
    PROBE,
    PROBE_KIND,
    LoopFactory,
    ProbeContainer,
    ProbeSettings,
    sample_payload,
)

ENV_PREFIX = ProbeSettings.env_prefix()
KIND = PROBE_KIND
EMBEDDED_DATABASE = Path(".local/acme.sqlite3")


def _in_a_host(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make `root` a host root (a `pyproject.toml` declaring the uv workspace), where the
    embedded database lives, and run from it; returns `root`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text('[tool.uv.workspace]\nmembers = ["workers/*"]\n')
    monkeypatch.chdir(root)
    return root


def test_every_command_uses_the_host_roots_embedded_database_wherever_it_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run from the host root or from a worker's folder (a member with a `pyproject.toml` of
    its own), a command opens the one file at the host root, and says which."""
    monkeypatch.delenv(f"{INFRA_PREFIX}DATABASE_URL", raising=False)
    host = _in_a_host(tmp_path / "host", monkeypatch)
    member = host / "workers" / "probe"
    member.mkdir(parents=True)
    (member / "pyproject.toml").write_text('[project]\nname = "probe"\nversion = "0"\n')
    payload = json.dumps(sample_payload())

    console(PROBE, ["enqueue", "--create-tenant", "demo", "--payload", payload])
    org_id = capsys.readouterr().out.split("\t")[1]
    monkeypatch.chdir(member)
    console(PROBE, ["tenants"])

    out, err = capsys.readouterr()
    assert out.split() == [org_id]
    assert f"{PROBE.name}: embedded: SQLite {host.resolve() / EMBEDDED_DATABASE}\n" in err
    assert not (member / ".local").exists()


def test_run_from_outside_the_host_by_its_virtualenv_a_command_uses_the_hosts_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`uv run --project <host> ...` from a folder outside it (cron, a systemd unit): the
    host is the one whose `.venv` runs the command."""
    monkeypatch.delenv(f"{INFRA_PREFIX}DATABASE_URL", raising=False)
    host = _in_a_host(tmp_path / "host", monkeypatch)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "prefix", str(host / ".venv"))

    console(PROBE, ["tenants"])

    err = capsys.readouterr().err
    assert f"{PROBE.name}: embedded: SQLite {host.resolve() / EMBEDDED_DATABASE}\n" in err
    assert list(elsewhere.iterdir()) == []


def test_an_embedded_file_left_in_the_working_folder_is_named_as_not_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file an earlier release made in `workers/<name>` (its path was relative then):
    every command says it is not read, and how to see what it holds."""
    monkeypatch.delenv(f"{INFRA_PREFIX}DATABASE_URL", raising=False)
    host = _in_a_host(tmp_path / "host", monkeypatch)
    member = host / "workers" / "probe"
    (member / EMBEDDED_DATABASE).parent.mkdir(parents=True)
    (member / EMBEDDED_DATABASE).touch()
    monkeypatch.chdir(member)

    console(PROBE, ["tenants"])

    stray = member.resolve() / EMBEDDED_DATABASE
    lines = capsys.readouterr().err.splitlines()
    assert f"{PROBE.name}: {stray} is not read: the embedded database is " in lines[0]
    assert f"{INFRA_PREFIX}DATABASE_URL=sqlite:///{stray}" in lines[0]


def test_an_embedded_file_whose_rows_do_not_fit_this_release_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A file an earlier release made whose rows the rebuilt table cannot take (here a
    table missing columns this one needs): one line naming the file to delete, file kept."""
    monkeypatch.delenv(f"{INFRA_PREFIX}DATABASE_URL", raising=False)
    host = _in_a_host(tmp_path / "host", monkeypatch)
    embedded = host.resolve() / EMBEDDED_DATABASE
    embedded.parent.mkdir(parents=True)
    with sqlite3.connect(embedded) as connection:
        connection.execute("CREATE TABLE work_items (id CHAR(32) PRIMARY KEY, status TEXT)")
        connection.execute("INSERT INTO work_items VALUES ('a', 'AVAILABLE')")
    connection.close()

    with pytest.raises(SystemExit) as refused:
        console(PROBE, ["tenants"])

    line = str(refused.value.code)
    assert line.startswith(f"{PROBE.name}: the embedded database {embedded} was made by ")
    assert line.endswith(f"delete {embedded} (it holds local data only)")
    assert "\n" not in line
    with sqlite3.connect(embedded) as connection:
        assert connection.execute("SELECT id FROM work_items").fetchall() == [("a",)]
    connection.close()


@pytest.mark.parametrize("argv", [["tenants"], ["serve"]])
def test_outside_any_host_a_command_refuses_in_one_line_and_creates_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str]
) -> None:
    monkeypatch.delenv(f"{INFRA_PREFIX}DATABASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))  # nor a host's virtualenv

    with pytest.raises(SystemExit) as refused:
        console(PROBE, argv)

    line = str(refused.value.code)
    assert line.startswith(f"{PROBE.name}: no host root at or above {tmp_path.resolve()} ")
    assert "[tool.uv.workspace]" in line
    assert f"set {INFRA_PREFIX}DATABASE_URL" in line
    assert "\n" not in line
    assert list(tmp_path.iterdir()) == []


def test_serve_refuses_a_metrics_port_another_process_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        monkeypatch.setenv(f"{ENV_PREFIX}METRICS_HOST", "127.0.0.1")
        monkeypatch.setenv(f"{ENV_PREFIX}METRICS_PORT", str(port))

        with pytest.raises(SystemExit) as refused:
            console(PROBE, ["serve"])

    message = str(refused.value.code)
    assert message.startswith(f"{PROBE.name}: cannot serve /metrics on 127.0.0.1:")
    assert f":{port} (" in message
    assert message.endswith(f"set {ENV_PREFIX}METRICS_PORT to a free port")


@pytest.mark.parametrize(
    ("payload", "refusal"),
    [
        ("not json", "payload: Invalid JSON"),
        ("[1, 2]", "payload: Input should be an object"),
    ],
)
def test_enqueue_refuses_a_bad_payload_before_it_touches_the_database(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    payload: str,
    refusal: str,
) -> None:
    monkeypatch.delenv(f"{INFRA_PREFIX}DATABASE_URL", raising=False)
    _in_a_host(tmp_path, monkeypatch)  # embedded: the SQLite file would be .local/...

    with pytest.raises(SystemExit) as refused:
        console(PROBE, ["enqueue", "--create-tenant", "demo", "--payload", payload])

    assert refused.value.code == 2
    # the last line: the first `boot` of an xdist worker process logs `booted` before it
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"{PROBE.name}: Invalid: {refusal}")
    assert not (tmp_path / ".local").exists()  # no database, so no demo tenant either


def test_a_capacity_the_pool_cannot_serve_stops_serve_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A capacity in `.env` that the pool cannot serve refuses `serve` in one line, and an
    operator's `tenants` still runs (it runs no loop)."""
    monkeypatch.delenv(f"{INFRA_PREFIX}DATABASE_URL", raising=False)
    _in_a_host(tmp_path, monkeypatch)
    monkeypatch.setenv(f"{ENV_PREFIX}CAPACITY", "25")
    monkeypatch.setenv(f"{ENV_PREFIX}DATABASE_POOL_SIZE", "15")

    with pytest.raises(SystemExit) as refused:
        console(PROBE, ["serve"])
    assert str(refused.value.code).startswith(
        f"{PROBE.name}: invalid settings: capacity 25 needs a database pool of at least"
    )

    console(PROBE, ["tenants"])
    assert "invalid settings" not in capsys.readouterr().err


def test_the_console_command_raises_the_collectors_young_threshold_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command owns its process: the cyclic collector's youngest generation runs every
    `GC_YOUNG_THRESHOLD` allocations, the older generations keep their thresholds."""
    monkeypatch.delenv(f"{INFRA_PREFIX}DATABASE_URL", raising=False)
    _in_a_host(tmp_path, monkeypatch)
    before = gc.get_threshold()
    gc.set_threshold(700, 9, 8)
    try:
        console(PROBE, ["items", "list"])
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, 9, 8)
    finally:
        gc.set_threshold(*before)
    capsys.readouterr()


def test_a_list_that_finds_nothing_says_so_on_stderr(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty queue: stdout stays empty (it carries rows only), stderr says why."""
    monkeypatch.delenv(f"{INFRA_PREFIX}DATABASE_URL", raising=False)
    _in_a_host(tmp_path, monkeypatch)

    console(PROBE, ["items", "list"])
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines()[-1].startswith(f"no items of kind {KIND} in ")
    console(PROBE, ["dead-letters", "list"])
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines()[-1].startswith(f"no dead letters of kind {KIND} in ")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        *(("--count", count) for count in ("0", "-1", "two", "10001", "99999999999")),
        *(("--priority", priority) for priority in ("11", "-11", "high")),
    ],
)
def test_enqueue_refuses_a_count_or_a_priority_out_of_range(
    capsys: pytest.CaptureFixture[str], option: str, value: str
) -> None:
    with pytest.raises(SystemExit) as refused:
        console(PROBE, ["enqueue", option, value])

    assert refused.value.code == 2
    assert f"argument {'-n/' if option == '--count' else ''}{option}:" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["items", "list"], ["dead-letters", "list"]], ids=" ".join)
@pytest.mark.parametrize("limit", ["0", "-5", "99999999999999999999"])
def test_a_list_refuses_a_limit_it_cannot_serve_before_it_opens_anything(
    capsys: pytest.CaptureFixture[str], argv: list[str], limit: str
) -> None:
    with pytest.raises(SystemExit) as refused:
        console(PROBE, [*argv, "--limit", limit])

    assert refused.value.code == 2
    assert "argument --limit:" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("variable", "value", "refusal"),
    [
        ("DATABASE_URL", "garbage", "DATABASE_URL is not a database URL"),
        ("DATABASE_URL", "mysql://root:secret@db/app", "DATABASE_URL names mysql"),
        ("REDIS_URL", "garbage", "REDIS_URL must start with one of redis://"),
        ("DATABASE_URL", "postgresql+psycopg2://db/app", "DATABASE_URL names the driver psycopg2"),
        ("DATABASE_URL", "postgresql://db/app?sslmode=require", "DATABASE_URL has sslmode"),
        ("DATABASE_URL", "postgres://root:secret@db/app", "DATABASE_URL starts with postgres://"),
        ("DATABASE_URL", "foo://root:secret@db/app", "DATABASE_URL names foo"),
        ("DATABASE_URL", "postgresql://root:secret@db:99999/app", "DATABASE_URL has port 99999"),
        ("DATABASE_URL", "postgresql://root:secret@db:abc/app", "DATABASE_URL is not a database"),
        ("REDIS_URL", "redis://:secret@cache:99999/0", "REDIS_URL has a port that is not one"),
        ("REDIS_URL", "redis://:secret@cache:0/0", "REDIS_URL has port 0"),
        ("DATABASE_URL", "", "DATABASE_URL is set but empty"),
        ("REDIS_URL", " ", "REDIS_URL is set but empty"),
    ],
)
@pytest.mark.parametrize("command", [["serve"], ["items", "list"], ["tenants"]], ids=" ".join)
def test_every_command_refuses_a_url_it_cannot_open_naming_the_variable_not_the_value(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, refusal: str, command: list[str]
) -> None:
    monkeypatch.setenv(f"{INFRA_PREFIX}{variable}", value)

    with pytest.raises(SystemExit) as refused:
        console(PROBE, command)

    message = str(refused.value.code)
    assert message.startswith(f"{PROBE.name}: invalid settings: {INFRA_PREFIX}{refusal}")
    assert "secret" not in message


def test_a_host_setting_the_host_refuses_is_named_by_the_hosts_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The host's `InfraSettings` refuses its own field (a log level it does not know):
    the line names `<HOST>_LOG_LEVEL`, the variable to fix, not the worker's prefix."""
    monkeypatch.setenv(f"{INFRA_PREFIX}LOG_LEVEL", "LOUD")

    with pytest.raises(SystemExit) as refused:
        console(PROBE, ["serve"])

    message = str(refused.value.code)
    assert message.startswith(f"{PROBE.name}: invalid settings: {INFRA_PREFIX}LOG_LEVEL: ")
    assert f"{ENV_PREFIX}LOG_LEVEL" not in message


@pytest.mark.parametrize(
    ("variable", "value", "refusal"),
    [
        ("CAPACITY", "0", "CAPACITY: Input should be greater than or equal to 1"),
        ("CAPACITY", "99", "capacity 99 needs a database pool of at least 104 connections"),
        ("LANE", "Bulk", "LANE: lane must be snake_case"),
        # A duration that is not finite, or would overflow the dates it is added to, is
        # refused at the start (it used to start, then fail every claim or sweep).
        ("LEASE", "inf", "LEASE: Input should be a finite number"),
        ("HEARTBEAT_INTERVAL", "-inf", "HEARTBEAT_INTERVAL: Input should be a finite number"),
        ("LEASE", "1e12", "LEASE: Input should be less than or equal to 315360000"),
        ("RETENTION", "1e20", "RETENTION: Input should be less than or equal to 315360000"),
        ("COMPLETED_RETENTION", "inf", "COMPLETED_RETENTION: Input should be a finite number"),
    ],
)
def test_invalid_settings_are_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, refusal: str
) -> None:
    monkeypatch.setenv(f"{ENV_PREFIX}{variable}", value)

    with pytest.raises(SystemExit) as refused:
        console(PROBE, ["serve"])

    message = str(refused.value.code)
    assert message.startswith(f"{PROBE.name}: invalid settings: ")
    assert "\n" not in message
    assert refusal in message
    assert "Value error, " not in message


def test_a_misspelt_setting_is_refused_naming_the_one_meant_and_another_variable_is_not(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(f"{ENV_PREFIX}CAPACTY", "50")

    with pytest.raises(SystemExit) as refused:
        console(PROBE, ["items", "list", "--limit", "1"])

    assert str(refused.value.code) == (
        f"{PROBE.name}: invalid settings: {ENV_PREFIX}CAPACTY is not a setting; "
        f"did you mean {ENV_PREFIX}CAPACITY?"
    )
    monkeypatch.delenv(f"{ENV_PREFIX}CAPACTY")
    monkeypatch.setenv(f"{ENV_PREFIX}PARTNER_API_TOKEN", "a handler's own")  # like no setting
    assert ProbeSettings.misspelt(os.environ) is None


def test_serve_names_the_host_setting_when_the_metrics_host_does_not_resolve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(f"{ENV_PREFIX}METRICS_HOST", "host.invalid")

    with pytest.raises(SystemExit) as refused:
        console(PROBE, ["serve"])

    message = str(refused.value.code)
    assert message.startswith(f"{PROBE.name}: cannot serve /metrics on host.invalid:")
    assert message.endswith(f"set {ENV_PREFIX}METRICS_HOST to an address of this machine")


def test_an_operator_command_without_its_database_says_so_on_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv(f"{INFRA_PREFIX}DATABASE_URL", f"postgresql://nobody@127.0.0.1:{port}/x")

    with pytest.raises(SystemExit) as refused:
        console(PROBE, ["items", "list"])

    message = str(refused.value.code)
    assert message.startswith(f"{PROBE.name}: the database is unavailable: ")
    assert "\n" not in message


@pytest.mark.parametrize("part", ["database", "username"])
def test_a_database_or_role_that_does_not_exist_is_one_line_too(
    monkeypatch: pytest.MonkeyPatch, pg_url: str, part: str
) -> None:
    base = make_url(pg_url)
    missing = "no_such_thing_here"
    url = base.set(database=missing) if part == "database" else base.set(username=missing)
    monkeypatch.setenv(f"{INFRA_PREFIX}DATABASE_URL", url.render_as_string(hide_password=False))

    with pytest.raises(SystemExit) as refused:
        console(PROBE, ["items", "list"])

    message = str(refused.value.code)
    assert message.startswith(f"{PROBE.name}: the database is unavailable: ")
    assert missing in message
    assert "\n" not in message


def test_serve_refuses_a_database_that_answers_without_the_queues_table(
    monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    """Every claim would fail on it: `serve` says so once, at the start, and exits 1."""
    url = make_url(pg_url).set(database="postgres")
    monkeypatch.setenv(f"{INFRA_PREFIX}DATABASE_URL", url.render_as_string(hide_password=False))
    with socket.socket() as probe:  # a port free now: serve binds it before the check
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv(f"{ENV_PREFIX}METRICS_HOST", "127.0.0.1")
    monkeypatch.setenv(f"{ENV_PREFIX}METRICS_PORT", str(port))

    with pytest.raises(SystemExit) as refused:
        console(PROBE, ["serve"])

    assert str(refused.value.code) == (
        f"{PROBE.name}: the database has not been migrated: it has no work_items table "
        "(run the host's migrations, `make migrate`, as the database's owner)"
    )


def test_a_database_that_was_never_migrated_is_named_so_not_unavailable(
    monkeypatch: pytest.MonkeyPatch, pg_url: str
) -> None:
    """The server's maintenance database `postgres` answers, but has none of the host's
    tables: the command says to migrate, not that the database is down."""
    url = make_url(pg_url).set(database="postgres")
    monkeypatch.setenv(f"{INFRA_PREFIX}DATABASE_URL", url.render_as_string(hide_password=False))

    with pytest.raises(SystemExit) as refused:
        console(PROBE, ["items", "list"])

    message = str(refused.value.code)
    assert message.startswith(f"{PROBE.name}: the database has not been migrated: ")
    assert "does not exist" in message
    assert "make migrate" in message
    assert "\n" not in message


@pytest.mark.parametrize("name", ["", "  ", "two\tparts", "two\nlines", "x" * 201])
def test_create_tenant_refuses_a_name_that_is_not_one_printable_line(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    with pytest.raises(SystemExit) as refused:
        console(PROBE, ["enqueue", "--create-tenant", name, "--operator", "alice"])

    assert refused.value.code == 2
    assert "argument --create-tenant: give one printable line" in capsys.readouterr().err


# -- the metrics port: what it answers and where it listens ------------------------------


async def test_the_metrics_port_answers_metrics_and_healthz_and_nothing_else() -> None:
    app = create_app(LoopState(heartbeat_failure_limit=3), CollectorRegistry())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        for path in ("/", "/docs", "/redoc", "/openapi.json", "/metrics/", "/env", "/admin"):
            assert (await client.get(path)).status_code == 404, path
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            for path in ("/metrics", "/healthz"):
                assert (await client.request(method, path)).status_code == 405, (method, path)


async def test_healthz_answers_503_with_the_reason_once_every_claim_failed_for_the_limit() -> None:
    state = LoopState(heartbeat_failure_limit=3, claim_failure_limit_s=6.0)
    app = create_app(state, CollectorRegistry())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://worker") as client:
        state.claim_failures = 4
        state.claims_failing_since = time.monotonic() - 5.0
        healthy = await client.get("/healthz")
        assert healthy.status_code == 200
        assert healthy.json()["reason"] is None
        assert healthy.json()["claim_failures"] == 4

        state.claims_failing_since = time.monotonic() - 6.5
        failing = await client.get("/healthz")
        assert failing.status_code == 503
        body = failing.json()
        assert body["status"] == "unhealthy"
        assert body["reason"].startswith("every claim failed for 6.5 s (4 in a row)")
        assert body["claims_failing_s"] >= 6.5
        assert body["wake_ups"] == "down"

        state.claims_failing_since, state.claim_failures = None, 0  # a claim succeeded
        assert (await client.get("/healthz")).status_code == 200


def test_the_metrics_port_binds_the_settings_address_loopback_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(f"{ENV_PREFIX}METRICS_HOST", raising=False)
    assert ProbeSettings().metrics_host == "127.0.0.1"
    sock = _bind(ProbeSettings().metrics_host, 0, ENV_PREFIX)
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()


async def test_redis_carries_no_payload_and_no_tenant_data(
    container: RuntimeContainer, make_loop: LoopFactory
) -> None:
    """A wake-up names a lane and a kind; a liveness key names the worker under the system
    scope, and its value is a random token per beat."""
    assert set(WorkAvailablePayload.model_fields) == {"lane", "kind"}
    loop = make_loop()
    assert await loop.heartbeat.beat_once()
    key = liveness_key(loop.worker_id)
    assert key == f"{EMPTY_UUID}:{loop.worker_id}"
    value = await container.infra.cache.get(CacheScope.WORKER_LIVENESS, key)
    assert isinstance(value, str)
    assert re.fullmatch(r"[0-9a-f]{32}", value)


def test_a_redis_url_with_credentials_and_tls_is_taken_and_shown_without_its_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "rediss://worker:s3cret@redis.internal:6380/0"
    monkeypatch.setenv(f"{INFRA_PREFIX}REDIS_URL", url)

    settings = ProbeSettings()

    assert settings.infra.redis_url == url
    assert _describe(settings.infra.redis_url, "") == "rediss://worker:***@redis.internal:6380/0"


async def test_a_redis_that_does_not_answer_at_start_is_named_once_by_its_variable(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A mistyped Redis URL is said at start, naming the variable; serve goes on (the
    heartbeat and the wake-ups wait for Redis as in any outage)."""
    monkeypatch.setenv(f"{INFRA_PREFIX}REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    settings = ProbeSettings()
    infra = Infra.build(settings.infra)
    container = cast(RuntimeContainer, SimpleNamespace(infra=infra))
    try:
        with caplog.at_level(logging.WARNING):
            await _warn_unanswered_redis(settings, container)
    finally:
        await infra.aclose()

    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Redis")]
    assert len(said) == 1, said
    assert said[0].endswith(f"(check {INFRA_PREFIX}REDIS_URL)"), said[0]


# -- the operator surface: no hidden side effects, accountable writes ---------------------

T = TypeVar("T")


@pytest.fixture(params=["embedded", "postgresql"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """The command's database: the embedded SQLite file (in `tmp_path`) or the test
    PostgreSQL as the application role. No Redis, no operator in the environment."""
    _in_a_host(tmp_path, monkeypatch)
    monkeypatch.delenv(f"{INFRA_PREFIX}REDIS_URL", raising=False)
    monkeypatch.delenv(f"{ENV_PREFIX}OPERATOR", raising=False)
    if request.param == "embedded":
        monkeypatch.delenv(f"{INFRA_PREFIX}DATABASE_URL", raising=False)
    else:
        monkeypatch.setenv(f"{INFRA_PREFIX}DATABASE_URL", request.getfixturevalue("pg_url"))
    return str(request.param)


def _on_the_queue(action: Callable[[RuntimeContainer], Awaitable[T]]) -> T:
    """Run `action` on a container built from the environment, as the command builds one."""

    async def run() -> T:
        container = ProbeContainer.build(ProbeSettings())
        try:
            return await action(container)
        finally:
            await container.aclose()

    return asyncio.run(run())


async def _tenant_ids(container: RuntimeContainer) -> set[UUID]:
    contexts = await container.managers.tenancy.service_contexts(RequestContext.new(APP))
    return {ctx.org_id for ctx in contexts}


async def _dead_letter(container: RuntimeContainer) -> tuple[UUID, UUID]:
    """A new tenant and a dead letter in it (on a lane of its own): `(org_id, item_id)`."""
    rctx = RequestContext.new(APP)
    org = await container.managers.tenancy.create_org(rctx, "dead letters")
    ctx = await container.managers.tenancy.service_context(
        rctx, org_id=org.id, acting_for=uuid4(), caused_by_request_id=None
    )
    lane = f"cli_{uuid4().hex[:8]}"
    work = container.managers.work
    fresh = WorkItem.new(org_id=org.id, kind=KIND, payload=sample_payload(), lane=lane)
    item = await work.enqueue(ctx, fresh.model_copy(update={"max_attempts": 1}))
    claimed = await work.claim(rctx, lane, [KIND], "test-cli", 30.0)
    assert claimed is not None
    await work.fail(claimed[0], claimed[1], "boom")
    return org.id, item.id


async def _state(
    container: RuntimeContainer, org_id: UUID, item_id: UUID
) -> tuple[WorkItem, list[AuditEntry]]:
    rctx = RequestContext.new(APP)
    ctx = await container.managers.tenancy.service_context(
        rctx, org_id=org_id, acting_for=EMPTY_UUID, caused_by_request_id=None
    )
    item = await container.managers.work.get(ctx, item_id)
    return item, await container.managers.audit.list_for(ctx, "work_item", item_id)


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the command, expect exit 2, return its one line on stderr."""
    with pytest.raises(SystemExit) as refused:
        console(PROBE, argv)
    assert refused.value.code == 2
    err = capsys.readouterr().err
    # The host's boot logs `booted` first in a process that had not booted yet.
    lines = [line for line in err.splitlines() if not line.endswith(f"booted {PROBE.name}")]
    assert len(lines) == 1, err
    return lines[0].strip()


def test_a_usage_error_is_one_line_naming_help(capsys: pytest.CaptureFixture[str]) -> None:
    """A malformed value or a missing argument is refused like every other bad input: one
    line on stderr, exit 2, not argparse's usage block."""
    for argv, what in (
        (["items", "show", str(uuid4()), "--org", "not-a-uuid"], "argument --org: invalid UUID"),
        (["items", "show"], "the following arguments are required"),
        (["no-such-command"], "argument command: invalid choice"),
    ):
        line = _refused(argv, capsys)
        assert what in line, line
        assert line.endswith("--help)"), line


def test_enqueue_without_a_tenant_is_refused_on_one_line_and_creates_none(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _on_the_queue(_tenant_ids) if backend == "postgresql" else set()
    payload = json.dumps(sample_payload())

    line = _refused(["enqueue", "--payload", payload, "--operator", "alice"], capsys)

    assert line.startswith(f"{PROBE.name}: enqueue needs --org ORG")
    assert f"`{PROBE.name} tenants`" in line
    assert "--create-tenant NAME" in line
    if backend == "embedded":
        assert not (tmp_path / ".local").exists()  # not even the database file
    else:
        assert _on_the_queue(_tenant_ids) == before


@pytest.mark.parametrize(
    "argv",
    [["enqueue", "--operator", "alice"], ["items", "list"], ["dead-letters", "list"]],
    ids=" ".join,
)
def test_an_org_that_is_no_live_tenant_is_refused_naming_the_option(
    argv: list[str], backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every command that takes `--org` says which tenants there are, not `NotFound` (after
    the start's own lines: the tenant is looked up once the storage is open)."""
    org = uuid4()
    if argv[0] == "enqueue":
        argv = [*argv, "--payload", json.dumps(sample_payload())]

    with pytest.raises(SystemExit) as refused:
        console(PROBE, [*argv, "--org", str(org)])

    assert refused.value.code == 2
    *_, line = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"{PROBE.name}: --org {org} is no live tenant (the `tenants` command lists them; "
        "`enqueue --create-tenant NAME` creates one); nothing read or written"
    )


def test_create_tenant_says_what_it_created_and_the_enqueue_names_operator_and_priority(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = json.dumps(sample_payload())

    enqueue = ["enqueue", "--create-tenant", "demo", "--operator", "alice", "--priority", "5"]
    console(PROBE, [*enqueue, "--payload", payload])

    created, enqueued = capsys.readouterr().out.splitlines()
    label, org_id, name = created.split("\t")
    assert (label, name) == ("created tenant", "demo")
    assert enqueued.startswith("enqueued   ")
    item_id = UUID(enqueued.split()[1])
    assert enqueued.split("\t")[1] == org_id
    item, entries = _on_the_queue(lambda c: _state(c, UUID(org_id), item_id))
    assert item.priority == 5
    operators = [(e.action, e.detail.get("operator")) for e in entries]
    assert operators == [(ENQUEUED_ACTION, "alice")]
    console(PROBE, ["tenants"])
    assert org_id in capsys.readouterr().out.split()


def test_replay_and_discard_name_their_operator_and_a_dry_run_changes_nothing(
    backend: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    org_id, replayed_id = _on_the_queue(_dead_letter)
    other_org, discarded_id = _on_the_queue(_dead_letter)
    capsys.readouterr()

    for org, item_id, action in (
        (org_id, replayed_id, "replay"),
        (other_org, discarded_id, "discard"),
    ):
        console(PROBE, ["dead-letters", action, str(item_id), "--org", str(org), "--dry-run"])
        out = capsys.readouterr().out
        assert out.startswith(f"would {action}")
        assert str(item_id) in out
        item, entries = _on_the_queue(partial(_state, org_id=org, item_id=item_id))
        assert (item.status, item.deleted_at, len(entries)) == (WorkStatus.FAILED, None, 1)

    console(
        PROBE,
        ["dead-letters", "replay", str(replayed_id), "--org", str(org_id), "--operator", "alice"],
    )
    assert capsys.readouterr().out.startswith(f"replayed   {replayed_id}")
    monkeypatch.setenv(f"{ENV_PREFIX}OPERATOR", "bob")  # the environment names the operator
    console(PROBE, ["dead-letters", "discard", str(discarded_id), "--org", str(other_org)])
    assert capsys.readouterr().out.startswith(f"discarded  {discarded_id}")

    item, entries = _on_the_queue(lambda c: _state(c, org_id, replayed_id))
    assert item.status is WorkStatus.AVAILABLE
    assert (entries[-1].action, entries[-1].detail["operator"]) == ("work.replayed", "alice")
    assert entries[-1].actor_id == EMPTY_UUID  # the actor stays the system user
    item, entries = _on_the_queue(lambda c: _state(c, other_org, discarded_id))
    assert item.deleted_at is not None
    assert (entries[-1].action, entries[-1].detail["operator"]) == ("work.discarded", "bob")


async def _waiting(container: RuntimeContainer) -> tuple[UUID, UUID]:
    """A new tenant and an item waiting in it (on a lane of its own): `(org_id, item_id)`."""
    rctx = RequestContext.new(APP)
    org = await container.managers.tenancy.create_org(rctx, "cancels")
    ctx = await container.managers.tenancy.service_context(
        rctx, org_id=org.id, acting_for=uuid4(), caused_by_request_id=None
    )
    lane = f"cli_{uuid4().hex[:8]}"
    fresh = WorkItem.new(org_id=org.id, kind=KIND, payload=sample_payload(), lane=lane)
    item = await container.managers.work.enqueue(ctx, fresh)
    return org.id, item.id


def test_items_cancel_cancels_a_waiting_item_audited_and_refuses_it_twice_in_one_line(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    org_id, item_id = _on_the_queue(_waiting)
    capsys.readouterr()
    argv = ["items", "cancel", str(item_id), "--org", str(org_id), "--operator", "alice"]

    console(PROBE, [*argv, "--dry-run"])
    assert capsys.readouterr().out.startswith(f"would cancel {item_id}")
    item, entries = _on_the_queue(lambda c: _state(c, org_id, item_id))
    assert (item.status, entries) == (WorkStatus.AVAILABLE, [])

    console(PROBE, argv)
    out = capsys.readouterr().out
    assert out.startswith(f"cancelled  {item_id}")
    assert "\tCANCELLED\t" in out
    item, entries = _on_the_queue(lambda c: _state(c, org_id, item_id))
    assert item.status is WorkStatus.CANCELLED
    assert [(e.action, e.detail["operator"], e.detail["was"]) for e in entries] == [
        ("work.cancelled", "alice", "AVAILABLE")
    ]

    with pytest.raises(SystemExit) as refused:
        console(PROBE, argv)
    assert refused.value.code == 2
    *_, line = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"{PROBE.name}: Conflict: status: only an available or claimed item can be cancelled; "
        "this one is CANCELLED"
    )


def test_a_row_that_cannot_be_read_is_named_by_every_read_never_fatal(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dead letter whose payload is no JSON object beside a readable one: `items list` and
    `dead-letters list` print a line for each (the unreadable one says which column and
    why), `items show` prints its stored columns, and a replay names it and writes nothing."""
    org_id, readable_id = _on_the_queue(_dead_letter)
    # This worker's kind: the fixture's default is the kind of the namespace's first worker.
    bad = stored_row(
        org_id, "default", payload=[1, 2, 3], status="FAILED", attempts=3, kind=KIND.value
    )

    async def store(container: RuntimeContainer) -> None:
        assert container.funnel is not None
        await store_row(container.funnel, bad)

    _on_the_queue(store)
    capsys.readouterr()
    problem = "unreadable: payload: Input should be a valid dictionary"

    for argv in (["items", "list"], ["dead-letters", "list"]):
        console(PROBE, [*argv, "--org", str(org_id)])
        lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
        assert [line[0] for line in lines] == [str(readable_id), str(bad["id"])]
        assert lines[1][1:6] == [str(org_id), "FAILED", KIND.value, "default", "3/3"]
        assert lines[1][7] == problem
    console(PROBE, ["items", "show", str(bad["id"]), "--org", str(org_id)])
    shown = json.loads(capsys.readouterr().out)
    assert shown["unreadable"] == {"column": "payload", "reason": problem.split(": ", 2)[2]}
    assert (shown["id"], shown["payload"], shown["status"]) == (str(bad["id"]), [1, 2, 3], "FAILED")
    with pytest.raises(SystemExit) as refused:
        console(
            PROBE, ["dead-letters", "replay", str(bad["id"]), "--org", str(org_id), "--dry-run"]
        )
    assert refused.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"{PROBE.name}: UnreadableItem: payload: work item {bad['id']} cannot be read "
        "(Input should be a valid dictionary)"
    )


def test_the_dead_letter_commands_refuse_an_item_of_another_kind_and_change_nothing(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dead-letters replay` and `discard` (dry run or not) act only on this worker's kind,
    as `dead-letters list` does: another kind's dead letter is its own worker's. `items
    show`, read-only, shows it."""
    org_id, _ = _on_the_queue(_dead_letter)
    other = stored_row(org_id, "default", status="FAILED", attempts=3, kind="ANOTHER_KIND")

    async def store(container: RuntimeContainer) -> None:
        assert container.funnel is not None
        await store_row(container.funnel, other)

    _on_the_queue(store)
    capsys.readouterr()
    refusal = (
        f"{PROBE.name}: Invalid: item_id: item {other['id']} is of kind ANOTHER_KIND, "
        f"not {KIND.value}"
    )
    target = [str(other["id"]), "--org", str(org_id), "--operator", "alice"]
    console(PROBE, ["items", "show", *target[:3]])
    shown = json.loads(capsys.readouterr().out)
    assert (shown["id"], shown["kind"]) == (str(other["id"]), "ANOTHER_KIND")
    for argv in (
        ["dead-letters", "replay", *target, "--dry-run"],
        ["dead-letters", "replay", *target],
        ["dead-letters", "discard", *target],
    ):
        with pytest.raises(SystemExit) as refused:
            console(PROBE, argv)
        assert refused.value.code == 2
        last = capsys.readouterr().err.splitlines()[-1]
        assert last.startswith(refusal)
        assert last.endswith("(no worker declares that kind: `items discard` deletes it)")

    async def unchanged(container: RuntimeContainer) -> list[AuditEntry]:
        ctx = await container.managers.tenancy.service_context(
            RequestContext.new(APP), org_id=org_id, acting_for=EMPTY_UUID, caused_by_request_id=None
        )
        return await container.managers.audit.list_for(ctx, "work_item", other["id"])

    assert _on_the_queue(unchanged) == []


def test_a_row_of_no_known_kind_is_listed_with_any_kind_and_discarded_audited(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A waiting `BOGUS_KIND` row: `items list` (this worker's kind) leaves it out, `items
    list --any-kind` shows it with its lane, `items discard --dry-run` changes nothing,
    `items discard` deletes it with an audit entry naming the operator, and a row of a kind
    the code names is refused."""
    org_id, readable_id = _on_the_queue(_dead_letter)
    bogus = stored_row(org_id, "default", kind="BOGUS_KIND")

    async def store(container: RuntimeContainer) -> None:
        assert container.funnel is not None
        await store_row(container.funnel, bogus)

    _on_the_queue(store)
    capsys.readouterr()
    org = ["--org", str(org_id)]
    console(PROBE, ["items", "list", *org])
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == [
        str(readable_id)
    ]
    console(PROBE, ["items", "list", "--any-kind", *org])
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    (row,) = [line for line in lines if line[0] == str(bogus["id"])]
    assert row[2:5] == ["AVAILABLE", "BOGUS_KIND", "default"]
    assert row[7].startswith("unreadable: kind: ")

    target = [str(bogus["id"]), *org, "--operator", "alice"]
    console(PROBE, ["items", "discard", *target, "--dry-run"])
    out, err = capsys.readouterr()
    assert out.startswith(f"would discard {bogus['id']}\t")
    assert err.endswith("dry run: nothing changed\n")
    console(PROBE, ["items", "discard", *target])
    assert capsys.readouterr().out.startswith(f"discarded  {bogus['id']}\t")
    console(PROBE, ["items", "list", "--any-kind", *org])
    assert str(bogus["id"]) not in capsys.readouterr().out

    async def audited(container: RuntimeContainer) -> list[AuditEntry]:
        ctx = await container.managers.tenancy.service_context(
            RequestContext.new(APP), org_id=org_id, acting_for=EMPTY_UUID, caused_by_request_id=None
        )
        return await container.managers.audit.list_for(ctx, "work_item", bogus["id"])

    (entry,) = _on_the_queue(audited)
    assert (entry.action, entry.detail["kind"], entry.detail["operator"]) == (
        "work.discarded",
        "BOGUS_KIND",
        "alice",
    )
    with pytest.raises(SystemExit) as refused:
        console(PROBE, ["items", "discard", str(readable_id), *org, "--operator", "alice"])
    assert refused.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"{PROBE.name}: Conflict: kind: item {readable_id} is of kind ")


def test_a_listing_writes_error_text_as_text_never_as_terminal_commands(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A handler's error (or a hand-written row) holding an escape sequence or a tab is
    listed with the sequence escaped, in its own column."""
    org_id, _ = _on_the_queue(_dead_letter)
    row = stored_row(org_id, "default", last_error="Boom: \x1b[2J\tcleared", attempts=1)

    async def store(container: RuntimeContainer) -> None:
        assert container.funnel is not None
        await store_row(container.funnel, row)

    _on_the_queue(store)
    capsys.readouterr()
    console(PROBE, ["items", "list", "--org", str(org_id)])
    out = capsys.readouterr().out
    assert "\x1b" not in out
    (line,) = [line for line in out.splitlines() if line.startswith(str(row["id"]))]
    assert line.split("\t")[7] == "Boom: \\x1b[2J cleared"


def test_items_move_moves_the_waiting_items_of_the_old_lane_audited(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Items waiting on a lane the kind's policy no longer names: a dry run lists them and
    changes nothing; the move puts them on the policy's lane with an audit entry each."""
    org_id, dead_id = _on_the_queue(_dead_letter)
    rctx = RequestContext.new(APP)
    old_lane = f"old_{uuid4().hex[:8]}"

    async def enqueue(container: RuntimeContainer) -> WorkItem:
        ctx = await container.managers.tenancy.service_context(
            rctx, org_id=org_id, acting_for=EMPTY_UUID, caused_by_request_id=None
        )
        fresh = WorkItem.new(org_id=org_id, kind=KIND, payload=sample_payload(), lane=old_lane)
        return await container.managers.work.enqueue(ctx, fresh)

    waiting = _on_the_queue(enqueue)
    capsys.readouterr()
    console(PROBE, ["summary"])
    assert f"stranded\t{old_lane}\t{KIND.value}\t1\n" in capsys.readouterr().out
    move = ["items", "move", "--from-lane", old_lane, "--org", str(org_id), "--operator", "bob"]
    console(PROBE, [*move, "--dry-run"])
    out, err = capsys.readouterr()
    assert out == f"would move {waiting.id}\t{org_id}\t{KIND.value}\t{old_lane}\tdefault\n"
    assert err.endswith("dry run: nothing changed\n")
    assert _on_the_queue(lambda c: _state(c, org_id, waiting.id))[0].lane == old_lane

    console(PROBE, move)
    out, err = capsys.readouterr()
    assert out == f"moved      {waiting.id}\t{org_id}\t{KIND.value}\t{old_lane}\tdefault\n"
    assert f"moved 1 waiting item(s) of kind {KIND.value} from lane {old_lane} to default" in err
    item, entries = _on_the_queue(lambda c: _state(c, org_id, waiting.id))
    assert (item.lane, item.status) == ("default", WorkStatus.AVAILABLE)
    assert [(e.action, e.detail["operator"]) for e in entries] == [("work.lane_moved", "bob")]
    dead, _ = _on_the_queue(lambda c: _state(c, org_id, dead_id))
    assert dead.status is WorkStatus.FAILED  # a dead letter on another lane never moves


def test_items_move_dry_run_refuses_what_the_move_refuses_in_the_same_line(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dry run that listed moves the real run then refuses would mislead: both refuse a
    lane no worker claims on (the items would be stranded) and a move onto the same lane."""
    org_id, _ = _on_the_queue(_dead_letter)
    capsys.readouterr()
    base = ["items", "move", "--org", str(org_id), "--operator", "bob"]
    for lanes, expected in (
        (
            ["--from-lane", "default", "--to-lane", "nowhere"],
            f"Invalid: to_lane: no worker claims {KIND.value} on lane nowhere; the lanes that do: ",
        ),
        (["--from-lane", "default"], "Invalid: to_lane: the items are on default already"),
    ):
        lines = []
        for dry in ([], ["--dry-run"]):
            with pytest.raises(SystemExit) as refused:
                console(PROBE, [*base, *lanes, *dry])
            assert refused.value.code == 2
            out, err = capsys.readouterr()
            assert out == ""  # nothing listed
            lines.append(err.strip().splitlines()[-1])  # after the embedded mode's note
        assert lines[0] == lines[1], lines
        assert expected in lines[0], lines[0]


def test_a_write_on_a_database_server_without_an_operator_is_refused_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(f"{INFRA_PREFIX}DATABASE_URL", pg_url)
    monkeypatch.delenv(f"{INFRA_PREFIX}REDIS_URL", raising=False)
    monkeypatch.setenv(f"{ENV_PREFIX}OPERATOR", "  ")  # blank is unset
    org_id, item_id = _on_the_queue(_dead_letter)
    before = _on_the_queue(lambda c: _state(c, org_id, item_id))
    payload = json.dumps(sample_payload())

    for argv in (
        ["dead-letters", "replay", str(item_id), "--org", str(org_id)],
        ["dead-letters", "discard", str(item_id), "--org", str(org_id)],
        ["enqueue", "--org", str(org_id), "--payload", payload],
        ["enqueue", "--create-tenant", "demo", "--payload", payload],
    ):
        line = _refused(argv, capsys)
        assert f"pass --operator NAME or set {ENV_PREFIX}OPERATOR; nothing written" in line

    assert _on_the_queue(lambda c: _state(c, org_id, item_id)) == before
    rctx = RequestContext.new(APP)

    async def items(container: RuntimeContainer) -> list[WorkItem]:
        ctx = await container.managers.tenancy.service_context(
            rctx, org_id=org_id, acting_for=EMPTY_UUID, caused_by_request_id=None
        )
        return await container.managers.work.list_items(ctx)

    assert [item.id for item in _on_the_queue(items)] == [item_id]


def test_a_worker_newer_than_the_engine_refuses_to_start_naming_the_owners_update() -> None:
    newer = dataclasses.replace(PROBE, runtime_api=API_VERSION + 1)

    with pytest.raises(SystemExit) as exited:
        console(newer, ["serve"])

    assert exited.value.code == (
        f"worker-probe: worker-probe needs worker runtime API {API_VERSION + 1}, but the "
        f"host's workers/runtime is at API {API_VERSION}: run `make update-worker NAME={OWNER}`"
    )


def test_a_text_log_line_escapes_what_could_forge_or_hide_a_line() -> None:
    """A message's and an exception's newlines are written `\\n`, control characters as
    their escapes; the traceback keeps its own lines."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("escape-probe")
    logger.propagate = False
    logger.addHandler(handler)
    escape_log_output(logger)
    try:
        raise ValueError("boom\nFORGED by the exception")
    except ValueError:
        logger.exception("said %s", "a\nFORGED by the message \x1b[31m")
    finally:
        logger.removeHandler(handler)

    lines = stream.getvalue().splitlines()
    assert lines[0] == "ERROR said a\\nFORGED by the message \\x1b[31m"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: boom\\nFORGED by the exception"
    assert not [line for line in lines if line.startswith("FORGED")]


# -- lanes, the summary and the corrected replay (docs/decisions/0040, 0041) ------------------


def test_lanes_pause_list_and_resume_a_lane_of_the_workers_own_audited_in_every_tenant(
    backend: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lane = f"cli_{uuid4().hex[:8]}"  # a lane of the test's own: PostgreSQL is shared
    monkeypatch.setenv(f"{ENV_PREFIX}LANE", lane)
    org_id, _ = _on_the_queue(_dead_letter)
    capsys.readouterr()

    console(PROBE, ["lanes", "pause", "--operator", "alice", "--reason", "upstream down"])
    paused = capsys.readouterr()
    console(PROBE, ["lanes", "list"])
    listed = capsys.readouterr().out
    console(PROBE, ["summary"])
    summary = capsys.readouterr().out
    console(PROBE, ["lanes", "resume", lane, "--operator", "bob"])
    resumed = capsys.readouterr().out

    assert paused.out.startswith(f"paused\t{lane}\talice\t")
    assert paused.out.rstrip("\n").endswith("\tupstream down")
    assert f"no worker claims on lane {lane} until" in paused.err
    assert f"paused\t{lane}\talice\t" in listed
    assert f"paused\t{lane}\talice\t" in summary
    assert resumed.startswith(f"resumed\t{lane}\talice\t")

    async def lane_entries(container: RuntimeContainer) -> list[AuditEntry]:
        ctx = await container.managers.tenancy.service_context(
            RequestContext.new(APP), org_id=org_id, acting_for=EMPTY_UUID, caused_by_request_id=None
        )
        return await container.managers.audit.list_for(
            ctx, LANE_SUBJECT_TYPE, lane_subject_id(lane)
        )

    entries = _on_the_queue(lane_entries)
    assert [(e.action, e.detail["operator"]) for e in entries] == [
        ("work.lane_paused", "alice"),
        ("work.lane_resumed", "bob"),
    ]


def test_lanes_pause_refuses_without_an_operator_and_an_unknown_lane_naming_the_known(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    no_operator = _refused(["lanes", "pause"], capsys)
    with pytest.raises(SystemExit) as refused:
        console(PROBE, ["lanes", "pause", "nowhere_at_all", "--operator", "alice"])
    *_, unknown = capsys.readouterr().err.strip().splitlines()

    assert no_operator == (
        f"{PROBE.name}: lanes pause records who asked, for every tenant: pass --operator NAME "
        f"or set {ENV_PREFIX}OPERATOR; nothing written"
    )
    assert refused.value.code == 2
    assert unknown.startswith(
        f"{PROBE.name}: Invalid: lane: no worker claims on lane nowhere_at_all; the known lanes: "
    )
    assert "nowhere_at_all" not in [p.lane for p in _on_the_queue(_paused)]


async def _paused(container: RuntimeContainer) -> list[LanePause]:
    return await container.managers.work.paused_lanes(RequestContext.new(APP))


def test_a_corrected_replay_takes_a_payload_the_model_accepts_and_audits_both(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    org_id, item_id = _on_the_queue(_dead_letter)
    before, _ = _on_the_queue(lambda c: _state(c, org_id, item_id))
    corrected = sample_payload()
    replay = ["dead-letters", "replay", str(item_id), "--org", str(org_id), "--operator", "al"]
    capsys.readouterr()

    bad = _refused([*replay, "--payload", '{"record_id": "not a uuid"}'], capsys)
    after_bad, _ = _on_the_queue(lambda c: _state(c, org_id, item_id))
    console(PROBE, [*replay, "--dry-run", "--payload", json.dumps(corrected)])
    dry = capsys.readouterr().out
    console(PROBE, [*replay, "--payload", json.dumps(corrected)])
    item, entries = _on_the_queue(lambda c: _state(c, org_id, item_id))

    assert bad.startswith(f"{PROBE.name}: Invalid: payload.record_id: ")
    assert (after_bad.status, after_bad.payload) == (WorkStatus.FAILED, before.payload)
    assert "would replace payload" in dry
    assert item.status is WorkStatus.AVAILABLE
    assert item.payload["record_id"] == corrected["record_id"]
    last = entries[-1]
    assert last.action == "work.replayed"
    assert (last.detail["old_payload"], last.detail["payload"]) == (before.payload, item.payload)


def test_the_summary_as_json_is_the_typed_model(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _on_the_queue(_dead_letter)
    capsys.readouterr()

    console(PROBE, ["summary", "--json"])

    summary = QueueSummary.model_validate_json(capsys.readouterr().out)
    assert all(group.count >= 1 for group in summary.groups)


def test_the_summary_lists_a_worker_alive_that_holds_nothing(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An idle worker is on the roster its heartbeat writes (docs/decisions/0049): the summary
    lists it, as a line and in JSON, with nothing held."""
    worker_id = f"host:1:{uuid4().hex[:8]}"
    lane = f"cli_{uuid4().hex[:8]}"
    rctx = RequestContext.new(APP)

    async def beat(container: RuntimeContainer) -> None:
        await container.managers.work.beat_worker(
            rctx, worker_id, worker=PROBE.name, lane=lane, kinds=[PROBE.kind], ttl_s=60.0
        )

    async def drop(container: RuntimeContainer) -> bool:
        return await container.managers.work.drop_worker(rctx, worker_id)

    _on_the_queue(beat)
    capsys.readouterr()
    console(PROBE, ["summary"])
    lines = capsys.readouterr()
    console(PROBE, ["summary", "--json"])
    summary = QueueSummary.model_validate_json(capsys.readouterr().out)
    assert _on_the_queue(drop) is True

    (line,) = [row for row in lines.out.splitlines() if worker_id in row]
    columns = line.split("\t")
    assert columns[:5] == ["alive", worker_id, PROBE.name, lane, PROBE.kind.value]
    assert columns[6] == "0"
    assert "worker(s) alive (" in lines.err
    (alive,) = [w for w in summary.workers_alive if w.worker_id == worker_id]
    assert (alive.lane, alive.kinds, alive.holding) == (lane, (PROBE.kind.value,), 0)
