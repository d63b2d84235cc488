"""The work storage contract: an operator's cancel (the template's docs/guarantees.md,
"Cancelling an item") and the retention of cancelled rows."""

from __future__ import annotations

from uuid import UUID, uuid4

import pytest
from work_fixtures import KIND, make_item, outcome, token_of

from acme.om.errors import Conflict
from acme.om.work.storage import WorkStorageInterface
from acme.om.work.types.work_item import ItemCancelled, WorkStatus
from contracts.work_storage_base import (
    LAPSED_LEASE_S,
    LEASE_S,
    PAST_LAPSED_S,
    StorageCases,
)


class CancelCases(StorageCases):
    """Cancelling waiting and claimed items, the holder's refused writes, the purge."""

    async def test_cancel_makes_a_waiting_item_cancelled_and_never_claimed(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        waiting = await self.enqueue(storage, make_item(org, lane))
        later = await self.enqueue(storage, make_item(org, lane, delay=0.1))
        cancelled = await storage.cancel_item(org, waiting.id)
        assert cancelled is not None
        assert cancelled.status is WorkStatus.CANCELLED
        assert cancelled.note == "cancelled"
        assert cancelled.claim_token is None
        assert await storage.cancel_item(org, later.id) is not None
        await self.advance(PAST_LAPSED_S)  # `later` is due
        assert await storage.claim_next(lane, [KIND], "w1", LEASE_S) == []
        assert await storage.read_item(org, waiting.id) == cancelled

    async def test_cancel_of_a_claimed_item_refuses_its_holders_writes_as_cancelled(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane)
        cancelled = await storage.cancel_item(org, claimed.id)
        assert cancelled is not None
        assert cancelled.status is WorkStatus.CANCELLED
        assert cancelled.claim_token == claimed.claim_token  # kept: the holder tells
        assert cancelled.claimed_by == "w1"
        assert cancelled.lease_expires_at is None
        assert cancelled.attempts == 1
        with pytest.raises(ItemCancelled):
            await storage.write_item(org, claimed, token_of(claimed), lease_for=LEASE_S)
        with pytest.raises(ItemCancelled):
            await storage.write_item(org, outcome(claimed, WorkStatus.COMPLETED), token_of(claimed))
        assert await storage.complete_items([(org, claimed.id, token_of(claimed))]) == set()
        assert await storage.read_item(org, claimed.id) == cancelled

    async def test_a_write_under_another_token_of_a_cancelled_item_is_a_plain_conflict(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane)
        await storage.cancel_item(org, claimed.id)
        with pytest.raises(Conflict) as refused:
            await storage.write_item(org, outcome(claimed, WorkStatus.COMPLETED), uuid4())
        assert not isinstance(refused.value, ItemCancelled)

    async def test_the_sweep_never_hands_back_a_cancelled_item(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """A dead holder's cancelled item stays cancelled: its lease is gone with it."""
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane, lease=LAPSED_LEASE_S)
        await storage.cancel_item(org, claimed.id)
        await self.advance(PAST_LAPSED_S)
        assert await storage.requeue_stale(org, None, 10) == []
        stored = await storage.read_item(org, claimed.id)
        assert stored is not None
        assert stored.status is WorkStatus.CANCELLED
        assert await storage.claim_next(lane, [KIND], "w2", LEASE_S) == []

    async def test_cancel_refuses_a_finished_discarded_or_unknown_item(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        done = await self.complete_one(storage, lane, org)
        await self.enqueue(storage, make_item(org, lane, max_attempts=1))
        dead = await self.claim_one(storage, lane)
        await storage.write_item(org, outcome(dead, WorkStatus.FAILED), token_of(dead))
        assert await storage.cancel_item(org, done.id) is None
        assert await storage.cancel_item(org, dead.id) is None
        await storage.discard_item(org, dead.id)
        assert await storage.cancel_item(org, dead.id) is None
        assert await storage.cancel_item(org, uuid4()) is None
        waiting = await self.enqueue(storage, make_item(org, lane))
        assert await storage.cancel_item(uuid4(), waiting.id) is None  # another tenant's
        assert await storage.cancel_item(org, waiting.id) is not None
        assert await storage.cancel_item(org, waiting.id) is None  # cancelled already

    async def test_a_completion_that_commits_first_leaves_nothing_to_cancel(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        done = await self.complete_one(storage, lane, org)
        assert await storage.cancel_item(org, done.id) is None
        stored = await storage.read_item(org, done.id)
        assert stored is not None
        assert stored.status is WorkStatus.COMPLETED

    async def test_purge_cancelled_removes_only_cancelled_rows_past_retention(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        done = await self.complete_one(storage, lane, org)
        first = await self.enqueue(storage, make_item(org, lane))
        await storage.cancel_item(org, first.id)
        await self.advance(0.05)
        second = await self.enqueue(storage, make_item(org, lane))
        await storage.cancel_item(org, second.id)
        waiting = await self.enqueue(storage, make_item(org, lane))
        assert await storage.purge_cancelled(org, 3600, 10) == 0
        await self.advance(0.01)
        assert await storage.purge_cancelled(uuid4(), 0, 10) == 0
        assert await storage.purge_cancelled(org, 0, 1) == 1  # the oldest cancel first
        assert await storage.read_item(org, first.id) is None
        assert await storage.purge_cancelled(org, 0, 10) == 1
        left = {i.id: i.status for i in await storage.list_items(org, limit=10)}
        assert left == {done.id: WorkStatus.COMPLETED, waiting.id: WorkStatus.AVAILABLE}
