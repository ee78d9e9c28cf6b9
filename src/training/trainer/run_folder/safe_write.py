"""The run's records besides checkpoints (metrics.jsonl, results.jsonl, params.txt), written so that a
full disk or a revoked permission never stops training.

`RunFiles.append` adds text to a file. When that raises an OSError the file is cut back to its length
before the write (no half record stays), the text is kept in memory, and one line is logged naming the
file and the cause (`disk full`, `permission denied`, ...); the next append to that file retries
everything kept, in order, and logs once when the file is written again. `close` retries every file a
last time and logs what could not be written; `unwritten` lists it for the run's last line. Writers that
keep their own files (TensorBoard's events, wandb's folder) report a failure through `give_up`: the same
one line, and the same listing at the end.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from pathlib import Path
from typing import Dict, Iterator, List, Sequence

_CAUSES = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "read-only file system",
    errno.EFBIG: "file too large for the file-size limit",
    errno.ENOENT: "its folder is gone",
    errno.ENOTDIR: "its folder is a file",
    errno.EIO: "input/output error",
}


def free_inodes(path: str | os.PathLike) -> int | None:
    """The files that can still be created on the file system holding `path` (or its nearest existing folder); None
    where it does not count them (it reports no inodes at all, as btrfs does) or cannot be asked."""
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        stats = os.statvfs(existing)
    except OSError:
        return None
    return stats.f_favail if stats.f_files else None


def no_inodes_text(path: str | os.PathLike) -> str:
    """What a full disk is when its bytes are not: "no free inodes (X MB free, but no file can be created)"."""
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return f"no free inodes ({shutil.disk_usage(existing).free / 1e6:.0f} MB free, but no file can be created there)"


def cause_of(error: BaseException) -> str:
    """Why a write failed, in words first: "disk full ([Errno 28] No space left on device)", "permission
    denied (...)", "no free inodes (...)" when a full disk has bytes left; another error by its type and first
    line."""
    if (
        isinstance(error, OSError)
        and error.errno == errno.ENOSPC
        and error.filename
        and free_inodes(error.filename) == 0
    ):
        return f"{no_inodes_text(error.filename)} ([Errno {error.errno}] {error.strerror})"
    if isinstance(error, OSError) and error.errno in _CAUSES:
        return f"{_CAUSES[error.errno]} ([Errno {error.errno}] {error.strerror})"
    text = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def write_failure(error: BaseException, folder: str | os.PathLike) -> str | None:
    """A tool's write into `folder` that failed for a cause of the disk or its permissions (`cause_of`), in one
    line naming the file (or the folder, when the error does not): what a command prints instead of a traceback.
    None for any other error (a bug to show in full)."""
    if not isinstance(error, OSError) or error.errno not in _CAUSES:
        return None
    return f"could not write {error.filename or f'into {folder}'} ({cause_of(error)})"


WRITE_FAILED_STATUS = 1  # a tool's exit status when its output took no more writes (2: a mistake in its input)


class WriteFailed(RuntimeError):
    """A tool's output took no more writes (a full disk, a read-only folder, a revoked permission): its command
    ends in this one line, `error: <it>`, with WRITE_FAILED_STATUS."""


@contextlib.contextmanager
def tool_writes(folder: str | os.PathLike, fix: str) -> Iterator[None]:
    """The block's OSError of the disk or its permissions (`write_failure`) as WriteFailed("could not write FILE
    (CAUSE); FIX"); any other error as it is."""
    try:
        yield
    except OSError as error:
        failure = write_failure(error, folder)
        if failure is None:
            raise
        raise WriteFailed(f"{failure}; {fix}") from None


class RunFiles:
    """Appends to the run's record files; a failed write is logged, kept and retried (see the module)."""

    def __init__(self) -> None:
        self.pending: Dict[Path, List[str]] = {}  # per file: the texts not written yet, in order
        self.causes: Dict[Path, str] = {}  # per failing file: the cause last logged
        self.given_up: Dict[Path, str] = {}  # per file another writer stopped writing: what it lost, and why

    def append(self, path: os.PathLike, text: str) -> bool:
        """Append `text` (after any text held back for `path`); whether everything for `path` is written now."""
        path = Path(path)
        self.pending.setdefault(path, []).append(text)
        return self._flush(path, new=1)

    def _flush(self, path: Path, new: int = 0) -> bool:
        """Write what is held back for `path` (the last `new` texts are not held back yet)."""
        texts = self.pending.get(path)
        if not texts:
            return True
        size = -1  # unknown until stat answers
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            size = path.stat().st_size if path.exists() else None
            with open(path, "a") as f:
                f.write("".join(texts))
        except OSError as error:
            self._cut_back(path, size)
            cause = cause_of(error)
            if self.causes.get(path) != cause:
                logging.error(
                    f"Could not write {path} ({cause}); training goes on, {len(texts)} record(s) held back, "
                    "retried with the next record and at the end of the run"
                )
            self.causes[path] = cause
            return False
        if path in self.causes:
            logging.warning(f"{path} is written again ({len(texts) - new} record(s) held back are in it now)")
            del self.causes[path]
        del self.pending[path]
        return True

    @staticmethod
    def _cut_back(path: Path, size) -> None:
        """Remove what a failed write left of its text (a full disk may take part of it)."""
        try:
            if size == -1:
                return
            if path.exists() and path.stat().st_size > (size or 0):
                os.truncate(path, size or 0)  # a file this write created stays, empty (it may be a symlink's target)
        except OSError:
            pass  # the records are still held back; a half line is skipped by the readers

    def give_up(self, path: os.PathLike, what: str, error: BaseException) -> None:
        """Another writer of the run folder failed on `path` and stops writing it: one line naming it and the cause
        (training goes on); `unwritten` lists `what` it did not write."""
        path, cause = Path(path), cause_of(error)
        logging.error(f"Could not write {path} ({cause}); training goes on without it, {what} not written")
        self.given_up.setdefault(path, f"{what} ({cause})")

    def close(self, also: Sequence[str] = ()) -> List[str]:
        """Retry every file; log and return what could still not be written ("<file>: N record(s) (cause)"), and
        `also`, what the log files lost (training.trainer.run_folder.logger)."""
        for path in list(self.pending):
            self._flush(path)
        lost = [*self.unwritten, *also]
        for line in lost:
            logging.error(f"NOT WRITTEN: {line}")
        return lost

    @property
    def unwritten(self) -> List[str]:
        return [
            f"{path}: {len(texts)} record(s) ({self.causes.get(path, 'not retried')})"
            for path, texts in self.pending.items()
        ] + [f"{path}: {what}" for path, what in self.given_up.items()]


class ErrorRecordingFile:
    """A binary file for `torch.save` that keeps the OSError of a failed write: torch reports that failure
    only as "unexpected pos", so the saver re-raises `error` (ENOSPC: disk full) instead."""

    def __init__(self, file) -> None:
        self.file = file
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as error:
            self.error = self.error or error
            raise

    def flush(self) -> None:
        self.file.flush()
