"""Forward+backward time and peak memory of the AdaCL loss against OpenCLIP's ClipLoss.

    python scripts/bench_loss.py --sizes 1024 4096 --threads 1 [--output bench.md]
    python scripts/bench_loss.py --device cuda --sizes 8192 32768 [--fused off]

Every loss sees the same random unit features (N x D, positives correlated with their queries so
that clone candidates exist) and logit_scale 14.3. Time: the median over `--repeats` interleaved
rounds (one warm-up step each first, which also compiles AdaCL's fused selection passes), wall
clock, synchronised on CUDA. Peak memory: on the CPU the peak resident set of a fresh subprocess per
case above its resident set once the inputs exist and the fused passes are compiled (on a smaller
batch, so the measured loss still allocates its own buffers; tracemalloc does not see torch's
allocations); on CUDA `torch.cuda.max_memory_allocated` above the allocation before the step. Both
are reported relative to ClipLoss measured in the same run. `--fused` sets OPEN_CLIP_ADACL_FUSED
(docs/adacl.md §6) for the run. The report names the machine (CPU model and family from
/proc/cpuinfo, cores, GPU) and the load average before and after the run, which on a shared machine
says how far to trust the absolute times (the ratios are measured interleaved).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F

CASES = ("clip", "adacl-literal", "adacl-calibrated")
# The fused passes compile for matrices from 2048 x 2048 entries (open_clip_adacl.fused.AUTO_MIN_ELEMENTS).
COMPILE_WARMUP_SIZE = 2048


def build_loss(case: str):
    import open_clip
    from open_clip_adacl import create_loss

    if case == "clip":
        return open_clip.ClipLoss()
    return create_loss("adacl", mode=case.split("-", 1)[1])


def make_features(num: int, dim: int, device: str, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    image = F.normalize(torch.randn(num, dim, generator=generator), dim=-1)
    text = F.normalize(image + torch.randn(num, dim, generator=generator), dim=-1)
    return image.to(device), text.to(device)


def train_step(loss_fn, image: torch.Tensor, text: torch.Tensor) -> None:
    image = image.clone().requires_grad_()
    text = text.clone().requires_grad_()
    scale = torch.tensor(14.3, device=image.device, requires_grad=True)
    loss_fn(image, text, scale).backward()


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_cases(num: int, dim: int, device: str, repeats: int) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Median wall-clock seconds and median CPU seconds (this process, all threads) per forward+backward of
    each case, rounds interleaved so drift hits all alike. On a machine shared with other jobs the CPU time
    moves less than the wall clock: it leaves out the time the process waits for a core."""
    image, text = make_features(num, dim, device)
    losses = {case: build_loss(case) for case in CASES}
    for loss_fn in losses.values():
        train_step(loss_fn, image, text)
    seconds: Dict[str, List[float]] = {case: [] for case in CASES}
    cpu_seconds: Dict[str, List[float]] = {case: [] for case in CASES}
    for _ in range(repeats):
        for case, loss_fn in losses.items():
            _synchronize(device)
            start, cpu_start = time.perf_counter(), time.process_time()
            train_step(loss_fn, image, text)
            _synchronize(device)
            seconds[case].append(time.perf_counter() - start)
            cpu_seconds[case].append(time.process_time() - cpu_start)
    return ({case: statistics.median(values) for case, values in seconds.items()},
            {case: statistics.median(values) for case, values in cpu_seconds.items()})


def _resident_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_memory_worker(case: str, num: int, dim: int, device: str) -> int:
    """Peak bytes of two training steps above what the inputs already take (this process only)."""
    warmup_image, warmup_text = make_features(min(num, COMPILE_WARMUP_SIZE), dim, device)
    train_step(build_loss(case), warmup_image, warmup_text)  # compiles; the compiler's memory is not the loss's
    del warmup_image, warmup_text
    image, text = make_features(num, dim, device)
    loss_fn = build_loss(case)
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(2):
            train_step(loss_fn, image, text)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    base = _resident_bytes("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # resets the peak (VmHWM) to the current resident set
    for _ in range(2):
        train_step(loss_fn, image, text)
    return _resident_bytes("VmHWM") - base


def measure_peak_memory(case: str, num: int, dim: int, device: str, threads: int) -> int:
    """`peak_memory_worker` in a fresh interpreter, so no earlier case's memory counts."""
    command = [sys.executable, os.path.abspath(__file__), "--memory-worker", case, "--sizes", str(num),
               "--dim", str(dim), "--device", device, "--threads", str(threads)]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return int(json.loads(output.strip().splitlines()[-1])["peak_bytes"])


def markdown_table(rows: Sequence[dict]) -> str:
    lines = ["| N | loss | time (ms) | time ratio | CPU time (ms) | CPU time ratio | peak memory (MiB) | memory ratio |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['N']} | {row['loss']} | {row['seconds'] * 1e3:.1f} | {row['time_ratio']:.3f} | "
                     f"{row['cpu_seconds'] * 1e3:.1f} | {row['cpu_ratio']:.3f} | "
                     f"{row['peak_bytes'] / 2 ** 20:.1f} | {row['memory_ratio']:.3f} |")
    return "\n".join(lines)


def benchmark(sizes: Sequence[int], dim: int, device: str, repeats: int, threads: int) -> List[dict]:
    rows = []
    for num in sizes:
        seconds, cpu_seconds = time_cases(num, dim, device, repeats)
        peak = {case: measure_peak_memory(case, num, dim, device, threads) for case in CASES}
        for case in CASES:
            rows.append({"N": num, "loss": case, "seconds": seconds[case], "peak_bytes": peak[case],
                         "time_ratio": seconds[case] / seconds["clip"], "cpu_seconds": cpu_seconds[case],
                         "cpu_ratio": cpu_seconds[case] / cpu_seconds["clip"],
                         # Tiny batches can reuse freed heap memory, leaving nothing to compare.
                         "memory_ratio": peak[case] / peak["clip"] if peak["clip"] > 0 else float("nan")})
    return rows


def describe_machine(device: str, threads: int) -> str:
    """CPU model (with family and model numbers, which tell apart CPUs that /proc/cpuinfo names alike),
    cores, torch threads, and the GPU when measuring on one."""
    from training.loss_comparison.report import machine_info

    info = machine_info(device)
    fields = {}
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                name, _, value = line.partition(":")
                fields.setdefault(name.strip(), value.strip())
    family = f" (family {fields['cpu family']}, model {fields['model']})" if "cpu family" in fields else ""
    return f"CPU {info['cpu']}{family}, {info['cores']} cores, {threads} torch thread(s){info.get('gpu', '')}"


def load_average() -> str:
    return ", ".join(f"{value:.1f}" for value in os.getloadavg())


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 8192], help="global batch sizes N")
    parser.add_argument("--dim", type=int, default=512, help="feature width D")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per case (median reported)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument("--fused", choices=("auto", "on", "off"),
                        help="AdaCL's fused selection passes (OPEN_CLIP_ADACL_FUSED; default: as set, else auto)")
    parser.add_argument("--output", help="also write the markdown table to this file")
    parser.add_argument("--memory-worker", choices=CASES, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.fused:
        os.environ["OPEN_CLIP_ADACL_FUSED"] = args.fused  # the memory workers inherit it
    if args.memory_worker:
        print(json.dumps({"peak_bytes": peak_memory_worker(args.memory_worker, args.sizes[0], args.dim, args.device)}))
        return
    load_before = load_average()
    rows = benchmark(args.sizes, args.dim, args.device, args.repeats, args.threads)
    fused = os.environ.get("OPEN_CLIP_ADACL_FUSED", "auto")
    report = (f"Loss forward+backward, D={args.dim}, torch {torch.__version__}, "
              f"{describe_machine(args.device, args.threads)}; load average {load_before} before, {load_average()} "
              f"after; AdaCL fused passes: {fused}; median of {args.repeats} rounds; ratios against ClipLoss in "
              f"the same run.\n\n{markdown_table(rows)}\n")
    print(report)
    if args.output:
        with open(args.output, "w") as handle:
            handle.write(report)


if __name__ == "__main__":
    main()
