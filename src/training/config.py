"""The run's configuration: one frozen `RunConfig`, built once from the command line by
`params.run_config` right after validation; each component takes its own part of it.

The parts that had a home already live with their component (DataConfig in `training.data`,
ModelConfig / OptimizerConfig / SchedulerConfig in `training.model`, TrainConfig in `training.train`,
CheckpointConfig in `training.checkpoint`); the ones only `training.main` reads are here.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from open_clip_adacl import LossOptions

from .checkpoint import CheckpointConfig
from .data import DataConfig
from .model import ModelConfig, OptimizerConfig, SchedulerConfig
from .train import TrainConfig


@dataclass(frozen=True)
class LossConfig:
    name: str                  # a registered loss
    options: LossOptions       # that loss's validated options: given flags, else the declared defaults
    local_loss: bool           # OpenCLIP's --local-loss and --gather-with-grad
    gather_with_grad: bool


@dataclass(frozen=True)
class ValidationConfig:
    """Validation after epochs, on rank 0, as OpenCLIP's `evaluate`."""

    val_frequency: int            # epochs between val loss and retrieval (0: never; the last epoch always)
    zeroshot_frequency: int       # epochs between ImageNet zero-shot (0: never; the last epoch always)
    imagenet_val: Optional[str]   # ImageNet val folder for zero-shot
    total_epochs: int
    batch_size: int               # zero-shot batches and loader workers, as OpenCLIP: --batch-size, --workers
    workers: int


@dataclass(frozen=True)
class LoggingConfig:
    """Where the run writes (<logs>/<name>/) and which dashboards it reports to."""

    logs: Optional[str]           # None: nothing is written (--logs none)
    name: Optional[str]           # None: named at start from the time and the main settings
    log_local: bool               # a log file per node (out-<rank>.log), not only rank 0's out.log
    debug: bool
    report_to: Tuple[str, ...]    # "tensorboard", "wandb"
    wandb_project_name: str
    wandb_notes: str


@dataclass(frozen=True)
class DistributedConfig:
    device: str
    dist_backend: Optional[str]
    dist_url: Optional[str]
    no_set_device_rank: bool
    use_bn_sync: bool
    ddp_static_graph: bool
    timeout_s: Optional[float] = None     # --dist-timeout (None: torch's default)


@dataclass(frozen=True)
class RunConfig:
    data: DataConfig              # the whole run's data (rank 0 of 1): each rank takes its share with replace
    model: ModelConfig            # precision resolved for the device the run will use
    optimizer: OptimizerConfig
    schedule: SchedulerConfig
    train: TrainConfig
    checkpoints: CheckpointConfig
    validation: ValidationConfig
    logging: LoggingConfig
    distributed: DistributedConfig
    loss: LossConfig
    epochs: int
    seed: int
    torchcompile: bool
    resume: Optional[str]         # a checkpoint path, "latest" (params.RESUME_LATEST) or None
    reset_loss_state: bool
    resume_anyway: bool           # accept a mid-epoch checkpoint of another data order (training.checkpoint)
    preempt_signals: Tuple[signal.Signals, ...]   # save and stop at the next step boundary (training.preemption)
    slurm_requeue: bool           # then requeue the SLURM job
    dry_run: bool
    recorded_args: Mapping[str, Any]
    """Every argument as params.txt, checkpoints and wandb record it (precision resolved; a run
    without --name records the name it gets at start)."""
