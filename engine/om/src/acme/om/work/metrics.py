"""The queue's Prometheus counters; the worker serves the default registry on `/metrics`."""

from __future__ import annotations

from functools import cache

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge


class WorkMetrics:
    """The work manager's counters and gauges; each one's help text says what it counts
    (docs/operations.md, "Metrics"). The gauges (`dead_letters_unaudited`, the oldest
    snapshot's `oldest_snapshot_xid_age` and `oldest_snapshot_age`, `lane_paused`) are set by
    each `queue_stats` pass; a dead letter's `reason` is `attempts`, `lease`, `tenant`,
    `unreadable` or `handler`. One set per registry (a second raises `ValueError`);
    `default_metrics()` is the process-wide one.
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.enqueued = Counter(
            "work_items_enqueued", "Work items inserted by an enqueue.", ["kind"], registry=registry
        )
        self.claimed = Counter(
            "work_items_claimed", "Work items claimed by a worker.", ["kind"], registry=registry
        )
        self.completed = Counter(
            "work_items_completed", "Work items completed.", ["kind"], registry=registry
        )
        self.retried = Counter(
            "work_items_retried",
            "Failed tries handed back with a backoff.",
            ["kind"],
            registry=registry,
        )
        self.requeued_stale = Counter(
            "work_items_requeued_stale",
            "Work items the sweep handed back after their lease passed.",
            ["kind"],
            registry=registry,
        )
        self.dead_letters = Counter(
            "work_dead_letters",
            "Work items failed for good (dead letters).",
            ["kind", "reason"],
            registry=registry,
        )
        self.fencing_conflicts = Counter(
            "work_fencing_conflicts",
            "Writes refused because the claim token no longer matched.",
            ["operation"],
            registry=registry,
        )
        self.cancelled = Counter(
            "work_items_cancelled",
            "Work items an operator cancelled, by the status they were cancelled from.",
            ["kind", "was"],
            registry=registry,
        )
        self.dead_letters_unaudited = Gauge(
            "work_dead_letters_unaudited",
            "Dead letters whose audit entry is not written yet (refreshed by each sweep).",
            ["kind"],
            registry=registry,
        )
        self.oldest_snapshot_xid_age = Gauge(
            "work_queue_oldest_snapshot_xid_age",
            "Transaction ids since the oldest snapshot another session of the queue's "
            "database holds was taken: what vacuum of work_items must keep (PostgreSQL only; "
            "refreshed by each sweep).",
            ["database"],
            registry=registry,
        )
        self.oldest_snapshot_age = Gauge(
            "work_queue_oldest_snapshot_age_seconds",
            "Seconds this process has seen the oldest snapshot another session of the queue's "
            "database holds kept unchanged, from its first sighting (PostgreSQL only; "
            "refreshed by each sweep).",
            ["database"],
            registry=registry,
        )
        self.lane_paused = Gauge(
            "work_lane_paused",
            "1 while the lane is paused (no claim takes its items), 0 once resumed "
            "(refreshed by each sweep and by this process's pause and resume).",
            ["lane"],
            registry=registry,
        )


@cache
def default_metrics() -> WorkMetrics:
    """The process-wide counters on prometheus-client's default registry."""
    return WorkMetrics()
