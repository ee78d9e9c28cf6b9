"""Console/file logging and the metrics record (`<logs>/<name>/metrics.jsonl`, optional tensorboard).

metrics.jsonl holds one JSON object per line, each with "kind", "step" and "epoch":
- kind "train": a logged training step (every --log-every-n-steps steps of an epoch, and its last):
  loss, contrastive_loss (its one term, as OpenCLIP's losses name it), lr, logit_scale, samples_per_second, samples_per_second_per_gpu, data_time, batch_time,
  num_nonfinite_steps, and the loss's own diagnostics as "stats/<name>" (floats; logged, never
  part of the loss);
- kind "epoch": a completed epoch's summary (an epoch cut short by preemption writes none): loss
  (mean over the epoch's finite steps), num_steps, num_nonfinite_steps, seconds,
  "skipped/<reason>" counts per skip reason, and their totals skipped_shard_visits (shard visits
  cut short: unreadable_shard, bad_tar) and skipped_samples; skipped_shards names the shards of those
  visits ({shard: {reason: visits}}, MAX_NAMED_SHARDS at most; the epoch's log line names them too);
- kind "val": validation / zero-shot metrics after an epoch, by their tensorboard tags (`val/clip_val_loss`,
  `val/image_to_text_R@1`, ...); `checkpoints/results.jsonl` holds the same values under OpenCLIP's own keys
  (`training.trainer.engine.validation`).

Tensorboard tags and steps are OpenCLIP 3.3.0's (`open_clip_train.train`), so its dashboards work unchanged:
`train/loss`, `train/contrastive_loss` (the loss's term), `train/scale` (the logit scale), `train/lr`,
`train/samples_per_second`, ... at the step's index counted from 0 (metrics.jsonl's `step` minus 1),
`val/<metric>` (e.g. `val/clip_val_loss`, `val/imagenet-zeroshot-val-top1`) at the epoch;
ours: the loss's stats as `loss_stats/<name>` and the epoch summaries as `epoch/<name>`. wandb
(`--report-to wandb`) gets the same keys at OpenCLIP's wandb steps (training at the step's index,
validation at the steps taken: wandb needs steps that never decrease), with the epoch as the "epoch" key.

After a resume from step S, `drop_lines_after` removes the lines of steps after S (written by
the interrupted run, which the resumed run replays), so metrics.jsonl holds each step once.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .layout import METRICS_NAME
from .safe_write import RunFiles, cause_of

_FORMAT = "%(asctime)s | %(levelname)s | %(message)s"
_HANDLER_TAG = "_open_clip_adacl_handler"


def setup_logging(
    log_file: Optional[str], level: int = logging.INFO, *, rank: int = 0, log_all_ranks: bool = False
) -> None:
    """Log to stderr (and `log_file`); replaces handlers from an earlier call in the same process."""
    end_logging()
    root = logging.getLogger()
    fmt = _FORMAT if rank == 0 else _FORMAT.replace("%(levelname)s", f"rank {rank} | %(levelname)s")
    formatter = logging.Formatter(fmt, datefmt="%Y-%m-%d,%H:%M:%S")
    handlers = [logging.StreamHandler()]
    if log_file:
        handlers.append(RunLogFile(log_file))
    for handler in handlers:
        handler.setFormatter(formatter)
        setattr(handler, _HANDLER_TAG, True)
        root.addHandler(handler)
    # Other ranks log warnings only, unless asked to log everything.
    root.setLevel(level if rank == 0 or log_all_ranks else max(level, logging.WARNING))


def end_logging() -> None:
    """Remove (and close) the handlers `setup_logging` added, so that a process's later lines reach neither
    a finished run's out.log nor the stderr it had then."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, _HANDLER_TAG, False):
            root.removeHandler(handler)
            handler.close()


class RunLogFile(logging.FileHandler):
    """out.log under the rule of the run's other record files (training.trainer.run_folder.safe_write): a write that fails (a full disk,
    a revoked permission) is one line on the console naming the file and the cause, not logging's
    `--- Logging error ---` block per line; training goes on, each later line is tried again (the file is
    reopened), and the lines lost are counted for the run's last line (`unwritten_log_lines`)."""

    def __init__(self, path: str) -> None:
        super().__init__(path, delay=True)  # opened by the first line: a folder that takes no file fails there
        self.lost = 0
        self.cause: Optional[str] = None  # why writes fail now (None: they succeed)
        self.lost_cause: Optional[str] = None  # why the last lost line was lost

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self.stream is None:
                self.stream = self._open()
            self.stream.write(self.format(record) + self.terminator)
            self.stream.flush()
        except OSError as error:
            self._lose(record, error)
            return
        except Exception:  # noqa: BLE001 - a record that does not format: logging's own report
            self.handleError(record)
            return
        if self.cause is not None:
            self.cause = None
            self._tell_others(
                record,
                logging.WARNING,
                f"{self.baseFilename} is written again ({self.lost} log line(s) missing from it)",
            )

    def _lose(self, record: logging.LogRecord, error: OSError) -> None:
        """Count the line, drop the stream (a failed flush keeps its bytes: the next line would fail on them) and
        say so once per cause on the other handlers (the console)."""
        self.lost += 1
        stream, self.stream = self.stream, None
        try:
            if stream is not None:
                stream.close()
        except OSError:
            pass
        cause = self.lost_cause = cause_of(error)
        if cause != self.cause:
            self.cause = cause
            self._tell_others(
                record,
                logging.ERROR,
                f"Could not write {self.baseFilename} ({cause}); training goes "
                "on, its lines shown here only until it can be written again",
            )

    def _tell_others(self, record: logging.LogRecord, level: int, message: str) -> None:
        """Log `message` on the root logger's other handlers (the console): this one is the subject."""
        note = logging.LogRecord(record.name, level, __file__, 0, message, None, None)
        for handler in logging.getLogger().handlers:
            if handler is not self and level >= handler.level:
                handler.handle(note)

    def unwritten(self) -> Optional[str]:
        return f"{self.baseFilename}: {self.lost} log line(s) ({self.lost_cause})" if self.lost else None


def unwritten_log_lines() -> List[str]:
    """The log files (`RunLogFile`) that lost lines: "<file>: N log line(s) (cause)"."""
    return [
        text
        for handler in logging.getLogger().handlers
        if isinstance(handler, RunLogFile)
        for text in [handler.unwritten()]
        if text
    ]


# metrics.jsonl names whose OpenCLIP tag differs.
_OPENCLIP_TRAIN_NAMES = {"logit_scale": "scale"}
LOSS_STATS_PREFIX = "stats/"


def dashboard_tag(kind: str, name: str) -> str:
    """The tensorboard tag of metric `name` of a `kind` line: OpenCLIP's where it has one."""
    if kind == "train" and name.startswith(LOSS_STATS_PREFIX):
        return "loss_stats/" + name[len(LOSS_STATS_PREFIX) :]
    if kind == "train":
        return "train/" + _OPENCLIP_TRAIN_NAMES.get(name, name)
    if kind == "val" and name.startswith("val/"):  # validation's metric names carry OpenCLIP's prefix already
        return name
    return f"{kind}/{name}"


def dashboard_step(kind: str, step: int, epoch: int) -> int:
    """A line's tensorboard step, as OpenCLIP numbers it (`open_clip_train.train`): validation at the epoch (1 after
    the first), the rest at the step's index counted from 0 (`num_batches_per_epoch * epoch + i_accum`), where
    metrics.jsonl's `step` counts the steps taken (1 after the first)."""
    return epoch if kind == "val" else step - 1


def wandb_step(kind: str, step: int) -> int:
    """A line's wandb step, as OpenCLIP's: training at the step's index from 0, validation at the steps taken
    (`num_batches_per_epoch * epoch`), so that the steps never decrease."""
    return step if kind == "val" else step - 1


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


def quiet_tensorboard_thread_errors() -> None:
    """TensorBoard's writer thread keeps a failed write's error for the next `add_scalar`, then re-raises it, which
    prints a traceback; `MetricsWriter` reports that error in one line, so the thread's own report is left out
    (other threads' errors go to the hook as before). Installed once per process."""
    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard", False):
        return

    def hook(args: threading.ExceptHookArgs) -> None:
        thread = type(args.thread)
        if not (thread.__module__.startswith("tensorboard.") and thread.__name__ == "_AsyncWriterThread"):
            previous(args)

    hook.quiets_tensorboard = True
    threading.excepthook = hook


class MetricsWriter:
    """Appends metric lines to metrics.jsonl and, when enabled, to tensorboard and wandb (rank 0 only).
    metrics.jsonl goes through `files` (a failed write is logged, held back and retried: training.trainer.run_folder.safe_write).
    A dashboard that fails (its files on a full or unwritable disk: TensorBoard's writer thread, wandb's local
    files) is dropped with one line naming its folder and the cause; training goes on, and `files` lists what it
    did not get for the run's last line."""

    def __init__(
        self,
        run_dir: Optional[str],
        *,
        tensorboard: bool = False,
        wandb: Optional[WandbConfig] = None,
        enabled: bool = True,
        files: Optional[RunFiles] = None,
    ):
        self.enabled = enabled and run_dir is not None
        self.files = files if files is not None else RunFiles()
        self.path = os.path.join(run_dir, METRICS_NAME) if self.enabled else None
        self.tb_writer = None
        self.wandb_run = None
        self.tb_dir = os.path.join(run_dir, "tensorboard") if run_dir is not None else None
        self.wandb_dir = os.path.join(run_dir, "wandb") if run_dir is not None else None
        if self.enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                quiet_tensorboard_thread_errors()
                self.tb_writer = SummaryWriter(self.tb_dir)
            except Exception as error:  # noqa: BLE001 - e.g. PermissionError creating the folder
                self.files.give_up(self.tb_dir, "every TensorBoard event", error)
        if self.enabled and wandb is not None:
            import wandb as wandb_module  # optional: pip install 'open_clip_adacl[wandb]'

            try:
                self.wandb_run = wandb_module.init(
                    project=wandb.project,
                    name=wandb.name,
                    id=wandb.name,
                    notes=wandb.notes,
                    resume="allow" if wandb.resume else None,
                    config=wandb.config,
                    dir=run_dir,
                )
            except Exception as error:  # noqa: BLE001 - wandb raises its own types for an unwritable dir
                self.files.give_up(self.wandb_dir, "the wandb run", error)

    def write(self, kind: str, *, step: int, epoch: int, values: Dict[str, Any]) -> None:
        if not self.enabled:
            return
        line = {"kind": kind, "step": step, "epoch": epoch, **{k: _plain(v) for k, v in values.items()}}
        self.files.append(self.path, json.dumps(line) + "\n")
        scalars = {
            dashboard_tag(kind, name): value
            for name, value in line.items()
            if name not in ("kind", "step", "epoch") and isinstance(value, (int, float))
        }
        if self.tb_writer is not None:
            try:
                for tag, value in scalars.items():
                    self.tb_writer.add_scalar(tag, value, dashboard_step(kind, step, epoch))
            except Exception as error:  # noqa: BLE001 - the writer thread's OSError, re-raised here
                self._drop_tensorboard(f"the TensorBoard events from step {step} on", error)
        if self.wandb_run is not None:
            try:
                self.wandb_run.log({**scalars, "epoch": epoch}, step=wandb_step(kind, step))
            except Exception as error:  # noqa: BLE001 - wandb raises its own types for a failed write
                self._drop_wandb(f"the wandb logs from step {step} on", error)

    def _drop_tensorboard(self, what: str, error: BaseException) -> None:
        writer, self.tb_writer = self.tb_writer, None
        self._give_up(self.tb_dir, what, error, writer.close)

    def _drop_wandb(self, what: str, error: BaseException) -> None:
        run, self.wandb_run = self.wandb_run, None
        self._give_up(self.wandb_dir, what, error, run.finish)

    def _give_up(self, folder: str, what: str, error: BaseException, close) -> None:
        """One line naming `folder` and the cause (listed again at the end); `close` is tried once, its own failure
        left out: the first one is the one reported."""
        self.files.give_up(folder, what, error)
        try:
            close()
        except Exception:  # noqa: BLE001 - it failed already; its failure is reported
            pass

    def close(self) -> List[str]:
        """Close the dashboards and retry what `files` held back; what could still not be written (the log
        files' lost lines included)."""
        if self.tb_writer is not None:
            try:
                self.tb_writer.close()
            except Exception as error:  # noqa: BLE001 - the last events' flush
                self.files.give_up(self.tb_dir, "the last TensorBoard events", error)
            self.tb_writer = None
        if self.wandb_run is not None:
            try:
                self.wandb_run.finish()
            except Exception as error:  # noqa: BLE001 - its last logs, on a full or unwritable disk
                self.files.give_up(self.wandb_dir, "the end of the wandb run", error)
            self.wandb_run = None
        return self.files.close(also=unwritten_log_lines())


def drop_lines_after(path: str, step: int, key: str = "step") -> int:
    """Remove the lines whose `key` (step; results.jsonl: epoch) is after `step` from the JSON-lines file at
    `path` (rewritten atomically; a last line cut short by a crash goes too); returns how many lines were removed."""
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    kept = []
    for line in lines:
        try:
            values = json.loads(line)
        except json.JSONDecodeError:  # the interrupted run's half-written last line
            continue
        if values[key] <= step:
            kept.append(line if line.endswith("\n") else line + "\n")
    if len(kept) == len(lines):
        return 0
    fd, tmp_name = tempfile.mkstemp(prefix=".metrics.", suffix=".tmp", dir=os.path.dirname(path) or ".")
    os.fchmod(fd, os.stat(path).st_mode & 0o777)  # keep the file's mode, not mkstemp's 0600
    with os.fdopen(fd, "w") as f:
        f.writelines(kept)
    os.replace(tmp_name, path)
    return len(lines) - len(kept)
