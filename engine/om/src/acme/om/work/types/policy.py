"""The per-kind policy: how often an item may be tried, how long one try may take, its lane."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class KindPolicy(BaseModel):
    """What the queue allows one work kind.

    `max_attempts` is the number of claims an item of the kind may spend (attempts are
    spent at claim); the claim that reaches it is the last, and its failure is final.
    `timeout` is the wall-clock budget of one try in seconds, enforced by the worker
    loop. `lane` is the lane an item of the kind is enqueued into when its caller names
    none (the outbox relay never does), so a kind handled by a worker on another lane
    names that lane here.
    """

    model_config = ConfigDict(frozen=True)

    max_attempts: int = Field(default=5, ge=1)
    timeout: float = Field(default=300.0, gt=0)
    lane: str = Field(default="default", min_length=1)
