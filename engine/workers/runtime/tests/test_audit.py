"""The handlers' audit entries, group-committed (`runtime.audit`): over the host's own audit
manager on PostgreSQL (through its `append_many` where it has one, else call by call), each
`append` keeps its own outcome while concurrent appends of a tenant share one batch; and the
optional contract part's shapes (docs/host-contract.md, Batched audit appends). Every test
here passes on a host with or without `append_many`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, cast
from uuid import UUID, uuid4

import pytest

from acme.infra.container import Infra
from acme.om.audit import AuditEntry, AuditManagerInterface
from acme.om.context import OpContext, RequestContext
from acme.om.errors import Invalid
from acme.om.root import Managers, build_managers
from acme.om.storage.impl.sql import SqlStorageRoot
from acme.workers.runtime.audit import AuditBatchAppender, GroupCommitAudit
from acme.workers.runtime.container import (
    HostContractError,
    RuntimeContainer,
    append_many_problem,
    as_audit_manager,
    check_audit_batches,
)
from acme.workers.runtime.testing import APP

_REFUSED = UUID(int=1)
"""A subject `_Audit` refuses, as a host refuses an entry it finds invalid."""


class _Audit:
    """The host's audit manager behind the runtime's group commit, whatever the host offers:
    its `append_many` when it has one, else each call through its `append` (the runtime's
    batching is under test, not the host's transaction). Refuses `_REFUSED` as a subject
    (`Invalid`) in a batch and alone; records each batch's tenants and size; reports only
    what `answer` makes of a batch's entries when set (a host breaking the contract)."""

    def __init__(
        self,
        host: AuditManagerInterface,
        *,
        answer: Callable[[list[AuditEntry]], Any] | None = None,
    ) -> None:
        self._host = host
        self._answer = answer
        self.batches: list[tuple[set[UUID], int]] = []

    async def append(self, ctx: OpContext, **fields: Any) -> AuditEntry:
        if fields["subject_id"] == _REFUSED:
            raise Invalid("subject_id: refused by the test")
        return await self._host.append(ctx, **fields)

    async def append_many(
        self, calls: Sequence[tuple[OpContext, Mapping[str, Any]]]
    ) -> list[AuditEntry]:
        self.batches.append(({ctx.org_id for ctx, _ in calls}, len(calls)))
        if any(fields["subject_id"] == _REFUSED for _, fields in calls):
            raise Invalid("subject_id: refused by the test")
        if isinstance(self._host, AuditBatchAppender):
            entries = await self._host.append_many(calls)
        else:
            entries = [await self._host.append(ctx, **fields) for ctx, fields in calls]
        return entries if self._answer is None else self._answer(entries)

    def group_committed(self) -> GroupCommitAudit:
        """The runtime's group commit over this manager."""
        return GroupCommitAudit(cast(AuditManagerInterface, self), self)


@pytest.fixture
def managers(pg_storage: SqlStorageRoot) -> Managers:
    """The host's managers over PostgreSQL (as the application role: row-level security)."""
    return build_managers(pg_storage, Infra.memory())


async def _tenant(managers: Managers, name: str = "audited") -> OpContext:
    rctx = RequestContext.new(APP)
    org = await managers.tenancy.create_org(rctx, name)
    return await managers.tenancy.service_context(
        rctx, org_id=org.id, acting_for=uuid4(), caused_by_request_id=None
    )


def _append(
    audit: AuditManagerInterface | GroupCommitAudit, ctx: OpContext, subject: UUID, **more: Any
) -> asyncio.Task[AuditEntry]:
    fields: dict[str, Any] = {"action": "handled", "subject_type": "thing", "detail": {}}
    fields.update(more)
    return asyncio.create_task(audit.append(ctx, subject_id=subject, **fields))


async def test_concurrent_appends_of_a_tenant_are_written_in_one_batch(
    managers: Managers,
) -> None:
    ctx = await _tenant(managers)
    host = _Audit(managers.audit)
    audit = host.group_committed()
    subject = uuid4()

    entries = await asyncio.gather(*(_append(audit, ctx, subject) for _ in range(10)))

    assert host.batches == [({ctx.org_id}, 10)]
    listed = await managers.audit.list_for(ctx, "thing", subject)
    assert sorted(e.id for e in listed) == sorted(e.id for e in entries)
    assert {(e.org_id, e.actor_id, e.request_id) for e in entries} == {
        (ctx.org_id, ctx.user_id, ctx.request.request_id)
    }


async def test_each_tenant_of_a_batch_is_written_in_its_own_transaction(
    managers: Managers,
) -> None:
    first, second = await _tenant(managers, "first"), await _tenant(managers, "second")
    host = _Audit(managers.audit)
    audit = host.group_committed()
    subject = uuid4()

    await asyncio.gather(*(_append(audit, ctx, subject) for ctx in (first, second, first)))

    assert sorted(host.batches, key=lambda b: b[1]) == [
        ({second.org_id}, 1),
        ({first.org_id}, 2),
    ]
    assert len(await managers.audit.list_for(first, "thing", subject)) == 2
    assert len(await managers.audit.list_for(second, "thing", subject)) == 1


async def test_a_refused_append_fails_alone_and_the_rest_of_its_batch_is_written(
    managers: Managers,
) -> None:
    ctx = await _tenant(managers)
    host = _Audit(managers.audit)
    audit = host.group_committed()
    subject = uuid4()

    good = [_append(audit, ctx, subject) for _ in range(3)]
    outcomes = await asyncio.gather(*good, _append(audit, ctx, _REFUSED), return_exceptions=True)

    assert host.batches == [({ctx.org_id}, 4)]  # refused as a batch, then one by one
    assert isinstance(outcomes[3], Invalid)
    assert "refused by the test" in str(outcomes[3])
    listed = await managers.audit.list_for(ctx, "thing", subject)
    assert sorted(e.id for e in listed) == sorted(
        e.id for e in outcomes[:3] if isinstance(e, AuditEntry)
    )


async def test_an_append_cancelled_before_its_batch_was_sent_is_not_written(
    managers: Managers,
) -> None:
    ctx = await _tenant(managers)
    host = _Audit(managers.audit)
    audit = host.group_committed()
    subject = uuid4()

    kept, dropped = _append(audit, ctx, subject), _append(audit, ctx, subject)
    await asyncio.sleep(0)  # both queued; the writer has not run yet
    dropped.cancel()
    entry = await kept

    assert dropped.cancelled()
    assert host.batches == [({ctx.org_id}, 1)]
    assert await managers.audit.list_for(ctx, "thing", subject) == [entry]


@pytest.mark.parametrize(
    ("answer", "named"),
    [
        (lambda entries: entries[:1], "returned 1 entries for 2 calls"),
        (lambda _: None, "returned None for 2 calls"),
    ],
    ids=["short", "none"],
)
async def test_a_batch_not_reported_as_the_contract_says_fails_each_append_and_repeats_none(
    managers: Managers,
    answer: Callable[[list[AuditEntry]], Any],
    named: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx = await _tenant(managers)
    host = _Audit(managers.audit, answer=answer)
    audit = host.group_committed()
    subject = uuid4()

    outcomes = await asyncio.gather(
        *(_append(audit, ctx, subject) for _ in range(2)), return_exceptions=True
    )

    for outcome in outcomes:  # failed, never cancelled: the loop retries the item
        assert isinstance(outcome, RuntimeError)
        assert named in str(outcome)
    assert host.batches == [({ctx.org_id}, 2)]
    assert len(await managers.audit.list_for(ctx, "thing", subject)) == 2  # written once
    assert any(r.levelname == "ERROR" and named in r.getMessage() for r in caplog.records)


async def test_a_refused_batch_is_logged_once_as_a_warning_with_its_traceback(
    managers: Managers, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    ctx = await _tenant(managers)
    host = _Audit(managers.audit)
    audit = host.group_committed()

    for _ in range(2):
        await asyncio.gather(
            _append(audit, ctx, uuid4()), _append(audit, ctx, _REFUSED), return_exceptions=True
        )

    fallbacks = [r for r in caplog.records if "appending them one by one" in r.getMessage()]
    assert audit.fallbacks == 2
    assert [(r.levelname, bool(r.exc_info)) for r in fallbacks] == [
        ("WARNING", True),
        ("INFO", False),
    ]


def test_the_hosts_audit_manager_is_group_committed_when_it_has_append_many(
    container: RuntimeContainer,
) -> None:
    check_audit_batches(container.managers)  # the host's own shape is one the worker calls
    audit = as_audit_manager(container.managers.audit)

    has_batches = isinstance(container.managers.audit, AuditBatchAppender)
    assert isinstance(audit, GroupCommitAudit) is has_batches
    assert isinstance(audit, AuditManagerInterface)  # what the handlers were written against


class _Appends:
    async def append(self, ctx: OpContext, **fields: Any) -> None: ...


class _Synchronous(_Appends):
    def append_many(self, calls: Sequence[tuple[OpContext, Mapping[str, Any]]]) -> list[Any]:
        return []


class _MoreRequired(_Appends):
    async def append_many(
        self, calls: Sequence[tuple[OpContext, Mapping[str, Any]]], *, dry_run: bool
    ) -> list[Any]:
        return []


class _NoPositional(_Appends):
    async def append_many(self, *, calls: Sequence[Any]) -> list[Any]:
        return []


def test_a_manager_without_append_many_is_used_as_it_is() -> None:
    audit: Any = _Appends()

    assert append_many_problem(audit) == ""
    assert as_audit_manager(audit) is audit


@pytest.mark.parametrize(
    ("audit", "problem"),
    [
        (_Synchronous(), "is not a coroutine function"),
        (_MoreRequired(), "also requires dry_run"),
        (_NoPositional(), "takes no positional parameter"),
    ],
)
def test_an_append_many_of_another_shape_is_refused_at_start_and_left_unused(
    container: RuntimeContainer, audit: Any, problem: str
) -> None:
    host = replace(container.managers, audit=audit)

    with pytest.raises(HostContractError, match=rf"Managers\.audit\.append_many {problem}"):
        check_audit_batches(host)
    assert as_audit_manager(audit) is audit
