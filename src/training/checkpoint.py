"""Checkpoints: atomic writes, OpenCLIP-compatible keys, and a one-call resume.

A checkpoint is a dict saved with `torch.save` that `torch.load(..., weights_only=True)` reads (so
OpenCLIP's `--pretrained PATH` and clip-benchmark load `epoch_N.pt` directly):

- OpenCLIP's keys: `epoch` (completed epochs), `name`, `state_dict` (the unwrapped model, no DDP
  'module.' prefix), `optimizer`, `scaler` (fp16 amp only);
- `step`: training steps taken (optimizer updates plus skipped non-finite steps);
- `loss`: the loss's `state_dict()` (per-sample state banks etc.; rank 0's copy, losses keep it
  identical on every rank);
- `data`: the position in the data stream: {"epoch", "batches_in_epoch", "skip_counts",
  "loss_sum", "num_loss_steps", "num_nonfinite_steps"} (the last four let the epoch summary of a
  resumed epoch count what happened before the interruption);
- `rng`: per-rank RNG states [{"torch", "cuda", "numpy", "python"}, ...] in rank order;
- `args`: every command-line argument (plain values), `model_cfg` / `preprocess_cfg`: the open_clip
  configs `training.export` writes next to the weights.

Files: `epoch_N.pt` (after epoch N), `epoch_latest.pt` (--save-most-recent), `step_N.pt`
(--save-every-n-steps; --keep-step-checkpoints K keeps the newest K) in `<logs>/<name>/checkpoints/`.
Each is written to a temporary file in the same directory, flushed and fsynced, then renamed over the
target, so a crash mid-write leaves the previous checkpoint intact; files get the umask's mode (0644
under umask 022). A failed save is logged loudly and training continues.
"""
from __future__ import annotations

import json
import logging
import os
import random
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from .distributed import DistributedEnv, all_gather_object, all_reduce_sum, unwrap_model

LATEST_CHECKPOINT_NAME = "epoch_latest.pt"
_CHECKPOINT_NAME = re.compile(r"^(epoch_(\d+|latest)|step_(\d+))\.pt$")


@dataclass
class TrainState:
    """Progress through training: what a checkpoint records and a resume restores."""

    epoch: int = 0                     # completed epochs (OpenCLIP's checkpoint "epoch")
    step: int = 0                      # training steps taken, skipped non-finite steps included
    batches_in_epoch: int = 0          # batches of epoch `epoch` already consumed
    num_nonfinite_steps: int = 0       # steps skipped for a non-finite loss, whole run
    consecutive_nonfinite_steps: int = 0
    # Running sums for the current epoch's summary (this rank's; skip counts are summed over ranks
    # when the epoch ends).
    skip_counts: Optional[torch.Tensor] = None
    loss_sum: float = 0.0
    num_loss_steps: int = 0
    rng: Optional[List[Dict[str, Any]]] = field(default=None, repr=False)  # per-rank RNG to restore

    def start_epoch(self, num_skip_reasons: int) -> None:
        """Reset the epoch's running sums unless resuming inside this epoch."""
        if self.batches_in_epoch == 0 or self.skip_counts is None:
            self.skip_counts = torch.zeros(num_skip_reasons, dtype=torch.long)
            self.loss_sum, self.num_loss_steps = 0.0, 0

    def finish_epoch(self) -> None:
        self.epoch += 1
        self.batches_in_epoch = 0


# ---------------------------------------------------------------------------------------------
# RNG states (stored as tensors and tuples so that weights_only loading accepts them)
# ---------------------------------------------------------------------------------------------


def rng_state() -> Dict[str, Any]:
    """This process's torch / CUDA / numpy / python RNG states."""
    name, key, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "numpy": {"name": name, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        "python": random.getstate(),
    }


def restore_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["name"], numpy_state["key"].numpy().astype(np.uint32), numpy_state["pos"],
                         numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------


def current_umask() -> int:
    """The process's umask (reading it means setting it; restored at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def save_atomic(payload: Dict[str, Any], path: os.PathLike) -> None:
    """torch.save to a temp file in the target's directory, fsync, then rename over the target.

    The file gets the mode a plain open() would give (0644 under umask 022), not mkstemp's 0600, so
    that teammates can read checkpoints on shared storage.
    """
    path = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        if os.path.exists(tmp_name):
            os.remove(tmp_name)
        raise
    # Make the rename itself durable.
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint(path: os.PathLike) -> Dict[str, Any]:
    """Read a checkpoint on the CPU (weights_only: no arbitrary code runs on load)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def step_checkpoint_number(path: Path) -> Optional[int]:
    """N for a step_N.pt file, else None."""
    match = _CHECKPOINT_NAME.match(path.name)
    return int(match.group(3)) if match and match.group(3) is not None else None


def checkpoint_step(path: Path) -> int:
    """The training step a checkpoint file was written at (read lazily through mmap)."""
    step = step_checkpoint_number(path)
    if step is not None:
        return step
    return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("step", 0))


def find_latest_checkpoint(checkpoint_dir: os.PathLike) -> Optional[Path]:
    """The checkpoint with the most steps among epoch_N.pt, epoch_latest.pt and step_N.pt; None if none.

    Unreadable files (e.g. truncated by a crash outside our atomic writes) are skipped with a warning.
    """
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        return None
    candidates = []
    for path in checkpoint_dir.iterdir():
        if not _CHECKPOINT_NAME.match(path.name):
            continue
        try:
            candidates.append((checkpoint_step(path), path.stat().st_mtime, path))
        except Exception as error:  # noqa: BLE001 - any unreadable file is skipped, loudly
            logging.warning(f"Ignoring unreadable checkpoint {path}: {error}")
    if not candidates:
        return None
    return max(candidates)[2]


# ---------------------------------------------------------------------------------------------
# Saving and resuming the run
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointConfig:
    """When to save and what to keep; where is the Checkpointer's `checkpoint_dir`."""

    save_frequency: int = 1          # epochs between epoch_N.pt
    save_most_recent: bool = False   # also epoch_latest.pt after every epoch
    save_every_n_steps: int = 0      # step_N.pt every N steps (0: off)
    delete_previous: bool = False    # remove the previous checkpoint of the same kind after a save
    keep_step_checkpoints: int = 0   # keep only the newest K step_N.pt (0: all); epoch files are never pruned
    total_epochs: int = 1


class Checkpointer:
    """Saves every stateful object of the run through its state_dict (rank 0 writes; all ranks call)."""

    def __init__(self, cfg: CheckpointConfig, *, checkpoint_dir: str, model, optimizer, scaler, loss,
                 env: DistributedEnv, name: str, args: Dict[str, Any], model_cfg: Dict[str, Any],
                 preprocess_cfg: Dict[str, Any]):
        self.cfg = cfg
        self.checkpoint_dir = Path(checkpoint_dir)
        self.model = model
        self.optimizer = optimizer
        self.scaler = scaler
        self.loss = loss
        self.env = env
        self.metadata = {
            "name": name,
            # A JSON round trip keeps only plain values, which weights_only loading accepts.
            "args": json.loads(json.dumps(args, default=str)),
            "model_cfg": model_cfg,
            "preprocess_cfg": json.loads(json.dumps(preprocess_cfg, default=str)),
        }
        self.last_saved: Optional[Path] = None
        if env.is_master:
            os.makedirs(self.checkpoint_dir, exist_ok=True)

    def payload(self, state: TrainState) -> Dict[str, Any]:
        """The checkpoint dict (collective: every rank must call it)."""
        rng = all_gather_object(rng_state(), self.env)
        skip_counts = all_reduce_sum(state.skip_counts.to(self.env.device), self.env).cpu()
        payload = {
            "epoch": state.epoch,
            "name": self.metadata["name"],
            "state_dict": unwrap_model(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "step": state.step,
            "loss": self.loss.state_dict(),
            "data": {
                "epoch": state.epoch,
                "batches_in_epoch": state.batches_in_epoch,
                "skip_counts": skip_counts,
                "loss_sum": state.loss_sum,
                "num_loss_steps": state.num_loss_steps,
                "num_nonfinite_steps": state.num_nonfinite_steps,
            },
            "rng": rng,
            "args": self.metadata["args"],
            "model_cfg": self.metadata["model_cfg"],
            "preprocess_cfg": self.metadata["preprocess_cfg"],
        }
        if self.scaler is not None:
            payload["scaler"] = self.scaler.state_dict()
        return payload

    def save(self, filenames: List[str], state: TrainState) -> List[Path]:
        """Write the checkpoint under each of `filenames` (rank 0); a failure is logged, not raised."""
        payload = self.payload(state)
        if not self.env.is_master:
            return []
        written = []
        for filename in filenames:
            path = self.checkpoint_dir / filename
            try:
                save_atomic(payload, path)
            except Exception as error:  # noqa: BLE001 - training must outlive a full disk or a flaky mount
                logging.error(f"CHECKPOINT SAVE FAILED: could not write {path}: {error!r}. Training continues; "
                              f"the previous checkpoint ({self.last_saved}) is intact.")
                continue
            logging.info(f"Saved checkpoint {path} (epoch {state.epoch}, step {state.step})")
            written.append(path)
            self.last_saved = path
        return written

    def _step_filenames(self, state: TrainState) -> List[str]:
        every = self.cfg.save_every_n_steps
        return [f"step_{state.step}.pt"] if every and state.step % every == 0 else []

    def maybe_save_step(self, state: TrainState) -> None:
        """step_N.pt every --save-every-n-steps steps (collective: every rank calls it)."""
        filenames = self._step_filenames(state)
        if filenames:
            self._save_and_prune(filenames, state)

    def save_epoch(self, state: TrainState) -> None:
        """After an epoch: epoch_N.pt (every --save-frequency epochs and after the last), epoch_latest.pt
        (--save-most-recent), as OpenCLIP, and step_N.pt when the epoch ended on a step-checkpoint step."""
        completed = state.epoch
        filenames = self._step_filenames(state)
        if completed == self.cfg.total_epochs or (
                self.cfg.save_frequency > 0 and completed % self.cfg.save_frequency == 0):
            filenames.append(f"epoch_{completed}.pt")
        if self.cfg.save_most_recent:
            filenames.append(LATEST_CHECKPOINT_NAME)
        if filenames:
            self._save_and_prune(filenames, state)

    def _save_and_prune(self, filenames: List[str], state: TrainState) -> None:
        """Save, then with --delete-previous-checkpoint remove the previous epoch_N.pt / older step_N.pt,
        and with --keep-step-checkpoints K all but the newest K step_N.pt."""
        written = self.save(filenames, state)
        keep_steps = 1 if self.cfg.delete_previous else self.cfg.keep_step_checkpoints
        for path in written:
            if self.cfg.delete_previous and path.name.startswith("epoch_") and path.name != LATEST_CHECKPOINT_NAME:
                previous = self.checkpoint_dir / f"epoch_{state.epoch - 1}.pt"
                previous.unlink(missing_ok=True)
            elif keep_steps and step_checkpoint_number(path) is not None:
                steps = sorted((step_checkpoint_number(p), p) for p in self.checkpoint_dir.glob("step_*.pt")
                               if step_checkpoint_number(p) is not None)
                for _, older in steps[:-keep_steps]:
                    older.unlink(missing_ok=True)


def resume(path: os.PathLike, *, model, optimizer, scaler, loss, env: DistributedEnv,
           reset_loss_state: bool = False) -> TrainState:
    """Restore model, optimizer, scaler and loss from `path`; return the progress to continue from.

    With `reset_loss_state` the loss restarts its own state (`loss.reset_state()`) instead.

    The RNG states are returned in `TrainState.rng` for the trainer to restore right before the next
    batch is drawn (restoring earlier would let setup work consume random numbers).
    """
    checkpoint = load_checkpoint(path)
    state_dict = checkpoint["state_dict"]
    if next(iter(state_dict)).startswith("module."):
        state_dict = {key[len("module."):]: value for key, value in state_dict.items()}
    unwrap_model(model).load_state_dict(state_dict)
    optimizer.load_state_dict(checkpoint["optimizer"])
    if scaler is not None and "scaler" in checkpoint:
        scaler.load_state_dict(checkpoint["scaler"])
    if reset_loss_state:
        loss.reset_state()
        logging.info("The loss's state starts afresh (--reset-loss-state)")
    elif "loss" in checkpoint:
        loss.load_state_dict(checkpoint["loss"])
    else:
        logging.warning(f"{path} has no loss state (an OpenCLIP checkpoint?); the loss starts fresh")
    epoch = checkpoint["epoch"]
    data = checkpoint.get("data", {"epoch": epoch, "batches_in_epoch": 0})
    rng = checkpoint.get("rng")
    if rng is not None and len(rng) != env.world_size:
        logging.warning(f"{path} holds RNG states of {len(rng)} ranks, this run has {env.world_size}; "
                        "random streams are re-seeded instead of restored")
        rng = None
    state = TrainState(
        epoch=data["epoch"],
        step=checkpoint.get("step", 0),
        batches_in_epoch=data["batches_in_epoch"],
        num_nonfinite_steps=data.get("num_nonfinite_steps", 0),
        rng=rng,
    )
    if state.batches_in_epoch and env.is_master:
        # The epoch's running sums so far (skip counts summed over ranks, so only rank 0 carries them).
        state.skip_counts = data["skip_counts"].clone()
        state.loss_sum, state.num_loss_steps = data["loss_sum"], data["num_loss_steps"]
    elif state.batches_in_epoch:
        state.skip_counts = torch.zeros_like(data["skip_counts"])
    logging.info(f"Resumed from {path}: epoch {state.epoch}, step {state.step}, "
                 f"{state.batches_in_epoch} batches into the epoch")
    return state
