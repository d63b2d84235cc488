"""The work storage contract: the worker roster (docs/decisions/0049), one row per worker
process, upserted by its heartbeat, deleted by its drain, pruned by the sweep once long
expired. Every call runs in the system scope (`EMPTY_UUID`): the roster has no tenant.

Worker ids are the test's own: a shared database holds other tests' rows, which a prune may
delete too, so the cases look at their own rows only.
"""

from __future__ import annotations

from uuid import uuid4

import pytest

from acme.om.types import EMPTY_UUID
from acme.om.work.storage import WorkStorageInterface
from acme.om.work.types.lanes import WorkerBeat
from contracts.work_storage_base import StorageCases

TTL_S = 30.0
"""A liveness TTL no case outlives (s)."""

SHORT_TTL_S = 0.2
"""A liveness TTL a case outlives by advancing `PAST_TTL_S` (s)."""

PAST_TTL_S = 0.3
"""Past `SHORT_TTL_S`; also the prune's grace, which a row expired one wait ago is within (s)."""


class RosterCases(StorageCases):
    """A beat's upsert, the drain's delete, expiry, and the sweep's prune."""

    @pytest.fixture
    def worker_id(self) -> str:
        return f"host:1:{uuid4().hex[:8]}"

    async def beat(
        self, storage: WorkStorageInterface, worker_id: str, lane: str, ttl_s: float = TTL_S
    ) -> None:
        await storage.beat_worker(
            EMPTY_UUID,
            worker_id,
            worker="invoice-mailer",
            lane=lane,
            kinds=["SEND_INVOICE", "NOTIFY_SHIPMENT"],
            ttl_s=ttl_s,
        )

    async def row(self, storage: WorkStorageInterface, worker_id: str) -> WorkerBeat | None:
        alive = [r for r in await storage.alive_workers(EMPTY_UUID) if r.worker_id == worker_id]
        return alive[0] if alive else None

    async def test_a_first_beat_lists_the_worker_alive_with_what_it_claims(
        self, storage: WorkStorageInterface, worker_id: str, lane: str
    ) -> None:
        await self.beat(storage, worker_id, lane)

        row = await self.row(storage, worker_id)

        assert row is not None
        assert (row.worker, row.lane, row.kinds) == (
            "invoice-mailer",
            lane,
            ("SEND_INVOICE", "NOTIFY_SHIPMENT"),
        )
        assert row.started_at == row.beat_at
        assert (row.expires_at - row.beat_at).total_seconds() == pytest.approx(TTL_S, abs=0.01)

    async def test_a_later_beat_moves_the_beat_and_keeps_the_start(
        self, storage: WorkStorageInterface, worker_id: str, lane: str
    ) -> None:
        await self.beat(storage, worker_id, lane)
        first = await self.row(storage, worker_id)
        await self.advance(0.1)

        await self.beat(storage, worker_id, f"{lane}_b")
        later = await self.row(storage, worker_id)

        assert first is not None
        assert later is not None
        assert later.started_at == first.started_at
        assert later.beat_at > first.beat_at
        assert later.lane == f"{lane}_b"

    async def test_dropping_a_worker_takes_it_off_the_roster_once(
        self, storage: WorkStorageInterface, worker_id: str, lane: str
    ) -> None:
        await self.beat(storage, worker_id, lane)

        dropped = await storage.drop_worker(EMPTY_UUID, worker_id)
        again = await storage.drop_worker(EMPTY_UUID, worker_id)

        assert (dropped, again) == (True, False)
        assert await self.row(storage, worker_id) is None

    async def test_a_worker_past_its_ttl_is_not_alive(
        self, storage: WorkStorageInterface, worker_id: str, lane: str
    ) -> None:
        await self.beat(storage, worker_id, lane, ttl_s=SHORT_TTL_S)
        assert await self.row(storage, worker_id) is not None

        await self.advance(PAST_TTL_S)

        assert await self.row(storage, worker_id) is None

    async def test_the_prune_deletes_rows_expired_past_the_grace_and_keeps_the_rest(
        self, storage: WorkStorageInterface, lane: str
    ) -> None:
        stale, recent, live = (f"host:{n}:{uuid4().hex[:8]}" for n in (1, 2, 3))
        await self.beat(storage, stale, lane, ttl_s=SHORT_TTL_S)
        await self.beat(storage, live, lane)
        await self.advance(PAST_TTL_S)
        await self.beat(storage, recent, lane, ttl_s=SHORT_TTL_S)
        await self.advance(PAST_TTL_S)
        started = {w: r.started_at for w in (recent, live) if (r := await self.row(storage, w))}

        pruned = await storage.prune_workers(EMPTY_UUID, PAST_TTL_S)
        for worker_id in (stale, recent):  # back on the roster: a fresh row, or the old one
            await self.beat(storage, worker_id, lane)
        after = {w: await self.row(storage, w) for w in (stale, recent, live)}

        assert pruned >= 1
        assert set(started) == {live}  # `recent` expired too, within the grace
        stale_row, recent_row, live_row = after[stale], after[recent], after[live]
        assert stale_row is not None
        assert recent_row is not None
        assert live_row is not None
        assert stale_row.started_at == stale_row.beat_at  # pruned: started afresh
        assert recent_row.started_at < recent_row.beat_at  # kept: its first start
        assert live_row.started_at == started[live]
