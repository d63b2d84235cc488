"""The queue's pure arithmetic.

The manager calls these before or after a storage statement: `is_exhausted` decides
whether a failure requeues or dead-letters, `retry_delay` sets the next `available_at`,
`handed_back_attempts` gives an attempt back on release and defer. Two rules a statement
must evaluate itself are spelled once more here, named as such, and the storage contract
holds every implementation to them: `is_stale` (the filter of `requeue_stale`) and
`is_claimable` (the filter of `claim_next`). The memory storage calls them directly.
`is_stranded` names the waiting items no worker will claim (`stranded` counts them).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime

from acme.om.errors import Invalid
from acme.om.work.types.lanes import WorkerBeat
from acme.om.work.types.policy import KindPolicy
from acme.om.work.types.work_item import (
    WORK_POLICIES,
    LaneStats,
    WorkItem,
    WorkKind,
    WorkStatus,
)


def retry_delay(
    attempts: int,
    *,
    base: float = 2.0,
    factor: float = 2.0,
    cap: float = 600.0,
    jitter: float = 0.1,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before the next try after `attempts` tries have failed.

    `base * factor ** (attempts - 1)`, capped at `cap`, then spread by up to `jitter`
    (a fraction) either way so items that failed together do not return together;
    the result never exceeds `cap` nor drops below 0. Exponential backoff with
    jitter, as River and Oban do (River's `internal/retrypolicy/default.go`, Oban's
    `lib/oban/backoff.ex`).
    Raises `ValueError` for a negative `attempts`, `base` or `jitter`.
    """
    if attempts < 0 or base < 0 or jitter < 0:
        raise ValueError("attempts, base and jitter must not be negative")
    exponent = max(attempts - 1, 0)
    delay = cap if exponent >= 64 else min(base * factor**exponent, cap)
    spread = (rng or random).uniform(-jitter, jitter) if jitter else 0.0
    return min(max(delay * (1.0 + spread), 0.0), cap)


def is_exhausted(attempts: int, max_attempts: int) -> bool:
    """True when `attempts` spent claims leave none: the failure that follows is final."""
    return attempts >= max_attempts


def handed_back_attempts(attempts: int) -> int:
    """The attempt count after a release or defer: the claim's attempt is given back."""
    return max(attempts - 1, 0)


def stagger(key: str, interval: float) -> float:
    """A stable offset in `[0, interval)` seconds for `key` (a worker id).

    Replicas that start together spread their sweeps and heartbeats over the interval
    instead of hitting the database in step; the same key always gets the same offset.
    """
    if interval <= 0:
        return 0.0
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 * interval


def is_stale(item: WorkItem, before: datetime) -> bool:
    """The stale filter of `requeue_stale`, spelled once more (the statement evaluates it).

    An item is stale when it is claimed and its lease passed strictly before `before`.
    Every storage's sweep statement must select exactly these rows, and its UPDATE
    re-checks the status and the claim token it read (riverqueue/river#1302).
    """
    return (
        item.status is WorkStatus.CLAIMED
        and item.lease_expires_at is not None
        and item.lease_expires_at < before
    )


def is_claimable(item: WorkItem, now: datetime) -> bool:
    """The filter of `claim_next`, spelled once more (the claim statement evaluates it).

    Available, due (`available_at <= now`), not soft-deleted, and with an attempt left:
    the `attempts < max_attempts` guard keeps an item that a crash left out of attempts
    from running again (oban-bg/oban#137 and #652).
    """
    return (
        item.status is WorkStatus.AVAILABLE
        and item.available_at <= now
        and item.deleted_at is None
        and not is_exhausted(item.attempts, item.max_attempts)
    )


NUL = "\x00"
"""U+0000: PostgreSQL's `text` and `jsonb` cannot hold it; SQLite and the memory storage can."""

_NUL_SHOWN = "\\x00"


def nul_path(value: object, path: str = "") -> str | None:
    """Where the first NUL character stands in a JSON value, or None when there is none.

    `value` is what `json.loads` gives (dicts, lists, strings, numbers, None); the answer
    is a dotted path from `path` (`.note`, `.lines.2`, or `path` itself for a string that
    holds one; a key that holds one is named by its text with the NUL shown as `\\x00`).
    The manager refuses such a payload at enqueue (`Invalid`), on every storage alike, so a
    payload that works on the embedded SQLite default works on PostgreSQL too.
    """
    if isinstance(value, str):
        return path if NUL in value else None
    if isinstance(value, dict):
        for key, inner in value.items():
            name = str(key)
            if NUL in name:
                return f"{path}.{name.replace(NUL, _NUL_SHOWN)}"
            found = nul_path(inner, f"{path}.{name}")
            if found is not None:
                return found
    if isinstance(value, list):
        for index, inner in enumerate(value):
            found = nul_path(inner, f"{path}.{index}")
            if found is not None:
                return found
    return None


NUL_REFUSALS = {
    "postgresql": "which PostgreSQL cannot store",
    "sqlite": (
        "refused on SQLite too, so that what works on the embedded database works on "
        "PostgreSQL, which cannot store it"
    ),
    "memory": (
        "refused in memory too, so that what works in tests works on PostgreSQL, "
        "which cannot store it"
    ),
}
"""Why a NUL character is refused, by the backend a storage declares (`backend`): the one
reason that applies there, named in the refusal."""


def refuse_nul(value: object, field: str, backend: str = "postgresql") -> None:
    """Raise `Invalid` naming where in `value` (a JSON value, the field `field`) a NUL
    character stands (`nul_path`) and why on `backend` (`NUL_REFUSALS`); return when
    there is none."""
    where = nul_path(value, field)
    if where is not None:
        reason = NUL_REFUSALS.get(backend, NUL_REFUSALS["postgresql"])
        raise Invalid(f"{where}: holds a NUL character (U+0000), {reason}")


# The longest idempotency key an enqueue accepts, in UTF-8 bytes. The key is indexed with
# its tenant (`ix_work_items_org_id_idempotency_key`), and PostgreSQL refuses a btree entry
# past 2,704 bytes on its default 8 kB pages (docs: "B-Tree Implementation", the limit on
# an index entry's size) unless the key compresses well; below this no key fails there.
MAX_IDEMPOTENCY_KEY_BYTES = 2000


def refuse_long_key(key: str | None) -> None:
    """Raise `Invalid` when `key` (an idempotency key) is longer than
    `MAX_IDEMPOTENCY_KEY_BYTES` in UTF-8; return otherwise."""
    size = 0 if key is None else len(key.encode("utf-8", "surrogatepass"))
    if size > MAX_IDEMPOTENCY_KEY_BYTES:
        raise Invalid(
            f"idempotency_key: {size} bytes in UTF-8, more than the"
            f" {MAX_IDEMPOTENCY_KEY_BYTES} the queue's index can hold"
        )


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable_text(text: str) -> str:
    """`text` with what PostgreSQL's `text` cannot hold escaped: a NUL character as `\\x00`,
    a lone surrogate (not UTF-8) as `\\ud800`. For an error message or a note the runtime
    writes: it is kept as its own text, not refused and not replaced."""
    return _UNSTORABLE.sub(lambda found: found.group().encode("unicode_escape").decode(), text)


LANE_MAX_CHARS = 100
"""The longest lane name, in characters (the wake-up's NOTIFY payload, `<lane> <kind>`,
stays far below PostgreSQL's 8,000 bytes)."""

_LANE = re.compile(r"[a-z][a-z0-9_]*")


def lane_problem(lane: object) -> str | None:
    """Why `lane` cannot name a lane, or None when it can: snake_case (a-z, 0-9 and `_`,
    starting with a letter), at most `LANE_MAX_CHARS` characters. A worker's `LANE` setting
    and every enqueue apply this one rule, so no item lands on a lane no worker can name."""
    if not isinstance(lane, str) or not _LANE.fullmatch(lane):
        return f"must be snake_case (a-z, 0-9, _), got {lane!r:.80}"
    if len(lane) > LANE_MAX_CHARS:
        return f"is {len(lane)} characters, more than {LANE_MAX_CHARS}"
    return None


def refuse_bad_lane(lane: object) -> None:
    """Raise `Invalid` naming `lane` when `lane_problem` finds one; return otherwise."""
    problem = lane_problem(lane)
    if problem is not None:
        raise Invalid(f"lane: {problem}")


def field_path(parts: Iterable[object]) -> str:
    """A validation error's location as a dotted path (`payloads.3.record_id`), a NUL
    character in a part shown as `\\x00` (an error message carries no NUL)."""
    return ".".join(str(part).replace(NUL, _NUL_SHOWN) for part in parts)


def policy_lane(kind: str, policies: Mapping[WorkKind, KindPolicy] = WORK_POLICIES) -> str | None:
    """The lane `kind`'s policy in `policies` names, or None when no `WorkKind` names
    `kind` (a kind without a policy is on `default`, as `KindPolicy()` is)."""
    try:
        known = WorkKind(kind)
    except ValueError:
        return None
    policy = policies.get(known)
    return KindPolicy().lane if policy is None else policy.lane


def known_lanes(also_known: Collection[str] = ()) -> list[str]:
    """The lanes a pause may name, sorted: every `WorkKind`'s lane as its policy names it
    (the kinds module), and `also_known` (docs/decisions/0040)."""
    lanes = {lane for kind in WorkKind if (lane := policy_lane(kind.value)) is not None}
    return sorted(lanes | set(also_known))


def refuse_unknown_lane(lane: str, also_known: Collection[str], *, field: str = "lane") -> None:
    """Raise `Invalid` for a malformed `lane` (`refuse_bad_lane`) or one no worker claims on:
    not in `known_lanes(also_known)` (the kinds module's lanes, docs/decisions/0040)."""
    refuse_bad_lane(lane)
    known = known_lanes(also_known)
    if lane not in known:
        raise Invalid(
            f"{field}: no worker claims on lane {lane}; the known lanes: {', '.join(known)}"
        )


def refuse_unclaimed_lane(
    kind: str, lane: str, workers: Iterable[WorkerBeat], *, field: str = "lane"
) -> None:
    """Raise `Invalid` when an item of `kind` put on `lane` would wait for no worker: `lane`
    is malformed (`refuse_bad_lane`), or it is neither the lane `kind`'s policy names
    (`policy_lane`) nor one a worker alive in `workers` (the roster, docs/decisions/0049)
    claims `kind` on. The refusal names the lanes that would serve it (`is_stranded`, the
    template's docs/operations.md, "Stranded items"); `field` is the answer it blames."""
    refuse_bad_lane(lane)
    home = policy_lane(kind)
    served = {worker.lane for worker in workers if kind in worker.kinds}
    if lane == home or lane in served:
        return
    lanes = sorted(served | ({home} if home is not None else set()))
    raise Invalid(
        f"{field}: no worker claims {kind} on lane {lane}; the lanes that do: "
        + (", ".join(lanes) or "none")
    )


def refuse_bad_move(
    from_lane: str,
    to_lane: str,
    also_known: Collection[str],
    *,
    kind: str | None = None,
    workers: Iterable[WorkerBeat] = (),
) -> None:
    """Raise `Invalid` for a lane move `move_lane` refuses: a malformed `from_lane`, a
    `to_lane` where the items would be stranded, or the same lane twice. Items of one `kind`
    need a lane that kind is claimed on (`refuse_unclaimed_lane` over the roster `workers`);
    items of every kind, a lane some worker claims on (`refuse_unknown_lane`). The CLI's dry
    run asks the same before it lists anything."""
    refuse_bad_lane(from_lane)
    if kind is None:
        refuse_unknown_lane(to_lane, also_known, field="to_lane")
    else:
        refuse_unclaimed_lane(kind, to_lane, workers, field="to_lane")
    if from_lane == to_lane:
        raise Invalid(f"to_lane: the items are on {from_lane} already; name another lane")


def is_stranded(
    kind: str, lane: str, policies: Mapping[WorkKind, KindPolicy] = WORK_POLICIES
) -> bool:
    """Whether an item of `kind` waiting on `lane` is one no worker claims: no `WorkKind`
    names its kind (a removed worker, an older release, a hand-written row), or its lane is
    not the one its kind's policy names (the worker's lane changed at an update, or a caller
    passed another lane). The template's docs/operations.md, "Stranded items".
    """
    return policy_lane(kind, policies) != lane


def stranded(
    stats: Iterable[LaneStats], policies: Mapping[WorkKind, KindPolicy] = WORK_POLICIES
) -> dict[tuple[str, str], int]:
    """The stranded `AVAILABLE` items in `stats` (`queue_stats` groups), counted per
    `(kind, lane)`; only pairs with at least one item, in `stats`' order."""
    found: dict[tuple[str, str], int] = {}
    for row in stats:
        waiting = row.status == WorkStatus.AVAILABLE and row.count > 0
        if waiting and is_stranded(row.kind, row.lane, policies):
            found[row.kind, row.lane] = found.get((row.kind, row.lane), 0) + row.count
    return found
