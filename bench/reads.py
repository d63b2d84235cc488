"""`make bench-scale`'s reads phase: the work API's reads at 1,000 and 1,000,000 rows of history.

One tenant of its own (`reads`) in `scale.Scale`'s database is given `READS_DUE` (1,000)
due items, `READS_DEAD` (100) dead letters and `READS_SMALL` (1,000) completed rows over the
last day; `bench/ours_client.py reads` times each read the work API makes of it through the
host's manager (median of `READS_REPEAT`, 50). Then completed rows are added up to
`READS_BIG` (1,000,000) and the reads are timed again. Both after a `VACUUM ANALYZE`, as a
table autovacuum keeps up with. Bound: each read at most `READS_BOUND` (2) x its time at
the small history (docs/decisions/0046: the reads go through indexes over the rows in play).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import scale_cluster as sc
from run import _env_int

READS_DUE = _env_int("BENCH_SCALE_READS_DUE", 1_000)
READS_DEAD = _env_int("BENCH_SCALE_READS_DEAD", 100)
READS_SMALL = _env_int("BENCH_SCALE_READS_SMALL", 1_000)
READS_BIG = _env_int("BENCH_SCALE_READS_BIG", 1_000_000)
READS_REPEAT = _env_int("BENCH_SCALE_READS_REPEAT", 50)
READS_BOUND = 2.0


def rows_sql(*, count: int, status: str) -> str:
    """`count` rows of tenant $1 in `status`: `COMPLETED` over the last day, `FAILED` dead
    letters over the last hour, `AVAILABLE` items due over the last 10 minutes."""
    window, done = {
        "COMPLETED": ("1 day", "at"),
        "FAILED": ("1 hour", "NULL"),
        "AVAILABLE": ("10 minutes", "NULL"),
    }[status]
    attempts = {"COMPLETED": 1, "FAILED": 5, "AVAILABLE": 0}[status]
    error = "'ValueError: bench'" if status == "FAILED" else "NULL"
    return (
        "INSERT INTO work_items (id, org_id, kind, lane, payload, status, attempts,"
        " max_attempts, available_at, completed_at, last_error, created_at, updated_at,"
        " created_by, updated_by)"
        " SELECT gen_random_uuid(), $1, 'NOTIFY_SHIPMENT', 'default',"
        " jsonb_build_object('record_id', gen_random_uuid()),"
        f" '{status}', {attempts}, 5, at, {done}, {error}, at, at, '{sc.EMPTY}', '{sc.EMPTY}'"
        f" FROM generate_series(1, {count}) AS g,"
        f" LATERAL (SELECT now() - interval '{window}' * random() AS at) t"
    )


def _time_reads(scale: sc.Scale, org: str) -> dict[str, float]:
    """The probe's medians, in ms, run inside the rendered host."""
    url = scale.pg.url("acme_app").replace("postgresql:", "postgresql+asyncpg:")
    cmd = ["uv", "run", "--all-packages", "--offline", "python"]
    cmd += [str(sc.REPO / "bench" / "ours_client.py"), "reads", "--url", url, "--org", org]
    cmd += ["--repeat", str(READS_REPEAT)]
    done = subprocess.run(
        cmd, cwd=scale.host, env=scale.env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"bench-scale: the reads probe failed ({done.returncode})")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def reads(scale: sc.Scale) -> dict[str, Any]:
    """The reads phase (module docstring); its record: the medians at both sizes."""
    conn = await scale.connect()
    try:
        org = await conn.fetchval(
            "INSERT INTO orgs (id, name, created_at, updated_at, created_by, updated_by)"
            f" VALUES (gen_random_uuid(), 'reads', now(), now(), '{sc.EMPTY}', '{sc.EMPTY}')"
            " RETURNING id"
        )
        for status, count in (
            ("AVAILABLE", READS_DUE),
            ("FAILED", READS_DEAD),
            ("COMPLETED", READS_SMALL),
        ):
            await conn.execute(rows_sql(count=count, status=status), org)
        await conn.execute("VACUUM ANALYZE work_items")
        small = _time_reads(scale, str(org))
        sc.say(f"  reads at {READS_SMALL:,} completed rows: {small}")
        for offset in range(READS_SMALL, READS_BIG, sc.CHUNK):
            count = min(sc.CHUNK, READS_BIG - offset)
            await conn.execute(rows_sql(count=count, status="COMPLETED"), org)
        await conn.execute("VACUUM ANALYZE work_items")
        big = _time_reads(scale, str(org))
        sc.say(f"  reads at {READS_BIG:,} completed rows: {big}")
    finally:
        await conn.close()
    return {"small_history": READS_SMALL, "big_history": READS_BIG, "small": small, "big": big}


def reads_verdicts(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One check per read: its median at the big history at most READS_BOUND x the small."""
    checks = []
    for name, small_ms in result["small"].items():
        ratio = result["big"][name] / small_ms if small_ms else None
        checks.append(
            {
                "name": (
                    f"the work API's `{name}` at {result['big_history']:,} completed rows"
                    f" <= {READS_BOUND} x at {result['small_history']:,}"
                ),
                "value": None if ratio is None else round(ratio, 2),
                "ok": ratio is not None and ratio <= READS_BOUND,
            }
        )
    return checks


def print_reads(result: dict[str, Any]) -> None:
    small, big = result["small_history"], result["big_history"]
    print(f"\n| the work API's read | {small:,} completed rows | {big:,} | ratio |")
    print("|---|---|---|---|")
    for name, small_ms in result["small"].items():
        big_ms = result["big"][name]
        print(f"| {name} | {small_ms} ms | {big_ms} ms | {big_ms / small_ms:.2f} |")
