"""Checkpoints: atomic writes, OpenCLIP-compatible keys, and a one-call resume.

A checkpoint is a dict saved with `torch.save` that `torch.load(..., weights_only=True)` reads (so
OpenCLIP's `--pretrained PATH` and clip-benchmark load `epoch_N.pt` directly):

- OpenCLIP's keys: `epoch` (completed epochs), `name`, `state_dict` (the unwrapped model, no DDP
  'module.' prefix), `optimizer`, `scaler` (fp16 amp only);
- `step`: training steps taken (optimizer updates plus skipped non-finite steps);
- `loss`: the loss's `state_dict()` (per-sample state banks etc.; rank 0's copy, losses keep it
  identical on every rank);
- `data`: the position in the data stream: {"epoch", "batches_in_epoch", "skip_counts",
  "loss_sum", "num_loss_steps", "num_nonfinite_steps", "samples_seen", "samples_per_schedule_step"}
  (the skip counts and loss sums let the epoch summary of a resumed epoch count what happened before
  the interruption; the last two place the LR schedule by global samples trained);
- `rng`: per-rank RNG states [{"torch", "cuda", "numpy", "python"}, ...] in rank order;
- `world_size`: the number of ranks that wrote it;
- `args`: every command-line argument (plain values), `model_cfg` / `preprocess_cfg`: the open_clip
  configs `training.export` writes next to the weights.

Files: `epoch_N.pt` (after epoch N), `epoch_latest.pt` (--save-most-recent), `step_N.pt`
(--save-every-n-steps, and at a preemption; --keep-step-checkpoints K keeps the newest K) in
`<logs>/<name>/checkpoints/`. Each is written to a temporary file in the same directory, flushed and
fsynced, then renamed over the target, so a crash mid-write leaves the previous checkpoint intact;
files get the umask's mode (0644 under umask 022). A failed save is retried once, then logged loudly;
training continues, but a run whose last save fails ends with a non-zero status (`training.main`).

A resume checks first that the checkpoint's run can be continued by this one (`check_resume`): a
mid-epoch position only means something for the same data order, and weights and loss state only
load into the same model and loss.
"""
from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Mapping, Optional

import numpy as np
import torch

from .distributed import DistributedEnv, all_gather_object, all_reduce_sum, any_rank, unwrap_model
from .flags import ConfigError, HelpGroup, flag, from_flag

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
    # The LR schedule's position is samples_seen / samples_per_schedule_step: OpenCLIP's step-based
    # schedule in units of the global batch the run started with, so a resume with another world size
    # or batch size continues it from the samples trained rather than from a recomputed step.
    samples_seen: int = 0                 # global samples of all steps taken
    samples_per_schedule_step: int = 0    # 0 until the trainer sets it (the first launch's global batch)

    @property
    def schedule_position(self) -> float:
        return self.samples_seen / self.samples_per_schedule_step

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
    """The training step a checkpoint file was written at. Opens the file (lazily, through mmap: the
    zip index and the pickled structure, not the tensors), so a truncated file raises here."""
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
        if not _CHECKPOINT_NAME.match(path.name):
            continue
        try:
            candidates.append((checkpoint_step(path), path.stat().st_mtime, path))
        except Exception as error:  # noqa: BLE001 - any unreadable file is skipped, loudly
            logging.warning(f"Ignoring unreadable checkpoint {path}: {_first_line(error)}")
    return [path for _, _, path in sorted(candidates, reverse=True)]


def roll_back(checkpoint_dir: os.PathLike, resumed_step: int) -> Optional[Path]:
    """Move the checkpoints of `checkpoint_dir` written after `resumed_step` into a new folder
    `rolled_back_after_step_<S>_<time>/` next to them (kept, never deleted; `--resume latest` no longer
    sees them); returns that folder, or None when nothing was newer."""
    checkpoint_dir = Path(checkpoint_dir)
    newer = []
    for path in checkpoint_dir.iterdir():
        if not _CHECKPOINT_NAME.match(path.name):
            continue
        try:
            step = checkpoint_step(path)
        except Exception:  # noqa: BLE001 - an unreadable file cannot be resumed from either: set it aside
            step = None
        if step is None or step > resumed_step:
            newer.append(path)
    if not newer:
        return None
    folder = checkpoint_dir / f"rolled_back_after_step_{resumed_step}_{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir()
    for path in newer:
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
        raise ValueError(f"checkpoints go to {target}, but {existing} is a file, not a folder; choose another "
                         "--logs or --name")
    try:  # writing is the only reliable test (os.access says yes to root on a read-only mount's files)
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise ValueError(f"checkpoints go to {target}, but {existing} is not writable ({error.strerror}); "
                         "choose another --logs or fix its permissions") from None
    free = shutil.disk_usage(existing).free
    if free < needed_bytes:
        raise ValueError(f"checkpoints go to {target}: one checkpoint needs about {needed_bytes / 1e9:.2f} GB, "
                         f"{free / 1e9:.2f} GB are free there; free space or choose another --logs")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:300]}" if text else type(error).__name__


# ---------------------------------------------------------------------------------------------
# Saving and resuming the run
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointConfig:
    """When to save and what to keep; where is the Checkpointer's `checkpoint_dir`."""

    FLAG_GROUP: ClassVar[str] = HelpGroup.LOGS

    save_frequency: int = flag(1, "How often (epochs) to save checkpoints.")
    save_most_recent: bool = flag(False, "Always save the most recent model trained to epoch_latest.pt.")
    save_every_n_steps: int = flag(0, "Also save step_N.pt every N optimizer steps (0: off), so a crash loses at "
                                      "most N steps.")
    delete_previous: bool = flag(False, "Delete the previous checkpoint after storing a new one.",
                                 name="--delete-previous-checkpoint")
    keep_step_checkpoints: int = flag(0, "Keep only the K most recent step_N.pt (0: keep all); epoch checkpoints are "
                                         "never removed by this flag.", metavar="K")
    total_epochs: int = from_flag("epochs", default=1)

    def check(self) -> None:
        if self.save_every_n_steps < 0:
            raise ConfigError(f"--save-every-n-steps must be >= 0 (0 turns step checkpoints off), got "
                              f"{self.save_every_n_steps}")
        if self.keep_step_checkpoints < 0:
            raise ConfigError(f"--keep-step-checkpoints must be >= 0 (0 keeps every step checkpoint), got "
                              f"{self.keep_step_checkpoints}")


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
            "args": plain_args(args),
            "model_cfg": model_cfg,
            "preprocess_cfg": plain_args(preprocess_cfg),
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
                "samples_seen": state.samples_seen,
                "samples_per_schedule_step": state.samples_per_schedule_step,
            },
            "rng": rng,
            "world_size": self.env.world_size,
            "args": self.metadata["args"],
            "model_cfg": self.metadata["model_cfg"],
            "preprocess_cfg": self.metadata["preprocess_cfg"],
        }
        if self.scaler is not None:
            payload["scaler"] = self.scaler.state_dict()
        return payload

    def save(self, filenames: List[str], state: TrainState) -> List[Path]:
        """Write the checkpoint under each of `filenames` (rank 0); a failed write is retried once, then
        logged, not raised: the returned files are those written (all of them on other ranks)."""
        payload = self.payload(state)
        if not self.env.is_master:
            return [self.checkpoint_dir / filename for filename in filenames]
        written = []
        for filename in filenames:
            path = self.checkpoint_dir / filename
            if self._write_with_retry(payload, path):
                logging.info(f"Saved checkpoint {path} (epoch {state.epoch}, step {state.step})")
                written.append(path)
                self.last_saved = path
        return written

    def _write_with_retry(self, payload: Dict[str, Any], path: Path) -> bool:
        for attempt in (1, 2):
            try:
                save_atomic(payload, path)
                return True
            except Exception as error:  # noqa: BLE001 - training must outlive a full disk or a flaky mount
                if attempt == 1:
                    logging.warning(f"Could not write {path} ({error!r}); retrying once")
                    continue
                logging.error(f"CHECKPOINT SAVE FAILED: could not write {path}: {error!r}. Training continues; "
                              f"the previous checkpoint ({self.last_saved}) is intact.")
        return False

    def _step_filenames(self, state: TrainState) -> List[str]:
        every = self.cfg.save_every_n_steps
        return [f"step_{state.step}.pt"] if every and state.step % every == 0 else []

    def maybe_save_step(self, state: TrainState) -> None:
        """step_N.pt every --save-every-n-steps steps (collective: every rank calls it)."""
        filenames = self._step_filenames(state)
        if filenames:
            self._save_and_prune(filenames, state)

    def save_now(self, state: TrainState) -> Optional[Path]:
        """step_N.pt for this step whatever --save-every-n-steps says (a preemption); the file, or None when
        the write failed (collective; the result is rank 0's on every rank)."""
        written = self._save_and_prune([f"step_{state.step}.pt"], state)
        if any_rank(not written, self.env):
            return None
        return self.checkpoint_dir / f"step_{state.step}.pt"

    def save_epoch(self, state: TrainState) -> bool:
        """After an epoch: epoch_N.pt (every --save-frequency epochs and after the last), epoch_latest.pt
        (--save-most-recent), as OpenCLIP, and step_N.pt when the epoch ended on a step-checkpoint step.
        Whether every file was written (collective; rank 0's answer on every rank)."""
        completed = state.epoch
        filenames = self._step_filenames(state)
        if completed == self.cfg.total_epochs or (
                self.cfg.save_frequency > 0 and completed % self.cfg.save_frequency == 0):
            filenames.append(f"epoch_{completed}.pt")
        if self.cfg.save_most_recent:
            filenames.append(LATEST_CHECKPOINT_NAME)
        written = self._save_and_prune(filenames, state) if filenames else []
        return not any_rank(len(written) < len(filenames), self.env)

    def _save_and_prune(self, filenames: List[str], state: TrainState) -> List[Path]:
        """Save, then with --delete-previous-checkpoint remove the previous epoch_N.pt / older step_N.pt,
        and with --keep-step-checkpoints K all but the newest K step_N.pt. Returns the files written."""
        written = self.save(filenames, state)
        if not self.env.is_master:
            return written
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
        return written


class ResumeError(ValueError):
    """A checkpoint this run cannot continue as asked; the message names the difference and the way out."""


# With the world size, these fix which samples each batch of an epoch holds (training.data's order).
SAMPLE_ORDER_ARGS = ("batch_size", "workers", "accum_freq", "train_data", "train_num_samples", "dataset_type",
                     "dataset_resampled", "train_data_upsampling_factors", "train_group_size", "caption_key", "seed")
# These fix the shapes of the weights.
MODEL_SHAPE_ARGS = ("model", "force_image_size", "force_context_length", "force_quick_gelu", "force_custom_text")


@dataclass(frozen=True)
class ResumeRequest:
    """What the resuming run is: its recorded arguments, world size, and what it agreed to give up."""

    args: Mapping[str, Any]
    world_size: int
    reset_loss_state: bool = False
    resume_anyway: bool = False      # continue a mid-epoch checkpoint although the data order changed


def _flag(name: str) -> str:
    return "the world size" if name == "world_size" else "--" + name.replace("_", "-")


def _describe(changes: Mapping[str, tuple]) -> str:
    return ", ".join(f"{_flag(name)} {old} -> {new}" for name, (old, new) in changes.items())


def _describe_options(changes: Mapping[str, tuple]) -> str:
    return ", ".join(f"{name} {old} -> {new}" for name, (old, new) in changes.items())


def plain_args(args: Mapping[str, Any]) -> Dict[str, Any]:
    """The arguments as a checkpoint stores them: a JSON round trip keeps only plain values, which
    weights_only loading accepts (tuples become lists, other objects their str)."""
    return json.loads(json.dumps(dict(args), default=str))


def _global_batch(args: Mapping[str, Any], world_size: int) -> int:
    return int(args["batch_size"]) * world_size


def check_resume(checkpoint: Mapping[str, Any], path: os.PathLike, request: ResumeRequest) -> Dict[str, tuple]:
    """Refuse (ResumeError) what this run cannot honour; return the sample-order changes it accepts.

    - another model architecture: refused (the weights cannot load);
    - another --loss: refused unless --reset-loss-state;
    - mid-epoch (batches_in_epoch > 0), any change of the world size or of SAMPLE_ORDER_ARGS: refused
      unless --resume-anyway, since the rest of the epoch would see some samples twice and others never;
    - at an epoch boundary these changes are accepted (returned, to be logged).
    A checkpoint without recorded arguments (OpenCLIP's) is not checked.
    """
    old, new = checkpoint.get("args") or {}, request.args
    if not old:
        return {}
    model = {name: (old[name], new.get(name)) for name in MODEL_SHAPE_ARGS if name in old and old[name] != new.get(name)}
    if model:
        raise ResumeError(f"{path} holds weights of another architecture ({_describe(model)}): they cannot load; "
                          f"resume with the checkpoint's values, or start a new run under another --name")
    if old.get("loss") != new.get("loss") and not request.reset_loss_state:
        raise ResumeError(f"{path} was trained with --loss {old.get('loss')}, this run has --loss {new.get('loss')}: "
                          f"the loss's state cannot carry over; add --reset-loss-state to start it afresh (weights "
                          f"and optimizer are restored), or resume with --loss {old.get('loss')}")
    changes = {name: (old[name], new.get(name)) for name in SAMPLE_ORDER_ARGS
               if name in old and old[name] != new.get(name)}
    old_world = checkpoint.get("world_size") or len(checkpoint.get("rng") or ()) or request.world_size
    if old_world != request.world_size:
        changes = {"world_size": (old_world, request.world_size), **changes}
    data = checkpoint.get("data") or {}
    batches = data.get("batches_in_epoch", 0)
    if changes and batches and not request.resume_anyway:
        raise ResumeError(
            f"{path} is {batches} batches into epoch {data['epoch']} and this run changes {_describe(changes)}: the "
            f"rest of the epoch would see some samples twice and others never; resume with the checkpoint's "
            f"settings, or from a checkpoint at an epoch boundary (epoch_N.pt), or pass --resume-anyway to continue "
            f"at the same number of samples into the epoch in the new order (exact data order is given up for "
            f"the rest of this epoch)")
    return changes


def translated_position(checkpoint: Mapping[str, Any], request: ResumeRequest) -> int:
    """--resume-anyway: the batch of this run's epoch that follows as many global samples as the
    checkpoint's run had consumed of it (rounded down to whole optimizer steps)."""
    old = checkpoint["args"]
    old_world = checkpoint.get("world_size") or len(checkpoint.get("rng") or ()) or request.world_size
    consumed = checkpoint["data"]["batches_in_epoch"] * _global_batch(old, old_world)
    batches = consumed // _global_batch(request.args, request.world_size)
    return batches - batches % int(request.args.get("accum_freq", 1))


def _changed_loss_options(checkpoint: Mapping[str, Any], request: ResumeRequest) -> Dict[str, tuple]:
    old = (checkpoint.get("args") or {}).get("loss_options") or {}
    new = request.args.get("loss_options") or {}
    return {name: (old.get(name), new.get(name)) for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)}


def resume(path: os.PathLike, *, model, optimizer, scaler, loss, env: DistributedEnv,
           request: Optional[ResumeRequest] = None, checkpoint: Optional[Mapping[str, Any]] = None) -> TrainState:
    """Restore model, optimizer, scaler and loss from `path` (or its already loaded `checkpoint`); return
    the progress to continue from. With `request`, first `check_resume` (ResumeError on what it refuses).

    With `request.reset_loss_state` the loss restarts its own state (`loss.reset_state()`) instead.

    The RNG states are returned in `TrainState.rng` for the trainer to restore right before the next
    batch is drawn (restoring earlier would let setup work consume random numbers).
    """
    checkpoint = load_checkpoint(path) if checkpoint is None else checkpoint
    request = request or ResumeRequest(args=checkpoint.get("args") or {}, world_size=env.world_size)
    changes = check_resume(checkpoint, path, request)
    state_dict = checkpoint["state_dict"]
    if next(iter(state_dict)).startswith("module."):
        state_dict = {key[len("module."):]: value for key, value in state_dict.items()}
    try:
        unwrap_model(model).load_state_dict(state_dict)
    except RuntimeError as error:
        raise ResumeError(f"{path}: its weights do not fit this model ({_first_line(error)}); resume with the "
                          "checkpoint's --model and --force-* settings") from None
    try:
        optimizer.load_state_dict(checkpoint["optimizer"])
    except ValueError as error:
        raise ResumeError(f"{path}: its optimizer state does not fit this run's trainable parameters "
                          f"({_first_line(error)}); resume with the checkpoint's --lock-* settings") from None
    if scaler is not None and "scaler" in checkpoint:
        scaler.load_state_dict(checkpoint["scaler"])
    _restore_loss_state(checkpoint, path, loss, request)
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
        samples_seen=data.get("samples_seen", 0),
        samples_per_schedule_step=data.get("samples_per_schedule_step", 0),
    )
    if changes and state.batches_in_epoch:  # accepted with --resume-anyway
        state.batches_in_epoch = translated_position(checkpoint, request)
        state.rng = None
        logging.warning(f"--resume-anyway: {path} was {data['batches_in_epoch']} batches into epoch {state.epoch}; "
                        f"with {_describe(changes)} this run continues at batch {state.batches_in_epoch}, in its own "
                        "sample order (some samples of this epoch are seen twice or not at all)")
    elif changes:
        logging.info(f"Resuming at an epoch boundary with {_describe(changes)}: the next epoch follows this run's "
                     "data order, and the LR schedule continues from the samples trained so far")
    if state.batches_in_epoch and env.is_master:
        # The epoch's running sums so far (skip counts summed over ranks, so only rank 0 carries them).
        state.skip_counts = data["skip_counts"].clone()
        state.loss_sum, state.num_loss_steps = data["loss_sum"], data["num_loss_steps"]
    elif state.batches_in_epoch:
        state.skip_counts = torch.zeros_like(data["skip_counts"])
    logging.info(f"Resumed from {path}: epoch {state.epoch}, step {state.step}, "
                 f"{state.batches_in_epoch} batches into the epoch")
    return state


def _restore_loss_state(checkpoint: Mapping[str, Any], path: os.PathLike, loss, request: ResumeRequest) -> None:
    changed = _changed_loss_options(checkpoint, request)
    if request.reset_loss_state:
        loss.reset_state()
        logging.info("The loss's state starts afresh (--reset-loss-state)")
        return
    if "loss" not in checkpoint:
        logging.warning(f"{path} has no loss state (an OpenCLIP checkpoint?); the loss starts fresh")
        return
    try:
        loss.load_state_dict(checkpoint["loss"])
    except (RuntimeError, ValueError) as error:  # torch's size mismatch, or the loss's own check
        what = f"the loss options changed ({_describe_options(changed)})" if changed else _first_line(error)
        raise ResumeError(f"{path}: its loss state does not fit this run's loss: {what}; add --reset-loss-state to "
                          "start the loss's state afresh (weights and optimizer are restored), or resume with the "
                          "checkpoint's options") from None
    if changed:
        logging.warning(f"Resuming with other loss options ({_describe_options(changed)}); the loss's state was "
                        "restored")
