"""The benchmark scripts of scripts/ imported by module name, as they import each other when run from there."""

import importlib
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def bench_script(name: str) -> ModuleType:
    """scripts/<name>.py as module `name` (scripts/ joins sys.path once, as `python scripts/<name>.py` puts it)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.append(str(SCRIPTS))
    return importlib.import_module(name)
