"""The work storage contract: one suite every `WorkStorageInterface` implementation passes.

Subclass `WorkStorageContract` in a `Test*` class, give it a `storage` fixture, an
`advance(seconds)` that lets that much storage-clock time pass (a fake clock moves; a
database's clock is waited on), and a `store(storage, values)` that stores a row as it is,
unvalidated, past the table's own checks (a row the storage's writes never make). The cases
cover claim exclusivity, lease, requeue, fencing, idempotency, tenants and the raced claim,
the replays of peers' failure reports (the template's docs/guarantees.md §2) that hold at
the storage level, rows that cannot be read, and the audit entries dead letters owe.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from work_fixtures import KIND, make_item, outcome, stored_row, token_of

from acme.om.errors import Conflict, NotFound
from acme.om.types import EMPTY_UUID
from acme.om.work.rules import is_claimable, is_stale
from acme.om.work.storage import Created, NewItems, OwedAudit, WorkStorageInterface
from acme.om.work.types.work_item import UnreadableItem, WorkItem, WorkStatus

LEASE = 30.0
"""A lease no test outlives unless it advances past it (s)."""

SHORT = 0.3
"""A lease a test outlives by advancing `PAST_SHORT` (s)."""

PAST_SHORT = 0.5

RACE_ROUNDS = 200
"""Rounds of the raced claim (two claimers at once, exactly one wins)."""


class WorkStorageContract:
    """The cases every work storage passes; subclasses provide `storage` and `advance`."""

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
        self, storage: WorkStorageInterface, lane: str, *, worker: str = "w1", lease: float = LEASE
    ) -> WorkItem:
        claimed = await storage.claim_next(lane, [KIND], worker, lease)
        assert len(claimed) == 1
        return claimed[0]

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
        assert lease == pytest.approx(LEASE, abs=0.01)
        assert claimed.claimed_at.tzinfo is not None
        assert claimed.updated_by == EMPTY_UUID
        assert await storage.read_item(org, item.id) == claimed

    async def test_a_claimed_item_is_not_claimed_again(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        await self.claim_one(storage, lane, worker="w1")
        assert await storage.claim_next(lane, [KIND], "w2", LEASE) == []

    async def test_claim_many_takes_the_oldest_each_under_its_own_token(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        items = [await self.enqueue(storage, make_item(org, lane)) for _ in range(3)]
        claimed = await storage.claim_next(lane, [KIND], "w1", LEASE, limit=2)
        oldest = sorted(items, key=lambda i: (i.available_at, i.id))[:2]
        assert [c.id for c in claimed] == [i.id for i in oldest]
        assert len({c.claim_token for c in claimed}) == 2

    async def test_claim_skips_other_lanes_future_items_and_unasked_kinds(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane + "-other"))
        await self.enqueue(storage, make_item(org, lane, delay=3600))
        assert await storage.claim_next(lane, [], "w1", LEASE) == []
        assert await storage.claim_next(lane, [KIND], "w1", LEASE) == []

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
        claimed = await storage.claim_next(lane, [KIND], "w1", LEASE, limit=10)
        expected = {i.id for i in stored if is_claimable(i, datetime.now(UTC))}
        assert {c.id for c in claimed} == expected == {rows[0].id}

    async def test_raced_claim_has_exactly_one_winner(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """Two claimers at once against one item, `RACE_ROUNDS` times: one wins each round."""
        for _ in range(RACE_ROUNDS):
            item = await self.enqueue(storage, make_item(org, lane))
            first, second = await asyncio.gather(
                storage.claim_next(lane, [KIND], "w1", LEASE),
                storage.claim_next(lane, [KIND], "w2", LEASE),
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
        claimed = await self.claim_one(storage, lane, lease=SHORT)
        renewed = await storage.write_item(org, claimed, token_of(claimed), lease_for=LEASE)
        assert renewed.claim_token == claimed.claim_token
        assert renewed.status is WorkStatus.CLAIMED
        assert renewed.lease_expires_at is not None
        assert claimed.lease_expires_at is not None
        assert renewed.lease_expires_at > claimed.lease_expires_at
        await self.advance(PAST_SHORT)
        done = await storage.write_item(
            org, outcome(renewed, WorkStatus.COMPLETED), token_of(renewed)
        )
        assert done.status is WorkStatus.COMPLETED
        assert done.completed_at is not None

    async def test_completion_after_the_lease_passed_is_refused(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane, lease=SHORT)
        await self.advance(PAST_SHORT)
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
        first, second, third, fourth = await storage.claim_next(lane, [KIND], "w1", LEASE, limit=4)
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
            org,
            [
                (first.id, token_of(first)),
                (second.id, token_of(second)),  # the earlier token
                (third.id, token_of(third)),
                (fourth.id, token_of(fourth)),  # handed back: no longer claimed
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
        claimed = await self.claim_one(storage, lane, lease=SHORT)
        await self.advance(PAST_SHORT)
        assert await storage.complete_items(org, [(claimed.id, token_of(claimed))]) == set()
        assert await storage.read_item(org, claimed.id) == claimed
        assert await storage.complete_items(org, []) == set()

    async def test_a_handed_back_item_is_due_after_its_delay(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane)
        later = await storage.write_item(
            org, outcome(claimed, WorkStatus.AVAILABLE), token_of(claimed), available_in=SHORT
        )
        assert later.claim_token is None
        assert await storage.claim_next(lane, [KIND], "w1", LEASE) == []
        await self.advance(PAST_SHORT)
        assert [i.id for i in await storage.claim_next(lane, [KIND], "w1", LEASE)] == [later.id]

    async def test_a_write_on_an_unclaimed_item_is_refused(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        item = await self.enqueue(storage, make_item(org, lane))
        with pytest.raises(Conflict):
            await storage.write_item(org, outcome(item, WorkStatus.COMPLETED), uuid4())
        with pytest.raises(NotFound):
            await storage.write_item(org, make_item(org, lane), uuid4())

    # -- the sweep -----------------------------------------------------------------------

    async def test_requeue_stale_hands_back_an_item_whose_lease_passed(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane, lease=SHORT)
        assert await storage.requeue_stale(org, None, 10) == []
        await self.advance(PAST_SHORT)
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
        await self.claim_one(storage, lane, lease=SHORT)
        await self.advance(PAST_SHORT)
        (moved,) = await storage.requeue_stale(org, None, 10)
        assert moved.status is WorkStatus.FAILED
        assert moved.last_error == "lease expired on the last attempt"
        assert await storage.claim_next(lane, [KIND], "w1", LEASE) == []

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
        await storage.claim_next(lane, [KIND], "w1", SHORT, limit=3)
        await self.advance(PAST_SHORT)
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

    # -- idempotency ---------------------------------------------------------------------

    async def test_a_duplicate_idempotency_key_is_reported_not_raised(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        first = await self.enqueue(storage, make_item(org, lane, key="order-42"))
        again = make_item(org, lane, key="order-42")
        assert await storage.create_item(org, again) == Created(first.id, False)
        assert await storage.read_item(org, again.id) is None
        assert await storage.read_item(org, first.id) == first

    async def test_idempotency_keys_are_per_tenant(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane, key="order-42"))
        other = uuid4()
        theirs = make_item(other, lane, key="order-42")
        assert await storage.create_item(other, theirs) == Created(theirs.id, True)

    async def test_a_retried_insert_leaves_a_claimed_row_untouched(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        item = make_item(org, lane, key="retry-me")
        await self.enqueue(storage, item)
        claimed = await self.claim_one(storage, lane)
        assert await storage.create_item(org, item) == Created(item.id, False)
        assert await storage.read_item(org, item.id) == claimed

    async def test_create_items_reports_each_item_in_order(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        held = await self.enqueue(storage, make_item(org, lane, key="k1"))
        fresh = make_item(org, lane, key="k2")
        twin = make_item(org, lane, key="k2")
        dup = make_item(org, lane, key="k1")
        results = await storage.create_items(org, [fresh, dup, twin])
        assert results == [
            Created(fresh.id, True),
            Created(held.id, False),
            Created(fresh.id, False),
        ]
        assert [r.row.id if r.row else None for r in results] == [fresh.id, held.id, fresh.id]
        assert results[1].row == held  # the row that already stood, read in the same session
        assert {i.id for i in await storage.read_items(org, [fresh.id, held.id, twin.id])} == {
            fresh.id,
            held.id,
        }

    async def test_an_item_is_stored_as_given_whatever_it_holds(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """Every column of an item reaches its row, alone or in a batch, whether the item is
        fresh (what an enqueue through the manager holds) or holds what only a later write
        gives a row (a spent attempt, a note, an error, another signer)."""
        now = datetime.now(UTC).replace(microsecond=0)
        fresh = make_item(org, lane, key="fresh")
        released = make_item(org, lane, attempts=1, note="released")
        failed = make_item(
            org,
            lane,
            attempts=3,
            status=WorkStatus.FAILED,
            last_error="boom",
            request_id=uuid4(),
            traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ).model_copy(update={"updated_at": now + timedelta(seconds=1), "updated_by": uuid4()})
        alone = make_item(org, lane, delay=SHORT)
        results = [
            *await storage.create_items(org, [fresh, failed]),
            await storage.create_item(org, released),
            await storage.create_item(org, alone),
        ]
        assert [r.created for r in results] == [True] * 4
        for given, result in zip([fresh, failed, released, alone], results, strict=True):
            stored = await storage.read_item(org, given.id)
            assert stored is not None
            assert result.row == stored
            assert stored.model_dump(exclude={"available_at"}) == given.model_dump(
                exclude={"available_at"}
            )

    async def test_new_items_are_stored_fresh_and_a_stored_id_is_skipped(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """`create_new` (the bulk enqueue) stores each id with its payload and what the batch
        shares, as fresh items of the tenant; an id already stored is left out of its answer
        and its row untouched; a delayed batch is due only after its delay."""
        held = await self.enqueue(storage, make_item(org, lane))
        now = datetime.now(UTC).replace(microsecond=0)
        batch = NewItems(
            kind=KIND,
            lane=lane,
            max_attempts=4,
            delay=0.0,
            created_at=now,
            actor=uuid4(),
            request_id=uuid4(),
            traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ids=[uuid4(), held.id, uuid4()],
            payloads=[json.dumps({"record_id": str(uuid4())}) for _ in range(3)],
        )
        inserted = await storage.create_new(org, batch)
        assert inserted == {batch.ids[0], batch.ids[2]}
        assert await storage.read_item(org, held.id) == held
        expected = {item.id: item for item in batch.items(org)}
        for item_id in inserted:
            stored = await storage.read_item(org, item_id)
            assert stored is not None
            assert stored.model_dump(exclude={"available_at"}) == expected[item_id].model_dump(
                exclude={"available_at"}
            )
            assert await storage.read_item(uuid4(), item_id) is None  # the tenant's own
        later = dataclasses.replace(batch, delay=SHORT, ids=[uuid4()], payloads=batch.payloads[:1])
        assert await storage.create_new(org, later) == set(later.ids)
        claimed = await storage.claim_next(lane, [KIND], "w1", LEASE, limit=10)
        assert {item.id for item in claimed} == {held.id, *inserted}
        await self.advance(PAST_SHORT)
        assert [i.id for i in await storage.claim_next(lane, [KIND], "w1", LEASE)] == later.ids

    async def test_available_at_is_the_storage_clock_plus_the_delay(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        item = make_item(org, lane, delay=SHORT)
        stored = await self.enqueue(storage, item)
        assert stored.created_at == item.created_at
        assert stored.available_at > stored.created_at
        assert await storage.claim_next(lane, [KIND], "w1", LEASE) == []
        await self.advance(PAST_SHORT)
        assert len(await storage.claim_next(lane, [KIND], "w1", LEASE)) == 1

    # -- tenants -------------------------------------------------------------------------

    async def test_write_item_of_another_tenant_leaves_the_row_as_it_stood(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane)
        intruder = uuid4()
        with pytest.raises(NotFound):
            await storage.write_item(
                intruder, outcome(claimed, WorkStatus.COMPLETED), token_of(claimed)
            )
        assert await storage.read_item(org, claimed.id) == claimed

    async def test_complete_items_of_another_tenant_leaves_the_row_as_it_stood(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane)
        assert await storage.complete_items(uuid4(), [(claimed.id, token_of(claimed))]) == set()
        assert await storage.read_item(org, claimed.id) == claimed

    async def test_read_item_of_another_tenant_finds_nothing(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        item = await self.enqueue(storage, make_item(org, lane))
        assert await storage.read_item(uuid4(), item.id) is None
        assert await storage.read_items(uuid4(), [item.id]) == []
        assert await storage.list_items(uuid4()) == []

    async def test_requeue_stale_of_one_tenant_leaves_another_tenants_item_claimed(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane, lease=SHORT)
        await self.advance(PAST_SHORT)
        assert await storage.requeue_stale(uuid4(), None, 10) == []
        assert await storage.read_item(org, claimed.id) == claimed

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

    async def complete_one(self, storage: WorkStorageInterface, lane: str, org: UUID) -> WorkItem:
        """Enqueue, claim and complete one item of `org` on `lane`; the row as written."""
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane)
        return await storage.write_item(
            org, outcome(claimed, WorkStatus.COMPLETED), token_of(claimed)
        )

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
        await self.advance(PAST_SHORT)

        stats = {(s.lane, s.status): s for s in await storage.queue_stats(EMPTY_UUID)}
        available = stats[lane, WorkStatus.AVAILABLE]
        assert available.count == 2
        assert available.oldest_available_age is not None
        assert PAST_SHORT - 0.05 <= available.oldest_available_age < LEASE
        assert stats[lane, WorkStatus.CLAIMED].oldest_available_age is None
        assert stats[later, WorkStatus.AVAILABLE].oldest_available_age == 0.0

    # -- rows that cannot be read (one never stops the others) ---------------------------

    async def test_a_row_that_cannot_be_read_is_dead_lettered_at_claim_and_the_others_run(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """A due row whose payload is no JSON object, between two good ones: the claim takes
        the good ones and fails the bad one for good in its own transaction, fenced on the
        token it gave it, owing its audit entry; no later claim sees it."""
        first = await self.enqueue(storage, make_item(org, lane))
        bad = stored_row(org, lane, payload=[1, 2, 3])
        await self.store(storage, bad)
        last = await self.enqueue(storage, make_item(org, lane))

        claimed = await storage.claim_next(lane, [KIND], "w1", LEASE, limit=10)

        assert {c.id for c in claimed} == {first.id, last.id}
        assert all(c.status is WorkStatus.CLAIMED for c in claimed)
        (dead,) = claimed.unreadable
        assert (dead.id, dead.org_id, dead.column) == (bad["id"], org, "payload")
        assert dead.reason == "Input should be a valid dictionary"
        assert (dead.status, dead.kind) == ("FAILED", KIND.value)
        assert dead.values["last_error"] == "unreadable row: payload: " + dead.reason
        assert dead.values["claim_token"] is None
        assert dead.values["lease_expires_at"] is None
        assert dead.values["attempts"] == 1
        assert dead.values["payload"] == [1, 2, 3]  # kept for an operator to read
        (owed,) = await storage.owed_audits(org, limit=10)
        assert (owed.id, owed.reason, owed.kind, owed.lane, owed.attempts) == (
            bad["id"],
            "unreadable",
            KIND.value,
            lane,
            1,
        )
        assert owed.last_error == dead.values["last_error"]
        assert await storage.claim_next(lane, [KIND], "w2", LEASE, limit=10) == []
        listed = await storage.list_items(org, limit=10)
        assert {i.id for i in listed} == {first.id, last.id}
        assert [u.id for u in listed.unreadable] == [bad["id"]]

    async def test_a_row_of_no_known_kind_is_named_by_every_read_and_only_its_discard_touches_it(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """Reads name the row, the dead-letter writes refuse it, and `discard_unknown_kind`,
        the operator's explicit act, soft-deletes it (docs/guarantees.md section 11)."""
        good = await self.enqueue(storage, make_item(org, lane))
        stray = stored_row(org, lane, kind="NO_SUCH_KIND", status="FAILED", last_error="old")
        await self.store(storage, stray)

        listed = await storage.list_items(org, limit=10)
        assert [i.id for i in listed] == [good.id]
        (unreadable,) = listed.unreadable
        assert (unreadable.id, unreadable.column, unreadable.kind) == (
            stray["id"],
            "kind",
            "NO_SUCH_KIND",
        )
        assert unreadable.problem.startswith("kind: Input should be ")
        with pytest.raises(UnreadableItem, match=rf"^kind: work item {stray['id']} cannot be"):
            await storage.read_item(org, stray["id"])
        for write in (storage.revive_item, storage.discard_item):
            with pytest.raises(UnreadableItem):
                await write(org, stray["id"])
        (again,) = (await storage.list_items(org, status=WorkStatus.FAILED)).unreadable
        assert again == unreadable
        assert again.values == unreadable.values  # nothing was written
        assert await storage.read_item(uuid4(), stray["id"]) is None

        assert await storage.discard_unknown_kind(uuid4(), stray["id"]) is None
        assert await storage.discard_unknown_kind(org, good.id) is None  # a known kind
        discarded = await storage.discard_unknown_kind(org, stray["id"])
        assert discarded is not None
        assert (discarded.id, discarded.kind, discarded.status, discarded.text("note")) == (
            stray["id"],
            "NO_SUCH_KIND",
            "FAILED",
            "discarded",
        )
        assert discarded.values["deleted_at"] is not None
        assert (await storage.list_items(org, limit=10)).unreadable == []
        assert await storage.discard_unknown_kind(org, stray["id"]) is None  # once

    async def test_a_claimed_row_of_no_known_kind_is_not_discarded(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """A claimed row is its holder's (an older release's worker may still run it) until
        the sweep hands it back; a waiting one of no known kind is discarded."""
        held = stored_row(
            org,
            lane,
            kind="NO_SUCH_KIND",
            status="CLAIMED",
            claimed_by="old-release",
            claim_token=uuid4(),
            claimed_at=datetime.now(UTC),
            lease_expires_at=datetime.now(UTC) + timedelta(minutes=5),
        )
        waiting = stored_row(org, lane, kind="NO_SUCH_KIND")
        for row in (held, waiting):
            await self.store(storage, row)

        assert await storage.discard_unknown_kind(org, held["id"]) is None
        gone = await storage.discard_unknown_kind(org, waiting["id"])
        assert gone is not None
        assert gone.status == "AVAILABLE"
        (left,) = (await storage.list_items(org, limit=10)).unreadable
        assert (left.id, left.status, left.values["deleted_at"]) == (held["id"], "CLAIMED", None)

    # -- moving a lane's waiting items ---------------------------------------------------

    async def test_move_lane_moves_only_the_waiting_rows_of_the_old_lane_and_kind(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        new_lane = f"{lane}_new"
        await self.enqueue(storage, make_item(org, lane))
        held = await self.claim_one(storage, lane)
        waiting = await self.enqueue(storage, make_item(org, lane))
        later = await self.enqueue(storage, make_item(org, lane, delay=3600))
        other_lane = await self.enqueue(storage, make_item(org, f"{lane}_other"))
        stray = stored_row(org, lane, kind="NO_SUCH_KIND")
        await self.store(storage, stray)
        other_tenant = make_item(uuid4(), lane)
        await self.enqueue(storage, other_tenant)

        moved = await storage.move_lane(org, from_lane=lane, to_lane=new_lane, kind=KIND.value)

        assert sorted(moved) == sorted([(waiting.id, KIND.value), (later.id, KIND.value)])
        for item_id, lane_now in (
            (waiting.id, new_lane),
            (later.id, new_lane),
            (held.id, lane),
            (other_lane.id, f"{lane}_other"),
        ):
            row = await storage.read_item(org, item_id)
            assert row is not None
            assert row.lane == lane_now
        row = await storage.read_item(org, waiting.id)
        assert row is not None
        assert (row.status, row.note, row.attempts) == (
            WorkStatus.AVAILABLE,
            f"lane moved from {lane}",
            0,
        )
        still = await storage.read_item(other_tenant.org_id, other_tenant.id)
        assert still is not None
        assert still.lane == lane
        left = await storage.claim_next(lane, [KIND], "w2", LEASE, limit=10)
        assert [i.id for i in left] == [other_tenant.id]
        taken = await storage.claim_next(new_lane, [KIND], "w2", LEASE, limit=10)
        assert [i.id for i in taken] == [waiting.id]  # `later` is not due yet

        everything = await storage.move_lane(org, from_lane=lane, to_lane=new_lane)
        assert everything == [(stray["id"], "NO_SUCH_KIND")]  # any kind, readable or not
        assert await storage.move_lane(org, from_lane=lane, to_lane=new_lane) == []

    async def test_a_dead_letter_whose_payload_is_no_object_is_never_revived(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """The table keeps such a payload only on a row that cannot run: revive finds
        nothing to write (None) rather than a row the check would refuse mid-write."""
        dead = stored_row(org, lane, payload=None, status="FAILED")
        await self.store(storage, dead)
        assert await storage.revive_item(org, dead["id"]) is None
        with pytest.raises(UnreadableItem, match=r"^payload: "):
            await storage.discard_item(org, dead["id"])
        (row,) = (await storage.list_items(org)).unreadable
        assert (row.status, row.values["deleted_at"], row.values["payload"]) == (
            "FAILED",
            None,
            None,
        )

    # -- the audit entry a dead letter owes ----------------------------------------------

    async def test_a_dead_letter_owes_its_audit_entry_until_settled_under_its_token(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane, max_attempts=1))
        held = await self.claim_one(storage, lane)
        failed = outcome(held, WorkStatus.FAILED, last_error="boom")
        dead = await storage.write_item(org, failed, token_of(held), dead_letter="attempts")

        (owed,) = await storage.owed_audits(org, limit=10)
        assert owed == OwedAudit(
            id=held.id,
            org_id=org,
            kind=KIND.value,
            lane=lane,
            attempts=1,
            last_error="boom",
            reason="attempts",
            token=token_of(held),
        )
        assert owed.key == f"{held.id}:dead_lettered:{token_of(held)}"
        assert await storage.owed_audits(uuid4(), limit=10) == []
        assert await storage.owed_audits(org, limit=10, item_ids=[uuid4()]) == []
        stats = {s.status: s for s in await storage.queue_stats(org) if s.lane == lane}
        assert stats[WorkStatus.FAILED].audit_owed == 1
        assert not await storage.settle_audit(org, held.id, uuid4())
        assert not await storage.settle_audit(uuid4(), held.id, token_of(held))
        assert await storage.settle_audit(org, held.id, token_of(held))
        assert not await storage.settle_audit(org, held.id, token_of(held))
        assert await storage.owed_audits(org, limit=10) == []
        stats = {s.status: s for s in await storage.queue_stats(org) if s.lane == lane}
        assert WorkStatus.FAILED not in stats  # an audited dead letter is history
        assert await storage.read_item(org, held.id) == dead  # the item itself is as written

    async def test_queue_stats_count_the_rows_in_play_and_never_the_history(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """Completed rows and audited dead letters are history: never counted (on
        PostgreSQL never read: `test_work_storage_postgres` checks the plan)."""
        await self.complete_one(storage, lane, org)
        for owes in (True, False):
            await self.enqueue(storage, make_item(org, lane, max_attempts=1))
            held = await self.claim_one(storage, lane)
            failed = outcome(held, WorkStatus.FAILED, last_error="boom")
            await storage.write_item(org, failed, token_of(held), dead_letter="attempts")
            if not owes:
                assert await storage.settle_audit(org, held.id, token_of(held))
        await self.enqueue(storage, make_item(org, lane))
        await self.enqueue(storage, make_item(org, lane))
        await self.claim_one(storage, lane)

        stats = {s.status: s for s in await storage.queue_stats(org) if s.lane == lane}

        assert {status: s.count for status, s in stats.items()} == {
            WorkStatus.AVAILABLE: 1,
            WorkStatus.CLAIMED: 1,
            WorkStatus.FAILED: 1,
        }
        assert stats[WorkStatus.FAILED].audit_owed == 1

    async def test_a_dead_letter_of_the_sweep_owes_its_entry_under_the_token_it_read(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane, max_attempts=1))
        await self.enqueue(storage, make_item(org, lane, max_attempts=2))
        held = await storage.claim_next(lane, [KIND], "w1", SHORT, limit=2)
        last, spare = sorted(held, key=lambda i: i.max_attempts)
        await self.advance(PAST_SHORT)
        moved = await storage.requeue_stale(org, None, 10)
        assert {m.id: m.status for m in moved} == {
            last.id: WorkStatus.FAILED,
            spare.id: WorkStatus.AVAILABLE,
        }
        (owed,) = await storage.owed_audits(org, limit=10)
        assert (owed.id, owed.reason, owed.token) == (last.id, "lease", token_of(last))
        assert owed.last_error == "lease expired on the last attempt"
