"""`python -m training.main`: CLIP pretraining with OpenCLIP's command line and any registered loss.

    python -m training.main --train-data 'demo/train/shard-{000000..000007}.tar' --model adacl-tiny \
        --loss clip --batch-size 64 --epochs 5 --lr 1e-3 --warmup 50 --workers 2 --device cpu

Single process, or one process per device under torchrun / srun (DDP). Everything a run writes is
under <logs>/<name>/: out.log, params.txt, metrics.jsonl, checkpoints/, tensorboard/.
"""
from __future__ import annotations

import logging
import os
import random
import sys
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
import torchvision

from open_clip_adacl import DistributedSetup, Loss, get_loss_class

from . import params
from .checkpoint import CheckpointConfig, Checkpointer, TrainState, find_latest_checkpoint, resume
from .config import LossConfig, RunConfig, ValidationConfig
from .data import SKIP_REASONS, DataConfig, DataError, build_train_data, build_val_data, data_error_reason
from .distributed import (DistributedEnv, any_rank, barrier, broadcast_object, init_distributed, shutdown,
                          unwrap_model, wrap_ddp)
from .logger import MetricsWriter, WandbConfig, setup_logging
from .model import (ModelBundle, ModelConfig, build_model, build_optimizer, build_precision, build_scheduler,
                    check_pretrained, open_clip_model_config, preprocess_config)
from .params import RESUME_LATEST, ConfigError
from .train import NonFiniteLossError, train_one_epoch
from .validation import imagenet_folder, run_validation, write_results, zero_shot_imagenet


@dataclass
class RunSummary:
    run_dir: Optional[str]
    epoch: int                      # completed epochs
    step: int                       # training steps taken
    final_loss: Optional[float]     # mean loss of the last epoch trained by this call
    checkpoint: Optional[str]       # last checkpoint written


@dataclass
class StartupPlan:
    """What the checks before any work found: the plan's text, and what to warn about."""

    text: str
    imagenet: Optional[torchvision.datasets.ImageFolder] = None  # --imagenet-val, without transform yet
    warnings: List[str] = field(default_factory=list)


@dataclass
class RunPaths:
    name: str
    run_dir: Optional[str]          # None with --logs none
    checkpoint_dir: Optional[str]
    log_file: Optional[str]         # None on ranks that do not write a log file


def main(argv: Optional[Sequence[str]] = None) -> Optional[RunSummary]:
    args = params.parse_args(argv)
    world_size = params.world_size_from_env()
    params.validate_args(args, world_size)
    cfg = params.run_config(args)  # from here on nothing reads args
    plan = check_startup(cfg, world_size)
    if cfg.dry_run:
        build_loss(cfg.loss, DistributedEnv(world_size=world_size))  # the loss's own checks of its setup
        # Only a named run can collide (the default name is the start time); the run checks every rank's log.
        if cfg.logging.name is not None and cfg.logging.logs is not None:
            collision = run_dir_collision(cfg.resume, os.path.join(cfg.logging.logs, cfg.logging.name, "out.log"))
            if collision:
                raise ConfigError(collision)
        for warning in plan.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        print(f"dry run OK: {plan.text}")
        return None
    env = init_distributed(cfg.distributed.device, dist_backend=cfg.distributed.dist_backend,
                           dist_url=cfg.distributed.dist_url, no_set_device_rank=cfg.distributed.no_set_device_rank)
    try:
        configure_torch(env.device)
        seed_everything(cfg.seed + env.rank)  # this rank's random stream (OpenCLIP's seeding)
        loss_fn = build_loss(cfg.loss, env)  # first, so that a bad loss option fails before anything is written
        return train(cfg, env, plan, loss_fn)
    finally:
        shutdown(env)


def train(cfg: RunConfig, env: DistributedEnv, plan: StartupPlan, loss_fn: Loss) -> RunSummary:
    """The run on this rank, with the loss `main` built (torch configured and this rank seeded)."""
    paths = build_run_paths(cfg, env)
    setup_logging(paths.log_file, logging.DEBUG if cfg.logging.debug else logging.INFO, rank=env.rank,
                  log_all_ranks=cfg.logging.log_local)
    logging.info(f"Rank {env.rank} of {env.world_size} on {env.device}, precision {cfg.model.precision}; "
                 f"run {paths.name}")
    recorded = recorded_args(cfg, paths)
    write_params(recorded, paths, env)
    for warning in plan.warnings if env.is_master else []:
        logging.warning(warning)

    # The same initial weights on every rank, then back to the rank's own random stream.
    seed_everything(cfg.seed)
    try:
        bundle = build_model(cfg.model, env.device)
    except RuntimeError as error:  # e.g. load_state_dict's missing/unexpected keys
        if not cfg.model.pretrained:
            raise
        raise ConfigError(f"--pretrained {cfg.model.pretrained} does not fit --model {cfg.model.name}: "
                          f"{str(error).splitlines()[0][:300]}; pass weights of that architecture") from error
    seed_everything(cfg.seed + env.rank)
    optimizer = build_optimizer(bundle.model, cfg.optimizer)
    precision = build_precision(cfg.model.precision, env.device)

    state = TrainState()
    resume_from = find_resume_checkpoint(cfg.resume, paths, env)
    if resume_from is not None:
        state = resume(resume_from, model=bundle.model, optimizer=optimizer, scaler=precision.scaler,
                       loss=loss_fn, env=env, reset_loss_state=cfg.reset_loss_state)

    data = build_data(cfg.data, bundle, env, epoch=state.epoch, skip_batches=state.batches_in_epoch)
    val_data = build_val_data_if_needed(cfg.data, bundle, env)
    imagenet = plan.imagenet if env.is_master else None  # rank 0 evaluates, as in OpenCLIP
    if imagenet is not None:
        imagenet.transform = bundle.preprocess_val
    scheduler = build_scheduler(optimizer, cfg.schedule, data.num_batches // cfg.train.accum_freq)
    model = wrap_ddp(bundle.model, env, static_graph=cfg.distributed.ddp_static_graph,
                     sync_batchnorm=cfg.distributed.use_bn_sync)
    if cfg.torchcompile:
        model = compile_model(model, grad_checkpointing=cfg.model.grad_checkpointing, distributed=env.distributed)
    metrics = build_metrics_writer(cfg, recorded, paths, env)
    checkpointer = build_checkpointer(cfg.checkpoints, cfg.model, recorded, paths, model, optimizer,
                                      precision.scaler, loss_fn, bundle, env)

    final_loss = None
    for epoch in range(state.epoch, cfg.epochs):
        logging.info(f"Start epoch {epoch}")
        data.set_epoch(epoch)
        result = train_one_epoch(model, loss_fn, data.dataloader, data.num_batches, optimizer, scheduler,
                                 precision, state, cfg.train, env, skip_reasons=SKIP_REASONS, metrics=metrics,
                                 checkpointer=checkpointer)
        final_loss = result.loss
        state.finish_epoch()
        validate_epoch(cfg.validation, unwrap_model(model), bundle, val_data, imagenet, precision, state, metrics,
                       paths, env)
        if checkpointer is not None:
            checkpointer.save_epoch(state)
        barrier(env)  # keep ranks together while rank 0 evaluates and saves

    metrics.close()
    last_checkpoint = str(checkpointer.last_saved) if checkpointer and checkpointer.last_saved else None
    summary = RunSummary(paths.run_dir, state.epoch, state.step, final_loss, last_checkpoint)
    loss_text = f"{final_loss:.4f}" if final_loss is not None else "n/a (no epoch left to train)"
    logging.info(f"Done: {summary.epoch} epochs, {summary.step} steps, final epoch loss {loss_text}, "
                 f"last checkpoint {summary.checkpoint}")
    return summary


# ---------------------------------------------------------------------------------------------
# Setup
# ---------------------------------------------------------------------------------------------


def configure_torch(device: torch.device) -> None:
    if device.type == "cuda":
        # TF32 matmuls on Ampere+ (OpenCLIP's setting): close to fp32 accuracy at a fraction of the cost.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.deterministic = False


def compile_model(model: torch.nn.Module, *, grad_checkpointing: bool, distributed: bool) -> torch.nn.Module:
    """torch.compile around the (DDP-wrapped) model, as OpenCLIP's --torchcompile; checkpoints and
    evaluation reach the eager model through `unwrap_model`."""
    logging.info("Compiling model...")
    if grad_checkpointing and distributed:
        # OpenCLIP's workaround: compile + grad checkpointing work, but not with DDP's dynamo optimizer.
        torch._dynamo.config.optimize_ddp = False
    return torch.compile(model)


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def build_run_paths(cfg: RunConfig, env: DistributedEnv) -> RunPaths:
    """<logs>/<name>/ and its files; refuses to overwrite an earlier run unless resuming it."""
    name = cfg.logging.name if cfg.logging.name is not None else default_run_name(cfg, env)
    if cfg.logging.logs is None:
        return RunPaths(name, None, None, None)
    run_dir = os.path.join(cfg.logging.logs, name)
    log_file = os.path.join(run_dir, f"out-{env.rank}.log" if cfg.logging.log_local else "out.log")
    writes_log = env.is_local_master if cfg.logging.log_local else env.is_master
    # Decided together: a rank that raised alone would leave the others waiting at the next collective.
    if any_rank(writes_log and run_dir_collision(cfg.resume, log_file) is not None, env):
        raise ConfigError(run_dir_collision(cfg.resume, log_file)
                          or f"{run_dir} already holds a run (seen by another rank)")
    if env.is_master:
        os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
    barrier(env)
    if writes_log:
        os.makedirs(run_dir, exist_ok=True)
    return RunPaths(name, run_dir, os.path.join(run_dir, "checkpoints"), log_file if writes_log else None)


def default_run_name(cfg: RunConfig, env: DistributedEnv) -> str:
    """OpenCLIP's name for a run without --name: rank 0's start time and the main settings."""
    date = broadcast_object(datetime.now().strftime("%Y_%m_%d-%H_%M_%S"), env)
    return "-".join([date, f"model_{cfg.model.name.replace('/', '-')}", f"lr_{cfg.optimizer.lr}",
                     f"b_{cfg.data.batch_size}", f"j_{cfg.data.workers}", f"p_{cfg.model.precision}"])


def run_dir_collision(resume_arg: Optional[str], log_file: str) -> Optional[str]:
    """The error for starting a new run where `log_file` shows an earlier one (None: no collision)."""
    if resume_arg == RESUME_LATEST or not os.path.exists(log_file):
        return None
    return (f"{os.path.dirname(log_file)} already holds a run; continue it with --resume latest or choose "
            f"another --name")


def recorded_args(cfg: RunConfig, paths: RunPaths) -> Dict[str, Any]:
    """Every argument as this run used it (params.txt, checkpoints, wandb), with the name it got at start."""
    return {**cfg.recorded_args, "name": paths.name}


def write_params(recorded: Dict[str, Any], paths: RunPaths, env: DistributedEnv) -> None:
    """params.txt: every argument, the loss's options included (OpenCLIP's format `name: value`)."""
    if not env.is_master:
        return
    lines = [f"{name}: {value}" for name, value in recorded.items()]
    logging.info("Params:\n  " + "\n  ".join(lines))
    if paths.run_dir is not None:
        Path(paths.run_dir, "params.txt").write_text("\n".join(lines) + "\n")


def find_resume_checkpoint(resume_arg: Optional[str], paths: RunPaths, env: DistributedEnv) -> Optional[str]:
    """--resume PATH as given; --resume latest: this run's newest checkpoint (None: start from scratch)."""
    if resume_arg != RESUME_LATEST:
        return resume_arg
    if paths.checkpoint_dir is None:
        raise ConfigError("--resume latest looks in <logs>/<name>/checkpoints; it needs --logs")
    latest = find_latest_checkpoint(paths.checkpoint_dir) if env.is_master else None
    latest = broadcast_object(str(latest) if latest else None, env)
    if latest is None:
        logging.info(f"No checkpoint in {paths.checkpoint_dir}; starting from scratch")
    return latest


def build_loss(cfg: LossConfig, env: DistributedEnv) -> Loss:
    """The registered loss with its (validated) options on this rank; an error it raises is a ConfigError."""
    dist = DistributedSetup(rank=env.rank, world_size=env.world_size, local_loss=cfg.local_loss,
                            gather_with_grad=cfg.gather_with_grad)
    try:
        loss_fn = get_loss_class(cfg.name)(cfg.options, dist)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"--loss {cfg.name}: {error}") from error
    return loss_fn.to(env.device)


def build_data(cfg: DataConfig, bundle: ModelBundle, env: DistributedEnv, *, epoch: int, skip_batches: int):
    """The training stream for this rank (the shards were checked by `check_startup`)."""
    cfg = replace(cfg, rank=env.rank, world_size=env.world_size, skip_batches=skip_batches)
    try:
        data = build_train_data(cfg, bundle.preprocess_train, bundle.tokenizer, epoch=epoch)
    except ValueError as error:  # e.g. a resume position outside the epoch (another batch size or world size)
        raise ConfigError(f"training data: {error}") from error
    logging.info(f"Training data: {data.num_samples} samples and {data.num_batches} batches per rank and epoch")
    return data


def build_val_data_if_needed(cfg: DataConfig, bundle: ModelBundle, env: DistributedEnv):
    """Validation data for rank 0, which evaluates alone as in OpenCLIP (None without --val-data; the
    shards were checked by `check_startup`)."""
    if cfg.val_data is None or not env.is_master:
        return None
    return build_val_data(cfg, bundle.preprocess_val, bundle.tokenizer)


def build_metrics_writer(cfg: RunConfig, recorded: Dict[str, Any], paths: RunPaths,
                         env: DistributedEnv) -> MetricsWriter:
    """metrics.jsonl, plus the dashboards --report-to names (rank 0)."""
    wandb = None
    if "wandb" in cfg.logging.report_to:
        wandb = WandbConfig(project=cfg.logging.wandb_project_name, name=paths.name, notes=cfg.logging.wandb_notes,
                            resume=cfg.resume == RESUME_LATEST, config=recorded)
    return MetricsWriter(paths.run_dir, tensorboard="tensorboard" in cfg.logging.report_to, wandb=wandb,
                         enabled=env.is_master)


def build_checkpointer(cfg: CheckpointConfig, model_cfg: ModelConfig, recorded: Dict[str, Any], paths: RunPaths,
                       model, optimizer, scaler, loss_fn, bundle: ModelBundle,
                       env: DistributedEnv) -> Optional[Checkpointer]:
    if paths.checkpoint_dir is None:
        return None
    return Checkpointer(cfg, checkpoint_dir=paths.checkpoint_dir, model=model, optimizer=optimizer, scaler=scaler,
                        loss=loss_fn, env=env, name=paths.name, args=recorded,
                        model_cfg=open_clip_model_config(model_cfg), preprocess_cfg=preprocess_config(bundle.model))


# ---------------------------------------------------------------------------------------------
# Validation, dry run, console entry point
# ---------------------------------------------------------------------------------------------


def validate_epoch(cfg: ValidationConfig, model, bundle: ModelBundle, val_data, imagenet, precision,
                   state: TrainState, metrics: MetricsWriter, paths: RunPaths, env: DistributedEnv) -> None:
    """Val loss and retrieval every --val-frequency epochs, ImageNet zero-shot every --zeroshot-frequency
    epochs (both also after the last epoch), on rank 0, as OpenCLIP's `evaluate`."""
    if not env.is_master:
        return
    completed, is_last = state.epoch, state.epoch == cfg.total_epochs
    results = {}
    if val_data is not None and cfg.val_frequency and (completed % cfg.val_frequency == 0 or is_last):
        results.update(run_validation(model, val_data.dataloader, device=env.device, autocast=precision.autocast,
                                      epoch=completed, input_dtype=precision.input_dtype))
    if imagenet is not None and (completed % cfg.zeroshot_frequency == 0 or is_last):
        results.update(zero_shot_imagenet(model, bundle.tokenizer, imagenet, device=env.device,
                                          autocast=precision.autocast, batch_size=cfg.batch_size,
                                          workers=cfg.workers, input_dtype=precision.input_dtype))
    if not results:
        return
    logging.info(f"Eval Epoch: {completed} " + "\t".join(f"{k}: {v:.4f}" for k, v in results.items()))
    metrics.write("val", step=state.step, epoch=completed, values=results)
    if paths.checkpoint_dir is not None:
        write_results(Path(paths.checkpoint_dir) / "results.jsonl", completed, results)


def check_startup(cfg: RunConfig, world_size: int) -> StartupPlan:
    """Before any work, on every rank (so that all of them stop together): the shards exist and open and
    the training shards fill an epoch at this batch size, --pretrained loads, --imagenet-val is an
    ImageNet folder; returns the plan, with a warning when warmup never ends."""
    try:
        data = build_train_data(replace(cfg.data, world_size=world_size), preprocess=None, tokenizer=None, epoch=0)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        raise ConfigError(f"training data: {error}") from error
    try:
        build_val_data(cfg.data, preprocess=None, tokenizer=None)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        raise ConfigError(f"validation data: {error}") from error
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
    return StartupPlan(text, imagenet, warnings)


def cli() -> None:
    """Console entry point: a configuration problem prints one line and exits with status 2; data that
    cannot fill an epoch (every shard of a rank unreadable) or a diverged run is logged and exits with 1."""
    try:
        main(sys.argv[1:])
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteLossError:
        sys.exit(1)  # the reason and what to change were logged
    except DataError as error:
        logging.error(f"training data: {data_error_reason(error)}")
        sys.exit(1)


if __name__ == "__main__":
    cli()
