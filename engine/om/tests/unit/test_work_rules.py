"""The queue's pure rules (`work/rules.py`): backoff, exhaustion, hand-back, stagger, NUL,
stranded items."""

from __future__ import annotations

import random

import pytest

from acme.om.work.rules import (
    handed_back_attempts,
    is_exhausted,
    is_stranded,
    nul_path,
    policy_lane,
    retry_delay,
    stagger,
    storable_text,
    stranded,
)
from acme.om.work.types.policy import KindPolicy
from acme.om.work.types.work_item import LaneStats, WorkKind, WorkStatus


def test_retry_delay_doubles_from_the_base_without_jitter() -> None:
    delays = [retry_delay(n, jitter=0.0) for n in range(1, 6)]
    assert delays == [2.0, 4.0, 8.0, 16.0, 32.0]


def test_retry_delay_is_capped_even_for_huge_attempt_counts() -> None:
    assert retry_delay(10, jitter=0.0) == 600.0
    assert retry_delay(10_000, jitter=0.5, rng=random.Random(1)) <= 600.0


def test_retry_delay_jitter_stays_within_its_fraction() -> None:
    rng = random.Random(7)
    delays = {retry_delay(3, jitter=0.1, rng=rng) for _ in range(200)}
    assert all(7.2 <= d <= 8.8 for d in delays)
    assert len(delays) > 100, "jitter spreads items that failed together"


def test_retry_delay_refuses_negative_input() -> None:
    with pytest.raises(ValueError, match="negative"):
        retry_delay(-1)


def test_the_failure_at_max_attempts_is_final() -> None:
    assert not is_exhausted(4, 5)
    assert is_exhausted(5, 5)
    assert handed_back_attempts(1) == 0
    assert handed_back_attempts(0) == 0


def test_stagger_is_stable_per_key_and_within_the_interval() -> None:
    offsets = [stagger(f"worker-{n}", 30.0) for n in range(50)]
    assert all(0.0 <= o < 30.0 for o in offsets)
    assert offsets == [stagger(f"worker-{n}", 30.0) for n in range(50)]
    assert len({round(o, 3) for o in offsets}) > 40, "replicas spread over the interval"
    assert stagger("worker-0", 0.0) == 0.0


def test_nul_path_names_where_the_first_nul_character_stands() -> None:
    assert nul_path({"a": [1, "ok", {"b": "x\x00"}]}, "payload") == "payload.a.2.b"
    assert nul_path({"k\x00": 1}, "payload") == "payload.k\\x00"
    assert nul_path("\x00", "idempotency_key") == "idempotency_key"
    assert nul_path({"a": ["ok", 2, None, 1.5]}, "payload") is None
    assert nul_path(None, "idempotency_key") is None


def test_storable_text_escapes_only_what_postgresql_cannot_hold() -> None:
    assert storable_text("a\x00b\x00") == "a\\x00b\\x00"
    assert storable_text("bad\ud800x") == "bad\\ud800x"  # a lone surrogate is not UTF-8
    assert storable_text("été \U0001f600 \x1b") == "été \U0001f600 \x1b"
    assert storable_text("plain") == "plain"


def test_an_item_is_stranded_off_its_policy_lane_or_of_a_kind_no_workkind_names() -> None:
    kind = next(iter(WorkKind))
    policies = {kind: KindPolicy(lane="bulk")}
    assert policy_lane(kind.value, policies) == "bulk"
    assert policy_lane("NO_SUCH_KIND", policies) is None
    assert not is_stranded(kind.value, "bulk", policies)
    assert is_stranded(kind.value, "default", policies)  # the lane changed at an update
    assert is_stranded("NO_SUCH_KIND", "bulk", policies)
    assert policy_lane(kind.value, {}) == "default"  # no policy: `KindPolicy()`'s lane


def test_stranded_counts_only_waiting_items_per_kind_and_lane() -> None:
    kind = next(iter(WorkKind)).value
    policies = {WorkKind(kind): KindPolicy(lane="bulk")}
    stats = [
        LaneStats(lane="bulk", kind=kind, status=WorkStatus.AVAILABLE, count=4),
        LaneStats(lane="default", kind=kind, status=WorkStatus.AVAILABLE, count=2),
        LaneStats(lane="default", kind=kind, status=WorkStatus.CLAIMED, count=1),
        LaneStats(lane="bulk", kind="BOGUS_KIND", status=WorkStatus.AVAILABLE, count=1),
        LaneStats(lane="bulk", kind="BOGUS_KIND", status=WorkStatus.FAILED, count=3),
    ]
    assert stranded(stats, policies) == {(kind, "default"): 2, ("BOGUS_KIND", "bulk"): 1}
    assert stranded(stats[:1], policies) == {}
