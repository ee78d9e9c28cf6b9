"""One owner per run folder: `<logs>/<name>/run.lock` names the process training the run.

Rank 0 opens (or creates) the file when the run starts and holds an OS lock on it (`fcntl.flock`) for as
long as the run lasts; the kernel drops that lock when the process ends, however it ends. Only the
holder of the OS lock reads the file's owner and writes itself into it, so two launches racing for the
same folder (a stale lock included) cannot both own it. A second launch of a live run finds the lock
held and stops with one line naming the owner. A file left by an owner that is gone (its PID no longer
runs on this host, or it is this very PID: a container restarted with the same PIDs) is taken over with
a warning. One written on another host cannot be checked from here (its file system may not share OS
locks between hosts), so its holder keeps a heartbeat: it sets the file's modification time every
HEARTBEAT_S seconds while it holds it. A lock of another host whose heartbeat is older than STALE_AFTER_S
(its node died: a SLURM job requeued onto a new node) is taken over with one line; a younger one is refused,
naming its age and the bound. STALE_AFTER_S is below SLURM's default SlurmdTimeout (300 s), after which a dead
node's job is requeued, and far above a heartbeat's delay on a loaded node or a shared file system's clock
skew. The holder removes the file when the run ends.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, Optional

LOCK_NAME = "run.lock"
_LOCK_MODE = 0o644
HEARTBEAT_S = 30  # the holder refreshes the file's modification time this often
STALE_AFTER_S = 120  # a lock of another host not refreshed for this long is taken over
# flock errors meaning "this file system has no OS locks": the owner check of the file's contents still applies.
_NO_OS_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


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


def _heartbeat_age(path: Path) -> float:
    """Seconds since the lock's holder last refreshed it."""
    return time.time() - os.stat(path).st_mtime


def _parse_owner(text: str) -> Dict[str, Any]:
    try:
        owner = json.loads(text)
    except ValueError:
        return {}
    return owner if isinstance(owner, dict) else {}


def _read_owner(fd: int) -> Dict[str, Any]:
    """The owner recorded in the open lock file ({} when empty or unreadable)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return _parse_owner(os.read(fd, 65536).decode("utf-8", "replace"))
    except OSError:
        return {}


def _describe(owner: Dict[str, Any]) -> str:
    return f"PID {owner.get('pid', '?')} on {owner.get('host', '?')} (since {owner.get('since', '?')})"


def _in_use(path: Path, owner: Dict[str, Any]) -> RunInUse:
    return RunInUse(
        f"{path.parent} is in use by {_describe(owner)}: this run is already training there; wait for "
        "that launch to end, or stop it, before launching the run again"
    )


def _is_same_file(fd: int, path: Path) -> bool:
    """Whether `fd` is still the file at `path` (a releasing owner may have removed it after it was opened)."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


class RunLock:
    """The run folder's lock (a context manager that releases it on exit); `acquire` on rank 0 only."""

    def __init__(self) -> None:
        self.path: Optional[Path] = None
        self.fd: Optional[int] = None
        self.released = threading.Event()
        self.fd_lock = threading.Lock()  # the heartbeat never touches a closed (or reused) descriptor

    def acquire(self, run_dir: os.PathLike) -> None:
        """Hold `run_dir`; RunInUse when a live process holds it. An OSError (a read-only folder) is the caller's
        to report."""
        path = Path(run_dir) / LOCK_NAME
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, _LOCK_MODE)
            try:
                self._lock(fd, path)
            except BaseException:
                os.close(fd)
                raise
            if _is_same_file(fd, path):
                break
            os.close(fd)  # the file was replaced while we waited: lock the one at the path now
        try:
            self._take_over_if_stale(path, _read_owner(fd))
            self._write_owner(fd)
        except BaseException:
            os.close(fd)
            raise
        self.path, self.fd = path, fd
        threading.Thread(target=self._beat, args=(fd,), name="run-lock-heartbeat", daemon=True).start()

    def _beat(self, fd: int) -> None:
        """The heartbeat: the lock's modification time set every HEARTBEAT_S seconds until it is released."""
        while not self.released.wait(HEARTBEAT_S):
            with self.fd_lock:
                try:
                    if self.fd == fd:
                        os.utime(fd)
                except OSError:  # a full or read-only disk meanwhile: the run goes on; the lock only ages
                    pass

    @staticmethod
    def _lock(fd: int, path: Path) -> None:
        """Take the OS lock on `fd` without waiting; RunInUse naming the owner when another process holds it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(path, _read_owner(fd)) from None
        except OSError as error:
            if error.errno not in _NO_OS_LOCKS:
                raise
            logging.warning(
                f"{path.parent}'s file system has no OS file locks ({error.strerror}): two launches "
                "started at the same moment could both take this run; launch it once"
            )

    @staticmethod
    def _take_over_if_stale(path: Path, owner: Dict[str, Any]) -> None:
        """With the OS lock held: refuse a recorded owner that is alive or cannot be checked; warn when taking
        over one that is gone (an empty file is one whose writer died before writing)."""
        if not owner:
            return
        alive = _owner_alive(owner)
        if alive:
            raise _in_use(path, owner)
        if alive is None:
            age = _heartbeat_age(path)
            if age <= STALE_AFTER_S:
                raise RunInUse(
                    f"{path.parent} is in use by {_describe(owner)}, another host, whose heartbeat (the "
                    f"lock's modification time, refreshed every {HEARTBEAT_S} s while it trains) is "
                    f"{age:.0f} s old: it is taken over once older than {STALE_AFTER_S} s; launch again "
                    f"after that if that run is over (or remove {path})"
                )
            logging.warning(
                f"Taking over {path}: its owner, {_describe(owner)}, another host, has not refreshed its "
                f"heartbeat for {age:.0f} s (more than {STALE_AFTER_S} s): that run is over"
            )
            return
        logging.warning(f"Taking over {path}: its owner, {_describe(owner)}, no longer runs")

    @staticmethod
    def _write_owner(fd: int) -> None:
        me = {"pid": os.getpid(), "host": socket.gethostname(), "since": datetime.now().isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)

    def release(self) -> None:
        """Remove the file, then drop the OS lock (in that order: a launch waiting on this file finds it gone
        and locks a new one)."""
        self.released.set()
        if self.path is not None:
            try:
                self.path.unlink(missing_ok=True)
            except OSError as error:  # a folder made read-only or immutable meanwhile: the OS lock still goes
                logging.warning(
                    f"Could not remove {self.path} ({error.strerror}); the next launch takes it over, "
                    "since its owner no longer runs"
                )
            self.path = None
        with self.fd_lock:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()
