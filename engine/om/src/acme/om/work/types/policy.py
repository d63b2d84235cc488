"""The per-kind policy: how often an item may be tried, how long one try may take, its lane
and its default priority."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

PRIORITY_MIN = -10
PRIORITY_MAX = 10
"""The range of an item's `priority` (higher is claimed first; 0, the default, keeps the
order items had before priorities), refused outside it at enqueue."""

PRIORITY_AGING_S = 600
"""The head start one priority level buys (s): within a tenant, a lane and a kind, the
claim orders items by `available_at` minus `priority` times this, so a higher priority goes
first among items due within that many seconds of each other per level, and an item waits
behind no item that became due more than `PRIORITY_MAX - PRIORITY_MIN` levels' worth after
it: aging, so no item starves (docs/decisions/0036). Part of the claim index's definition."""


class KindPolicy(BaseModel):
    """What the queue allows one work kind.

    `max_attempts` is the number of claims an item of the kind may spend (attempts are
    spent at claim); the claim that reaches it is the last, and its failure is final.
    `timeout` is the wall-clock budget of one try in seconds, enforced by the worker
    loop. `lane` is the lane an item of the kind is enqueued into when its caller names
    none (the outbox relay never does), so a kind handled by a worker on another lane
    names that lane here. `priority` is an item's priority when its enqueuer names none
    (every relayed item's), from `PRIORITY_MIN` to `PRIORITY_MAX`.
    """

    model_config = ConfigDict(frozen=True)

    max_attempts: int = Field(default=5, ge=1)
    timeout: float = Field(default=300.0, gt=0)
    lane: str = Field(default="default", min_length=1)
    priority: int = Field(default=0, ge=PRIORITY_MIN, le=PRIORITY_MAX)
