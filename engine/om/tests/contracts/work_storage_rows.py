"""The work storage contract: idempotency, tenants, unreadable rows, lane moves, audit debts."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest
from work_fixtures import KIND, make_item, outcome, stored_row, token_of

from acme.om.errors import NotFound
from acme.om.work.storage import Created, NewItems, OwedAudit, WorkStorageInterface
from acme.om.work.types.work_item import UnreadableItem, WorkItem, WorkStatus
from contracts.work_storage_base import (
    LAPSED_LEASE_S,
    LEASE_S,
    PAST_LAPSED_S,
    PAST_SHORT_S,
    SHORT_LEASE_S,
    StorageCases,
)


class RowCases(StorageCases):
    """Idempotency, tenants, unreadable rows, lane moves and owed audit entries."""

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
        alone = make_item(org, lane, delay=SHORT_LEASE_S)
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
        later = dataclasses.replace(
            batch, delay=SHORT_LEASE_S, ids=[uuid4()], payloads=batch.payloads[:1]
        )
        assert await storage.create_new(org, later) == set(later.ids)
        claimed = await storage.claim_next(lane, [KIND], "w1", LEASE_S, limit=10)
        assert {item.id for item in claimed} == {held.id, *inserted}
        await self.advance(PAST_SHORT_S)
        assert [i.id for i in await storage.claim_next(lane, [KIND], "w1", LEASE_S)] == later.ids

    async def test_available_at_is_the_storage_clock_plus_the_delay(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        item = make_item(org, lane, delay=SHORT_LEASE_S)
        stored = await self.enqueue(storage, item)
        assert stored.created_at == item.created_at
        assert stored.available_at > stored.created_at
        assert await storage.claim_next(lane, [KIND], "w1", LEASE_S) == []
        await self.advance(PAST_SHORT_S)
        assert len(await storage.claim_next(lane, [KIND], "w1", LEASE_S)) == 1

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
        intruder = uuid4()
        assert await storage.complete_items([(intruder, claimed.id, token_of(claimed))]) == set()
        assert await storage.read_item(org, claimed.id) == claimed

    async def test_read_item_of_another_tenant_finds_nothing(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        item = await self.enqueue(storage, make_item(org, lane))
        assert await storage.read_item(uuid4(), item.id) is None
        assert await storage.read_items(uuid4(), [item.id]) == []
        assert await storage.list_items(uuid4()) == []

    async def test_list_items_pages_by_keyset_and_filters_by_lane(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """Five items on `lane` (two sharing a `created_at`), one on another lane: pages of
        two, each after the last row of the previous one, meet every item once, in order."""
        base = datetime.now(UTC)
        stamps = [base, base - timedelta(seconds=1), base - timedelta(seconds=1)]
        stamps += [base - timedelta(seconds=2), base - timedelta(seconds=3)]
        for at in stamps:
            item = make_item(org, lane).model_copy(update={"created_at": at, "updated_at": at})
            await self.enqueue(storage, item)
        await self.enqueue(storage, make_item(org, f"{lane}_other"))
        pages: list[list[UUID]] = []
        after: tuple[datetime, UUID] | None = None
        while True:
            page = await storage.list_items(org, lane=lane, after=after, limit=2)
            if not page:
                break
            pages.append([item.id for item in page])
            after = (page[-1].created_at, page[-1].id)

        everything = await storage.list_items(org, lane=lane, limit=10)
        assert [i for page in pages for i in page] == [item.id for item in everything]
        assert [len(page) for page in pages] == [2, 2, 1]

    async def test_recent_outcomes_count_the_window_alone_in_slices(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        """Completions 100 s, 100 s and 1,000 s ago and one 4,000 s ago (out of the hour);
        a dead letter 100 s ago, a discarded one beside it: slices of 600 s, newest last."""
        now = datetime.now(UTC)

        def done(ago_s: float) -> WorkItem:
            at = now - timedelta(seconds=ago_s)
            return make_item(org, lane, status=WorkStatus.COMPLETED, completed_at=at)

        failed = make_item(org, lane, status=WorkStatus.FAILED)
        failed = failed.model_copy(update={"updated_at": now - timedelta(seconds=100)})
        gone = failed.model_copy(update={"id": uuid4(), "deleted_at": now})
        for item in (done(100), done(100), done(1000), done(4000), failed, gone):
            await self.enqueue(storage, item)

        slices = await storage.recent_outcomes(org, window_s=3600, buckets=6)

        assert slices == [(0, 0), (0, 0), (0, 0), (0, 0), (1, 0), (2, 1)]
        assert await storage.recent_outcomes(uuid4(), window_s=3600, buckets=6) == [(0, 0)] * 6

    async def test_requeue_stale_of_one_tenant_leaves_another_tenants_item_claimed(
        self, storage: WorkStorageInterface, lane: str, org: UUID
    ) -> None:
        await self.enqueue(storage, make_item(org, lane))
        claimed = await self.claim_one(storage, lane, lease=LAPSED_LEASE_S)
        await self.advance(PAST_LAPSED_S)
        assert await storage.requeue_stale(uuid4(), None, 10) == []
        assert await storage.read_item(org, claimed.id) == claimed

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

        claimed = await storage.claim_next(lane, [KIND], "w1", LEASE_S, limit=10)

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
        assert await storage.claim_next(lane, [KIND], "w2", LEASE_S, limit=10) == []
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
        left = await storage.claim_next(lane, [KIND], "w2", LEASE_S, limit=10)
        assert [i.id for i in left] == [other_tenant.id]
        taken = await storage.claim_next(new_lane, [KIND], "w2", LEASE_S, limit=10)
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
        held = await storage.claim_next(lane, [KIND], "w1", LAPSED_LEASE_S, limit=2)
        last, spare = sorted(held, key=lambda i: i.max_attempts)
        await self.advance(PAST_LAPSED_S)
        moved = await storage.requeue_stale(org, None, 10)
        assert {m.id: m.status for m in moved} == {
            last.id: WorkStatus.FAILED,
            spare.id: WorkStatus.AVAILABLE,
        }
        (owed,) = await storage.owed_audits(org, limit=10)
        assert (owed.id, owed.reason, owed.token) == (last.id, "lease", token_of(last))
        assert owed.last_error == "lease expired on the last attempt"
