"""The work storage contract: the sweep, retention and the operator's writes."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID, uuid4

import pytest
from work_fixtures import KIND, make_item, outcome, token_of

from acme.om.errors import Conflict
from acme.om.types import EMPTY_UUID
from acme.om.work.rules import is_stale
from acme.om.work.storage import WorkStorageInterface
from acme.om.work.types.work_item import WorkItem, WorkStatus
from contracts.work_storage_base import (
    LAPSED_LEASE_S,
    LEASE_S,
    PAST_LAPSED_S,
    PAST_SHORT_S,
    SHORT_LEASE_S,
    StorageCases,
)


class SweepCases(StorageCases):
    """The sweep, retention and the operator's writes."""

    # -- the sweep -----------------------------------------------------------------------

    async def test_requeue_stale_hands_back_an_item_whose_lease_passed(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane, lease=SHORT_LEASE_S)
        assert await storage.requeue_stale(org, None, 10) == []
        await self.advance(PAST_SHORT_S)
        (moved,) = await storage.requeue_stale(org, None, 10)
        assert moved.id == claimed.id
        assert moved.status is WorkStatus.AVAILABLE
        assert moved.attempts == 1
        assert moved.claim_token is None
        assert moved.lease_expires_at is None
        assert moved.note == "lease expired"
        again = await self.claim_one(storage, lane, worker="w2")
        assert again.attempts == 2
        with pytest.raises(Conflict):
            await storage.write_item(org, outcome(claimed, WorkStatus.COMPLETED), token_of(claimed))

    async def test_requeue_stale_dead_letters_an_item_out_of_attempts(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """oban-bg/oban#137: a crashed item out of attempts is failed, never run again."""
        await self.enqueue(storage, make_item(org, lane, max_attempts=1))
        await self.claim_one(storage, lane, lease=LAPSED_LEASE_S)
        await self.advance(PAST_LAPSED_S)
        (moved,) = await storage.requeue_stale(org, None, 10)
        assert moved.status is WorkStatus.FAILED
        assert moved.last_error == "lease expired on the last attempt"
        assert await storage.claim_next(lane, [KIND], "w1", LEASE_S) == []

    async def test_stale_filter_is_rules_is_stale(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """The sweep statement moves exactly the rows `rules.is_stale` accepts, boundary
        included (a lease ending exactly at `before` is not stale)."""
        held: list[WorkItem] = []
        for lease in (100.0, 200.0, 300.0):
            await self.enqueue(storage, make_item(org, lane))
            held.append(await self.claim_one(storage, lane, lease=lease))
        await self.enqueue(storage, make_item(org, lane))
        snapshot = await storage.list_items(org, limit=10)
        assert held[1].lease_expires_at is not None
        assert held[2].lease_expires_at is not None
        before = held[1].lease_expires_at
        expected = {i.id for i in snapshot if is_stale(i, before)}
        assert {m.id for m in await storage.requeue_stale(org, before, 10)} == expected
        assert expected == {held[0].id}
        before = held[2].lease_expires_at + timedelta(microseconds=1)
        snapshot = await storage.list_items(org, limit=10)
        expected = {i.id for i in snapshot if is_stale(i, before)}
        assert {m.id for m in await storage.requeue_stale(org, before, 10)} == expected
        assert expected == {held[1].id, held[2].id}

    async def test_requeue_stale_moves_at_most_limit(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        for _ in range(3):
            await self.enqueue(storage, make_item(org, lane))
        await storage.claim_next(lane, [KIND], "w1", LAPSED_LEASE_S, limit=3)
        await self.advance(PAST_LAPSED_S)
        assert len(await storage.requeue_stale(org, None, 2)) == 2
        assert len(await storage.requeue_stale(org, None, 2)) == 1

    async def test_sweep_leaves_an_item_completed_after_it_went_stale(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """riverqueue/river#1302: a sweep that counts the item stale by its `before` finds
        it completed under the still-valid token and moves nothing."""
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane)
        assert claimed.lease_expires_at is not None
        before = claimed.lease_expires_at + timedelta(seconds=60)
        snapshot = await storage.read_item(org, claimed.id)
        assert snapshot is not None
        assert is_stale(snapshot, before)
        await storage.write_item(org, outcome(claimed, WorkStatus.COMPLETED), token_of(claimed))
        assert await storage.requeue_stale(org, before, 10) == []
        done = await storage.read_item(org, claimed.id)
        assert done is not None
        assert done.status is WorkStatus.COMPLETED

    # -- operator writes -----------------------------------------------------------------

    async def test_revive_and_discard_act_on_failed_items_only(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        item = await self.enqueue(storage, make_item(org, lane, max_attempts=1))
        assert await storage.revive_item(org, item.id) is None
        assert await storage.discard_item(org, item.id) is None
        claimed = await self.claim_one(storage, lane)
        await storage.write_item(
            org, outcome(claimed, WorkStatus.FAILED, last_error="boom"), token_of(claimed)
        )
        assert await storage.revive_item(uuid4(), item.id) is None
        revived = await storage.revive_item(org, item.id)
        assert revived is not None
        assert (revived.status, revived.attempts, revived.updated_by) == (
            WorkStatus.AVAILABLE,
            0,
            EMPTY_UUID,
        )
        claimed = await self.claim_one(storage, lane)
        await storage.write_item(org, outcome(claimed, WorkStatus.FAILED), token_of(claimed))
        discarded = await storage.discard_item(org, item.id)
        assert discarded is not None
        assert discarded.deleted_at is not None
        assert await storage.list_items(org) == []
        assert await storage.discard_item(org, item.id) is None

    async def test_purge_deleted_removes_rows_past_retention(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane, max_attempts=1))
        claimed = await self.claim_one(storage, lane)
        await storage.write_item(org, outcome(claimed, WorkStatus.FAILED), token_of(claimed))
        await storage.discard_item(org, claimed.id)
        assert await storage.purge_deleted(org, 3600) == 0
        assert await storage.purge_deleted(uuid4(), 0) == 0
        await self.advance(0.01)
        assert await storage.purge_deleted(org, 0) == 1
        assert await storage.read_item(org, claimed.id) is None

    async def test_purge_completed_removes_only_completed_rows_past_retention(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        done = await self.complete_one(storage, lane, org)
        await self.enqueue(storage, make_item(org, lane, max_attempts=1))
        dead = await self.claim_one(storage, lane)
        await storage.write_item(org, outcome(dead, WorkStatus.FAILED), token_of(dead))
        held = await self.enqueue(storage, make_item(org, lane))
        await self.claim_one(storage, lane)
        waiting = await self.enqueue(storage, make_item(org, lane))
        assert await storage.purge_completed(org, 3600, 10) == 0
        await self.advance(0.01)
        assert await storage.purge_completed(uuid4(), 0, 10) == 0
        assert await storage.read_item(org, done.id) == done
        assert await storage.purge_completed(org, 0, 10) == 1
        assert await storage.read_item(org, done.id) is None
        left = {i.id: i.status for i in await storage.list_items(org, limit=10)}
        assert left == {
            dead.id: WorkStatus.FAILED,
            held.id: WorkStatus.CLAIMED,
            waiting.id: WorkStatus.AVAILABLE,
        }
        assert await storage.purge_completed(org, 0, 10) == 0

    async def test_purge_completed_deletes_at_most_limit_oldest_first(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        done: list[WorkItem] = []
        for _ in range(3):
            done.append(await self.complete_one(storage, lane, org))
            await self.advance(0.01)
        assert await storage.purge_completed(org, 0, 2) == 2
        assert [i.id for i in await storage.list_items(org, limit=10)] == [done[2].id]
        assert await storage.purge_completed(org, 0, 2) == 1
        assert await storage.list_items(org, limit=10) == []

    async def test_list_items_filters_and_queue_stats_count(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        for _ in range(2):
            await self.enqueue(storage, make_item(org, lane))
        await self.claim_one(storage, lane)
        other = uuid4()
        await self.enqueue(storage, make_item(other, lane))
        assert len(await storage.list_items(org, status=WorkStatus.AVAILABLE, kind=KIND)) == 1
        assert len(await storage.list_items(org, status=WorkStatus.CLAIMED)) == 1
        stats = {(s.status, s.count) for s in await storage.queue_stats(org) if s.lane == lane}
        everyone = {
            (s.status, s.count) for s in await storage.queue_stats(EMPTY_UUID) if s.lane == lane
        }
        assert sum(n for _, n in stats) == 2
        assert sum(n for _, n in everyone) == 3
        assert (WorkStatus.CLAIMED, 1) in everyone

    async def test_queue_stats_age_the_oldest_due_item_on_the_storage_clock(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        for _ in range(2):
            await self.enqueue(storage, make_item(org, lane))
        await self.enqueue(storage, make_item(org, lane, delay=3600))
        await self.claim_one(storage, lane)
        later = f"{lane}-later"
        await self.enqueue(storage, make_item(org, later, delay=3600))
        await self.advance(PAST_SHORT_S)

        stats = {(s.lane, s.status): s for s in await storage.queue_stats(EMPTY_UUID)}
        available = stats[lane, WorkStatus.AVAILABLE]
        assert available.count == 2
        assert available.oldest_available_age is not None
        assert PAST_SHORT_S - 0.05 <= available.oldest_available_age < LEASE_S
        assert stats[lane, WorkStatus.CLAIMED].oldest_available_age is None
        assert stats[later, WorkStatus.AVAILABLE].oldest_available_age == 0.0
