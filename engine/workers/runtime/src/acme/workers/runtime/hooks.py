"""`ItemHooks`: what a worker adds around each of its items without editing the engine.

The loop (`loop.py`, which re-exports both names) runs them in each item's task.
"""

from __future__ import annotations

from acme.om.context import OpContext
from acme.om.work.types.work_item import WorkItem


class ItemHooks:
    """What a worker adds around each of its items without editing the engine: subclass it,
    override what you need, and pass an instance as the worker's `hooks` (its `loop.py`).

    Every hook is a coroutine run in the item's own task, under the item's span and its
    context. `before_item` runs inside the kind's timeout, just before the handler: raising
    there fails the attempt as a handler's exception does (retried with backoff). The
    others run after the fact and never change the outcome: an exception they raise is
    logged with its traceback and counted (`worker_hook_failures_total{hook}`), then
    dropped. `after_item` follows the handler (`error` is what it raised, None when it
    returned), before the completion or failure is written; `on_dead_letter` follows the
    write that made the item a dead letter (its attempts are spent).
    """

    async def before_item(self, ctx: OpContext, item: WorkItem) -> None:
        """Before the handler runs `item` (a claimed item, its attempt already counted)."""

    async def after_item(self, ctx: OpContext, item: WorkItem, error: Exception | None) -> None:
        """After the handler ran `item`; `error` is what it raised, or None."""

    async def on_dead_letter(self, ctx: OpContext, item: WorkItem) -> None:
        """After `item` became a dead letter (`FAILED`, its attempts spent)."""


NO_HOOKS = ItemHooks()
"""The hooks of a worker that adds nothing around its items."""
