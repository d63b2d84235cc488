"""`make bench-scale`'s upgrade and reads phases (`bench/upgrade.py`, `bench/reads.py`): what
they read off a run — the longest stall of completions across a revision, the revisions
still to apply, which of them shipped before the safe-revision rule, a read's bound."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import scale_cluster  # noqa: F401  (puts scripts/ on the path upgrade imports from)
from upgrade import frozen, lock_timed_out, longest_gap, pending_revisions  # bench/ is no package


def test_the_longest_gap_spans_the_last_completion_before_and_the_first_after() -> None:
    completions = [0.0, 1.0, 2.0, 9.0, 9.5, 20.0]

    assert longest_gap(completions, 3.0, 8.0) == 7.0  # 2.0 to 9.0: the stall across it
    assert longest_gap(completions, 9.1, 9.2) == 0.5
    assert longest_gap(completions, 9.6, 10.0) == 10.5  # nothing after until 20.0
    assert longest_gap([], 5.0, 7.5) == 2.5


def test_pending_revisions_follow_the_chain_from_the_applied_one(tmp_path: Path) -> None:
    versions = tmp_path / "om/migrations/versions/queue"
    versions.mkdir(parents=True)
    for revision, down in (("1_b", "1_a"), ("1_c", "1_b"), ("1_a", "0")):
        (versions / f"{revision}.py").write_text(
            f'revision = "{revision}"\ndown_revision = "{down}"\n\n'
            f'run_sql_file("queue/1_work_items_{revision[2:]}.up.sql")\n'
        )

    assert pending_revisions(tmp_path, "1_a") == [
        ("1_b", "work_items_b.up.sql"),
        ("1_c", "work_items_c.up.sql"),
    ]


def test_only_a_lock_timeout_makes_a_failed_revision_run_again() -> None:
    timed_out = (
        "asyncpg.exceptions.LockNotAvailableError: canceling statement due to lock timeout\n"
        "[SQL: ALTER TABLE work_items ADD CONSTRAINT ck_work_items_status_v2 ...]"
    )
    assert lock_timed_out(timed_out)
    assert lock_timed_out("ERROR:  canceling statement due to lock timeout")
    assert not lock_timed_out(
        "asyncpg.exceptions.QueryCanceledError: canceling statement due to statement timeout"
    )
    assert not lock_timed_out("sqlalchemy.exc.ProgrammingError: relation does not exist")


def test_only_the_revisions_shipped_before_the_rule_are_frozen() -> None:
    assert frozen("work_items_claim_paths.up.sql")
    assert frozen("work_items.up.sql")
    assert not frozen("work_items_priority.up.sql")
    assert not frozen("work_items_vacuum.up.sql")


def test_a_read_fails_its_bound_past_twice_its_time_on_the_small_history() -> None:
    from reads import reads_verdicts

    record = {
        "small_history": 1_000,
        "big_history": 1_000_000,
        "small": {"dead letters": 1.0, "one item": 0.5, "counts": 0.0},
        "big": {"dead letters": 2.0, "one item": 1.1, "counts": 0.4},
    }

    checks = {c["name"].split("`")[1]: (c["value"], c["ok"]) for c in reads_verdicts(record)}

    assert checks == {
        "dead letters": (2.0, True),
        "one item": (2.2, False),
        "counts": (None, False),  # no time at the small history: nothing to compare
    }
