"""Resuming a run from a checkpoint, the one place a launch decides where it starts (`resume_or_start_over`):
which checkpoint (`--resume latest` or PATH, an unreadable one skipped or refused), first what this run may
continue (`check_resume`: a mid-epoch position only means something for the same data order; weights and loss
state only load into the same model and loss), then every component loaded, each misfit named with the flag
that would fit it, and the run folder brought back to that point (or set aside for a start from scratch)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..data import DataPosition, global_batch
from ..distributed import DistributedEnv, any_rank, barrier, broadcast_object
from ..engine.checkpoint import TrainState, is_per_rank, plain_args
from ..flags import LAUNCH_SETTING, MODEL_SHAPE, SAMPLE_ORDER, ConfigError, flags_fixing
from ..run_folder.checkpoint_files import (
    checkpoint_candidates,
    first_line,
    load_checkpoint,
    roll_back,
    saved_world_size,
)
from ..run_folder.layout import CHECKPOINT_DIR_NAME
from ..run_folder.rewind import rewind_to
from .config import RESUME_LATEST, RunConfig, run_flags, with_canonical_names
from .folder import RunPaths, is_inside, start_over


class ResumeError(ValueError):
    """A checkpoint this run cannot continue as asked; the message names the difference and the way out."""


@dataclass(frozen=True)
class ResumeRequest:
    """What the resuming run is: its recorded arguments, world size, and what it agreed to give up."""

    args: Mapping[str, Any]
    world_size: int
    reset_loss_state: bool = False
    resume_anyway: bool = False  # continue a mid-epoch checkpoint although the data order changed


def _flag(name: str) -> str:
    return "the world size" if name == "world_size" else "--" + name.replace("_", "-")


def _describe(changes: Mapping[str, tuple]) -> str:
    return ", ".join(f"{_flag(name)} {old} -> {new}" for name, (old, new) in changes.items())


def _describe_options(changes: Mapping[str, tuple]) -> str:
    return ", ".join(f"{name} {old} -> {new}" for name, (old, new) in changes.items())


def check_resume(checkpoint: Mapping[str, Any], path: os.PathLike, request: ResumeRequest) -> Dict[str, tuple]:
    """Refuse (ResumeError) what this run cannot honour; return the sample-order changes it accepts.

    - another model architecture: refused (the weights cannot load);
    - another --loss: refused unless --reset-loss-state;
    - mid-epoch (batches_in_epoch > 0), any change of the world size or of a flag declared resume=SAMPLE_ORDER: refused
      unless --resume-anyway, since the rest of the epoch would see some samples twice and others never;
    - at an epoch boundary these changes are accepted (returned, to be logged).
    A checkpoint without recorded arguments (OpenCLIP's) is not checked.
    """
    old, new = with_canonical_names(checkpoint.get("args") or {}), request.args
    if not old:
        return {}
    # Declared on the flags (`flag(..., resume=...)`): what fixes the shapes of the weights and, with the world
    # size, which samples each batch of an epoch holds (training.trainer.data's order).
    flags = run_flags()
    model = {
        name: (old[name], new.get(name))
        for name in flags_fixing(flags, MODEL_SHAPE)
        if name in old and old[name] != new.get(name)
    }
    if model:
        raise ResumeError(
            f"{path} holds weights of another architecture ({_describe(model)}): they cannot load; "
            f"resume with the checkpoint's values, or start a new run under another --name"
        )
    if old.get("loss") != new.get("loss") and not request.reset_loss_state:
        raise ResumeError(
            f"{path} was trained with --loss {old.get('loss')}, this run has --loss {new.get('loss')}: "
            f"the loss's state cannot carry over; add --reset-loss-state to start it afresh (weights "
            f"and optimizer are restored), or resume with --loss {old.get('loss')}"
        )
    changes = {
        name: (old[name], new.get(name))
        for name in flags_fixing(flags, SAMPLE_ORDER)
        if name in old and old[name] != new.get(name)
    }
    old_world = saved_world_size(checkpoint, default=request.world_size)
    if old_world != request.world_size:
        changes = {"world_size": (old_world, request.world_size), **changes}
    data = checkpoint.get("data") or {}
    batches = data.get("batches_in_epoch", 0)
    if changes and batches and not request.resume_anyway:
        raise ResumeError(
            f"{path} is {batches} batches into epoch {data['epoch']} and this run changes {_describe(changes)}: the "
            f"rest of the epoch would see some samples twice and others never; resume with the checkpoint's "
            f"settings, or from a checkpoint at an epoch boundary (epoch_N.pt), or pass --resume-anyway to continue "
            f"at the same number of samples into the epoch in the new order (exact data order is given up for "
            f"the rest of this epoch)"
        )
    return changes


def translated_position(checkpoint: Mapping[str, Any], request: ResumeRequest) -> int:
    """--resume-anyway: the batch of this run's epoch that follows as many global samples as the
    checkpoint's run had consumed of it (rounded down to whole optimizer steps)."""
    old = checkpoint["args"]
    old_world = saved_world_size(checkpoint, default=request.world_size)
    position = DataPosition()
    position.load_state_dict(checkpoint["data"])
    return position.in_batches_of(
        global_batch(int(old["batch_size"]), old_world),
        global_batch(int(request.args["batch_size"]), request.world_size),
        int(request.args.get("accum_freq", 1)),
    )


def _changed_loss_options(checkpoint: Mapping[str, Any], request: ResumeRequest) -> Dict[str, tuple]:
    old = (checkpoint.get("args") or {}).get("loss_options") or {}
    new = request.args.get("loss_options") or {}
    # An option the checkpoint does not name came after it was written: it ran as that option's default.
    return {name: (old[name], new.get(name)) for name in sorted(old) if old[name] != new.get(name)}


def resume(
    path: os.PathLike,
    components: Mapping[str, Any],
    *,
    env: DistributedEnv,
    request: Optional[ResumeRequest] = None,
    checkpoint: Optional[Mapping[str, Any]] = None,
) -> None:
    """Load every component of `components` (`run_components`) from `path` (or its already loaded
    `checkpoint`, in today's layout). With `request`, first `check_resume` (ResumeError on what it refuses).

    A per-rank component loads this rank's state; saved by another world size, it starts afresh (with a
    warning), unless it can merge the ranks' states for rank 0 (`merge_rank_states`). With
    `request.reset_loss_state` the loss restarts its own state (`loss.reset_state()`) instead. With
    --resume-anyway's new data order the position is translated into this run's batches and the RNG
    streams are not restored. A component the checkpoint lacks (an OpenCLIP checkpoint) starts afresh.
    """
    checkpoint = load_checkpoint(path) if checkpoint is None else checkpoint
    request = request or ResumeRequest(args=checkpoint.get("args") or {}, world_size=env.world_size)
    changes = check_resume(checkpoint, path, request)
    translated = bool(changes and checkpoint["data"]["batches_in_epoch"])  # accepted with --resume-anyway
    not_loaded = {"rng"} if translated else set()
    if request.reset_loss_state:
        components["loss"].reset_state()
        logging.info("The loss's state starts afresh (--reset-loss-state)")
        not_loaded.add("loss")
    missing = [key for key in components if key not in checkpoint and key not in not_loaded]
    if missing:
        logging.warning(f"{path} holds no state for {', '.join(missing)} (an OpenCLIP checkpoint?); they start afresh")
    for key, component in components.items():
        if key in not_loaded or key in missing:
            continue
        try:
            if is_per_rank(component):
                _load_rank_state(key, component, checkpoint[key], path, env)
            else:
                component.load_state_dict(checkpoint[key])
        except (RuntimeError, ValueError) as error:  # torch's size mismatch, or the component's own check
            raise ResumeError(f"{path}: {_mismatch(key, error, checkpoint, request)}") from None
    position, state = components["data"], components["train"]
    changed_options = _changed_loss_options(checkpoint, request)
    if changed_options and not request.reset_loss_state:
        logging.warning(
            f"Resuming with other loss options ({_describe_options(changed_options)}); the loss's state was restored"
        )
    if translated:
        position.batches_in_epoch = translated_position(checkpoint, request)
        logging.warning(
            f"--resume-anyway: {path} was {checkpoint['data']['batches_in_epoch']} batches into epoch "
            f"{position.epoch}; with {_describe(changes)} this run continues at batch "
            f"{position.batches_in_epoch}, in its own sample order (some samples of this epoch are seen "
            "twice or not at all)"
        )
    elif changes:
        logging.info(
            f"Resuming at an epoch boundary with {_describe(changes)}: the next epoch follows this run's "
            "data order, and the LR schedule continues from the samples trained so far"
        )
    logging.info(
        f"Resumed from {path}: epoch {position.epoch}, step {state.step}, "
        f"{position.batches_in_epoch} batches into the epoch"
    )


def _load_rank_state(
    key: str, component, states: List[Mapping[str, Any]], path: os.PathLike, env: DistributedEnv
) -> None:
    if len(states) == env.world_size:
        component.load_state_dict(states[env.rank])
    elif hasattr(component, "merge_rank_states"):
        if env.is_master:
            component.load_state_dict(component.merge_rank_states(states))
    else:
        logging.warning(
            f"{path} holds {key} states of {len(states)} ranks, this run has {env.world_size}; "
            f"{key} starts afresh on every rank"
        )


def _mismatch(key: str, error: BaseException, checkpoint: Mapping[str, Any], request: ResumeRequest) -> str:
    """What a component's state that does not load means, and the way out."""
    if key == "state_dict":
        return (
            f"its weights do not fit this model ({first_line(error)}); resume with the checkpoint's --model "
            "and --force-* settings"
        )
    if key == "optimizer":
        return (
            f"its optimizer state does not fit this run's trainable parameters ({first_line(error)}); resume "
            "with the checkpoint's --lock-* settings"
        )
    if key == "loss":
        changed = _changed_loss_options(checkpoint, request)
        what = f"the loss options changed ({_describe_options(changed)})" if changed else first_line(error)
        return (
            f"its loss state does not fit this run's loss: {what}; add --reset-loss-state to start the loss's "
            "state afresh (weights and optimizer are restored), or resume with the checkpoint's options"
        )
    return f"its {key} state does not fit this run ({first_line(error)})"


# Changes a resume accepts that still alter the run: the learning-rate schedule, the number of epochs, the precision
# or gradient clipping continue the same data order, so they are not refused (unlike sample-order changes,
# `check_resume`), but the rest of the run then differs from the run the checkpoint began: each is logged with its
# old and new value and what it alters, one warning line per flag.
# RUN_CHANGING_ARGS: recorded argument -> what changing it alters from the resume point on.
RUN_CHANGING_ARGS = {
    "lr": "the learning-rate schedule",
    "warmup": "the learning-rate schedule",
    "lr_scheduler": "the learning-rate schedule",
    "epochs_cooldown": "the learning-rate schedule",
    "lr_cooldown_power": "the learning-rate schedule",
    "lr_cooldown_end": "the learning-rate schedule",
    "epochs": "the run's length and its learning-rate schedule",
    "precision": "the numerics of every later step",
    "grad_clip_norm": "gradient clipping",
}


# Recorded arguments that are this launch's decisions, not the run's settings: where it resumes from and writes to
# (a --resume PATH into a new --name), and `loss_options`, what the loss flags (each named on its own) resolve to.
LAUNCH_ARGS = (
    "resume",
    "resume_anyway",
    "reset_loss_state",
    "dry_run",
    "recipe_overrides",
    "loss_options",
    "name",
    "logs",
)


def run_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> Dict[str, Tuple[Any, Any]]:
    """Every recorded argument whose value differs (a checkpoint that recorded none: none), RUN_CHANGING_ARGS first,
    but those `check_resume` rules on (architecture, sample order), this launch's own decisions (LAUNCH_ARGS) and
    the settings of how a launch runs (flags declared LAUNCH_SETTING: a timeout, the logging cadence)."""
    flags = run_flags()
    ruled = {
        *flags_fixing(flags, MODEL_SHAPE),
        *flags_fixing(flags, SAMPLE_ORDER),
        *flags_fixing(flags, LAUNCH_SETTING),
    }
    ruled.update(LAUNCH_ARGS)
    names = [*RUN_CHANGING_ARGS, *sorted(set(old) - set(RUN_CHANGING_ARGS))]  # the explained ones first
    return {
        name: (old[name], new.get(name))
        for name in names
        if name in old and name not in ruled and name in new and old[name] != new[name]
    }


def run_change_lines(checkpoint: Mapping[str, Any], path: os.PathLike, new_args: Mapping[str, Any]) -> List[str]:
    """One line per flag this resume of `checkpoint` changes, saying what it alters (RUN_CHANGING_ARGS) where known."""
    step = checkpoint.get("step", "?")
    changes = run_changes(with_canonical_names(checkpoint.get("args") or {}), new_args)
    return [
        f"Resuming {path} with --{name.replace('_', '-')} {old} -> {new}: from step {step} on "
        + (
            f"this changes {RUN_CHANGING_ARGS[name]}"
            if name in RUN_CHANGING_ARGS
            else "the run goes on with the new value"
        )
        + " (the run no longer matches the one the checkpoint began)"
        for name, (old, new) in changes.items()
    ]


def warn_run_changes(checkpoint: Mapping[str, Any], path: os.PathLike, new_args: Mapping[str, Any]) -> None:
    """One warning line per flag this resume of `checkpoint` changes (`run_change_lines`)."""
    for line in run_change_lines(checkpoint, path, new_args):
        logging.warning(line)


def dry_run_changes(cfg: RunConfig) -> List[str]:
    """What the run's resume would warn of (`run_change_lines`), for the dry run: its checkpoint read (--resume
    PATH, or with --resume latest the newest of <logs>/<name>/checkpoints) and its arguments compared."""
    if cfg.resume is None or (cfg.resume == RESUME_LATEST and (cfg.logging.logs is None or cfg.logging.name is None)):
        return []
    path = cfg.resume
    if cfg.resume == RESUME_LATEST:
        candidates = checkpoint_candidates(os.path.join(cfg.logging.logs, cfg.logging.name, CHECKPOINT_DIR_NAME))
        if not candidates:
            return []
        path = str(candidates[0])
    try:
        checkpoint = load_checkpoint(path)
    except Exception as error:  # noqa: BLE001 - the run itself skips or refuses it, with its own line
        return [f"could not read {path} to compare its arguments ({first_line(error)})"]
    return run_change_lines(checkpoint, path, {**cfg.recorded_args, "name": cfg.logging.name})


def resume_or_start_over(
    cfg: RunConfig,
    recorded: Mapping[str, Any],
    paths: RunPaths,
    components: Dict[str, Any],
    num_batches: int,
    step_samples: int,
    env: DistributedEnv,
) -> Optional[str]:
    """Where this launch starts: the checkpoint its `components` (`run_components`) were loaded from, the run
    folder brought back to it (`after_resume`), or None: from scratch, the earlier launch's files set aside.
    `num_batches` is this rank's batches per epoch, `step_samples` its samples per optimizer step
    (`data.samples_per_step`)."""
    request = ResumeRequest(
        args=plain_args(recorded),
        world_size=env.world_size,
        reset_loss_state=cfg.reset_loss_state,
        resume_anyway=cfg.resume_anyway,
    )
    state: TrainState = components["train"]
    resumed_from = resume_run(cfg.resume, request, paths, components, env)
    if resumed_from is not None:
        position = state.position
        # --resume-anyway's position, counted in this run's batches, may lie past its epoch: its last step then.
        position.batches_in_epoch = min(position.batches_in_epoch, num_batches - cfg.train.accum_freq)
        after_resume(cfg.resume, paths, resumed_from, state, step_samples, env)
    else:
        start_over(paths, env)
    state.samples_per_schedule_step = state.samples_per_schedule_step or step_samples
    return resumed_from


def resume_run(
    resume_arg: Optional[str], request: ResumeRequest, paths: RunPaths, components: Dict[str, Any], env: DistributedEnv
) -> Optional[str]:
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
            error = first_line(load_error)
        if any_rank(error is not None, env):  # every rank moves on to the same candidate
            if resume_arg != RESUME_LATEST:
                raise ConfigError(
                    f"--resume {path}: cannot read the checkpoint ({error or 'failed on another rank'}); "
                    "pass another checkpoint, or --resume latest"
                )
            logging.warning(
                f"Skipping unreadable checkpoint {path} ({error or 'failed on another rank'}); trying the "
                "next older one"
            )
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


def after_resume(
    resume_arg: Optional[str],
    paths: RunPaths,
    resumed_from: str,
    state: TrainState,
    step_samples: int,
    env: DistributedEnv,
) -> None:
    """Bring the run directory back to the resume point (rank 0): an explicit --resume into this run's
    own checkpoints moves the newer ones aside; metrics.jsonl and results.jsonl lose what the run will replay.
    `step_samples`: this launch's samples per optimizer step (`samples_per_step`)."""
    if not state.samples_per_schedule_step:  # a checkpoint written before the schedule counted samples
        state.samples_per_schedule_step, state.samples_seen = step_samples, state.step * step_samples
    if env.is_master and paths.run_dir is not None:
        if resume_arg != RESUME_LATEST and is_inside(resumed_from, paths.checkpoint_dir):
            folder = roll_back(paths.checkpoint_dir, state.step)
            if folder is not None:
                moved = ", ".join(sorted(p.name for p in folder.iterdir()))
                logging.warning(f"Rolled back to {resumed_from}: moved the newer checkpoints ({moved}) to {folder}")
        rewind_to(Path(paths.run_dir), Path(paths.checkpoint_dir), state.step, state.position.epoch)
    barrier(env)
