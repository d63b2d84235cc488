"""`make bench-scale`'s churn and worker-count phases, over `scale.Scale`'s cluster and host.

Churn (issue 31): `BENCH_SCALE_CHURN_RATE` (300) items/s enqueued for `BENCH_SCALE_CHURN_S`
(1,800) seconds into one worker at capacity 10 with `COMPLETED_RETENTION=60`, while another
session holds a `REPEATABLE READ` snapshot from `BENCH_SCALE_HOLD_FROM_S` (300) to
`BENCH_SCALE_HOLD_TO_S` (1,500). The worker logs JSON lines at INFO; its `queue stats`
lines are the record a deployment turns into metrics, and the rendered host's snapshot
alarms (its Terraform worker module) are evaluated on it as CloudWatch evaluates them.
Bounds: the first alarm fires within 12 min of the hold starting; after the hold, `n_dead_tup` comes back within 2x its value at the
hold's start, and the table with its indexes grows under 10 % over the last 5 minutes.

Workers: `BENCH_SCALE_CURVE_ITEMS` (50,000) due items drained by 1, 2, 4 and 8 worker
processes on one lane; aggregate items/s as a curve, and no item claimed twice (every row
completed at its first attempt, the workers' completions summing to the items).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import hcl2
import scale_cluster as sc
from run import WorkerProcess, _env_int

CHURN_RATE = _env_int("BENCH_SCALE_CHURN_RATE", 300)
CHURN_S = _env_int("BENCH_SCALE_CHURN_S", 1800)
HOLD_FROM_S = _env_int("BENCH_SCALE_HOLD_FROM_S", 300)
HOLD_TO_S = _env_int("BENCH_SCALE_HOLD_TO_S", 1500)
CURVE_ITEMS = _env_int("BENCH_SCALE_CURVE_ITEMS", 50_000)
CURVE_WORKERS = (1, 2, 4, 8)
ALARM_BOUND_S = 12 * 60
DEAD_BOUND = 2.0
GROWTH_BOUND = 0.10
ALARMS = ("snapshot_age", "snapshot_held")
MODULE = Path("deployment/terraform/modules/worker")


@dataclass(frozen=True)
class Alarm:
    """A CloudWatch metric alarm of the worker module, as its evaluation needs it."""

    field: str  # the queue stats field the metric comes from (`oldest_snapshot_xid_age`)
    threshold: float
    period_s: int
    evaluation_periods: int
    datapoints_to_alarm: int


def alarm_from_module(host: Path, resource: str) -> Alarm:
    """Read `resource`'s alarm from the rendered host's worker module (python-hcl2; a
    `var.` threshold from its variable's default). Raises `SystemExit` when it is absent."""
    parsed: dict[str, list[Any]] = {}
    for path in sorted((host / MODULE).glob("*.tf")):
        with path.open(encoding="utf-8") as handle:
            for key, blocks in hcl2.load(handle).items():
                parsed.setdefault(key, []).extend(blocks)
    alarms = {
        _unquote(name): body
        for block in parsed.get("resource", [])
        for kind, named in block.items()
        if _unquote(kind) == "aws_cloudwatch_metric_alarm"
        for name, body in named.items()
    }
    if resource not in alarms:
        raise SystemExit(f"bench-scale: no alarm {resource} in {MODULE}")
    body = alarms[resource]
    metrics = next(b["queue_metrics"] for b in parsed["locals"] if "queue_metrics" in b)
    threshold = _unquote(body["threshold"])
    if isinstance(threshold, str) and threshold.startswith("${var."):
        name = threshold.removeprefix("${var.").removesuffix("}")
        variables = {_unquote(k): v for b in parsed["variable"] for k, v in b.items()}
        threshold = variables[name]["default"]
    periods = int(body["evaluation_periods"])
    return Alarm(
        field=_unquote(metrics[_unquote(body["metric_name"])]["field"]),
        threshold=float(threshold),
        period_s=int(body["period"]),
        evaluation_periods=periods,
        datapoints_to_alarm=int(body.get("datapoints_to_alarm", periods)),
    )


def _unquote(value: Any) -> Any:
    """python-hcl2 keeps the quotes of string literals (`'"serve"'`); drop them."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def first_alarm_at(samples: list[tuple[float, float]], alarm: Alarm) -> float | None:
    """When CloudWatch would first raise `alarm` over `samples` ((epoch s, value), sorted):
    periods aligned to multiples of `period_s`, the Maximum in each, the alarm at the end of
    the first period where `datapoints_to_alarm` of the last `evaluation_periods` periods
    exceed the threshold (a period without data does not breach). None when it never does."""
    if not samples:
        return None
    highest: dict[int, float] = {}
    for at, sample in samples:
        period = int(at // alarm.period_s)
        highest[period] = max(highest.get(period, -math.inf), sample)
    first, last = min(highest), max(highest)
    for period in range(first, last + 1):
        window = range(period - alarm.evaluation_periods + 1, period + 1)
        breaching = sum(1 for p in window if highest.get(p, -math.inf) > alarm.threshold)
        if breaching >= alarm.datapoints_to_alarm:
            return float((period + 1) * alarm.period_s)
    return None


def stats_lines(log: Path) -> list[dict[str, Any]]:
    """The worker's `queue stats` JSON lines in `log`, each with `at` (epoch seconds)."""
    lines = []
    for raw in log.read_text(errors="replace").splitlines():
        if not raw.startswith("{"):
            continue
        line = json.loads(raw)
        if line.get("event") == "queue_stats":
            lines.append(line | {"at": datetime.fromisoformat(line["ts"]).timestamp()})
    return lines


async def relation_sizes(conn: asyncpg.Connection) -> dict[str, int]:
    rows = await conn.fetch(
        "SELECT c.relname, pg_relation_size(c.oid) AS bytes FROM pg_class c"
        " WHERE c.relname = 'work_items' OR c.oid IN"
        " (SELECT indexrelid FROM pg_index WHERE indrelid = 'work_items'::regclass)"
    )
    return {str(r["relname"]): int(r["bytes"]) for r in rows}


async def _enqueue_at_rate(
    conn: asyncpg.Connection, stop: asyncio.Event, latencies: list[float]
) -> int:
    """One due item per 1/CHURN_RATE s (tenants in turn) until `stop`; returns the count."""
    orgs = [r["id"] for r in await conn.fetch("SELECT id FROM orgs WHERE name LIKE 'scale-%'")]
    statement = await conn.prepare(
        "INSERT INTO work_items (id, org_id, kind, lane, payload, status, attempts, max_attempts,"
        " available_at, created_at, updated_at, created_by, updated_by)"
        " VALUES (gen_random_uuid(), $1, 'NOTIFY_SHIPMENT', 'default',"
        " jsonb_build_object('record_id', gen_random_uuid()), 'AVAILABLE', 0, 5,"
        f" statement_timestamp(), statement_timestamp(), statement_timestamp(), '{sc.EMPTY}',"
        f" '{sc.EMPTY}')"
    )
    started, sent = time.monotonic(), 0
    while not stop.is_set():
        due = started + sent / CHURN_RATE
        if (wait := due - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        began = time.monotonic()
        await statement.fetch(orgs[sent % len(orgs)])
        latencies.append(time.monotonic() - began)
        sent += 1
    return sent


async def churn(scale: sc.Scale) -> dict[str, Any]:
    """The churn phase on an emptied `work_items`: a row per minute, the hold's times, the
    enqueue p99 and the worker's `queue stats` lines."""
    conn = await scale.connect()
    holder = await scale.connect()
    admin = await scale.connect()
    try:
        await conn.execute("TRUNCATE work_items")
        await conn.execute("VACUUM ANALYZE work_items")
        worker, port = scale.start_worker("churn", retention_s=60, log_stats=True)
        stop = asyncio.Event()
        latencies: list[float] = []
        enqueuer = asyncio.create_task(_enqueue_at_rate(conn, stop, latencies))
        minutes: list[dict[str, Any]] = []
        hold: dict[str, float] = {}
        started = time.monotonic()
        try:
            while (elapsed := time.monotonic() - started) < CHURN_S:
                await asyncio.sleep(0.5)
                if not worker.alive():
                    raise SystemExit(f"bench-scale: the churn worker exited:\n{worker.tail()}")
                if "from" not in hold and elapsed >= HOLD_FROM_S:
                    await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    await holder.fetchval("SELECT count(*) FROM orgs")  # takes the snapshot
                    hold["from"] = time.time()
                    sc.say(f"  churn: snapshot held from {elapsed:.0f} s")
                if "from" in hold and "to" not in hold and elapsed >= HOLD_TO_S:
                    await holder.execute("COMMIT")
                    hold["to"] = time.time()
                    sc.say(f"  churn: snapshot released at {elapsed:.0f} s")
                if elapsed >= 60 * len(minutes):
                    minutes.append(await _minute(admin, len(minutes), latencies, port, worker))
        finally:
            stop.set()
            await enqueuer
            worker.stop()
    finally:
        for connection in (admin, holder, conn):
            await connection.close()
    return {
        "hold": hold,
        "minutes": minutes,
        "enqueued": len(latencies),
        "enqueue_p99_ms": _p99_ms(latencies),
        "stats_lines": stats_lines(worker.log),
    }


async def _minute(
    admin: asyncpg.Connection, minute: int, latencies: list[float], port: int, worker: WorkerProcess
) -> dict[str, Any]:
    """One row of the churn record: what was enqueued and completed, the table's tuples and
    size, and the snapshot fields of the worker's last `queue stats` line."""
    stats = await sc.table_stats(admin)
    sizes = await relation_sizes(admin)
    last = (stats_lines(worker.log) or [{}])[-1]
    row = {
        "minute": minute,
        "enqueued": len(latencies),
        "completed": sc.completed(port),
        "relation_bytes": sum(sizes.values()),
        "oldest_snapshot_xid_age": last.get("oldest_snapshot_xid_age"),
        "oldest_snapshot_age_s": last.get("oldest_snapshot_age_s"),
        **stats,
    }
    sc.say(
        f"  churn minute {minute}: enqueued {row['enqueued']:,}, completed {row['completed']},"
        f" dead {row['n_dead_tup']:,}, live {row['n_live_tup']:,},"
        f" {row['relation_bytes'] / 1048576:.1f} MB, snapshot held"
        f" {row['oldest_snapshot_age_s']} s / {row['oldest_snapshot_xid_age']} xids"
    )
    return row


def _p99_ms(latencies: list[float]) -> float | None:
    if not latencies:
        return None
    ordered = sorted(latencies)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000, 2)


def churn_verdicts(result: dict[str, Any], host: Path) -> list[dict[str, Any]]:
    """The churn bounds over `churn`'s record; each alarm's firing reported."""
    held_from = result["hold"].get("from")
    fired: dict[str, float | None] = {}
    for resource in ALARMS:
        alarm = alarm_from_module(host, resource)
        samples = [
            (line["at"], float(line[alarm.field]))
            for line in result["stats_lines"]
            if alarm.field in line
        ]
        at = first_alarm_at(samples, alarm)
        fired[resource] = None if at is None or held_from is None else (at - held_from) / 60
    result["alarms_fired_min"] = fired
    first = min((m for m in fired.values() if m is not None), default=None)
    by_minute = {m["minute"]: m for m in result["minutes"]}
    start = by_minute.get(HOLD_FROM_S // 60)
    end = by_minute.get(max(by_minute, default=0))
    released = by_minute.get(HOLD_TO_S // 60)
    dead = None if not (start and end) else end["n_dead_tup"] / max(start["n_dead_tup"], 1)
    growth = None
    if released and end:
        growth = end["relation_bytes"] / max(released["relation_bytes"], 1) - 1
    return [
        {
            "name": f"a held-snapshot alarm fires within {ALARM_BOUND_S // 60} min of the hold"
            f" ({', '.join(f'{r}: {m if m is None else round(m, 1)}' for r, m in fired.items())})",
            "value": None if first is None else round(first, 1),
            "ok": first is not None and first * 60 <= ALARM_BOUND_S,
        },
        {
            "name": f"n_dead_tup at the end within {DEAD_BOUND} x its value at the hold's start",
            "value": None if dead is None else round(dead, 2),
            "ok": dead is not None and dead <= DEAD_BOUND,
        },
        {
            "name": f"table and indexes grow under {GROWTH_BOUND:.0%} after the release",
            "value": None if growth is None else round(growth, 3),
            "ok": growth is not None and growth < GROWTH_BOUND,
        },
    ]


async def curve(scale: sc.Scale) -> dict[str, Any]:
    """Aggregate items/s of 1, 2, 4 and 8 workers over `CURVE_ITEMS` due items each, timed
    from the items' insert (every worker already up) to the last completion."""
    conn = await scale.connect()
    points: list[dict[str, Any]] = []
    try:
        for count in CURVE_WORKERS:
            await conn.execute("TRUNCATE work_items")
            await conn.execute("VACUUM ANALYZE work_items")
            workers = [scale.start_worker(f"curve-{count}-{n}") for n in range(count)]
            try:
                while any(sc.completed(port) is None for _, port in workers):
                    await asyncio.sleep(0.2)
                started = time.monotonic()
                await scale.generate(conn, count=CURVE_ITEMS, status="AVAILABLE")
                done = 0
                while done < CURVE_ITEMS and time.monotonic() - started < sc.TIMEOUT:
                    await asyncio.sleep(0.1)
                    done = sum(sc.completed(port) or 0 for _, port in workers)
                elapsed = time.monotonic() - started
            finally:
                for worker, _ in workers:
                    worker.stop()
            row = await conn.fetchrow(
                "SELECT count(*) FILTER (WHERE status = 'COMPLETED') AS completed,"
                " count(*) FILTER (WHERE attempts <> 1) AS claimed_again FROM work_items"
            )
            points.append(
                {
                    "workers": count,
                    "items_per_s": round(done / elapsed, 1),
                    "completions": done,
                    "rows_completed": row["completed"],
                    "rows_claimed_again": row["claimed_again"],
                }
            )
            sc.say(f"  {count} workers: {points[-1]['items_per_s']:,} items/s")
    finally:
        await conn.close()
    return {"items": CURVE_ITEMS, "points": points}


def curve_verdicts(result: dict[str, Any]) -> list[dict[str, Any]]:
    twice = [
        p["workers"]
        for p in result["points"]
        if p["rows_claimed_again"]
        or p["completions"] != result["items"]
        or p["rows_completed"] != result["items"]
    ]
    return [
        {
            "name": "no item claimed twice, every item completed once",
            "value": twice or "none",
            "ok": not twice and len(result["points"]) == len(CURVE_WORKERS),
        }
    ]
