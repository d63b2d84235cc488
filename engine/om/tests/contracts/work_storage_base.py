"""The work storage contract's base: its hooks, constants and shared steps."""

from __future__ import annotations

from typing import Any
from uuid import UUID, uuid4

import pytest
from work_fixtures import KIND, make_item, outcome, token_of

from acme.om.work.storage import Created, WorkStorageInterface
from acme.om.work.types.work_item import WorkItem, WorkStatus

LEASE_S = 30.0
"""A lease no test outlives unless it advances past it (s)."""

SHORT_LEASE_S = 0.3
"""A lease a test outlives by advancing `PAST_SHORT_S` (s)."""

PAST_SHORT_S = 0.4
"""Past `SHORT_LEASE_S`: a wait never ends early, so a small margin is enough (s)."""

LAPSED_LEASE_S = 0.05
"""A lease a case lets pass with nothing to check while it holds (s)."""

PAST_LAPSED_S = 0.15
"""Past `LAPSED_LEASE_S` (s)."""

RACE_ROUNDS = 200
"""Rounds of the raced claim (two claimers at once, exactly one wins)."""


class StorageCases:
    """What every case uses: the hooks a subclass provides (`storage`, `advance`, `store`),
    a lane and a tenant of the test's own, and the steps most cases start with."""

    async def advance(self, seconds: float) -> None:
        """Let `seconds` of storage-clock time pass."""
        raise NotImplementedError

    async def store(self, storage: WorkStorageInterface, values: dict[str, Any]) -> None:
        """Store `values` (`work_fixtures.stored_row`) as one row, unvalidated, whatever the
        table's checks say: a row written around the manager, or before a check existed."""
        raise NotImplementedError

    @pytest.fixture
    def lane(self) -> str:
        """A lane of the test's own, so tests sharing a database never claim each other's."""
        return f"lane_{uuid4().hex[:12]}"

    @pytest.fixture
    def org(self) -> UUID:
        return uuid4()

    async def enqueue(self, storage: WorkStorageInterface, item: WorkItem) -> WorkItem:
        created = await storage.create_item(item.org_id, item)
        assert created == Created(item.id, True)
        stored = await storage.read_item(item.org_id, item.id)
        assert stored is not None
        return stored

    async def claim_one(
        self,
        storage: WorkStorageInterface,
        lane: str,
        *,
        worker: str = "w1",
        lease: float = LEASE_S,
    ) -> WorkItem:
        claimed = await storage.claim_next(lane, [KIND], worker, lease)
        assert len(claimed) == 1
        return claimed[0]

    async def complete_one(self, storage: WorkStorageInterface, lane: str, org: UUID) -> WorkItem:
        """Enqueue, claim and complete one item of `org` on `lane`; the row as written."""
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane)
        return await storage.write_item(
            org, outcome(claimed, WorkStatus.COMPLETED), token_of(claimed)
        )
