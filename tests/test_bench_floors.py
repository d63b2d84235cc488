"""The bench's wake-up floor across processes (`bench/notify_floor.py`) on the real
PostgreSQL, in a scratch database of its own: every row inserted is woken and claimed by
the listener process, each latency is a real span of time, and the table is gone after."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from conftest import ADMIN_URL

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import notify_floor  # bench/ is no package: found through the path set above


async def _admin(statement: str) -> None:
    conn = await asyncpg.connect(ADMIN_URL)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def _count(dsn: str, sql: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        found: int = await conn.fetchval(sql)
        return found
    finally:
        await conn.close()


@pytest.fixture
def scratch_dsn() -> Iterator[str]:
    name = f"bench_floor_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(f"CREATE DATABASE {name}"))
    try:
        yield f"{ADMIN_URL.rsplit('/', 1)[0]}/{name}"
    finally:
        asyncio.run(_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def test_every_row_is_woken_and_claimed_across_processes_and_the_table_dropped(
    scratch_dsn: str,
) -> None:
    latencies = notify_floor.measure(scratch_dsn, 20, 0.01)

    assert len(latencies) == 20  # a row the listener never claimed would be left out
    assert latencies == sorted(latencies)
    assert all(0.0 < ms < 5_000 for ms in latencies)
    left = "SELECT count(*) FROM pg_class WHERE relname LIKE 'notify_floor%'"
    assert asyncio.run(_count(scratch_dsn, left)) == 0
