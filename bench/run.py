"""`make bench`: queue throughput and claim latency of a rendered worker on PostgreSQL.

Renders `shipment-notifier` into `.bench/host` (as `make demo` does), migrates a scratch
database `acme_bench`, then runs `bench/queue_inner.py` inside the host for each scenario:
enqueue N items with `enqueue_many`, drain them with C concurrent claimers that each
`claim_many` up to B items and complete them one by one. Each scenario is held to its
targets in `bench/targets.json` (items per second, p99 claim latency in milliseconds);
the run exits 1 when one misses. Targets are for this project's 2-core machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import asyncpg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import demo  # the demo's host preparation, reused as is

ADMIN = os.environ.get("DEMO_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
HOST_PART = ADMIN.split("@", 1)[1].rsplit("/", 1)[0]


async def recreate_database() -> None:
    conn = await asyncpg.connect(ADMIN)
    try:
        await conn.execute("DROP DATABASE IF EXISTS acme_bench WITH (FORCE)")
        await conn.execute("CREATE DATABASE acme_bench OWNER acme_owner")
    finally:
        await conn.close()


def main() -> int:
    targets = json.loads((REPO / "bench" / "targets.json").read_text())
    work = REPO / ".bench"
    host = demo.prepare_host(work)
    worker = demo.Worker(*demo.FIRST, port=0, log=work / "unused.log")
    demo.render(host, worker)
    env = demo.host_env(demo.Backend("bench", None, None, None, None), [])
    demo.run(["uv", "sync", "--offline", "--all-packages", "--quiet"], cwd=host, env=env)
    demo.run(["bash", "scripts/infra-up.sh"], cwd=host, env=env)
    asyncio.run(recreate_database())
    owner = f"postgresql+asyncpg://acme_owner@{HOST_PART}/acme_bench"
    demo.run(["make", "migrate"], cwd=host, env={**env, "ACME_MIGRATION_URL": owner})
    app_url = f"postgresql+asyncpg://acme_app@{HOST_PART}/acme_bench"
    failed = False
    print(f"{'scenario':<28}{'items/s':>10}{'target':>10}{'p99 ms':>10}{'target':>10}")
    for scenario in targets["scenarios"]:
        args = [str(scenario[k]) for k in ("items", "claimers", "batch")]
        done = subprocess.run(
            [
                "uv",
                "run",
                "--all-packages",
                "--offline",
                "python",
                str(REPO / "bench" / "queue_inner.py"),
                app_url,
                *args,
            ],
            cwd=host,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            sys.stderr.write(done.stdout + done.stderr)
            return 1
        result = json.loads(done.stdout.strip().splitlines()[-1])
        ok = (
            result["items_per_second"] >= scenario["min_items_per_second"]
            and result["claim_p99_ms"] <= scenario["max_claim_p99_ms"]
        )
        failed = failed or not ok
        name = f"{scenario['items']} items, {scenario['claimers']}x{scenario['batch']}"
        print(
            f"{name:<28}{result['items_per_second']:>10}{scenario['min_items_per_second']:>10}"
            f"{result['claim_p99_ms']:>10}{scenario['max_claim_p99_ms']:>10}"
            f"  {'ok' if ok else 'MISSED'}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
