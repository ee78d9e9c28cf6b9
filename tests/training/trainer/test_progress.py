"""The time left that long tools print: the rate so far over what remains, in words of the estimate's size."""

import pytest

from training.trainer.progress import duration_text, eta_text, remaining_seconds


def test_the_time_left_is_the_rate_so_far_over_what_remains():
    assert remaining_seconds(elapsed=60, done=2, total=10) == 240
    assert remaining_seconds(elapsed=60, done=10, total=10) == 0
    assert remaining_seconds(elapsed=60, done=0, total=10) is None  # nothing done yet: no rate to go by


@pytest.mark.parametrize(
    "seconds, text",
    [
        (42, "42 s"),
        (89.6, "90 s"),
        (600, "10 min"),
        (3500, "58 min"),
        (3599, "1 h 00 min"),
        (3600, "1 h 00 min"),
        (11100, "3 h 05 min"),
    ],
)
def test_durations_read_as_precisely_as_an_estimate_deserves(seconds, text):
    assert duration_text(seconds) == text


def test_eta_text():
    assert eta_text(120, 1, 4) == "ETA 6 min" and eta_text(5, 0, 4) == "ETA unknown"
