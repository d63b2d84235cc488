"""`WORK_AVAILABLE` published off the enqueue's path, coalesced per lane and kind
(docs/decisions/0022, 0023)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from acme.infra.topics import (
    Topics,
    TopicsInterface,
    TopicsUnavailable,
    WorkAvailablePayload,
)

logger = logging.getLogger(__name__)

WAKE_UP_COALESCE_S = 0.005
"""After publishing `WORK_AVAILABLE` the publisher waits this long (s) before it publishes
the wake-ups owed meanwhile (`WakeUpPublisher.owe`): an enqueue after a quiet spell is
published at once, and a stream of enqueues sends at most one message per lane and kind per
window, not one per enqueue (each costs a round trip of the topic's CPU in the enqueuing
process)."""


class WakeUpPublisher:
    """Publishes the `WORK_AVAILABLE` owed for committed rows on `topics`, one task at a
    time, then waits `coalesce_s` seconds and publishes what was owed meanwhile."""

    def __init__(self, topics: TopicsInterface, *, coalesce_s: float) -> None:
        self._topics = topics
        self._coalesce_s = coalesce_s
        # The (lane, kind) pairs whose WORK_AVAILABLE is owed, and the task publishing them.
        self._owed: dict[tuple[str, str], None] = {}
        self._publishing: asyncio.Task[None] | None = None

    def owe(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Publish `WORK_AVAILABLE` for each (lane, kind) of `pairs`, whose rows are
        committed, without the caller waiting on the topic's round trip: at once after a
        quiet spell, else when the window ends. A wake-up owed when the process stops is
        lost: a worker on PostgreSQL wakes on the insert's NOTIFY anyway, one on Redis at
        its next poll (a lost wake-up costs one poll interval, never an item)."""
        self._owed.update(dict.fromkeys(pairs))
        if not self._owed:
            return
        loop = asyncio.get_running_loop()
        task = self._publishing
        if task is None or task.done() or task.get_loop() is not loop:
            self._publishing = loop.create_task(self._publish_owed())

    async def published(self) -> None:
        """Wait until what is owed is published (`WorkManagerInterface.publish_owed_wake_ups`)."""
        while self._publishing is not None and not self._publishing.done():
            if self._publishing.get_loop() is not asyncio.get_running_loop():
                return  # a task of a loop gone: what it owed is published by the next `owe`
            await asyncio.shield(self._publishing)

    async def _publish_owed(self) -> None:
        """`owe`'s task: publish every owed pair, wait out the coalescing window, and again,
        until a window passes with none owed."""
        while self._owed:
            owed, self._owed = list(self._owed), {}
            for lane, kind in owed:
                try:
                    await self._publish(lane, kind)
                except Exception:
                    logger.exception("WORK_AVAILABLE not published for %s/%s", lane, kind)
            if self._coalesce_s > 0:
                await asyncio.sleep(self._coalesce_s)

    async def _publish(self, lane: str, kind: str) -> None:
        """Wake the workers of `lane`; a lost wake-up costs one poll interval, never an item."""
        try:
            await self._topics.publish(
                Topics.WORK_AVAILABLE, WorkAvailablePayload(lane=lane, kind=kind)
            )
        except TopicsUnavailable:
            logger.warning("WORK_AVAILABLE not published for %s/%s; workers will poll", lane, kind)
