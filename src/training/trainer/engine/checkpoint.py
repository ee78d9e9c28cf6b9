"""Checkpoints: atomic writes, OpenCLIP-compatible keys, and a one-call resume.

A checkpoint holds the state_dict() of every stateful component of the run under the component's key
(`run_components`), saved with `torch.save` so that `torch.load(..., weights_only=True)` reads it (so
OpenCLIP's `--pretrained PATH` and clip-benchmark load `epoch_N.pt` directly):

- OpenCLIP's keys: `epoch` (completed epochs), `name`, `state_dict` (the unwrapped model, no DDP
  'module.' prefix), `optimizer`, `scaler` (fp16 amp only);
- `loss`: the loss's `state_dict()` (per-sample state banks etc.; rank 0's copy, losses keep it
  identical on every rank);
- `data`: the position in the data stream (`training.trainer.data.DataPosition`: epoch, batches_in_epoch);
- `train`: the run's counters (`TrainState`: steps, non-finite steps, samples trained and the LR
  schedule's unit, which places the schedule by global samples trained);
- per-rank components, a list in rank order: `rng` (torch / CUDA / numpy / python RNG states) and
  `epoch_sums` (the epoch's skip counts, the shards of visits cut short and loss sums so far, so that the
  summary of a resumed epoch counts and names what happened before the interruption);
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

Writing and reading the files: `training.trainer.run_folder.checkpoint_files`; resuming from one (first checking that this
run may continue it): `training.trainer.launch.resume`.
"""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Mapping, Optional

import numpy as np
import torch

from ..data.position import DataPosition
from ..data.samples import ShardVisits, Skipped, merged_shard_visits
from ..distributed import DistributedEnv, all_gather_object, any_rank, unwrap_model
from ..flags import ConfigError, HelpGroup, flag, from_flag
from ..run_folder.checkpoint_digest import with_digest
from ..run_folder.checkpoint_files import CHECKPOINT_FORMAT, save_atomic
from ..run_folder.layout import (
    EPOCH_CHECKPOINT_NAME,
    LATEST_CHECKPOINT_NAME,
    STEP_CHECKPOINT_NAME,
    epoch_checkpoint_name,
    numbered_checkpoints,
    step_checkpoint_name,
    step_checkpoint_number,
)
from ..run_folder.safe_write import cause_of


@dataclass
class EpochSums:
    """This rank's running sums over the current epoch, for its summary (skip counts are summed over
    ranks, and the shards of cut-short visits merged, when the epoch ends). A per-rank checkpoint component;
    its state is plain tensors, numbers and dicts, so that `weights_only` loading reads it."""

    per_rank: ClassVar[bool] = True
    skip_counts: Optional[torch.Tensor] = None
    loss_sum: float = 0.0
    num_loss_steps: int = 0
    shard_visits: ShardVisits = field(default_factory=dict)  # at most MAX_NAMED_SHARDS shards

    def reset(self, num_skip_reasons: int) -> None:
        self.skip_counts = torch.zeros(num_skip_reasons, dtype=torch.long)
        self.loss_sum, self.num_loss_steps = 0.0, 0
        self.shard_visits = {}

    def add_skipped(self, skipped: Skipped) -> None:
        """Count a batch's skips."""
        self.skip_counts += skipped.counts.cpu()
        self.shard_visits = merged_shard_visits(self.shard_visits, skipped.shard_visits)

    @property
    def mean_loss(self) -> float:
        """The epoch's mean loss over its finite steps so far (0 before the first)."""
        return self.loss_sum / max(self.num_loss_steps, 1)

    def state_dict(self) -> Dict[str, Any]:
        return {
            "skip_counts": self.skip_counts,
            "loss_sum": self.loss_sum,
            "num_loss_steps": self.num_loss_steps,
            "shard_visits": merged_shard_visits(self.shard_visits),  # a copy: the checkpoint is written later
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.skip_counts = state["skip_counts"]
        self.loss_sum, self.num_loss_steps = float(state["loss_sum"]), int(state["num_loss_steps"])
        self.shard_visits = merged_shard_visits(state.get("shard_visits", {}))  # none in earlier checkpoints

    @staticmethod
    def merge_rank_states(states: List[Mapping[str, Any]]) -> Dict[str, Any]:
        """The sums of another world size's ranks, for rank 0 to carry: skip counts summed and shard visits
        merged over ranks (as the epoch summary does), the loss sums of the old rank 0 (the rank that logs the
        summary)."""
        counts = [state["skip_counts"] for state in states if state["skip_counts"] is not None]
        return {
            **states[0],
            "skip_counts": torch.stack(counts).sum(0) if counts else None,
            "shard_visits": merged_shard_visits(*(state.get("shard_visits", {}) for state in states)),
        }


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
    step: int = 0  # training steps taken, skipped non-finite steps included
    num_nonfinite_steps: int = 0  # steps skipped for a non-finite loss, whole run
    consecutive_nonfinite_steps: int = 0
    # The LR schedule's position is samples_seen / samples_per_schedule_step: OpenCLIP's step-based
    # schedule in units of the samples of one step (all ranks, all micro-batches) the run started with, so a
    # resume with another world size or batch size continues it from the samples trained rather than from a
    # recomputed step.
    samples_seen: int = 0  # samples over all ranks of all steps taken
    samples_per_schedule_step: int = 0  # 0 until the trainer sets it (the first launch's samples per step)
    epoch_sums: EpochSums = field(default_factory=EpochSums)
    rng: RandomStreams = field(default_factory=RandomStreams, repr=False)

    _COUNTERS: ClassVar[tuple] = (
        "step",
        "num_nonfinite_steps",
        "consecutive_nonfinite_steps",
        "samples_seen",
        "samples_per_schedule_step",
    )

    def state_dict(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in self._COUNTERS}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for name in self._COUNTERS:
            setattr(self, name, int(state[name]))

    @property
    def schedule_position(self) -> float:
        return self.samples_seen / self.samples_per_schedule_step

    def start_epoch(self, num_skip_reasons: int) -> None:
        """Reset the epoch's running sums unless resuming inside this epoch (counts saved before later skip reasons
        were added get zeros for them: reasons are only ever appended)."""
        counts = self.epoch_sums.skip_counts
        if self.position.batches_in_epoch == 0 or counts is None:
            self.epoch_sums.reset(num_skip_reasons)
        elif len(counts) < num_skip_reasons:
            self.epoch_sums.skip_counts = torch.cat([counts, counts.new_zeros(num_skip_reasons - len(counts))])

    def finish_epoch(self) -> None:
        self.position.next_epoch()


def run_components(*, model, optimizer, scaler, loss, state: TrainState) -> Dict[str, Any]:
    """Every stateful object of the run by its checkpoint key (OpenCLIP's for model, optimizer and scaler):
    what the Checkpointer saves and `resume` restores. `model` may be wrapped (DDP, torch.compile)."""
    components = {
        "state_dict": unwrap_model(model),
        "optimizer": optimizer,
        "loss": loss,
        "data": state.position,
        "train": state,
        "epoch_sums": state.epoch_sums,
        "rng": state.rng,
    }
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
        "numpy": {
            "name": name,
            "key": torch.from_numpy(key.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": random.getstate(),
    }


def restore_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["name"],
            numpy_state["key"].numpy().astype(np.uint32),
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


# ---------------------------------------------------------------------------------------------
# Saving and resuming the run
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointConfig:
    """When to save and what to keep; where is the Checkpointer's `checkpoint_dir`."""

    FLAG_GROUP: ClassVar[str] = HelpGroup.LOGS

    save_frequency: int = flag(1, "How often (epochs) to save checkpoints.")
    save_most_recent: bool = flag(False, "Always save the most recent model trained to epoch_latest.pt.")
    save_every_n_steps: int = flag(
        0, "Also save step_N.pt every N optimizer steps (0: off), so a crash loses at most N steps."
    )
    delete_previous: bool = flag(
        False, "Delete the previous checkpoint after storing a new one.", name="--delete-previous-checkpoint"
    )
    keep_step_checkpoints: int = flag(
        3,
        "Keep only the K most recent step_N.pt (0: keep all); epoch checkpoints are never removed by this flag.",
        metavar="K",
    )
    total_epochs: int = from_flag("epochs", default=1)

    def check(self) -> None:
        if self.save_every_n_steps < 0:
            raise ConfigError(
                f"--save-every-n-steps must be >= 0 (0 turns step checkpoints off), got {self.save_every_n_steps}"
            )
        if self.keep_step_checkpoints < 0:
            raise ConfigError(
                f"--keep-step-checkpoints must be >= 0 (0 keeps every step checkpoint), got "
                f"{self.keep_step_checkpoints}"
            )

    def files_kept(self, total_steps: int) -> Dict[str, int]:
        """The most checkpoint files of each kind a run of `total_steps` steps keeps at once (`save_epoch`,
        `maybe_save_step`, `_save_and_prune`), for the disk it will need."""
        epoch_files = saved_epochs(self.total_epochs, self.save_frequency)
        step_files = total_steps // self.save_every_n_steps if self.save_every_n_steps else 0
        keep_steps = 1 if self.delete_previous else self.keep_step_checkpoints
        return {
            "epoch_N.pt": min(epoch_files, 1) if self.delete_previous else epoch_files,
            "epoch_latest.pt": int(self.save_most_recent),
            "step_N.pt": min(step_files, keep_steps) if keep_steps else step_files,
        }


def saved_epochs(total_epochs: int, save_frequency: int) -> int:
    """How many of epochs 1..total_epochs end with an epoch checkpoint: each multiple of `save_frequency` (none
    when it is <= 0) and the last; counted without visiting each epoch, so that any --epochs is sized at once."""
    multiples = total_epochs // save_frequency if save_frequency > 0 else 0
    last_is_a_multiple = save_frequency > 0 and total_epochs % save_frequency == 0
    return multiples + (0 if last_is_a_multiple else 1)


class Checkpointer:
    """Saves every stateful component of the run through its state_dict (rank 0 writes; all ranks call)."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        *,
        checkpoint_dir: str,
        components: Mapping[str, Any],
        env: DistributedEnv,
        name: str,
        args: Dict[str, Any],
        model_cfg: Dict[str, Any],
        preprocess_cfg: Dict[str, Any],
        resumed_from: Optional[str] = None,
    ):
        """`components`: the objects to save by checkpoint key (`run_components`); its "train", the
        TrainState, also names the files (epoch and step). `resumed_from`: the checkpoint the run started from,
        the one to fall back on until this launch writes one."""
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
        self.not_written = ""  # why the last save wrote nothing though it could have (a non-finite state)
        self.resumed_from = Path(resumed_from) if resumed_from else None
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

    @property
    def last_good(self) -> Optional[Path]:
        """The newest checkpoint of this run written at a finite step: this launch's last, else the one it resumed."""
        return self.last_saved or self.resumed_from

    def last_good_text(self) -> str:
        return str(self.last_good) if self.last_good else "none: this run has written no checkpoint yet"

    def _refuse(self, filenames: List[str], reason: str) -> List[Path]:
        """Writes nothing, keeps `reason` in `not_written` and says so once (rank 0), naming the last good file."""
        self.not_written = reason
        if self.env.is_master:
            logging.warning(
                f"Not writing {', '.join(filenames)}: {reason}; the last checkpoint written at a finite step is "
                f"{self.last_good_text()}"
            )
        return []

    def save(self, filenames: List[str]) -> List[Path]:
        """Write the checkpoint under each of `filenames` (rank 0); a failed write is retried once, then
        logged, not raised: the returned files are those written (all of them on other ranks). While steps
        have a non-finite loss (skipped) nothing is written: those weights led into it, and `--resume latest`
        would return to them (every rank knows the streak: the trainer agrees on it in the step's all-reduce);
        nor is a state whose weights, optimizer or loss state hold NaN/inf (`not_written` says why)."""
        state = self.state
        streak = state.consecutive_nonfinite_steps
        self.not_written = ""
        if streak:
            return self._refuse(filenames, f"the loss of the last {streak} step(s) was non-finite")
        payload = self.payload()
        # A finite loss can still end in an update that overflows: such a state would be called good and resumed
        # from, so it is never written (every rank decides alike: DDP keeps the replicas equal).
        poisoned = nonfinite_tensors(payload)
        if any_rank(bool(poisoned), self.env):
            return self._refuse(
                filenames,
                f"the state after step {state.step}'s update holds non-finite values "
                f"({len(poisoned)} tensors, e.g. {', '.join(poisoned[:3])})",
            )
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
                logging.error(
                    f"CHECKPOINT SAVE FAILED: could not write {path} ({cause_of(error)}). Training "
                    f"continues; {self.previous_checkpoint_text()}."
                )
        return False

    def previous_checkpoint_text(self) -> str:
        if self.last_good is None:
            return "there is no earlier checkpoint of this run to fall back on"
        return f"the previous checkpoint ({self.last_good}) is intact"

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
            self.cfg.save_frequency > 0 and completed % self.cfg.save_frequency == 0
        ):
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


def nonfinite_tensors(tree: Any, name: str = "") -> List[str]:
    """The keys (dotted) of the floating-point tensors in a nested state dict that hold NaN or inf."""
    if isinstance(tree, torch.Tensor):
        return [name] if tree.is_floating_point() and not bool(torch.isfinite(tree).all()) else []
    if isinstance(tree, Mapping):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return []
    return [found for key, value in items for found in nonfinite_tensors(value, f"{name}.{key}" if name else str(key))]


def plain_args(args: Mapping[str, Any]) -> Dict[str, Any]:
    """The arguments as a checkpoint stores them: a JSON round trip keeps only plain values, which
    weights_only loading accepts (tuples become lists, other objects their str)."""
    return json.loads(json.dumps(dict(args), default=str))
