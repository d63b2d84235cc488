"""The work manager's cases beyond a host's own (engine-only: no host receives this file).

`test_work_manager.py`, which hosts receive, holds the item's life a host relies on; here
the rest over the same memory bench: bulk and refused enqueues, wake-up batching, the
claim's context asks, dead letters and the audit entry each one owes, unreadable rows and
the operator writes (replay, discard, move_lane, purge, cancel) and a handler's verdicts.
Fixtures as in that file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from uuid import UUID, uuid4

import pytest
from prometheus_client import CollectorRegistry
from work_fixtures import (
    KIND,
    LANE,
    LEASE_S,
    TRACEPARENT,
    WORKER_APP,
    FakeClock,
    ProbePayload,
    WorkBench,
    claim,
    new_item,
    payload,
    stored_row,
    use_probe_payload,
    work_bench,
)

from acme.infra.container import Infra
from acme.infra.topics import Topics, WorkAvailablePayload
from acme.om.audit import AuditEntry, AuditManagerInterface
from acme.om.context import OpContext, RequestContext, Role
from acme.om.errors import Conflict, Invalid, NotFound
from acme.om.outbox import OutboxRow
from acme.om.storage.impl.memory import MemoryStorageRoot
from acme.om.types import EMPTY_UUID
from acme.om.work.impl.manager import WorkManagerImpl
from acme.om.work.metrics import WorkMetrics
from acme.om.work.rules import MAX_IDEMPOTENCY_KEY_BYTES, known_lanes
from acme.om.work.storage.impl.memory import MemoryWorkStorage
from acme.om.work.types.work_item import (
    WORK_PAYLOADS,
    WORK_POLICIES,
    ItemCancelled,
    UnreadableItem,
    WorkItem,
    WorkKind,
    WorkStatus,
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def bench(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> WorkBench:
    use_probe_payload(monkeypatch)
    return work_bench(MemoryStorageRoot(), Infra.memory(), MemoryWorkStorage(clock=clock))


@pytest.fixture
async def ctx(bench: WorkBench) -> OpContext:
    return await bench.member()


# -- enqueue -----------------------------------------------------------------------------------


async def test_enqueue_does_not_wait_for_the_wake_up_and_a_burst_sends_one_per_publish(
    bench: WorkBench, ctx: OpContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An enqueue returns while its `WORK_AVAILABLE` is still being published (here the
    topic holds every publish until released); the enqueues made meanwhile are owed one
    message more, published after the first: every enqueue is followed by a message sent
    after it, and a burst sends two, not six; `publish_owed_wake_ups` returns once both
    are sent."""
    topics = bench.infra.topics
    publish = topics.publish
    release = asyncio.Event()
    sent: list[object] = []

    async def held_publish(topic: Topics, message: WorkAvailablePayload) -> None:
        await release.wait()
        sent.append(message)
        await publish(topic, message)

    monkeypatch.setattr(topics, "publish", held_publish)
    for _ in range(6):
        await asyncio.wait_for(bench.work.enqueue(ctx, new_item(ctx)), timeout=1)
    assert sent == []  # six enqueues returned, none waited for the topic
    flushed = asyncio.create_task(bench.work.publish_owed_wake_ups())
    await asyncio.sleep(0.05)
    assert not flushed.done()  # what is owed is not published yet
    release.set()
    await asyncio.wait_for(flushed, timeout=1)
    assert sent == [WorkAvailablePayload(lane=LANE, kind=KIND.value)] * 2
    await bench.work.publish_owed_wake_ups()  # nothing owed: returns at once
    assert bench.count("work_items_enqueued_total", kind=KIND.value) == 6


async def test_a_stream_of_enqueues_sends_one_wake_up_per_window_the_first_at_once(
    bench: WorkBench, ctx: OpContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first enqueue after a quiet spell is published at once; the enqueues of the
    coalescing window that follows (each one's publish would have completed before the
    next) are owed one message, sent when the window ends, not one each."""
    work = WorkManagerImpl(
        MemoryWorkStorage(),
        tenancy=bench.managers.tenancy,
        audit=bench.managers.audit,
        topics=bench.infra.topics,
        metrics=WorkMetrics(CollectorRegistry()),
        wake_up_coalesce_s=0.2,
    )
    topics = bench.infra.topics
    publish = topics.publish
    sent: list[object] = []

    async def counted(topic: Topics, message: WorkAvailablePayload) -> None:
        sent.append(message)
        await publish(topic, message)

    monkeypatch.setattr(topics, "publish", counted)
    await work.enqueue(ctx, new_item(ctx))
    for _ in range(3):
        await asyncio.sleep(0)
    assert sent == [WorkAvailablePayload(lane=LANE, kind=KIND.value)]  # not held back
    for _ in range(5):
        await work.enqueue(ctx, new_item(ctx))
        await asyncio.sleep(0.01)  # the publish would have been sent by now
    assert len(sent) == 1  # owed until the window ends
    await asyncio.wait_for(work.publish_owed_wake_ups(), timeout=2)
    assert sent == [WorkAvailablePayload(lane=LANE, kind=KIND.value)] * 2


async def test_enqueue_bulk_stores_stamped_fresh_items_and_returns_their_ids(
    bench: WorkBench, ctx: OpContext
) -> None:
    """Each payload (a model or its JSON form) becomes one fresh item of the kind, stamped
    from the context as `enqueue` stamps it, on the policy's lane; the ids come back in
    input order, every item is counted and the lane is woken."""
    payloads: list[Any] = [ProbePayload(record_id=uuid4(), count=2), payload(), payload()]
    async with bench.infra.topics.subscribe(Topics.WORK_AVAILABLE) as messages:
        ids = await bench.work.enqueue_bulk(ctx, KIND, payloads)
        message = await asyncio.wait_for(anext(messages), timeout=1)
    assert message == WorkAvailablePayload(lane=WORK_POLICIES[KIND].lane, kind=KIND.value)
    assert len(set(ids)) == 3
    stored = [await bench.work.get(ctx, item_id) for item_id in ids]
    assert [item.payload for item in stored] == [
        ProbePayload.model_validate(p).model_dump(mode="json") for p in payloads
    ]
    for item in stored:
        assert (item.kind, item.lane, item.status, item.attempts) == (
            KIND,
            WORK_POLICIES[KIND].lane,
            WorkStatus.AVAILABLE,
            0,
        )
        assert item.max_attempts == WORK_POLICIES[KIND].max_attempts
        assert (item.created_by, item.updated_by) == (ctx.user_id, ctx.user_id)
        assert item.request_id == ctx.request.request_id
        assert item.traceparent == ctx.request.traceparent
        assert item.idempotency_key is None
        assert item.claim_token is None
    assert bench.count("work_items_enqueued_total", kind=KIND.value) == 3
    assert await bench.work.enqueue_bulk(ctx, KIND, []) == []


async def test_enqueue_bulk_refuses_by_payload_index_and_writes_nothing(
    bench: WorkBench, ctx: OpContext
) -> None:
    """Whatever `enqueue` refuses, `enqueue_bulk` refuses too, naming the payload by its
    index: a model instance is validated in its JSON form (one built without validation,
    or of a subclass with a field of its own, is refused), and so are the lane, the delay,
    the kind and the tenant."""

    class WithSecret(ProbePayload):
        secret: str = "s"

    good = payload()
    wrong: dict[str, Any] = {"record_id": "not-a-uuid", "count": "many"}
    unvalidated = ProbePayload.model_construct(**wrong)  # built without validation
    cases: list[tuple[list[Any], dict[str, Any], str]] = [
        ([good, {"record_id": "not-a-uuid"}], {}, r"^payloads\.1\.record_id: "),
        ([{"record_id": str(uuid4()), "note": "a\x00b"}], {}, r"^payloads\.0\.note: holds a NUL"),
        ([good, {"record_id": str(uuid4()), "extra": 1}], {}, r"^payloads\.1\.extra: "),
        ([{"record_id": str(uuid4()), "n\x00b": 1}], {}, r"^payloads\.0\.n\\x00b: Extra inputs"),
        ([good, unvalidated], {}, r"^payloads\.1\.record_id: "),
        ([WithSecret(record_id=uuid4())], {}, r"^payloads\.0\.secret: Extra inputs"),
        ([good], {"delay": float("nan")}, r"^delay: nan is not a finite number"),
        ([good], {"delay": float("-inf")}, r"^delay: -inf is not a finite number"),
        ([good], {"delay": 1e300}, r"^delay: .* reaches past the year 9999"),
        ([good], {"delay": "5"}, r"^delay: must be a number of seconds, got str"),
        ([good], {"delay": True}, r"^delay: must be a number of seconds, got bool"),
        ([good], {"lane": "Bad Lane!"}, r"^lane: must be snake_case"),
        ([good], {"lane": "a\x00b"}, r"^lane: must be snake_case"),
        ([good], {"lane": "x" * 101}, r"^lane: is 101 characters, more than 100"),
    ]
    for payloads, options, refusal in cases:
        with pytest.raises(Invalid, match=refusal):
            await bench.work.enqueue_bulk(ctx, KIND, payloads, **options)
    with pytest.raises(Invalid, match=r"^kind: 'NO_SUCH_KIND' names no work kind"):
        await bench.work.enqueue_bulk(ctx, cast(WorkKind, "NO_SUCH_KIND"), [good])
    nil = dataclasses.replace(ctx, org_id=EMPTY_UUID)
    with pytest.raises(Invalid, match=r"^org_id: the nil tenant is the system scope"):
        await bench.work.enqueue_bulk(nil, KIND, [good])
    assert await bench.work.list_items(ctx) == []
    assert bench.count("work_items_enqueued_total", kind=KIND.value) == 0
    # The kind's name as text names it, as `WorkItem.new` takes it.
    (item_id,) = await bench.work.enqueue_bulk(ctx, cast(WorkKind, KIND.value), [good])
    assert (await bench.work.get(ctx, item_id)).kind is KIND


async def test_enqueue_refuses_a_lane_no_worker_can_name_and_the_system_scope(
    bench: WorkBench, ctx: OpContext
) -> None:
    """The single enqueue applies the same lane rule as a worker's `LANE` setting, refuses
    the nil tenant (the system scope), and `WorkItem.new` a delay that is not a number."""
    for lane, refusal in [
        ("Bad Lane!", r"^lane: must be snake_case"),
        ("nul\x00lane", r"^lane: must be snake_case"),
        ("x" * 101, r"^lane: is 101 characters"),
    ]:
        with pytest.raises(Invalid, match=refusal):
            await bench.work.enqueue(ctx, new_item(ctx, lane=lane))
    nil = dataclasses.replace(ctx, org_id=EMPTY_UUID)
    with pytest.raises(Invalid, match=r"^org_id: the nil tenant is the system scope"):
        await bench.work.enqueue(nil, new_item(nil))
    with pytest.raises(Invalid, match=r"^delay: must be a number of seconds, got NoneType"):
        WorkItem.new(org_id=ctx.org_id, kind=KIND, payload=payload(), delay=cast(float, None))
    assert await bench.work.list_items(ctx) == []


async def test_a_duplicate_idempotency_key_returns_the_first_row(
    bench: WorkBench, ctx: OpContext
) -> None:
    first = await bench.work.enqueue(ctx, new_item(ctx, idempotency_key="order-42"))
    second = await bench.work.enqueue(ctx, new_item(ctx, idempotency_key="order-42"))
    assert second == first


async def test_an_idempotency_key_an_item_of_another_kind_holds_is_a_conflict(
    bench: WorkBench, ctx: OpContext
) -> None:
    """A key is the tenant's whatever the kind: answering an enqueue of another kind with
    the key's item would drop the new item unseen, so it is refused, naming both kinds."""
    first = await bench.work.enqueue(ctx, new_item(ctx, idempotency_key="order-42"))
    other = next(kind for kind in WorkKind if kind is not KIND)
    # A payload every kind's model takes (the template's default payload).
    again = new_item(
        ctx, idempotency_key="order-42", kind=other, payload={"record_id": str(uuid4())}
    )
    refusal = (
        rf"^idempotency_key: 'order-42' is item {first.id} of kind {KIND.value}, "
        rf"not {other.value}: give each kind keys of its own$"
    )
    with pytest.raises(Conflict, match=refusal):
        await bench.work.enqueue(ctx, again)
    fresh = again.model_copy(update={"id": uuid4(), "idempotency_key": "order-43"})
    with pytest.raises(Conflict, match=r"; the others were enqueued$"):
        await bench.work.enqueue_many(ctx, [fresh, again])
    assert {i.id for i in await bench.work.list_items(ctx)} == {first.id, fresh.id}


async def test_enqueue_refuses_a_payload_naming_the_field_and_writes_nothing(
    bench: WorkBench, ctx: OpContext
) -> None:
    bad = new_item(ctx, payload={"record_id": "not-a-uuid"})
    with pytest.raises(Invalid, match=r"^payload\.record_id: "):
        await bench.work.enqueue(ctx, bad)
    with pytest.raises(Invalid, match=r"^payload\.stray: "):
        await bench.work.enqueue(ctx, new_item(ctx, payload={**payload(), "stray": 1}))
    assert await bench.work.list_items(ctx) == []


async def test_enqueue_refuses_a_nul_character_naming_the_field_and_writes_nothing(
    bench: WorkBench, ctx: OpContext
) -> None:
    """PostgreSQL cannot store U+0000; the refusal is the manager's, so memory and SQLite
    refuse what PostgreSQL would (the same case runs over PostgreSQL in the integration
    suite)."""
    nul_note = new_item(ctx, payload={"record_id": str(uuid4()), "note": "a\x00b"})
    with pytest.raises(Invalid, match=r"^payload\.note: holds a NUL character \(U\+0000\)"):
        await bench.work.enqueue(ctx, nul_note)
    with pytest.raises(Invalid, match=r", refused in memory too, so that what works in tests"):
        await bench.work.enqueue(ctx, nul_note)  # the reason that applies to this backend
    nul_key = new_item(ctx, idempotency_key="order-\x00")
    with pytest.raises(Invalid, match=r"^idempotency_key: holds a NUL character"):
        await bench.work.enqueue_many(ctx, [new_item(ctx), nul_key])
    assert await bench.work.list_items(ctx) == []


async def test_enqueue_refuses_an_idempotency_key_the_index_cannot_hold(
    bench: WorkBench, ctx: OpContext
) -> None:
    """A key past `MAX_IDEMPOTENCY_KEY_BYTES` in UTF-8 (PostgreSQL's btree entry limit,
    less a margin) is refused on every storage alike, naming its size; one at the limit is
    stored."""
    at_limit = "k" * MAX_IDEMPOTENCY_KEY_BYTES
    stored = await bench.work.enqueue(ctx, new_item(ctx, idempotency_key=at_limit))
    assert stored.idempotency_key == at_limit
    too_long = "é" * (MAX_IDEMPOTENCY_KEY_BYTES // 2 + 1)  # two bytes each in UTF-8
    with pytest.raises(
        Invalid, match=rf"^idempotency_key: {MAX_IDEMPOTENCY_KEY_BYTES + 2} bytes in UTF-8"
    ):
        await bench.work.enqueue_many(ctx, [new_item(ctx), new_item(ctx, idempotency_key=too_long)])
    assert [i.id for i in await bench.work.list_items(ctx)] == [stored.id]


@pytest.mark.parametrize(
    ("delay", "message"),
    [
        (float("inf"), r"^delay: inf is not a finite number of seconds"),
        (float("nan"), r"^delay: nan is not a finite number of seconds"),
        (1e12, r"^delay: 1000000000000\.0 seconds reaches past the year 9999"),
    ],
)
async def test_an_item_refuses_a_delay_no_timestamp_can_hold(
    ctx: OpContext, delay: float, message: str
) -> None:
    """`WorkItem.new` refuses a delay that is not finite or lands past the year 9999 with
    `Invalid` naming the field, not the `OverflowError` of the date arithmetic."""
    with pytest.raises(Invalid, match=message):
        WorkItem.new(org_id=ctx.org_id, kind=KIND, payload=payload(), delay=delay)


async def test_a_failure_message_with_a_nul_character_is_stored_readable(
    bench: WorkBench, ctx: OpContext
) -> None:
    await bench.work.enqueue(ctx, new_item(ctx))
    work_ctx, held = await claim(bench)
    failed = await bench.work.fail(work_ctx, held, "ValueError: bad\x00byte \ud800")
    assert failed.last_error == "ValueError: bad\\x00byte \\ud800"


async def test_enqueue_refuses_a_kind_without_a_payload_model(
    bench: WorkBench, ctx: OpContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(WORK_PAYLOADS, KIND)
    with pytest.raises(Invalid, match=r"^kind: "):
        await bench.work.enqueue(ctx, new_item(ctx))
    assert await bench.work.list_items(ctx) == []


async def test_enqueue_refuses_an_item_of_another_tenant(bench: WorkBench, ctx: OpContext) -> None:
    with pytest.raises(Invalid, match=r"^org_id: "):
        await bench.work.enqueue(ctx, new_item(ctx, org_id=uuid4()))


async def test_enqueue_many_writes_every_item_or_none(bench: WorkBench, ctx: OpContext) -> None:
    good, bad = new_item(ctx), new_item(ctx, payload={})
    with pytest.raises(Invalid):
        await bench.work.enqueue_many(ctx, [good, bad])
    assert await bench.work.list_items(ctx) == []
    items = await bench.work.enqueue_many(ctx, [good, new_item(ctx)])
    assert items[0].id == good.id
    assert len(await bench.work.list_items(ctx)) == 2


def outbox_row(ctx: OpContext, kind: str) -> OutboxRow:
    return OutboxRow(
        id=uuid4(),
        org_id=ctx.org_id,
        kind=kind,
        payload=payload(),
        actor_id=uuid4(),
        request_id=uuid4(),
        traceparent=TRACEPARENT,
        created_at=datetime.now(UTC),
        relayed_at=None,
    )


async def test_enqueue_relayed_refuses_an_unknown_kind_and_another_tenant(
    bench: WorkBench, ctx: OpContext
) -> None:
    with pytest.raises(Invalid, match=r"^kind: "):
        await bench.work.enqueue_relayed(ctx.org_id, outbox_row(ctx, "work.no_such_kind"))
    with pytest.raises(Invalid, match=r"^org_id: "):
        await bench.work.enqueue_relayed(uuid4(), outbox_row(ctx, f"work.{KIND.value}"))


async def test_every_enqueue_path_takes_a_priority_and_refuses_one_out_of_its_range(
    bench: WorkBench, ctx: OpContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The single, many and bulk enqueues store the priority asked; without one an item,
    a relayed one too, takes its kind's policy priority; one out of -10..10 (or no int) is
    refused naming the range, with nothing written (docs/decisions/0036)."""
    monkeypatch.setitem(WORK_POLICIES, KIND, WORK_POLICIES[KIND].model_copy(update={"priority": 4}))
    out_of_range = r"^priority: 11 is out of range; use an integer from -10 to 10"
    with pytest.raises(Invalid, match=out_of_range):
        await bench.work.enqueue(ctx, new_item(ctx, priority=11))
    with pytest.raises(Invalid, match=out_of_range):
        await bench.work.enqueue_many(ctx, [new_item(ctx), new_item(ctx, priority=11)])
    with pytest.raises(Invalid, match=out_of_range):
        await bench.work.enqueue_bulk(ctx, KIND, [payload()], priority=11)
    with pytest.raises(Invalid, match=r"^priority: must be an integer from -10 to 10, got bool"):
        await bench.work.enqueue_bulk(ctx, KIND, [payload()], priority=True)
    with pytest.raises(Invalid, match=r"^priority: -11 is out of range"):
        WorkItem.new(org_id=ctx.org_id, kind=KIND, payload=payload(), priority=-11)
    assert await bench.work.list_items(ctx) == []

    one = await bench.work.enqueue(ctx, new_item(ctx, priority=7))
    (many,) = await bench.work.enqueue_many(ctx, [new_item(ctx, priority=-10)])
    (bulk,) = await bench.work.enqueue_bulk(ctx, KIND, [payload()], priority=10)
    (bulk_default,) = await bench.work.enqueue_bulk(ctx, KIND, [payload()])
    made = WorkItem.new(org_id=ctx.org_id, kind=KIND, payload=payload(), lane=LANE)
    relayed = await bench.work.enqueue_relayed(ctx.org_id, outbox_row(ctx, f"work.{KIND.value}"))
    assert (one.priority, many.priority, made.priority, relayed.priority) == (7, -10, 4, 4)
    assert (await bench.work.get(ctx, bulk)).priority == 10
    assert (await bench.work.get(ctx, bulk_default)).priority == 4


# -- claim -------------------------------------------------------------------------------------


async def test_claim_finds_nothing_on_an_empty_lane(bench: WorkBench) -> None:
    assert (
        await bench.work.claim(RequestContext.new(WORKER_APP), LANE, [KIND], "w1", LEASE_S) is None
    )


async def test_claim_many_fills_the_free_slots(bench: WorkBench, ctx: OpContext) -> None:
    await bench.work.enqueue_many(ctx, [new_item(ctx) for _ in range(3)])
    rctx = RequestContext.new(WORKER_APP)
    claimed = await bench.work.claim_many(rctx, LANE, [KIND], "w1", lease=LEASE_S, limit=2)
    assert len(claimed) == 2
    assert bench.count("work_items_claimed_total", kind=KIND.value) == 2


async def test_claim_many_asks_the_tenancy_manager_once_per_enqueue_request(
    bench: WorkBench, ctx: OpContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each item runs under a context the tenancy manager built for its tenant, enqueuer
    and causing request; items enqueued together share one transition."""
    together = await bench.work.enqueue_many(ctx, [new_item(ctx) for _ in range(3)])
    later = await bench.managers.tenancy.member_context(
        RequestContext.new(ctx.request.app), org_id=ctx.org_id, user_id=ctx.user_id, role=ctx.role
    )
    alone = await bench.work.enqueue(later, new_item(later))
    other = await bench.member("other")
    theirs = await bench.work.enqueue(other, new_item(other))
    tenancy = bench.managers.tenancy
    original = tenancy.service_context
    asked: list[object] = []

    async def service_context(rctx: RequestContext, **kwargs: Any) -> OpContext:
        asked.append(kwargs["caused_by_request_id"])
        return await original(rctx, **kwargs)

    monkeypatch.setattr(tenancy, "service_context", service_context)
    claimed = await bench.work.claim_many(
        RequestContext.new(WORKER_APP), LANE, [KIND], "w1", lease=LEASE_S, limit=5
    )

    assert sorted(map(str, asked)) == sorted(
        map(str, [ctx.request.request_id, later.request.request_id, other.request.request_id])
    )
    causes = {item.id: (c.org_id, c.user_id, c.caused_by_request_id) for c, item in claimed}
    assert causes == {
        **{i.id: (ctx.org_id, ctx.user_id, ctx.request.request_id) for i in together},
        alone.id: (ctx.org_id, ctx.user_id, later.request.request_id),
        theirs.id: (other.org_id, other.user_id, other.request.request_id),
    }


async def test_a_claim_whose_contexts_cannot_be_built_hands_the_batch_back(
    bench: WorkBench, ctx: OpContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim has committed when a tenancy lookup fails (the database blips): the whole
    batch goes back at once, attempts given back, the items whose context was already
    built included, instead of waiting out its leases."""
    await bench.work.enqueue_many(ctx, [new_item(ctx) for _ in range(2)])
    other = await bench.member("other")
    await bench.work.enqueue(other, new_item(other))
    tenancy = bench.managers.tenancy
    original = tenancy.service_context

    async def service_context(rctx: RequestContext, **kwargs: Any) -> OpContext:
        if kwargs["org_id"] == other.org_id:
            raise ConnectionError("the tenancy store is unreachable")
        return await original(rctx, **kwargs)

    monkeypatch.setattr(tenancy, "service_context", service_context)
    with pytest.raises(ConnectionError):
        await bench.work.claim_many(
            RequestContext.new(WORKER_APP), LANE, [KIND], "w1", lease=LEASE_S, limit=3
        )

    items = await bench.work.list_items(ctx) + await bench.work.list_items(other)
    assert [(i.status, i.attempts, i.claim_token) for i in items] == [
        (WorkStatus.AVAILABLE, 0, None)
    ] * 3
    assert all(i.note == "handed back: the claim's context could not be built" for i in items)


class _Recorder:
    """Wraps the tenancy manager's `service_context` and the storage's `claim_next` of a
    bench, recording `("ask", org_id)`, `("claim", "start")` and `("claim", "end")` in
    the order they happen; `fail_asks_for` makes the asks for one tenant raise."""

    def __init__(self, bench: WorkBench, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, object]] = []
        self.fail_asks_for: UUID | None = None
        tenancy = bench.managers.tenancy
        ask = tenancy.service_context
        storage = cast(Any, bench.work)._storage
        claim_next = storage.claim_next

        async def service_context(rctx: RequestContext, **kwargs: Any) -> OpContext:
            self.events.append(("ask", kwargs["org_id"]))
            await asyncio.sleep(0)  # let a claim running beside it start first
            if kwargs["org_id"] == self.fail_asks_for:
                raise ConnectionError("the tenancy store is unreachable")
            return await ask(rctx, **kwargs)

        async def claim(*args: Any, **kwargs: Any) -> Any:
            self.events.append(("claim", "start"))
            await asyncio.sleep(0.01)
            claimed = await claim_next(*args, **kwargs)
            self.events.append(("claim", "end"))
            return claimed

        monkeypatch.setattr(tenancy, "service_context", service_context)
        monkeypatch.setattr(storage, "claim_next", claim)

    async def claim(self, bench: WorkBench, limit: int = 1) -> list[tuple[OpContext, WorkItem]]:
        self.events.clear()
        rctx = RequestContext.new(WORKER_APP)
        return await bench.work.claim_many(rctx, LANE, [KIND], "w1", lease=LEASE_S, limit=limit)


async def test_while_batches_repeat_a_context_it_is_asked_for_beside_the_claim(
    bench: WorkBench, ctx: OpContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items enqueued together (one tenant, enqueuer and request): from the third batch on,
    the tenancy manager is asked while the claim runs, once per batch, never twice, and
    the items run under the context it built."""
    await bench.work.enqueue_many(ctx, [new_item(ctx) for _ in range(4)])
    recorder = _Recorder(bench, monkeypatch)
    after = [("claim", "start"), ("claim", "end"), ("ask", ctx.org_id)]
    for _ in range(2):
        assert len(await recorder.claim(bench)) == 1
        assert recorder.events == after

    (pair,) = await recorder.claim(bench)
    assert recorder.events == [("claim", "start"), ("ask", ctx.org_id), ("claim", "end")]
    assert (pair[0].org_id, pair[0].caused_by_request_id) == (
        ctx.org_id,
        ctx.request.request_id,
    )
    assert len(await recorder.claim(bench)) == 1
    assert recorder.events.count(("ask", ctx.org_id)) == 1


async def test_a_batch_of_another_context_stops_the_early_ask(
    bench: WorkBench, ctx: OpContext, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a batch brings another context, the early answer goes unused once and is asked
    no more: items that each come from their own request never pay for it."""
    await bench.work.enqueue_many(ctx, [new_item(ctx) for _ in range(2)])
    clock.advance(1)  # the other request's items are due after these (one tenant: in order)
    other = dataclasses.replace(ctx, request=RequestContext.new(ctx.request.app))
    await bench.work.enqueue(other, new_item(other))
    await bench.work.enqueue(other, new_item(other))
    recorder = _Recorder(bench, monkeypatch)
    await recorder.claim(bench)
    await recorder.claim(bench)  # the same context twice: the next claim asks early

    (pair,) = await recorder.claim(bench)
    assert pair[0].caused_by_request_id == other.request.request_id
    assert recorder.events == [
        ("claim", "start"),
        ("ask", ctx.org_id),  # early, and unused
        ("claim", "end"),
        ("ask", other.org_id),
    ]
    await recorder.claim(bench)
    assert recorder.events == [("claim", "start"), ("claim", "end"), ("ask", other.org_id)]


async def test_an_early_answer_that_the_tenant_is_gone_dead_letters_the_item(
    bench: WorkBench, ctx: OpContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fence on a gone tenant holds for an early answer too."""
    await bench.work.enqueue_many(ctx, [new_item(ctx) for _ in range(3)])
    recorder = _Recorder(bench, monkeypatch)
    await recorder.claim(bench)
    await recorder.claim(bench)
    tenancy = bench.managers.tenancy
    asking = tenancy.service_context

    async def gone(rctx: RequestContext, **kwargs: Any) -> OpContext:
        await asking(rctx, **kwargs)
        raise NotFound(f"org_id: {kwargs['org_id']} is gone")

    monkeypatch.setattr(tenancy, "service_context", gone)
    assert await recorder.claim(bench) == []
    # Early, as before; then the slot the dead letter left is claimed again at once (the
    # lane is empty now).
    assert recorder.events[:3] == [("claim", "start"), ("ask", ctx.org_id), ("claim", "end")]
    assert recorder.events.count(("claim", "start")) == 2
    failed = [i for i in await bench.work.list_items(ctx) if i.status is WorkStatus.FAILED]
    assert [i.last_error for i in failed] == ["tenant is gone"]


async def test_a_live_tenants_answer_is_reused_for_its_reuse_time_then_asked_again(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a reuse time, the answer that a tenant is live serves the key's next batches
    (no ask; the same context with the batch's own request) until that time has passed
    since the ask; then it is asked again."""
    use_probe_payload(monkeypatch)
    bench = work_bench(
        MemoryStorageRoot(), Infra.memory(), MemoryWorkStorage(clock=clock), context_reuse_s=0.3
    )
    ctx = await bench.member()
    await bench.work.enqueue_many(ctx, [new_item(ctx) for _ in range(4)])
    recorder = _Recorder(bench, monkeypatch)
    (first,) = await recorder.claim(bench)
    assert recorder.events == [("claim", "start"), ("claim", "end"), ("ask", ctx.org_id)]
    (second,) = await recorder.claim(bench)
    assert recorder.events == [("claim", "start"), ("claim", "end")]
    assert second[0].request != first[0].request  # the second claim's own
    assert dataclasses.replace(second[0], request=first[0].request) == first[0]
    await asyncio.sleep(0.35)
    (third,) = await recorder.claim(bench)
    assert ("ask", ctx.org_id) in recorder.events
    assert (third[0].org_id, third[0].caused_by_request_id) == (
        ctx.org_id,
        ctx.request.request_id,
    )


async def test_a_tenant_gone_longer_than_the_reuse_time_has_its_items_dead_lettered(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant that goes after an answer that it was live: its items still run within the
    reuse time of that answer, and the first claim after it asks, hears that the tenant is
    gone and dead-letters the item; an answer that a tenant is gone is never reused."""
    use_probe_payload(monkeypatch)
    bench = work_bench(
        MemoryStorageRoot(), Infra.memory(), MemoryWorkStorage(clock=clock), context_reuse_s=0.3
    )
    ctx = await bench.member()
    await bench.work.enqueue_many(ctx, [new_item(ctx) for _ in range(4)])
    recorder = _Recorder(bench, monkeypatch)
    assert len(await recorder.claim(bench)) == 1
    tenancy = bench.managers.tenancy
    asking = tenancy.service_context

    async def gone(rctx: RequestContext, **kwargs: Any) -> OpContext:
        await asking(rctx, **kwargs)
        raise NotFound(f"org_id: {kwargs['org_id']} is gone")

    monkeypatch.setattr(tenancy, "service_context", gone)
    assert len(await recorder.claim(bench)) == 1  # within the reuse time: not asked
    await asyncio.sleep(0.35)
    assert await recorder.claim(bench) == []
    assert await recorder.claim(bench) == []
    assert recorder.events.count(("ask", ctx.org_id)) == 1  # asked again, not reused
    failed = [i for i in await bench.work.list_items(ctx) if i.status is WorkStatus.FAILED]
    assert [i.last_error for i in failed] == ["tenant is gone"] * 2


async def test_a_claim_that_took_longer_than_the_reuse_time_asks_again(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer fresh when a claim starts but older than the reuse time when the claim
    returns is not used: a slow claim does not stretch the window, and the item of a tenant
    gone meanwhile is dead-lettered."""
    use_probe_payload(monkeypatch)
    storage = MemoryWorkStorage(clock=clock)
    bench = work_bench(MemoryStorageRoot(), Infra.memory(), storage, context_reuse_s=0.2)
    ctx = await bench.member()
    await bench.work.enqueue_many(ctx, [new_item(ctx) for _ in range(2)])
    recorder = _Recorder(bench, monkeypatch)
    assert len(await recorder.claim(bench)) == 1
    tenancy, claim_next = bench.managers.tenancy, storage.claim_next
    asking = tenancy.service_context

    async def gone(rctx: RequestContext, **kwargs: Any) -> OpContext:
        await asking(rctx, **kwargs)
        raise NotFound(f"org_id: {kwargs['org_id']} is gone")

    async def slow(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.3)
        return await claim_next(*args, **kwargs)

    monkeypatch.setattr(tenancy, "service_context", gone)
    monkeypatch.setattr(storage, "claim_next", slow)
    assert await recorder.claim(bench) == []
    assert ("ask", ctx.org_id) in recorder.events
    failed = [i for i in await bench.work.list_items(ctx) if i.status is WorkStatus.FAILED]
    assert [i.last_error for i in failed] == ["tenant is gone"]


async def test_a_backlog_of_a_gone_tenant_does_not_pass_for_an_empty_lane(
    bench: WorkBench, ctx: OpContext, clock: FakeClock
) -> None:
    """A claim whose rows are all dead letters (a gone tenant's) claims again at once for
    the slots they left: one `claim_many` goes through the gone tenant's backlog and hands
    out the live tenant's item behind it, instead of returning nothing while it is due."""
    storage = MemoryWorkStorage(clock=clock)
    orphaned = work_bench(MemoryStorageRoot(), Infra.memory(), storage)
    for _ in range(5):
        await storage.create_item(ctx.org_id, new_item(ctx))  # a tenant `orphaned` lacks
    clock.advance(1)
    live = await orphaned.member()
    await orphaned.work.enqueue(live, new_item(live))
    rctx = RequestContext.new(WORKER_APP)
    pairs = await orphaned.work.claim_many(rctx, LANE, [KIND], "w1", lease=LEASE_S, limit=2)
    assert [(c.org_id, i.org_id) for c, i in pairs] == [(live.org_id, live.org_id)]
    rows = await storage.list_items(ctx.org_id)
    assert [(r.status, r.last_error) for r in rows] == [(WorkStatus.FAILED, "tenant is gone")] * 5
    assert orphaned.count("work_dead_letters_total", kind=KIND.value, reason="tenant") == 5
    assert await orphaned.work.claim_many(rctx, LANE, [KIND], "w1", lease=LEASE_S, limit=2) == []


async def test_a_claim_after_dead_letters_that_fails_still_hands_out_what_it_claimed(
    bench: WorkBench, ctx: OpContext, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the claim that follows a batch's dead letters fails, the items the first claim
    handed out are returned, not left claimed by nobody until their leases pass."""
    storage = MemoryWorkStorage(clock=clock)
    orphaned = work_bench(MemoryStorageRoot(), Infra.memory(), storage)
    live = await orphaned.member()
    await orphaned.work.enqueue(live, new_item(live))
    clock.advance(1)
    await storage.create_item(ctx.org_id, new_item(ctx))  # a tenant `orphaned` lacks
    claim_next = storage.claim_next
    calls: list[int] = []

    async def second_fails(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["limit"])
        if len(calls) > 1:
            raise ConnectionError("the database went away")
        return await claim_next(*args, **kwargs)

    monkeypatch.setattr(storage, "claim_next", second_fails)
    rctx = RequestContext.new(WORKER_APP)
    pairs = await orphaned.work.claim_many(rctx, LANE, [KIND], "w1", lease=LEASE_S, limit=2)
    assert calls == [2, 1]
    assert [i.org_id for _, i in pairs] == [live.org_id]
    with pytest.raises(ConnectionError):  # a first claim that fails still raises
        await orphaned.work.claim_many(rctx, LANE, [KIND], "w1", lease=LEASE_S, limit=2)


async def test_an_early_ask_that_fails_is_asked_again_after_the_claim(
    bench: WorkBench, ctx: OpContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An early ask that raises costs nothing but itself: the batch asks again after the
    claim, and a failure there hands the batch back, as without the early ask."""
    await bench.work.enqueue_many(ctx, [new_item(ctx) for _ in range(4)])
    recorder = _Recorder(bench, monkeypatch)
    await recorder.claim(bench)
    await recorder.claim(bench)
    recorder.fail_asks_for = ctx.org_id
    with pytest.raises(ConnectionError):
        await recorder.claim(bench)
    assert recorder.events == [
        ("claim", "start"),
        ("ask", ctx.org_id),
        ("claim", "end"),
        ("ask", ctx.org_id),
    ]
    handed_back = [i for i in await bench.work.list_items(ctx) if i.claim_token is None]
    assert len(handed_back) == 2  # the two never claimed, and the one handed back
    assert sum(i.status is WorkStatus.AVAILABLE for i in handed_back) == 2


async def test_the_contexts_of_a_batch_are_asked_for_at_the_same_time(
    bench: WorkBench, ctx: OpContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items from three requests: the three tenancy reads overlap instead of running in
    turn, and each item still gets the context of its own request."""
    later = [
        await bench.managers.tenancy.member_context(
            RequestContext.new(ctx.request.app),
            org_id=ctx.org_id,
            user_id=ctx.user_id,
            role=ctx.role,
        )
        for _ in range(2)
    ]
    items = [await bench.work.enqueue(c, new_item(c)) for c in (ctx, *later)]
    tenancy = bench.managers.tenancy
    original = tenancy.service_context
    events: list[str] = []

    async def service_context(rctx: RequestContext, **kwargs: Any) -> OpContext:
        events.append("start")
        await asyncio.sleep(0.01)
        events.append("end")
        return await original(rctx, **kwargs)

    monkeypatch.setattr(tenancy, "service_context", service_context)
    claimed = await bench.work.claim_many(
        RequestContext.new(WORKER_APP), LANE, [KIND], "w1", lease=LEASE_S, limit=3
    )
    assert events == ["start"] * 3 + ["end"] * 3
    causes = {item.id: c.caused_by_request_id for c, item in claimed}
    assert causes == {
        item.id: c.request.request_id for c, item in zip((ctx, *later), items, strict=True)
    }


async def test_complete_many_completes_held_items_and_counts_the_refused(
    bench: WorkBench, ctx: OpContext
) -> None:
    await bench.work.enqueue_many(ctx, [new_item(ctx) for _ in range(3)])
    pairs = await bench.work.claim_many(
        RequestContext.new(WORKER_APP), LANE, [KIND], "w1", lease=LEASE_S, limit=3
    )
    (_, a), (ctx_b, b), (_, c) = pairs
    await bench.work.release(ctx_b, b, note="handed back")

    done = await bench.work.complete_many(pairs)

    assert done == {a.id, c.id}
    assert (await bench.work.get(ctx, a.id)).status is WorkStatus.COMPLETED
    assert (await bench.work.get(ctx, b.id)).status is WorkStatus.AVAILABLE
    assert bench.count("work_items_completed_total", kind=KIND.value) == 2
    assert bench.count("work_fencing_conflicts_total", operation="complete") == 1


# -- a holder's writes -------------------------------------------------------------------------


async def test_release_hands_back_at_once_with_its_note(bench: WorkBench, ctx: OpContext) -> None:
    await bench.work.enqueue(ctx, new_item(ctx))
    work_ctx, held = await claim(bench)
    back = await bench.work.release(work_ctx, held, note="draining")
    assert (back.status, back.attempts, back.note) == (WorkStatus.AVAILABLE, 0, "draining")
    assert back.updated_by == EMPTY_UUID


async def test_extend_lease_renews_under_the_same_token(
    bench: WorkBench, ctx: OpContext, clock: FakeClock
) -> None:
    await bench.work.enqueue(ctx, new_item(ctx))
    work_ctx, held = await claim(bench)
    clock.advance(20)
    renewed = await bench.work.extend_lease(work_ctx, held, LEASE_S)
    assert renewed.lease_expires_at == clock.now + timedelta(seconds=LEASE_S)
    assert renewed.claim_token == held.claim_token
    assert renewed.updated_by == EMPTY_UUID
    clock.advance(20)
    assert (await bench.work.complete(work_ctx, renewed)).status is WorkStatus.COMPLETED


async def test_a_failure_with_attempts_left_requeues_with_a_growing_delay(
    bench: WorkBench, ctx: OpContext, clock: FakeClock
) -> None:
    await bench.work.enqueue(ctx, new_item(ctx, max_attempts=3))
    delays: list[float] = []
    for _ in range(2):
        work_ctx, held = await claim(bench)
        failed = await bench.work.fail(work_ctx, held, "boom")
        assert (failed.status, failed.last_error) == (WorkStatus.AVAILABLE, "boom")
        delays.append((failed.available_at - clock.now).total_seconds())
        clock.advance(delays[-1] + 1)
    assert 0 < delays[0] < delays[1]
    assert bench.count("work_items_retried_total", kind=KIND.value) == 2


async def test_a_failure_at_max_attempts_is_a_dead_letter(bench: WorkBench, ctx: OpContext) -> None:
    item = await bench.work.enqueue(ctx, new_item(ctx, max_attempts=1))
    work_ctx, held = await claim(bench)
    dead = await bench.work.fail(work_ctx, held, "boom")
    assert (dead.status, dead.last_error, dead.updated_by) == (
        WorkStatus.FAILED,
        "boom",
        EMPTY_UUID,
    )
    entries = await bench.managers.audit.list_for(ctx, "work_item", item.id)
    assert [(e.action, e.actor_id) for e in entries] == [("work.dead_lettered", ctx.user_id)]
    assert entries[0].detail["reason"] == "attempts"
    assert bench.count("work_dead_letters_total", kind=KIND.value, reason="attempts") == 1
    assert (
        await bench.work.claim(RequestContext.new(WORKER_APP), LANE, [KIND], "w", LEASE_S) is None
    )


async def test_every_holder_write_with_a_stale_token_is_refused(
    bench: WorkBench, ctx: OpContext, clock: FakeClock
) -> None:
    await bench.work.enqueue(ctx, new_item(ctx))
    work_ctx, held = await claim(bench)
    clock.advance(LEASE_S + 1)
    assert await bench.work.requeue_stale(await bench.service(ctx.org_id)) == 1
    _, current = await claim(bench, worker="w2")
    for write in (
        bench.work.complete(work_ctx, held),
        bench.work.fail(work_ctx, held, "late"),
        bench.work.defer(work_ctx, held, 1),
        bench.work.release(work_ctx, held),
        bench.work.extend_lease(work_ctx, held, LEASE_S),
    ):
        with pytest.raises(Conflict):
            await write
    assert await bench.work.get(ctx, held.id) == current
    assert bench.count("work_fencing_conflicts_total", operation="complete") == 1


async def test_a_write_in_another_tenant_finds_nothing(bench: WorkBench, ctx: OpContext) -> None:
    await bench.work.enqueue(ctx, new_item(ctx))
    _, held = await claim(bench)
    stranger = await bench.member("stranger")
    with pytest.raises(NotFound):
        await bench.work.complete(stranger, held)
    with pytest.raises(NotFound):
        await bench.work.get(stranger, held.id)


# -- maintenance -------------------------------------------------------------------------------


async def test_maintenance_contexts_are_service_contexts_of_the_system_user(
    bench: WorkBench, ctx: OpContext
) -> None:
    contexts = await bench.work.maintenance_contexts(RequestContext.new(WORKER_APP))
    assert [(c.org_id, c.user_id, c.role) for c in contexts] == [
        (ctx.org_id, EMPTY_UUID, Role.SERVICE)
    ]


async def test_requeue_stale_requeues_and_dead_letters_with_an_audit_entry(
    bench: WorkBench, ctx: OpContext, clock: FakeClock
) -> None:
    spare = await bench.work.enqueue(ctx, new_item(ctx, max_attempts=2))
    last = await bench.work.enqueue(ctx, new_item(ctx, max_attempts=1))
    await bench.work.claim_many(
        RequestContext.new(WORKER_APP), LANE, [KIND], "w1", lease=LEASE_S, limit=2
    )
    clock.advance(LEASE_S + 1)
    sweep_ctx = await bench.service(ctx.org_id)
    assert await bench.work.requeue_stale(sweep_ctx) == 2
    assert (await bench.work.get(ctx, spare.id)).status is WorkStatus.AVAILABLE
    assert (await bench.work.get(ctx, last.id)).status is WorkStatus.FAILED
    entries = await bench.managers.audit.list_for(ctx, "work_item", last.id)
    assert [(e.action, e.actor_id) for e in entries] == [("work.dead_lettered", EMPTY_UUID)]
    assert bench.count("work_dead_letters_total", kind=KIND.value, reason="lease") == 1
    assert bench.count("work_items_requeued_stale_total", kind=KIND.value) == 1


async def test_a_claimed_item_whose_tenant_is_gone_is_dead_lettered(
    bench: WorkBench, ctx: OpContext
) -> None:
    storage = MemoryWorkStorage()
    orphaned = work_bench(MemoryStorageRoot(), Infra.memory(), storage)
    await storage.create_item(ctx.org_id, new_item(ctx))
    rctx = RequestContext.new(WORKER_APP)
    assert await orphaned.work.claim(rctx, LANE, [KIND], "w1", LEASE_S) is None
    (row,) = await storage.list_items(ctx.org_id)
    assert (row.status, row.last_error) == (WorkStatus.FAILED, "tenant is gone")
    assert orphaned.count("work_dead_letters_total", kind=KIND.value, reason="tenant") == 1


# -- operator ----------------------------------------------------------------------------------


async def dead_letter(bench: WorkBench, ctx: OpContext) -> WorkItem:
    item = await bench.work.enqueue(ctx, new_item(ctx, max_attempts=1))
    work_ctx, held = await claim(bench)
    await bench.work.fail(work_ctx, held, "boom")
    return item


async def test_replay_revives_a_dead_letter_and_is_audited(
    bench: WorkBench, ctx: OpContext
) -> None:
    item = await dead_letter(bench, ctx)
    replayed = await bench.work.replay(ctx, item.id)
    assert (replayed.status, replayed.attempts, replayed.updated_by) == (
        WorkStatus.AVAILABLE,
        0,
        EMPTY_UUID,
    )
    entries = await bench.managers.audit.list_for(ctx, "work_item", item.id)
    assert [(e.action, e.actor_id) for e in entries][-1] == ("work.replayed", ctx.user_id)
    with pytest.raises(Conflict, match=r"^status: "):
        await bench.work.replay(ctx, item.id)
    with pytest.raises(NotFound):
        await bench.work.replay(ctx, uuid4())


async def test_replay_and_discard_record_the_operator_in_the_audit_detail_only(
    bench: WorkBench, ctx: OpContext
) -> None:
    # every dead letter first: a replayed item is claimable again
    replayed, discarded = await dead_letter(bench, ctx), await dead_letter(bench, ctx)
    unnamed = await dead_letter(bench, ctx)
    await bench.work.replay(ctx, replayed.id, operator="alice")
    await bench.work.discard(ctx, discarded.id, operator="bob")
    for item, action, operator in (
        (replayed, "work.replayed", "alice"),
        (discarded, "work.discarded", "bob"),
    ):
        last = (await bench.managers.audit.list_for(ctx, "work_item", item.id))[-1]
        assert (last.action, last.detail["operator"], last.actor_id) == (
            action,
            operator,
            ctx.user_id,
        )
    await bench.work.replay(ctx, unnamed.id)
    last = (await bench.managers.audit.list_for(ctx, "work_item", unnamed.id))[-1]
    assert "operator" not in last.detail


async def test_discard_soft_deletes_a_dead_letter_and_is_audited(
    bench: WorkBench, ctx: OpContext, clock: FakeClock
) -> None:
    item = await dead_letter(bench, ctx)
    discarded = await bench.work.discard(ctx, item.id)
    assert discarded.deleted_at is not None
    entries = await bench.managers.audit.list_for(ctx, "work_item", item.id)
    assert [e.action for e in entries][-1] == "work.discarded"
    assert await bench.work.list_items(ctx, status=WorkStatus.FAILED) == []
    for again in (bench.work.discard, bench.work.replay):
        with pytest.raises(Conflict, match=rf"^deleted_at: item {item.id} was discarded at "):
            await again(ctx, item.id)
    clock.advance(10)
    assert await bench.work.purge_deleted(ctx, older_than=5) == 1
    with pytest.raises(NotFound):
        await bench.work.get(ctx, item.id)


async def test_move_lane_moves_the_waiting_items_audited_and_refuses_a_lane_it_cannot_name(
    bench: WorkBench, ctx: OpContext
) -> None:
    waiting = await bench.work.enqueue(ctx, new_item(ctx, lane="default"))
    move = functools.partial(
        bench.work.move_lane,
        ctx,
        from_lane="default",
        to_lane="bulk",
        kind=KIND.value,
        operator="alice",
        also_known=["bulk"],
    )
    # a lane some worker claims on, but no worker claims this kind on: stranded, refused
    rctx = RequestContext.new(WORKER_APP)
    await bench.work.beat_worker(rctx, "m-1", worker="m", lane="bulk", kinds=[], ttl_s=60)
    with pytest.raises(
        Invalid, match=rf"^to_lane: no worker claims {KIND.value} on lane bulk; the lanes that do: "
    ):
        await move()
    assert (await bench.work.get(ctx, waiting.id)).lane == "default"
    await bench.work.beat_worker(rctx, "w-1", worker="w", lane="bulk", kinds=[KIND], ttl_s=60)
    moved = await move()
    assert moved == [(waiting.id, KIND.value)]
    assert (await bench.work.get(ctx, waiting.id)).lane == "bulk"
    (entry,) = await bench.managers.audit.list_for(ctx, "work_item", waiting.id)
    assert (entry.action, entry.detail) == (
        "work.lane_moved",
        {"kind": KIND.value, "from_lane": "default", "to_lane": "bulk", "operator": "alice"},
    )
    for from_lane, to_lane in (("default", "default"), ("default", "Bulk Lane")):
        with pytest.raises(Invalid, match=r"^(to_lane|lane): "):
            await bench.work.move_lane(ctx, from_lane=from_lane, to_lane=to_lane)
    # a lane no worker claims on would strand the items: refused, naming the known ones
    known = ", ".join(known_lanes())
    with pytest.raises(
        Invalid, match=rf"^to_lane: no worker claims on lane nowhere; the known lanes: {known}$"
    ):
        await bench.work.move_lane(ctx, from_lane="bulk", to_lane="nowhere")
    assert (await bench.work.get(ctx, waiting.id)).lane == "bulk"


async def test_discard_unknown_kind_deletes_only_a_row_no_workkind_names_audited(
    bench: WorkBench, ctx: OpContext
) -> None:
    known = await bench.work.enqueue(ctx, new_item(ctx))
    stray = stored_row(ctx.org_id, LANE, kind="BOGUS_KIND")
    storage = bench.work._storage
    assert isinstance(storage, MemoryWorkStorage)
    storage._rows[stray["id"]] = WorkItem.model_construct(**stray)

    row = await bench.work.discard_unknown_kind(ctx, stray["id"], operator="bob")

    assert (row.id, row.kind, row.values["deleted_at"] is not None) == (
        stray["id"],
        "BOGUS_KIND",
        True,
    )
    (entry,) = await bench.managers.audit.list_for(ctx, "work_item", stray["id"])
    assert (entry.action, entry.detail) == (
        "work.discarded",
        {"kind": "BOGUS_KIND", "lane": LANE, "status": "AVAILABLE", "operator": "bob"},
    )
    with pytest.raises(Conflict, match=rf"^deleted_at: item {stray['id']} was discarded"):
        await bench.work.discard_unknown_kind(ctx, stray["id"])
    with pytest.raises(Conflict, match=rf"^kind: item {known.id} is of kind {KIND.value}, "):
        await bench.work.discard_unknown_kind(ctx, known.id)
    with pytest.raises(NotFound):
        await bench.work.discard_unknown_kind(ctx, uuid4())


async def test_purge_completed_deletes_completed_items_past_retention_only(
    bench: WorkBench, ctx: OpContext, clock: FakeClock
) -> None:
    item = await bench.work.enqueue(ctx, new_item(ctx))
    work_ctx, held = await claim(bench)
    await bench.work.complete(work_ctx, held)
    dead = await dead_letter(bench, ctx)
    clock.advance(10)
    assert await bench.work.purge_completed(ctx, older_than=60) == 0
    assert await bench.work.purge_completed(ctx, older_than=5) == 1
    with pytest.raises(NotFound):
        await bench.work.get(ctx, item.id)
    assert (await bench.work.get(ctx, dead.id)).status == WorkStatus.FAILED
    with pytest.raises(Invalid, match=r"^older_than: "):
        await bench.work.purge_completed(ctx, older_than=-1)
    with pytest.raises(Invalid, match=r"^limit: "):
        await bench.work.purge_completed(ctx, older_than=5, limit=0)


async def test_queue_stats_count_across_tenants(bench: WorkBench, ctx: OpContext) -> None:
    other = await bench.member("other")
    await bench.work.enqueue(ctx, new_item(ctx))
    await bench.work.enqueue(other, new_item(other))
    (stats,) = await bench.work.queue_stats(RequestContext.new(WORKER_APP))
    assert (stats.lane, stats.kind, stats.status, stats.count) == (
        LANE,
        KIND.value,
        WorkStatus.AVAILABLE,
        2,
    )


# -- the audit entry a dead letter owes --------------------------------------------------------


def fail_once(target: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """`target` that raises `ConnectionError` on its first call (the database went away) and
    passes every later call through; keeps `target`'s signature."""
    calls: list[int] = []

    @functools.wraps(target)
    async def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("the audit database went away")
        return await target(*args, **kwargs)

    return flaky


async def dead_lettered_entries(bench: WorkBench, ctx: OpContext, item_id: UUID) -> list[Any]:
    entries = await bench.managers.audit.list_for(ctx, "work_item", item_id)
    return [e for e in entries if e.action == "work.dead_lettered"]


async def unaudited(bench: WorkBench) -> float:
    await bench.work.queue_stats(RequestContext.new(WORKER_APP))
    return bench.count("work_dead_letters_unaudited", kind=KIND.value)


async def test_a_dead_letter_whose_audit_write_failed_gets_one_entry_from_the_sweep(
    bench: WorkBench, ctx: OpContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The row is failed, then the audit append fails: the failure stands and is counted,
    the entry waits (the gauge says so), and the sweep writes it: once, however often it
    runs."""
    item = await bench.work.enqueue(ctx, new_item(ctx, max_attempts=1))
    work_ctx, held = await claim(bench)
    monkeypatch.setattr(bench.managers.audit, "append", fail_once(bench.managers.audit.append))

    failed = await bench.work.fail(work_ctx, held, "boom")

    assert (failed.status, failed.last_error) == (WorkStatus.FAILED, "boom")
    assert bench.count("work_dead_letters_total", kind=KIND.value, reason="attempts") == 1
    assert await dead_lettered_entries(bench, ctx, item.id) == []
    assert await unaudited(bench) == 1
    sweep = await bench.service(ctx.org_id)
    assert await bench.work.audit_dead_letters(sweep) == 1
    assert await bench.work.audit_dead_letters(sweep) == 0
    (entry,) = await dead_lettered_entries(bench, ctx, item.id)
    assert entry.detail == {
        "kind": KIND.value,
        "lane": LANE,
        "attempts": 1,
        "reason": "attempts",
        "last_error": "boom",
        "claim_token": str(held.claim_token),
    }
    assert entry.actor_id == EMPTY_UUID  # written by the sweep's service context
    assert await unaudited(bench) == 0
    assert bench.count("work_dead_letters_total", kind=KIND.value, reason="attempts") == 1


async def test_a_lease_dead_letter_whose_audit_write_failed_still_moves_and_counts(
    bench: WorkBench, ctx: OpContext, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    item = await bench.work.enqueue(ctx, new_item(ctx, max_attempts=1))
    await claim(bench)
    clock.advance(LEASE_S + 1)
    monkeypatch.setattr(bench.managers.audit, "append", fail_once(bench.managers.audit.append))
    sweep = await bench.service(ctx.org_id)

    assert await bench.work.requeue_stale(sweep) == 1

    assert (await bench.work.get(ctx, item.id)).status is WorkStatus.FAILED
    assert bench.count("work_dead_letters_total", kind=KIND.value, reason="lease") == 1
    assert await dead_lettered_entries(bench, ctx, item.id) == []
    assert await bench.work.audit_dead_letters(sweep) == 1
    (entry,) = await dead_lettered_entries(bench, ctx, item.id)
    assert entry.detail["reason"] == "lease"


async def test_sweeps_racing_the_original_write_record_one_entry(
    bench: WorkBench, ctx: OpContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry is appended but its debt is not settled (the queue database went away in
    between): two sweeps at once write it again, under the same key, and one entry stands."""
    item = await bench.work.enqueue(ctx, new_item(ctx, max_attempts=1))
    work_ctx, held = await claim(bench)
    storage = bench.work._storage
    monkeypatch.setattr(storage, "settle_audit", fail_once(storage.settle_audit))

    await bench.work.fail(work_ctx, held, "boom")

    assert len(await dead_lettered_entries(bench, ctx, item.id)) == 1
    assert await unaudited(bench) == 1
    sweep = await bench.service(ctx.org_id)
    first, second = await asyncio.gather(
        bench.work.audit_dead_letters(sweep), bench.work.audit_dead_letters(sweep)
    )
    assert first + second == 1  # one of them settled the debt
    assert len(await dead_lettered_entries(bench, ctx, item.id)) == 1
    assert await unaudited(bench) == 0


class _UnkeyedAudit:
    """A host's audit manager whose `append` takes no idempotency key (the optional part of
    the host contract), over the real one."""

    def __init__(self, inner: AuditManagerInterface) -> None:
        self._inner = inner

    async def append(
        self,
        ctx: OpContext,
        *,
        action: str,
        subject_type: str,
        subject_id: UUID,
        detail: dict[str, Any],
    ) -> AuditEntry:
        return await self._inner.append(
            ctx, action=action, subject_type=subject_type, subject_id=subject_id, detail=detail
        )

    async def list_for(
        self, ctx: OpContext, subject_type: str, subject_id: UUID
    ) -> list[AuditEntry]:
        return await self._inner.list_for(ctx, subject_type, subject_id)


async def test_without_an_idempotency_key_the_entry_is_found_by_its_claim_token(
    bench: WorkBench, ctx: OpContext, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = MemoryWorkStorage(clock=clock)
    work = WorkManagerImpl(
        storage,
        tenancy=bench.managers.tenancy,
        audit=cast(AuditManagerInterface, _UnkeyedAudit(bench.managers.audit)),
        topics=bench.infra.topics,
        metrics=WorkMetrics(CollectorRegistry()),
    )
    item = await work.enqueue(ctx, new_item(ctx, max_attempts=1))
    claimed = await work.claim(RequestContext.new(WORKER_APP), LANE, [KIND], "w1", LEASE_S)
    assert claimed is not None
    monkeypatch.setattr(storage, "settle_audit", fail_once(storage.settle_audit))
    await work.fail(*claimed, "boom")
    sweep = await bench.service(ctx.org_id)
    assert await work.audit_dead_letters(sweep) == 1
    assert await work.audit_dead_letters(sweep) == 0
    assert len(await dead_lettered_entries(bench, ctx, item.id)) == 1


async def test_replay_writes_the_entry_a_dead_letter_still_owes_first(
    bench: WorkBench, ctx: OpContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    item = await bench.work.enqueue(ctx, new_item(ctx, max_attempts=1))
    work_ctx, held = await claim(bench)
    monkeypatch.setattr(bench.managers.audit, "append", fail_once(bench.managers.audit.append))
    await bench.work.fail(work_ctx, held, "boom")
    await bench.work.replay(ctx, item.id)
    entries = await bench.managers.audit.list_for(ctx, "work_item", item.id)
    assert [e.action for e in entries] == ["work.dead_lettered", "work.replayed"]
    assert await unaudited(bench) == 0


# -- rows that cannot be read ------------------------------------------------------------------


async def test_a_row_that_cannot_be_read_never_stops_the_claim_and_is_audited_by_the_sweep(
    bench: WorkBench, ctx: OpContext, caplog: pytest.LogCaptureFixture
) -> None:
    good = await bench.work.enqueue(ctx, new_item(ctx))
    bad = stored_row(ctx.org_id, LANE, payload=[1, 2, 3])
    storage = bench.work._storage
    assert isinstance(storage, MemoryWorkStorage)
    storage._rows[bad["id"]] = WorkItem.model_construct(
        **{**bad, "kind": WorkKind(bad["kind"]), "status": WorkStatus.AVAILABLE}
    )
    rctx = RequestContext.new(WORKER_APP)

    claimed = await bench.work.claim_many(rctx, LANE, [KIND], "w1", lease=LEASE_S, limit=10)

    assert [item.id for _, item in claimed] == [good.id]
    assert bench.count("work_dead_letters_total", kind=KIND.value, reason="unreadable") == 1
    assert f"work item {bad['id']} (tenant {ctx.org_id}) dead-lettered: its row cannot be " in (
        caplog.text
    )
    with pytest.raises(UnreadableItem, match=rf"^payload: work item {bad['id']} cannot be read"):
        await bench.work.get(ctx, bad["id"])
    (listed,) = (await bench.work.list_items(ctx, status=WorkStatus.FAILED)).unreadable
    assert listed.values["last_error"] == "unreadable row: payload: " + listed.reason
    assert await bench.work.audit_dead_letters(await bench.service(ctx.org_id)) == 1
    (entry,) = await dead_lettered_entries(bench, ctx, bad["id"])
    assert (entry.detail["reason"], entry.detail["attempts"]) == ("unreadable", 1)
    for write in (bench.work.replay, bench.work.discard):
        with pytest.raises(UnreadableItem):
            await write(ctx, bad["id"])
    (still,) = (await bench.work.list_items(ctx, status=WorkStatus.FAILED)).unreadable
    assert still.values == listed.values  # refused, nothing written


# -- cancel and a handler's verdicts -----------------------------------------------------------


async def test_cancel_item_of_a_waiting_item_is_audited_with_the_operator(
    bench: WorkBench, ctx: OpContext
) -> None:
    item = await bench.work.enqueue(ctx, new_item(ctx))
    cancelled = await bench.work.cancel_item(ctx, item.id, operator="alice")
    assert cancelled.status is WorkStatus.CANCELLED
    last = (await bench.managers.audit.list_for(ctx, "work_item", item.id))[-1]
    assert (last.action, last.actor_id) == ("work.cancelled", ctx.user_id)
    assert last.detail == {
        "kind": KIND.value,
        "lane": LANE,
        "was": "AVAILABLE",
        "operator": "alice",
    }
    assert bench.count("work_items_cancelled_total", kind=KIND.value, was="available") == 1
    assert (
        await bench.work.claim_many(
            RequestContext.new(WORKER_APP), LANE, [KIND], "w1", lease=LEASE_S, limit=5
        )
        == []
    )


async def test_cancel_item_of_a_claimed_item_refuses_the_holder_without_a_conflict_counted(
    bench: WorkBench, ctx: OpContext
) -> None:
    item = await bench.work.enqueue(ctx, new_item(ctx))
    work_ctx, held = await claim(bench)
    await bench.work.cancel_item(ctx, item.id)
    last = (await bench.managers.audit.list_for(ctx, "work_item", item.id))[-1]
    assert (last.detail["was"], last.detail["claimed_by"]) == ("CLAIMED", "w1")
    with pytest.raises(ItemCancelled):
        await bench.work.extend_lease(work_ctx, held, LEASE_S)
    with pytest.raises(ItemCancelled):
        await bench.work.fail(work_ctx, held, "boom")
    done = await bench.work.complete_many([(work_ctx, held)])
    assert (set(done), done.cancelled) == (set(), {item.id})
    assert bench.count("work_fencing_conflicts_total", operation="complete") == 0
    assert bench.count("work_fencing_conflicts_total", operation="extend_lease") == 0
    assert bench.count("work_fencing_conflicts_total", operation="fail") == 0


async def test_cancel_item_sends_the_cancel_note_on_the_topic(
    bench: WorkBench, ctx: OpContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker on Redis hears of the cancel at once: `(lane, cancel:<id>)`."""
    item = await bench.work.enqueue(ctx, new_item(ctx))
    await bench.work.publish_owed_wake_ups()
    sent: list[object] = []
    publish = bench.infra.topics.publish

    async def recorded(topic: Topics, message: WorkAvailablePayload) -> None:
        sent.append(message)
        await publish(topic, message)

    monkeypatch.setattr(bench.infra.topics, "publish", recorded)
    await bench.work.cancel_item(ctx, item.id)
    await bench.work.publish_owed_wake_ups()
    assert sent == [WorkAvailablePayload(lane=LANE, kind=f"cancel:{item.id}")]


async def test_cancel_item_refuses_a_finished_or_unknown_item_in_one_line(
    bench: WorkBench, ctx: OpContext
) -> None:
    dead = await dead_letter(bench, ctx)
    with pytest.raises(Conflict, match=r"^status: only an available or claimed item can be "):
        await bench.work.cancel_item(ctx, dead.id)
    await bench.work.discard(ctx, dead.id)
    with pytest.raises(Conflict, match=r"^deleted_at: "):
        await bench.work.cancel_item(ctx, dead.id)
    with pytest.raises(NotFound, match=r"^item_id: no work item "):
        await bench.work.cancel_item(ctx, uuid4())
    entries = await bench.managers.audit.list_for(ctx, "work_item", dead.id)
    assert "work.cancelled" not in [e.action for e in entries]


async def test_purge_cancelled_deletes_cancelled_items_past_retention_only(
    bench: WorkBench, ctx: OpContext, clock: FakeClock
) -> None:
    item = await bench.work.enqueue(ctx, new_item(ctx))
    await bench.work.cancel_item(ctx, item.id)
    clock.advance(10)
    assert await bench.work.purge_cancelled(ctx, older_than=60) == 0
    assert await bench.work.purge_cancelled(ctx, older_than=5) == 1
    with pytest.raises(Invalid):
        await bench.work.purge_cancelled(ctx, older_than=-1)
    with pytest.raises(Invalid):
        await bench.work.purge_cancelled(ctx, older_than=5, limit=0)


async def test_fail_permanently_dead_letters_at_once_and_audits_the_reason(
    bench: WorkBench, ctx: OpContext
) -> None:
    item = await bench.work.enqueue(ctx, new_item(ctx, max_attempts=5))
    work_ctx, held = await claim(bench)
    dead = await bench.work.fail_permanently(work_ctx, held, "PermanentFailure: no such order")
    assert (dead.status, dead.attempts, dead.last_error) == (
        WorkStatus.FAILED,
        1,
        "PermanentFailure: no such order",
    )
    (entry,) = await dead_lettered_entries(bench, ctx, item.id)
    assert (entry.detail["reason"], entry.detail["last_error"]) == (
        "handler",
        "PermanentFailure: no such order",
    )
    assert bench.count("work_dead_letters_total", kind=KIND.value, reason="handler") == 1
    with pytest.raises(Conflict):
        await bench.work.fail_permanently(work_ctx, held, "again")


async def test_a_snooze_hands_the_item_back_later_with_its_attempt_given_back(
    bench: WorkBench, ctx: OpContext, clock: FakeClock
) -> None:
    await bench.work.enqueue(ctx, new_item(ctx))
    work_ctx, held = await claim(bench)
    snoozed = await bench.work.defer(work_ctx, held, 30.0, note="snoozed")
    assert (snoozed.status, snoozed.attempts, snoozed.note) == (
        WorkStatus.AVAILABLE,
        0,
        "snoozed",
    )
    rctx = RequestContext.new(WORKER_APP)
    assert await bench.work.claim(rctx, LANE, [KIND], "w1", LEASE_S) is None
    clock.advance(31)
    assert await bench.work.claim(rctx, LANE, [KIND], "w1", LEASE_S) is not None
