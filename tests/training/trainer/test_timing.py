"""The benchmarks' paired ratio (`training.trainer.timing`): two cases timed in the same rounds, paired by round."""

import math

import pytest
from scipy import stats

from training.trainer.timing import paired_ratio, ratio_text


def test_a_case_twice_as_slow_in_every_round_is_twice_as_slow_whatever_the_drift():
    ratio, low, high = paired_ratio([2.0, 4.0, 3.0], [1.0, 2.0, 1.5])
    assert ratio == pytest.approx(2.0) and low == pytest.approx(2.0) and high == pytest.approx(2.0)
    assert ratio_text((ratio, low, high)) == "2.000 [2.000, 2.000]" and ratio_text(None) == "-"
    assert paired_ratio([1.0], [1.0]) is None


def test_the_interval_is_the_paired_t_interval_of_the_log_ratios():
    ratio, low, high = paired_ratio([1.1, 0.9, 1.0, 1.2], [1.0, 1.0, 1.0, 1.0])
    logs = [math.log(value) for value in (1.1, 0.9, 1.0, 1.2)]
    interval = stats.t.interval(0.95, len(logs) - 1, loc=sum(logs) / 4, scale=stats.sem(logs))
    assert ratio == pytest.approx((1.1 * 0.9 * 1.2) ** 0.25)
    assert (low, high) == pytest.approx(tuple(math.exp(bound) for bound in interval))
