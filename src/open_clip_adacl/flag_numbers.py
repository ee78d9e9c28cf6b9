"""The numbers a flag may carry: finite floats, integers within 64 bits. One check for every command line that
takes numbers (the trainer's flags, the loss options), so that NaN, infinity or a count beyond what torch and
numpy hold is refused in one line before any work instead of training on NaN or failing deep inside torch."""

from __future__ import annotations

import math
from typing import Any, Optional

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def number_problem(value: Any) -> Optional[str]:
    """Why `value` cannot be a flag's number (None when it can, or is no number): NaN and infinity train
    nothing finite, and torch tensors, numpy and the data loader count in 64-bit integers."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number (NaN or infinity would make the run's numbers NaN); pass a finite one"
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:
        return f"{value} does not fit a 64-bit integer (at most 2**63 - 1 = {INT64_MAX}); pass a smaller one"
    return None


def numbers_problem(value: Any) -> Optional[str]:
    """`number_problem` of a value or of each item of a list or tuple (flags with several values)."""
    for item in value if isinstance(value, (list, tuple)) else (value,):
        problem = number_problem(item)
        if problem:
            return problem
    return None
