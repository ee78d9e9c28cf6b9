"""A run's folder, `<logs>/<name>/`, as a launch sets it up: its paths and name, refusing to start a new run
over an earlier one, the lock that keeps two launches of one run apart, room for a checkpoint, setting an
earlier launch's files aside, params.txt and the loss's journals (their names: `training.trainer.run_folder.layout`)."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from open_clip_adacl import Loss

from ..distributed import DistributedEnv, any_rank, barrier, broadcast_object
from ..engine.checkpoint import TrainState, plain_args
from ..engine.model import parameter_count
from ..flags import ConfigError
from ..run_folder.checkpoint_files import (
    atomic_file,
    check_checkpoint_space,
    estimated_checkpoint_bytes,
    remove_stale_temporary_files,
)
from ..run_folder.layout import ARGS_NAME, CHECKPOINT_DIR_NAME, LOG_NAME, PARAMS_NAME, RunDir
from ..run_folder.lock import LOCK_NAME, RunInUse, RunLock
from ..run_folder.rewind import checkpoint_files, set_aside_earlier_launch
from ..run_folder.safe_write import RunFiles, cause_of, free_inodes, no_inodes_text
from .config import RESUME_LATEST, RunConfig
from .params import dumped_args


@dataclass
class RunPaths:
    name: str
    run_dir: Optional[str]  # None with --logs none
    checkpoint_dir: Optional[str]
    log_file: Optional[str]  # None on ranks that do not write a log file


def start_over(paths: RunPaths, env: DistributedEnv) -> None:
    """A launch from scratch in a folder an earlier launch wrote: its files go aside (rank 0)."""
    if env.is_master and paths.run_dir is not None:
        set_aside_earlier_launch(Path(paths.run_dir), Path(paths.checkpoint_dir))
    barrier(env)


def hold_run_dir(lock: RunLock, paths: RunPaths, env: DistributedEnv) -> None:
    """Rank 0 locks the run folder, then removes the temporary files an earlier launch killed mid-write left there;
    every rank stops with its one line when another launch holds it or the folder takes no lock file (read-only,
    a full disk)."""
    problem = None
    if env.is_master and paths.run_dir is not None:
        try:
            lock.acquire(paths.run_dir)
        except RunInUse as error:
            problem = str(error)
        except OSError as error:
            problem = (
                f"cannot write the run's lock {os.path.join(paths.run_dir, LOCK_NAME)} ({cause_of(error)}): "
                "a run writes into its folder; make it writable, or choose another --logs or --name"
            )
        else:
            try:
                remove_stale_temporary_files([paths.run_dir, paths.checkpoint_dir])
            except OSError as error:  # the lock was written: the folder holding the leftover is the one refusing
                problem = (
                    f"cannot remove {error.filename or 'a temporary file'} that a cut write left ({cause_of(error)}): "
                    "the run writes its checkpoints beside it; make that folder writable, or choose another --logs "
                    "or --name"
                )
    problem = broadcast_object(problem, env)
    if problem:
        raise ConfigError(problem)


def is_inside(path: str, directory: Optional[str]) -> bool:
    return directory is not None and Path(directory).resolve() in Path(path).resolve().parents


def build_run_paths(cfg: RunConfig, env: DistributedEnv) -> RunPaths:
    """<logs>/<name>/ and its files; refuses to overwrite an earlier run unless resuming it."""
    name = cfg.logging.name if cfg.logging.name is not None else default_run_name(cfg, env)
    if cfg.logging.logs is None:
        return RunPaths(name, None, None, None)
    run_dir = os.path.join(cfg.logging.logs, name)
    checkpoint_dir = os.path.join(run_dir, CHECKPOINT_DIR_NAME)
    log_file = os.path.join(run_dir, f"out-{env.rank}.log" if cfg.logging.log_local else LOG_NAME)
    writes_log = env.is_local_master if cfg.logging.log_local else env.is_master
    # Decided together: a rank that raised alone would leave the others waiting at the next collective.
    if any_rank(writes_log and run_dir_collision(cfg.resume, log_file, checkpoint_dir) is not None, env):
        raise ConfigError(
            run_dir_collision(cfg.resume, log_file, checkpoint_dir)
            or f"{run_dir} already holds a run (seen by another rank)"
        )
    problem = None
    if env.is_master:
        problem = cannot_create(checkpoint_dir)
    problem = broadcast_object(problem, env)
    if problem:
        raise ConfigError(problem)
    if writes_log:
        os.makedirs(run_dir, exist_ok=True)
    return RunPaths(name, run_dir, checkpoint_dir, log_file if writes_log else None)


def run_folder_warnings(cfg: RunConfig) -> List[str]:
    """What is legal but surprising about where the run writes: a --name that leads out of --logs (`../x`, an
    absolute path) puts the run's files where a look into --logs will not find them (judged by the names, not by
    where links lead)."""
    name, logs = cfg.logging.name, cfg.logging.logs
    if name is None or logs is None:
        return []
    run_dir = os.path.normpath(os.path.join(logs, name))
    if os.path.relpath(run_dir, os.path.normpath(logs)).split(os.sep)[0] != os.pardir:
        return []
    return [
        f"--name {name} puts the run outside --logs {logs}: it writes to {os.path.abspath(run_dir)}; pass a name "
        "inside --logs (without '..' or a leading '/') unless that is where the run belongs"
    ]


def cannot_create(directory: str) -> Optional[str]:
    """Create `directory`; the error line when that fails (None: it exists now)."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        return (
            f"cannot create {directory} ({error.strerror}: {error.filename}"
            + (f"; {no_inodes_text(directory)}" if error.errno == errno.ENOSPC and free_inodes(directory) == 0 else "")
            + "); choose another --logs or --name, or fix the path"
        )
    return None


def check_run_checkpoint_space(
    paths: RunPaths, num_parameters: int, loss_fn: Loss, kept: Dict[str, int], env: DistributedEnv
) -> Optional[str]:
    """Before training (rank 0 checks, every rank stops): the checkpoint folder takes a file and has room for one
    checkpoint of a model of `num_parameters`, its optimizer and the loss state; returns, on rank 0, the disk the
    `kept` files will need (`checkpoint_disk_text`, for the run's plan line)."""
    if paths.checkpoint_dir is None:
        return None
    problem = disk = None
    if env.is_master:
        needed = estimated_checkpoint_bytes(num_parameters, state_bytes(loss_fn))
        try:
            check_checkpoint_space(paths.checkpoint_dir, needed)
            disk = checkpoint_disk_text(paths.checkpoint_dir, needed, kept)
        except ValueError as error:
            problem = str(error)
    problem = broadcast_object(problem, env)
    if problem:
        raise ConfigError(problem)
    return disk


def check_dry_run_checkpoint_space(cfg: RunConfig, loss_fn: Loss, kept: Dict[str, int]) -> None:
    """The dry run's version of `check_run_checkpoint_space`: the model is counted on the meta device
    (no weights are allocated), the folder may not exist yet (its nearest existing parent is checked)."""
    target = (
        os.path.join(cfg.logging.logs, cfg.logging.name, CHECKPOINT_DIR_NAME)
        if cfg.logging.name is not None
        else cfg.logging.logs
    )
    logging.disable(logging.WARNING)  # open_clip's "No pretrained weights loaded" is noise here
    try:
        needed = estimated_checkpoint_bytes(parameter_count(cfg.model), state_bytes(loss_fn))
    except Exception as error:  # noqa: BLE001 - e.g. a hub model not downloaded: check writability only
        print(
            f"warning: could not size a checkpoint of --model {cfg.model.name} ({error!r}); only checking that "
            f"{target} is writable",
            file=sys.stderr,
        )
        needed = 0
    finally:
        logging.disable(logging.NOTSET)
    try:
        check_checkpoint_space(target, needed)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if needed:
        log_checkpoint_disk(target, needed, kept, print)


def log_checkpoint_disk(target: str, one_checkpoint: int, kept: Dict[str, int], log) -> None:
    log(checkpoint_disk_text(target, one_checkpoint, kept))


def checkpoint_disk_text(target: str, one_checkpoint: int, kept: Dict[str, int]) -> str:
    """The disk the run's checkpoints will need: `kept` files of each kind at once, plus the one being written (a
    temporary file until it is renamed), against what is free in `target` now."""
    existing = Path(target)
    while not existing.exists():
        existing = existing.parent
    count = sum(kept.values()) + 1
    needed, free = count * one_checkpoint, shutil.disk_usage(existing).free
    kinds = ", ".join(f"{number} {kind}" for kind, number in kept.items() if number)
    line = (
        f"checkpoints: about {one_checkpoint / 1e9:.2f} GB each, up to {count} at once ({kinds}, one being "
        f"written): about {needed / 1e9:.1f} GB in {target}, {free / 1e9:.1f} GB free there"
    )
    if needed > free:
        line += (
            "; not enough: free space, raise --save-frequency or lower --keep-step-checkpoints, or the run "
            "stops saving when the disk fills"
        )
    return line


def state_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's state_dict tensors (a loss's per-sample banks, queues, ...)."""
    return sum(t.numel() * t.element_size() for t in module.state_dict().values() if isinstance(t, torch.Tensor))


def default_run_name(cfg: RunConfig, env: DistributedEnv) -> str:
    """OpenCLIP's name for a run without --name: rank 0's start time and the main settings, then the SLURM job
    (each task of a job array has its own) or rank 0's PID, so that launches in the same second differ."""
    job = os.environ.get("SLURM_JOB_ID")
    date, launch = broadcast_object(
        (datetime.now().strftime("%Y_%m_%d-%H_%M_%S"), f"job_{job}" if job else f"pid_{os.getpid()}"), env
    )
    return "-".join(
        [
            date,
            f"model_{cfg.model.name.replace('/', '-')}",
            f"lr_{cfg.optimizer.lr}",
            f"b_{cfg.data.batch_size}",
            f"j_{cfg.data.workers}",
            f"p_{cfg.model.precision}",
            launch,
        ]
    )


def run_dir_collision(resume_arg: Optional[str], log_file: str, checkpoint_dir: str) -> Optional[str]:
    """The error for starting a new run where `log_file` shows an earlier one (None: no collision).
    Continuing it (--resume latest) or rolling it back (--resume PATH of its own checkpoints) is no collision;
    nor is an earlier launch that left no checkpoint (its files are set aside: `start_over`)."""
    if resume_arg == RESUME_LATEST or not os.path.exists(log_file) or not checkpoint_files(Path(checkpoint_dir)):
        return None
    if resume_arg is not None and is_inside(resume_arg, checkpoint_dir):
        return None
    return (
        f"{os.path.dirname(log_file)} already holds a run; continue it with --resume latest, roll it back with "
        f"--resume {checkpoint_dir}/<checkpoint>, or choose another --name"
    )


def recorded_args(cfg: RunConfig, paths: RunPaths) -> Dict[str, Any]:
    """Every argument as this run used it (params.txt, checkpoints, wandb), with the name it got at start."""
    return {**cfg.recorded_args, "name": paths.name}


def launch_note(env: DistributedEnv, resumed_from: Optional[str], state: TrainState) -> str:
    """The header of this launch's block in params.txt."""
    start = (
        f"resumed from {resumed_from} at epoch {state.position.epoch}, step {state.step}, "
        f"{state.position.batches_in_epoch} batches into the epoch"
        if resumed_from
        else "from scratch"
    )
    return f"# launch at {datetime.now():%Y-%m-%d %H:%M:%S}, {env.world_size} rank(s), {start}"


def write_params(recorded: Dict[str, Any], paths: RunPaths, env: DistributedEnv, note: str, files: RunFiles) -> None:
    """params.txt: every argument, the loss's options included (OpenCLIP's format `name: value`), one block
    per launch, each under a `# launch ...` line (appended through `files`, so a resumed run keeps its history);
    params.json: this launch's arguments as values (`RunDir.recorded_args`), replaced atomically."""
    if not env.is_master:
        return
    lines = [f"{name}: {value}" for name, value in recorded.items()]
    logging.info("Params:\n  " + "\n  ".join(f"{name}: {value}" for name, value in dumped_args(recorded).items()))
    if paths.run_dir is not None:
        path = Path(paths.run_dir, PARAMS_NAME)
        separator = "\n" if path.exists() else ""
        files.append(path, separator + "\n".join([note, *lines]) + "\n")
        args_path = Path(paths.run_dir, ARGS_NAME)
        try:
            with atomic_file(args_path, "w") as f:
                f.write(json.dumps(plain_args(recorded), indent=1) + "\n")
        except OSError as error:
            files.give_up(args_path, "the launch's arguments as values", error)


class LossJournals:
    """The loss's `journals()` in the run folder (rank 0's), each as <name>.json, rewritten whenever it changed
    (AdaCL's choices of selection passes, as it makes them). The trainer asks after every step of this run and
    never after it ends, so what the loss journals later (the next run's in the same process) is not written
    here. A write that fails is logged and tried again at the journal's next change: a journal is no reason to
    stop training."""

    def __init__(self, loss_fn: Loss, paths: RunPaths, env: DistributedEnv) -> None:
        self.loss_fn = loss_fn
        self.run = RunDir(paths.run_dir) if env.is_master and paths.run_dir is not None else None
        self.written: Dict[str, Any] = {}  # per journal, what was last written (or tried)

    def update(self) -> None:
        if self.run is None:
            return
        for name, value in self.loss_fn.journals().items():
            if self.written.get(name) == value:
                continue
            self.written[name] = value
            path = self.run.loss_journal_path(name)
            try:
                with atomic_file(path, "w") as f:
                    f.write(json.dumps(value, indent=2) + "\n")
            except OSError as error:
                logging.warning(
                    f"Could not write {path} ({cause_of(error)}); training goes on, the journal is "
                    "written again when it changes"
                )
