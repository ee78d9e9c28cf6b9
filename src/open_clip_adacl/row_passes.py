"""How the selection's passes walk this rank's rows x C matrix (logits or keys): in row chunks small enough
to stay in the CPU cache (`row_chunks`, with `ChunkScratch`'s reused buffers), on one CPU thread
(`one_cpu_thread`), or, for a pass over independent rows, on one thread per core with a share of the rows
each (`rows_on_cpu_threads`), independent calls on threads of their own (`side_by_side`); reading values
back to the host only where that makes no device wait (`reading_back_is_free`); and the per-rank minimum
that a rank holding no rows still takes part in (`min_or`). `selection.py`, `radix_select.py` and the AdaCL
loss share them; the results never depend on the chunk size or the number of threads.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator, List, Optional, Sequence, Tuple, TypeVar

import torch

T = TypeVar("T")

# Elements per chunk; on the CPU per thread, since each op splits its chunk between the threads.
# Chunks should be few, since every op on a chunk costs a dispatch and, with several threads, a
# fork-join; within a chunk the ops reuse chunk-sized scratch buffers (`ChunkScratch`), which stay
# in the last-level cache. 2^20 per thread (4 MiB of float32) is the middle of a flat optimum
# (sizes tried: docs/THROUGHPUT.md). On a GPU bigger chunks only bound the temporaries.
CHUNK_ELEMENTS = {"cpu": 1 << 20, "cuda": 1 << 24}
# The global row index that no row has: what a rank without the row contributes to a min over rows.
NO_ROW = torch.iinfo(torch.int64).max
# `side_by_side`'s helper threads: (the process that made them, how many, the pool).
_helpers: Optional[Tuple[int, int, ThreadPoolExecutor]] = None


@contextmanager
def one_cpu_thread(device: torch.device) -> Iterator[None]:
    """On the CPU, run the block on one thread (torch's intra-op threads restored after it).

    For the selection's passes: integer and comparison ops that memory traffic bounds, so a second
    thread gains little, while every op costs a fork-join that waits for any thread another process
    has preempted; on a shared machine one thread is the faster choice (measured: docs/THROUGHPUT.md).
    """
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def rows_on_cpu_threads(num_rows: int, device: torch.device, work: Callable[[int, int], None]) -> None:
    """Run `work(start, stop)` over (start, stop) row ranges that together cover `num_rows` once.

    On the CPU with torch set to T > 1 threads, the rows are split into T ranges, each walked by its
    own thread (`side_by_side`); elsewhere `work(0, num_rows)` runs on the calling thread. For passes
    of many short torch ops over independent rows: torch splits every op between its threads and joins
    them after it, and when another job holds a core each join waits for the preempted thread; here
    each thread walks its own rows and the threads meet once, at the end. `work` must write only its
    own rows' results. Measured against torch's threads and one thread: docs/THROUGHPUT.md.
    """
    shares = min(cpu_threads(device), num_rows)
    if shares <= 1:
        work(0, num_rows)
        return
    bounds = [num_rows * share // shares for share in range(shares + 1)]
    side_by_side(device, [lambda share=share: work(bounds[share], bounds[share + 1]) for share in range(shares)])


def cpu_threads(device: torch.device) -> int:
    """The threads torch may use for an op on `device`: its intra-op threads on the CPU, else 1."""
    return torch.get_num_threads() if device.type == "cpu" else 1


def can_run_side_by_side(device: torch.device, num_calls: int) -> bool:
    """Whether `side_by_side` runs `num_calls` calls at once: on the CPU, with as many torch threads."""
    return num_calls >= 2 and cpu_threads(device) >= num_calls


def side_by_side(device: torch.device, calls: Sequence[Callable[[], T]]) -> List[T]:
    """The results of `calls`, run side by side when `can_run_side_by_side`, each on its own thread with
    one torch thread (`one_cpu_thread`; the calling thread runs the first); else one after the other on
    the calling thread, as they are.

    Torch ops, and the selection's compiled passes (fused.py), release Python's GIL while they run, so
    the threads run at once. The calls must not depend on each other, nor take part in collectives
    (ranks would meet them in different orders). An exception in any call is raised here, after all
    have ended.
    """
    if not can_run_side_by_side(device, len(calls)):
        return [call() for call in calls]
    results: List[Optional[T]] = [None] * len(calls)
    errors: List[Optional[BaseException]] = [None] * len(calls)

    def run(index: int) -> None:
        try:
            with one_cpu_thread(device):
                results[index] = calls[index]()
        except BaseException as error:  # noqa: BLE001 - handed to the calling thread, which raises it
            errors[index] = error

    helpers = [_helper_threads(len(calls) - 1).submit(run, index) for index in range(1, len(calls))]
    run(0)
    for helper in helpers:
        helper.result()
    for error in errors:
        if error is not None:
            raise error
    return results  # type: ignore[return-value]


def _helper_threads(count: int) -> ThreadPoolExecutor:
    """Threads kept for `side_by_side` from call to call (starting a thread costs about a millisecond,
    a step of a small batch a few); made again in a forked child, which has none of its parent's threads."""
    global _helpers
    pid = os.getpid()
    if _helpers is None or _helpers[0] != pid or _helpers[1] < count:
        if _helpers is not None and _helpers[0] == pid:
            _helpers[2].shutdown(wait=False)  # too few: its threads end once idle
        _helpers = (pid, count, ThreadPoolExecutor(max_workers=count, thread_name_prefix="open_clip_adacl"))
    return _helpers[2]


def row_chunks(num_rows: int, num_cols: int, device: torch.device) -> Iterator[Tuple[int, int]]:
    """(start, stop) row ranges covering `num_rows`, each about one cache-sized chunk."""
    step = _chunk_rows(num_cols, device)
    for start in range(0, num_rows, step):
        yield start, min(start + step, num_rows)


def _chunk_rows(num_cols: int, device: torch.device) -> int:
    elements = CHUNK_ELEMENTS.get(device.type, CHUNK_ELEMENTS["cuda"])
    if device.type == "cpu":
        elements *= torch.get_num_threads()
    return max(1, elements // max(num_cols, 1))


class ChunkScratch:
    """Buffers of one chunk's shape (see `row_chunks`), reused from chunk to chunk of a pass: a
    chunk's temporaries then stay in cache instead of being allocated (and, when large,
    page-faulted) anew for every op."""

    def __init__(self, num_rows: int, num_cols: int, device: torch.device):
        self.shape, self.device = (min(num_rows, _chunk_rows(num_cols, device)), num_cols), device
        self._buffers = {}

    def get(self, name: str, dtype: torch.dtype, rows: int) -> torch.Tensor:
        """The first `rows` rows of buffer `name` (made on first use)."""
        buffer = self._buffers.get(name)
        if buffer is None:
            buffer = self._buffers[name] = torch.empty(self.shape, dtype=dtype, device=self.device)
        return buffer[:rows]


def reading_back_is_free(device: torch.device) -> bool:
    """Whether the host may read a tensor's values (`.item()`, `.tolist()`, `nonzero`) without making
    a device wait: on the CPU, where the ops have already run. The selection then skips work that
    the values show to be unneeded; elsewhere it runs the same ops whatever the values."""
    return device.type == "cpu"


def min_or(values: torch.Tensor, empty: float) -> torch.Tensor:
    """values.min(), or `empty` when a rank has no rows (the number of rows is known on the host)."""
    return values.min() if values.numel() else torch.full((), empty, dtype=values.dtype, device=values.device)


def require(holds: torch.Tensor, message: str) -> None:
    """Raise ValueError(`message`) unless the 0-dim bool `holds` is True. Where reading back is free (the CPU)
    it is read at once; elsewhere the device asserts it in its queue (`torch._assert_async`: a failure stops
    the run at the device's next synchronisation, with the message where the device reports it), so a check of
    the inputs makes no host wait."""
    if reading_back_is_free(holds.device):
        if not bool(holds):
            raise ValueError(message)
        return
    torch._assert_async(holds, message)
