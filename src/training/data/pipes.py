"""`pipe:CMD` shards with a stall timeout (`--shard-timeout`).

webdataset's Pipe waits for its command for as long as it takes, so one `pipe:aws s3 cp ... -` that
hangs on a dead connection would hold the run forever. `WatchedPipe` is that Pipe (same exit-status
checks) with the command in its own process group and a watchdog thread: a read that gets no byte for
`timeout_s` seconds ends the whole group (the shell and what it started) and fails the shard visit with
`ShardStalled`, an OSError, so the shard is skipped and counted as unreadable, its URL logged. Reads
return what has arrived (`read1`), so a slow but moving download never counts as stalled, and time
spent while nobody reads (the trainer busy with a step) is not counted.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import Optional

from webdataset.gopen import Pipe, gopen

_PIPE_PREFIX = "pipe:"
_SIGPIPE_STATUS = 141  # the shell's status for a writer ended by SIGPIPE (the reader stopped early): no error


class ShardStalled(OSError):
    """A `pipe:` shard's command sent no data for --shard-timeout seconds and was ended."""


def open_shard(url: str, timeout_s: float):
    """A binary stream of the shard at `url`: a WatchedPipe for `pipe:` URLs (timeout_s 0: never times out),
    webdataset's gopen for the others."""
    if url.startswith(_PIPE_PREFIX) and timeout_s > 0:
        return WatchedPipe(url[len(_PIPE_PREFIX):], timeout_s)
    return gopen(url)


class WatchedPipe(Pipe):
    def __init__(self, command: str, timeout_s: float) -> None:
        super().__init__(command, mode="rb", shell=True, bufsize=8192, ignore_status=[_SIGPIPE_STATUS],
                         start_new_session=True)  # its own group: ending it ends what the shell started
        self.command = command
        self.timeout_s = timeout_s
        self.waiting_since: Optional[float] = None  # set while a read waits for data
        self.stalled = False
        self.finished = threading.Event()
        threading.Thread(target=self._watch, name="shard-watchdog", daemon=True).start()

    def _watch(self) -> None:
        while not self.finished.wait(min(1.0, self.timeout_s / 4)):
            since = self.waiting_since
            if since is not None and time.monotonic() - since > self.timeout_s:
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
        if self.stalled:
            self.status = self.proc.wait()
            raise ShardStalled(f"`{self.command}` sent no data for {self.timeout_s:g} s (--shard-timeout); it was "
                               "ended and the shard skipped")
        super().wait_for_child()

    def close(self) -> None:
        """Close the stream; a command still running after timeout_s (the reader stopped early, or it hangs
        on exit) is ended."""
        self.finished.set()
        self.stream.close()
        try:
            self.status = self.proc.wait(self.timeout_s)
        except subprocess.TimeoutExpired:
            self.stalled = True
            self._end_group()
        self.wait_for_child()
