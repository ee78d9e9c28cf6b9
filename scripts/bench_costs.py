"""What one step of each registered loss costs on the GPU code path, run on the CPU, beside OpenCLIP's ClipLoss.

    OMP_NUM_THREADS=2 python scripts/bench_costs.py --sizes 256 4096 [--output costs.md]
    python scripts/bench_costs.py --device cuda --sizes 32768

For every registered loss (`open_clip_adacl.list_losses()`; adacl in both modes, adaclw with each discovery of
`open_clip_adacl.clone_signals.SIGNALS`) and each N, one forward + backward at D = `--dim` on bench_loss.py's
trained-like features at logit scale 50, with the GPU's code path forced on the CPU (step_costs.gpu_code_path:
nothing read back to skip work, the eager selection passes, a GPU's row chunks). Each loss gets the keyword inputs
the trainer passes, made deterministic: sample ids 0..N-1 (and `data_size` N where the loss keeps per-sample
state), family ids of bench_loss.py's clusters of eight, its synthesized captions' token ids; its stats are
off (`wants_stats`, a step the trainer does not log). Counted on the second step (the first fills any state
the loss keeps; `commit()` runs after each step, outside the counted span) under step_costs.counting_host_reads:

- aten ops: every op dispatched, forward and backward (about one kernel launch each on a GPU);
- host waits: the calls that would make a GPU's host wait (`.item()`, `.tolist()`, `nonzero`, boolean-mask
  indexing, `unique`, `repeat_interleave`, `bincount`, ...), named; and those of the loss's `commit()` apart;
- N x N passes: the bytes of the inputs and outputs of the ops whose tensors have at least N x N elements
  (views and unwritten allocations aside), over the 4 N^2 bytes of one N x N float32 matrix;
- CPU wall time: the median over `--repeats` rounds of one forward + backward, every case once a round in an
  order rotated from round to round, on the same forced path.

Every figure comes beside its ratio to ClipLoss's in the same run. With `--device cuda` (scripts/gpu_bench.sh) the
same on a GPU, on its own path (nothing forced), the times synchronised, and each case's peak memory: the highest
`torch.cuda.max_memory_allocated` over the rounds above what was allocated before the step.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from bench_loss import CLUSTER_SIZE, INPUTS, describe_machine, load_average, make_features, make_tokens, rotated
from step_costs import counting_host_reads, gpu_code_path

INPUT_KIND = "trained-50"
BASELINE = "ClipLoss"
SIGLIP_BIAS = -10.0  # SigLIP's logit bias at initialisation


@dataclass
class Case:
    name: str
    build: Callable[..., torch.nn.Module]  # (N, DistributedSetup or None) -> the loss


def loss_cases() -> List[Case]:
    """OpenCLIP's ClipLoss first, then every registered loss (adacl per mode, adaclw per discovery)."""
    import open_clip

    from open_clip_adacl import clone_signals, create_loss, get_loss_class, list_losses

    def registered(name: str, **options) -> Callable[..., torch.nn.Module]:
        def build(num: int, dist=None) -> torch.nn.Module:
            accepted = {spec.name for spec in get_loss_class(name).Options.specs()}
            sized = {"data_size": num} if "data_size" in accepted else {}
            loss_fn = create_loss(name, dist=dist, **options, **sized)
            loss_fn.wants_stats = False  # a step the trainer does not log
            return loss_fn

        return build

    cases = [Case(BASELINE, lambda num, dist=None: open_clip.ClipLoss())]
    for name in list_losses():
        if name == "adacl":
            cases += [Case(f"adacl ({mode})", registered(name, mode=mode)) for mode in ("calibrated", "literal")]
        elif name == "adaclw":
            cases += [Case(f"adaclw/{signal}", registered(name, discovery=signal)) for signal in clone_signals.SIGNALS]
        else:
            cases.append(Case(name, registered(name)))
    return cases


@dataclass
class StepInputs:
    image: torch.Tensor
    text: torch.Tensor
    scale: torch.Tensor  # 0-dim, and the bias for a loss that needs one: on the device, made before the step
    bias: torch.Tensor
    sample_index: torch.Tensor
    family: torch.Tensor
    text_tokens: torch.Tensor


def step_inputs(num: int, dim: int, rows: slice = slice(None), device: str = "cpu") -> StepInputs:
    """The `rows` of a global batch of `num` (a rank's share: all by default), on `device`."""
    image, text = make_features(num, dim, "cpu", INPUT_KIND)
    ids = torch.arange(num)
    parts = (image, text, ids, ids // CLUSTER_SIZE, make_tokens(num))
    image, text, ids, family, tokens = (part[rows].to(device) for part in parts)
    scale, bias = (torch.tensor(value, device=device) for value in (INPUTS[INPUT_KIND], SIGLIP_BIAS))
    return StepInputs(image, text, scale, bias, ids, family, tokens)


def train_step(loss_fn: torch.nn.Module, inputs: StepInputs) -> None:
    """One forward + backward, with the trainer's keyword inputs for a registered loss (ClipLoss takes none)."""
    image, text = inputs.image.clone().requires_grad_(), inputs.text.clone().requires_grad_()
    scale = inputs.scale.clone().requires_grad_()
    if not hasattr(loss_fn, "commit"):
        loss_fn(image, text, scale).backward()
        return
    loss_fn(
        image,
        text,
        scale,
        inputs.bias.clone().requires_grad_() if loss_fn.needs_logit_bias else None,
        sample_index=inputs.sample_index,
        family=inputs.family,
        text_tokens=inputs.text_tokens,
    ).backward()


def commit(loss_fn: torch.nn.Module) -> None:
    if hasattr(loss_fn, "commit"):
        loss_fn.commit()


def count_case(loss_fn: torch.nn.Module, inputs: StepInputs) -> dict:
    """The second step's ops, host waits and N x N passes (the first fills the loss's state), and its commit's
    host waits."""
    num = inputs.image.shape[0]
    train_step(loss_fn, inputs)
    commit(loss_fn)
    with counting_host_reads(costs_of=num) as reads:
        train_step(loss_fn, inputs)
    with counting_host_reads() as commit_reads:
        commit(loss_fn)
    costs = reads.costs
    return {
        "ops": costs.ops,
        "host_waits": dict(reads),
        "square_passes": costs.square_passes,
        "commit_waits": dict(commit_reads),
    }


def time_cases(
    losses: Dict[str, torch.nn.Module], inputs: StepInputs, repeats: int
) -> Tuple[Dict[str, float], Dict[str, Optional[int]]]:
    """Each case's median wall-clock seconds of one forward + backward, rounds interleaved (see the docstring),
    synchronised on CUDA; and on CUDA its peak bytes above what was allocated before the step (the highest over
    the rounds; None elsewhere)."""
    cuda = inputs.image.device.type == "cuda"
    seconds: Dict[str, List[float]] = {name: [] for name in losses}
    peaks: Dict[str, Optional[int]] = dict.fromkeys(losses)
    for round_index in range(repeats):
        for name in rotated(list(losses), round_index):
            if cuda:
                torch.cuda.synchronize()
                before = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            train_step(losses[name], inputs)
            if cuda:
                torch.cuda.synchronize()
                peaks[name] = max(peaks[name] or 0, torch.cuda.max_memory_allocated() - before)
            seconds[name].append(time.perf_counter() - start)
            commit(losses[name])
    return {name: statistics.median(values) for name, values in seconds.items()}, peaks


def measure(
    sizes: Sequence[int], dim: int, repeats: int, only: Optional[Sequence[str]] = None, device: str = "cpu"
) -> List[dict]:
    """One row per N and case (see the docstring), ClipLoss's first; `only`: the cases to measure beside it. On
    CUDA the device's own path, with each case's peak memory."""
    cases = [case for case in loss_cases() if only is None or case.name == BASELINE or case.name in only]
    rows = []
    with gpu_code_path() if device == "cpu" else contextlib.nullcontext():
        for num in sizes:
            inputs = step_inputs(num, dim, device=device)
            losses = {case.name: case.build(num).to(device) for case in cases}
            counted = {name: count_case(loss_fn, inputs) for name, loss_fn in losses.items()}
            seconds, peaks = time_cases(losses, inputs, repeats)
            base, base_seconds = counted[BASELINE], seconds[BASELINE]
            for name, count in counted.items():
                rows.append(
                    {
                        "loss": name,
                        "N": num,
                        **count,
                        "ops_ratio": count["ops"] / base["ops"],
                        "passes_ratio": count["square_passes"] / base["square_passes"],
                        "seconds": seconds[name],
                        "time_ratio": seconds[name] / base_seconds,
                        "peak_bytes": peaks[name],
                        "memory_ratio": None if peaks[name] is None else peaks[name] / max(peaks[BASELINE], 1),
                    }
                )
    return rows


def _named(waits: Dict[str, int]) -> str:
    return ", ".join(f"{name} x{count}" for name, count in sorted(waits.items())) or "-"


def markdown_table(rows: Sequence[dict], device: str = "cpu") -> str:
    """One row per case and N; on CUDA with the peak memory columns."""
    memory = any(row["peak_bytes"] is not None for row in rows)
    lines = [
        "| loss | N | aten ops | ops / ClipLoss | host waits | which | N x N passes | passes / ClipLoss | "
        f"{device.upper()} wall (ms) | wall / ClipLoss | "
        + ("peak memory (MiB) | memory / ClipLoss | " if memory else "")
        + "commit's host waits |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|" + ("---:|---:|" if memory else "") + "---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['loss']} | {row['N']} | {row['ops']} | {row['ops_ratio']:.2f} | "
            f"{sum(row['host_waits'].values())} | {_named(row['host_waits'])} | {row['square_passes']:.1f} | "
            f"{row['passes_ratio']:.2f} | {row['seconds'] * 1e3:.1f} | {row['time_ratio']:.2f} | "
            + (f"{row['peak_bytes'] / 2**20:.0f} | {row['memory_ratio']:.2f} | " if memory else "")
            + f"{_named(row['commit_waits'])} |"
        )
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    from training.trainer.launch.tool_flags import add_trainer_flags

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 4096], help="global batch sizes N")
    parser.add_argument("--dim", type=int, default=512, help="feature width D")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per case (median reported)")
    parser.add_argument("--losses", nargs="+", metavar="CASE", help="measure only these cases beside ClipLoss")
    add_trainer_flags(
        parser,
        ("device",),
        defaults={"device": "cpu"},
        notes={
            "device": "Here: cpu (the GPU's code path forced on the CPU) or cuda (the device's own, with peak memory)."
        },
    )
    parser.add_argument("--output", help="also write the report to this file")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.dim < 1 or min(args.sizes) < 3:
        parser.error("--repeats and --dim must be at least 1 and every --sizes value at least 3")
    if args.device not in ("cpu", "cuda"):
        parser.error(f"--device {args.device}: choose cpu or cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here; measure the GPU's path on the CPU with --device cpu")
    known = {case.name for case in loss_cases()}
    unknown = sorted(set(args.losses or ()) - known)
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose among: {', '.join(sorted(known))}")
    return args


def main(argv=None) -> List[dict]:
    args = parse_args(argv)
    load_before = load_average()
    rows = measure(args.sizes, args.dim, args.repeats, args.losses, args.device)
    where = "the GPU code path forced on the CPU" if args.device == "cpu" else "CUDA (peak: max_memory_allocated)"
    report = (
        f"One forward + backward on {where}, {INPUT_KIND} features, D={args.dim}, torch {torch.__version__}, "
        f"{describe_machine(args.device, torch.get_num_threads())}; load average {load_before} before, "
        f"{load_average()} after; wall: median of {args.repeats} rounds; every ratio against ClipLoss in the same "
        f"run.\n\n{markdown_table(rows, args.device)}\n"
    )
    print(report)
    if args.output:
        from training.discover.store import write_atomically

        write_atomically(Path(args.output), report)
    return rows


if __name__ == "__main__":
    sys.exit(main() and None)
