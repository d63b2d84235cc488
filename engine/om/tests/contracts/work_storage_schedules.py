"""The work storage contract: the schedule-state row, advanced once per tick
(docs/decisions/0034)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

from work_fixtures import make_item, outcome, token_of

from acme.om.work.storage import WorkStorageInterface
from acme.om.work.types.schedules import ScheduleState
from acme.om.work.types.work_item import WorkStatus
from contracts.work_storage_base import StorageCases

TICK = datetime(2026, 3, 8, 6, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


class ScheduleCases(StorageCases):
    """A tick's state row and its item, written together or not at all."""

    async def test_first_advance_writes_the_row_and_the_item_a_second_writes_nothing(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        name = f"w:{uuid4().hex}"
        first, second = make_item(org, lane), make_item(org, lane)
        assert await storage.advance_schedule(org, name, previous=None, tick=TICK, item=first)
        assert not await storage.advance_schedule(org, name, previous=None, tick=TICK, item=second)
        assert await storage.schedule_ticks(org) == {name: TICK}
        assert {i.id for i in await storage.list_items(org, limit=10)} == {first.id}

    async def test_advance_from_a_stale_tick_is_refused_and_writes_no_item(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        name = f"w:{uuid4().hex}"
        assert await storage.advance_schedule(org, name, previous=None, tick=TICK, item=None)
        on_time = make_item(org, lane)
        assert await storage.advance_schedule(
            org, name, previous=TICK, tick=TICK + HOUR, item=on_time
        )
        late = make_item(org, lane)
        assert not await storage.advance_schedule(
            org, name, previous=TICK, tick=TICK + 2 * HOUR, item=late
        )
        assert await storage.schedule_ticks(org) == {name: TICK + HOUR}
        assert {i.id for i in await storage.list_items(org, limit=10)} == {on_time.id}

    async def test_raced_advances_from_one_tick_enqueue_it_once(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        name = f"w:{uuid4().hex}"
        assert await storage.advance_schedule(org, name, previous=None, tick=TICK, item=None)
        won = await asyncio.gather(
            *(
                storage.advance_schedule(
                    org, name, previous=TICK, tick=TICK + HOUR, item=make_item(org, lane)
                )
                for _ in range(4)
            )
        )
        assert won.count(True) == 1
        assert len(await storage.list_items(org, limit=10)) == 1

    async def test_schedule_rows_are_per_tenant(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        name, other = f"w:{uuid4().hex}", uuid4()
        assert await storage.advance_schedule(org, name, previous=None, tick=TICK, item=None)
        assert await storage.schedule_ticks(other) == {}
        assert await storage.advance_schedule(other, name, previous=None, tick=TICK, item=None)
        assert await storage.schedule_ticks(other) == {name: TICK}

    async def test_the_row_records_the_next_tick_each_advance_gives_it(
        self, storage: WorkStorageInterface, org: UUID
    ) -> None:
        """The tick after the handled one, as the advancing worker's cron gave it, for the
        work API (docs/decisions/0051); an advance that gives none records none."""
        name, older = f"w:{uuid4().hex}", f"v:{uuid4().hex}"
        assert await storage.advance_schedule(
            org, name, previous=None, tick=TICK, item=None, next_tick=TICK + HOUR
        )
        assert await storage.advance_schedule(
            org, name, previous=TICK, tick=TICK + HOUR, item=None, next_tick=TICK + 2 * HOUR
        )
        assert await storage.advance_schedule(org, older, previous=None, tick=TICK, item=None)
        assert await storage.schedule_states(org) == [
            ScheduleState(schedule=older, tick_at=TICK, next_tick_at=None),
            ScheduleState(schedule=name, tick_at=TICK + HOUR, next_tick_at=TICK + 2 * HOUR),
        ]
        assert await storage.schedule_ticks(org) == {name: TICK + HOUR, older: TICK}

    async def test_a_purged_item_leaves_its_tick_handled(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """The row, not the item, remembers the tick: the completed-row purge forgets the
        item and the tick still runs once."""
        name = f"w:{uuid4().hex}"
        assert await storage.advance_schedule(
            org, name, previous=None, tick=TICK, item=make_item(org, lane)
        )
        claimed = await self.claim_one(storage, lane)
        await storage.write_item(org, outcome(claimed, WorkStatus.COMPLETED), token_of(claimed))
        await self.advance(0.01)
        assert await storage.purge_completed(org, 0, 10) == 1
        assert not await storage.advance_schedule(
            org, name, previous=None, tick=TICK, item=make_item(org, lane)
        )
        assert await storage.list_items(org, limit=10) == []
