"""The handler every worker implements for the kinds it runs."""

from __future__ import annotations

from abc import ABC, abstractmethod

from acme.om.context import OpContext
from acme.om.work.types.work_item import WorkItem


class WorkHandlerInterface(ABC):
    """Runs one claimed work item.

    The loop passes the `OpContext` the claim returned; a handler never builds one. A
    handler may run twice for one item (a lease lost mid-run, a crash before completion),
    so a write to the record it advances is a compare-and-set on the record's `version`:
    the claim token fences the queue row, never the record.
    """

    @abstractmethod
    async def handle(self, ctx: OpContext, item: WorkItem) -> None:
        """Do the work of `item` under `ctx`; raise to have the item failed and retried."""
