"""Checkpoints: atomic writes, OpenCLIP-compatible keys, and a one-call resume.

A checkpoint holds the state_dict() of every stateful component of the run under the component's key
(`run_components`), saved with `torch.save` so that `torch.load(..., weights_only=True)` reads it (so
OpenCLIP's `--pretrained PATH` and clip-benchmark load `epoch_N.pt` directly):

- OpenCLIP's keys: `epoch` (completed epochs), `name`, `state_dict` (the unwrapped model, no DDP
  'module.' prefix), `optimizer`, `scaler` (fp16 amp only);
- `loss`: the loss's `state_dict()` (per-sample state banks etc.; rank 0's copy, losses keep it
  identical on every rank);
- `data`: the position in the data stream (`training.data.DataPosition`: epoch, batches_in_epoch);
- `train`: the run's counters (`TrainState`: steps, non-finite steps, samples trained and the LR
  schedule's unit, which places the schedule by global samples trained);
- per-rank components, a list in rank order: `rng` (torch / CUDA / numpy / python RNG states) and
  `epoch_sums` (the epoch's skip counts and loss sums so far, so that the summary of a resumed epoch
  counts what happened before the interruption);
- `step` (training steps taken: lists checkpoints without reading the components), `world_size` (the
  ranks that wrote it), `args` (every command-line argument, plain values), `model_cfg` /
  `preprocess_cfg` (the open_clip configs `training.export` writes next to the weights), and
  `format` (CHECKPOINT_FORMAT). A checkpoint without `format` (the earlier layout, whose `data` entry
  mixed the position with the counters and rank 0's sums, or OpenCLIP's) is converted on load.

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
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, ClassVar, Dict, Iterator, List, Mapping, Optional

import numpy as np
import torch

from .checkpoint_digest import verify_digest, with_digest
from .data.position import DataPosition
from .distributed import DistributedEnv, all_gather_object, any_rank, unwrap_model
from .flags import ConfigError, HelpGroup, flag, from_flag
from .run_dir import (CHECKPOINT_FILE_NAME, EPOCH_CHECKPOINT_NAME, LATEST_CHECKPOINT_NAME, STEP_CHECKPOINT_NAME,
                      epoch_checkpoint_name, numbered_checkpoints, step_checkpoint_name, step_checkpoint_number)
from .safe_write import ErrorRecordingFile, cause_of

CHECKPOINT_FORMAT = 2  # the layout above; checkpoints without a "format" key are converted on load


@dataclass
class EpochSums:
    """This rank's running sums over the current epoch, for its summary (skip counts are summed over
    ranks when the epoch ends). A per-rank checkpoint component."""

    per_rank: ClassVar[bool] = True
    skip_counts: Optional[torch.Tensor] = None
    loss_sum: float = 0.0
    num_loss_steps: int = 0

    def reset(self, num_skip_reasons: int) -> None:
        self.skip_counts = torch.zeros(num_skip_reasons, dtype=torch.long)
        self.loss_sum, self.num_loss_steps = 0.0, 0

    @property
    def mean_loss(self) -> float:
        """The epoch's mean loss over its finite steps so far (0 before the first)."""
        return self.loss_sum / max(self.num_loss_steps, 1)

    def state_dict(self) -> Dict[str, Any]:
        return {"skip_counts": self.skip_counts, "loss_sum": self.loss_sum, "num_loss_steps": self.num_loss_steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.skip_counts = state["skip_counts"]
        self.loss_sum, self.num_loss_steps = float(state["loss_sum"]), int(state["num_loss_steps"])

    @staticmethod
    def merge_rank_states(states: List[Mapping[str, Any]]) -> Dict[str, Any]:
        """The sums of another world size's ranks, for rank 0 to carry: skip counts summed over ranks (as
        the epoch summary sums them), the loss sums of the old rank 0 (the rank that logs the summary)."""
        counts = [state["skip_counts"] for state in states if state["skip_counts"] is not None]
        return {**states[0], "skip_counts": torch.stack(counts).sum(0) if counts else None}


class RandomStreams:
    """This process's torch / CUDA / numpy / python RNG states, a per-rank checkpoint component. A loaded
    state waits until `restore_pending()`: the trainer restores it right before the next batch is drawn,
    since restoring earlier would let setup work consume random numbers."""

    per_rank: ClassVar[bool] = True

    def __init__(self) -> None:
        self.pending: Optional[Dict[str, Any]] = None

    def state_dict(self) -> Dict[str, Any]:
        return rng_state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.pending = dict(state)

    def restore_pending(self) -> None:
        if self.pending is not None:
            restore_rng_state(self.pending)
            self.pending = None


@dataclass
class TrainState:
    """Progress through training: the data position, the run's counters (this object's own state_dict),
    this rank's epoch sums and RNG streams; each is a checkpoint component (`run_components`)."""

    position: DataPosition = field(default_factory=DataPosition)
    step: int = 0                      # training steps taken, skipped non-finite steps included
    num_nonfinite_steps: int = 0       # steps skipped for a non-finite loss, whole run
    consecutive_nonfinite_steps: int = 0
    # The LR schedule's position is samples_seen / samples_per_schedule_step: OpenCLIP's step-based
    # schedule in units of the global batch the run started with, so a resume with another world size
    # or batch size continues it from the samples trained rather than from a recomputed step.
    samples_seen: int = 0                 # global samples of all steps taken
    samples_per_schedule_step: int = 0    # 0 until the trainer sets it (the first launch's global batch)
    epoch_sums: EpochSums = field(default_factory=EpochSums)
    rng: RandomStreams = field(default_factory=RandomStreams, repr=False)

    _COUNTERS: ClassVar[tuple] = ("step", "num_nonfinite_steps", "consecutive_nonfinite_steps", "samples_seen",
                                  "samples_per_schedule_step")

    def state_dict(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in self._COUNTERS}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name in self._COUNTERS:
            setattr(self, name, int(state[name]))

    @property
    def schedule_position(self) -> float:
        return self.samples_seen / self.samples_per_schedule_step

    def start_epoch(self, num_skip_reasons: int) -> None:
        """Reset the epoch's running sums unless resuming inside this epoch."""
        if self.position.batches_in_epoch == 0 or self.epoch_sums.skip_counts is None:
            self.epoch_sums.reset(num_skip_reasons)

    def finish_epoch(self) -> None:
        self.position.next_epoch()


def run_components(*, model, optimizer, scaler, loss, state: TrainState) -> Dict[str, Any]:
    """Every stateful object of the run by its checkpoint key (OpenCLIP's for model, optimizer and scaler):
    what the Checkpointer saves and `resume` restores. `model` may be wrapped (DDP, torch.compile)."""
    components = {"state_dict": unwrap_model(model), "optimizer": optimizer, "loss": loss, "data": state.position,
                  "train": state, "epoch_sums": state.epoch_sums, "rng": state.rng}
    if scaler is not None:
        components["scaler"] = scaler
    return components


def is_per_rank(component) -> bool:
    """Whether each rank's copy is saved (a list in rank order) rather than rank 0's alone."""
    return getattr(component, "per_rank", False)


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


def load_checkpoint(path: os.PathLike) -> Dict[str, Any]:
    """Read a checkpoint on the CPU (weights_only: no arbitrary code runs on load), in today's layout: one
    of the earlier layout (no "format" key) is converted; a bare state dict is returned as it is. Its
    content digest is checked first (`CheckpointDamaged` when it does not match; training.checkpoint_digest)."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    verify_digest(checkpoint, path)
    if "state_dict" in checkpoint and "format" not in checkpoint:
        checkpoint = converted_from_earlier_layout(checkpoint)
        logging.info(f"{path} is in the earlier checkpoint layout (written before components were saved by name, "
                     "or by OpenCLIP); converted on load")
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
    converted["data"] = {"epoch": data.get("epoch", checkpoint.get("epoch", 0)),
                         "batches_in_epoch": data.get("batches_in_epoch", 0)}
    converted["train"] = {"step": checkpoint.get("step", 0), "num_nonfinite_steps": data.get("num_nonfinite_steps", 0),
                          "consecutive_nonfinite_steps": 0, "samples_seen": data.get("samples_seen", 0),
                          "samples_per_schedule_step": data.get("samples_per_schedule_step", 0)}
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
        if not CHECKPOINT_FILE_NAME.match(path.name):
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
    """Saves every stateful component of the run through its state_dict (rank 0 writes; all ranks call)."""

    def __init__(self, cfg: CheckpointConfig, *, checkpoint_dir: str, components: Mapping[str, Any],
                 env: DistributedEnv, name: str, args: Dict[str, Any], model_cfg: Dict[str, Any],
                 preprocess_cfg: Dict[str, Any]):
        """`components`: the objects to save by checkpoint key (`run_components`); its "train", the
        TrainState, also names the files (epoch and step)."""
        self.cfg = cfg
        self.checkpoint_dir = Path(checkpoint_dir)
        self.components = dict(components)
        self.state: TrainState = components["train"]
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

    def payload(self) -> Dict[str, Any]:
        """The checkpoint dict (collective: every rank must call it)."""
        per_rank = {key: component for key, component in self.components.items() if is_per_rank(component)}
        ranks = all_gather_object({key: component.state_dict() for key, component in per_rank.items()}, self.env)
        return {
            "format": CHECKPOINT_FORMAT,
            "epoch": self.state.position.epoch,
            "step": self.state.step,
            **{key: component.state_dict() for key, component in self.components.items() if key not in per_rank},
            **{key: [rank[key] for rank in ranks] for key in per_rank},
            "world_size": self.env.world_size,
            **self.metadata,
        }

    def save(self, filenames: List[str]) -> List[Path]:
        """Write the checkpoint under each of `filenames` (rank 0); a failed write is retried once, then
        logged, not raised: the returned files are those written (all of them on other ranks)."""
        state = self.state
        payload = self.payload()
        if not self.env.is_master:  # rank 0's files, as far as this rank knows
            written = [self.checkpoint_dir / filename for filename in filenames]
            self.last_saved = written[-1] if written else self.last_saved
            return written
        payload = with_digest(payload)
        written = []
        for filename in filenames:
            path = self.checkpoint_dir / filename
            if self._write_with_retry(payload, path):
                logging.info(f"Saved checkpoint {path} (epoch {state.position.epoch}, step {state.step})")
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
                    logging.warning(f"Could not write {path} ({cause_of(error)}); retrying once")
                    continue
                logging.error(f"CHECKPOINT SAVE FAILED: could not write {path} ({cause_of(error)}). Training "
                              f"continues; the previous checkpoint ({self.last_saved}) is intact.")
        return False

    def _step_filenames(self) -> List[str]:
        every, step = self.cfg.save_every_n_steps, self.state.step
        return [step_checkpoint_name(step)] if every and step % every == 0 else []

    def maybe_save_step(self) -> None:
        """step_N.pt every --save-every-n-steps steps (collective: every rank calls it)."""
        filenames = self._step_filenames()
        if filenames:
            self._save_and_prune(filenames)

    def save_now(self) -> Optional[Path]:
        """step_N.pt for this step whatever --save-every-n-steps says (a preemption); the file, or None when
        the write failed (collective; the result is rank 0's on every rank)."""
        path = self.checkpoint_dir / step_checkpoint_name(self.state.step)
        written = self._save_and_prune([path.name])
        return None if any_rank(not written, self.env) else path

    def save_epoch(self) -> bool:
        """After an epoch: epoch_N.pt (every --save-frequency epochs and after the last), epoch_latest.pt
        (--save-most-recent), as OpenCLIP, and step_N.pt when the epoch ended on a step-checkpoint step.
        Whether every file was written (collective; rank 0's answer on every rank)."""
        completed = self.state.position.epoch
        filenames = self._step_filenames()
        if completed == self.cfg.total_epochs or (
                self.cfg.save_frequency > 0 and completed % self.cfg.save_frequency == 0):
            filenames.append(epoch_checkpoint_name(completed))
        if self.cfg.save_most_recent:
            filenames.append(LATEST_CHECKPOINT_NAME)
        written = self._save_and_prune(filenames) if filenames else []
        return not any_rank(len(written) < len(filenames), self.env)

    def _save_and_prune(self, filenames: List[str]) -> List[Path]:
        """Save, then with --delete-previous-checkpoint remove the previous epoch_N.pt / older step_N.pt,
        and with --keep-step-checkpoints K all but the newest K step_N.pt. Returns the files written."""
        written = self.save(filenames)
        if not self.env.is_master:
            return written
        keep_steps = 1 if self.cfg.delete_previous else self.cfg.keep_step_checkpoints
        for path in written:
            if self.cfg.delete_previous and EPOCH_CHECKPOINT_NAME.match(path.name):
                previous = self.checkpoint_dir / epoch_checkpoint_name(self.state.position.epoch - 1)
                previous.unlink(missing_ok=True)
            elif keep_steps and step_checkpoint_number(path) is not None:
                for older in numbered_checkpoints(self.checkpoint_dir, STEP_CHECKPOINT_NAME)[:-keep_steps]:
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
    old_world = saved_world_size(checkpoint, default=request.world_size)
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
    old_world = saved_world_size(checkpoint, default=request.world_size)
    position = DataPosition()
    position.load_state_dict(checkpoint["data"])
    return position.in_batches_of(_global_batch(old, old_world), _global_batch(request.args, request.world_size),
                                  int(request.args.get("accum_freq", 1)))


def _changed_loss_options(checkpoint: Mapping[str, Any], request: ResumeRequest) -> Dict[str, tuple]:
    old = (checkpoint.get("args") or {}).get("loss_options") or {}
    new = request.args.get("loss_options") or {}
    return {name: (old.get(name), new.get(name)) for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)}


def resume(path: os.PathLike, components: Mapping[str, Any], *, env: DistributedEnv,
           request: Optional[ResumeRequest] = None, checkpoint: Optional[Mapping[str, Any]] = None) -> None:
    """Load every component of `components` (`run_components`) from `path` (or its already loaded
    `checkpoint`, in today's layout). With `request`, first `check_resume` (ResumeError on what it refuses).

    A per-rank component loads this rank's state; saved by another world size, it starts afresh (with a
    warning), unless it can merge the ranks' states for rank 0 (`merge_rank_states`). With
    `request.reset_loss_state` the loss restarts its own state (`loss.reset_state()`) instead. With
    --resume-anyway's new data order the position is translated into this run's batches and the RNG
    streams are not restored. A component the checkpoint lacks (an OpenCLIP checkpoint) starts afresh.
    """
    checkpoint = load_checkpoint(path) if checkpoint is None else checkpoint
    request = request or ResumeRequest(args=checkpoint.get("args") or {}, world_size=env.world_size)
    changes = check_resume(checkpoint, path, request)
    translated = bool(changes and checkpoint["data"]["batches_in_epoch"])  # accepted with --resume-anyway
    not_loaded = {"rng"} if translated else set()
    if request.reset_loss_state:
        components["loss"].reset_state()
        logging.info("The loss's state starts afresh (--reset-loss-state)")
        not_loaded.add("loss")
    missing = [key for key in components if key not in checkpoint and key not in not_loaded]
    if missing:
        logging.warning(f"{path} holds no state for {', '.join(missing)} (an OpenCLIP checkpoint?); "
                        "they start afresh")
    for key, component in components.items():
        if key in not_loaded or key in missing:
            continue
        try:
            if is_per_rank(component):
                _load_rank_state(key, component, checkpoint[key], path, env)
            else:
                component.load_state_dict(checkpoint[key])
        except (RuntimeError, ValueError) as error:  # torch's size mismatch, or the component's own check
            raise ResumeError(f"{path}: {_mismatch(key, error, checkpoint, request)}") from None
    position, state = components["data"], components["train"]
    changed_options = _changed_loss_options(checkpoint, request)
    if changed_options and not request.reset_loss_state:
        logging.warning(f"Resuming with other loss options ({_describe_options(changed_options)}); the loss's "
                        "state was restored")
    if translated:
        position.batches_in_epoch = translated_position(checkpoint, request)
        logging.warning(f"--resume-anyway: {path} was {checkpoint['data']['batches_in_epoch']} batches into epoch "
                        f"{position.epoch}; with {_describe(changes)} this run continues at batch "
                        f"{position.batches_in_epoch}, in its own sample order (some samples of this epoch are seen "
                        "twice or not at all)")
    elif changes:
        logging.info(f"Resuming at an epoch boundary with {_describe(changes)}: the next epoch follows this run's "
                     "data order, and the LR schedule continues from the samples trained so far")
    logging.info(f"Resumed from {path}: epoch {position.epoch}, step {state.step}, "
                 f"{position.batches_in_epoch} batches into the epoch")


def _load_rank_state(key: str, component, states: List[Mapping[str, Any]], path: os.PathLike,
                     env: DistributedEnv) -> None:
    if len(states) == env.world_size:
        component.load_state_dict(states[env.rank])
    elif hasattr(component, "merge_rank_states"):
        if env.is_master:
            component.load_state_dict(component.merge_rank_states(states))
    else:
        logging.warning(f"{path} holds {key} states of {len(states)} ranks, this run has {env.world_size}; "
                        f"{key} starts afresh on every rank")


def _mismatch(key: str, error: BaseException, checkpoint: Mapping[str, Any], request: ResumeRequest) -> str:
    """What a component's state that does not load means, and the way out."""
    if key == "state_dict":
        return (f"its weights do not fit this model ({_first_line(error)}); resume with the checkpoint's --model "
                "and --force-* settings")
    if key == "optimizer":
        return (f"its optimizer state does not fit this run's trainable parameters ({_first_line(error)}); resume "
                "with the checkpoint's --lock-* settings")
    if key == "loss":
        changed = _changed_loss_options(checkpoint, request)
        what = f"the loss options changed ({_describe_options(changed)})" if changed else _first_line(error)
        return (f"its loss state does not fit this run's loss: {what}; add --reset-loss-state to start the loss's "
                "state afresh (weights and optimizer are restored), or resume with the checkpoint's options")
    return f"its {key} state does not fit this run ({_first_line(error)})"
