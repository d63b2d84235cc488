"""A lane's pause, the worker roster, and the queue at a glance
(`WorkManagerInterface.queue_summary`)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from acme.om.work.types.work_item import LaneStats


class LanePause(BaseModel):
    """A paused lane: no claim takes its items until it is resumed (docs/decisions/0040).

    `paused_by` is who paused it (the operator's name), `paused_at` when (the database's
    clock), `reason` what they gave, if anything.
    """

    model_config = ConfigDict(frozen=True)

    lane: str
    paused_at: datetime
    paused_by: str
    reason: str | None = None


class WorkerBeat(BaseModel):
    """A worker process's row in the roster (`work_workers`, docs/decisions/0049), as its
    heartbeat writes it: no tenant, a worker serves them all.

    `worker_id` is the process's id (`<host>:<pid>:<random>`, the `claimed_by` of what it
    holds), `worker` its name (the console command), `lane` and `kinds` what it claims.
    `started_at` is its first beat, `beat_at` its latest, `expires_at` when it stops counting
    as alive without another (its beat plus its liveness TTL): all on the database's clock.
    """

    model_config = ConfigDict(frozen=True)

    worker_id: str
    worker: str
    lane: str
    kinds: tuple[str, ...]
    started_at: datetime
    beat_at: datetime
    expires_at: datetime


class WorkerAlive(WorkerBeat):
    """A worker whose roster row has not expired (`WorkerBeat`), with `holding`: the items
    it holds under a live lease (0: idle)."""

    holding: int


class QueueSummary(BaseModel):
    """The queue across every tenant, as an operator reads it at a glance.

    `groups`: counts per lane, kind and status of the rows in play (`LaneStats`: available,
    claimed, and dead letters still owing their audit entry; history is not read), each
    `AVAILABLE` group with its oldest due age in seconds. `paused`: the paused lanes.
    `workers_alive`: the workers whose roster row has not expired (`WorkerAlive`, idle ones
    too), by worker id. `workers_holding`: the workers (`claimed_by`) holding at least one
    item whose lease has not passed, with how many they hold, whether in the roster or not
    (a worker of a release without it, or whose roster writes fail). `read_at`: when the
    summary was read, on the reading process's clock.
    """

    model_config = ConfigDict(frozen=True)

    groups: list[LaneStats]
    paused: list[LanePause]
    workers_alive: list[WorkerAlive]
    workers_holding: dict[str, int]
    read_at: datetime

    def oldest_due_age(self, lane: str | None = None) -> float:
        """The longest wait of a due item, in seconds, on `lane` or on any lane; 0 if none."""
        return max(
            (
                group.oldest_available_age or 0.0
                for group in self.groups
                if lane is None or group.lane == lane
            ),
            default=0.0,
        )
