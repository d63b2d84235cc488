"""The work storage contract: paused lanes (docs/decisions/0040), the workers holding items,
and the corrected replay's write."""

from __future__ import annotations

from uuid import UUID, uuid4

from work_fixtures import KIND, make_item, outcome, stored_row, token_of

from acme.om.types import EMPTY_UUID
from acme.om.work.storage import WorkStorageInterface
from acme.om.work.types.work_item import WorkStatus
from contracts.work_storage_base import LAPSED_LEASE_S, LEASE_S, PAST_LAPSED_S, StorageCases


class LaneCases(StorageCases):
    """Pause, resume, the holders, and a revive with a corrected payload."""

    async def test_a_paused_lane_yields_no_claim_while_other_lanes_do(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        other = f"{lane}_other"
        await self.enqueue(storage, make_item(org, lane))
        await self.enqueue(storage, make_item(org, other))

        pause, made = await storage.pause_lane(EMPTY_UUID, lane, paused_by="alice", reason="deploy")
        claimed = await storage.claim_next(lane, [KIND], "w1", LEASE_S, limit=10)
        beside = await storage.claim_next(other, [KIND], "w1", LEASE_S, limit=10)

        assert made is True
        assert (pause.lane, pause.paused_by, pause.reason) == (lane, "alice", "deploy")
        assert list(claimed) == []
        assert claimed.unreadable == []
        assert len(beside) == 1

    async def test_a_paused_lane_takes_enqueues_and_claims_them_after_resume(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await storage.pause_lane(EMPTY_UUID, lane, paused_by="alice", reason=None)
        items = [await self.enqueue(storage, make_item(org, lane)) for _ in range(3)]

        while_paused = await storage.claim_next(lane, [KIND], "w1", LEASE_S, limit=10)
        lifted = await storage.resume_lane(EMPTY_UUID, lane)
        after = await storage.claim_next(lane, [KIND], "w1", LEASE_S, limit=10)

        assert list(while_paused) == []
        assert lifted is not None
        assert lifted.lane == lane
        assert {item.id for item in after} == {item.id for item in items}

    async def test_an_item_claimed_before_the_pause_is_still_its_holders(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane)

        await storage.pause_lane(EMPTY_UUID, lane, paused_by="alice", reason=None)
        done = await storage.write_item(
            org, outcome(claimed, WorkStatus.COMPLETED), token_of(claimed)
        )

        assert done.status is WorkStatus.COMPLETED

    async def test_pausing_a_paused_lane_keeps_the_first_pause(
        self, storage: WorkStorageInterface, lane: str
    ) -> None:
        first, _ = await storage.pause_lane(EMPTY_UUID, lane, paused_by="alice", reason="one")

        second, made = await storage.pause_lane(EMPTY_UUID, lane, paused_by="bob", reason="two")

        assert made is False
        assert second == first

    async def test_resuming_a_lane_that_is_not_paused_finds_nothing(
        self, storage: WorkStorageInterface, lane: str
    ) -> None:
        assert await storage.resume_lane(EMPTY_UUID, lane) is None

    async def test_the_paused_lanes_are_listed_by_name_until_resumed(
        self, storage: WorkStorageInterface, lane: str
    ) -> None:
        names = [f"{lane}_b", f"{lane}_a"]
        for name in names:
            await storage.pause_lane(EMPTY_UUID, name, paused_by="alice", reason=None)
        listed = [p.lane for p in await storage.paused_lanes(EMPTY_UUID) if p.lane in names]

        await storage.resume_lane(EMPTY_UUID, names[0])
        after = [p.lane for p in await storage.paused_lanes(uuid4()) if p.lane in names]

        assert listed == sorted(names)
        assert after == [names[1]]

    async def test_the_holders_are_the_workers_with_a_live_lease(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        for _ in range(3):
            await self.enqueue(storage, make_item(org, lane))
        worker_a, worker_b = f"a-{uuid4().hex}", f"b-{uuid4().hex}"
        await storage.claim_next(lane, [KIND], worker_a, LEASE_S, limit=2)
        await storage.claim_next(lane, [KIND], worker_b, LAPSED_LEASE_S)
        await self.advance(PAST_LAPSED_S)

        everyone = await storage.holders(EMPTY_UUID)
        others = await storage.holders(uuid4())

        assert everyone.get(worker_a) == 2
        assert worker_b not in everyone
        assert worker_a not in others

    async def test_a_revive_with_a_payload_replaces_it(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        item = await self.enqueue(storage, make_item(org, lane, max_attempts=1))
        claimed = await self.claim_one(storage, lane)
        await storage.write_item(
            org, outcome(claimed, WorkStatus.FAILED, last_error="bad"), token_of(claimed)
        )

        revived = await storage.revive_item(org, item.id, payload={"n": 2, "fixed": True})
        stored = await storage.read_item(org, item.id)

        assert revived is not None
        assert revived.status is WorkStatus.AVAILABLE
        assert revived.payload == {"n": 2, "fixed": True}
        assert stored is not None
        assert stored.payload == {"n": 2, "fixed": True}

    async def test_a_revive_with_a_payload_fixes_a_payload_no_model_reads(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        row = stored_row(org, lane, payload=[1, 2, 3], status="FAILED")
        await self.store(storage, row)

        revived = await storage.revive_item(org, row["id"], payload={"n": 1})

        assert revived is not None
        assert revived.payload == {"n": 1}
        assert revived.status is WorkStatus.AVAILABLE
