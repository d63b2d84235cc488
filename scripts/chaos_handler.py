"""The handler `make chaos` writes over the rendered `handler.py` (as a user editing their
handler would): it records every execution in a ledger and advances one record per item.

Each execution, on its own asyncpg pool to the harness's database (`CHAOS_LEDGER_URL`, a
role the fault `pg_terminate_backend` leaves alone), in this order:

1. appends `(item_id, claim_token, attempt, pid, started_at)` to `chaos_ledger`: a plain
   INSERT, no compare-and-set, so the ledger sees every execution the queue started;
2. by the payload's `note`: `poison` raises (every attempt, so the item is dead-lettered by
   design); `block` on the item's first attempt blocks the event loop for
   `CHAOS_BLOCK_S` seconds with `time.sleep` (longer than the lease: the fault "a handler
   that blocks its loop");
3. waits `CHAOS_WORK_S` seconds (the handler's I/O);
4. advances the item's record by a compare-and-set on its `version`: `version` 0 to 1, so a
   second execution of the same item changes nothing (the pattern workers/runtime/README.md
   gives under "Writing a handler");
5. stamps `ended_at` on its ledger row.

The harness reads the ledger, the records and the queue table once the run is over.
"""

from __future__ import annotations

import asyncio
import os
import time
from uuid import UUID

import asyncpg
from acme.om.audit import AuditManagerInterface
from acme.om.context import OpContext
from acme.om.work.types.handler import WorkHandlerInterface
from acme.om.work.types.work_item import WorkItem


class NotifyShipmentHandlerImpl(WorkHandlerInterface):
    """The chaos harness's handler: ledger row, scripted fault, record CAS, ledger end."""

    def __init__(self, *, audit: AuditManagerInterface) -> None:
        self._audit = audit
        self._url = os.environ["CHAOS_LEDGER_URL"]
        self._work_s = float(os.environ.get("CHAOS_WORK_S", "0.01"))
        self._block_s = float(os.environ.get("CHAOS_BLOCK_S", "0"))
        self._pool: asyncpg.Pool | None = None
        self._opening = asyncio.Lock()

    async def _ledger(self) -> asyncpg.Pool:
        """The ledger pool, opened on first use (the worker builds handlers before its loop)."""
        async with self._opening:
            if self._pool is None:
                self._pool = await asyncpg.create_pool(
                    self._url, min_size=1, max_size=4, command_timeout=5
                )
        return self._pool

    async def handle(self, ctx: OpContext, item: WorkItem) -> None:
        """Run one execution of `item` (steps above); raises to fail the attempt."""
        pool = await self._ledger()
        note = str(item.payload.get("note", ""))
        record_id = UUID(str(item.payload["record_id"]))
        execution = await pool.fetchval(
            "INSERT INTO chaos_ledger (item_id, claim_token, attempt, pid, started_at) "
            "VALUES ($1, $2, $3, $4, to_timestamp($5)) RETURNING id",
            item.id,
            item.claim_token,
            item.attempts,
            os.getpid(),
            time.time(),
        )
        if note == "poison":
            raise RuntimeError("poison item: fails every attempt by design")
        if note == "block" and item.attempts == 1 and self._block_s > 0:
            time.sleep(self._block_s)  # noqa: ASYNC251 - the fault: the whole event loop stops
        await asyncio.sleep(self._work_s)
        await pool.execute(
            "UPDATE chaos_records SET version = version + 1, advanced_by = $2, "
            "advanced_at = clock_timestamp() WHERE id = $1 AND version = 0",
            record_id,
            item.claim_token,
        )
        await pool.execute(
            "UPDATE chaos_ledger SET ended_at = to_timestamp($2) WHERE id = $1",
            execution,
            time.time(),
        )
