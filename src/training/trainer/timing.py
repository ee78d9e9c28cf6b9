"""Two cases timed in the same rounds, compared: the paired ratio with its interval, as every speed benchmark of
scripts/ reports it (docs/THROUGHPUT.md: a target is a ratio against a baseline measured in the same run).

Timing both cases in each round and pairing them by round removes the drift both met in it (other work on a
shared machine, the CPU's clock), which a ratio of two medians keeps.
"""

from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence, Tuple

# A spread of the log-ratios at most this x max(1, |log-ratio|) is none (float rounding): the ratio is its own
# interval.
NO_SPREAD = 1e-9


def paired_ratio(
    ours: Sequence[float], theirs: Sequence[float], confidence: float = 0.95
) -> Optional[Tuple[float, float, float]]:
    """The geometric mean of `ours[i] / theirs[i]` over paired measurements (two cases timed in the same round of
    a benchmark) with its interval at `confidence` (a paired t interval on the logarithms); None with fewer than 2
    pairs; the same ratio in every pair is its own interval."""
    logs = [math.log(a) - math.log(b) for a, b in zip(ours, theirs)]
    if len(logs) < 2:
        return None
    mean = statistics.fmean(logs)
    spread = statistics.stdev(logs)
    if spread <= NO_SPREAD * max(1.0, max(abs(value) for value in logs)):
        return math.exp(mean), math.exp(mean), math.exp(mean)
    from scipy import stats

    low, high = stats.ttest_1samp(logs, 0.0).confidence_interval(confidence)
    return math.exp(mean), math.exp(float(low)), math.exp(float(high))


def ratio_text(ratio: Optional[Tuple[float, float, float]]) -> str:
    """A `paired_ratio` as "1.012 [0.964, 1.063]"; "-" for None."""
    return "-" if ratio is None else f"{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}]"
