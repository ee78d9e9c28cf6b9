"""What the AdaCL loss's own threads buy on the CPU: forward+backward with them and without, against ClipLoss.

    python scripts/bench_threads.py --size 4096 --threads 2 --repeats 20 [--busy 3] [--output threads.md]

With torch set to 2 or more threads, the loss selects its two directions' anchors side by side, one
thread each, and splits the rows of its summary pass between threads (`open_clip_adacl.row_passes`;
docs/THROUGHPUT.md). `in turn` is the same loss with that switched off (`row_passes.can_run_side_by_side`
answering no): the directions one after the other, every op split between torch's threads. Cases
`clip` (OpenCLIP's ClipLoss), `side by side` and `in turn` run once per round, in an order rotated
from round to round, on `bench_loss.py`'s trained-like features with its default selection path
(`auto`); each ratio is paired by round (the geometric mean of the two cases' times in the same round,
with its 95% interval).

A second table times the summary pass alone (`selection.summarize_rows`, one direction's logits) three
ways: its rows split between threads (the default), in turn with each op on torch's threads, and on
one thread. `--busy K` starts K processes that keep a core busy for the whole run, as other jobs on a
shared machine do. The report names the machine, the code and the load average before and after.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable, Dict, Iterator, List

import torch
from bench_loss import INPUTS, build_loss, describe_machine, load_average, make_features, rotated, train_step

from training.trainer.timing import paired_ratio, ratio_text

CASES = ("clip", "side by side", "in turn")
SUMMARY_CASES = ("rows split", "in turn", "one thread")


@contextmanager
def without_own_threads() -> Iterator[None]:
    """The loss without its own threads: the `in turn` cases."""
    from open_clip_adacl import row_passes

    original = row_passes.can_run_side_by_side
    row_passes.can_run_side_by_side = lambda device, num_calls: False
    try:
        yield
    finally:
        row_passes.can_run_side_by_side = original


def interleaved(steps: Dict[str, Callable[[], None]], repeats: int) -> Dict[str, List[float]]:
    """Wall-clock seconds of each case per round, after one untimed call each; the order rotates by round."""
    names = list(steps)
    for name in names:
        steps[name]()
    seconds: Dict[str, List[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        for name in rotated(names, round_index):
            start = time.perf_counter()
            steps[name]()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def loss_steps(size: int, dim: int, inputs: str, mode: str) -> Dict[str, Callable[[], None]]:
    """One forward+backward of each of `CASES`."""
    image, text = make_features(size, dim, "cpu", inputs)
    scale = INPUTS[inputs]
    losses = {
        "clip": build_loss("clip"),
        "side by side": build_loss(f"adacl-{mode}/auto"),
        "in turn": build_loss(f"adacl-{mode}/auto"),
    }

    def step(case: str) -> None:
        with without_own_threads() if case == "in turn" else nullcontext():
            train_step(losses[case], image, text, scale)

    return {case: (lambda case=case: step(case)) for case in CASES}


def summary_steps(size: int, dim: int, inputs: str) -> Dict[str, Callable[[], None]]:
    """One summary pass over the image-to-text logits in each of `SUMMARY_CASES`."""
    from open_clip_adacl.row_passes import one_cpu_thread
    from open_clip_adacl.selection import summarize_rows

    image, text = make_features(size, dim, "cpu", inputs)
    logits = INPUTS[inputs] * image @ text.T
    positive_col = torch.arange(size)
    context = {
        "rows split": nullcontext,
        "in turn": without_own_threads,
        "one thread": lambda: one_cpu_thread(logits.device),
    }

    def step(case: str) -> None:
        with context[case]():
            summarize_rows(logits, positive_col)

    return {case: (lambda case=case: step(case)) for case in SUMMARY_CASES}


def loss_rows(seconds: Dict[str, List[float]], mode: str) -> List[str]:
    """Each case's median time, and its paired ratios to ClipLoss and to `in turn`."""
    rows = [f"| clip | - | {statistics.median(seconds['clip']) * 1e3:.1f} | 1.000 | - |"]
    for case in CASES[1:]:
        rows.append(
            f"| adacl-{mode} | {case} | {statistics.median(seconds[case]) * 1e3:.1f} | "
            f"{ratio_text(paired_ratio(seconds[case], seconds['clip']))} | "
            f"{ratio_text(paired_ratio(seconds[case], seconds['in turn']))} |"
        )
    return rows


def summary_rows(seconds: Dict[str, List[float]]) -> List[str]:
    """Each way's median time, and its paired ratio to `one thread`."""
    return [
        f"| {case} | {statistics.median(seconds[case]) * 1e3:.1f} | "
        f"{ratio_text(paired_ratio(seconds[case], seconds['one thread']))} |"
        for case in SUMMARY_CASES
    ]


def _busy() -> None:
    while True:
        pass


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=4096, help="global batch size N")
    parser.add_argument("--dim", type=int, default=512, help="feature width D")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (2 or more, or nothing differs)")
    parser.add_argument("--repeats", type=int, default=20, help="timed rounds")
    parser.add_argument("--inputs", choices=tuple(INPUTS), default="trained-50", help="input kind (bench_loss.py)")
    parser.add_argument("--modes", nargs="+", choices=("literal", "calibrated"), default=["literal", "calibrated"])
    parser.add_argument("--busy", type=int, default=0, help="processes that keep a core busy during the run")
    parser.add_argument("--output", help="also write the report to this file")
    args = parser.parse_args(argv)
    if args.threads < 2 or args.repeats < 2 or args.size < 3 or args.dim < 1 or args.busy < 0:
        parser.error(
            "--threads and --repeats must be at least 2 (with one thread both cases are the same code), "
            "--size at least 3, --dim at least 1, --busy at least 0"
        )
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.pop("OPEN_CLIP_ADACL_FUSED", None)  # the default path, auto
    busy = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.busy)]
    for process in busy:
        process.start()
    try:
        before = load_average()
        rows = [
            "| loss | threads | time (ms) | paired ratio to ClipLoss (95%) | paired ratio to in turn (95%) |",
            "|---|---|---:|---:|---:|",
        ]
        for mode in args.modes:
            rows += loss_rows(interleaved(loss_steps(args.size, args.dim, args.inputs, mode), args.repeats), mode)
        rows += [
            "",
            "The summary pass alone (one direction):",
            "",
            "| summary pass | time (ms) | paired ratio to one thread (95%) |",
            "|---|---:|---:|",
        ]
        rows += summary_rows(interleaved(summary_steps(args.size, args.dim, args.inputs), args.repeats))
        after = load_average()
    finally:
        for process in busy:
            process.terminate()
    text = (
        f"AdaCL's threads, forward+backward, N={args.size}, D={args.dim}, {args.inputs} inputs, torch "
        f"{torch.__version__}, {describe_machine('cpu', args.threads)}; {args.busy} busy process(es) beside it; "
        f"load average {before} before, {after} after; medians of {args.repeats} rounds, ratios paired by "
        f"round.\n\n" + "\n".join(rows) + "\n"
    )
    print(text)
    if args.output:
        from training.discover.store import write_atomically

        write_atomically(Path(args.output), text)


if __name__ == "__main__":
    main()
