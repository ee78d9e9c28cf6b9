"""The checks before any work, on every rank (so that all of them stop together), and the plan they print:
the data, --pretrained, --imagenet-val and the schedule's length (`--dry-run` stops after them); a run's log
starts with that plan (`plan_line`)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from typing import List, Optional

import torchvision

from open_clip_adacl.flag_numbers import INT64_MAX
from open_clip_adacl.losses.flags import loss_line

from ..data import (
    build_train_data,
    build_val_data,
    check_data_fields,
    get_data_source,
    resolve_dataset_type,
    samples_per_step,
)
from ..distributed import resolved_device_type
from ..engine.model import ModelConfig, check_pretrained, parameter_count
from ..engine.validation import imagenet_folder
from ..flags import ConfigError
from ..run_folder.checkpoint_files import checkpoint_candidates
from ..run_folder.layout import CHECKPOINT_DIR_NAME
from .config import RESUME_LATEST, RunConfig, sample_state_rows


@dataclass
class StartupPlan:
    """What the checks before any work found: the plan's text, and what to warn about."""

    text: str
    num_batches: int  # training batches per rank and epoch
    total_steps: int  # optimizer steps over all epochs
    imagenet: Optional[torchvision.datasets.ImageFolder] = None  # --imagenet-val, without transform yet
    warnings: List[str] = field(default_factory=list)


def check_startup(cfg: RunConfig, world_size: int) -> StartupPlan:
    """Before any work, on every rank (so that all of them stop together): the shards exist and open, their
    first samples have the caption and image fields, the training shards fill an epoch at this batch size, --pretrained loads, --imagenet-val is an
    ImageNet folder; returns the plan, with warnings for a warmup that never ends, autocast on the CPU and a
    --resume latest that cannot find this run again."""
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
    state_problem = sample_state_problem(cfg, data)
    if state_problem:
        raise ConfigError(state_problem)
    accum_freq = cfg.train.accum_freq
    steps_per_epoch = data.num_batches // accum_freq
    if steps_per_epoch < 1:
        raise ConfigError(
            f"an epoch has {data.num_batches} batches per rank, fewer than --accum-freq "
            f"{accum_freq}: lower --accum-freq or --batch-size, or use more samples"
        )
    try:
        check_pretrained(cfg.model.name, cfg.model.pretrained, cfg.model.cache_dir)
    except ValueError as error:
        raise ConfigError(f"--pretrained {cfg.model.pretrained}: {error}") from error
    half_weights = half_weights_on_cpu(cfg)
    if half_weights:
        raise ConfigError(half_weights)
    imagenet = None
    if cfg.validation.imagenet_val and cfg.validation.zeroshot_frequency:
        try:
            imagenet = imagenet_folder(cfg.validation.imagenet_val)
        except ValueError as error:
            raise ConfigError(f"--imagenet-val: {error}") from error
    total_steps = steps_per_epoch * cfg.epochs
    if total_steps > INT64_MAX:
        raise ConfigError(
            f"--epochs {cfg.epochs} x {steps_per_epoch} steps per epoch = {total_steps} steps, more than a 64-bit "
            "step counter holds (2**63 - 1); lower --epochs or --train-num-samples"
        )
    batch_size = cfg.data.batch_size
    text = (
        f"--model {cfg.model.name} --loss {cfg.loss.name}; {world_size} rank(s) x "
        f"batch {batch_size} x accum {accum_freq} = {samples_per_step(batch_size, world_size, accum_freq)} samples "
        f"per step; {data.num_samples} samples per rank and epoch, {steps_per_epoch} steps per epoch, "
        f"{total_steps} steps in {cfg.epochs} epochs"
    )
    text += "".join(f"\n  {line}" for line in changed_option_lines(cfg.loss.options))
    warnings = []
    if cfg.schedule.warmup >= total_steps > 0:
        warnings.append(
            f"--warmup {cfg.schedule.warmup} >= the run's {total_steps} steps: the learning rate never "
            f"reaches --lr {cfg.schedule.lr}; lower --warmup (OpenCLIP's recipes warm up for a few % of "
            "the steps)"
        )
    warnings += [
        warning
        for warning in (amp_on_cpu_warning(cfg), unnamed_resume_warning(cfg), epoch_beyond_data_warning(cfg, data))
        if warning
    ]
    return StartupPlan(text, data.num_batches, total_steps, imagenet, warnings)


def sample_state_problem(cfg: RunConfig, data) -> Optional[str]:
    """A loss's per-sample state (--data-size rows) that some sample ids of the training data, known before any is
    read (a csv's: its row numbers), cannot index. A shard's sample keys are known only when read: those are
    skipped as bad_sample_key (`DataConfig.sample_index_limit`)."""
    rows, ids_below = sample_state_rows(cfg.loss.options), data.sample_ids_below
    if rows is None or ids_below is None or ids_below <= rows:
        return None
    return (
        f"--data-size {rows} is less than the {ids_below} rows of --train-data {cfg.data.train_data} (row k is "
        f"sample k, and --loss {cfg.loss.name} keeps a state per sample): rows {rows}..{ids_below - 1} have none; "
        f"pass --data-size {ids_below}"
    )


def plan_line(plan: StartupPlan, disk: Optional[str]) -> str:
    """The run's first log line: its plan (ranks x batch x accum, steps, epochs) and the disk its checkpoints need;
    the loss options it changes follow on lines of their own."""
    first, *options = plan.text.split("\n")
    return "\n".join([f"Plan: {first}" + (f"; {disk}" if disk else ""), *options])


def quiet_parameter_count(cfg: ModelConfig) -> Optional[int]:
    """The model's parameters, counted on the meta device before any weights exist and without open_clip's lines
    about it (they belong to the real model's creation); None when it cannot be sized so (a hub model not in the
    cache yet: the run sizes it once built)."""
    logging.disable(logging.WARNING)
    try:
        return parameter_count(cfg)
    except Exception:  # noqa: BLE001 - any failure only postpones the sizing
        return None
    finally:
        logging.disable(logging.NOTSET)


def changed_option_lines(options) -> List[str]:
    """One line per loss option whose value is not its declared default ("mode: calibrated (default literal)"):
    the plan says what this run sets, params.txt every value."""
    return [
        f"loss option {spec.name}: {getattr(options, spec.name)} (default {spec.default})"
        for spec in options.specs()
        if getattr(options, spec.name) != spec.default
    ]


# Autocast precisions, which run slower than fp32 on the CPU: adacl-tiny's 64 steps at batch 32 took 27 s with amp
# against 9 s in fp32 (AMD EPYC family 25 model 17, 2 cores).
AUTOCAST_PRECISIONS = ("amp", "amp_bf16", "amp_bfloat16")


def amp_on_cpu_warning(cfg: RunConfig) -> Optional[str]:
    """--precision amp on a run that lands on the CPU: autocast there converts every matmul's inputs and
    trains slower than fp32, which is the CPU's default for that reason."""
    if cfg.model.precision not in AUTOCAST_PRECISIONS or resolved_device_type(cfg.distributed.device) != "cpu":
        return None
    return (
        f"--precision {cfg.model.precision} on the CPU: autocast trains slower there than fp32 (3x for "
        "adacl-tiny on 2 cores); drop --precision (fp32 is the CPU's default) unless you are testing it"
    )


def epoch_beyond_data_warning(cfg: RunConfig, data) -> Optional[str]:
    """--train-num-samples above the samples the training data holds (when known: sizes.json, a csv's rows): an
    epoch then shows each sample several times, which a user who meant "one pass" would not guess."""
    wanted, held = cfg.data.train_num_samples, data.data_size
    if wanted is None or not held or wanted <= held:
        return None
    return (
        f"--train-num-samples {wanted} is more than the {held} samples of --train-data: an epoch shows each sample "
        f"about {wanted / held:.3g} times; lower it to {held} for one pass per epoch"
    )


def loss_input_warnings(cfg: RunConfig, loss_fn) -> List[str]:
    """Options under which the loss changes nothing at this run's global batch (`Loss.idle_options`, by their
    flags), and a loss that reads the captions' token ids (a token discovery) on data whose samples share one
    caption: every pair of captions is alike, so it flags nothing and trains as its plain base loss."""
    global_batch = samples_per_step(cfg.data.batch_size, loss_fn.dist.world_size, cfg.train.accum_freq)
    warnings = [loss_line(cfg.loss.name, line) for line in loss_fn.idle_options(global_batch)]
    if not loss_fn.reads_text_tokens():
        return warnings
    source = get_data_source(resolve_dataset_type(cfg.data.dataset_type, cfg.data.train_data))
    if not source.one_caption:
        return warnings
    return warnings + [
        f"--loss {cfg.loss.name} reads the captions' token ids, and --dataset-type {cfg.data.dataset_type} gives "
        "every sample the same caption: its discovery can tell no pair apart and flags nothing; train on data with "
        "captions, or choose a discovery that reads the embeddings"
    ]


# Precisions that keep the weights, and so AdamW's moments, in float16 (OpenCLIP's fp16 and pure_fp16).
HALF_WEIGHT_PRECISIONS = ("fp16", "pure_fp16")


def half_weights_on_cpu(cfg: RunConfig) -> Optional[str]:
    """--precision fp16 or pure_fp16 on a run that lands on the CPU: float16 weights and optimizer moments, where
    AdamW's squared gradients underflow to zero and its first update overflows; the CPU has no float16 speed to win
    that for (on an accelerator OpenCLIP's default, amp, keeps fp32 weights with a gradient scaler)."""
    if cfg.model.precision not in HALF_WEIGHT_PRECISIONS or resolved_device_type(cfg.distributed.device) != "cpu":
        return None
    return (
        f"--precision {cfg.model.precision} on the CPU keeps the weights and AdamW's moments in float16, where squared "
        "gradients underflow to zero and the first update overflows (adacl-tiny's loss is NaN from step 2 on); "
        "drop --precision (fp32, the CPU's default) or pass --precision bf16"
    )


def unnamed_resume_warning(cfg: RunConfig) -> Optional[str]:
    """--resume latest without --name: each launch is named after its start time, so a relaunch (or a
    SLURM requeue) looks in a new, empty folder and starts from scratch."""
    if cfg.resume != RESUME_LATEST or cfg.logging.name is not None or cfg.logging.logs is None:
        return None
    return (
        "--resume latest without --name: each launch gets a new name (its start time), so a relaunch starts "
        "from scratch in a new folder; add --name NAME to continue this run when it is launched again"
    )


def resume_note(cfg: RunConfig) -> Optional[str]:
    """What --resume latest will do, for the dry run's plan: continue from the newest checkpoint of
    <logs>/<name>/checkpoints, or start from scratch when there is none (or no --name to find it by)."""
    if cfg.resume != RESUME_LATEST or cfg.logging.logs is None:
        return None
    if cfg.logging.name is None:
        return "--resume latest: no --name, so a new run: it starts from scratch"
    checkpoint_dir = os.path.join(cfg.logging.logs, cfg.logging.name, CHECKPOINT_DIR_NAME)
    candidates = checkpoint_candidates(checkpoint_dir)
    if not candidates:
        return f"--resume latest: no checkpoint in {checkpoint_dir} yet, so the run starts from scratch"
    return f"--resume latest: the run continues from {candidates[0]}"
