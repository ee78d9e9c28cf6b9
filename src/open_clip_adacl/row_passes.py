"""How the selection's passes walk this rank's rows x C matrix (logits or keys): in row chunks small enough
to stay in the CPU cache (`row_chunks`, with `ChunkScratch`'s reused buffers), on one CPU thread
(`one_cpu_thread`), reading values back to the host only where that makes no device wait
(`reading_back_is_free`); and the per-rank minimum that a rank holding no rows still takes part in
(`min_or`). `selection.py` and `radix_select.py` share them; the results never depend on the chunk size.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Tuple

import torch

# Elements per chunk; on the CPU per thread, since each op splits its chunk between the threads.
# Chunks should be few, since every op on a chunk costs a dispatch and, with several threads, a
# fork-join; within a chunk the ops reuse chunk-sized scratch buffers (`ChunkScratch`), which stay
# in the last-level cache. 2^20 per thread (4 MiB of float32) is the middle of a flat optimum
# (sizes tried: docs/THROUGHPUT.md). On a GPU bigger chunks only bound the temporaries.
CHUNK_ELEMENTS = {"cpu": 1 << 20, "cuda": 1 << 24}
# The global row index that no row has: what a rank without the row contributes to a min over rows.
NO_ROW = torch.iinfo(torch.int64).max


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
