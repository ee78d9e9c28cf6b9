"""Estimates of the time left, for tools that run longer than a minute (the discovery pass, the loss
comparison): the rate so far carried over what remains, in words a console line can hold."""

from __future__ import annotations

from typing import Optional


def remaining_seconds(elapsed: float, done: float, total: float) -> Optional[float]:
    """Seconds left if the rest goes at the rate so far (`done` units in `elapsed` seconds); None before
    the first unit, whose time is all there is to go by."""
    if done <= 0 or elapsed <= 0:
        return None
    return elapsed / done * max(total - done, 0)


def duration_text(seconds: float) -> str:
    """'45 s', '12 min', '3 h 05 min': as precise as an estimate of that size deserves."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def eta_text(elapsed: float, done: float, total: float) -> str:
    """'ETA 12 min' (or 'ETA unknown' before the first unit is done)."""
    left = remaining_seconds(elapsed, done, total)
    return "ETA unknown" if left is None else f"ETA {duration_text(left)}"
