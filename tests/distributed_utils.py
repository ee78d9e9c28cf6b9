"""Run a function on several real gloo ranks on the CPU and collect what each rank returns.

Used by every test that compares a distributed computation with one process on the concatenated
batch. The function must be importable (module level) so `torch.multiprocessing.spawn` can pickle it.
"""
from __future__ import annotations

import os
import socket
import tempfile
from typing import Any, Callable, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, out_dir: str, fn: Callable, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_on_ranks(fn: Callable, world_size: int, *args: Any) -> List[Any]:
    """`fn(rank, world_size, *args)` on `world_size` gloo processes; returns each rank's result."""
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_worker, args=(world_size, _free_port(), out_dir, fn, args), nprocs=world_size, join=True)
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]
