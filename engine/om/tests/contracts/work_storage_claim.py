"""The work storage contract: the claim, the lease and fencing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from uuid import UUID, uuid4

import pytest
from work_fixtures import KIND, make_item, outcome, token_of

from acme.om.errors import Conflict, NotFound
from acme.om.types import EMPTY_UUID
from acme.om.work.rules import is_claimable
from acme.om.work.storage import WorkStorageInterface
from acme.om.work.types.work_item import WorkStatus
from contracts.work_storage_base import (
    LAPSED_LEASE_S,
    LEASE_S,
    PAST_LAPSED_S,
    PAST_SHORT_S,
    RACE_ROUNDS,
    SHORT_LEASE_S,
    StorageCases,
)


class ClaimCases(StorageCases):
    """The claim, the lease and fencing."""

    # -- the claim -----------------------------------------------------------------------

    async def test_claim_spends_an_attempt_and_mints_a_token_with_the_lease(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        item = await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane, worker="w1")
        assert claimed.id == item.id
        assert claimed.org_id == org
        assert claimed.status is WorkStatus.CLAIMED
        assert claimed.attempts == 1
        assert claimed.claimed_by == "w1"
        assert claimed.claim_token is not None
        assert claimed.claimed_at is not None
        assert claimed.lease_expires_at is not None
        lease = (claimed.lease_expires_at - claimed.claimed_at).total_seconds()
        assert lease == pytest.approx(LEASE_S, abs=0.01)
        assert claimed.claimed_at.tzinfo is not None
        assert claimed.updated_by == EMPTY_UUID
        assert await storage.read_item(org, item.id) == claimed

    async def test_a_claimed_item_is_not_claimed_again(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        await self.claim_one(storage, lane, worker="w1")
        assert await storage.claim_next(lane, [KIND], "w2", LEASE_S) == []

    async def test_claim_many_takes_the_oldest_each_under_its_own_token(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        items = [await self.enqueue(storage, make_item(org, lane)) for _ in range(3)]
        claimed = await storage.claim_next(lane, [KIND], "w1", LEASE_S, limit=2)
        oldest = sorted(items, key=lambda i: (i.available_at, i.id))[:2]
        assert [c.id for c in claimed] == [i.id for i in oldest]
        assert len({c.claim_token for c in claimed}) == 2

    async def test_claim_skips_other_lanes_future_items_and_unasked_kinds(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane + "-other"))
        await self.enqueue(storage, make_item(org, lane, delay=3600))
        assert await storage.claim_next(lane, [], "w1", LEASE_S) == []
        assert await storage.claim_next(lane, [KIND], "w1", LEASE_S) == []

    async def test_claim_filter_is_rules_is_claimable(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """The claim statement takes exactly the rows `rules.is_claimable` accepts."""
        now = datetime.now(UTC)
        rows = [
            make_item(org, lane),
            make_item(org, lane, delay=3600),
            make_item(org, lane, attempts=3, max_attempts=3),
            make_item(org, lane, deleted_at=now),
            make_item(org, lane, status=WorkStatus.COMPLETED),
            make_item(org, lane, status=WorkStatus.FAILED),
        ]
        stored = [await self.enqueue(storage, r) for r in rows]
        claimed = await storage.claim_next(lane, [KIND], "w1", LEASE_S, limit=10)
        expected = {i.id for i in stored if is_claimable(i, datetime.now(UTC))}
        assert {c.id for c in claimed} == expected == {rows[0].id}

    async def test_raced_claim_has_exactly_one_winner(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """Two claimers at once against one item, `RACE_ROUNDS` times: one wins each round."""
        for _ in range(RACE_ROUNDS):
            item = await self.enqueue(storage, make_item(org, lane))
            first, second = await asyncio.gather(
                storage.claim_next(lane, [KIND], "w1", LEASE_S),
                storage.claim_next(lane, [KIND], "w2", LEASE_S),
            )
            winners = first + second
            assert [w.id for w in winners] == [item.id]
            await storage.write_item(
                org, outcome(winners[0], WorkStatus.COMPLETED), token_of(winners[0])
            )

    # -- the lease and fencing -----------------------------------------------------------

    async def test_extending_the_lease_moves_its_end_and_keeps_the_token(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane, lease=SHORT_LEASE_S)
        renewed = await storage.write_item(org, claimed, token_of(claimed), lease_for=LEASE_S)
        assert renewed.claim_token == claimed.claim_token
        assert renewed.status is WorkStatus.CLAIMED
        assert renewed.lease_expires_at is not None
        assert claimed.lease_expires_at is not None
        assert renewed.lease_expires_at > claimed.lease_expires_at
        await self.advance(PAST_SHORT_S)
        done = await storage.write_item(
            org, outcome(renewed, WorkStatus.COMPLETED), token_of(renewed)
        )
        assert done.status is WorkStatus.COMPLETED
        assert done.completed_at is not None

    async def test_completion_after_the_lease_passed_is_refused(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane, lease=LAPSED_LEASE_S)
        await self.advance(PAST_LAPSED_S)
        with pytest.raises(Conflict):
            await storage.write_item(org, outcome(claimed, WorkStatus.COMPLETED), token_of(claimed))
        assert await storage.read_item(org, claimed.id) == claimed

    async def test_completion_with_an_earlier_token_of_the_same_worker_is_refused(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """One worker holds one item twice across a requeue: only the newer token writes."""
        await self.enqueue(storage, make_item(org, lane))
        first = await self.claim_one(storage, lane, worker="w1")
        await storage.write_item(
            org, outcome(first, WorkStatus.AVAILABLE, attempts=0), token_of(first), available_in=0
        )
        second = await self.claim_one(storage, lane, worker="w1")
        assert second.claim_token != first.claim_token
        with pytest.raises(Conflict):
            await storage.write_item(org, outcome(first, WorkStatus.COMPLETED), token_of(first))
        assert await storage.read_item(org, second.id) == second
        done = await storage.write_item(
            org, outcome(second, WorkStatus.COMPLETED), token_of(second)
        )
        assert done.status is WorkStatus.COMPLETED

    async def test_complete_items_fences_each_row_on_its_own_token(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """A batched completion is the same fence as `write_item`, per row: the rows held
        under their tokens complete; a stale token (here, an earlier claim of the same
        worker) and an unclaimed row are left exactly as they stood."""
        for _ in range(4):
            await self.enqueue(storage, make_item(org, lane))
        first, second, third, fourth = await storage.claim_next(
            lane, [KIND], "w1", LEASE_S, limit=4
        )
        await storage.write_item(
            org, outcome(second, WorkStatus.AVAILABLE, attempts=0), token_of(second), available_in=0
        )
        again = await self.claim_one(storage, lane, worker="w1")
        assert again.id == second.id
        await storage.write_item(
            org, outcome(fourth, WorkStatus.AVAILABLE, attempts=0), token_of(fourth), available_in=9
        )
        unclaimed = await storage.read_item(org, fourth.id)

        done = await storage.complete_items(
            [
                (org, first.id, token_of(first)),
                (org, second.id, token_of(second)),  # the earlier token
                (org, third.id, token_of(third)),
                (org, fourth.id, token_of(fourth)),  # handed back: no longer claimed
            ],
        )

        assert done == {first.id, third.id}
        for held in (first, third):
            row = await storage.read_item(org, held.id)
            assert row is not None
            assert row.status is WorkStatus.COMPLETED
            assert row.completed_at is not None
            assert row.claim_token is None
            assert row.lease_expires_at is None
            assert row.attempts == held.attempts
            assert row.updated_by == EMPTY_UUID
        assert await storage.read_item(org, again.id) == again
        assert await storage.read_item(org, fourth.id) == unclaimed

    async def test_complete_items_after_the_lease_passed_completes_nothing(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane, lease=LAPSED_LEASE_S)
        await self.advance(PAST_LAPSED_S)
        assert await storage.complete_items([(org, claimed.id, token_of(claimed))]) == set()
        assert await storage.read_item(org, claimed.id) == claimed
        assert await storage.complete_items([]) == set()

    async def test_complete_items_completes_the_rows_of_several_tenants_at_once(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """One call completes the held rows of every tenant it names (one statement on
        PostgreSQL and SQLite: docs/decisions/0054), each under its own tenant and token."""
        other = uuid4()
        await self.enqueue(storage, make_item(org, lane))
        await self.enqueue(storage, make_item(other, lane))
        held = await storage.claim_next(lane, [KIND], "w1", LEASE_S, limit=2)
        assert {item.org_id for item in held} == {org, other}

        done = await storage.complete_items([(i.org_id, i.id, token_of(i)) for i in held])

        assert done == {item.id for item in held}
        for item in held:
            row = await storage.read_item(item.org_id, item.id)
            assert row is not None
            assert row.status is WorkStatus.COMPLETED

    async def test_a_handed_back_item_is_due_after_its_delay(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane)
        later = await storage.write_item(
            org,
            outcome(claimed, WorkStatus.AVAILABLE),
            token_of(claimed),
            available_in=SHORT_LEASE_S,
        )
        assert later.claim_token is None
        assert await storage.claim_next(lane, [KIND], "w1", LEASE_S) == []
        await self.advance(PAST_SHORT_S)
        assert [i.id for i in await storage.claim_next(lane, [KIND], "w1", LEASE_S)] == [later.id]

    async def test_a_write_on_an_unclaimed_item_is_refused(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        item = await self.enqueue(storage, make_item(org, lane))
        with pytest.raises(Conflict):
            await storage.write_item(org, outcome(item, WorkStatus.COMPLETED), uuid4())
        with pytest.raises(NotFound):
            await storage.write_item(org, make_item(org, lane), uuid4())
