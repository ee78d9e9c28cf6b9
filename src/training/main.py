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
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import List, Optional, Sequence

import numpy as np
import torch
import torchvision

from open_clip_adacl import DistributedSetup, Loss, create_loss

from . import params
from .checkpoint import Checkpointer, TrainState, find_latest_checkpoint, resume
from .data import SKIP_REASONS, DataError, build_train_data, build_val_data, data_error_reason
from .distributed import (DistributedEnv, any_rank, barrier, broadcast_object, init_distributed, shutdown,
                          unwrap_model, wrap_ddp)
from .logger import MetricsWriter, WandbConfig, setup_logging
from .model import (ModelBundle, build_model, build_optimizer, build_precision, build_scheduler, check_pretrained,
                    open_clip_model_config, preprocess_config)
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
    plan = check_startup(args, world_size)
    if args.dry_run:
        build_loss(args, DistributedEnv(world_size=world_size))  # the loss's own checks of its options
        # Only a named run can collide (the default name is the start time); the run checks every rank's log.
        if args.name is not None and has_run_dir(args):
            collision = run_dir_collision(args, os.path.join(args.logs, args.name, "out.log"))
            if collision:
                raise ConfigError(collision)
        for warning in plan.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        print(f"dry run OK: {plan.text}")
        return None
    env = init_distributed(args.device, dist_backend=args.dist_backend, dist_url=args.dist_url,
                           no_set_device_rank=args.no_set_device_rank)
    try:
        return train(args, env, plan)
    finally:
        shutdown(env)


def train(args, env: DistributedEnv, plan: StartupPlan) -> RunSummary:
    args.precision = params.resolve_precision(args.precision, env.device.type)
    configure_torch(env.device)
    seed_everything(args.seed + env.rank)  # this rank's random stream (OpenCLIP's seeding)
    loss_fn = build_loss(args, env)  # first, so that a bad loss option fails before anything is written
    paths = build_run_paths(args, env)
    setup_logging(paths.log_file, logging.DEBUG if args.debug else logging.INFO, rank=env.rank,
                  log_all_ranks=args.log_local)
    logging.info(f"Rank {env.rank} of {env.world_size} on {env.device}, precision {args.precision}; run {paths.name}")
    write_params(args, paths, env)
    for warning in plan.warnings if env.is_master else []:
        logging.warning(warning)

    # The same initial weights on every rank, then back to the rank's own random stream.
    seed_everything(args.seed)
    try:
        bundle = build_model(params.model_config(args), env.device)
    except RuntimeError as error:  # e.g. load_state_dict's missing/unexpected keys
        if not args.pretrained:
            raise
        raise ConfigError(f"--pretrained {args.pretrained} does not fit --model {args.model}: "
                          f"{str(error).splitlines()[0][:300]}; pass weights of that architecture") from error
    seed_everything(args.seed + env.rank)
    optimizer = build_optimizer(bundle.model, params.optimizer_config(args))
    precision = build_precision(args.precision, env.device)

    state = TrainState()
    resume_from = find_resume_checkpoint(args.resume, paths, env)
    if resume_from is not None:
        state = resume(resume_from, model=bundle.model, optimizer=optimizer, scaler=precision.scaler,
                       loss=loss_fn, env=env, reset_loss_state=args.reset_loss_state)

    data = build_data(args, bundle, env, epoch=state.epoch, skip_batches=state.batches_in_epoch)
    val_data = build_val_data_if_needed(args, bundle, env)
    imagenet = plan.imagenet if env.is_master else None  # rank 0 evaluates, as in OpenCLIP
    if imagenet is not None:
        imagenet.transform = bundle.preprocess_val
    scheduler = build_scheduler(optimizer, params.scheduler_config(args), data.num_batches // args.accum_freq)
    model = wrap_ddp(bundle.model, env, static_graph=args.ddp_static_graph, sync_batchnorm=args.use_bn_sync)
    if args.torchcompile:
        model = compile_model(model, grad_checkpointing=args.grad_checkpointing, distributed=env.distributed)
    metrics = build_metrics_writer(args, paths, env)
    checkpointer = build_checkpointer(args, paths, model, optimizer, precision.scaler, loss_fn, bundle, env)
    train_cfg = params.train_config(args)

    final_loss = None
    for epoch in range(state.epoch, args.epochs):
        logging.info(f"Start epoch {epoch}")
        data.set_epoch(epoch)
        result = train_one_epoch(model, loss_fn, data.dataloader, data.num_batches, optimizer, scheduler,
                                 precision, state, train_cfg, env, skip_reasons=SKIP_REASONS, metrics=metrics,
                                 checkpointer=checkpointer)
        final_loss = result.loss
        state.finish_epoch()
        evaluate(args, unwrap_model(model), bundle, val_data, imagenet, precision, state, metrics, paths, env)
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


def build_run_paths(args, env: DistributedEnv) -> RunPaths:
    """<logs>/<name>/ and its files; refuses to overwrite an earlier run unless resuming it."""
    if args.name is None:
        date = broadcast_object(datetime.now().strftime("%Y_%m_%d-%H_%M_%S"), env)
        args.name = "-".join([date, f"model_{args.model.replace('/', '-')}", f"lr_{args.lr}",
                              f"b_{args.batch_size}", f"j_{args.workers}", f"p_{args.precision}"])
    if not has_run_dir(args):
        return RunPaths(args.name, None, None, None)
    run_dir = os.path.join(args.logs, args.name)
    log_file = os.path.join(run_dir, f"out-{env.rank}.log" if args.log_local else "out.log")
    writes_log = env.is_local_master if args.log_local else env.is_master
    # Decided together: a rank that raised alone would leave the others waiting at the next collective.
    if any_rank(writes_log and run_dir_collision(args, log_file) is not None, env):
        raise ConfigError(run_dir_collision(args, log_file) or f"{run_dir} already holds a run (seen by another rank)")
    if env.is_master:
        os.makedirs(os.path.join(run_dir, "checkpoints"), exist_ok=True)
    barrier(env)
    if writes_log:
        os.makedirs(run_dir, exist_ok=True)
    return RunPaths(args.name, run_dir, os.path.join(run_dir, "checkpoints"), log_file if writes_log else None)


def has_run_dir(args) -> bool:
    """False with --logs none: nothing is written."""
    return args.logs is not None and args.logs.lower() != "none"


def run_dir_collision(args, log_file: str) -> Optional[str]:
    """The error for starting a new run where `log_file` shows an earlier one (None: no collision)."""
    if args.resume == RESUME_LATEST or not os.path.exists(log_file):
        return None
    return (f"{os.path.dirname(log_file)} already holds a run; continue it with --resume latest or choose "
            f"another --name")


def write_params(args, paths: RunPaths, env: DistributedEnv) -> None:
    """params.txt: every argument, the loss's options included (OpenCLIP's format `name: value`)."""
    if not env.is_master:
        return
    lines = [f"{name}: {value}" for name, value in params.arg_values(args).items()]
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


def build_loss(args, env: DistributedEnv) -> Loss:
    """The registered loss `--loss` with its options; an option it rejects is a ConfigError."""
    dist = DistributedSetup(rank=env.rank, world_size=env.world_size, local_loss=args.local_loss,
                            gather_with_grad=args.gather_with_grad)
    try:
        loss_fn = create_loss(args.loss, dist=dist, **args.loss_options)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"--loss {args.loss}: {error}") from error
    return loss_fn.to(env.device)


def build_data(args, bundle: ModelBundle, env: DistributedEnv, *, epoch: int, skip_batches: int):
    """The training stream for this rank (the shards were checked by `check_startup`)."""
    cfg = params.data_config(args, rank=env.rank, world_size=env.world_size, skip_batches=skip_batches)
    try:
        data = build_train_data(cfg, bundle.preprocess_train, bundle.tokenizer, epoch=epoch)
    except ValueError as error:  # e.g. a resume position outside the epoch (another batch size or world size)
        raise ConfigError(f"training data: {error}") from error
    logging.info(f"Training data: {data.num_samples} samples and {data.num_batches} batches per rank and epoch")
    return data


def build_val_data_if_needed(args, bundle: ModelBundle, env: DistributedEnv):
    """Validation data for rank 0, which evaluates alone as in OpenCLIP (None without --val-data; the
    shards were checked by `check_startup`)."""
    if args.val_data is None or not env.is_master:
        return None
    return build_val_data(params.data_config(args, rank=0, world_size=1, validation=True), bundle.preprocess_val,
                          bundle.tokenizer)


def build_metrics_writer(args, paths: RunPaths, env: DistributedEnv) -> MetricsWriter:
    """metrics.jsonl, plus the dashboards --report-to names (rank 0)."""
    dashboards = params.report_to(args.report_to)
    wandb = None
    if "wandb" in dashboards:
        wandb = WandbConfig(project=args.wandb_project_name, name=paths.name, notes=args.wandb_notes,
                            resume=args.resume == RESUME_LATEST, config=params.arg_values(args))
    return MetricsWriter(paths.run_dir, tensorboard="tensorboard" in dashboards, wandb=wandb, enabled=env.is_master)


def build_checkpointer(args, paths: RunPaths, model, optimizer, scaler, loss_fn, bundle: ModelBundle,
                       env: DistributedEnv) -> Optional[Checkpointer]:
    if paths.checkpoint_dir is None:
        return None
    return Checkpointer(params.checkpoint_config(args, paths.checkpoint_dir), model=model, optimizer=optimizer,
                        scaler=scaler, loss=loss_fn, env=env, name=paths.name, args=params.arg_values(args),
                        model_cfg=open_clip_model_config(params.model_config(args)),
                        preprocess_cfg=preprocess_config(bundle.model))


# ---------------------------------------------------------------------------------------------
# Evaluation, dry run, console entry point
# ---------------------------------------------------------------------------------------------


def evaluate(args, model, bundle: ModelBundle, val_data, imagenet, precision, state: TrainState,
             metrics: MetricsWriter, paths: RunPaths, env: DistributedEnv) -> None:
    """Val loss and retrieval every --val-frequency epochs, ImageNet zero-shot every --zeroshot-frequency
    epochs (both also after the last epoch), on rank 0, as OpenCLIP's `evaluate`."""
    if not env.is_master:
        return
    completed, is_last = state.epoch, state.epoch == args.epochs
    results = {}
    if val_data is not None and args.val_frequency and (completed % args.val_frequency == 0 or is_last):
        results.update(run_validation(model, val_data.dataloader, device=env.device, autocast=precision.autocast,
                                      epoch=completed, input_dtype=precision.input_dtype))
    if imagenet is not None and (completed % args.zeroshot_frequency == 0 or is_last):
        results.update(zero_shot_imagenet(model, bundle.tokenizer, imagenet, device=env.device, autocast=precision.autocast,
                                          batch_size=args.batch_size, workers=args.workers,
                                          input_dtype=precision.input_dtype))
    if not results:
        return
    logging.info(f"Eval Epoch: {completed} " + "\t".join(f"{k}: {v:.4f}" for k, v in results.items()))
    metrics.write("val", step=state.step, epoch=completed, values=results)
    if paths.checkpoint_dir is not None:
        write_results(Path(paths.checkpoint_dir) / "results.jsonl", completed, results)


def check_startup(args, world_size: int) -> StartupPlan:
    """Before any work, on every rank (so that all of them stop together): the shards exist and open and
    the training shards fill an epoch at this batch size, --pretrained loads, --imagenet-val is an
    ImageNet folder; returns the plan, with a warning when warmup never ends."""
    cfg = params.data_config(args, rank=0, world_size=world_size)
    try:
        data = build_train_data(cfg, preprocess=None, tokenizer=None, epoch=0)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        raise ConfigError(f"training data: {error}") from error
    try:
        build_val_data(params.data_config(args, rank=0, world_size=1, validation=True), preprocess=None,
                       tokenizer=None)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        raise ConfigError(f"validation data: {error}") from error
    steps_per_epoch = data.num_batches // args.accum_freq
    if steps_per_epoch < 1:
        raise ConfigError(f"an epoch has {data.num_batches} batches per rank, fewer than --accum-freq "
                          f"{args.accum_freq}: lower --accum-freq or --batch-size, or use more samples")
    try:
        check_pretrained(args.model, args.pretrained, args.cache_dir)
    except ValueError as error:
        raise ConfigError(f"--pretrained {args.pretrained}: {error}") from error
    imagenet = None
    if args.imagenet_val and args.zeroshot_frequency:
        try:
            imagenet = imagenet_folder(args.imagenet_val)
        except ValueError as error:
            raise ConfigError(f"--imagenet-val: {error}") from error
    total_steps = steps_per_epoch * args.epochs
    text = (f"--model {args.model} --loss {args.loss} {args.loss_options}; {world_size} rank(s) x batch "
            f"{args.batch_size} x accum {args.accum_freq} = {world_size * args.batch_size * args.accum_freq} samples "
            f"per step; {data.num_samples} samples per rank and epoch, {steps_per_epoch} steps per epoch, "
            f"{total_steps} steps in {args.epochs} epochs")
    warnings = []
    if args.warmup >= total_steps > 0:
        warnings.append(f"--warmup {args.warmup} >= the run's {total_steps} steps: the learning rate never reaches "
                        f"--lr {args.lr}; lower --warmup (OpenCLIP's recipes warm up for a few % of the steps)")
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
