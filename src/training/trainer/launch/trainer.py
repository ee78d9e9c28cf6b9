"""The run, one object: `Trainer(config).run()` on every rank.

Built from the run config alone, the Trainer owns the run from start to summary: the start-up checks (and
--dry-run), the process group, the loss, the run folder, the model, optimizer and precision, the starting
point (`launch.resume.resume_or_start_over`, the one place a run resumes), the data, the schedule and the
epoch loop (`engine.loop.train_one_epoch`), validation every --val-frequency epochs, a checkpoint every
--save-frequency epochs (both also after the last), and a preemption signal, which ends the run at a step
boundary with a checkpoint (`Preempted`; docs/cluster.md).
"""

from __future__ import annotations

import logging
import os
import random
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from torchvision.datasets import ImageFolder

from open_clip_adacl import DistributedSetup, Loss, get_loss_class
from open_clip_adacl.losses.flags import loss_line

from ..data import (
    SKIP_REASONS,
    DataConfig,
    LoaderInfo,
    build_train_data,
    build_val_data,
    samples_per_step,
)
from ..distributed import (
    DistributedEnv,
    DistributedStartError,
    any_rank,
    init_distributed,
    shutdown,
    unwrap_model,
    wrap_ddp,
)
from ..engine.checkpoint import Checkpointer, TrainState, run_components
from ..engine.loop import EpochLoop, NonFiniteLossError, train_one_epoch
from ..engine.model import ModelBundle, build_model, check_model_loads, open_clip_model_config, preprocess_config
from ..engine.optimizer import build_optimizer
from ..engine.precision import build_precision
from ..engine.schedule import build_scheduler
from ..engine.validation import (
    dashboard_values,
    epoch_results,
    eval_line,
    run_validation,
    write_results,
    zero_shot_imagenet,
)
from ..flags import ConfigError
from ..preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionFlag, requeue_slurm_job
from ..run_folder.layout import CHECKPOINT_DIR_NAME, LOG_NAME, RESULTS_NAME, RunDir
from ..run_folder.lock import RunLock
from ..run_folder.logger import MetricsWriter, WandbConfig, setup_logging
from ..run_folder.margins import write_margins_plot
from ..run_folder.safe_write import RunFiles
from . import params
from .config import RESUME_LATEST, LossConfig, RunConfig, sample_state_rows
from .folder import (
    LossJournals,
    RunPaths,
    build_run_paths,
    check_dry_run_checkpoint_space,
    check_run_checkpoint_space,
    hold_run_dir,
    launch_note,
    recorded_args,
    run_dir_collision,
    run_folder_warnings,
    write_params,
)
from .resume import dry_run_changes, resume_or_start_over
from .startup import (
    StartupPlan,
    check_startup,
    loss_input_warnings,
    plan_line,
    quiet_parameter_count,
    resume_note,
)

# The plots a loss may ask for (`Loss.plots`), by name: rank 0 redraws each into the run folder at every epoch end.
PLOTS: Dict[str, Callable[[str], object]] = {"margins": write_margins_plot}


@dataclass
class RunSummary:
    run_dir: Optional[str]
    epoch: int  # completed epochs
    step: int  # training steps taken
    final_loss: Optional[float]  # mean loss of the last epoch trained by this call
    checkpoint: Optional[str]  # last checkpoint written
    unwritten: List[str] = field(
        default_factory=list
    )  # record files that could not be fully written (training.trainer.run_folder.safe_write)

    @property
    def run_folder(self) -> RunDir:
        """The run folder's reader: metrics (`RunDir.metrics`), validation results (`results`), checkpoints by
        number (`epoch_checkpoint`, `step_checkpoint`) and the last launch's arguments as values
        (`recorded_args`; `params.config_from_recorded_args` makes them its `RunConfig`)."""
        if self.run_dir is None:
            raise ValueError("this run wrote no folder (--logs none)")
        return RunDir(self.run_dir)


class FinalCheckpointError(RuntimeError):
    """The run trained to the end but its last checkpoint could not be written."""


@dataclass(frozen=True)
class RunParts:
    """This rank's parts of a run, built once by `Trainer._build` before its first epoch. The epoch loop holds
    what a step needs (model, loss, optimizer, state, metrics, checkpointer, preemption flag); the rest is what
    only the Trainer uses between epochs."""

    paths: RunPaths  # the run folder's paths and name
    files: RunFiles  # the run's record files, all but checkpoints (a failed write never stops training)
    data: LoaderInfo  # the training stream from the starting point on
    val_data: Optional[LoaderInfo]  # --val-data, on rank 0
    imagenet: Optional[ImageFolder]  # --imagenet-val, on rank 0
    tokenizer: Callable  # for ImageNet's class prompts
    loop: EpochLoop


class Trainer:
    """One run on this rank, built from its `RunConfig` (`params.config_from_values`, or `checked_config` of
    parsed flags); `run()` trains it (or, with `cfg.dry_run`, only checks it) on the ranks the environment
    announces. Its one field is the config: `run` checks it, starts the process group and builds the loss, then
    `_build` makes the run's `RunParts` once (run folder, model, optimizer, precision, starting point, data, epoch
    loop) and `_train_epochs` validates (`_validate`) and saves each epoch; `_stop_for_preemption` ends it early."""

    cfg: RunConfig

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg

    def run(self) -> Optional[RunSummary]:
        """What this rank trained (None for --dry-run); `RunSummary.run_folder` reads the run folder (metrics,
        checkpoints, results)."""
        cfg = self.cfg
        world_size = params.world_size_from_env()
        plan = check_startup(cfg, world_size)
        plan.warnings += run_folder_warnings(cfg)
        if cfg.dry_run:
            self._dry_run(plan, world_size)
            return None
        try:
            env = init_distributed(
                cfg.distributed.device,
                dist_backend=cfg.distributed.dist_backend,
                dist_url=cfg.distributed.dist_url,
                no_set_device_rank=cfg.distributed.no_set_device_rank,
                timeout_s=cfg.distributed.timeout_s,
            )
        except DistributedStartError as error:
            raise ConfigError(str(error)) from None
        try:
            configure_torch(env.device)
            seed_everything(cfg.seed + env.rank)  # this rank's random stream (OpenCLIP's seeding)
            loss_fn = build_loss(cfg.loss, env)  # first, so that a bad loss option fails before anything is written
            plan.warnings += loss_input_warnings(cfg, loss_fn)
            with PreemptionFlag().watching(cfg.preempt_signals) as preemption, RunLock() as lock:
                return self._train(self._build(lock, env, plan, loss_fn, preemption))
        finally:
            shutdown(env)

    def _dry_run(self, plan: StartupPlan, world_size: int) -> None:
        cfg = self.cfg
        loss_fn = build_loss(cfg.loss, DistributedEnv(world_size=world_size))  # the loss's own checks of its setup
        plan.warnings += loss_input_warnings(cfg, loss_fn)
        check_model_loads(cfg.model)
        # Only a named run can collide (the default name is the start time); the run checks every rank's log.
        if cfg.logging.name is not None and cfg.logging.logs is not None:
            run_dir = os.path.join(cfg.logging.logs, cfg.logging.name)
            collision = run_dir_collision(
                cfg.resume, os.path.join(run_dir, LOG_NAME), os.path.join(run_dir, CHECKPOINT_DIR_NAME)
            )
            if collision:
                raise ConfigError(collision)
        if cfg.logging.logs is not None:
            check_dry_run_checkpoint_space(cfg, loss_fn, cfg.checkpoints.files_kept(plan.total_steps))
        for warning in plan.warnings + dry_run_changes(cfg):
            print(f"warning: {warning}", file=sys.stderr)
        note = resume_note(cfg)
        print(f"dry run OK: {plan.text}" + (f"\n{note}" if note else ""))

    def _train(self, parts: RunParts) -> RunSummary:
        """The run on this rank from its built parts; stops early (Preempted) when the preemption flag is
        signalled."""
        loop = parts.loop
        try:
            final_loss = self._train_epochs(parts)
        except (NonFiniteLossError, FinalCheckpointError):
            loop.metrics.close()  # what was held back gets its last try, and its NOT WRITTEN line
            raise
        unwritten = loop.metrics.close()
        checkpointer, state = loop.checkpointer, loop.state
        # A launch that trained nothing (the run was finished) names the checkpoint it resumed as the last one.
        last_checkpoint = str(checkpointer.last_good) if checkpointer and checkpointer.last_good else None
        summary = RunSummary(
            parts.paths.run_dir, state.position.epoch, state.step, final_loss, last_checkpoint, unwritten
        )
        not_written = f"; {len(unwritten)} record file(s) NOT fully written (NOT WRITTEN above)" if unwritten else ""
        if final_loss is None:
            logging.info(
                f"Nothing to train: the run was already finished (all {summary.epoch} epochs, {summary.step} steps); "
                f"its last checkpoint is {summary.checkpoint}{not_written}; raise --epochs to train it further"
            )
            return summary
        logging.info(
            f"Done: {summary.epoch} epochs, {summary.step} steps, final epoch loss {final_loss:.4f}, "
            f"last checkpoint {summary.checkpoint}{not_written}"
        )
        return summary

    def _build(
        self, lock: RunLock, env: DistributedEnv, plan: StartupPlan, loss_fn: Loss, preemption: PreemptionFlag
    ) -> RunParts:
        """The run's parts, in the order a run needs them (torch configured, this rank seeded, the loss built):
        the run folder (held by rank 0 with `lock`), the model, optimizer and precision, the starting point
        (`resume_or_start_over`, recorded in params.txt), then the data, schedule and epoch loop from there."""
        cfg = self.cfg
        paths, recorded, disk_checked = self._open_run_folder(lock, env, plan, loss_fn)
        bundle = self._build_model(env)
        optimizer = build_optimizer(bundle.model, cfg.optimizer)
        precision = build_precision(cfg.model.precision, env.device)
        if not disk_checked:  # the model could not be sized before it was built
            num_parameters = sum(parameter.numel() for parameter in bundle.model.parameters())
            disk = check_run_checkpoint_space(paths, num_parameters, loss_fn, self._files_kept(plan), env)
            if disk:
                logging.info(disk)
        state = TrainState()
        components = run_components(
            model=bundle.model, optimizer=optimizer, scaler=precision.scaler, loss=loss_fn, state=state
        )
        step_samples = samples_per_step(cfg.data.batch_size, env.world_size, cfg.train.accum_freq)
        resumed_from = resume_or_start_over(cfg, recorded, paths, components, plan.num_batches, step_samples, env)
        files = RunFiles()
        write_params(recorded, paths, env, launch_note(env, resumed_from, state), files)

        position = state.position
        data = build_data(
            cfg.data,
            bundle,
            env,
            epoch=position.epoch,
            skip_batches=position.batches_in_epoch,
            family_field=loss_fn.family_field() if loss_fn.reads_family() else None,
            sample_index_limit=sample_state_rows(cfg.loss.options),
        )
        val_data = build_val_data_if_needed(cfg.data, bundle, env)
        imagenet = plan.imagenet if env.is_master else None  # rank 0 evaluates, as in OpenCLIP
        if imagenet is not None:
            imagenet.transform = bundle.preprocess_val
        # In the schedule's unit (the first launch's step samples): the same schedule however the run is split.
        scheduled_steps_per_epoch = (
            data.num_batches // cfg.train.accum_freq * step_samples / state.samples_per_schedule_step
        )
        model = wrap_ddp(
            bundle.model, env, static_graph=cfg.distributed.ddp_static_graph, sync_batchnorm=cfg.distributed.use_bn_sync
        )
        if cfg.torchcompile:
            model = compile_model(model, grad_checkpointing=cfg.model.grad_checkpointing, distributed=env.distributed)
        checkpointer = None
        if paths.checkpoint_dir is not None:
            checkpointer = Checkpointer(
                cfg.checkpoints,
                checkpoint_dir=paths.checkpoint_dir,
                components=components,
                env=env,
                name=paths.name,
                args=recorded,
                model_cfg=open_clip_model_config(cfg.model),
                preprocess_cfg=preprocess_config(bundle.model),
                resumed_from=resumed_from,
            )
        loop = EpochLoop(
            model=model,
            loss_fn=loss_fn,
            optimizer=optimizer,
            scheduler=build_scheduler(optimizer, cfg.schedule, scheduled_steps_per_epoch),
            precision=precision,
            state=state,
            cfg=cfg.train,
            env=env,
            metrics=self._metrics_writer(paths, recorded, env, files),
            skip_reasons=SKIP_REASONS,
            checkpointer=checkpointer,
            preemption=preemption,
            keep_loss_journals=LossJournals(loss_fn, paths, env).update,
            total_steps=plan.total_steps,
        )
        return RunParts(paths, files, data, val_data, imagenet, bundle.tokenizer, loop)

    def _open_run_folder(
        self, lock: RunLock, env: DistributedEnv, plan: StartupPlan, loss_fn: Loss
    ) -> Tuple[RunPaths, dict, bool]:
        """The run's paths, its log, the folder held by rank 0, and the arguments it records; the log's first line is
        the run's plan with the disk its checkpoints need, checked (False: the model could not be sized yet)."""
        cfg = self.cfg
        paths = build_run_paths(cfg, env)
        setup_logging(
            paths.log_file,
            logging.DEBUG if cfg.logging.debug else logging.INFO,
            rank=env.rank,
            log_all_ranks=cfg.logging.log_local,
        )
        hold_run_dir(lock, paths, env)
        num_parameters = quiet_parameter_count(cfg.model)
        disk = None
        if num_parameters is not None:
            disk = check_run_checkpoint_space(paths, num_parameters, loss_fn, self._files_kept(plan), env)
        logging.info(plan_line(plan, disk))
        logging.info(
            f"Rank {env.rank} of {env.world_size} on {env.device}, precision {cfg.model.precision}; run {paths.name}"
        )
        recorded = recorded_args(cfg, paths)
        for warning in plan.warnings if env.is_master else []:
            logging.warning(warning)
        return paths, recorded, num_parameters is not None

    def _files_kept(self, plan: StartupPlan) -> Dict[str, int]:
        return self.cfg.checkpoints.files_kept(plan.total_steps)

    def _build_model(self, env: DistributedEnv) -> ModelBundle:
        """The model, with the same initial weights on every rank (then back to the rank's own random stream)."""
        cfg = self.cfg
        seed_everything(cfg.seed)
        try:
            bundle = build_model(cfg.model, env.device)
        except RuntimeError as error:  # e.g. load_state_dict's missing/unexpected keys
            if not cfg.model.pretrained:
                raise
            raise ConfigError(
                f"--pretrained {cfg.model.pretrained} does not fit --model {cfg.model.name}: "
                f"{str(error).splitlines()[0][:300]}; pass weights of that architecture"
            ) from error
        seed_everything(cfg.seed + env.rank)
        return bundle

    def _metrics_writer(self, paths: RunPaths, recorded: dict, env: DistributedEnv, files: RunFiles) -> MetricsWriter:
        """metrics.jsonl, plus the dashboards --report-to names (rank 0)."""
        cfg = self.cfg
        wandb = None
        if "wandb" in cfg.logging.report_to:
            wandb = WandbConfig(
                project=cfg.logging.wandb_project_name,
                name=paths.name,
                notes=cfg.logging.wandb_notes,
                resume=cfg.resume == RESUME_LATEST,
                config=recorded,
            )
        return MetricsWriter(
            paths.run_dir,
            tensorboard="tensorboard" in cfg.logging.report_to,
            wandb=wandb,
            enabled=env.is_master,
            files=files,
        )

    def _train_epochs(self, parts: RunParts) -> Optional[float]:
        """The epochs left to train, each validated and saved; the mean loss of the last (None: none was left).
        Stops early (Preempted) at a preemption signal, and with FinalCheckpointError when the last checkpoint
        could not be written (or may not be: the run ended inside a non-finite streak)."""
        cfg, loop = self.cfg, parts.loop
        state, checkpointer = loop.state, loop.checkpointer
        position = state.position
        final_loss = None
        for epoch in range(position.epoch, cfg.epochs):
            logging.info(f"Start epoch {epoch}")
            parts.data.set_epoch(epoch)
            result = train_one_epoch(loop, parts.data)
            if result.preempted:
                self._stop_for_preemption(parts)
            final_loss = result.loss
            state.finish_epoch()
            self._validate(parts)
            if loop.metrics.enabled:  # rank 0, with a run folder
                for plot in loop.loss_fn.plots:
                    PLOTS[plot](parts.paths.run_dir)
            saved = checkpointer.save_epoch() if checkpointer is not None else True
            if not saved and position.epoch == cfg.epochs:
                raise FinalCheckpointError(self._final_checkpoint_missing(parts))
            # A collective, so it also keeps ranks together while rank 0 evaluates and saves.
            if any_rank(loop.preemption.requested, loop.env) and position.epoch < cfg.epochs:
                self._stop_for_preemption(parts)
        return final_loss

    def _validate(self, parts: RunParts) -> None:
        """Val loss and retrieval every --val-frequency epochs, ImageNet zero-shot every --zeroshot-frequency
        epochs (both also after the last epoch), on rank 0, as OpenCLIP's `evaluate`."""
        cfg, loop = self.cfg.validation, parts.loop
        env, state, precision = loop.env, loop.state, loop.precision
        if not env.is_master:
            return
        model = unwrap_model(loop.model)
        completed, is_last = state.position.epoch, state.position.epoch == cfg.total_epochs
        validation, zero_shot = {}, {}
        if parts.val_data is not None and cfg.val_frequency and (completed % cfg.val_frequency == 0 or is_last):
            validation.update(
                run_validation(
                    model,
                    parts.val_data.dataloader,
                    device=env.device,
                    autocast=precision.autocast,
                    epoch=completed,
                    input_dtype=precision.input_dtype,
                )
            )
        if parts.imagenet is not None and (completed % cfg.zeroshot_frequency == 0 or is_last):
            zero_shot.update(
                zero_shot_imagenet(
                    model,
                    parts.tokenizer,
                    parts.imagenet,
                    device=env.device,
                    autocast=precision.autocast,
                    batch_size=cfg.batch_size,
                    workers=cfg.workers,
                    input_dtype=precision.input_dtype,
                )
            )
        if not (validation or zero_shot):
            return
        results = epoch_results(completed, zero_shot, validation)
        logging.info(eval_line(results))
        loop.metrics.write("val", step=state.step, epoch=completed, values=dashboard_values(results))
        if parts.paths.checkpoint_dir is not None:
            write_results(Path(parts.paths.checkpoint_dir) / RESULTS_NAME, results, parts.files)

    def _final_checkpoint_missing(self, parts: RunParts) -> str:
        """Why the run that trained every epoch has no final checkpoint, and what to do."""
        checkpointer = parts.loop.checkpointer
        epochs, not_written = self.cfg.epochs, checkpointer.not_written
        if not_written:
            return (
                f"the run trained all {epochs} epochs, but no final checkpoint was written: {not_written}, and "
                f"those weights led into a divergence; the last checkpoint written at a finite step is "
                f"{checkpointer.last_good_text()}: resume from it after lowering --lr (or raising --warmup, "
                "or with --grad-clip-norm)"
            )
        return (
            f"the run trained all {epochs} epochs, but its final checkpoint could not be written (CHECKPOINT SAVE "
            f"FAILED above): the trained model is not on disk; free space or fix {parts.paths.checkpoint_dir}, "
            "then rerun with --resume latest"
        )

    def _stop_for_preemption(self, parts: RunParts) -> None:
        """Save step_N.pt (all ranks), requeue the SLURM job (rank 0, --slurm-requeue), log one line, raise
        Preempted."""
        loop = parts.loop
        state, checkpointer, preemption = loop.state, loop.checkpointer, loop.preemption
        saved = checkpointer.save_now() if checkpointer is not None else None
        loop.metrics.close()
        if preemption.stopped_by_a_person():
            requeued = f"not requeued ({preemption.signal_name} is a stop, not one of --preempt-signal)"
        else:
            requeued = (
                requeue_slurm_job(self.cfg.slurm_requeue)
                if loop.env.is_master and checkpointer is not None
                else "not requeued"
            )
        cause = (
            f"SIG{preemption.signal_name.removeprefix('SIG')}" if preemption.requested else "a signal to another rank"
        )
        where = f"step {state.step} (epoch {state.position.epoch}, {state.position.batches_in_epoch} batches into it)"
        if saved is not None:
            message = (
                f"Preempted by {cause} at {where}: saved {saved}; {requeued}; exiting with status "
                f"{PREEMPTED_EXIT_CODE} (--resume latest continues from step {state.step})"
            )
            logging.info(message)
            raise Preempted(message)
        if checkpointer is None:
            reason = "--logs none"
        elif checkpointer.not_written:
            reason = (
                f"{checkpointer.not_written}; the last checkpoint written at a finite step is "
                f"{checkpointer.last_good_text()}"
            )
        else:
            reason = "the save failed (CHECKPOINT SAVE FAILED above)"
        resume = (
            "--resume latest continues from the previous checkpoint"
            if checkpointer is not None and checkpointer.last_good is not None
            else "there is no earlier checkpoint: a relaunch starts over"
        )
        message = (
            f"Preempted by {cause} at {where}: NO checkpoint written ({reason}); {requeued}; exiting with "
            f"status 1 ({resume})"
        )
        logging.error(message)
        raise Preempted(message, exit_code=1)


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


def build_loss(cfg: LossConfig, env: DistributedEnv) -> Loss:
    """The registered loss with its (validated) options on this rank; an error it raises is a ConfigError."""
    dist = DistributedSetup(
        rank=env.rank, world_size=env.world_size, local_loss=cfg.local_loss, gather_with_grad=cfg.gather_with_grad
    )
    try:
        loss_fn = get_loss_class(cfg.name)(cfg.options, dist)
    except (ValueError, TypeError) as error:
        raise ConfigError(loss_line(cfg.name, error)) from error
    unknown = [plot for plot in loss_fn.plots if plot not in PLOTS]
    if unknown:
        raise ConfigError(
            f"--loss {cfg.name} asks for the plot(s) {', '.join(unknown)}, which the trainer does not "
            f"draw (it draws: {', '.join(PLOTS)}); add a writer to training.trainer.launch.trainer.PLOTS"
        )
    return loss_fn.to(env.device)


def build_data(
    cfg: DataConfig,
    bundle: ModelBundle,
    env: DistributedEnv,
    *,
    epoch: int,
    skip_batches: int,
    family_field: Optional[str] = None,
    sample_index_limit: Optional[int] = None,
):
    """The training stream for this rank (the shards were checked by `check_startup`); with `family_field`
    (a loss that `reads_family()`) its batches carry each sample's family ids read from that json field; with
    `sample_index_limit` (a loss's per-sample state) a sample whose id cannot index that state is skipped."""
    cfg = replace(
        cfg,
        rank=env.rank,
        world_size=env.world_size,
        skip_batches=skip_batches,
        family_field=family_field,
        sample_index_limit=sample_index_limit,
    )
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
