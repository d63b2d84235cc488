"""The work queue on the real PostgreSQL, as the application role under forced RLS.

The storage contract (the raced claim runs over two pooled connections at once) over the
storage as a worker builds it: enqueue, claim and completions on its held connections. The
engine's other cases (a pooler's and a funnel's paths, the table against the migrations,
peers' failure reports, unreadable rows) are in `test_work_storage_postgres_engine.py` in
the template's engine, which hosts do not receive.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from work_fixtures import lift_payload_check, restore_payload_check, store_row

from acme.om.storage.funnel import StorageFunnel
from acme.om.work.storage import WorkStorageInterface
from acme.om.work.storage.impl.postgres import PostgresWorkStorage
from contracts.work_storage import WorkStorageContract

pytestmark = pytest.mark.integration


class TestPostgresWorkStorage(WorkStorageContract):
    """The contract over PostgreSQL; time is the database's clock, so tests wait on it.

    The enqueue, the claim and the completions run on the storage's held connections
    (straight to the server, each statement alone under the tenant set on the session).
    `store` lifts the table's payload check (as the owner) for a payload that is no JSON
    object, and the check is put back after the test by the migrations' own SQL.
    """

    @pytest.fixture
    async def storage(
        self, pg_funnel: StorageFunnel, pg_owner_url: str
    ) -> AsyncIterator[PostgresWorkStorage]:
        self.funnel = pg_funnel
        self.owner_url = pg_owner_url
        yield PostgresWorkStorage(pg_funnel)
        await restore_payload_check(pg_owner_url)

    async def advance(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def store(self, storage: WorkStorageInterface, values: dict[str, Any]) -> None:
        if not isinstance(values["payload"], dict):
            await lift_payload_check(self.owner_url)
        await store_row(self.funnel, values)
