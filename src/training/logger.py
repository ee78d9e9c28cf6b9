"""Console/file logging and the metrics record (`<logs>/<name>/metrics.jsonl`, optional tensorboard).

metrics.jsonl holds one JSON object per line, each with "kind", "step" and "epoch":
- kind "train": a logged training step (every --log-every-n-steps steps of an epoch, and its last):
  loss, lr, logit_scale, samples_per_second, samples_per_second_per_gpu, data_time, batch_time,
  num_nonfinite_steps, and the loss's own diagnostics as "stats/<name>" (floats; logged, never
  part of the loss);
- kind "epoch": a completed epoch's summary (an epoch cut short by preemption writes none): loss
  (mean over the epoch's finite steps), num_steps, num_nonfinite_steps, seconds,
  "skipped/<reason>" counts per skip reason, and their totals skipped_shard_visits (shard visits
  cut short: unreadable_shard, bad_tar) and skipped_samples;
- kind "val": validation / zero-shot metrics after an epoch.

Tensorboard tags are OpenCLIP 3.3.0's (`open_clip_train.train`), so its dashboards work unchanged:
`train/loss`, `train/scale` (the logit scale), `train/lr`, `train/samples_per_second`, ... at the
step, `val/<metric>` (e.g. `val/clip_val_loss`, `val/imagenet-zeroshot-val-top1`) at the epoch;
ours: the loss's stats as `loss_stats/<name>` and the epoch summaries as `epoch/<name>`. wandb
(`--report-to wandb`) gets the same keys, all at the training step (wandb needs steps that never
decrease; OpenCLIP does the same), with the epoch as the "epoch" key.

After a resume from step S, `drop_records_after` removes the records of steps after S (written by
the interrupted run, which the resumed run replays), so metrics.jsonl holds each step once.
"""
from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .run_dir import METRICS_NAME
from .safe_write import RunFiles

_FORMAT = "%(asctime)s | %(levelname)s | %(message)s"
_HANDLER_TAG = "_open_clip_adacl_handler"


def setup_logging(log_file: Optional[str], level: int = logging.INFO, *, rank: int = 0,
                  log_all_ranks: bool = False) -> None:
    """Log to stderr (and `log_file`); replaces handlers from an earlier call in the same process."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _HANDLER_TAG, False):
            root.removeHandler(handler)
            handler.close()
    fmt = _FORMAT if rank == 0 else _FORMAT.replace("%(levelname)s", f"rank {rank} | %(levelname)s")
    formatter = logging.Formatter(fmt, datefmt="%Y-%m-%d,%H:%M:%S")
    handlers = [logging.StreamHandler()]
    if log_file:
        handlers.append(logging.FileHandler(log_file))
    for handler in handlers:
        handler.setFormatter(formatter)
        setattr(handler, _HANDLER_TAG, True)
        root.addHandler(handler)
    # Other ranks log warnings only, unless asked to log everything.
    root.setLevel(level if rank == 0 or log_all_ranks else max(level, logging.WARNING))


# metrics.jsonl names whose OpenCLIP tag differs.
_OPENCLIP_TRAIN_NAMES = {"logit_scale": "scale"}
LOSS_STATS_PREFIX = "stats/"


def dashboard_tag(kind: str, name: str) -> str:
    """The tensorboard tag of metric `name` of a `kind` record: OpenCLIP's where it has one."""
    if kind == "train" and name.startswith(LOSS_STATS_PREFIX):
        return "loss_stats/" + name[len(LOSS_STATS_PREFIX):]
    if kind == "train":
        return "train/" + _OPENCLIP_TRAIN_NAMES.get(name, name)
    if kind == "val" and name.startswith("val/"):  # validation's metric names carry OpenCLIP's prefix already
        return name
    return f"{kind}/{name}"


def dashboard_step(kind: str, step: int, epoch: int) -> int:
    """OpenCLIP logs validation at the epoch, training at the step."""
    return epoch if kind == "val" else step


def _plain(value: Any) -> Any:
    """JSON-friendly value: tensors and numpy scalars become floats; NaN/inf become strings."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


@dataclass
class WandbConfig:
    """wandb.init's settings, as OpenCLIP passes them (the run's name is also its id, so a resumed run
    continues the same wandb run)."""

    project: str
    name: str
    notes: str = ""
    resume: bool = False
    config: Dict[str, Any] = field(default_factory=dict)


class MetricsWriter:
    """Appends metric records to metrics.jsonl and, when enabled, to tensorboard and wandb (rank 0 only).
    metrics.jsonl goes through `files` (a failed write is logged, held back and retried: training.safe_write)."""

    def __init__(self, run_dir: Optional[str], *, tensorboard: bool = False, wandb: Optional[WandbConfig] = None,
                 enabled: bool = True, files: Optional[RunFiles] = None):
        self.enabled = enabled and run_dir is not None
        self.files = files if files is not None else RunFiles()
        self.path = os.path.join(run_dir, METRICS_NAME) if self.enabled else None
        self.tb_writer = None
        self.wandb_run = None
        if self.enabled and tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb_writer = SummaryWriter(os.path.join(run_dir, "tensorboard"))
        if self.enabled and wandb is not None:
            import wandb as wandb_module  # optional: pip install 'open_clip_adacl[wandb]'

            self.wandb_run = wandb_module.init(project=wandb.project, name=wandb.name, id=wandb.name,
                                               notes=wandb.notes, resume="allow" if wandb.resume else None,
                                               config=wandb.config, dir=run_dir)

    def write(self, kind: str, *, step: int, epoch: int, values: Dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "step": step, "epoch": epoch, **{k: _plain(v) for k, v in values.items()}}
        self.files.append(self.path, json.dumps(record) + "\n")
        scalars = {dashboard_tag(kind, name): value for name, value in record.items()
                   if name not in ("kind", "step", "epoch") and isinstance(value, (int, float))}
        if self.tb_writer is not None:
            for tag, value in scalars.items():
                self.tb_writer.add_scalar(tag, value, dashboard_step(kind, step, epoch))
        if self.wandb_run is not None:
            self.wandb_run.log({**scalars, "epoch": epoch}, step=step)

    def close(self) -> List[str]:
        """Close the dashboards and retry what `files` held back; what could still not be written."""
        if self.tb_writer is not None:
            self.tb_writer.close()
            self.tb_writer = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None
        return self.files.close()


def drop_records_after(path: str, step: int, key: str = "step") -> int:
    """Remove the records whose `key` (step; results.jsonl: epoch) is after `step` from the JSON-lines file at
    `path` (rewritten atomically; a last line cut short by a crash goes too); returns how many lines were removed."""
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the interrupted run's half-written last line
            continue
        if record[key] <= step:
            kept.append(line if line.endswith("\n") else line + "\n")
    if len(kept) == len(lines):
        return 0
    fd, tmp_name = tempfile.mkstemp(prefix=".metrics.", suffix=".tmp", dir=os.path.dirname(path) or ".")
    os.fchmod(fd, os.stat(path).st_mode & 0o777)  # keep the file's mode, not mkstemp's 0600
    with os.fdopen(fd, "w") as f:
        f.writelines(kept)
    os.replace(tmp_name, path)
    return len(lines) - len(kept)
