"""The tenancy manager's answers for claimed items: asked per context key, at most
`ASKS_AT_ONCE` at a time, an answer that a tenant is live reused for `context_reuse_s`, and
a lane's next key guessed so it can be asked beside the claim (docs/decisions/0016, 0022)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from uuid import UUID

from acme.om.context import OpContext, RequestContext
from acme.om.errors import NotFound
from acme.om.tenancy import TenancyManagerInterface
from acme.om.work.types.work_item import WorkItem

ContextKey = tuple[UUID, UUID, UUID | None]
"""What a claimed item's context is built from: (tenant, enqueuer, causing request)."""

CONTEXT_REUSE_S = 0.25
"""How long (s, from the start of the ask) the tenancy manager's answer that a tenant is
live serves the later claim batches of the same `ContextKey` (the template's
docs/decisions/0022): a tenant gone longer than this has its claimed items dead-lettered,
as every answer that it is gone does at once."""

ASKS_AT_ONCE = 10
"""The most tenancy reads one claim batch runs at the same time (`TenancyAnswers.ask_all`)."""

_ANSWERS_KEPT = 1_000
"""The most tenancy answers kept for reuse (the oldest go first)."""


def context_key(item: WorkItem) -> ContextKey:
    """The key `item`'s context is asked under."""
    return (item.org_id, item.created_by, item.request_id)


class TenancyAnswers:
    """The service contexts `tenancy` builds for claimed items, by `ContextKey`; an answer
    that the tenant is live is kept for `reuse_s` seconds (0: never), one that it is gone
    never is."""

    def __init__(self, tenancy: TenancyManagerInterface, *, reuse_s: float) -> None:
        self._tenancy = tenancy
        self._reuse_s = reuse_s
        # By key: (when asked, time.monotonic(); the context), the oldest first.
        self._answers: dict[ContextKey, tuple[float, OpContext]] = {}
        # Per lane: the key of the last claim batch, and the key to ask for early (beside
        # the next claim) because the last two batches shared it.
        self._last_key: dict[str, ContextKey] = {}
        self._expected_key: dict[str, ContextKey] = {}

    def reusable(self, key: ContextKey, rctx: RequestContext) -> OpContext | None:
        """The answer for `key` asked less than `reuse_s` ago, now (a claim that took long
        does not stretch the window), under the claim's request `rctx`; None when there is
        none."""
        answer = self._answers.get(key)
        if answer is None or answer[0] <= time.monotonic() - self._reuse_s:
            return None
        ctx = answer[1]
        # The host contract's OpContext is a frozen dataclass: the tenancy manager's answer,
        # with the request of the claim it now serves.
        return ctx if ctx.request is rctx else dataclasses.replace(ctx, request=rctx)

    async def ask_all(
        self, rctx: RequestContext, keys: Sequence[ContextKey], *, parallel: int
    ) -> list[OpContext | BaseException | None]:
        """`ask` for each of `keys`, at most `parallel` at a time; each answer, or the
        exception its ask raised, in the order of `keys`. The caller passes at most its
        batch's size (whose handlers have not started, so no running handler's connection
        is taken) and `ASKS_AT_ONCE`."""
        if len(keys) <= 1:
            try:
                return [await self.ask(rctx, key) for key in keys]
            except Exception as exc:
                return [exc]
        gate = asyncio.Semaphore(max(1, min(parallel, len(keys))))

        async def ask(key: ContextKey) -> OpContext | None:
            async with gate:
                return await self.ask(rctx, key)

        return list(await asyncio.gather(*map(ask, keys), return_exceptions=True))

    async def ask(self, rctx: RequestContext, key: ContextKey) -> OpContext | None:
        """The tenancy manager's service context for `key`; None when the tenant is gone.
        Raises what the tenancy manager raises besides `NotFound`."""
        org_id, acting_for, caused_by = key
        asked_at = time.monotonic()
        try:
            ctx = await self._tenancy.service_context(
                rctx, org_id=org_id, acting_for=acting_for, caused_by_request_id=caused_by
            )
        except NotFound:
            self._answers.pop(key, None)
            return None
        if self._reuse_s > 0:
            self._answers.pop(key, None)  # re-inserted last: the dict stays oldest first
            self._answers[key] = (asked_at, ctx)
            if len(self._answers) > _ANSWERS_KEPT:
                del self._answers[next(iter(self._answers))]
        return ctx

    def forget_expired(self) -> None:
        """Drop the answers asked `reuse_s` ago or earlier (the oldest are first)."""
        expired = time.monotonic() - self._reuse_s
        while self._answers:
            key, (asked_at, _) = next(iter(self._answers.items()))
            if asked_at > expired:
                break
            del self._answers[key]

    def expected(self, lane: str) -> ContextKey | None:
        """The key to ask for beside `lane`'s next claim, if any (`expect`)."""
        return self._expected_key.get(lane)

    def expect(self, lane: str, items: Sequence[WorkItem]) -> None:
        """Note the key most of `lane`'s claimed `items` share; ask early next time only
        while batches repeat a key: a workload whose every item comes from another request
        never pays for an early answer it cannot use."""
        keys: dict[ContextKey, int] = {}
        for item in items:
            key = context_key(item)
            keys[key] = keys.get(key, 0) + 1
        key = max(keys, key=keys.__getitem__)
        if self._last_key.get(lane) == key:
            self._expected_key[lane] = key
        else:
            self._expected_key.pop(lane, None)
        self._last_key[lane] = key
