"""The heartbeat: a key under `CacheScope.WORKER_LIVENESS` written and read back on a beat
started every `heartbeat_interval` seconds (start to start).

After `heartbeat_failure_limit` failed beats in a row the loop stops claiming and
`/healthz` answers non-2xx (`LoopState.claiming_paused`); one good beat resumes both.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from acme.infra.cache import CacheInterface, CacheScope
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.settings import RuntimeSettings
from acme.workers.runtime.state import LOOP_LOGGER, ClaimSignal, LoopState, liveness_key

logger = logging.getLogger(LOOP_LOGGER)


class Heartbeat:
    """Beats for `worker_id` on `cache`; `run()` until cancelled, `beat_once()` once."""

    def __init__(
        self,
        *,
        settings: RuntimeSettings,
        cache: CacheInterface,
        metrics: WorkerMetrics,
        worker_id: str,
        state: LoopState,
        signal: ClaimSignal,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.worker_id = worker_id
        self.state = state
        self._cache = cache
        self._signal = signal

    async def mark_offline(self) -> None:
        """Delete the liveness key (the drain's last step); raises what the cache raises."""
        await self._cache.delete(CacheScope.WORKER_LIVENESS, liveness_key(self.worker_id))

    async def _write_liveness(self, key: str, value: str) -> None:
        """Write `value` under the liveness `key` and read it back; raises `LookupError` when
        what comes back differs (the write was lost or evicted), or what the cache raises."""
        await self._cache.set(
            CacheScope.WORKER_LIVENESS, key, value, ttl=self.settings.liveness_ttl
        )
        seen = await self._cache.get(CacheScope.WORKER_LIVENESS, key)
        if seen != value:
            raise LookupError("the liveness key read back differs from the one written")

    async def run(self) -> None:
        """Start a beat every `heartbeat_interval` seconds, start to start.

        A beat is cut off at the interval, so one that hangs (Redis unreachable) is followed
        at once by the next: after Redis returns, a good beat comes within one interval.
        """
        interval = self.settings.heartbeat_interval
        while True:
            started = time.monotonic()
            await self.beat_once()
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def beat_once(self) -> bool:
        """Write the liveness key and read it back; a miss or an error is a failed beat.

        A beat that raises is tried once more at once, within the same bound: after a Redis
        restart the first use of each connection pooled before it fails (it was open to the
        old server), so one retry on the pool's next connection tells a stale connection
        from a Redis still down, and `/healthz` returns within one interval of Redis.

        Returns whether the beat succeeded and updates `state`: claiming pauses after
        `heartbeat_failure_limit` failures in a row and resumes on the next good beat.
        """
        self.metrics.event_loop_tasks.set(len(asyncio.all_tasks()))
        key = liveness_key(self.worker_id)
        value = uuid.uuid4().hex
        bound = self.settings.heartbeat_interval
        try:
            async with asyncio.timeout(bound):
                try:
                    await self._write_liveness(key, value)
                except Exception:
                    await self._write_liveness(key, value)
        except Exception as exc:
            was_paused = self.state.claiming_paused
            self.state.heartbeat_failures += 1
            self.metrics.heartbeat_failures.inc()
            cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            logger.warning(
                "heartbeat failed (%s), %d in a row",
                cause[:300],
                self.state.heartbeat_failures,
            )
            if self.state.claiming_paused and not was_paused:
                logger.error(
                    "heartbeat failed %d times: claiming paused", self.state.heartbeat_failures
                )
            return False
        if self.state.claiming_paused:
            logger.info("heartbeat recovered: claiming resumed")
            self._signal.woken()
        self.state.heartbeat_failures = 0
        self.state.beats += 1
        return True
