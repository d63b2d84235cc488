"""`make bench-scale`'s alarm evaluation (`bench/churn.py`): CloudWatch's rules over the
worker's recorded `queue stats` lines. The shipped alarms against it: tests/test_deployment.py."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from churn import Alarm, first_alarm_at  # bench/ is no package


def test_an_alarm_fires_at_the_end_of_the_first_period_whose_window_breaches() -> None:
    """Periods aligned to multiples of `period_s`, the Maximum in each; 2 of 3 breaching."""
    alarm = Alarm("x", threshold=10, period_s=60, evaluation_periods=3, datapoints_to_alarm=2)
    samples = [(float(t), 20.0 if 130 <= t <= 250 else 0.0) for t in range(0, 600, 30)]

    assert first_alarm_at(samples, alarm) == 240.0  # periods [120, 180) and [180, 240)


def test_periods_without_data_do_not_breach() -> None:
    alarm = Alarm("x", threshold=10, period_s=60, evaluation_periods=3, datapoints_to_alarm=2)
    samples = [(0.0, 20.0), (300.0, 20.0), (330.0, 0.0)]

    assert first_alarm_at(samples, alarm) is None
    assert first_alarm_at([], alarm) is None
