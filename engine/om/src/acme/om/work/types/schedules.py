"""A schedule's state for one tenant (`work_schedules`), as the API and operators read it."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict


class ScheduleState(BaseModel):
    """A schedule's row for one tenant: `schedule` (`<worker>:<name>`), `tick_at` the latest
    tick a worker handled (enqueued or skipped), `next_tick_at` the tick after it by the
    schedule's cron as that worker read it (None: none in 50 years, or a row written by a
    release that did not record it); all aware UTC (docs/decisions/0034, 0051)."""

    model_config = ConfigDict(frozen=True)

    schedule: str
    tick_at: datetime
    next_tick_at: datetime | None
