"""`pipe:CMD` shards with a stall timeout (`--shard-timeout`) that a preemption signal cuts short.

webdataset's Pipe waits for its command for as long as it takes, so one `pipe:aws s3 cp ... -` that
hangs on a dead connection would hold the run forever. `WatchedPipe` is that Pipe (same exit-status
checks) with the command in its own process group and a watchdog thread: a read that gets no byte for
`timeout_s` seconds ends the whole group (the shell and what it started) and fails the shard visit with
`ShardStalled`, an OSError, so the shard is skipped and counted as unreadable, its URL logged. Reads
return what has arrived (`read1`), so a slow but moving download never counts as stalled, and time
spent while nobody reads (the trainer busy with a step) is not counted. Once a preemption signal has
arrived (training.trainer.preemption), a read that has waited `PREEMPTED_STALL_S` seconds is ended the same way
(`ShardInterrupted`, also with --shard-timeout 0): the signal's handler only sets a flag, and the read
it interrupted would resume waiting, so the run could not reach its stop path (a checkpoint, status 75).
Data that keeps arriving is read on, so the step the run stops after still gets its batch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Optional

from webdataset.gopen import Pipe, gopen

from ..preemption import preemption_requested

_PIPE_PREFIX = "pipe:"
_SIGPIPE_STATUS = 141  # the shell's status for a writer ended by SIGPIPE (the reader stopped early): no error
_WATCH_INTERVAL_S = 1.0  # how often the watchdog looks at a waiting read
# Signals a cluster stops jobs with: never delivered to the watchdog thread, so they interrupt the waiting read
# and their Python handler runs (it runs in the main thread only once that thread's system call returns).
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT, signal.SIGHUP}
PREEMPTED_STALL_S = 2.0  # after a preemption signal, a read that waited this long counts as stalled


class ShardStalled(OSError):
    """A `pipe:` shard's command sent no data for --shard-timeout seconds and was ended."""


class ShardInterrupted(ShardStalled):
    """A `pipe:` shard's command was ended while a read waited for it, because a preemption signal arrived."""


def open_shard(url: str, timeout_s: float):
    """A binary stream of the shard at `url`: a WatchedPipe for `pipe:` URLs (timeout_s 0: no stall timeout,
    still ended at a preemption signal), webdataset's gopen for the others."""
    if url.startswith(_PIPE_PREFIX):
        return WatchedPipe(url[len(_PIPE_PREFIX) :], timeout_s)
    return gopen(url)


class WatchedPipe(Pipe):
    def __init__(self, command: str, timeout_s: float) -> None:
        super().__init__(
            command, mode="rb", shell=True, bufsize=8192, ignore_status=[_SIGPIPE_STATUS], start_new_session=True
        )  # its own group: ending it ends what the shell started
        self.command = command
        self.timeout_s = timeout_s
        self.waiting_since: Optional[float] = None  # set while a read waits for data
        self.stalled = False
        self.interrupted = False  # ended for a preemption signal
        self.finished = threading.Event()
        threading.Thread(target=self._watch, name="shard-watchdog", daemon=True).start()

    def _watch(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        interval = min(_WATCH_INTERVAL_S, self.timeout_s / 4) if self.timeout_s > 0 else _WATCH_INTERVAL_S
        while not self.finished.wait(interval):
            since = self.waiting_since
            waited = 0.0 if since is None else time.monotonic() - since
            if waited > PREEMPTED_STALL_S and preemption_requested():
                self.interrupted = True
            elif not 0 < self.timeout_s < waited:
                continue
            self.stalled = True
            self._end_group()
            return

    def _end_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def read(self, size: int = -1) -> bytes:
        self.waiting_since = time.monotonic()
        try:
            data = self.stream.read1(size) if size and size > 0 else self.stream.read()
        finally:
            self.waiting_since = None
        self.check_status()
        return data

    def wait_for_child(self) -> None:
        if self.interrupted:
            self.status = self.proc.wait()
            raise ShardInterrupted(
                f"`{self.command}` was ended while the run waited for its data, for a preemption "
                "signal; the shard was skipped"
            )
        if self.stalled:
            self.status = self.proc.wait()
            raise ShardStalled(
                f"`{self.command}` sent no data for {self.timeout_s:g} s (--shard-timeout); it was "
                "ended and the shard skipped"
            )
        super().wait_for_child()

    def close(self) -> None:
        """Close the stream; a command still running after timeout_s (the reader stopped early, or it hangs
        on exit; 0: as long as it takes) is ended."""
        self.finished.set()
        self.stream.close()
        try:
            self.status = self.proc.wait(self.timeout_s or None)
        except subprocess.TimeoutExpired:
            self.stalled = True
            self._end_group()
        self.wait_for_child()
