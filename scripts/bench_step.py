"""Training step time of `--loss adacl` against `--loss clip`: the trainer's own step, same model and batch.

    python scripts/bench_step.py                         # CPU: ViT-S-32 at batch 8, adacl-tiny at batch 128
    python scripts/bench_step.py --cases ViT-B-32:256 --device cuda --precision amp --output step.json

For each case (MODEL:BATCH) every loss steps one and the same model and AdamW: two copies of a
ViT-B-32 built alike differed by 3-8% in step time, the copy built second the slower whichever loss
it ran. One step is `training.trainer.engine.loop.forward_backward` + `apply_update` (forward, loss,
backward, AdamW, logit-scale clamp: what `train_one_epoch` runs per step) on one fixed random batch
already on the device, so data loading is left out. After --warmup-steps steps per loss, --repeats rounds
interleave the losses so that drift on a shared machine hits all of them alike; each loss's step
time is the median of its rounds, the ratio is that against the first loss's (clip) in the same
run, and the paired ratio the geometric mean over rounds of the two losses' back-to-back step times,
with its 95% interval (each loss goes first in turn).
Each round also times every loss alone (forward and backward on the model's features of the
batch, detached): the loss's share is its median over the step's, what a faster or slower loss
can change in the step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from typing import Dict, List, Sequence

import torch

from open_clip_adacl import create_loss
from training.trainer.data import Batch
from training.trainer.data.samples import no_skips
from training.trainer.engine.loop import apply_update, forward_backward
from training.trainer.engine.model import ModelConfig, build_model
from training.trainer.engine.optimizer import OptimizerConfig, build_optimizer
from training.trainer.engine.precision import build_precision, resolve_precision
from training.trainer.launch.tool_flags import add_trainer_flags
from training.trainer.timing import paired_ratio, ratio_text

DEFAULT_CASES = ("ViT-S-32:8", "adacl-tiny:128")
OPTIMIZER = OptimizerConfig(lr=1e-4, wd=0.1, beta1=0.9, beta2=0.98, eps=1e-6)


@dataclass
class Trainee:
    """A loss with the model and optimizer it steps."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss: torch.nn.Module


def parse_case(case: str) -> tuple:
    model, _, batch = case.rpartition(":")
    if not model or not batch.isdigit():
        raise argparse.ArgumentTypeError(f"expected MODEL:BATCH such as ViT-S-32:8, got {case!r}")
    return model, int(batch)


def random_batch(model: torch.nn.Module, batch_size: int, device: torch.device, dtype) -> Batch:
    """Images at the model's input size and token ids at its context length (fixed seed)."""
    generator = torch.Generator().manual_seed(0)
    height, width = (
        model.visual.image_size if isinstance(model.visual.image_size, tuple) else (model.visual.image_size,) * 2
    )
    images = torch.randn(batch_size, 3, height, width, generator=generator)
    texts = torch.randint(1, model.vocab_size, (batch_size, model.context_length), generator=generator)
    return Batch(
        images.to(device=device, dtype=dtype), texts.to(device), torch.arange(batch_size, device=device), no_skips()
    )


def build_trainees(model_name: str, losses: Sequence[str], precision: str, device: torch.device) -> Dict[str, Trainee]:
    """One model and one AdamW that every loss steps (see the module's docstring: two copies built alike
    differ in step time by more than the losses do)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(model_name, precision=precision), device).model
    model.train()
    optimizer = build_optimizer(model, OPTIMIZER)
    return {loss: Trainee(model, optimizer, create_loss(loss).to(device)) for loss in losses}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def step_seconds(trainee: Trainee, batch: Batch, precision, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    trainee.optimizer.zero_grad(set_to_none=True)
    forward_backward(trainee.model, trainee.loss, [batch], precision)
    apply_update(trainee.model, trainee.optimizer, precision, grad_clip_norm=None)
    trainee.loss.commit()
    synchronize(device)
    return time.perf_counter() - start


def loss_seconds(trainee: Trainee, features: tuple, device: torch.device) -> float:
    """One forward and backward of the loss alone on fixed features (leaves, so nothing else runs)."""
    image, text, logit_scale = (tensor.detach().requires_grad_() for tensor in features)
    trainee.loss.eval()  # a timing, not a training step: it stages no update of the loss's state
    synchronize(device)
    start = time.perf_counter()
    trainee.loss(image, text, logit_scale).backward()
    synchronize(device)
    trainee.loss.train()
    return time.perf_counter() - start


def bench_case(
    model_name: str,
    batch_size: int,
    losses: Sequence[str],
    *,
    device: torch.device,
    precision: str,
    warmup: int,
    repeats: int,
) -> List[dict]:
    """One row per loss: median step seconds, samples/s, the ratio to the first loss and the loss's share."""
    trainees = build_trainees(model_name, losses, precision, device)
    first = next(iter(trainees.values())).model
    step_precision = build_precision(precision, device)
    batch = random_batch(first, batch_size, device, step_precision.input_dtype)
    with torch.no_grad(), step_precision.autocast():
        output = first(batch.images, batch.texts)
    features = tuple(output[name].float() for name in ("image_features", "text_features", "logit_scale"))
    for trainee in trainees.values():
        for _ in range(warmup):
            step_seconds(trainee, batch, step_precision, device)
            loss_seconds(trainee, features, device)
    seconds: Dict[str, List[float]] = {loss: [] for loss in losses}
    alone: Dict[str, List[float]] = {loss: [] for loss in losses}
    for round_index in range(repeats):
        shift = round_index % len(losses)  # each loss goes first in turn, so order hits all alike
        for loss in list(losses[shift:]) + list(losses[:shift]):
            seconds[loss].append(step_seconds(trainees[loss], batch, step_precision, device))
            alone[loss].append(loss_seconds(trainees[loss], features, device))
    medians = {loss: statistics.median(values) for loss, values in seconds.items()}
    baseline = losses[0]
    return [
        {
            "model": model_name,
            "batch_size": batch_size,
            "loss": loss,
            "seconds": medians[loss],
            "samples_per_second": batch_size / medians[loss],
            "ratio": medians[loss] / medians[baseline],
            # Within a round the losses ran back to back: pairing their times removes the drift between rounds.
            "paired_ratio": paired_ratio(seconds[loss], seconds[baseline]),
            "loss_seconds": statistics.median(alone[loss]),
            "loss_share": statistics.median(alone[loss]) / medians[loss],
            "rounds": seconds[loss],
        }
        for loss in losses
    ]


def markdown_table(rows: Sequence[dict]) -> str:
    lines = [
        "| model | batch | loss | step time (ms) | samples/s | ratio | paired ratio (95%) | loss alone (ms) | "
        "loss's share of the step |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['model']} | {row['batch_size']} | {row['loss']} | {row['seconds'] * 1e3:.1f} | "
            f"{row['samples_per_second']:.1f} | {row['ratio']:.3f} | {ratio_text(row['paired_ratio'])} | "
            f"{row['loss_seconds'] * 1e3:.1f} | {row['loss_share']:.1%} |"
        )
    return "\n".join(lines)


def describe_device(device: torch.device, threads: int) -> str:
    """The GPU, or the CPU with its family and model numbers, threads and load; and the code version measured."""
    from training.trainer.run_folder.provenance import machine_info

    info = machine_info(device.type)
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else (f"CPU {info['cpu']}, {info['cores']} cores, {threads} thread(s), load average {info['load']}")
    )
    return f"{where}; code {info['code']}"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases",
        type=parse_case,
        nargs="+",
        default=[parse_case(c) for c in DEFAULT_CASES],
        help="MODEL:BATCH cases (per-process batch)",
    )
    parser.add_argument("--losses", nargs="+", default=["clip", "adacl"], help="the first is the ratios' baseline")
    add_trainer_flags(
        parser.add_argument_group("the trainer's flags"), ("device", "precision"), defaults={"device": "cpu"}
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--warmup-steps", dest="warmup", type=int, default=2, help="untimed steps per loss first")
    parser.add_argument("--repeats", type=int, default=10, help="timed rounds (median reported)")
    parser.add_argument("--output", help="also write the rows and settings as JSON to this file")
    parser.add_argument("--smoke", action="store_true", help="a seconds-long check: adacl-tiny:8, 1 round")
    args = parser.parse_args(argv)
    if args.smoke:
        args.cases, args.warmup, args.repeats = [("adacl-tiny", 8)], 0, 1
    return args


def main(argv=None) -> List[dict]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    precision = resolve_precision(args.precision, device.type)
    rows = []
    for model_name, batch_size in args.cases:
        rows += bench_case(
            model_name,
            batch_size,
            args.losses,
            device=device,
            precision=precision,
            warmup=args.warmup,
            repeats=args.repeats,
        )
    settings = (
        f"Training step (forward, loss, backward, AdamW), {precision}, torch {torch.__version__}, "
        f"{describe_device(device, args.threads)}; median of {args.repeats} interleaved rounds after "
        f"{args.warmup} warm-up steps; ratio against --loss {args.losses[0]} in the same run."
    )
    print(f"{settings}\n\n{markdown_table(rows)}")
    if args.output:
        with open(args.output, "w") as handle:
            json.dump({"settings": settings, "rows": rows}, handle, indent=1)
    return rows


if __name__ == "__main__":
    main()
