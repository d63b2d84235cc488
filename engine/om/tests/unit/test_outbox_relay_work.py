"""The outbox relay's `work.` branch, over memory and over PostgreSQL.

A `work.<kind>` row relayed twice leaves one work item, and the item carries the row's actor,
request id, and traceparent. Beside the host's own relay tests
(`om/tests/unit/test_outbox_relay.py`), which the template never edits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from uuid import UUID, uuid4

import pytest
from work_fixtures import KIND, SERVICE_APP, ProbePayload, use_probe_payload

from acme.infra.container import Infra
from acme.infra.topics import Topics, WorkAvailablePayload
from acme.om.context import OpContext, RequestContext, Role
from acme.om.root import Managers, build_managers
from acme.om.storage.root import StorageRootInterface
from acme.om.work.types.work_item import WorkStatus

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(
    params=["memory_storage", pytest.param("pg_storage", marks=pytest.mark.integration)]
)
def storage(request: pytest.FixtureRequest) -> StorageRootInterface:
    """The memory storage root, then the SQL one over PostgreSQL as the application role."""
    root: StorageRootInterface = request.getfixturevalue(request.param)
    return root


@pytest.fixture
def managers(
    storage: StorageRootInterface, infra_memory: Infra, monkeypatch: pytest.MonkeyPatch
) -> Managers:
    use_probe_payload(monkeypatch)
    return build_managers(storage, infra_memory)


@pytest.fixture
async def ctx(managers: Managers) -> OpContext:
    """A member of a fresh tenant, acting in a traced request (the cause the row records)."""
    rctx = RequestContext.new(SERVICE_APP, traceparent=TRACEPARENT)
    org = await managers.tenancy.create_org(rctx, "relay-org")
    return await managers.tenancy.member_context(
        rctx, org_id=org.id, user_id=uuid4(), role=Role.MEMBER
    )


def crash_once_after_dispatch(
    storage: StorageRootInterface, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The relay's first `mark_relayed` raises, as a crash between dispatch and mark would:
    the row stays pending and the next pass dispatches it again (at least once)."""
    outbox = storage.get_outbox_storage()
    mark = outbox.mark_relayed
    crashed: list[bool] = []

    async def mark_relayed(row_ids: Sequence[UUID], at: datetime) -> int:
        if not crashed:
            crashed.append(True)
            raise ConnectionError("the relay died before marking its rows")
        return await mark(row_ids, at)

    monkeypatch.setattr(outbox, "mark_relayed", mark_relayed)


async def test_a_work_row_relayed_twice_leaves_one_item_caused_by_the_row(
    managers: Managers,
    ctx: OpContext,
    storage: StorageRootInterface,
    infra_memory: Infra,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    payload = ProbePayload(record_id=uuid4()).model_dump(mode="json")
    row = await managers.outbox.append(ctx, f"work.{KIND.value.lower()}", payload)
    crash_once_after_dispatch(storage, monkeypatch)
    rctx = RequestContext.new(SERVICE_APP)

    async with infra_memory.topics.subscribe(Topics.WORK_AVAILABLE) as messages:
        with pytest.raises(ConnectionError):
            await managers.outbox_relay.relay_pending(rctx)
        assert await managers.outbox_relay.relay_pending(rctx) == 1
        assert await managers.outbox_relay.relay_pending(rctx) == 0
        message = await asyncio.wait_for(anext(messages), timeout=1)

    (item,) = await managers.work.list_items(ctx)
    assert message == WorkAvailablePayload(lane=item.lane, kind=KIND.value)
    assert (item.kind, item.status, item.payload) == (KIND, WorkStatus.AVAILABLE, payload)
    assert (item.created_by, item.request_id, item.traceparent) == (
        row.actor_id,
        row.request_id,
        row.traceparent,
    )
    assert (row.actor_id, row.request_id, row.traceparent) == (
        ctx.user_id,
        ctx.request.request_id,
        TRACEPARENT,
    )
    assert item.idempotency_key == str(row.id)
