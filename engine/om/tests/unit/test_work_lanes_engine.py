"""The work manager's lane pauses, corrected replays and queue summary (engine-only), over the
memory bench of `test_work_manager_engine.py` (docs/decisions/0040, 0041)."""

from __future__ import annotations

from uuid import uuid4

import pytest
from work_fixtures import (
    KIND,
    LANE,
    WORKER_APP,
    FakeClock,
    WorkBench,
    claim,
    new_item,
    use_probe_payload,
    work_bench,
)

from acme.infra.container import Infra
from acme.om.context import OpContext, RequestContext
from acme.om.errors import Conflict, Invalid
from acme.om.storage.impl.memory import MemoryStorageRoot
from acme.om.work.impl.operator_commands import LANE_SUBJECT_TYPE, lane_subject_id
from acme.om.work.rules import known_lanes
from acme.om.work.storage.impl.memory import MemoryWorkStorage
from acme.om.work.types.work_item import WorkItem, WorkStatus


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def storage(clock: FakeClock) -> MemoryWorkStorage:
    return MemoryWorkStorage(clock=clock)


@pytest.fixture
def bench(storage: MemoryWorkStorage, monkeypatch: pytest.MonkeyPatch) -> WorkBench:
    use_probe_payload(monkeypatch)
    return work_bench(MemoryStorageRoot(), Infra.memory(), storage)


@pytest.fixture
async def ctx(bench: WorkBench) -> OpContext:
    return await bench.member()


@pytest.fixture
def rctx() -> RequestContext:
    return RequestContext.new(WORKER_APP)


async def dead_letter(bench: WorkBench, ctx: OpContext) -> WorkItem:
    item = await bench.work.enqueue(ctx, new_item(ctx, max_attempts=1))
    work_ctx, held = await claim(bench)
    await bench.work.fail(work_ctx, held, "boom")
    return item


# -- pause and resume --------------------------------------------------------------------------


async def test_a_paused_lane_claims_nothing_until_resumed_and_enqueues_go_on(
    bench: WorkBench, ctx: OpContext, rctx: RequestContext
) -> None:
    await bench.work.pause_lane(rctx, LANE, actor="alice", reason="upstream down")
    item = await bench.work.enqueue(ctx, new_item(ctx))

    while_paused = await bench.work.claim(rctx, LANE, [KIND], "w1", 30.0)
    lifted = await bench.work.resume_lane(rctx, LANE, actor="bob")
    after = await bench.work.claim(rctx, LANE, [KIND], "w1", 30.0)

    assert while_paused is None
    assert (lifted.lane, lifted.paused_by, lifted.reason) == (LANE, "alice", "upstream down")
    assert after is not None
    assert after[1].id == item.id


async def test_a_pause_and_a_resume_are_audited_in_every_live_tenant(
    bench: WorkBench, ctx: OpContext, rctx: RequestContext
) -> None:
    other = await bench.member("another tenant")

    await bench.work.pause_lane(rctx, LANE, actor="alice", reason="deploy")
    await bench.work.resume_lane(rctx, LANE, actor="bob", reason="done")

    for tenant in (ctx, other):
        entries = await bench.managers.audit.list_for(
            tenant, LANE_SUBJECT_TYPE, lane_subject_id(LANE)
        )
        assert [(e.action, e.detail["operator"], e.detail["reason"]) for e in entries] == [
            ("work.lane_paused", "alice", "deploy"),
            ("work.lane_resumed", "bob", "done"),
        ]
        assert {e.detail["lane"] for e in entries} == {LANE}


async def test_an_unknown_lane_is_refused_naming_the_known_ones(
    bench: WorkBench, rctx: RequestContext
) -> None:
    with pytest.raises(
        Invalid, match=r"^lane: no worker claims on lane nowhere; the known lanes: "
    ):
        await bench.work.pause_lane(rctx, "nowhere", actor="alice")

    assert await bench.work.paused_lanes(rctx) == []
    assert LANE in known_lanes()
    assert known_lanes(["other_lane"]) == sorted({*known_lanes(), "other_lane"})


async def test_a_lane_a_worker_names_itself_may_be_paused(
    bench: WorkBench, rctx: RequestContext
) -> None:
    pause = await bench.work.pause_lane(rctx, "slow_lane", actor="alice", also_known=["slow_lane"])

    assert [p.lane for p in await bench.work.paused_lanes(rctx)] == [pause.lane]


async def test_pausing_twice_and_resuming_a_running_lane_are_refused_in_one_line(
    bench: WorkBench, rctx: RequestContext
) -> None:
    await bench.work.pause_lane(rctx, LANE, actor="alice")

    with pytest.raises(Conflict, match=rf"^lane: {LANE} is paused already, by alice at "):
        await bench.work.pause_lane(rctx, LANE, actor="bob")
    await bench.work.resume_lane(rctx, LANE, actor="bob")
    with pytest.raises(Conflict, match=rf"^lane: {LANE} is not paused; the paused lanes: none$"):
        await bench.work.resume_lane(rctx, LANE, actor="bob")
    with pytest.raises(Invalid, match=r"^actor: "):
        await bench.work.pause_lane(rctx, LANE, actor="  ")


async def test_the_paused_gauge_follows_the_pause_and_each_queue_stats(
    bench: WorkBench, storage: MemoryWorkStorage, rctx: RequestContext
) -> None:
    def gauge() -> float | None:
        return bench.registry.get_sample_value("work_lane_paused", {"lane": LANE})

    await bench.work.pause_lane(rctx, LANE, actor="alice")
    paused = gauge()
    await bench.work.resume_lane(rctx, LANE, actor="alice")
    resumed = gauge()
    # another process pauses it: this one's next queue_stats reads it
    await storage.pause_lane(uuid4(), LANE, paused_by="carol", reason=None)
    await bench.work.queue_stats(rctx)

    assert (paused, resumed, gauge()) == (1.0, 0.0, 1.0)


# -- the corrected replay ----------------------------------------------------------------------


async def test_a_corrected_replay_replaces_the_payload_and_audits_old_and_new(
    bench: WorkBench, ctx: OpContext
) -> None:
    item = await dead_letter(bench, ctx)
    corrected = {"record_id": str(uuid4()), "count": 7}

    replayed = await bench.work.replay(ctx, item.id, operator="alice", payload=corrected)

    assert replayed.status is WorkStatus.AVAILABLE
    assert replayed.payload == {**corrected, "note": ""}
    last = (await bench.managers.audit.list_for(ctx, "work_item", item.id))[-1]
    assert last.action == "work.replayed"
    assert last.detail["old_payload"] == item.payload
    assert last.detail["payload"] == {**corrected, "note": ""}
    assert last.detail["operator"] == "alice"


async def test_a_corrected_payload_the_model_refuses_writes_nothing(
    bench: WorkBench, ctx: OpContext
) -> None:
    item = await dead_letter(bench, ctx)

    with pytest.raises(Invalid, match=r"^payload\.count: "):
        await bench.work.replay(ctx, item.id, payload={"record_id": str(uuid4()), "count": "x"})

    stored = await bench.work.get(ctx, item.id)
    assert (stored.status, stored.payload) == (WorkStatus.FAILED, item.payload)
    entries = await bench.managers.audit.list_for(ctx, "work_item", item.id)
    assert "work.replayed" not in [e.action for e in entries]


# -- the summary -------------------------------------------------------------------------------


async def test_the_summary_counts_names_the_pauses_and_the_holders(
    bench: WorkBench, ctx: OpContext, rctx: RequestContext
) -> None:
    for _ in range(3):
        await bench.work.enqueue(ctx, new_item(ctx))
    await claim(bench, worker="w7")
    await bench.work.pause_lane(rctx, LANE, actor="alice", reason="deploy")

    summary = await bench.work.queue_summary(rctx)

    counts = {(g.lane, g.kind, g.status): g.count for g in summary.groups}
    assert counts == {
        (LANE, KIND.value, WorkStatus.AVAILABLE): 2,
        (LANE, KIND.value, WorkStatus.CLAIMED): 1,
    }
    assert [(p.lane, p.paused_by, p.reason) for p in summary.paused] == [(LANE, "alice", "deploy")]
    assert summary.workers_holding == {"w7": 1}
    assert summary.oldest_due_age(LANE) >= 0.0


# -- the worker roster (docs/decisions/0049) ------------------------------------------------


async def test_the_summary_lists_an_idle_worker_alive_beside_one_holding_an_item(
    bench: WorkBench, ctx: OpContext, rctx: RequestContext, clock: FakeClock
) -> None:
    """The case the holders alone could not show: a worker alive with nothing claimed."""
    await bench.work.enqueue(ctx, new_item(ctx))
    await claim(bench, worker="w7")
    for worker_id in ("w7", "w8"):
        await bench.work.beat_worker(
            rctx, worker_id, worker="invoice-mailer", lane=LANE, kinds=[KIND], ttl_s=15.0
        )
    await bench.work.beat_worker(
        rctx, "w9", worker="invoice-mailer", lane=LANE, kinds=[KIND], ttl_s=1.0
    )
    clock.advance(2.0)  # w9 stopped beating: past its TTL

    summary = await bench.work.queue_summary(rctx)

    alive = [(w.worker_id, w.worker, w.lane, w.kinds, w.holding) for w in summary.workers_alive]
    assert alive == [
        ("w7", "invoice-mailer", LANE, (KIND.value,), 1),
        ("w8", "invoice-mailer", LANE, (KIND.value,), 0),
    ]
    assert summary.workers_holding == {"w7": 1}


async def test_a_roster_beat_without_a_name_or_a_ttl_and_a_negative_grace_are_refused(
    bench: WorkBench, rctx: RequestContext
) -> None:
    with pytest.raises(Invalid, match=r"^worker_id, worker: "):
        await bench.work.beat_worker(rctx, "w1", worker="", lane=LANE, kinds=[KIND], ttl_s=1.0)
    with pytest.raises(Invalid, match=r"^ttl_s: must be above 0 seconds"):
        await bench.work.beat_worker(rctx, "w1", worker="m", lane=LANE, kinds=[KIND], ttl_s=0)
    with pytest.raises(Invalid, match=r"^expired_for_s: "):
        await bench.work.prune_workers(rctx, expired_for_s=-1.0)

    assert (await bench.work.queue_summary(rctx)).workers_alive == []
