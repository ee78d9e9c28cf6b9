"""Checkpoint files (the layout: `training.trainer.engine.checkpoint`): written atomically with the umask's mode, read with
their digest verified and an earlier layout converted, listed newest first (unreadable ones named and left
out), rolled back or moved aside (kept, never deleted), and the room one needs checked before a run."""

from __future__ import annotations

import logging
import os
import pickle
import re
import shutil
import tempfile
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Dict, Iterator, List, Mapping, Optional

import torch

from .checkpoint_digest import verify_digest
from .layout import CHECKPOINT_FILE_NAME
from .safe_write import ErrorRecordingFile, free_inodes, no_inodes_text

# The temporary files of `atomic_file`: ".<target>.<mkstemp's 8 characters>.tmp".
TEMPORARY_FILE_NAME = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")
CHECKPOINT_FORMAT = (
    2  # the layout of training.trainer.engine.checkpoint; checkpoints without a "format" key are converted on load
)


def current_umask() -> int:
    """The process's umask (reading it means setting it; restored at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_file(path: os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """A temporary file in `path`'s folder for the block to write, fsynced and renamed over `path` when the
    block ends (removed if it fails), so a reader sees the old file or the whole new one. It gets the mode a
    plain open() would give (0644 under umask 022), not mkstemp's 0600, so that teammates can read it on
    shared storage."""
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        if os.path.exists(tmp_name):
            os.remove(tmp_name)
        raise


@contextmanager
def staged_folder(folder: os.PathLike) -> Iterator[Path]:
    """A temporary folder inside `folder` (made if missing) for the block to write a set of files into; when the
    block ends they are renamed into `folder`, each over its namesake, and when it fails none is: the temporary
    folder goes, and `folder` with it when this made it, so that no part of the set stands there as if whole. An
    OSError of a file in the temporary folder (or of none) names `folder`, where the user looks."""
    folder = Path(folder)
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    stage = None
    try:
        stage = Path(tempfile.mkdtemp(prefix=".staged.", suffix=".tmp", dir=folder))
        yield stage
        for path in sorted(stage.iterdir()):
            os.replace(path, folder / path.name)
    except BaseException as error:
        if isinstance(error, OSError) and (error.filename is None or str(error.filename).startswith(str(stage))):
            error.filename = str(folder)
        if made:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)


def remove_stale_temporary_files(folders: List[os.PathLike]) -> List[Path]:
    """Remove the temporary files of `atomic_file` in `folders`, left by a process killed while it wrote (a
    checkpoint's is as large as the checkpoint); call it only while holding the run's lock, when no other
    process writes there. Returns the files removed."""
    removed = []
    for folder in dict.fromkeys(Path(folder) for folder in folders):
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if TEMPORARY_FILE_NAME.match(path.name) and path.is_file():
                size = path.stat().st_size
                path.unlink()
                removed.append((path, size))
    if removed:
        logging.info(
            f"Removed {len(removed)} temporary file(s) that a write cut short left "
            f"({sum(size for _, size in removed) / 1e6:.1f} MB): {', '.join(str(p) for p, _ in removed)}"
        )
    return [path for path, _ in removed]


def save_atomic(payload: Dict[str, Any], path: os.PathLike) -> None:
    """torch.save to `atomic_file(path)`, then make the rename itself durable."""
    path = Path(path)
    with atomic_file(path) as f:
        recording = ErrorRecordingFile(f)
        try:
            torch.save(payload, recording)
        except RuntimeError as error:  # torch reports a failed write as "unexpected pos": raise its cause
            raise (recording.error or error) from None
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class CheckpointEmpty(ValueError):
    """A checkpoint file of 0 bytes (torch's own error for it speaks of mmap)."""


def check_not_empty(path: os.PathLike) -> None:
    """CheckpointEmpty for a file of 0 bytes, in plain words."""
    if os.path.getsize(path) == 0:
        raise CheckpointEmpty("it is empty (0 bytes): a save or a copy that stopped before writing anything")


def load_checkpoint(path: os.PathLike, *, mmap: bool = False) -> Dict[str, Any]:
    """Read a checkpoint on the CPU (weights_only: no arbitrary code runs on load), in today's layout: one
    of the earlier layout (no "format" key) is converted; a bare state dict is returned as it is. Its
    content digest is checked first (`CheckpointDamaged` when it does not match; training.trainer.run_folder.checkpoint_digest);
    an empty file is `CheckpointEmpty`. Every checkpoint read of src/ comes here (tests/test_layout.py).
    `mmap` maps the tensors instead of copying them into memory: for a reader that looks and lets go (a
    check of --pretrained, the arguments a checkpoint recorded), not for a resume that keeps them."""
    check_not_empty(path)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    verify_digest(checkpoint, path)
    if "state_dict" in checkpoint and "format" not in checkpoint:
        checkpoint = converted_from_earlier_layout(checkpoint)
        logging.info(
            f"{path} is in the earlier checkpoint layout (written before components were saved by name, "
            "or by OpenCLIP); converted on load"
        )
    return checkpoint


def converted_from_earlier_layout(checkpoint: Mapping[str, Any]) -> Dict[str, Any]:
    """A checkpoint without "format" in today's layout. Its `data` held the position, the run's counters and
    the epoch's sums (skip counts summed over ranks, rank 0's loss sums; rank 0 carries them, the other
    ranks start from zero, as that layout's resume did); OpenCLIP's has no `data` (at an epoch boundary),
    and a DDP-wrapped model's 'module.' prefix where it saved without unwrapping."""
    data = checkpoint.get("data") or {}
    converted = {key: value for key, value in checkpoint.items() if key != "data"}
    converted["format"] = CHECKPOINT_FORMAT
    converted["state_dict"] = {key.removeprefix("module."): value for key, value in checkpoint["state_dict"].items()}
    converted["data"] = {
        "epoch": data.get("epoch", checkpoint.get("epoch", 0)),
        "batches_in_epoch": data.get("batches_in_epoch", 0),
    }
    converted["train"] = {
        "step": checkpoint.get("step", 0),
        "num_nonfinite_steps": data.get("num_nonfinite_steps", 0),
        "consecutive_nonfinite_steps": 0,
        "samples_seen": data.get("samples_seen", 0),
        "samples_per_schedule_step": data.get("samples_per_schedule_step", 0),
    }
    if "skip_counts" in data:
        world_size = saved_world_size(checkpoint, default=1)
        rank0 = {key: data[key] for key in ("skip_counts", "loss_sum", "num_loss_steps")}
        others = {"skip_counts": torch.zeros_like(data["skip_counts"]), "loss_sum": 0.0, "num_loss_steps": 0}
        converted["epoch_sums"] = [rank0] + [dict(others) for _ in range(world_size - 1)]
    return converted


def saved_world_size(checkpoint: Mapping[str, Any], default: int) -> int:
    """The number of ranks that wrote `checkpoint`: its `world_size`, else the length of its per-rank RNG
    list (a checkpoint from before `world_size` was saved), else `default` (OpenCLIP's, which has neither)."""
    return checkpoint.get("world_size") or len(checkpoint.get("rng") or ()) or default


def checkpoint_step(path: Path) -> int:
    """The training step a checkpoint file was written at. Opens the file (lazily, through mmap: the
    zip index and the pickled structure, not the tensors), so a truncated file raises here (an empty one:
    CheckpointEmpty)."""
    check_not_empty(path)
    return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("step", 0))


def checkpoint_candidates(checkpoint_dir: os.PathLike) -> List[Path]:
    """epoch_N.pt, epoch_latest.pt and step_N.pt, newest (most steps, then latest written) first.

    Every file is opened; an unreadable one (truncated by a crash outside our atomic writes, a
    half-copied file) is left out with a warning naming it.
    """
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        return []
    candidates = []
    for path in checkpoint_dir.iterdir():
        if not CHECKPOINT_FILE_NAME.match(path.name):
            continue
        try:
            candidates.append((checkpoint_step(path), path.stat().st_mtime, path))
        except Exception as error:  # noqa: BLE001 - any unreadable file is skipped, loudly
            logging.warning(f"Ignoring unreadable checkpoint {path}: {first_line(error)}")
    return [path for _, _, path in sorted(candidates, reverse=True)]


def roll_back(checkpoint_dir: os.PathLike, resumed_step: int) -> Optional[Path]:
    """Move the checkpoints of `checkpoint_dir` written after `resumed_step` into a new folder
    `rolled_back_after_step_<S>_<time>/` next to them (kept, never deleted; `--resume latest` no longer
    sees them); returns that folder, or None when nothing was newer."""
    checkpoint_dir = Path(checkpoint_dir)
    newer = []
    for path in checkpoint_dir.iterdir():
        if not CHECKPOINT_FILE_NAME.match(path.name):
            continue
        try:
            step = checkpoint_step(path)
        except Exception:  # noqa: BLE001 - an unreadable file cannot be resumed from either: set it aside
            step = None
        if step is None or step > resumed_step:
            newer.append(path)
    return move_aside(newer, checkpoint_dir / f"rolled_back_after_step_{resumed_step}_{datetime.now():%Y%m%d-%H%M%S}")


def move_aside(paths: List[Path], folder: Path) -> Optional[Path]:
    """Move `paths` into the new `folder` (kept, never deleted); the folder, or None when `paths` is empty."""
    if not paths:
        return None
    folder.mkdir()
    for path in paths:
        path.rename(folder / path.name)
    return folder


def estimated_checkpoint_bytes(num_parameters: int, loss_state_bytes: int) -> int:
    """One checkpoint: fp32 weights and AdamW's two fp32 moments (12 bytes a parameter), the loss's
    state, and 5% for the rest (RNG states, arguments, configs, zip overhead)."""
    return int((12 * num_parameters + loss_state_bytes) * 1.05)


def check_checkpoint_space(checkpoint_dir: os.PathLike, needed_bytes: int) -> None:
    """Raise ValueError (naming the folder and the fix) unless a checkpoint of `needed_bytes` can be
    written into `checkpoint_dir`, or, before it exists, into the folder it would be created in."""
    target = Path(checkpoint_dir)
    existing = target
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(
            f"checkpoints go to {target}, but {existing} is a file, not a folder; choose another --logs or --name"
        )
    if free_inodes(existing) == 0:
        raise ValueError(
            f"checkpoints go to {target}, but its file system has {no_inodes_text(existing)}; delete files there "
            "or choose another --logs"
        )
    try:  # writing is the only reliable test (os.access says yes to root on a read-only mount's files)
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise ValueError(
            f"checkpoints go to {target}, but {existing} is not writable ({error.strerror}); "
            "choose another --logs or fix its permissions"
        ) from None
    free = shutil.disk_usage(existing).free
    if free < needed_bytes:
        raise ValueError(
            f"checkpoints go to {target}: one checkpoint needs about {needed_bytes / 1e9:.2f} GB, "
            f"{free / 1e9:.2f} GB are free there; free space or choose another --logs"
        )


def first_line(error: BaseException) -> str:
    """The error in one line for a message. torch's refusal of a pickle under weights_only is told in our words:
    its advice to load the file with weights_only=False (which runs any code a pickle holds) is never passed on."""
    if isinstance(error, pickle.UnpicklingError):
        found = re.search(r"WeightsUnpickler error:\s*([^.\n]+)", str(error))  # the cause, not torch's advice
        return (
            "UnpicklingError: not a file of tensors and plain values, all a checkpoint is loaded as (a pickle's "
            f"code never runs here){f': {found.group(1)[:200]}' if found else ''}"
        )
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:300]}" if text else type(error).__name__
