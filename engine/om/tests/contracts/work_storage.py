"""The work storage contract: one suite every `WorkStorageInterface` implementation passes.

Subclass `WorkStorageContract` in a `Test*` class, give it a `storage` fixture, an
`advance(seconds)` that lets that much storage-clock time pass (a fake clock moves; a
database's clock is waited on), and a `store(storage, values)` that stores a row as it is,
unvalidated, past the table's own checks (a row the storage's writes never make). The cases
cover claim exclusivity, the claim's order (priorities, a fair share per tenant), lease,
requeue, fencing, idempotency, tenants and the raced claim, the replays of peers' failure
reports (the template's docs/guarantees.md §2) that hold at the storage level, rows that
cannot be read, the audit entries dead letters owe, paused lanes, an operator's cancel, the
schedule-state row, and the worker roster.
"""

from __future__ import annotations

from contracts.work_storage_base import (
    LEASE_S,
    PAST_SHORT_S,
    RACE_ROUNDS,
    SHORT_LEASE_S,
    StorageCases,
)
from contracts.work_storage_cancel import CancelCases
from contracts.work_storage_claim import ClaimCases
from contracts.work_storage_lanes import LaneCases
from contracts.work_storage_order import OrderCases
from contracts.work_storage_roster import RosterCases
from contracts.work_storage_rows import RowCases
from contracts.work_storage_schedules import ScheduleCases
from contracts.work_storage_sweep import SweepCases

__all__ = [
    "LEASE_S",
    "PAST_SHORT_S",
    "RACE_ROUNDS",
    "SHORT_LEASE_S",
    "StorageCases",
    "WorkStorageContract",
]


class WorkStorageContract(
    ClaimCases,
    OrderCases,
    SweepCases,
    RowCases,
    LaneCases,
    CancelCases,
    ScheduleCases,
    RosterCases,
):
    """The cases every work storage passes; subclasses provide `storage` and `advance`."""
