"""The packages under src/ depend on each other one way, and each command-line package runs as `python -m`.

open_clip_adacl (the library) <- training (the trainer) <- evaluation, synthetic_scenes <- loss_comparison.
"""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
# What each package may import of the others (lazy imports inside functions count too).
ALLOWED = {
    "open_clip_adacl": set(),
    "training": {"open_clip_adacl"},
    "evaluation": {"open_clip_adacl", "training"},
    "synthetic_scenes": {"open_clip_adacl", "training"},
    "loss_comparison": {"open_clip_adacl", "training", "evaluation", "synthetic_scenes"},
}


def imported_packages(path: Path) -> set:
    """The top-level names `path` imports absolutely (relative imports stay inside its package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_every_package_under_src_is_known():
    assert {path.parent.name for path in SRC.glob("*/__init__.py")} == set(ALLOWED)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_dependencies_point_one_way(package):
    forbidden = set(ALLOWED) - ALLOWED[package] - {package}
    wrong = {str(path.relative_to(SRC)): sorted(imported_packages(path) & forbidden)
             for path in sorted((SRC / package).rglob("*.py"))}
    assert {path: names for path, names in wrong.items() if names} == {}


# (`python -m loss_comparison` runs in tests/test_loss_comparison_jobs.py: every job is such a process.)
@pytest.mark.parametrize("package", ["synthetic_scenes", "evaluation", "training.discover"])
def test_each_command_line_package_runs_as_a_module(package):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", package, "--help"], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(f"usage: python -m {package}")
