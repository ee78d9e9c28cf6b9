"""Which extra a command needs, and the one line it prints when that extra is missing: `pip install -e .` installs
the loss library alone, as `pip install open_clip_torch` leaves out open_clip_train's dependencies. Imports nothing
that an extra holds, so a command can call it when its own imports fail."""

from __future__ import annotations

import sys
from typing import NoReturn


def exit_for_missing_extra(error: ModuleNotFoundError, command: str, extra: str) -> NoReturn:
    """A command whose extra is not installed ends in one line naming the extra, as a missing wandb does, instead of
    the import's traceback; a module of this project that is missing is a broken install, and its error is raised as
    it is."""
    package = (error.name or "").split(".")[0]
    if not package or package in ("training", "open_clip_adacl"):
        raise error
    print(
        f"error: {command} needs {package}, part of the [{extra}] extra: pip install 'open_clip_adacl[{extra}]' "
        "(from the repository: pip install -r requirements.txt)",
        file=sys.stderr,
    )
    sys.exit(2)
