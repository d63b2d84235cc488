"""The worker's Prometheus metrics, served on `/metrics` by `server.py`.

Every metric lives on one `CollectorRegistry` the caller owns (a fresh one per test, the
process registry in production), so two loops in one process never collide. Durations are
histograms in seconds; counters carry the item's `kind`, gauges the queue `lane` (and the
kind, for the oldest available age); the wake-up metrics carry the `channel`. The
`worker_outbox_*` gauges carry no label and are registered only by `outbox_gauges()`, which
the loop calls for a host whose outbox relay reports its state (`loop.OutboxStatsReader`):
a host without it exports none of them.
The template's docs/operations.md, "Metrics", lists every series and the alerts on them.
Names start with `worker_`: the work manager's own counters (`work_*`, on the default
registry) count the queue's side of the same events.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0)
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_RENEWAL_GAP_BUCKETS = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    15.0,
    20.0,
    30.0,
    60.0,
    120.0,
    300.0,
)

WAKE_UP_CHANNELS = ("topic", "database")
"""The `channel` label of the wake-up metrics: `topic` is the host's `WORK_AVAILABLE` topic
(Redis pub/sub in production), `database` the PostgreSQL `LISTEN` on the queue's own
NOTIFY channel."""


@dataclass(frozen=True)
class OutboxGauges:
    """The outbox's state as the host's relay reported it at the last sweep (all tenants).

    `pending` rows not relayed (dead letters excluded), `oldest_pending_age` in seconds,
    `failing`: pending rows whose relay failed at least `loop.OUTBOX_FAILING_AFTER` times,
    `dead_letters`: rows the relay gave up on.
    """

    pending: Gauge
    oldest_pending_age: Gauge
    failing: Gauge
    dead_letters: Gauge


class WorkerMetrics:
    """Counters, gauges and histograms of one worker process, registered on `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._outbox: OutboxGauges | None = None
        self.claimed = Counter(
            "worker_items_claimed", "Items claimed by this worker", ["kind"], registry=registry
        )
        self.completed = Counter(
            "worker_items_completed", "Items handled and completed", ["kind"], registry=registry
        )
        self.failed = Counter(
            "worker_items_failed",
            "Attempts that failed and were requeued with backoff",
            ["kind"],
            registry=registry,
        )
        self.dead_lettered = Counter(
            "worker_items_dead_lettered",
            "Attempts that failed at max_attempts, or whose handler raised PermanentFailure: "
            "the item is a dead letter",
            ["kind"],
            registry=registry,
        )
        self.cancelled = Counter(
            "worker_items_cancelled",
            "Items an operator cancelled while this worker held them: the handler was "
            "cancelled or its outcome refused (never a fencing conflict nor a lost lease)",
            ["kind"],
            registry=registry,
        )
        self.snoozed = Counter(
            "worker_items_snoozed",
            "Items whose handler raised Snooze: handed back for later, the attempt given back",
            ["kind"],
            registry=registry,
        )
        self.hook_failures = Counter(
            "worker_hook_failures",
            "A worker's after-the-fact item hook (after_item, on_dead_letter) that raised",
            ["hook"],
            registry=registry,
        )
        self.ticks_enqueued = Counter(
            "worker_schedule_ticks_enqueued",
            "Schedule ticks this process enqueued (a catch-up included), per schedule",
            ["schedule"],
            registry=registry,
        )
        self.ticks_missed = Counter(
            "worker_schedule_ticks_missed",
            "Schedule ticks passed over while no worker ran, or late past the catch-up horizon",
            ["schedule"],
            registry=registry,
        )
        self.released = Counter(
            "worker_items_released",
            "Items handed back to the queue without spending an attempt",
            ["kind", "reason"],
            registry=registry,
        )
        self.leases_lost = Counter(
            "worker_leases_lost",
            "Items whose lease this worker lost (refused renewal or half the lease unrenewed)",
            ["kind", "reason"],
            registry=registry,
        )
        self.renewals = Counter(
            "worker_lease_renewals",
            "Lease renewals that succeeded",
            ["kind"],
            registry=registry,
        )
        self.renewal_gap = Histogram(
            "worker_lease_renewal_gap_seconds",
            "Time between two successful renewals of one lease (the first from the handler's "
            "start), seconds; the worker fences itself once it reaches half the lease",
            ["kind"],
            buckets=_RENEWAL_GAP_BUCKETS,
            registry=registry,
        )
        self.renewals_failed = Counter(
            "worker_lease_renewals_failed",
            "Lease renewals that failed or timed out (retried until half the lease passed)",
            ["kind"],
            registry=registry,
        )
        self.claim_failures = Counter(
            "worker_claim_failures",
            "Claims that raised (retried after the poll interval)",
            registry=registry,
        )
        self.completions_failed = Counter(
            "worker_completions_failed",
            "Completions that could not be written (the item stays claimed until the sweep "
            "hands it back after its lease)",
            ["kind"],
            registry=registry,
        )
        self.unwritten_recovered = Counter(
            "worker_unwritten_recovered",
            "Items whose final write this worker could not make (reason: completion_failed, "
            "failure_unrecorded) that a sweep later handed back after their lease",
            ["kind", "reason"],
            registry=registry,
        )
        self.wake_up_channel_up = Gauge(
            "worker_wake_up_channel_up",
            "1 while the loop is subscribed to its wake-up channel, 0 while it resubscribes",
            ["channel"],
            registry=registry,
        )
        self.wake_up_resubscriptions = Counter(
            "worker_wake_up_resubscriptions",
            "Wake-up subscriptions re-established after a loss (or a failed first try)",
            ["channel"],
            registry=registry,
        )
        self.heartbeat_failures = Counter(
            "worker_heartbeat_failures",
            "Liveness beats that failed or read back wrong",
            registry=registry,
        )
        self.roster_write_failures = Counter(
            "worker_roster_write_failures",
            "Beats whose worker-roster row was not written (the liveness beat stands)",
            registry=registry,
        )
        self.sweep_moved = Counter(
            "worker_sweep_moved",
            "Rows the maintenance sweep moved, per step",
            ["step"],
            registry=registry,
        )
        self.sweep_errors = Counter(
            "worker_sweep_errors", "Sweep steps that raised, per step", ["step"], registry=registry
        )
        self.in_flight = Gauge(
            "worker_items_in_flight", "Items this worker is handling now", registry=registry
        )
        self.event_loop_tasks = Gauge(
            "worker_event_loop_tasks",
            "asyncio tasks alive in the worker's event loop at the last heartbeat (a count "
            "that only grows is a leak)",
            registry=registry,
        )
        self.claiming = Gauge(
            "worker_claiming",
            "1 while the loop claims, 0 while paused or draining",
            registry=registry,
        )
        self.queue_depth = Gauge(
            "worker_queue_depth", "Available items per lane", ["lane"], registry=registry
        )
        self.queue_oldest_available_age = Gauge(
            "worker_queue_oldest_available_age_seconds",
            "Seconds the oldest due available item has waited, per lane and kind, measured on "
            "the database clock at the last sweep (0 when nothing is due)",
            ["lane", "kind"],
            registry=registry,
        )
        self.handle_duration = Histogram(
            "worker_handle_duration_seconds",
            "Time a handler ran, seconds",
            ["kind"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.claim_to_start = Histogram(
            "worker_claim_to_start_seconds",
            "Time from the claim returning to the handler starting, seconds",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )

    def outbox_gauges(self) -> OutboxGauges:
        """The `worker_outbox_*` gauges, registered on the first call; later calls return the
        same ones. The loop calls it once it has read the outbox's state, so a host whose
        relay does not report it exports none of them."""
        if self._outbox is None:
            registry = self.registry
            pending = Gauge(
                "worker_outbox_pending",
                "Outbox rows not relayed yet, across tenants (dead letters excluded), at the last "
                "sweep",
                registry=registry,
            )
            oldest_pending_age = Gauge(
                "worker_outbox_oldest_pending_age_seconds",
                "Seconds since the oldest pending outbox row was written, on the storage's clock, "
                "at the last sweep (0 when none is pending)",
                registry=registry,
            )
            failing = Gauge(
                "worker_outbox_failing",
                "Pending outbox rows whose relay failed at least OUTBOX_FAILING_AFTER times",
                registry=registry,
            )
            dead_letters = Gauge(
                "worker_outbox_dead_letters",
                "Outbox rows the host's relay gave up on, still in the table",
                registry=registry,
            )
            self._outbox = OutboxGauges(pending, oldest_pending_age, failing, dead_letters)
        return self._outbox
