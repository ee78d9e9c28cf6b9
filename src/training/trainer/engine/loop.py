"""The training loop: one epoch of steps, each a forward/backward over `--accum-freq` global batches and an update.

Semantics follow `open_clip_train.train.train_one_epoch` (gradient accumulation, gradient clipping,
logit_scale clamped to [0, ln 100], OpenCLIP's console line), with these differences:
- the loss's `stats` are logged, never summed into the loss;
- the loss's state (queues, running statistics, per-sample banks) moves once per optimizer step:
  the trainer calls `loss_fn.commit()` after each update, however many micro-batches it had;
- a step whose loss is NaN/inf on any rank is skipped (no update, loss state unchanged) and
  counted; after `max_nonfinite_steps` in a row the run stops with `NonFiniteLossError`;
- samples the data pipeline skipped (corrupt image, empty caption, ...) are counted per reason,
  summed over ranks at the end of the epoch and reported in its summary, which names the shards whose visits
  were cut short (up to MAX_NAMED_SHARDS of them);
- mid-epoch checkpoints (`--save-every-n-steps`) and an exact mid-epoch resume;
- the LR schedule is placed by the global samples trained (`TrainState.schedule_position`);
- a preemption signal (`training.trainer.preemption`) is agreed on by all ranks inside the step's all-reduce,
  and the epoch stops after that step (`EpochResult.preempted`), for the caller to save and exit.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, Iterable, List, Optional, Protocol, Sequence, Tuple

import torch
from torch.nn.parallel import DistributedDataParallel

from open_clip_adacl.losses.base import Loss

from ..data.batch import Batch
from ..data.samples import ShardVisits, merged_shard_visits
from ..data.shards import SHARD_SKIP_REASONS
from ..distributed import DistributedEnv, all_gather_object, all_reduce_sum, any_rank_each, unwrap_model
from ..flags import LAUNCH_SETTING, SAMPLE_ORDER, ConfigError, HelpGroup, flag
from ..preemption import PreemptionFlag
from ..progress import duration_text
from ..run_folder.logger import MetricsWriter
from .checkpoint import Checkpointer, TrainState
from .precision import Precision

MAX_LOGIT_SCALE = math.log(100)  # CLIP's clamp: the temperature never goes below 0.01
LOSS_TERM = "contrastive_loss"  # the loss's one term, as OpenCLIP's ClipLoss and our losses name it (output_dict)


class NonFiniteLossError(RuntimeError):
    """Too many consecutive steps had a NaN/inf loss: the run diverged."""


@dataclass(frozen=True)
class TrainConfig:
    FLAG_GROUP: ClassVar[str] = HelpGroup.OPTIMISATION

    accum_freq: int = flag(1, "Update the model every --accum-freq steps.", resume=SAMPLE_ORDER)
    grad_clip_norm: Optional[float] = flag(None, "Gradient clip.")
    log_every_n_steps: int = flag(
        100, "Log every n steps to console/metrics.jsonl/tensorboard.", group=HelpGroup.LOGS, resume=LAUNCH_SETTING
    )
    max_nonfinite_steps: int = flag(10, "Skip steps whose loss is NaN/inf; stop after this many in a row.")
    skip_scheduler: bool = flag(False, "Use this flag to skip the learning rate decay.")

    def check(self) -> None:
        if self.accum_freq < 1:
            raise ConfigError(f"--accum-freq must be >= 1, got {self.accum_freq}")
        if self.log_every_n_steps < 1:
            raise ConfigError(f"--log-every-n-steps must be >= 1, got {self.log_every_n_steps}")
        if self.max_nonfinite_steps < 1:
            raise ConfigError(f"--max-nonfinite-steps must be >= 1, got {self.max_nonfinite_steps}")
        if self.grad_clip_norm is not None and not self.grad_clip_norm > 0:
            raise ConfigError(f"--grad-clip-norm must be > 0, got {self.grad_clip_norm}")


@dataclass
class StepOutput:
    loss: torch.Tensor  # detached loss of the step's samples
    stats: Dict[str, torch.Tensor]  # the loss's diagnostics (detached)
    logit_scale: torch.Tensor  # detached, exponentiated
    finite: bool  # this rank's loss was finite


def loss_inputs(loss_fn: Loss, micro_batches: Sequence[Batch]) -> Dict[str, Optional[torch.Tensor]]:
    """The loss's per-sample inputs, by name, for the samples of its global batch on this rank (a step's
    micro-batches, in order): their indices always, their family ids and caption token ids where the loss
    declares it reads them."""

    def joined(field: str) -> Optional[torch.Tensor]:
        parts = [getattr(batch, field) for batch in micro_batches]
        return parts[0] if len(parts) == 1 or parts[0] is None else torch.cat(parts)

    inputs = {"sample_index": joined("sample_index")}
    if loss_fn.reads_family():
        inputs["family"] = joined("family")
    if loss_fn.takes_text_tokens:
        inputs["text_tokens"] = joined("texts")
    return inputs


def _loss_of(loss_fn: Loss, image_features, text_features, model_out: Dict[str, torch.Tensor], inputs) -> torch.Tensor:
    return loss_fn(image_features, text_features, model_out["logit_scale"], model_out.get("logit_bias"), **inputs)


def _backward(loss: torch.Tensor, scaler: Optional[torch.amp.GradScaler]) -> None:
    (scaler.scale(loss) if scaler is not None else loss).backward()


def forward_backward(
    model: torch.nn.Module, loss_fn: Loss, micro_batches: List[Batch], precision: Precision
) -> StepOutput:
    """Accumulate into `.grad` the gradient of the loss over the batch formed by `micro_batches`.

    With one micro-batch this is a plain forward/backward. With several (--accum-freq), OpenCLIP's
    scheme: features of every micro-batch are first computed without gradients; then each
    micro-batch is re-encoded with gradients and the loss is taken over all features, its own
    swapped in, so the summed gradients equal those of one large batch while only one micro-batch's
    activations are alive at a time. (As in OpenCLIP, the loss runs once per micro-batch; each run
    stages the same state update, which the caller commits once.)
    """
    if len(micro_batches) == 1:
        batch = micro_batches[0]
        with precision.autocast():
            model_out = model(batch.images, batch.texts)
            inputs = loss_inputs(loss_fn, micro_batches)
            loss = _loss_of(loss_fn, model_out["image_features"], model_out["text_features"], model_out, inputs)
        _backward(loss, precision.scaler)
        finite = bool(torch.isfinite(loss))
    else:
        with torch.no_grad(), precision.autocast():
            cached = [model(batch.images, batch.texts) for batch in micro_batches]
        inputs = loss_inputs(loss_fn, micro_batches)
        finite = True
        for j, batch in enumerate(micro_batches):
            # Gradients are all-reduced once, on the last micro-batch.
            is_last = j == len(micro_batches) - 1
            sync = nullcontext() if is_last or not isinstance(model, DistributedDataParallel) else model.no_sync()
            with sync:
                with precision.autocast():
                    model_out = model(batch.images, batch.texts)
                    image_features = torch.cat(
                        [c["image_features"] for c in cached[:j]]
                        + [model_out["image_features"]]
                        + [c["image_features"] for c in cached[j + 1 :]]
                    )
                    text_features = torch.cat(
                        [c["text_features"] for c in cached[:j]]
                        + [model_out["text_features"]]
                        + [c["text_features"] for c in cached[j + 1 :]]
                    )
                    loss = _loss_of(loss_fn, image_features, text_features, model_out, inputs)
                _backward(loss, precision.scaler)
            finite = finite and bool(torch.isfinite(loss))
    stats = {name: value.detach() for name, value in loss_fn.stats.items()}
    return StepOutput(loss=loss.detach(), stats=stats, logit_scale=model_out["logit_scale"].detach(), finite=finite)


def apply_update(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, precision: Precision, grad_clip_norm: Optional[float]
) -> None:
    """Clip, step the optimizer (through the scaler for fp16 amp) and clamp logit_scale."""
    scaler = precision.scaler
    if grad_clip_norm is not None:
        if scaler is not None:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip_norm, norm_type=2.0)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    with torch.no_grad():
        unwrap_model(model).logit_scale.clamp_(0, MAX_LOGIT_SCALE)


def skip_nonfinite_step(
    state: TrainState,
    optimizer: torch.optim.Optimizer,
    precision: str,
    limit: int,
    loss: torch.Tensor,
    last_checkpoint: Optional[str],
) -> None:
    """Drop this step's gradients and count it; raise NonFiniteLossError after `limit` in a row, naming
    `last_checkpoint`, the last one written at a finite step (none is written during the streak). Called before
    `state.step` counts this step: its number is the next one, as metrics.jsonl numbers it."""
    optimizer.zero_grad(set_to_none=True)
    state.num_nonfinite_steps += 1
    state.consecutive_nonfinite_steps += 1
    step = state.step + 1
    logging.warning(
        f"Step {step}: non-finite loss ({loss.item()}); step skipped ({state.consecutive_nonfinite_steps} in a row)"
    )
    if state.consecutive_nonfinite_steps >= limit:
        message = nonfinite_message(state, step, optimizer.param_groups[0]["lr"], precision, limit, last_checkpoint)
        logging.error(message)
        raise NonFiniteLossError(message)


def nonfinite_message(
    state: TrainState, step: int, lr: float, precision: str, limit: int, last_checkpoint: Optional[str]
) -> str:
    """The stop line of a diverged run: `limit` non-finite steps in a row, the last numbered `step` (as in
    metrics.jsonl), and the checkpoint to resume, the last one written at a finite step."""
    resume = (
        f"resume from the last checkpoint written at a finite step, {last_checkpoint}, with --resume "
        f"{last_checkpoint} after changing them"
        if last_checkpoint
        else "no checkpoint was written at a finite step: start again after changing them"
    )
    return (
        f"{limit} consecutive steps had a non-finite (NaN/inf) loss, the last at step {step} "
        f"(epoch {state.position.epoch}, lr {lr:g}, precision {precision}); stopping. Likely causes: a learning rate "
        f"too high for this batch size and warmup (lower --lr or raise --warmup; --grad-clip-norm helps), "
        f"or reduced precision overflowing (fp16/amp: use --precision amp_bf16 or fp32); {resume}."
    )


@dataclass
class EpochResult:
    loss: float  # mean loss over the epoch's finite steps (rank 0's)
    num_steps: int
    num_nonfinite_steps: int
    skipped: Dict[str, int]  # shards and samples the data pipeline skipped, per reason, summed over ranks
    skipped_shards: ShardVisits  # the shards of the skipped shard visits, over ranks (MAX_NAMED_SHARDS at most)
    seconds: float
    preempted: bool = False  # stopped after a step, inside the epoch, for a preemption signal


@dataclass(frozen=True)
class EpochLoop:
    """What one epoch of steps drives: one rank's components, built once by the run's `Trainer`
    (`training.trainer.launch.trainer`, its `RunParts.loop`), which calls `train_one_epoch` for each epoch."""

    model: torch.nn.Module
    loss_fn: Loss
    optimizer: torch.optim.Optimizer
    scheduler: Optional[Callable[[int], float]]
    precision: Precision
    state: TrainState
    cfg: TrainConfig
    env: DistributedEnv
    metrics: MetricsWriter
    skip_reasons: Sequence[str]  # the data pipeline's skip counters, in its order
    checkpointer: Optional[Checkpointer] = None  # step checkpoints (--save-every-n-steps)
    preemption: Optional[PreemptionFlag] = None
    # After each step: the loss's journals into the run folder (`launch.folder.LossJournals.update`).
    keep_loss_journals: Optional[Callable[[], None]] = None
    total_steps: int = 0  # the run's steps over all epochs, for its time left (0: unknown)


class EpochData(Protocol):
    """One epoch's batches (the trainer's `LoaderInfo`, or any iterable with its length)."""

    dataloader: Iterable
    num_batches: int


def train_one_epoch(loop: EpochLoop, data: EpochData) -> EpochResult:
    """Train on the rest of epoch `state.position.epoch` (all of it, or what follows a mid-epoch resume).

    `data.dataloader` yields `Batch`es (`training.trainer.data.batch`) and, when resuming mid-epoch,
    has already been told to skip the `state.position.batches_in_epoch` batches consumed before the
    interruption. `loss_fn.on_epoch_start(epoch)` is called first, also for an epoch resumed midway (the loss's
    restored state already reflects the epoch's earlier steps; the hook only sets the epoch).

    When `preemption` was signalled on any rank, the epoch ends after the current step (unless it is
    the epoch's last, which ends the epoch anyway) with `preempted` set and no epoch summary.
    """
    loss_fn, optimizer, precision = loop.loss_fn, loop.optimizer, loop.precision
    state, cfg, env, metrics, checkpointer = loop.state, loop.cfg, loop.env, loop.metrics, loop.checkpointer
    skip_reasons, dataloader, num_batches = loop.skip_reasons, data.dataloader, data.num_batches
    loop.model.train()
    position, sums = state.position, state.epoch_sums
    loss_fn.on_epoch_start(position.epoch)
    state.start_epoch(len(skip_reasons))
    steps_per_epoch = num_batches // cfg.accum_freq
    step_in_epoch = first_step = position.batches_in_epoch // cfg.accum_freq
    num_nonfinite_at_start = state.num_nonfinite_steps
    epoch_start = end = time.monotonic()
    first_step_end = None  # the rate left leaves out this launch's first step of the epoch (compile, loader start)

    batches = iter(dataloader)
    # Restored here, after the loader's iterator drew its seed, so the next batch and step see
    # exactly the random numbers they saw before the interruption.
    state.rng.restore_pending()

    micro_batches: List[Batch] = []
    for batch in batches:
        if step_in_epoch >= steps_per_epoch:
            break
        sums.add_skipped(batch.skipped)
        micro_batches.append(batch.to(env.device, precision.input_dtype))
        position.batches_in_epoch += 1
        if len(micro_batches) < cfg.accum_freq:
            continue
        data_time = time.monotonic() - end
        step_samples = sum(len(b.images) for b in micro_batches) * env.world_size
        if not state.samples_per_schedule_step:
            state.samples_per_schedule_step = step_samples
        # Every rank alike (a loss's stats may reduce over the ranks); only rank 0 then logs them.
        loss_fn.wants_stats = logs_step(step_in_epoch + 1, steps_per_epoch, cfg.log_every_n_steps)
        out, preempted = optimizer_step(loop, micro_batches, step_samples)
        step_in_epoch += 1
        if loop.keep_loss_journals is not None:
            loop.keep_loss_journals()

        batch_time = time.monotonic() - end
        end = time.monotonic()
        first_step_end = end if first_step_end is None else first_step_end
        if env.is_master and logs_step(step_in_epoch, steps_per_epoch, cfg.log_every_n_steps):
            timed_steps = step_in_epoch - first_step - 1  # this launch's steps of the epoch after its first
            seconds_per_step = (end - first_step_end) / timed_steps if timed_steps else None
            _log_step(
                metrics,
                state,
                out,
                optimizer,
                step_in_epoch,
                steps_per_epoch,
                step_samples,
                batch_time,
                data_time,
                env,
                console_stats=loss_fn.console_stats,
                time_left=time_left_text(
                    seconds_per_step,
                    steps_per_epoch - step_in_epoch,
                    loop.total_steps - state.step if loop.total_steps else None,
                ),
            )
        # The epoch's last step is saved after the epoch ends (Checkpointer.save_epoch), as the start
        # of the next epoch rather than as the end of this one; so is a preemption at that step.
        if step_in_epoch == steps_per_epoch:
            continue
        if preempted:
            return EpochResult(
                loss=sums.mean_loss,
                num_steps=step_in_epoch,
                num_nonfinite_steps=state.num_nonfinite_steps - num_nonfinite_at_start,
                skipped={},
                skipped_shards={},
                seconds=time.monotonic() - epoch_start,
                preempted=True,
            )
        # Not during a non-finite streak: those weights led into it, and --resume latest would resume them.
        if checkpointer is not None and state.consecutive_nonfinite_steps == 0:
            checkpointer.maybe_save_step()

    skipped = all_reduce_sum(sums.skip_counts.to(env.device), env).cpu().tolist()
    result = EpochResult(
        loss=sums.mean_loss,
        num_steps=step_in_epoch,
        num_nonfinite_steps=state.num_nonfinite_steps - num_nonfinite_at_start,
        skipped=dict(zip(skip_reasons, skipped)),
        skipped_shards=merged_shard_visits(*all_gather_object(sums.shard_visits, env)),
        seconds=time.monotonic() - epoch_start,
    )
    _log_epoch(metrics, state, result, env)
    return result


def logs_step(step_in_epoch: int, steps_per_epoch: int, log_every_n_steps: int) -> bool:
    """Whether the epoch's step `step_in_epoch` (counted from 1) is logged: the first of every
    `log_every_n_steps`, and the epoch's last."""
    return (step_in_epoch - 1) % log_every_n_steps == 0 or step_in_epoch == steps_per_epoch


def optimizer_step(loop: EpochLoop, micro_batches: List[Batch], step_samples: int) -> Tuple[StepOutput, bool]:
    """One step over `micro_batches`, `step_samples` samples over all ranks: the LR placed, the forward/backward
    (after which `micro_batches` is emptied, its tensors freed before the update), then on every rank the same
    decision, an update or (a non-finite loss on any rank) a skipped step, and the step counted. Also returns
    whether a preemption was requested on any rank."""
    state, cfg, optimizer, precision, preemption = loop.state, loop.cfg, loop.optimizer, loop.precision, loop.preemption
    if loop.scheduler is not None and not cfg.skip_scheduler:
        loop.scheduler(state.schedule_position)
    optimizer.zero_grad(set_to_none=True)
    out = forward_backward(loop.model, loop.loss_fn, micro_batches, precision)
    micro_batches.clear()

    # Every rank takes the same decisions, or DDP replicas would drift apart; the preemption flag
    # rides on the all-reduce the non-finite check needs anyway.
    nonfinite, preempted = any_rank_each([not out.finite, preemption is not None and preemption.requested], loop.env)
    if nonfinite:
        last_good = loop.checkpointer.last_good if loop.checkpointer is not None else None
        skip_nonfinite_step(
            state, optimizer, precision.name, cfg.max_nonfinite_steps, out.loss, str(last_good) if last_good else None
        )
    else:
        apply_update(loop.model, optimizer, precision, cfg.grad_clip_norm)
        loop.loss_fn.commit()
        state.consecutive_nonfinite_steps = 0
        state.epoch_sums.loss_sum += out.loss.item()
        state.epoch_sums.num_loss_steps += 1
    state.step += 1
    state.samples_seen += step_samples
    return out, preempted


def time_left_text(seconds_per_step: Optional[float], epoch_steps_left: int, run_steps_left: Optional[int]) -> str:
    """'time left: epoch 3 min, run 2 h 05 min': the steps left at the rate of this launch's steps so far, its first
    step in the epoch left out (None: no step after it yet). The first step of a launch starts the data loader's
    workers and, with --torchcompile, compiles the model: adacl-tiny at batch 64 took 43 s for it with an empty
    inductor cache (2.1 s with a warm one) against 0.13 s for each later step (Intel Xeon, 2 cores), so counted in,
    it made the first estimates of a short run a hundred times too long."""
    if seconds_per_step is None:
        return (
            "time left: from the next logged step (the first step, which compiles and starts the loader, is not timed)"
        )
    text = f"time left: epoch {duration_text(seconds_per_step * epoch_steps_left)}"
    return text + (f", run {duration_text(seconds_per_step * run_steps_left)}" if run_steps_left is not None else "")


def _log_step(
    metrics: MetricsWriter,
    state: TrainState,
    out: StepOutput,
    optimizer,
    step_in_epoch: int,
    steps_per_epoch: int,
    step_samples: int,
    batch_time: float,
    data_time: float,
    env: DistributedEnv,
    console_stats: Optional[Sequence[str]] = None,
    time_left: str = "",
) -> None:
    """OpenCLIP's console line, and a "train" line in metrics.jsonl / tensorboard (every stat; the
    console only the loss's `console_stats`, matched by the name after the direction, or all). A stat
    that is NaN has no value at this step (AdaCL's margins at a fallback step) and is left out of both, so a
    dashboard draws a gap there rather than a made-up 0 or 1.

    The step line is OpenCLIP's (`open_clip_train.train.train_one_epoch`), `[samples/samples per epoch (p%)]`
    (global samples), then each loss term and the total as `Name: value (the epoch's running mean)`, ending there
    (our losses have the one term `Contrastive_loss`), so that a parser of OpenCLIP's logs, one anchored at the
    line's end too, reads it. The next line, `Step N: ...`, holds what OpenCLIP does not print: the step, the
    samples seen in the run, the time left and the loss's stats."""
    lr = optimizer.param_groups[0]["lr"]
    all_stats = {name: value.item() for name, value in out.stats.items()}
    stats = {name: value for name, value in all_stats.items() if not math.isnan(value)}
    loss = out.loss.item()
    values: Dict[str, Any] = {
        "loss": loss,
        LOSS_TERM: loss,  # the loss's one term, as OpenCLIP's losses name it in their output_dict
        "lr": lr,
        "logit_scale": out.logit_scale.item(),
        "samples_per_second": step_samples / batch_time,
        "samples_per_second_per_gpu": step_samples / batch_time / env.world_size,
        "batch_time": batch_time,
        "data_time": data_time,
        "num_nonfinite_steps": state.num_nonfinite_steps,
        **{f"stats/{name}": value for name, value in stats.items()},
    }
    percent = 100.0 * step_in_epoch / steps_per_epoch
    samples_per_epoch = steps_per_epoch * step_samples
    sample_digits = len(str(samples_per_epoch))
    mean_loss = state.epoch_sums.mean_loss
    loss_terms = " ".join(
        f"{name.capitalize()}: {value:#.5g} ({mean_loss:#.5g})" for name, value in ((LOSS_TERM, loss), ("loss", loss))
    )
    logging.info(
        f"Train Epoch: {state.position.epoch} [{step_in_epoch * step_samples:>{sample_digits}}/{samples_per_epoch} "
        f"({percent:.0f}%)] "
        f"Data (t): {data_time:.3f} Batch (t): {batch_time:.3f}, {values['samples_per_second']:#g}/s, "
        f"{values['samples_per_second_per_gpu']:#g}/s/gpu LR: {lr:5f} Logit Scale: {values['logit_scale']:.3f} "
        + loss_terms
    )
    stats_text = console_stats_text(all_stats, console_stats)
    progress = ", ".join(part for part in (f"samples seen {state.samples_seen}", time_left) if part)
    logging.info(f"Step {state.step}: {progress}" + (f" | {stats_text}" if stats_text else ""))
    metrics.write("train", step=state.step, epoch=state.position.epoch, values=values)


def console_stats_text(stats: Dict[str, float], names: Optional[Sequence[str]]) -> str:
    """The console's short form of the loss's stats `names` (all when None), with the directions said once when
    every stat has the same ones: "i2t/t2i m2: 0.0312/0.0287 anchor: 0.41/0.39"; else "i2t/m2: 0.0312 ...".
    A stat with no value at this step (NaN) shows as "-"."""
    grouped: Dict[str, Dict[str, float]] = {}
    for key, value in stats.items():
        direction, _, name = key.rpartition("/")
        if names is None or name in names:
            grouped.setdefault(name, {})[direction] = value
    directions = {tuple(by_direction) for by_direction in grouped.values()}
    if len(directions) != 1 or "" in next(iter(directions), ("",)):
        return " ".join(
            f"{key}: {_short(value)}"
            for key, value in stats.items()
            if names is None or key.rpartition("/")[2] in names
        )
    [shared] = directions
    return " ".join(
        ["/".join(shared)]
        + [
            f"{name}: " + "/".join(_short(value) for value in by_direction.values())
            for name, by_direction in grouped.items()
        ]
    )


def _short(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3g}"


def _log_epoch(metrics: MetricsWriter, state: TrainState, result: EpochResult, env: DistributedEnv) -> None:
    if not env.is_master:
        return
    shards = {reason: count for reason, count in result.skipped.items() if reason in SHARD_SKIP_REASONS}
    samples = {reason: count for reason, count in result.skipped.items() if reason not in SHARD_SKIP_REASONS}

    logging.info(
        f"Epoch {state.position.epoch} done: loss {result.loss:.4f}, {result.num_steps} steps "
        f"({result.num_nonfinite_steps} skipped as non-finite), skipped shard visits: {_listed(shards)}"
        f"{_named_shards(result.skipped_shards, sum(shards.values()))}, "
        f"skipped samples: {_listed(samples)}, {result.seconds:.1f} s"
    )
    metrics.write(
        "epoch",
        step=state.step,
        epoch=state.position.epoch,
        values={
            "loss": result.loss,
            "num_steps": result.num_steps,
            "num_nonfinite_steps": result.num_nonfinite_steps,
            "seconds": result.seconds,
            "skipped_shard_visits": sum(shards.values()),
            "skipped_samples": sum(samples.values()),
            "skipped_shards": result.skipped_shards,
            **{f"skipped/{reason}": count for reason, count in result.skipped.items()},
        },
    )


def _listed(counts: Dict[str, int]) -> str:
    return ", ".join(f"{reason} {count}" for reason, count in counts.items() if count) or "none"


def _named_shards(shard_visits: ShardVisits, num_visits: int) -> str:
    """' (<shard>: <reason> <n>; ...; and K more)' naming the shards of `num_visits` skipped shard visits, so
    that the summary says which files to check; K counts the visits of shards past MAX_NAMED_SHARDS."""
    named = [f"{shard}: {_listed(by_reason)}" for shard, by_reason in shard_visits.items()]
    unnamed = num_visits - sum(sum(by_reason.values()) for by_reason in shard_visits.values())
    if unnamed > 0:
        named.append(f"and {unnamed} more visits")
    return f" ({'; '.join(named)})" if named else ""
