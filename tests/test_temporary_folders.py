"""The suite's temporary folders go as soon as their tests pass (pytest.ini's retention policy and the
`module_tmp` fixture of tests/conftest.py), and stay where a test failed, to be looked at."""

from pathlib import Path

import pytest

from helpers import REPO, TESTS

pytest_plugins = ["pytester"]

# Each test records the folders it was given; the names say whether its module passes.
RECORD = """
import pytest


@pytest.fixture(scope="module")
def shared(module_tmp):
    path = module_tmp("shared")
    (path / "checkpoint.pt").write_bytes(bytes(1024))
    return path


def record(tmp_path, shared, name):
    with open({paths!r}, "a") as out:
        out.write(f"{{name}} tmp_path {{tmp_path}}\\n{{name}} module {{shared}}\\n")
"""


@pytest.mark.slow
def test_passing_tests_leave_no_folder_and_a_failing_one_keeps_its_own(pytester):
    pytester.makeini((REPO / "pytest.ini").read_text().replace("pythonpath = tests", f"pythonpath = {TESTS}"))
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    paths = pytester.path / "paths.txt"
    pytester.makepyfile(
        test_passes=RECORD.format(paths=str(paths))
        + """
def test_one(tmp_path, shared):
    record(tmp_path, shared, "passes")
""",
        test_fails=RECORD.format(paths=str(paths))
        + """
def test_one(tmp_path, shared):
    record(tmp_path, shared, "fails")
    assert False, "this module fails"
""",
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    result.assert_outcomes(passed=1, failed=1)
    given = {
        f"{name} {kind}": path
        for name, kind, path in (line.split(" ", 2) for line in paths.read_text().split("\n") if line)
    }
    assert len(given) == 4
    assert not any(Path(given[f"passes {kind}"]).exists() for kind in ("tmp_path", "module"))
    assert all(Path(given[f"fails {kind}"]).exists() for kind in ("tmp_path", "module"))
