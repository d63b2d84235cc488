"""The `work_lane_pauses` table, in the `queue` database role: one row per paused lane.

A row says the lane is paused: every claim statement excludes the lanes it lists, whatever
tenant an item is of (docs/decisions/0040). Shared by every tenant (`TenancyScope.GLOBAL`);
on PostgreSQL its policies let every session read it and only the system scope write it.
The table must equal what the queue migration `*_work_items_lane_pauses.up.sql` builds; the
integration suite compares the two on PostgreSQL. SQLite gets it from `metadata.create_all`.
"""

from __future__ import annotations

from sqlalchemy import Column, Table, Text

from acme.om.storage.metadata import metadata
from acme.om.work.storage.tables.work_items import UtcDateTime

work_lane_pauses = Table(
    "work_lane_pauses",
    metadata,
    Column("lane", Text, primary_key=True),
    Column("paused_at", UtcDateTime, nullable=False),
    # Who paused it: the operator's name as the command line or the API gave it.
    Column("paused_by", Text, nullable=False),
    Column("reason", Text),
)
