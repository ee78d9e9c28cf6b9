"""Process-group setup and the few collectives the trainer needs, in one place.

Launchers: torchrun (RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT) and SLURM's srun
(SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID; MASTER_ADDR defaults to the first host of
SLURM_NODELIST, or SLURM_JOB_NODELIST, and MASTER_PORT to one derived from SLURM_JOB_ID). Rank
detection and process-group creation are OpenCLIP's (`open_clip_train.distributed`); the backend is
gloo on CPU and nccl on CUDA.
DDP wrapping is ours: OpenCLIP passes `device_ids=[device]`, which DDP rejects for CPU modules.
Ours too: `--dist-timeout` for the rendezvous and collectives, a one-line error when announced ranks never
arrive, and workers of a torchrun agent that never outlive it (parent-death signal).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import re
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator, List, Mapping, Optional, Sequence

import torch
import torch.distributed as dist
from open_clip_train.distributed import init_distributed_device_so, is_device_available
from torch.nn.parallel import DistributedDataParallel

DEFAULT_MASTER_PORT = 29500
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class DistributedStartError(RuntimeError):
    """The process group could not form (ranks that never arrived); the message names what to check."""


@dataclass(frozen=True)
class DistributedEnv:
    """Where this process runs: its ranks, the world size and its torch device."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_master(self) -> bool:
        return self.rank == 0

    @property
    def is_local_master(self) -> bool:
        return self.local_rank == 0


# What OpenCLIP's `world_info_from_env` reads, each list in its order of precedence (the first one set wins).
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
RANK_VARIABLES = ("RANK", "PMI_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
# Each launcher variable read as a whole number, with its smallest and largest value and what it means.
LAUNCHER_NUMBERS = {
    **{name: (1, None, "the number of processes") for name in WORLD_SIZE_VARIABLES},
    **{name: (0, None, "this process's rank") for name in RANK_VARIABLES + LOCAL_RANK_VARIABLES},
    "MASTER_PORT": (1, 65535, "the rendezvous port"),
    "SLURM_JOB_ID": (0, None, "the SLURM job's id"),
}


def launch_environment_problem(environ: Mapping[str, str]) -> Optional[str]:
    """Why the launcher's variables in `environ` cannot start this process (None when they can): each one set is a
    whole number in its range, and the rank is below the world size. Read before OpenCLIP reads them with
    `int()`, whose traceback would name neither the variable nor the fix."""
    for name, (low, high, meaning) in LAUNCHER_NUMBERS.items():
        if name not in environ:
            continue
        text = environ[name].strip()
        value = int(text) if re.fullmatch(r"[+-]?\d+", text) else None
        if value is None or value < low or (high is not None and value > high):
            bounds = f"{low}..{high}" if high is not None else f">= {low}"
            return (
                f"{name}={environ[name]!r} is not a whole number {bounds} ({meaning}, which torchrun and srun set); "
                f"unset it, or launch with torchrun or srun"
            )
    rank_name = next((name for name in RANK_VARIABLES if name in environ), None)
    size_name = next((name for name in WORLD_SIZE_VARIABLES if name in environ), None)
    if rank_name and size_name and int(environ[rank_name]) >= int(environ[size_name]):
        size = int(environ[size_name])
        return (
            f"{rank_name}={environ[rank_name].strip()} is not below {size_name}={size} (the ranks of {size} "
            f"process(es) are 0..{size - 1}); launch with torchrun or srun, which number them, or fix the variables"
        )
    return None


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list: 'gpu[003-005,9],cpu1' -> 'gpu003'."""
    first = re.match(r"[^,\[]+(\[[^\]]*\])?", nodelist.strip())
    if first is None:
        raise ValueError(f"cannot parse SLURM_NODELIST {nodelist!r}")
    host = first.group(0)
    bracket = first.group(1)
    if bracket is None:
        return host
    first_range = bracket[1:-1].split(",")[0]
    return host[: -len(bracket)] + first_range.split("-")[0]


def set_slurm_rendezvous_env() -> None:
    """Under srun, fill MASTER_ADDR/MASTER_PORT (env:// rendezvous) when the job script did not."""
    if "SLURM_PROCID" not in os.environ:
        return
    if "MASTER_ADDR" not in os.environ:
        # srun sets both lists; some container launchers pass on only the job's.
        nodelist = os.environ.get("SLURM_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", "127.0.0.1")
        os.environ["MASTER_ADDR"] = first_slurm_host(nodelist)
    if "MASTER_PORT" not in os.environ:
        # Derived from the job id so that two jobs sharing a node do not collide.
        job_id = int(os.environ.get("SLURM_JOB_ID", "0"))
        os.environ["MASTER_PORT"] = str(DEFAULT_MASTER_PORT + job_id % 10000)


def init_distributed(
    device: str = "cuda",
    *,
    dist_backend: Optional[str] = None,
    dist_url: Optional[str] = None,
    no_set_device_rank: bool = False,
    timeout_s: Optional[float] = None,
) -> DistributedEnv:
    """Initialise the default process group when launched by torchrun or srun; else a single process.

    An unavailable `device` falls back to the CPU with a warning (as OpenCLIP does). `timeout_s`
    (None: torch's default) bounds the rendezvous and every later collective; ranks that do not
    arrive within it raise DistributedStartError.
    """
    set_slurm_rendezvous_env()
    exit_with_torchrun_agent()
    try:
        with _process_group_timeout(timeout_s):
            info = init_distributed_device_so(
                device=device,
                dist_backend=dist_backend,
                dist_url=dist_url,
                no_set_device_rank=no_set_device_rank,
            )
    except dist.DistStoreError as error:  # the TCP store gave up waiting for the other ranks
        raise DistributedStartError(missing_ranks_message(error, timeout_s)) from None
    return DistributedEnv(
        rank=info["global_rank"],
        local_rank=info["local_rank"],
        world_size=info["world_size"],
        device=torch.device(info["device"]),
    )


@contextlib.contextmanager
def _process_group_timeout(timeout_s: Optional[float]) -> Iterator[None]:
    """OpenCLIP's `init_distributed_device_so` creates the group with torch's default timeout and takes
    none; this passes ours to its `init_process_group` call (looked up on the module at call time)."""
    if timeout_s is None:
        yield
        return
    original = dist.init_process_group
    dist.init_process_group = functools.partial(original, timeout=timedelta(seconds=timeout_s))
    try:
        yield
    finally:
        dist.init_process_group = original


def missing_ranks_message(error: Exception, timeout_s: Optional[float]) -> str:
    """One line for a rendezvous that timed out: who was expected, where, and what to check."""
    launcher = "SLURM_NTASKS" if "SLURM_PROCID" in os.environ else "WORLD_SIZE"  # OpenCLIP's choice of the two
    announced = os.environ.get(launcher, "?")
    rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID", "?")
    waited = f"--dist-timeout {timeout_s:g} s" if timeout_s is not None else "torch's default timeout"
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (
        f"rank {rank} of {announced} ({launcher}={announced}): the other ranks did not join the rendezvous at "
        f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')} within {waited} ({reason}); "
        "start every rank (srun inside an allocation, or torchrun), or unset the SLURM_* variables to train "
        "in one process"
    )


def failed_collective(error: BaseException) -> Optional[str]:
    """The first line of `error` when it is a collective that failed because another rank died or did not
    answer within --dist-timeout (gloo's and NCCL's errors), without its source location; None otherwise."""
    text = str(error).strip()
    if not (isinstance(error, dist.DistError) or "gloo" in text or "NCCL" in text):
        return None
    return re.sub(r"^\[[^\]]*\] ", "", text.splitlines()[0] if text else type(error).__name__)[:200]


def exit_with_torchrun_agent() -> None:
    """Under torchrun (Linux), have the kernel send this worker SIGTERM when its agent dies, so that a
    killed agent (e.g. by a signal it does not handle, such as SIGUSR1) never leaves workers training on
    without a parent; SIGTERM takes the graceful preemption path (a step checkpoint, then exit).

    Only for torchrun's workers: a plain run under a shell that exits (nohup) must keep running."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    # (An agent that dies before this line, while the worker imports torch, is not noticed; checking
    # getppid() == 1 would misfire where torchrun itself is a container's process 1.)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        logging.warning(
            f"prctl(PR_SET_PDEATHSIG) failed (errno {ctypes.get_errno()}): this worker would outlive a killed torchrun"
        )


def resolved_device_type(device: str) -> str:
    """The device type `init_distributed` ends up on for `device` (cuda, cpu, ...): a known but
    unavailable device falls back to the CPU there. Known before any process group exists, so the
    run's config can hold the precision the device implies."""
    device_type = device.split(":", 1)[0]
    available, known = is_device_available(device_type)
    return "cpu" if known and not available else device_type


def unavailable_device(device: str) -> Optional[str]:
    """The error line for a `device` this machine lacks (None: it has it, or torch does not know the name)."""
    device_type = device.split(":", 1)[0]
    available, known = is_device_available(device_type)
    if not known or available:
        return None
    return (
        f"--device {device}: no {device_type} device is available on this machine; pass --device cpu to train on "
        "the CPU, or leave --device out to use a GPU when there is one"
    )


def wrap_ddp(
    model: torch.nn.Module, env: DistributedEnv, *, static_graph: bool = False, sync_batchnorm: bool = False
) -> torch.nn.Module:
    """DistributedDataParallel for several ranks (no device_ids on CPU); the model itself otherwise."""
    if not env.distributed:
        return model
    if sync_batchnorm:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    device_ids = [env.device] if env.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, static_graph=static_graph)


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside torch.compile's wrapper and DDP (whose state_dict has no '_orig_mod.' or 'module.' prefix)."""
    model = getattr(model, "_orig_mod", model)
    return model.module if isinstance(model, DistributedDataParallel) else model


def all_reduce_sum(tensor: torch.Tensor, env: DistributedEnv) -> torch.Tensor:
    """Sum of `tensor` over ranks (a copy; the input is unchanged)."""
    tensor = tensor.clone()
    if env.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def any_rank(flag: bool, env: DistributedEnv) -> bool:
    """True on every rank when `flag` is true on at least one."""
    return any_rank_each([flag], env)[0]


def any_rank_each(flags: Sequence[bool], env: DistributedEnv) -> List[bool]:
    """For each of `flags`, whether it is true on at least one rank: several decisions, one all-reduce."""
    if not env.distributed:
        return list(flags)
    values = torch.tensor([1.0 if flag else 0.0 for flag in flags], device=env.device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return [bool(value) for value in values.tolist()]


def broadcast_object(obj: Any, env: DistributedEnv, src: int = 0) -> Any:
    """Rank `src`'s `obj` on every rank."""
    if not env.distributed:
        return obj
    objects = [obj if env.rank == src else None]
    dist.broadcast_object_list(objects, src=src)
    return objects[0]


def all_gather_object(obj: Any, env: DistributedEnv) -> List[Any]:
    """Every rank's `obj`, in rank order, on every rank."""
    if not env.distributed:
        return [obj]
    objects: List[Any] = [None] * env.world_size
    dist.all_gather_object(objects, obj)
    return objects


def barrier(env: DistributedEnv) -> None:
    if env.distributed:
        dist.barrier()


def shutdown(env: DistributedEnv) -> None:
    if env.distributed and dist.is_initialized():
        dist.destroy_process_group()
