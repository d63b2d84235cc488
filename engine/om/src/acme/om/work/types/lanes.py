"""A lane's pause and the queue at a glance (`WorkManagerInterface.queue_summary`)."""

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


class QueueSummary(BaseModel):
    """The queue across every tenant, as an operator reads it at a glance.

    `groups`: counts per lane, kind and status of the rows in play (`LaneStats`: available,
    claimed, and dead letters still owing their audit entry; history is not read), each
    `AVAILABLE` group with its oldest due age in seconds. `paused`: the paused lanes.
    `workers_holding`: the workers (`claimed_by`) holding at least one item whose lease
    has not passed, with how many they hold; an idle worker holds nothing and is not
    listed (its liveness key is in the cache, which lists no keys). `read_at`: when the
    summary was read, on the reading process's clock.
    """

    model_config = ConfigDict(frozen=True)

    groups: list[LaneStats]
    paused: list[LanePause]
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
