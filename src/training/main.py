"""`python -m training.main`: CLIP pretraining with OpenCLIP's command line and any registered loss.

    python -m training.main --train-data 'demo/train/shard-{000000..000007}.tar' --model adacl-tiny \
        --loss clip --batch-size 64 --epochs 5 --lr 1e-3 --warmup 50 --workers 2 --device cpu

Single process, or one process per device under torchrun / srun (DDP). Everything a run writes is
under <logs>/<name>/: out.log, params.txt (one block per launch), metrics.jsonl, checkpoints/,
tensorboard/. Exit status: 0 done, 1 stopped by the data, a diverged loss, a failed final checkpoint or
another rank's failure, 2 a configuration error (one line), 75 preempted (a step checkpoint saved;
docs/cluster.md).
"""
from __future__ import annotations

if __name__ == "__main__":  # before the imports below (seconds): a preemption signal meanwhile is not fatal
    from training.trainer.preemption import remember_early_signals

    remember_early_signals()

import logging
import os
import random
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from open_clip_adacl import DistributedSetup, Loss, get_loss_class

from .trainer.launch import params
from .trainer.engine.checkpoint import CheckpointConfig, Checkpointer, TrainState, plain_args, run_components
from .trainer.run_folder.checkpoint_files import checkpoint_candidates, load_checkpoint, roll_back
from .trainer.launch.resume import ResumeError, ResumeRequest, resume
from .trainer.launch.config import RESUME_LATEST, LossConfig, RunConfig, ValidationConfig
from .trainer.data import (FAMILY_FIELD, SKIP_REASONS, DataConfig, DataError, build_train_data, build_val_data,
                           data_error_reason)
from .trainer.distributed import (DistributedEnv, DistributedStartError, any_rank, barrier, broadcast_object,
                                  failed_collective, init_distributed, shutdown, unwrap_model, wrap_ddp)
from .trainer.run_folder.logger import MetricsWriter, WandbConfig, setup_logging
from .trainer.flags import ConfigError
from .trainer.run_folder.margins import write_margins_plot
from .trainer.engine.model import ModelBundle, ModelConfig, build_model, open_clip_model_config, preprocess_config
from .trainer.engine.optimizer import build_optimizer
from .trainer.engine.precision import build_precision
from .trainer.preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionFlag, requeue_slurm_job
from .trainer.launch.resume_changes import warn_run_changes
from .trainer.launch.folder import (LossRecords, RunPaths, build_run_paths, check_dry_run_checkpoint_space,
                                    check_run_checkpoint_space, hold_run_dir, is_inside, launch_note, recorded_args,
                                    run_dir_collision, run_folder_warnings, start_over, write_params)
from .trainer.run_folder.lock import RunLock
from .trainer.run_folder.layout import CHECKPOINT_DIR_NAME, LOG_NAME, RESULTS_NAME, RunDir
from .trainer.run_folder.records import trim_to_resume_point
from .trainer.run_folder.safe_write import RunFiles
from .trainer.engine.schedule import build_scheduler
from .trainer.launch.startup import StartupPlan, check_startup, resume_note
from .trainer.engine.loop import NonFiniteLossError, Trainer, train_one_epoch
from .trainer.engine.validation import run_validation, write_results, zero_shot_imagenet

# The plots a loss may ask for (`Loss.plots`), by name: rank 0 redraws each into the run folder at every epoch end.
PLOTS: Dict[str, Callable[[str], object]] = {"margins": write_margins_plot}


@dataclass
class RunSummary:
    run_dir: Optional[str]
    epoch: int                      # completed epochs
    step: int                       # training steps taken
    final_loss: Optional[float]     # mean loss of the last epoch trained by this call
    checkpoint: Optional[str]       # last checkpoint written
    unwritten: List[str] = field(default_factory=list)  # records that could not be written (training.trainer.run_folder.safe_write)

    @property
    def record(self) -> RunDir:
        """The run folder's reader: metrics (`RunDir.metrics`), validation results (`results`), checkpoints by
        number (`epoch_checkpoint`, `step_checkpoint`) and the flags of the last launch as params.txt recorded
        them (`recorded_flags`, values as text)."""
        if self.run_dir is None:
            raise ValueError("this run wrote no folder (--logs none)")
        return RunDir(self.run_dir)


class FinalCheckpointError(RuntimeError):
    """The run trained to the end but its last checkpoint could not be written."""


def main(argv: Optional[Sequence[str]] = None) -> Optional[RunSummary]:
    """The command line's run: `run(config)` of the parsed, checked flags (None for --dry-run)."""
    return run(params.checked_config(params.parse_args(argv)))  # from here on nothing reads args


def run(cfg: RunConfig) -> Optional[RunSummary]:
    """Train (or, with `cfg.dry_run`, only check) the run `cfg` describes, on the ranks the environment
    announces; build `cfg` with `training.trainer.launch.params.config_from_values` (or `checked_config` of parsed flags).
    Returns what this rank trained; `RunSummary.record` reads the run folder (metrics, checkpoints, results)."""
    world_size = params.world_size_from_env()
    plan = check_startup(cfg, world_size)
    plan.warnings += run_folder_warnings(cfg)
    if cfg.dry_run:
        loss_fn = build_loss(cfg.loss, DistributedEnv(world_size=world_size))  # the loss's own checks of its setup
        # Only a named run can collide (the default name is the start time); the run checks every rank's log.
        if cfg.logging.name is not None and cfg.logging.logs is not None:
            run_dir = os.path.join(cfg.logging.logs, cfg.logging.name)
            collision = run_dir_collision(cfg.resume, os.path.join(run_dir, LOG_NAME),
                                          os.path.join(run_dir, CHECKPOINT_DIR_NAME))
            if collision:
                raise ConfigError(collision)
        if cfg.logging.logs is not None:
            check_dry_run_checkpoint_space(cfg, loss_fn)
        for warning in plan.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        note = resume_note(cfg)
        print(f"dry run OK: {plan.text}" + (f"\n{note}" if note else ""))
        return None
    try:
        env = init_distributed(cfg.distributed.device, dist_backend=cfg.distributed.dist_backend,
                               dist_url=cfg.distributed.dist_url, no_set_device_rank=cfg.distributed.no_set_device_rank,
                               timeout_s=cfg.distributed.timeout_s)
    except DistributedStartError as error:
        raise ConfigError(str(error)) from None
    try:
        configure_torch(env.device)
        seed_everything(cfg.seed + env.rank)  # this rank's random stream (OpenCLIP's seeding)
        loss_fn = build_loss(cfg.loss, env)  # first, so that a bad loss option fails before anything is written
        with PreemptionFlag().watching(cfg.preempt_signals) as preemption, RunLock() as lock:
            return train(cfg, env, plan, loss_fn, preemption, lock)
    finally:
        shutdown(env)


def train(cfg: RunConfig, env: DistributedEnv, plan: StartupPlan, loss_fn: Loss, preemption: PreemptionFlag,
          lock: RunLock) -> RunSummary:
    """The run on this rank, with the loss `main` built (torch configured and this rank seeded); stops
    early (Preempted) when `preemption` is signalled. Rank 0 holds the run folder with `lock`."""
    paths = build_run_paths(cfg, env)
    setup_logging(paths.log_file, logging.DEBUG if cfg.logging.debug else logging.INFO, rank=env.rank,
                  log_all_ranks=cfg.logging.log_local)
    hold_run_dir(lock, paths, env)
    logging.info(f"Rank {env.rank} of {env.world_size} on {env.device}, precision {cfg.model.precision}; "
                 f"run {paths.name}")
    recorded = recorded_args(cfg, paths)
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
    check_run_checkpoint_space(paths, bundle.model, loss_fn, env)

    request = ResumeRequest(args=plain_args(recorded), world_size=env.world_size,
                            reset_loss_state=cfg.reset_loss_state, resume_anyway=cfg.resume_anyway)
    state = TrainState()
    components = run_components(model=bundle.model, optimizer=optimizer, scaler=precision.scaler, loss=loss_fn,
                                state=state)
    resumed_from = resume_run(cfg.resume, request, paths, components, env)
    position = state.position
    global_batch = cfg.data.batch_size * env.world_size * cfg.train.accum_freq
    if resumed_from is not None:
        # --resume-anyway's position, counted in this run's batches, may lie past its epoch: its last step then.
        position.batches_in_epoch = min(position.batches_in_epoch, plan.num_batches - cfg.train.accum_freq)
        after_resume(cfg, paths, resumed_from, state, global_batch, env)
    else:
        start_over(paths, env)
    state.samples_per_schedule_step = state.samples_per_schedule_step or global_batch
    files = RunFiles()  # every record of the run but checkpoints: a failed write never stops training
    write_params(recorded, paths, env, launch_note(env, resumed_from, state), files)

    data = build_data(cfg.data, bundle, env, epoch=position.epoch, skip_batches=position.batches_in_epoch,
                      families=loss_fn.needs_family)
    val_data = build_val_data_if_needed(cfg.data, bundle, env)
    imagenet = plan.imagenet if env.is_master else None  # rank 0 evaluates, as in OpenCLIP
    if imagenet is not None:
        imagenet.transform = bundle.preprocess_val
    # In the schedule's unit (the first launch's global batch): the same schedule however the run is split.
    scheduled_steps_per_epoch = data.num_batches // cfg.train.accum_freq * global_batch / state.samples_per_schedule_step
    scheduler = build_scheduler(optimizer, cfg.schedule, scheduled_steps_per_epoch)
    model = wrap_ddp(bundle.model, env, static_graph=cfg.distributed.ddp_static_graph,
                     sync_batchnorm=cfg.distributed.use_bn_sync)
    if cfg.torchcompile:
        model = compile_model(model, grad_checkpointing=cfg.model.grad_checkpointing, distributed=env.distributed)
    metrics = build_metrics_writer(cfg, recorded, paths, env, files)
    checkpointer = build_checkpointer(cfg.checkpoints, cfg.model, recorded, paths, components, bundle, env,
                                      resumed_from)
    trainer = Trainer(model, loss_fn, optimizer, scheduler, precision, state, cfg.train, env, metrics, SKIP_REASONS,
                      checkpointer, preemption, LossRecords(loss_fn, paths, env).update)

    try:
        final_loss = train_epochs(cfg, trainer, data, val_data, imagenet, bundle, paths, files)
    except (NonFiniteLossError, FinalCheckpointError):
        metrics.close()  # what was held back gets its last try, and its NOT WRITTEN line
        raise

    unwritten = metrics.close()
    last_checkpoint = str(checkpointer.last_saved) if checkpointer and checkpointer.last_saved else None
    summary = RunSummary(paths.run_dir, position.epoch, state.step, final_loss, last_checkpoint, unwritten)
    loss_text = f"{final_loss:.4f}" if final_loss is not None else "n/a (no epoch left to train)"
    not_written = f"; {len(unwritten)} record file(s) NOT fully written (NOT WRITTEN above)" if unwritten else ""
    logging.info(f"Done: {summary.epoch} epochs, {summary.step} steps, final epoch loss {loss_text}, "
                 f"last checkpoint {summary.checkpoint}{not_written}")
    return summary


def train_epochs(cfg: RunConfig, trainer: Trainer, data, val_data, imagenet, bundle: ModelBundle, paths: RunPaths,
                 files: RunFiles) -> Optional[float]:
    """The epochs left to train, each validated and saved; the mean loss of the last (None: none was left).
    Stops early (Preempted) at a preemption signal, and with FinalCheckpointError when the last checkpoint
    could not be written (or may not be: the run ended inside a non-finite streak)."""
    state, checkpointer, preemption, env = trainer.state, trainer.checkpointer, trainer.preemption, trainer.env
    metrics, position = trainer.metrics, state.position
    final_loss = None
    for epoch in range(position.epoch, cfg.epochs):
        logging.info(f"Start epoch {epoch}")
        data.set_epoch(epoch)
        result = train_one_epoch(trainer, data)
        if result.preempted:
            stop_for_preemption(state, checkpointer, preemption, cfg.slurm_requeue, metrics, env)
        final_loss = result.loss
        state.finish_epoch()
        validate_epoch(cfg.validation, unwrap_model(trainer.model), bundle, val_data, imagenet, trainer.precision,
                       state, metrics, paths, env, files)
        if metrics.enabled:  # rank 0, with a run folder
            for plot in trainer.loss_fn.plots:
                PLOTS[plot](paths.run_dir)
        saved = checkpointer.save_epoch() if checkpointer is not None else True
        if not saved and position.epoch == cfg.epochs:
            raise FinalCheckpointError(final_checkpoint_missing(cfg.epochs, state, checkpointer, paths))
        # A collective, so it also keeps ranks together while rank 0 evaluates and saves.
        if any_rank(preemption.requested, env) and position.epoch < cfg.epochs:
            stop_for_preemption(state, checkpointer, preemption, cfg.slurm_requeue, metrics, env)
    return final_loss


def final_checkpoint_missing(epochs: int, state: TrainState, checkpointer: Checkpointer, paths: RunPaths) -> str:
    """Why the run that trained every epoch has no final checkpoint, and what to do."""
    streak = state.consecutive_nonfinite_steps
    if streak:
        return (f"the run trained all {epochs} epochs, but its last {streak} step(s) had a non-finite loss (skipped), "
                f"so no final checkpoint was written: those weights led into the divergence; the last checkpoint "
                f"written at a finite step is {checkpointer.last_good_text()}: resume from it after lowering --lr "
                "(or raising --warmup, or with --grad-clip-norm)")
    return (f"the run trained all {epochs} epochs, but its final checkpoint could not be written (CHECKPOINT SAVE "
            f"FAILED above): the trained model is not on disk; free space or fix {paths.checkpoint_dir}, then rerun "
            "with --resume latest")


def stop_for_preemption(state: TrainState, checkpointer: Optional[Checkpointer], preemption: PreemptionFlag,
                        slurm_requeue: bool, metrics: MetricsWriter, env: DistributedEnv) -> None:
    """Save step_N.pt (all ranks), requeue the SLURM job (rank 0, --slurm-requeue), log one line, raise Preempted."""
    saved = checkpointer.save_now() if checkpointer is not None else None
    metrics.close()
    requeued = requeue_slurm_job(slurm_requeue) if env.is_master and checkpointer is not None else "not requeued"
    cause = f"SIG{preemption.signal_name.removeprefix('SIG')}" if preemption.requested else "a signal to another rank"
    where = f"step {state.step} (epoch {state.position.epoch}, {state.position.batches_in_epoch} batches into it)"
    if saved is not None:
        message = (f"Preempted by {cause} at {where}: saved {saved}; {requeued}; exiting with status "
                   f"{PREEMPTED_EXIT_CODE} (--resume latest continues from step {state.step})")
        logging.info(message)
        raise Preempted(message)
    if checkpointer is None:
        reason = "--logs none"
    elif state.consecutive_nonfinite_steps:
        reason = (f"the loss of the last {state.consecutive_nonfinite_steps} step(s) was non-finite; the last "
                  f"checkpoint written at a finite step is {checkpointer.last_good_text()}")
    else:
        reason = "the save failed (CHECKPOINT SAVE FAILED above)"
    message = (f"Preempted by {cause} at {where}: NO checkpoint written ({reason}); {requeued}; exiting with "
               "status 1 (--resume latest continues from the previous checkpoint)")
    logging.error(message)
    raise Preempted(message, exit_code=1)


def resume_run(resume_arg: Optional[str], request: ResumeRequest, paths: RunPaths, components: Dict[str, Any],
               env: DistributedEnv) -> Optional[str]:
    """Load the run's `components` (`run_components`) from the checkpoint to start from; that checkpoint
    (None: from scratch, the components as they are).

    --resume latest tries this run's checkpoints newest first, skipping (with a warning naming it) any
    that does not load; --resume PATH loads PATH or stops with one line naming it. A checkpoint this
    run cannot continue (`check_resume`) stops the run with the reason.
    """
    for path in find_resume_candidates(resume_arg, paths, env):
        checkpoint, error = None, None
        try:
            checkpoint = load_checkpoint(path)
        except Exception as load_error:  # noqa: BLE001 - any unreadable file: a truncated zip, a wrong format
            error = f"{type(load_error).__name__}: {str(load_error).strip().splitlines()[0][:300]}"
        if any_rank(error is not None, env):  # every rank moves on to the same candidate
            if resume_arg != RESUME_LATEST:
                raise ConfigError(f"--resume {path}: cannot read the checkpoint ({error or 'failed on another rank'}); "
                                  "pass another checkpoint, or --resume latest")
            logging.warning(f"Skipping unreadable checkpoint {path} ({error or 'failed on another rank'}); trying the "
                            "next older one")
            continue
        try:
            resume(path, components, env=env, request=request, checkpoint=checkpoint)
        except ResumeError as refusal:
            raise ConfigError(str(refusal)) from None
        warn_run_changes(checkpoint, path, request.args)
        return str(path)
    if resume_arg == RESUME_LATEST:
        logging.info(f"No readable checkpoint in {paths.checkpoint_dir}; starting from scratch")
    return None


def after_resume(cfg: RunConfig, paths: RunPaths, resumed_from: str, state: TrainState, global_batch: int,
                 env: DistributedEnv) -> None:
    """Bring the run directory back to the resume point (rank 0): an explicit --resume into this run's
    own checkpoints moves the newer ones aside; metrics.jsonl and results.jsonl lose what the run will replay."""
    if not state.samples_per_schedule_step:  # a checkpoint written before the schedule counted samples
        state.samples_per_schedule_step, state.samples_seen = global_batch, state.step * global_batch
    if env.is_master and paths.run_dir is not None:
        if cfg.resume != RESUME_LATEST and is_inside(resumed_from, paths.checkpoint_dir):
            folder = roll_back(paths.checkpoint_dir, state.step)
            if folder is not None:
                moved = ", ".join(sorted(p.name for p in folder.iterdir()))
                logging.warning(f"Rolled back to {resumed_from}: moved the newer checkpoints ({moved}) to {folder}")
        trim_to_resume_point(Path(paths.run_dir), Path(paths.checkpoint_dir), state.step, state.position.epoch)
    barrier(env)


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


def find_resume_candidates(resume_arg: Optional[str], paths: RunPaths, env: DistributedEnv) -> List[str]:
    """--resume PATH: [PATH]; --resume latest: this run's readable checkpoints, newest first (rank 0's listing)."""
    if resume_arg is None:
        return []
    if resume_arg != RESUME_LATEST:
        return [resume_arg]
    if paths.checkpoint_dir is None:
        raise ConfigError("--resume latest looks in <logs>/<name>/checkpoints; it needs --logs")
    candidates = [str(path) for path in checkpoint_candidates(paths.checkpoint_dir)] if env.is_master else None
    return broadcast_object(candidates, env)


def build_loss(cfg: LossConfig, env: DistributedEnv) -> Loss:
    """The registered loss with its (validated) options on this rank; an error it raises is a ConfigError."""
    dist = DistributedSetup(rank=env.rank, world_size=env.world_size, local_loss=cfg.local_loss,
                            gather_with_grad=cfg.gather_with_grad)
    try:
        loss_fn = get_loss_class(cfg.name)(cfg.options, dist)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"--loss {cfg.name}: {error}") from error
    unknown = [plot for plot in loss_fn.plots if plot not in PLOTS]
    if unknown:
        raise ConfigError(f"--loss {cfg.name} asks for the plot(s) {', '.join(unknown)}, which the trainer does not "
                          f"draw (it draws: {', '.join(PLOTS)}); add a writer to training.main.PLOTS")
    return loss_fn.to(env.device)


def build_data(cfg: DataConfig, bundle: ModelBundle, env: DistributedEnv, *, epoch: int, skip_batches: int,
               families: bool = False):
    """The training stream for this rank (the shards were checked by `check_startup`); with `families`
    (a loss that `needs_family`) its batches carry each sample's family id."""
    cfg = replace(cfg, rank=env.rank, world_size=env.world_size, skip_batches=skip_batches,
                  family_field=FAMILY_FIELD if families else None)
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


def build_metrics_writer(cfg: RunConfig, recorded: Dict[str, Any], paths: RunPaths, env: DistributedEnv,
                         files: RunFiles) -> MetricsWriter:
    """metrics.jsonl, plus the dashboards --report-to names (rank 0)."""
    wandb = None
    if "wandb" in cfg.logging.report_to:
        wandb = WandbConfig(project=cfg.logging.wandb_project_name, name=paths.name, notes=cfg.logging.wandb_notes,
                            resume=cfg.resume == RESUME_LATEST, config=recorded)
    return MetricsWriter(paths.run_dir, tensorboard="tensorboard" in cfg.logging.report_to, wandb=wandb,
                         enabled=env.is_master, files=files)


def build_checkpointer(cfg: CheckpointConfig, model_cfg: ModelConfig, recorded: Dict[str, Any], paths: RunPaths,
                       components: Dict[str, Any], bundle: ModelBundle, env: DistributedEnv,
                       resumed_from: Optional[str] = None) -> Optional[Checkpointer]:
    if paths.checkpoint_dir is None:
        return None
    return Checkpointer(cfg, checkpoint_dir=paths.checkpoint_dir, components=components, env=env, name=paths.name,
                        args=recorded, model_cfg=open_clip_model_config(model_cfg),
                        preprocess_cfg=preprocess_config(bundle.model), resumed_from=resumed_from)


# ---------------------------------------------------------------------------------------------
# Validation and the console entry point
# ---------------------------------------------------------------------------------------------


def validate_epoch(cfg: ValidationConfig, model, bundle: ModelBundle, val_data, imagenet, precision,
                   state: TrainState, metrics: MetricsWriter, paths: RunPaths, env: DistributedEnv,
                   files: RunFiles) -> None:
    """Val loss and retrieval every --val-frequency epochs, ImageNet zero-shot every --zeroshot-frequency
    epochs (both also after the last epoch), on rank 0, as OpenCLIP's `evaluate`."""
    if not env.is_master:
        return
    completed, is_last = state.position.epoch, state.position.epoch == cfg.total_epochs
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
        write_results(Path(paths.checkpoint_dir) / RESULTS_NAME, completed, results, files)


def cli() -> None:
    """Console entry point: a configuration problem prints one line and exits with status 2; data that
    cannot fill an epoch (every shard of a rank unreadable), a diverged run, a final checkpoint that
    could not be written or a collective that failed (another rank died or timed out) is logged in one
    line and exits with 1; a preempted run (its step checkpoint saved) exits with 75 (PREEMPTED_EXIT_CODE)."""
    try:
        main(sys.argv[1:])
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteLossError:
        sys.exit(1)  # the reason and what to change were logged
    except Preempted as stop:
        sys.exit(stop.exit_code)  # the one line was logged
    except FinalCheckpointError as error:
        logging.error(str(error))
        sys.exit(1)
    except DataError as error:
        logging.error(f"training data: {data_error_reason(error)}")
        sys.exit(1)
    except RuntimeError as error:
        reason = failed_collective(error)
        if reason is None:
            raise
        rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID", "0")
        logging.error(f"rank {rank}: a collective with the other ranks failed ({reason}): another rank died or did not "
                      "answer within --dist-timeout (its log says why); stopping, --resume latest continues from the "
                      "last checkpoint")
        sys.exit(1)


if __name__ == "__main__":
    cli()
