"""An embedded SQLite file from an earlier release, upgraded at start or refused whole."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from uuid import uuid4

import pytest
from sqlalchemy.dialects import sqlite
from sqlalchemy.schema import CreateIndex, CreateTable

from acme.om.schema import create_all
from acme.om.work.storage.impl.sqlite_upgrade import (
    SqliteFileOutdated,
    upgrade_sqlite_file,
    work_tables,
)
from acme.om.work.storage.tables.work_items import work_items

# `work_items` as an earlier release made it: without the audit-owed columns and the
# payload check, with an index this release no longer has and without one it added.
_EARLIER_TABLE = """
CREATE TABLE work_items (
    id CHAR(32) NOT NULL, org_id CHAR(32) NOT NULL, kind TEXT NOT NULL, lane TEXT NOT NULL,
    payload JSON NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL, available_at DATETIME NOT NULL, claimed_by TEXT,
    claim_token CHAR(32), claimed_at DATETIME, lease_expires_at DATETIME, last_error TEXT,
    note TEXT, idempotency_key TEXT, request_id CHAR(32), traceparent TEXT,
    completed_at DATETIME, created_at DATETIME NOT NULL, updated_at DATETIME NOT NULL,
    created_by CHAR(32) NOT NULL, updated_by CHAR(32) NOT NULL, deleted_at DATETIME,
    CONSTRAINT pk_work_items PRIMARY KEY (id),
    CONSTRAINT ck_work_items_status CHECK (status IN ('AVAILABLE', 'CLAIMED', 'COMPLETED',
        'FAILED', 'RUNNING'))
)
"""
_EARLIER_INDEX = "CREATE INDEX ix_work_items_lane_status ON work_items (lane, status)"


def _earlier_file(path: Path, status: str = "AVAILABLE") -> str:
    connection = sqlite3.connect(path)
    with connection:
        connection.execute(_EARLIER_TABLE)
        connection.execute(_EARLIER_INDEX)
        connection.execute(
            "INSERT INTO work_items VALUES (?, ?, 'default', 'main', '{\"n\": 1}', ?, 0, 5,"
            " '2026-01-01 00:00:00.000000', NULL, NULL, NULL, NULL, NULL, NULL, 'k1', NULL,"
            " NULL, NULL, '2026-01-01 00:00:00.000000', '2026-01-01 00:00:00.000000', ?, ?,"
            " NULL)",
            (uuid4().hex, uuid4().hex, status, uuid4().hex, uuid4().hex),
        )
    connection.close()
    return f"sqlite+aiosqlite:///{path}"


def _schema(path: Path) -> dict[str, str]:
    connection = sqlite3.connect(path)
    try:
        rows = connection.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL")
        return {str(name): str(sql) for name, sql in rows}
    finally:
        connection.close()


def test_an_earlier_file_is_rebuilt_to_this_release_keeping_its_rows(tmp_path: Path) -> None:
    """The table takes this release's columns, checks and indexes (the stale index gone);
    the row keeps its values, the new columns empty; a second start changes nothing."""
    url = _earlier_file(tmp_path / "work.db")

    assert upgrade_sqlite_file(url) == ("work_items",)
    create_all(url)

    schema = _schema(tmp_path / "work.db")
    dialect = sqlite.dialect()
    wanted = str(CreateTable(work_items).compile(dialect=dialect)).strip()
    assert schema["work_items"].split("(", 1)[1] == wanted.split("(", 1)[1]
    for index in work_items.indexes:
        assert schema[str(index.name)] == str(CreateIndex(index).compile(dialect=dialect))
    assert "ix_work_items_lane_status" not in schema
    connection = sqlite3.connect(tmp_path / "work.db")
    try:
        row = connection.execute(
            "SELECT idempotency_key, payload, audit_owed_token FROM work_items"
        ).fetchall()
    finally:
        connection.close()
    assert row == [("k1", '{"n": 1}', None)]
    assert upgrade_sqlite_file(url) == ()
    assert _schema(tmp_path / "work.db") == schema


def test_an_earlier_file_takes_a_cancel_once_rebuilt(tmp_path: Path) -> None:
    """Its status check had no `CANCELLED`: the rebuilt table's admits it (issue 33)."""
    url = _earlier_file(tmp_path / "work.db")
    upgrade_sqlite_file(url)
    connection = sqlite3.connect(tmp_path / "work.db")
    try:
        with connection:
            connection.execute("UPDATE work_items SET status = 'CANCELLED'")
        assert connection.execute("SELECT status FROM work_items").fetchall() == [("CANCELLED",)]
    finally:
        connection.close()


def test_rows_that_do_not_fit_refuse_the_file_in_one_line_and_leave_it_whole(
    tmp_path: Path,
) -> None:
    """A status this release's check refuses: the message names the file and the fix, and
    the file keeps its table, its index and its row."""
    path = tmp_path / "work.db"
    url = _earlier_file(path, status="RUNNING")
    before = _schema(path)

    with pytest.raises(SqliteFileOutdated) as refused:
        upgrade_sqlite_file(url)

    message = str(refused.value)
    assert "\n" not in message
    assert f"delete {path}" in message
    assert "CHECK constraint failed" in message
    assert _schema(path) == before
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("SELECT status FROM work_items").fetchall() == [("RUNNING",)]
    finally:
        connection.close()


def test_a_missing_file_or_a_current_one_is_left_to_create_all(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'work.db'}"
    assert upgrade_sqlite_file(url) == ()
    assert not (tmp_path / "work.db").exists()
    create_all(url)
    before = _schema(tmp_path / "work.db")
    assert upgrade_sqlite_file(url) == ()
    assert _schema(tmp_path / "work.db") == before


def test_every_work_table_is_upgraded() -> None:
    """The upgrade reads the namespace's table modules, so a table added later is covered."""
    assert work_items in work_tables()
