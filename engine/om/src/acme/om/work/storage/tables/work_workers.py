"""The `work_workers` table, in the `queue` database role: the worker roster, one row per
running worker process (docs/decisions/0049).

Each beat of a worker's heartbeat upserts its row (`beat_at`, `expires_at`), its drain
deletes it, and the sweep deletes rows that expired long ago (a worker killed without a
drain). No tenant: a worker serves every tenant (`TenancyScope.GLOBAL`); on PostgreSQL its
policy lets only the system scope read or write it. The table must equal what the queue
migration `*_work_items_workers.up.sql` builds; the integration suite compares the two on
PostgreSQL. SQLite gets it from `metadata.create_all`.
"""

from __future__ import annotations

from sqlalchemy import Column, Table, Text

from acme.om.storage.metadata import metadata
from acme.om.work.storage.tables.work_items import UtcDateTime

work_workers = Table(
    "work_workers",
    metadata,
    # `<host>:<pid>:<random>`, the `claimed_by` of the items the process holds.
    Column("worker_id", Text, primary_key=True),
    # The worker's name (its console command), the lane it claims on, and the kinds it
    # claims there, space-separated (a `WorkKind` value holds no space).
    Column("worker", Text, nullable=False),
    Column("lane", Text, nullable=False),
    Column("kinds", Text, nullable=False),
    Column("started_at", UtcDateTime, nullable=False),
    Column("beat_at", UtcDateTime, nullable=False),
    # `beat_at` plus the worker's liveness TTL: alive until then without another beat.
    Column("expires_at", UtcDateTime, nullable=False),
)
