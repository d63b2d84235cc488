"""Group commit for the handlers' audit entries: the entries of concurrent items written together.

A handler that audits each item (the generated default handler does) pays one database
session per entry through `AuditManagerInterface.append`. When the host's audit manager
also has `append_many` (the optional part of docs/host-contract.md, "Batched audit
appends"), the container hands the handlers a `GroupCommitAudit` over it instead: each
`append` still returns only once its entry is written, with the entry its key recorded,
or raises what writing it raised; but the appends that arrive while one batch is being
written go out together in the next, one `append_many` per tenant. An idle worker writes
an entry at once; a busy one pays one session per batch. The loop writes its completions
the same way (`completion.Completions`); see docs/performance.md for what it buys.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

from acme.om.audit import AuditEntry, AuditManagerInterface
from acme.om.context import OpContext

logger = logging.getLogger(__name__)


@runtime_checkable
class AuditBatchAppender(Protocol):
    """The optional part of the host's audit manager (docs/host-contract.md, "Batched audit
    appends"): `append_many(calls)` does what `append(ctx, **fields)` does for each
    `(ctx, fields)` of `calls`, all of one tenant, in one transaction (all recorded or
    none), and returns the entries in the order of `calls`."""

    async def append_many(
        self, calls: Sequence[tuple[OpContext, Mapping[str, Any]]]
    ) -> list[AuditEntry]: ...


@dataclass
class _Append:
    """One `append` waiting for its batch: its context, its fields, and its caller's future."""

    ctx: OpContext
    fields: dict[str, Any]
    done: asyncio.Future[AuditEntry] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class GroupCommitAudit:
    """The host's audit manager with `append` written in batches; everything else (`list_for`,
    and any method a host adds) is the host's own, called through.

    `append` queues the call and, unless a batch is being written, starts the writer; the
    writer takes every queued call, groups them by tenant (`ctx.org_id`) and sends each
    group as one `append_many`. When a group's `append_many` raises, each of its calls is
    made once more on its own through `append`, concurrently, so each caller gets exactly
    the outcome its own call has (an `Invalid` naming its own field, say) and one refused
    entry never fails another (`fallbacks` counts such batches). A return that is not one
    entry per call fails each caller with a `RuntimeError`, and repeats none.
    A call cancelled before its batch was sent is dropped; one sent lands with its batch or
    not at all. A virtual `AuditManagerInterface` (`container.as_audit_manager`).
    """

    def __init__(self, audit: AuditManagerInterface, batches: AuditBatchAppender) -> None:
        self._audit = audit
        self._batches = batches
        self._queued: list[_Append] = []
        self._writer: asyncio.Task[None] | None = None
        self.fallbacks = 0
        """How many batches `append_many` refused (each then written call by call); the
        first is logged as a warning with its traceback, the next ones at INFO."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._audit, name)

    async def append(
        self,
        ctx: OpContext,
        *,
        action: str,
        subject_type: str,
        subject_id: UUID,
        detail: dict[str, Any],
        idempotency_key: str | None = None,
    ) -> AuditEntry:
        """`AuditManagerInterface.append`, written with the other appends of its batch."""
        fields: dict[str, Any] = {
            "action": action,
            "subject_type": subject_type,
            "subject_id": subject_id,
            "detail": detail,
        }
        if idempotency_key is not None:
            fields["idempotency_key"] = idempotency_key
        call = _Append(ctx, fields)
        self._queued.append(call)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_queued(), name="audit-group-commit")
        return await call.done

    async def _write_queued(self) -> None:
        """Write the queued appends until none is left, one `append_many` per tenant. Every
        caller gets an outcome: what `_write` raises fails its batch's callers; a cancelled
        writer (the event loop closing) cancels the callers still waiting."""
        taken: list[_Append] = []
        try:
            while self._queued:
                taken, self._queued = self._queued, []
                tenants: dict[UUID, list[_Append]] = {}
                for call in taken:
                    if not call.done.done():  # its caller gave up before the batch was sent
                        tenants.setdefault(call.ctx.org_id, []).append(call)
                for calls in tenants.values():
                    try:
                        await self._write(calls)
                    except Exception as exc:
                        _fail(calls, RuntimeError(f"the audit batch failed: {exc!r}"))
        finally:
            for call in (*taken, *self._queued):
                if not call.done.done():
                    call.done.cancel()

    async def _write(self, calls: list[_Append]) -> None:
        """One tenant's batch; on failure, each call on its own (see the class docstring)."""
        try:
            entries: object = await self._batches.append_many([(c.ctx, c.fields) for c in calls])
        except Exception as exc:
            self.fallbacks += 1
            log = logger.warning if self.fallbacks == 1 else logger.info
            log(
                "append_many failed for %d audit entries (%s); appending them one by one "
                "(fallback %d of this process)",
                len(calls),
                f"{type(exc).__name__}: {exc}"[:300],
                self.fallbacks,
                exc_info=self.fallbacks == 1,
            )
            await asyncio.gather(*(self._write_one(call) for call in calls))
            return
        if not isinstance(entries, list) or len(entries) != len(calls):
            # Written, perhaps, but not reported as the contract says: fail each caller (its
            # item is retried, the entry's key makes the retry audit once), repeat none.
            got = f"{len(entries)} entries" if isinstance(entries, list) else repr(entries)[:80]
            message = (
                f"append_many returned {got} for {len(calls)} calls "
                "(docs/host-contract.md, Batched audit appends)"
            )
            logger.error("%s", message)
            _fail(calls, RuntimeError(message))
            return
        for call, entry in zip(calls, entries, strict=True):
            if not call.done.done():
                call.done.set_result(entry)

    async def _write_one(self, call: _Append) -> None:
        try:
            entry = await self._audit.append(call.ctx, **call.fields)
        except Exception as exc:
            if not call.done.done():
                call.done.set_exception(exc)
        else:
            if not call.done.done():
                call.done.set_result(entry)


def _fail(calls: list[_Append], error: Exception) -> None:
    """Fail every caller of `calls` still waiting, each with its own copy of `error`."""
    for call in calls:
        if not call.done.done():
            call.done.set_exception(type(error)(*error.args))


AuditManagerInterface.register(GroupCommitAudit)
