"""The heartbeat: a key under `CacheScope.WORKER_LIVENESS` written and read back on a beat
started every `heartbeat_interval` seconds (start to start), then the worker's row in the
worker roster upserted (docs/decisions/0049).

After `heartbeat_failure_limit` failed beats in a row the loop stops claiming and
`/healthz` answers non-2xx (`LoopState.claiming_paused`); one good beat resumes both. Only
the liveness key decides that: a roster write that fails or outlasts the beat's interval is
counted (`worker_roster_write_failures_total`), logged at the first failure of a streak and
at the recovery, and tried again on the next beat.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence

from acme.infra.cache import CacheInterface, CacheScope
from acme.om.context import AppContext, AppType, RequestContext
from acme.om.work import WorkManagerInterface
from acme.om.work.types.work_item import WorkKind
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.settings import RuntimeSettings
from acme.workers.runtime.state import LOOP_LOGGER, ClaimSignal, LoopState, liveness_key

logger = logging.getLogger(LOOP_LOGGER)


class Heartbeat:
    """Beats for `worker_id` on `cache` and in `work`'s worker roster (as claiming `kinds` on
    the settings' lane); `run()` until cancelled, `beat_once()` once."""

    def __init__(
        self,
        *,
        settings: RuntimeSettings,
        cache: CacheInterface,
        work: WorkManagerInterface,
        metrics: WorkerMetrics,
        worker_id: str,
        kinds: Sequence[WorkKind],
        state: LoopState,
        signal: ClaimSignal,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.worker_id = worker_id
        self.state = state
        self.roster_failures = 0  # roster writes failed in a row
        self._cache = cache
        self._work = work
        self._kinds = list(kinds)
        self._signal = signal
        self._app = AppContext(type=AppType.WORKER, version=settings.app_version)

    async def mark_offline(self) -> None:
        """Delete the liveness key, then the roster row (the drain's last step), each tried
        whatever the other did; raises the first error met (the cache's or the database's)."""
        errors: list[Exception] = []
        try:
            await self._cache.delete(CacheScope.WORKER_LIVENESS, liveness_key(self.worker_id))
        except Exception as exc:
            errors.append(exc)
        try:
            await self._work.drop_worker(RequestContext.new(self._app), self.worker_id)
        except Exception as exc:
            errors.append(exc)
        if errors:
            raise errors[0]

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
            await self.write_roster(interval - (time.monotonic() - started))
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def write_roster(self, bound_s: float) -> bool:
        """Upsert this worker's roster row, alive for `liveness_ttl` seconds, within `bound_s`
        seconds (what the beat's interval has left; none left is a failed write). Returns
        whether it landed. Never raises: a failure is counted and logged, and the next beat
        writes again (docs/decisions/0049)."""
        try:
            if bound_s <= 0:
                raise TimeoutError("the liveness beat used the whole interval")
            async with asyncio.timeout(bound_s):
                await self._work.beat_worker(
                    RequestContext.new(self._app),
                    self.worker_id,
                    worker=self.settings.service_name,
                    lane=self.settings.lane,
                    kinds=self._kinds,
                    ttl_s=self.settings.liveness_ttl,
                )
        except Exception as exc:
            self.roster_failures += 1
            self.metrics.roster_write_failures.inc()
            if self.roster_failures == 1:
                cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                logger.warning(
                    "worker roster write failed (%s); the liveness beat stands, retried each beat",
                    cause[:300],
                )
            return False
        if self.roster_failures:
            logger.info(
                "worker roster written again after %d failed write(s)", self.roster_failures
            )
            self.roster_failures = 0
        return True

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
