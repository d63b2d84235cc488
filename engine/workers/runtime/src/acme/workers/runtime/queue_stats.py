"""The sweep's last service: the queue gauges, the outbox's, and one `queue stats` line.

Per pass: `queue_stats` through the work manager (the depth per lane, the oldest
available age per lane and kind, and on PostgreSQL the oldest snapshot's age), the
stranded items (`rules.stranded`, one WARNING), the host relay's `outbox_stats` when it
reports them, then the line (`QUEUE_STATS_EVENT`, `QUEUE_STATS_FIELDS`) alarms read.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Protocol, runtime_checkable

from prometheus_client.metrics import MetricWrapperBase

from acme.om.context import RequestContext
from acme.om.work import WorkManagerInterface
from acme.om.work.metrics import default_metrics
from acme.om.work.rules import policy_lane, stranded
from acme.om.work.types.policy import KindPolicy
from acme.om.work.types.work_item import LaneStats, WorkKind, WorkStatus
from acme.workers.runtime.metrics import WorkerMetrics
from acme.workers.runtime.settings import RuntimeSettings
from acme.workers.runtime.state import LOOP_LOGGER, LoopState
from acme.workers.runtime.sweep_steps import SweepSteps

logger = logging.getLogger(LOOP_LOGGER)

OUTBOX_FAILING_AFTER = 3
"""Failed relays after which a pending outbox row counts in `worker_outbox_failing`."""


class OutboxStatsLike(Protocol):
    """What `OutboxStatsReader.outbox_stats` returns: the outbox across every tenant.

    `pending`: rows not relayed and not given up; `oldest_pending_age`: seconds since the
    oldest pending row was written (0 when none); `failing`: pending rows whose relay
    failed at least `failing_after` times; `dead_lettered`: rows the relay gave up on and
    keeps. Counts are non-negative ints, the age a non-negative number of seconds.
    """

    @property
    def pending(self) -> int: ...

    @property
    def oldest_pending_age(self) -> float: ...

    @property
    def failing(self) -> int: ...

    @property
    def dead_lettered(self) -> int: ...


@runtime_checkable
class OutboxStatsReader(Protocol):
    """A host outbox relay that reports the outbox's state; the sweep reads it each pass.

    The host contract's optional part (docs/host-contract.md, "Outbox state and dead
    letters"): `Managers.outbox_relay` with this method; the worker's container checks its
    shape (`container.outbox_stats_reader`). Without it the `worker_outbox_*` gauges are
    not exported.
    """

    async def outbox_stats(self, rctx: RequestContext, *, failing_after: int) -> OutboxStatsLike:
        """The outbox across every tenant; see `OutboxStatsLike`."""
        ...


async def _outbox_stats(
    reader: OutboxStatsReader, rctx: RequestContext
) -> tuple[int, float, int, int]:
    """`(pending, oldest_pending_age, failing, dead_lettered)` from `reader.outbox_stats`;
    raises `TypeError` unless each count is a non-negative int and the age a non-negative
    number of seconds."""
    stats: object = await reader.outbox_stats(rctx, failing_after=OUTBOX_FAILING_AFTER)
    counts: list[int] = []
    for field in ("pending", "failing", "dead_lettered"):
        value = getattr(stats, field, None)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TypeError(f"outbox_stats returned {field}={value!r}, not a count")
        counts.append(value)
    age = getattr(stats, "oldest_pending_age", None)
    if not isinstance(age, int | float) or isinstance(age, bool) or not 0 <= age < math.inf:
        raise TypeError(f"outbox_stats returned oldest_pending_age={age!r}, not seconds")
    return counts[0], float(age), counts[1], counts[2]


QUEUE_STATS_EVENT = "queue_stats"
"""The `event` field of the line each sweep pass logs, `queue stats ...` (INFO)."""

QUEUE_STATS_FIELDS = (
    "lane",
    "available",
    "oldest_available_age_s",
    "dead_letters_unaudited",
    "oldest_snapshot_xid_age",
    "oldest_snapshot_age_s",
    "claim_failures",
    "lease_renewal_failures",
    "completion_failures",
    "wake_up_channel_up",
    "lane_paused",
    "outbox_pending",
    "outbox_oldest_pending_age_s",
    "outbox_failing",
    "outbox_dead_letters",
    "stranded",
)
"""The fields of that line besides `event`, as `extra` (top-level keys of a JSON log line,
where the host's deployment turns them into metrics; docs/operations.md, Alerts).

The loop's own lane (`lane`) and kinds: `available` items (due or not) and
`oldest_available_age_s` (the oldest due one's wait, on the database clock),
`dead_letters_unaudited`; across the database, `oldest_snapshot_xid_age` and
`oldest_snapshot_age_s` (PostgreSQL only). Since this loop's previous line:
`claim_failures`, `lease_renewal_failures`, `completion_failures`. `wake_up_channel_up`: 1
or 0. `lane_paused`: 1 while the loop's lane is paused (no claim takes its items;
docs/operations.md, Pausing a lane), else 0. The outbox's four, across tenants, with an
`outbox_stats` reader. Last, `stranded`: across lanes and kinds, the waiting items no worker
claims (`rules.stranded`). A field this pass could not read is left out."""


def _sample_values(metric: MetricWrapperBase, suffix: str = "") -> list[float]:
    """The values of `metric`'s samples whose name ends with `suffix`, over every label set
    (a counter's `_total` ones, not its `_created`)."""
    return [
        sample.value
        for family in metric.collect()
        for sample in family.samples
        if sample.name.endswith(suffix)
    ]


def _lane_paused(lane: str) -> int:
    """1 when the manager's `work_lane_paused` gauge says `lane` is paused, else 0."""
    return int(
        any(
            sample.labels.get("lane") == lane and sample.value == 1
            for family in default_metrics().lane_paused.collect()
            for sample in family.samples
        )
    )


class QueueStats:
    """Sets the queue and outbox gauges and logs the `queue stats` line, once per pass.

    A lane or kind with no row in play any more reads 0, not its last value; the failure
    counts are the counters `/metrics` serves, since this object's previous line.
    """

    def __init__(
        self,
        *,
        settings: RuntimeSettings,
        work: WorkManagerInterface,
        metrics: WorkerMetrics,
        kinds: Sequence[WorkKind],
        policies: Mapping[WorkKind, KindPolicy],
        state: LoopState,
        outbox_stats: OutboxStatsReader | None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self._work = work
        self._kinds = {str(kind) for kind in kinds}
        self._policies = policies
        self._state = state
        self._outbox_stats = outbox_stats
        self._failures_logged: dict[str, float] = {}  # totals at the last line
        self._gauged_lanes: set[str] = set()  # the queue gauges' label values set so far
        self._gauged_ages: set[tuple[str, str]] = set()

    def say_what_is_not_exported(self) -> None:
        """Without an `outbox_stats` reader, say once that the outbox gauges are missing."""
        if self._outbox_stats is None:
            logger.info(
                "the outbox relay does not report the outbox's state (no outbox_stats): "
                "the worker_outbox_* gauges are not exported"
            )

    async def sweep(self, steps: SweepSteps, rctx: RequestContext) -> None:
        """Read and export this pass's stats (steps `queue_stats`, `outbox_stats`), then say
        the steps still failing and log the line (`_log`)."""
        stats = await steps.run(
            "queue_stats", partial(self._work.queue_stats, rctx), reads_queue=True
        )
        line: dict[str, Any] = {"lane": self.settings.lane}  # the queue stats line's fields
        if stats is not None:
            self._gauge_queue(stats, line)
        if self._outbox_stats is not None:
            outbox = await steps.run(
                "outbox_stats", partial(_outbox_stats, self._outbox_stats, rctx)
            )
            if outbox is not None:
                gauges = self.metrics.outbox_gauges()
                pending, oldest_age, failing, dead = outbox
                gauges.pending.set(pending)
                gauges.oldest_pending_age.set(oldest_age)
                gauges.failing.set(failing)
                gauges.dead_letters.set(dead)
                line["outbox_pending"] = pending
                line["outbox_oldest_pending_age_s"] = round(oldest_age, 3)
                line["outbox_failing"] = failing
                line["outbox_dead_letters"] = dead
        steps.say_failing()
        self._log(line)

    def _gauge_queue(self, stats: Sequence[LaneStats], line: dict[str, Any]) -> None:
        """Set the depth and age gauges from `stats`, and this lane's fields of `line`."""
        depth: dict[str, int] = {}
        ages: dict[tuple[str, str], float] = {}
        for row in stats:
            available = row.count if row.status == WorkStatus.AVAILABLE else 0
            depth[row.lane] = depth.get(row.lane, 0) + available
            ages[row.lane, row.kind] = max(
                ages.get((row.lane, row.kind), 0.0), row.oldest_available_age or 0.0
            )
        self._gauged_lanes |= depth.keys()
        self._gauged_ages |= ages.keys()
        for lane in self._gauged_lanes:
            self.metrics.queue_depth.labels(lane=lane).set(depth.get(lane, 0))
        for lane, kind in self._gauged_ages:
            age = ages.get((lane, kind), 0.0)
            self.metrics.queue_oldest_available_age.labels(lane=lane, kind=kind).set(age)
        own = [row for row in stats if row.lane == self.settings.lane and row.kind in self._kinds]
        line["available"] = sum(r.count for r in own if r.status == WorkStatus.AVAILABLE)
        oldest = max((ages[r.lane, r.kind] for r in own), default=0.0)
        line["oldest_available_age_s"] = round(oldest, 3)
        line["dead_letters_unaudited"] = sum(r.audit_owed for r in own)
        line["stranded"] = self._report_stranded(stats)
        # The manager's gauges, refreshed by the queue_stats just read (the snapshot's age on
        # PostgreSQL only).
        xid_ages = _sample_values(default_metrics().oldest_snapshot_xid_age)
        if xid_ages:
            line["oldest_snapshot_xid_age"] = int(max(xid_ages))
        held = _sample_values(default_metrics().oldest_snapshot_age)
        if held:
            line["oldest_snapshot_age_s"] = round(max(held), 1)
        line["lane_paused"] = _lane_paused(self.settings.lane)

    def _report_stranded(self, stats: Sequence[LaneStats]) -> int:
        """Log one WARNING naming each kind and lane with stranded items and how many, when
        there are any; the total. Nothing is moved: an operator decides (the template's
        docs/operations.md, "Stranded items")."""
        found = stranded(stats, self._policies)
        named = []
        for (kind, lane), count in found.items():
            home = policy_lane(kind, self._policies)
            why = "no worker declares this kind" if home is None else f"its workers claim on {home}"
            named.append(f"{kind} on {lane}: {count} ({why})")
        if named:
            logger.warning(
                "stranded items, waiting where no worker claims them: %s; list them with "
                "`items list --any-kind`, then `items move` or `items discard`",
                ", ".join(named),
            )
        return sum(found.values())

    def _log(self, line: dict[str, Any]) -> None:
        """Log the `queue stats` line (INFO): `line`, the failures counted since the
        previous line and whether the wake-up channel is up, as `extra` fields and as
        `key=value` in the message."""
        failures = {
            "claim_failures": sum(_sample_values(self.metrics.claim_failures, "_total")),
            "lease_renewal_failures": sum(_sample_values(self.metrics.renewals_failed, "_total")),
            "completion_failures": sum(_sample_values(self.metrics.completions_failed, "_total")),
        }
        for name, total in failures.items():
            line[name] = round(total - self._failures_logged.get(name, 0.0))
        self._failures_logged = failures
        line["wake_up_channel_up"] = int(self._state.wake_ups_up)
        fields = {"event": QUEUE_STATS_EVENT} | {
            name: line[name] for name in QUEUE_STATS_FIELDS if name in line
        }
        suffix = " ".join(f"{name}={value}" for name, value in fields.items() if name != "event")
        logger.info("queue stats %s", suffix, extra=fields)
