"""Run a function on several real gloo ranks on the CPU and collect what each rank returns.

Used by every test that compares a distributed computation with one process on the concatenated
batch. The function must be importable (module level) so it can be pickled to the ranks.

The ranks start from a fork server that imported torch, open_clip and the trainer once per test process: a
spawned rank imports them again (about 8 s of CPU, more than most of these tests compute), and a plain fork of
the test process cannot run autograd after the parent has. Each rank gets the caller's environment as it is
at the call (the fork server's is that of its start), so a test's `monkeypatch.setenv` reaches the ranks.
"""

from __future__ import annotations

import os
import socket
import tempfile
from typing import Any, Callable, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Imported once by the fork server, before it forks any rank.
PRELOAD = ["torch", "torch.distributed", "open_clip", "open_clip_adacl", "training.main"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(
    rank: int, world_size: int, port: int, out_dir: str, fn: Callable, args: tuple, init_group: bool, environ: dict
) -> None:
    os.environ.clear()
    os.environ.update(environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if init_group:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    else:  # what torchrun sets: `fn` creates (and destroys) the group itself, e.g. training.main
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_on_ranks(fn: Callable, world_size: int, *args: Any, init_group: bool = True) -> List[Any]:
    """`fn(rank, world_size, *args)` on `world_size` gloo processes; returns each rank's result.

    With `init_group=False` the default group is not created; each process gets torchrun's
    environment variables instead, so `fn` may run `training.main` (several times in a row).
    """
    with tempfile.TemporaryDirectory() as out_dir:
        mp.get_context("forkserver").set_forkserver_preload(PRELOAD)
        mp.start_processes(
            _worker,
            args=(world_size, free_port(), out_dir, fn, args, init_group, dict(os.environ)),
            nprocs=world_size,
            join=True,
            start_method="forkserver",
        )
        return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]
