"""The queue's Prometheus counters; the worker serves the default registry on `/metrics`."""

from __future__ import annotations

from functools import cache

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge


class WorkMetrics:
    """Counters the work manager moves, labelled by kind (and by reason or operation).

    `dead_letters` counts every item failed for good, with `reason` `attempts` (the last
    attempt failed), `lease` (the sweep found it out of attempts), `tenant` (its tenant
    is gone), `unreadable` (a claimed row the model refuses) or `handler` (its handler's
    `PermanentFailure`); `fencing_conflicts` counts writes refused because the claim token
    no longer matched, by `operation` (never a write refused by a cancel); `cancelled`
    counts operators' cancels, by the status cancelled from (`was`: `available`, `claimed`).
    `dead_letters_unaudited` is a gauge: the dead letters, across tenants, whose audit entry
    is not written yet, as the last `queue_stats` counted them (each sweep pass);
    `oldest_snapshot_xid_age` is a gauge too: in transaction ids, how far the oldest snapshot
    another session of the `database` holds lags behind, as the last `queue_stats` read it
    (PostgreSQL only), and `oldest_snapshot_age` how long, in seconds, this process has seen
    that same snapshot held (from its first sighting); `lane_paused` is 1 for each paused
    lane, 0 once resumed, as the last `queue_stats` read them. One set per registry (a
    second raises `ValueError`); `default_metrics()` is the process-wide one.
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
