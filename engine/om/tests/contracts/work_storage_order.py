"""The work storage contract: the claim's order, priorities within a tenant and a fair
share between tenants (docs/decisions/0036, 0037)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

from work_fixtures import KIND, make_item, stored_row

from acme.om.work.storage import WorkStorageInterface
from acme.om.work.types.work_item import PRIORITY_AGING_S, PRIORITY_MAX, WorkItem
from contracts.work_storage_base import LEASE_S, StorageCases


def oldest_first(items: list[WorkItem]) -> list[WorkItem]:
    """`items` oldest `available_at` first, then by id (a fake clock gives them one time)."""
    return sorted(items, key=lambda i: (i.available_at, i.id))


class OrderCases(StorageCases):
    """Priorities with aging within a tenant; tenants share first."""

    async def claim_ids(self, storage: WorkStorageInterface, lane: str, limit: int) -> list[UUID]:
        return [c.id for c in await storage.claim_next(lane, [KIND], "w1", LEASE_S, limit=limit)]

    async def backlog(
        self, storage: WorkStorageInterface, org: UUID, lane: str, count: int, priority: int = 0
    ) -> list[WorkItem]:
        return [
            await self.enqueue(storage, make_item(org, lane, priority=priority))
            for _ in range(count)
        ]

    # -- within a tenant -------------------------------------------------------------------

    async def test_a_tenants_items_go_higher_priority_first_then_oldest_first(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        low, high, lowest, other_high = [
            await self.enqueue(storage, make_item(org, lane, priority=p)) for p in (0, 5, -3, 5)
        ]
        highs = sorted([high, other_high], key=lambda i: (i.available_at, i.id))
        claimed = [(await self.claim_one(storage, lane)).id for _ in range(4)]
        assert claimed == [highs[0].id, highs[1].id, low.id, lowest.id]

    async def test_the_default_priority_keeps_the_oldest_first(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        items = await self.backlog(storage, org, lane, 3)
        assert [i.priority for i in items] == [0, 0, 0]
        claimed = await self.claim_ids(storage, lane, 3)
        assert claimed == [i.id for i in oldest_first(items)]

    async def test_an_item_due_longer_than_the_head_start_goes_before_a_higher_priority(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """Aging: a priority level is a head start of `PRIORITY_AGING_S`, so an item waits
        behind no higher-priority item that became due more than the gap's worth after it."""
        now = datetime.now(UTC)
        head_start = timedelta(seconds=PRIORITY_AGING_S * PRIORITY_MAX)
        starved = stored_row(org, lane, available_at=now - head_start - timedelta(minutes=5))
        recent = stored_row(org, lane, available_at=now - head_start + timedelta(minutes=5))
        await self.store(storage, starved)
        await self.store(storage, recent)
        urgent = await self.enqueue(storage, make_item(org, lane, priority=PRIORITY_MAX))
        claimed = [(await self.claim_one(storage, lane)).id for _ in range(3)]
        assert claimed == [starved["id"], urgent.id, recent["id"]]

    # -- between tenants -------------------------------------------------------------------

    async def test_tenants_share_a_claim_before_any_takes_a_second_turn(
        self, storage: WorkStorageInterface, lane: str
    ) -> None:
        big, small = uuid4(), uuid4()
        older = oldest_first(await self.backlog(storage, big, lane, 6))
        newer = oldest_first(await self.backlog(storage, small, lane, 2))
        claimed = await self.claim_ids(storage, lane, 4)
        assert sorted(claimed, key=str) == sorted([i.id for i in older[:2] + newer[:2]], key=str)

    async def test_slots_a_small_tenant_leaves_go_to_the_others(
        self, storage: WorkStorageInterface, lane: str
    ) -> None:
        big, small = uuid4(), uuid4()
        older = oldest_first(await self.backlog(storage, big, lane, 6))
        (only,) = await self.backlog(storage, small, lane, 1)
        claimed = await self.claim_ids(storage, lane, 4)
        ids = [i.id for i in older]
        assert set(claimed) == {only.id, *(i.id for i in older[:3])}, [
            ids.index(c) if c in ids else "B" for c in claimed
        ]

    async def test_a_priority_buys_no_bigger_share(
        self, storage: WorkStorageInterface, lane: str
    ) -> None:
        urgent, plain = uuid4(), uuid4()
        await self.backlog(storage, urgent, lane, 4, priority=PRIORITY_MAX)
        await self.backlog(storage, plain, lane, 4)
        claimed = await storage.claim_next(lane, [KIND], "w1", LEASE_S, limit=4)
        assert Counter(c.org_id for c in claimed) == {urgent: 2, plain: 2}

    async def test_one_slot_claims_reach_a_new_tenant_behind_a_backlog(
        self, storage: WorkStorageInterface, lane: str
    ) -> None:
        """A claim of one slot takes the next due tenant's turn, not the oldest item:
        behind 30 older items of another tenant, a new tenant's item is one of the next
        two one-slot claims, not the 31st."""
        await self.backlog(storage, uuid4(), lane, 30)
        (item,) = await self.backlog(storage, uuid4(), lane, 1)
        claimed = [(await self.claim_one(storage, lane)).id for _ in range(2)]
        assert item.id in claimed

    async def test_one_slot_claims_serve_the_due_tenants_in_turn(
        self, storage: WorkStorageInterface, lane: str
    ) -> None:
        """One-slot claims go round the due tenants by id (`OneSlotTurns`): over three
        tenants of three items each, every round of three claims takes one item of each
        tenant, in the same order each round, and each tenant's oldest first."""
        orgs = (uuid4(), uuid4(), uuid4())
        backlogs = {org: await self.backlog(storage, org, lane, 3) for org in orgs}
        claimed = [await self.claim_one(storage, lane) for _ in range(9)]
        rounds = [[c.org_id for c in claimed[n : n + 3]] for n in (0, 3, 6)]
        assert sorted(rounds[0]) == sorted(backlogs)
        assert rounds[1] == rounds[0]
        assert rounds[2] == rounds[0]
        for org, items in backlogs.items():
            assert [c.id for c in claimed if c.org_id == org] == [i.id for i in oldest_first(items)]
