"""One owner per run folder: `<logs>/<name>/run.lock` names the process training the run.

Rank 0 creates the file when the run starts (atomically: written aside, then hard-linked into place,
which fails when it exists) and removes it when the run ends, however it ends. A second launch of the
same run finds it and stops with one line naming the owner. A lock whose owner is gone (its PID no
longer runs on this host, or it is this very PID: a container restarted with the same PIDs) is taken
over with a warning; one held on another host cannot be checked from here, and the line says how to
remove it when that run is known to be over.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, Optional

LOCK_NAME = "run.lock"


class RunInUse(RuntimeError):
    """The run folder is held by another live process; the message names it and the way out."""


def _owner_alive(owner: Dict[str, Any]) -> Optional[bool]:
    """Whether the lock's owner still runs (None: it ran on another host, which cannot be checked)."""
    if owner.get("host") != socket.gethostname():
        return None
    pid = owner.get("pid")
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _read_owner(path: Path) -> Dict[str, Any]:
    try:
        owner = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


class RunLock:
    """The run folder's lock (a context manager that releases it on exit); `acquire` on rank 0 only."""

    def __init__(self) -> None:
        self.path: Optional[Path] = None

    def acquire(self, run_dir: os.PathLike) -> None:
        """Hold `run_dir`; RunInUse when a live process holds it."""
        path = Path(run_dir) / LOCK_NAME
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": datetime.now().isoformat(timespec="seconds")}
        fd, aside = tempfile.mkstemp(prefix=f".{LOCK_NAME}.", dir=run_dir)
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        try:
            for _ in range(2):  # a stale lock is taken over once
                try:
                    os.link(aside, path)
                    self.path = path
                    return
                except FileExistsError:
                    self._take_over_if_stale(path)
            raise RunInUse(f"{run_dir} is locked again by another launch of this run; launch it once")
        finally:
            os.unlink(aside)

    @staticmethod
    def _take_over_if_stale(path: Path) -> None:
        owner = _read_owner(path)
        alive = _owner_alive(owner)
        who = f"PID {owner.get('pid', '?')} on {owner.get('host', '?')} (since {owner.get('since', '?')})"
        if alive:
            raise RunInUse(f"{path.parent} is in use by {who}: this run is already training there; wait for that "
                           "launch to end, or stop it, before launching the run again")
        if alive is None:
            raise RunInUse(f"{path.parent} is in use by {who}, another host, where this process cannot check it; if "
                           f"that run is over, remove {path} and launch again")
        logging.warning(f"Taking over {path}: its owner, {who}, no longer runs")
        path.unlink(missing_ok=True)

    def release(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
