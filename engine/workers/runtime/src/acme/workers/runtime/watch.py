"""The event-loop watch: says when the worker's event loop was blocked.

A handler or hook that calls blocking code (`time.sleep`, a synchronous client) stops every
claim, lease renewal and heartbeat of the process while it runs, and what the loop sees
afterwards looks like a database that did not answer. `EventLoopWatch` wakes every
`_PROBE_S` seconds and logs one WARNING for each wake-up that comes `_BLOCKED_S` or more
late, before the timeouts the block caused are reported.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from acme.workers.runtime.state import LOOP_LOGGER

logger = logging.getLogger(LOOP_LOGGER)

_PROBE_S = 0.25  # seconds between the watch's wake-ups
_BLOCKED_S = 1.0  # seconds late past which the loop counts as blocked


class EventLoopWatch:
    """`run()` until cancelled; `clock` is a monotonic clock in seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock

    async def run(self) -> None:
        while True:
            began = self._clock()
            await asyncio.sleep(_PROBE_S)
            late_s = self._clock() - began - _PROBE_S
            if late_s >= _BLOCKED_S:
                logger.warning(
                    "the event loop was blocked for %.1f s: a handler or hook ran blocking "
                    "code (time.sleep, a synchronous client); run it with asyncio.to_thread. "
                    "Claims, lease renewals and the heartbeat waited as long",
                    late_s,
                )
