"""A database outage as the worker loop and its sweep see it: when it began, what was said.

The claim, the completion flush and each sweep step report a failed database call here;
a transient one (`errors.transient_database_error`) is an outage, waited out until
`database_outage_limit` seconds, then the loop is stopped (docs/decisions/0025).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from acme.workers.runtime.errors import one_line, transient_database_error
from acme.workers.runtime.settings import RuntimeSettings
from acme.workers.runtime.state import LoopState

logger = logging.getLogger("acme.workers.runtime.loop")

_OUTAGE_REMINDER_S = 60.0  # seconds between two "still waiting for the database" lines


class DatabaseOutage:
    """Tracks one outage in `state.database_down_since`; `outage` says why the loop stopped.

    `stop` is called once, when the outage passes `database_outage_limit` (the loop sets
    it to its own `stop`).
    """

    def __init__(self, settings: RuntimeSettings, state: LoopState) -> None:
        self.settings = settings
        self.state = state
        self.stop: Callable[[], None] = lambda: None
        self.outage: str | None = None
        """Why the loop stopped itself: a database outage past `database_outage_limit`."""
        self._said = 0.0  # when the last line about the outage was written

    def failed(self, exc: BaseException, where: str, began: float) -> bool:
        """Whether `exc`, raised by `where` (the claim, a sweep step) in a call that began
        at `began` (`time.monotonic()`), is a database outage; False for any other error,
        which the caller logs.

        An outage runs from when its first failing call began. Its first error writes one
        line saying what the loop waits for, one more follows every `_OUTAGE_REMINDER_S`;
        past `database_outage_limit` seconds `stop` is called, `outage` saying why, and
        `serve` exits 1 (docs/operations.md, "Outages", in the worker template).
        """
        if not transient_database_error(exc):
            return False
        now = time.monotonic()
        limit = self.settings.database_outage_limit
        setting = f"{self.settings.env_prefix()}DATABASE_OUTAGE_LIMIT"
        since = self.state.database_down_since
        if since is None or began < since:
            first = since is None
            self.state.database_down_since = since = min(began, now)
            if first:
                self._said = now
        else:
            first = False
        if now - since >= limit:
            if self.outage is None:
                self.outage = (
                    f"the database was unavailable for {now - since:.0f} s, past {setting} "
                    f"({limit:g} s); last error: {one_line(exc)}"
                )
                logger.error("%s: stopping", self.outage)
                self.stop()
            return True
        if first:
            logger.warning(
                "the database is unavailable (%s, in the %s): waiting for it; claims and "
                "sweeps retry, and the worker exits after %g s of it (%s)",
                one_line(exc),
                where,
                limit,
                setting,
            )
        elif now - self._said >= _OUTAGE_REMINDER_S:
            self._said = now
            logger.warning(
                "still waiting for the database after %.0f s (%s); the worker exits at %g s (%s)",
                now - since,
                one_line(exc),
                limit,
                setting,
            )
        return True

    def answered(self) -> None:
        """A database call succeeded: an outage in progress is over (one line says so)."""
        since = self.state.database_down_since
        if since is not None:
            self.state.database_down_since = None
            logger.info("the database answers again after %.1f s", time.monotonic() - since)
