"""Dead letters' audit entries: the row that fails for good records the entry it owes
(`OwedAudit`), the entry is appended once, then the debt is settled (docs/decisions/0014).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from acme.om.audit import AuditManagerInterface
from acme.om.context import OpContext
from acme.om.work.metrics import WorkMetrics
from acme.om.work.storage import OwedAudit, WorkStorageInterface
from acme.om.work.types.work_item import WorkItem

logger = logging.getLogger(__name__)

SUBJECT_TYPE = "work_item"
"""The `subject_type` of every audit entry about a work item."""

DEAD_LETTERED = "work.dead_lettered"
"""The audit action of a dead letter: one entry per dead letter, keyed by `OwedAudit.key`."""


class DeadLetterAudits:
    """The `work.dead_lettered` entries dead letters owe, written to `audit` and settled in
    `storage`. The entry and the row live in two roles, so they share no transaction: the
    entry is appended under an idempotency key (the item and its claim), or, when the
    host's `append` takes none (optional in docs/host-contract.md), after looking for it by
    its `claim_token` detail, which two writers racing can both miss."""

    def __init__(
        self, storage: WorkStorageInterface, audit: AuditManagerInterface, metrics: WorkMetrics
    ) -> None:
        self._storage = storage
        self._audit = audit
        self._metrics = metrics
        self._keyed = _takes_keyword(audit.append, "idempotency_key")

    async def dead_letter(self, ctx: OpContext, owed: OwedAudit) -> None:
        """A dead letter is the failed row (written, owing its entry), its count and its
        audit entry (`write_now`)."""
        self._metrics.dead_letters.labels(kind=owed.kind, reason=owed.reason).inc()
        await self.write_now(ctx, [owed.id], known=[owed])

    async def write_now(
        self, ctx: OpContext, item_ids: Sequence[UUID], *, known: Sequence[OwedAudit] = ()
    ) -> None:
        """Write the entries the dead letters `item_ids` of `ctx`'s tenant owe (`known`
        debts as given, the others read first). What cannot be written now is logged and
        left owed: the sweep's `audit_dead_letters` writes it, and the failure it follows
        stands."""
        debts = list(known)
        given = {debt.id for debt in known}
        unread = [item_id for item_id in item_ids if item_id not in given]
        try:
            if unread:
                debts += await self._storage.owed_audits(
                    ctx.org_id, limit=len(unread), item_ids=unread
                )
            for debt in debts:
                await self.write(ctx, debt)
        except Exception as exc:
            logger.warning(
                "work item(s) %s: a dead letter whose audit entry is not written yet (%s); "
                "the sweep writes it",
                ", ".join(str(item_id) for item_id in item_ids),
                type(exc).__name__,
            )

    async def write(self, ctx: OpContext, owed: OwedAudit) -> bool:
        """Append the `work.dead_lettered` entry `owed` stands for, once, then settle the
        debt; True when this call settled it. Raises what the audit or the storage raise
        (the debt then stays, and a later call writes the same entry)."""
        detail = {
            "kind": owed.kind,
            "lane": owed.lane,
            "attempts": owed.attempts,
            "reason": owed.reason,
            "last_error": owed.last_error,
            "claim_token": str(owed.token),
        }
        if self._keyed:
            # Passed by name from a mapping: a host whose `append` has no such parameter
            # still type-checks (and takes the other branch).
            keyed: dict[str, Any] = {"idempotency_key": owed.key}
            await self._audit.append(
                ctx,
                action=DEAD_LETTERED,
                subject_type=SUBJECT_TYPE,
                subject_id=owed.id,
                detail=detail,
                **keyed,
            )
        elif not await self._has_entry(ctx, owed):
            await self._audit.append(
                ctx,
                action=DEAD_LETTERED,
                subject_type=SUBJECT_TYPE,
                subject_id=owed.id,
                detail=detail,
            )
        return await self._storage.settle_audit(owed.org_id, owed.id, owed.token)

    async def settle(self, ctx: OpContext, item_id: UUID) -> None:
        """Write the entry the item still owes before an operator write moves it on (a
        replayed item can die again, under a new debt); raises when it cannot."""
        for owed in await self._storage.owed_audits(ctx.org_id, limit=1, item_ids=[item_id]):
            await self.write(ctx, owed)

    async def _has_entry(self, ctx: OpContext, owed: OwedAudit) -> bool:
        """Whether the item already has the dead-letter entry of `owed` (by its token)."""
        entries = await self._audit.list_for(ctx, SUBJECT_TYPE, owed.id)
        return any(
            entry.action == DEAD_LETTERED and entry.detail.get("claim_token") == str(owed.token)
            for entry in entries
        )


def owed_audit(item: WorkItem, token: UUID, reason: str) -> OwedAudit:
    """The audit entry `item`, just failed for good under `token`, owes."""
    return OwedAudit(
        id=item.id,
        org_id=item.org_id,
        kind=item.kind.value,
        lane=item.lane,
        attempts=item.attempts,
        last_error=item.last_error,
        reason=reason,
        token=token,
    )


def _takes_keyword(method: Any, name: str) -> bool:
    """Whether `method` accepts the keyword argument `name` (or any keyword)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == name and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        or p.kind is p.VAR_KEYWORD
        for p in parameters
    )
