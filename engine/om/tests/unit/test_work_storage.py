"""The work storage contract over the memory storage and over a real SQLite file."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import pytest
from sqlalchemy import Executable, TextualSelect, event, insert, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import create_async_engine
from work_fixtures import FakeClock, store_row, stored_row

from acme.om.errors import Invalid
from acme.om.schema import create_all
from acme.om.storage.funnel import StorageFunnel
from acme.om.storage.roles import DatabaseRole
from acme.om.types import EMPTY_UUID
from acme.om.work.rules import refuse_nul
from acme.om.work.storage import WorkStorageInterface
from acme.om.work.storage.impl import postgres_statements
from acme.om.work.storage.impl.memory import MemoryWorkStorage
from acme.om.work.storage.impl.postgres import PostgresWorkStorage
from acme.om.work.storage.impl.sqlite import SqliteWorkStorage
from acme.om.work.storage.tables.work_items import work_items
from acme.om.work.types.work_item import WorkItem, WorkKind, WorkStatus
from contracts.work_storage import WorkStorageContract


class TestMemoryWorkStorage(WorkStorageContract):
    """The contract over the in-memory table; time moves only when the test moves it."""

    @pytest.fixture
    def storage(self) -> MemoryWorkStorage:
        self.clock = FakeClock()
        return MemoryWorkStorage(clock=self.clock)

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    async def store(self, storage: WorkStorageInterface, values: dict[str, Any]) -> None:
        """Into the memory table unvalidated (`model_construct`); the status and a kind
        `WorkKind` names typed as the SQL tables read them back."""
        assert isinstance(storage, MemoryWorkStorage)
        row = {**values, "status": WorkStatus(values["status"])}
        with contextlib.suppress(ValueError):
            row["kind"] = WorkKind(values["kind"])
        storage._rows[row["id"]] = WorkItem.model_construct(**row)


class TestSqliteWorkStorage(WorkStorageContract):
    """The contract over a SQLite file built by `create_all`; time is SQLite's clock.

    After `store`, the file's checks are off on every connection the storage takes, as on a
    file made before the table had them (`create_all` never alters a table that exists), so
    the storage meets a runnable row its table would refuse today.
    """

    @pytest.fixture
    async def storage(self, tmp_path: Path) -> AsyncIterator[SqliteWorkStorage]:
        url = f"sqlite+aiosqlite:///{tmp_path / 'work.db'}"
        create_all(url)
        engine = create_async_engine(url, connect_args={"timeout": 30})
        self.lax = False
        event.listen(engine.sync_engine, "checkout", self._checks)
        self.funnel = StorageFunnel(dict.fromkeys(DatabaseRole, engine))
        try:
            yield SqliteWorkStorage(self.funnel)
        finally:
            await self.funnel.dispose()

    def _checks(self, dbapi_connection: Any, *_: Any) -> None:
        ignore = "ON" if self.lax else "OFF"
        dbapi_connection.cursor().execute(f"PRAGMA ignore_check_constraints = {ignore}")

    async def advance(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def store(self, storage: WorkStorageInterface, values: dict[str, Any]) -> None:
        self.lax = True
        await store_row(self.funnel, values)


async def _run(funnel: StorageFunnel, tenant: UUID, statement: Executable) -> None:
    async with funnel.session(DatabaseRole.QUEUE, tenant) as conn:
        await conn.execute(statement)


async def test_the_sqlite_table_keeps_a_payload_that_is_no_object_off_runnable_rows(
    tmp_path: Path,
) -> None:
    """`ck_work_items_payload` (`json_type` on SQLite): a row that can run holds a JSON
    object; a dead letter may keep what it holds, and nothing makes it runnable again."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'work.db'}"
    create_all(url)
    funnel = StorageFunnel.from_url(url, pool_size=1)
    tenant = uuid4()
    try:
        for status in ("AVAILABLE", "CLAIMED"):
            row = stored_row(tenant, "default", payload=[1], status=status)
            with pytest.raises(IntegrityError, match="ck_work_items_payload"):
                await _run(funnel, tenant, insert(work_items).values(**row))
        dead = stored_row(tenant, "default", payload=[1], status="FAILED")
        await _run(funnel, tenant, insert(work_items).values(**dead))
        revive = (
            update(work_items)
            .where(work_items.c.id == dead["id"])
            .values(status=WorkStatus.AVAILABLE.value)
        )
        with pytest.raises(IntegrityError, match="ck_work_items_payload"):
            await _run(funnel, tenant, revive)
        assert await SqliteWorkStorage(funnel).revive_item(tenant, dead["id"]) is None
    finally:
        await funnel.dispose()


async def test_sqlite_and_memory_have_no_snapshot_to_report(tmp_path: Path) -> None:
    """Only PostgreSQL keeps old row versions for open snapshots; the others answer None,
    and the manager then leaves `work_queue_oldest_snapshot_xid_age` unset."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'work.db'}"
    create_all(url)
    funnel = StorageFunnel(dict.fromkeys(DatabaseRole, create_async_engine(url)))
    try:
        assert await SqliteWorkStorage(funnel).oldest_snapshot(EMPTY_UUID) is None
    finally:
        await funnel.dispose()
    assert await MemoryWorkStorage().oldest_snapshot(EMPTY_UUID) is None


@pytest.mark.parametrize(
    ("storage", "reason"),
    [
        (PostgresWorkStorage, r", which PostgreSQL cannot store$"),
        (SqliteWorkStorage, r", refused on SQLite too, so that what works on the embedded "),
        (MemoryWorkStorage, r", refused in memory too, so that what works in tests "),
    ],
)
def test_a_nul_refusal_gives_the_reason_of_the_storage_s_own_backend(
    storage: type[WorkStorageInterface], reason: str
) -> None:
    """Every backend refuses a NUL character alike; each names the reason true there."""
    with pytest.raises(Invalid, match=rf"^payload\.note: holds a NUL .*\(U\+0000\){reason}"):
        refuse_nul({"note": "a\x00b"}, "payload", storage.backend)


def test_each_hot_postgresql_statement_is_one_text_in_both_bind_styles() -> None:
    """The held connection's form (asyncpg, `$n`) and the funnel session's (SQLAlchemy,
    `:name`) of each hot statement are one text: the numbered form with each `$n` read as
    the n-th parameter's name is the named form, so neither path can drift from the other."""
    hot = [
        *postgres_statements.INSERTS.values(),
        postgres_statements.NEW,
        postgres_statements.HOLDERS,
        postgres_statements.claim_statement(1, 1),
        postgres_statements.claim_statement(3, 10),
        postgres_statements.COMPLETE,
        postgres_statements.UNREADABLE_DEAD_LETTER,
    ]
    for statement in hot:
        names = [f":{name}" for name in statement.names]

        def name_of(number: re.Match[str], names: list[str] = names) -> str:
            return names[int(number[1]) - 1]

        clause = statement.named
        named = clause.element if isinstance(clause, TextualSelect) else clause
        assert re.sub(r"\$(\d+)\b", name_of, statement.numbered) == named.text
    claim = postgres_statements.claim_statement(3, 10).numbered
    # Its lane and kinds read through an init plan, (docs/decisions/0057).
    assert "CAST($1 AS text) AS lane, CAST($4 AS text) AS kind_0" in claim
    assert "kind IN ((SELECT kind_0 FROM args), (SELECT kind_1 FROM args)" in claim
    # The limit is written, never bound: a bound LIMIT keeps PostgreSQL planning each call.
    assert "LIMIT 10)" in claim
    assert "LIMIT $" not in claim
    with pytest.raises(ValueError, match="at least one item"):
        postgres_statements.claim_statement(1, 0)
    for fenced in (postgres_statements.COMPLETE, postgres_statements.UNREADABLE_DEAD_LETTER):
        assert "claim_token = " in fenced.numbered  # each write fenced on its claim's token
