"""The `work_schedules` table, in the `queue` database role: one row per schedule and
tenant, the latest tick the schedule has handled (enqueued or skipped) and the tick after
it, which the work API shows (docs/decisions/0051).

A tick is enqueued in the transaction that advances its row, by a statement conditional on
the tick the row held before (docs/decisions/0034), so any number of worker processes
enqueue it once. The row outlives the items it enqueued: the retention purge of completed
items never lets a tick run twice. The table must equal what the queue migration
`om/migrations/sql/queue/*_work_items_schedules.up.sql` builds; SQLite gets it from
`metadata.create_all`.
"""

from __future__ import annotations

from sqlalchemy import Column, Table, Text, Uuid

from acme.om.storage.metadata import metadata
from acme.om.work.storage.tables.work_items import UtcDateTime

work_schedules = Table(
    "work_schedules",
    metadata,
    Column("org_id", Uuid, primary_key=True),
    # `<worker>:<schedule name>`: a schedule's name is unique within its worker.
    Column("schedule", Text, primary_key=True),
    Column("tick_at", UtcDateTime, nullable=False),
    # The tick after `tick_at` by the cron of the worker that advanced the row: the API
    # imports no worker's schedules. NULL for a row a release before it wrote.
    Column("next_tick_at", UtcDateTime, nullable=True),
    Column("updated_at", UtcDateTime, nullable=False),
)
