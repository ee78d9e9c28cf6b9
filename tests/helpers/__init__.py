"""Helpers the tests share (no test module imports another); `tests/` is on the path (pytest.ini)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
