"""The queue's hot statements on PostgreSQL, each written once as text over its parameters'
placeholders (`Statement`): numbered (`$1`) for asyncpg on a held connection, where each is
prepared once per connection and never compiled again, and named (`:name`) for SQLAlchemy
in a funnel session. The enqueue's insert and its read of the rows it skipped, the bulk
enqueue, the claim, the completion and the dead letter of an unreadable row; each write
after the insert is fenced on the claim token in its own WHERE clause (docs/decisions/0005,
0021). The contract suite runs every case on both paths.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any
from uuid import UUID

from sqlalchemy import ColumnElement, TextClause, TextualSelect, text

from acme.om.types import EMPTY_UUID
from acme.om.work.storage import NewItems
from acme.om.work.storage.impl.sql import unreadable_error
from acme.om.work.storage.tables.work_items import claim_rank_sql, work_items
from acme.om.work.types.work_item import UnreadableRow, WorkItem, WorkKind, WorkStatus

t = work_items


@dataclass(frozen=True, eq=False)
class Statement:
    """One statement in both bind styles: `numbered` for asyncpg (`$1`, ...), `named` for
    SQLAlchemy (`:name`, its result typed as the table's columns it returns), and its
    parameters' `names` in order."""

    names: tuple[str, ...]
    numbered: str
    named: TextClause | TextualSelect

    def params(self, values: Sequence[Any]) -> dict[str, Any]:
        """`values`, in `names` order, as the named form's parameters."""
        return dict(zip(self.names, values, strict=True))


def statement(
    write: Callable[[Sequence[str]], str],
    names: Sequence[str],
    returns: Sequence[ColumnElement[Any]] = (),
) -> Statement:
    """The statement `write` writes over the placeholders of `names` (one per name, in
    order), in both bind styles; `returns` types the named form's result columns."""
    named = text(write([f":{name}" for name in names]))
    return Statement(
        tuple(names),
        write([f"${n}" for n in range(1, len(names) + 1)]),
        named.columns(*returns) if returns else named,
    )


# Every column an enqueue writes but `org_id` (bound once, not per row), with its PostgreSQL
# type, as the unnest insert binds them; `delay` is not a column: the database adds it to its
# clock for `available_at`.
_ARRAY_COLUMNS = {
    "id": "uuid",
    "kind": "text",
    "lane": "text",
    "payload": "text",
    "status": "text",
    "attempts": "integer",
    "max_attempts": "integer",
    "delay": "float8",
    "claimed_by": "text",
    "claim_token": "uuid",
    "claimed_at": "timestamptz",
    "lease_expires_at": "timestamptz",
    "last_error": "text",
    "note": "text",
    "idempotency_key": "text",
    "request_id": "uuid",
    "traceparent": "text",
    "completed_at": "timestamptz",
    "created_at": "timestamptz",
    "updated_at": "timestamptz",
    "created_by": "uuid",
    "updated_by": "uuid",
    "deleted_at": "timestamptz",
    "priority": "smallint",
}

# What a fresh item (`fresh`: every enqueue through the manager) leaves to the statement:
# the columns an item that never ran holds, written as SQL (over the row's other columns,
# named in braces), so the insert binds 12 columns instead of 24 (each costs its encoding
# in the driver, and an array its unnest in the server, a single enqueue as much as a batch).
_FRESH_FIXED = {
    "status": f"'{WorkStatus.AVAILABLE.value}'",
    "attempts": "0",
    "updated_at": "{created_at}",
    "updated_by": "{created_by}",
}
_FRESH_COLUMNS = {
    name: _ARRAY_COLUMNS[name]
    for name in (
        "id",
        "kind",
        "lane",
        "payload",
        "max_attempts",
        "delay",
        "idempotency_key",
        "request_id",
        "traceparent",
        "created_at",
        "created_by",
        "priority",
    )
}


def fresh(item: WorkItem) -> bool:
    """Whether `item` holds what an item that never ran holds (available, no attempt spent,
    no claim, no error or note, never completed nor deleted, last changed when and by whom
    it was created): the insert then writes those columns in SQL (`_FRESH_FIXED`)."""
    return (
        item.status is WorkStatus.AVAILABLE
        and item.attempts == 0
        and item.claimed_by is None
        and item.claim_token is None
        and item.claimed_at is None
        and item.lease_expires_at is None
        and item.last_error is None
        and item.note is None
        and item.completed_at is None
        and item.deleted_at is None
        and item.updated_at == item.created_at
        and item.updated_by == item.created_by
    )


@dataclass(frozen=True, eq=False)
class InsertForm:
    """One shape of the enqueue's insert: `bound` columns (name to PostgreSQL type) are
    parameters, `fixed` columns SQL over the bound ones (`{name}`). The insert binds one
    array per bound column and unnests them (`INSERT ... SELECT FROM unnest`: one prepared
    statement whatever the batch holds, as pgqueuer enqueues), or, for one item, one value
    per column (`INSERT ... VALUES`: nothing to build into arrays and unnest)."""

    bound: dict[str, str]
    fixed: dict[str, str]

    def sql(self, params: Sequence[str], *, one: bool = False) -> str:
        """The insert, `params[0]` the tenant's parameter (`$1`, or `:org_id` for
        SQLAlchemy) and `params[n]` the n-th bound column's (its array's, or with `one`
        its value's): duplicates (an id or an idempotency key already stored) are skipped,
        and each inserted row's `available_at` is the database's clock plus its `delay` in
        seconds."""
        names = list(self.bound)
        typed = zip(names, params[1:], self.bound.values(), strict=True)
        if one:
            source = {name: f"CAST({param} AS {sql_type})" for name, param, sql_type in typed}
        else:
            source = {name: f"u.{name}" for name in names}
        written = {"org_id": f"CAST({params[0]} AS uuid)"}
        written.update(
            (name, f"CAST({source[name]} AS jsonb)" if name == "payload" else source[name])
            for name in names
            if name != "delay"
        )
        written.update((name, sql.format_map(source)) for name, sql in self.fixed.items())
        delay = source["delay"]
        written["available_at"] = f"statement_timestamp() + make_interval(secs => {delay})"
        head = f"INSERT INTO work_items ({', '.join(written)}) "
        tail = " ON CONFLICT DO NOTHING RETURNING id, available_at"
        if one:
            return f"{head}VALUES ({', '.join(written.values())}){tail}"
        arrays = ", ".join(
            f"CAST({param} AS {sql_type}[])"
            for param, sql_type in zip(params[1:], self.bound.values(), strict=True)
        )
        return (
            f"{head}SELECT {', '.join(written.values())} "
            f"FROM unnest({arrays}) AS u({', '.join(names)}){tail}"
        )

    def values(self, org_id: UUID, items: Sequence[WorkItem], *, one: bool = False) -> list[Any]:
        """The insert's parameters: `org_id`, then per bound column the list of the items'
        values, or with `one` the value of `items[0]`, in order."""
        if one:
            (item,) = items
            return [org_id, *(_bound_value(item, name) for name in self.bound)]
        return [org_id, *([_bound_value(item, name) for item in items] for name in self.bound)]


def _bound_value(item: WorkItem, name: str) -> Any:
    """Column `name` of `item` as the insert binds it (the payload as JSON text)."""
    if name == "payload":
        return json.dumps(item.payload)
    if name == "status":
        return item.status.value
    return getattr(item, name)


FULL_INSERT = InsertForm(_ARRAY_COLUMNS, {})
FRESH_INSERT = InsertForm(_FRESH_COLUMNS, _FRESH_FIXED)


def insert_form(items: Sequence[WorkItem]) -> InsertForm:
    """The narrower insert when every item is fresh (`fresh`), else the full one."""
    return FRESH_INSERT if all(fresh(item) for item in items) else FULL_INSERT


# The bulk enqueue's parameters (`NewItems`), in order: one value each for the whole batch,
# then the two arrays (ids, payloads as JSON text).
_NEW_PARAMS = {
    "org_id": "uuid",
    "kind": "text",
    "lane": "text",
    "max_attempts": "integer",
    "request_id": "uuid",
    "traceparent": "text",
    "created_at": "timestamptz",
    "actor": "uuid",
    "delay": "float8",
    "ids": "uuid[]",
    "payloads": "text[]",
    "priority": "smallint",
}


def _new_sql(params: Sequence[str]) -> str:
    """The bulk enqueue's insert, `params[n]` the parameter of the n-th `_NEW_PARAMS` entry:
    what the batch shares is bound once, only the ids and the payloads per row."""
    p = {
        name: f"CAST({param} AS {sql_type})"
        for (name, sql_type), param in zip(_NEW_PARAMS.items(), params, strict=True)
    }
    return (
        "INSERT INTO work_items (id, org_id, kind, lane, payload, status, attempts,"
        " max_attempts, request_id, traceparent, created_at, updated_at, created_by,"
        " updated_by, available_at, priority)"
        f" SELECT u.id, {p['org_id']}, {p['kind']}, {p['lane']}, CAST(u.payload AS jsonb),"
        f" '{WorkStatus.AVAILABLE.value}', 0, {p['max_attempts']}, {p['request_id']},"
        f" {p['traceparent']}, {p['created_at']}, {p['created_at']}, {p['actor']},"
        f" {p['actor']}, statement_timestamp() + make_interval(secs => {p['delay']}),"
        f" {p['priority']}"
        f" FROM unnest({p['ids']}, {p['payloads']}) AS u(id, payload)"
        " ON CONFLICT DO NOTHING RETURNING id"
    )


def new_values(org_id: UUID, items: NewItems) -> list[Any]:
    """`items`' parameters for `_new_sql`, in `_NEW_PARAMS` order."""
    return [
        org_id,
        items.kind.value,
        items.lane,
        items.max_attempts,
        items.request_id,
        items.traceparent,
        items.created_at,
        items.actor,
        max(items.delay, 0.0),
        items.ids,
        items.payloads,
        items.priority,
    ]


_COLUMNS = ", ".join(f"work_items.{column.name}" for column in t.c)
_RELEASED = (
    "claimed_by = NULL, claim_token = NULL, claimed_at = NULL, lease_expires_at = NULL,"
    f" updated_at = statement_timestamp(), updated_by = '{EMPTY_UUID}'"
)


def _insert_statement(form: InsertForm, *, one: bool) -> Statement:
    """`form`'s insert (`INSERTS`); parameters `org_id`, then `a_<column>` per bound one."""

    def write(params: Sequence[str]) -> str:
        return form.sql(params, one=one)

    names = ["org_id", *(f"a_{name}" for name in form.bound)]
    return statement(write, names, (t.c.id, t.c.available_at))


# The enqueue's insert, by form and whether it is the one-item (`VALUES`) form.
INSERTS = {
    (form, one): _insert_statement(form, one=one)
    for form in (FULL_INSERT, FRESH_INSERT)
    for one in (False, True)
}

# The bulk enqueue (`new_values`).
NEW = statement(_new_sql, list(_NEW_PARAMS))


def _holders_sql(p: Sequence[str]) -> str:
    """The stored rows of tenant `p[0]` holding the ids (`p[1]`) or idempotency keys
    (`p[2]`) of items the insert skipped."""
    return (
        f"SELECT {_COLUMNS} FROM work_items WHERE org_id = {p[0]}"
        f" AND (id = ANY(CAST({p[1]} AS uuid[])) OR idempotency_key = ANY(CAST({p[2]} AS text[])))"
    )


HOLDERS = statement(_holders_sql, ["org_id", "ids", "keys"], tuple(t.c))


def holders_values(org_id: UUID, missing: Sequence[WorkItem]) -> list[Any]:
    """`HOLDERS`' parameters for the items the insert skipped."""
    keys = [item.idempotency_key for item in missing if item.idempotency_key is not None]
    return [org_id, [item.id for item in missing], keys]


def _available(alias: str, lane: str, kinds: Sequence[str]) -> str:
    """The claim index's predicate and leading columns for `alias`'s rows of `lane` and
    `kinds` (for one kind `kind = ...`, an index condition read in the index's order; for
    several `kind IN (...)`)."""
    kind = f"= {kinds[0]}" if len(kinds) == 1 else f"IN ({', '.join(kinds)})"
    return (
        f"{alias}.status = '{WorkStatus.AVAILABLE.value}' AND {alias}.lane = {lane}"
        f" AND {alias}.kind {kind}"
    )


def _due(alias: str) -> str:
    """The claim's filter beyond its index: `alias`'s row is due now, not discarded, and
    has an attempt left (`rules.is_claimable`)."""
    return (
        f"{alias}.available_at <= statement_timestamp() AND {alias}.deleted_at IS NULL"
        f" AND {alias}.attempts < {alias}.max_attempts"
    )


def _args(lane: str, kinds: Sequence[str], after: str | None = None) -> tuple[str, str, list[str]]:
    """A claim's CTE `args` of its lane, kinds (and tenant id `after`) as one row, with
    the references to them: `(CTE, lane, kinds)`. Read through an init plan, a value is
    unknown to the planner whether bound or not, so the cached generic plan costs what a
    custom one does and PostgreSQL keeps it (docs/decisions/0053)."""
    columns = [f"CAST({lane} AS text) AS lane"]
    columns += [f"CAST({kind} AS text) AS kind_{n}" for n, kind in enumerate(kinds)]
    if after is not None:
        columns.append(f"CAST({after} AS uuid) AS after")
    refs = [f"(SELECT kind_{n} FROM args)" for n in range(len(kinds))]
    return f"args AS MATERIALIZED (SELECT {', '.join(columns)})", "(SELECT lane FROM args)", refs


TENANT_WINDOW = 32
"""How many tenants with available items one claim considers at most, per kind, unless it
has more slots (a window from a random tenant id on): a claim's skip scan costs one index
probe per tenant, so its cost stays bounded with thousands of tenants (docs/decisions/0037)."""


@cache
def claim_statement(kinds: int, limit: int) -> Statement:
    """The claim of at most `limit` items of `kinds` kinds, one parameter each (values:
    `claim_values`), read from `ix_work_items_claim_order`: tenants share first, priority
    orders within a tenant (docs/decisions/0037). Raises `ValueError` for `limit` < 1.

    Per kind, a skip scan lists up to `TENANT_WINDOW` (or `limit`) due tenants from a
    random tenant id on; each takes up to `ceil(limit / tenants)` items in claim order,
    SKIP LOCKED, and the slots left go to their next items (`_turns`). The UPDATE claims
    them by primary key under a fresh token for `lease_s` seconds; a paused lane's guard
    is checked once (docs/decisions/0040). `limit` is written into the text, not bound,
    so the cached generic plan is the custom one (docs/decisions/0053)."""
    if limit < 1:
        raise ValueError(f"a claim takes at least one item, not {limit}")
    names = ["lane", "worker_id", "lease_s", *(f"kind_{n}" for n in range(kinds))]

    def write(p: Sequence[str]) -> str:
        lane_value, worker_id, lease_s, *kind_values = p
        args, lane, listed = _args(lane_value, kind_values)
        window = max(TENANT_WINDOW, limit)
        scans, windows = [], []
        for n, kind in enumerate(listed):
            first = f"SELECT w.org_id FROM work_items w WHERE {_available('w', lane, [kind])}"
            step = f"({first} AND w.org_id > t.org_id"
            # The tenant's rank after its id: an order only the claim index gives, so no
            # plan walks another index by `org_id` through the history.
            probe = f"ORDER BY w.org_id, {claim_rank_sql('w.available_at', 'w.priority')} LIMIT 1"
            # From the start up, then from the lowest id up to the start: each probe bounded,
            # so no tenant's front (the dead entries churn leaves) is read twice.
            below = " AND w.org_id < (SELECT org_id FROM start)"
            for name, start, bound in (
                (f"up_{n}", " AND w.org_id >= (SELECT org_id FROM start)", ""),
                (f"wrap_{n}", below, below),
            ):
                base = first.replace("SELECT w.org_id", "SELECT w.org_id, 1", 1)
                scans.append(
                    f"{name}(org_id, seen) AS (({base}{start} {probe})"
                    f" UNION ALL SELECT {step}{bound} {probe}), t.seen + 1"
                    f" FROM {name} t WHERE t.org_id IS NOT NULL AND t.seen < {window})"
                )
            windows.append(
                f"(SELECT org_id FROM up_{n} WHERE org_id IS NOT NULL UNION ALL"
                f" SELECT org_id FROM wrap_{n} WHERE org_id IS NOT NULL"
                f" LIMIT {window})"
            )
        found = " UNION ".join(windows)
        # The slots the shares left, to the tenants' next items: read only when they did.
        more = _turns(lane, listed, f"LIMIT {limit}", " AND w.id NOT IN (SELECT id FROM shared)")
        return (
            f"WITH RECURSIVE {args}, start AS MATERIALIZED (SELECT gen_random_uuid() AS org_id),"
            f" {', '.join(scans)},"
            f" tenants AS MATERIALIZED (SELECT org_id FROM ({found}) AS found"
            f" WHERE NOT EXISTS (SELECT 1 FROM work_lane_pauses WHERE lane = {lane})),"
            f" share AS (SELECT CAST(ceil(CAST({limit} AS float8) / greatest(count(*), 1))"
            " AS integer) AS per_tenant FROM tenants),"
            " due AS MATERIALIZED (SELECT org_id FROM tenants ORDER BY random()),"
            f" shared AS MATERIALIZED ({_turns(lane, listed, 'LIMIT share.per_tenant')}"
            f" LIMIT {limit}),"
            f" picked AS (SELECT id FROM (SELECT id FROM shared UNION ALL {more}) AS turns"
            f" LIMIT {limit}) {_claim_picked(worker_id, lease_s)}"
        )

    return statement(write, names, tuple(t.c))


def _claim_picked(worker_id: str, lease_s: float | str) -> str:
    """The claim's UPDATE of the rows its CTE `picked` lists, by primary key, for
    `worker_id`: an attempt spent, a fresh token, a lease of `lease_s` seconds."""
    return (
        f"UPDATE work_items SET status = '{WorkStatus.CLAIMED.value}',"
        f" attempts = work_items.attempts + 1, claimed_by = {worker_id},"
        " claim_token = gen_random_uuid(), claimed_at = statement_timestamp(),"
        f" lease_expires_at = statement_timestamp() + make_interval(secs => {lease_s}),"
        f" note = NULL, updated_at = statement_timestamp(), updated_by = '{EMPTY_UUID}'"
        f" WHERE work_items.id = ANY(ARRAY(SELECT id FROM picked)) RETURNING {_COLUMNS}"
    )


@cache
def claim_one_statement(kinds: int) -> Statement:
    """The claim of one item of `kinds` kinds (values: `claim_for`): the first due
    item, in claim order, of the first due tenant after tenant id `after`, wrapping round,
    so one-slot claims that pass each the tenant the last one took serve the due tenants
    in turn (docs/decisions/0056). One index descent per kind, two when it wraps; SKIP
    LOCKED; a paused lane's guard checked once."""
    names = ["lane", "worker_id", "lease_s", "after", *(f"kind_{n}" for n in range(kinds))]

    def write(p: Sequence[str]) -> str:
        lane_value, worker_id, lease_s, after, *kind_values = p
        args, lane, listed = _args(lane_value, kind_values, after)
        rank = claim_rank_sql("w.available_at", "w.priority")
        laps = []
        for lap, side in enumerate((">", "<=")):
            firsts = [
                f"SELECT * FROM (SELECT w.id, w.org_id, {rank} AS rank FROM work_items w"
                f" WHERE {_available('w', lane, [kind])}"
                f" AND w.org_id {side} (SELECT after FROM args) AND {_due('w')}"
                f" ORDER BY w.org_id, {rank}, w.id LIMIT 1 FOR UPDATE SKIP LOCKED) AS k{n}"
                for n, kind in enumerate(listed)
            ]
            # Of several kinds, the first tenant's first: each kind's is read in index order.
            order = " ORDER BY org_id, rank, id LIMIT 1" if len(firsts) > 1 else ""
            laps.append(f"(SELECT id FROM ({' UNION ALL '.join(firsts)}) AS lap_{lap}{order})")
        return (
            f"WITH {args},"
            f" picked AS (SELECT id FROM ({' UNION ALL '.join(laps)}) AS laps"
            f" WHERE NOT EXISTS (SELECT 1 FROM work_lane_pauses WHERE lane = {lane}) LIMIT 1)"
            f" {_claim_picked(worker_id, lease_s)}"
        )

    return statement(write, names, tuple(t.c))


def _turns(lane: str, kinds: Sequence[str], bound: str, exclude: str = "") -> str:
    """The claim's rows of each due tenant (`due`, in its random order), at most `bound`
    (`LIMIT`, `share.per_tenant` its share) of each in its claim order, `exclude` added to
    their filter, locked with SKIP LOCKED as they are read."""
    rank = claim_rank_sql("w.available_at", "w.priority")
    return (
        "SELECT taken.id FROM share CROSS JOIN due CROSS JOIN LATERAL"
        f" (SELECT w.id FROM work_items w WHERE {_available('w', lane, kinds)}"
        f" AND w.org_id = due.org_id AND {_due('w')}{exclude}"
        f" ORDER BY {rank}, w.id {bound} FOR UPDATE SKIP LOCKED) AS taken"
    )


def claim_values(lane: str, kinds: Sequence[WorkKind], worker_id: str, lease_s: float) -> list[Any]:
    """`claim_statement(len(kinds), limit)`'s parameters."""
    return [lane, worker_id, lease_s, *(kind.value for kind in kinds)]


def claim_for(
    lane: str, kinds: Sequence[WorkKind], worker_id: str, lease_s: float, limit: int, after: UUID
) -> tuple[Statement, list[Any]]:
    """The claim of up to `limit` items of `kinds` on `lane` and its values: of one slot
    `claim_one_statement` (the first due tenant after tenant id `after`), else
    `claim_statement`."""
    if limit == 1:
        values = [lane, worker_id, lease_s, after, *(kind.value for kind in kinds)]
        return claim_one_statement(len(kinds)), values
    return claim_statement(len(kinds), limit), claim_values(lane, kinds, worker_id, lease_s)


def _complete_sql(p: Sequence[str]) -> str:
    """The completion of rows of any tenants, each fenced on its tenant and its own token:
    the tenants (`p[0]`), ids (`p[1]`) and tokens (`p[2]`) as arrays, joined by position;
    run under the system scope, as the claim (docs/decisions/0054)."""
    return (
        f"UPDATE work_items SET status = '{WorkStatus.COMPLETED.value}', {_RELEASED},"
        " completed_at = statement_timestamp()"
        f" FROM unnest(CAST({p[0]} AS uuid[]), CAST({p[1]} AS uuid[]), CAST({p[2]} AS uuid[]))"
        " AS claims(org_id, id, claim_token)"
        " WHERE work_items.id = claims.id AND work_items.claim_token = claims.claim_token"
        " AND work_items.org_id = claims.org_id"
        f" AND work_items.status = '{WorkStatus.CLAIMED.value}'"
        " AND work_items.lease_expires_at > statement_timestamp()"
        " RETURNING work_items.id"
    )


COMPLETE = statement(_complete_sql, ["org_ids", "ids", "tokens"], (t.c.id,))


# The fewest triples `COMPLETE` is given: PostgreSQL prices its cached generic plan for
# arrays of ten, so a shorter batch would be planned afresh at every bind, as a custom plan
# priced for fewer (docs/decisions/0054). The padding is NULL, which no row matches.
_COMPLETE_PADDED_TO = 10


def complete_values(claims: Sequence[tuple[UUID, UUID, UUID]]) -> list[Any]:
    """`COMPLETE`'s parameters for `(tenant id, item id, claim token)` triples, padded
    with NULL triples to `_COMPLETE_PADDED_TO`."""
    padding: list[None] = [None] * max(0, _COMPLETE_PADDED_TO - len(claims))
    return [
        [org_id for org_id, _, _ in claims] + padding,
        [i for _, i, _ in claims] + padding,
        [k for *_, k in claims] + padding,
    ]


def _unreadable_sql(p: Sequence[str]) -> str:
    """The dead letter of claimed row `p[0]` of tenant `p[1]` that cannot be read, fenced on
    the claim's token `p[2]` (recorded as the audit entry it owes), with error `p[3]`."""
    item_id, org_id, token, error = p
    return (
        f"UPDATE work_items SET status = '{WorkStatus.FAILED.value}', {_RELEASED},"
        f" last_error = {error}, audit_owed_token = {token}, audit_owed_reason = 'unreadable'"
        f" WHERE id = {item_id} AND org_id = {org_id} AND claim_token = {token}"
        f" AND status = '{WorkStatus.CLAIMED.value}' AND lease_expires_at > statement_timestamp()"
        f" RETURNING {_COLUMNS}"
    )


UNREADABLE_DEAD_LETTER = statement(_unreadable_sql, ["id", "org_id", "token", "error"], tuple(t.c))


def unreadable_values(row: UnreadableRow) -> list[Any]:
    """`UNREADABLE_DEAD_LETTER`'s parameters for `row`."""
    return [row.id, row.org_id, row.values.get("claim_token"), unreadable_error(row)]
