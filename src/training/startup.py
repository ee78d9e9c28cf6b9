"""The checks before any work, on every rank (so that all of them stop together), and the plan they print:
the data, --pretrained, --imagenet-val and the schedule's length (`--dry-run` stops after them)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import List, Optional

import torchvision

from .config import RunConfig
from .data import build_train_data, build_val_data, check_data_fields
from .flags import ConfigError
from .model import check_pretrained
from .validation import imagenet_folder


@dataclass
class StartupPlan:
    """What the checks before any work found: the plan's text, and what to warn about."""

    text: str
    num_batches: int                # training batches per rank and epoch
    imagenet: Optional[torchvision.datasets.ImageFolder] = None  # --imagenet-val, without transform yet
    warnings: List[str] = field(default_factory=list)


def check_startup(cfg: RunConfig, world_size: int) -> StartupPlan:
    """Before any work, on every rank (so that all of them stop together): the shards exist and open, their
    first samples have the caption and image fields, the training shards fill an epoch at this batch size, --pretrained loads, --imagenet-val is an
    ImageNet folder; returns the plan, with a warning when warmup never ends."""
    try:
        data = build_train_data(replace(cfg.data, world_size=world_size), preprocess=None, tokenizer=None, epoch=0)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        raise ConfigError(f"training data: {error}") from error
    try:
        build_val_data(cfg.data, preprocess=None, tokenizer=None)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        raise ConfigError(f"validation data: {error}") from error
    try:
        check_data_fields(cfg.data)
    except ValueError as error:  # a DataError (no readable sample) is the run's to report, as for the loaders
        raise ConfigError(str(error)) from error
    accum_freq = cfg.train.accum_freq
    steps_per_epoch = data.num_batches // accum_freq
    if steps_per_epoch < 1:
        raise ConfigError(f"an epoch has {data.num_batches} batches per rank, fewer than --accum-freq "
                          f"{accum_freq}: lower --accum-freq or --batch-size, or use more samples")
    try:
        check_pretrained(cfg.model.name, cfg.model.pretrained, cfg.model.cache_dir)
    except ValueError as error:
        raise ConfigError(f"--pretrained {cfg.model.pretrained}: {error}") from error
    imagenet = None
    if cfg.validation.imagenet_val and cfg.validation.zeroshot_frequency:
        try:
            imagenet = imagenet_folder(cfg.validation.imagenet_val)
        except ValueError as error:
            raise ConfigError(f"--imagenet-val: {error}") from error
    total_steps = steps_per_epoch * cfg.epochs
    batch_size = cfg.data.batch_size
    text = (f"--model {cfg.model.name} --loss {cfg.loss.name} {asdict(cfg.loss.options)}; {world_size} rank(s) x "
            f"batch {batch_size} x accum {accum_freq} = {world_size * batch_size * accum_freq} samples "
            f"per step; {data.num_samples} samples per rank and epoch, {steps_per_epoch} steps per epoch, "
            f"{total_steps} steps in {cfg.epochs} epochs")
    warnings = []
    if cfg.schedule.warmup >= total_steps > 0:
        warnings.append(f"--warmup {cfg.schedule.warmup} >= the run's {total_steps} steps: the learning rate never "
                        f"reaches --lr {cfg.schedule.lr}; lower --warmup (OpenCLIP's recipes warm up for a few % of "
                        "the steps)")
    return StartupPlan(text, data.num_batches, imagenet, warnings)
