"""`make bench-scale`: the generated queue on a big table, in a PostgreSQL cluster of its own.

Not part of CI (a full run took 44 min on 2 cores). Set-up:
1. a cluster of its own, started by `scripts/chaos.py`'s `Postgres` (`initdb`, `pg_ctl`, a
   free loopback port, its files under `TMPDIR`), with production-like settings on top:
   autovacuum on at the naptime docs/operations.md asks for, shared buffers sized for the
   table, `pg_stat_statements` loaded; fsync off unless `BENCH_SCALE_FSYNC=on` (as `make
   chaos`: a commit still waits for its WAL write; with fsync on, the 100 tenants' commits
   bound the drain on this machine's disk, not the queue);
2. `shipment-notifier` rendered into a fresh reference host (`.bench/scale/host`, as
   `make bench` does), its handler replaced by `bench/host_noop_handler.py`, the roles and
   database made by the host's `scripts/infra-up.sh`, the schema by `make migrate`;
3. `BENCH_SCALE_TENANTS` (100) tenants in `orgs`.

Then the phases of `BENCH_SCALE_PHASES` (`drain,curve,churn,reads,upgrade`), in that order:

- `drain`: one worker process (capacity `BENCH_SCALE_CAPACITY`, 10; no Redis: PostgreSQL
  NOTIFY wake-ups) drains the baseline, `BENCH_SCALE_BASELINE` (20,000) due items on the
  near-empty table (`make bench`'s 20k row, in this cluster), with the claim statement's
  mean time from `pg_stat_statements`; then `BENCH_SCALE_HISTORY` (10,000,000) completed
  rows and `BENCH_SCALE_DUE` (1,000,000) due items are generated in the database and
  drained, a row per `BENCH_SCALE_MINUTE` (60 s): items/s, the claim's calls, mean and
  shared buffers per call, dead tuples, autovacuum runs, the claim index's pages. Bounds:
  the claim's mean over the drain at most `CLAIM_BOUND` (1.2) x the near-empty one's, every
  full minute at least `DRAIN_BOUND` (0.9) x the baseline's items/s.
- `curve` and `churn`: `bench/churn.py` (1, 2, 4 and 8 worker processes; steady traffic
  with a short retention and a held snapshot, the alarm evaluated on the recorded gauge).
- `reads`: `bench/reads.py` (the work API's reads of one tenant at 1,000 and at 1,000,000
  completed rows; each at most 2 x its time at the small history).
- `upgrade`: `bench/upgrade.py` (the 0.1.0 release with the same rows, in a database of
  its own, migrated revision by revision while two of its workers drain and 50 items/s
  are enqueued; no revision written under the safe-revision rule stalls traffic past 3 s).

Prints the tables and every bound; writes `.bench/scale-results.json`; exits 1 when a
bound is missed or an item is left undone.

Knobs (environment): BENCH_SCALE_PHASES, BENCH_SCALE_HISTORY, BENCH_SCALE_DUE,
BENCH_SCALE_BASELINE, BENCH_SCALE_TENANTS, BENCH_SCALE_CAPACITY, BENCH_SCALE_MINUTE,
BENCH_SCALE_TIMEOUT (seconds, a drain's limit: 3600), BENCH_SCALE_NAPTIME
(autovacuum_naptime, seconds: 15), BENCH_SCALE_SHARED_BUFFERS (1GB), BENCH_SCALE_FSYNC
(off), BENCH_SCALE_KEEP=1 (leave the cluster running at the end, for a look by hand), and
`bench/churn.py`'s.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from typing import Any

import asyncpg
import churn
import reads
import upgrade
from scale_cluster import (
    BASELINE,
    CAPACITY,
    DUE,
    FSYNC,
    HISTORY,
    KEEP,
    NAPTIME,
    RETENTION_S,
    SERVER_SETTINGS,
    TENANTS,
    TIMEOUT,
    WORK,
    Scale,
    completed,
    remove_leftovers,
    say,
    table_stats,
)

CLAIM_BOUND = 1.2
DRAIN_BOUND = 0.9
MINUTE = float(os.environ.get("BENCH_SCALE_MINUTE", "60"))
PHASES = os.environ.get("BENCH_SCALE_PHASES", "drain,curve,churn,reads,upgrade").split(",")

# What both claim statements (postgres_statements.claim_statement and claim_one_statement)
# hold and no other statement does, as pg_stat_statements keeps them (it replaces constants
# only): their UPDATE's fresh claim token. `drain` refuses a run that found no claim.
CLAIM_QUERY = "%claim_token = gen_random_uuid(), claimed_at = statement_timestamp()%"


async def claim_stats(conn: asyncpg.Connection) -> tuple[int, float, int]:
    """The claim statement's calls, total execution time (ms) and shared buffers read or
    hit so far."""
    row = await conn.fetchrow(
        "SELECT coalesce(sum(calls), 0)::bigint AS calls,"
        " coalesce(sum(total_exec_time), 0)::float8 AS ms,"
        " coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint AS blocks"
        " FROM pg_stat_statements WHERE query LIKE $1",
        CLAIM_QUERY,
    )
    return int(row["calls"]), float(row["ms"]), int(row["blocks"])


async def drain(
    scale: Scale, conn: asyncpg.Connection, *, tag: str, total: int, minute: float | None
) -> dict[str, Any]:
    """Drain `total` due items with one worker; with `minute`, one row per `minute` s."""
    await conn.execute("SELECT pg_stat_statements_reset()")
    worker, port = scale.start_worker(tag)
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    last_at, last_done = started, 0
    last_calls, last_ms, last_blocks = 0, 0.0, 0
    done, finished = 0, None
    try:
        while True:
            await asyncio.sleep(0.2)
            if not worker.alive():
                raise SystemExit(f"bench-scale: the {tag} worker exited:\n{worker.tail()}")
            done = completed(port) or done
            now = time.monotonic()
            if done >= total:
                finished = now
            if minute is not None and (now - last_at >= minute or finished):
                calls, ms, blocks = await claim_stats(conn)
                stats = await table_stats(conn)
                claims = max(calls - last_calls, 1)
                rows.append(
                    {
                        "minute": len(rows) + 1,
                        "seconds": round(now - last_at, 1),
                        "items": done - last_done,
                        "items_per_s": round((done - last_done) / (now - last_at), 1),
                        "claims": calls - last_calls,
                        "claim_mean_ms": round((ms - last_ms) / claims, 3),
                        "claim_buffers": round((blocks - last_blocks) / claims, 1),
                        **stats,
                    }
                )
                say(
                    f"  {tag} minute {len(rows)}: {rows[-1]['items_per_s']:,} items/s, claim"
                    f" {rows[-1]['claim_mean_ms']} ms, {rows[-1]['claim_buffers']} buffers, dead {stats['n_dead_tup']:,},"
                    f" autovacuums {stats['autovacuum_count']}, claim index"
                    f" {stats['claim_index_pages']:,} pages; {done:,} of {total:,}"
                )
                last_at, last_done, last_calls, last_ms = now, done, calls, ms
                last_blocks = blocks
            if finished or now - started > TIMEOUT:
                break
    finally:
        worker.stop()
    calls, ms, blocks = await claim_stats(conn)
    if done and not calls:
        raise SystemExit(
            f"bench-scale: {done:,} items drained and no claim statement in"
            f" pg_stat_statements: CLAIM_QUERY ({CLAIM_QUERY}) no longer matches the claim"
        )
    elapsed = (finished or time.monotonic()) - started
    return {
        "items": done,
        "seconds": round(elapsed, 1),
        "items_per_s": round(done / elapsed, 1),
        "claims": calls,
        "claim_mean_ms": round(ms / max(calls, 1), 3),
        "claim_buffers": round(blocks / max(calls, 1), 1),
        "complete": finished is not None,
        "minutes": rows,
    }


async def measure(scale: Scale) -> dict[str, Any]:
    conn = await scale.connect()
    try:
        say(f"baseline: {BASELINE:,} due items over {TENANTS} tenants on a near-empty table")
        await scale.generate(conn, count=BASELINE, status="AVAILABLE")
        await conn.execute("VACUUM ANALYZE work_items")
        baseline = await drain(scale, conn, tag="baseline", total=BASELINE, minute=None)
        say(
            f"  baseline: {baseline['items_per_s']:,} items/s, claim mean "
            f"{baseline['claim_mean_ms']} ms over {baseline['claims']:,} claims"
        )
        say(f"load: {HISTORY:,} completed rows, then {DUE:,} due items (in the database)")
        history_s = await scale.generate(conn, count=HISTORY, status="COMPLETED")
        due_s = await scale.generate(conn, count=DUE, status="AVAILABLE")
        started = time.monotonic()
        await conn.execute("VACUUM ANALYZE work_items")
        vacuum_s = time.monotonic() - started
        before = await table_stats(conn)
        before["relation_mb"] = await conn.fetchval(
            "SELECT pg_total_relation_size('work_items') / 1048576"
        )
        say(
            f"  loaded in {history_s + due_s:.0f} s, VACUUM ANALYZE {vacuum_s:.0f} s; "
            f"work_items {before['relation_mb']:,} MB with its indexes"
        )
        say(f"drain: {DUE:,} due items at capacity {CAPACITY}, a row per {MINUTE:.0f} s")
        big = await drain(scale, conn, tag="drain", total=DUE, minute=MINUTE)
        after_stats = await table_stats(conn)
    finally:
        await conn.close()
    return {
        "baseline": baseline,
        "load": {
            "history_s": round(history_s, 1),
            "due_s": round(due_s, 1),
            "vacuum_analyze_s": round(vacuum_s, 1),
            "before_drain": before,
        },
        "drain": big,
        "after_drain": after_stats,
    }


def verdicts(result: dict[str, Any]) -> list[dict[str, Any]]:
    base, big = result["baseline"], result["drain"]
    claim_ratio = big["claim_mean_ms"] / base["claim_mean_ms"] if base["claim_mean_ms"] else None
    full = [m for m in big["minutes"] if m["seconds"] >= MINUTE * 0.99]
    worst = min((m["items_per_s"] for m in full), default=None)
    drain_ratio = worst / base["items_per_s"] if worst is not None else None
    return [
        {
            "name": f"claim mean over the drain <= {CLAIM_BOUND} x near-empty",
            "value": None if claim_ratio is None else round(claim_ratio, 2),
            "ok": claim_ratio is not None and claim_ratio <= CLAIM_BOUND,
        },
        {
            "name": f"every full minute of the drain >= {DRAIN_BOUND} x the baseline's items/s",
            "value": None if drain_ratio is None else round(drain_ratio, 2),
            "ok": drain_ratio is not None and drain_ratio >= DRAIN_BOUND and big["complete"],
        },
    ]


def print_table(result: dict[str, Any]) -> None:
    base, big = result["baseline"], result["drain"]
    print(
        f"\nwork_items: {HISTORY:,} completed + {DUE:,} due over {TENANTS} tenants; "
        f"capacity {CAPACITY}; autovacuum_naptime {NAPTIME} s; fsync {FSYNC}"
    )
    print(
        "| stage | items/s | claims | claim mean ms | buffers per claim | dead tuples"
        " | autovacuums | claim index pages |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| baseline {BASELINE:,} items, near-empty | {base['items_per_s']:,} | "
        f"{base['claims']:,} | {base['claim_mean_ms']} | {base['claim_buffers']} | | | |"
    )
    for m in big["minutes"]:
        print(
            f"| drain minute {m['minute']} ({m['seconds']} s) | {m['items_per_s']:,} | "
            f"{m['claims']:,} | {m['claim_mean_ms']} | {m['claim_buffers']} | {m['n_dead_tup']:,} | "
            f"{m['autovacuum_count']} | {m['claim_index_pages']:,} |"
        )
    print(
        f"| drain, whole | {big['items_per_s']:,} | {big['claims']:,} | "
        f"{big['claim_mean_ms']} | {big['claim_buffers']} | | | |"
    )


async def phases(scale: Scale) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run each phase of `PHASES` in order on `scale`'s cluster; their records and bounds."""
    conn = await scale.connect()
    try:
        await scale.seed_tenants(conn)
    finally:
        await conn.close()
    result: dict[str, Any] = {}
    checks: list[dict[str, Any]] = []
    if "drain" in PHASES:
        result["drain"] = await measure(scale)
        checks += verdicts(result["drain"])
        print_table(result["drain"])
    if "curve" in PHASES:
        say(f"workers: {churn.CURVE_ITEMS:,} due items drained by 1, 2, 4 and 8 processes")
        result["curve"] = await churn.curve(scale)
        checks += churn.curve_verdicts(result["curve"])
    if "churn" in PHASES:
        say(
            f"churn: {churn.CHURN_RATE} items/s for {churn.CHURN_S} s, COMPLETED_RETENTION 60 s,"
            f" a snapshot held from {churn.HOLD_FROM_S} s to {churn.HOLD_TO_S} s"
        )
        result["churn"] = await churn.churn(scale)
        checks += churn.churn_verdicts(result["churn"], scale.host)
    if "reads" in PHASES:
        say(f"reads: the work API's reads at {reads.READS_SMALL:,} and {reads.READS_BIG:,} rows")
        result["reads"] = await reads.reads(scale)
        checks += reads.reads_verdicts(result["reads"])
        reads.print_reads(result["reads"])
    if "upgrade" in PHASES:
        say(f"upgrade: the 0.1.0 release migrated under {upgrade.RATE} items/s and two workers")
        result["upgrade"] = await upgrade.upgrade(scale)
        checks += upgrade.upgrade_verdicts(result["upgrade"])
        upgrade.print_upgrade(result["upgrade"])
    return result, checks


def main() -> int:
    began = time.monotonic()
    for tool in ("initdb", "pg_ctl"):
        if shutil.which(tool) is None:
            raise SystemExit(f"bench-scale: {tool} not found (PostgreSQL's server binaries)")
    remove_leftovers()
    scale = Scale()
    try:
        scale.start()
        scale.prepare()
        result, checks = asyncio.run(phases(scale))
    finally:
        if KEEP:
            say(f"cluster left running: {scale.pg.url()} (pg_ctl -D {scale.pg.data} stop)")
        else:
            scale.pg.stop()
            shutil.rmtree(scale.pg.root, ignore_errors=True)
    if "curve" in result:
        print("\n| worker processes | items/s | claimed again |\n|---|---|---|")
        for point in result["curve"]["points"]:
            print(
                f"| {point['workers']} | {point['items_per_s']:,} | {point['rows_claimed_again']} |"
            )
    for check in checks:
        print(f"{'met   ' if check['ok'] else 'MISSED'} {check['name']}: {check['value']}")
    result |= {
        "config": {
            "phases": PHASES,
            "history": HISTORY,
            "due": DUE,
            "baseline": BASELINE,
            "tenants": TENANTS,
            "capacity": CAPACITY,
            "minute_s": MINUTE,
            "server_settings": SERVER_SETTINGS.strip().splitlines(),
            "completed_retention_s": RETENTION_S,
        },
        "bounds": checks,
        "elapsed_s": round(time.monotonic() - began, 1),
    }
    (WORK / "scale-results.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    say(f"{(time.monotonic() - began) / 60:.1f} min; results in .bench/scale-results.json")
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
