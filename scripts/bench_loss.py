"""Forward+backward time and peak memory of the AdaCL loss against OpenCLIP's ClipLoss.

    python scripts/bench_loss.py --sizes 1024 4096 --threads 1 [--output bench.md]
    python scripts/bench_loss.py --device cuda --sizes 8192 32768 --inputs trained-50 --paths auto eager --memory

Inputs (`--inputs`, N x D unit features; default all three):
- `random`: random features, each text its image plus as much noise (cosine about 0.7 to its image,
  0 to the others), logit_scale 14.3 (CLIP's at initialisation);
- `trained-50`, `trained-100`: features shaped like a trained model's, logit_scale 50 and 100: a
  direction shared by all (negatives at cosine about 0.14), clusters of eight near-duplicates
  (cosine about 0.31 to a sibling's caption) and each caption near its image (cosine about 0.35).
Every input runs ClipLoss and AdaCL in both modes (literal, calibrated) on each of the selection
paths (`--paths`, OPEN_CLIP_ADACL_FUSED, docs/adacl.md §6.1): `auto` (the default, which times both
the first time it meets a shape and keeps the faster), `fused` (on) and `eager` (off). Time: the
median over `--repeats` rounds, each running every case once, in an order rotated from round to
round (one warm-up step each first, which also compiles the fused passes and makes auto's choice);
wall clock, synchronised on CUDA, and CPU time of the process. Peak memory (`--memory`; with
`--memory-only` no timed rounds): on the CPU the peak resident set of a fresh subprocess per case above
its resident set once the inputs exist and the fused passes are compiled (on a smaller batch, so the
measured loss still allocates its own buffers; tracemalloc does not see torch's allocations); on CUDA
`torch.cuda.max_memory_allocated` above the allocation before the step. With `--ranks W ...` (CPU,
gloo) each case also runs on W fresh processes with OpenCLIP's `--local-loss --gather-with-grad` at
the same global N, each rank holding N / W rows, and the table gives the highest rank's peak and every
rank's (memory only: W processes on a few cores time nothing a GPU rank would see). The memory table
gives each case's ratio to ClipLoss's peak in the same setting. Everything is reported relative to
ClipLoss measured in the same run, and `auto / best` compares auto with the faster of fused and eager
(by their medians). In one process, each ratio also comes paired (wall clock, and CPU time): the
geometric mean over rounds of the two cases' times in the same round, with its 95% interval, which
leaves out the drift between rounds (with `--processes`, the geometric mean over the processes of each
one's ratio to its own ClipLoss). The report names the
machine (CPU model and family from /proc/cpuinfo, cores, GPU), auto's choices, and the load average
before and after the run, which on a shared machine says how far to trust the times.

With `--processes K`, each path runs alone in K fresh processes (paths alternating, ClipLoss
measured in each), as a user's run would meet it: one process, one path, `auto` deciding once.
Two processes running the same code differ by up to about 10% on a 2-core machine (their memory
is laid out anew; every N x N buffer is fresh pages), more than the paths differ, so a single
process per path cannot rank them. Each row then gives the median over the K processes of their
ratios to ClipLoss (each process's own ClipLoss) with the lowest and highest, and `auto / best`
compares the medians.

Discovery cases (`--discoveries NAME ...`, names of `open_clip_adacl.clone_signals.SIGNALS`): each adds a
case `adaclw/<name>`, the `adaclw` loss with `discovery=<name>` and its other options at their defaults
(docs/losses.md), timed in the same rounds beside ClipLoss (and beside AdaCL on the paths of `--paths`;
`--paths` with no value times ClipLoss and the discovery cases only). Each step passes what the trainer
passes on a step it does not log (the loss's `wants_stats` off: `adaclw` then leaves out its stats, which cost
passes over the N x N logits; the trainer logs one step in `--log-every-n-steps`): `sample_index=` 0..N-1 and
the captions' token ids (`text_tokens=`), here synthesized
(`make_tokens`): 77-token captions over CLIP's vocabulary of 49408 (start 49406, end 49407, padding 0) of
8 to 30 words drawn from a Zipf law (common words shared by many captions), the eight captions of a
trained-like cluster sharing a template of which each replaces a fifth of the words; and every step,
the warm-up one included, ends with the loss's `commit()` inside the timed span, as the trainer's
step, so the persistence signals read and write their pair memory: the same N sample ids every step,
each pair of the batch remembered from the step before (a small dataset's steady state; with a large
one most pairs would be new). The selection passes run on `auto` in these cases. Timing only (not with
`--memory` or `--processes`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from training.trainer.timing import paired_ratio, ratio_text

MODES = ("literal", "calibrated")
# Selection path -> OPEN_CLIP_ADACL_FUSED.
PATHS = {"auto": "auto", "fused": "on", "eager": "off"}
# Input kind -> logit_scale.
INPUTS = {"random": 14.3, "trained-50": 50.0, "trained-100": 100.0}
# Squared norms of the trained-like features' parts: shared direction, cluster, sample, caption noise
# (cosines: negatives 0.14, a sibling's caption 0.31, the own caption 0.35).
TRAINED_PARTS = (0.15, 0.16, 0.04, 2.51)
CLUSTER_SIZE = 8
# How a peak is measured, by device (see the docstring).
MEMORY_MEASURE = {
    "cpu": "peak resident set (VmHWM) over the resident set once the inputs exist",
    "cuda": "torch.cuda.max_memory_allocated over the allocation before the steps",
}
# The fused passes compile for matrices from 2048 x 2048 entries (open_clip_adacl.fused.AUTO_MIN_ELEMENTS).
COMPILE_WARMUP_SIZE = 2048


def case_name(mode: str, path: str) -> str:
    return f"adacl-{mode}/{path}"


def cases(paths: Sequence[str], discoveries: Sequence[str] = ()) -> List[str]:
    return (
        ["clip"]
        + [case_name(mode, path) for mode in MODES for path in paths]
        + [discovery_case(name) for name in discoveries]
    )


def discovery_case(name: str) -> str:
    return f"adaclw/{name}"


def discovery_of(case: str) -> Optional[str]:
    """The discovery of an `adaclw/<name>` case; None for any other case."""
    loss, _, name = case.partition("/")
    return name if loss == "adaclw" else None


def build_loss(case: str, rank: int = 0, world_size: int = 1):
    """`case`'s loss; on several ranks with OpenCLIP's `--local-loss --gather-with-grad`."""
    import open_clip

    from open_clip_adacl import DistributedSetup, create_loss

    local = world_size > 1
    if case == "clip":
        return open_clip.ClipLoss(local_loss=local, gather_with_grad=local, rank=rank, world_size=world_size)
    dist = DistributedSetup(rank=rank, world_size=world_size, local_loss=local, gather_with_grad=local)
    if discovery_of(case) is not None:
        loss_fn = create_loss("adaclw", discovery=discovery_of(case), dist=dist)
        loss_fn.wants_stats = False  # a step the trainer does not log (all but one in --log-every-n-steps)
        return loss_fn
    return create_loss(
        "adacl",
        mode=case.split("/")[0].split("-", 1)[1],
        dist=dist,
    )


def make_features(num: int, dim: int, device: str, inputs: str = "random", seed: int = 0):
    """(image, text) unit features of the `inputs` kind (see the module's docstring)."""
    generator = torch.Generator().manual_seed(seed)

    def unit(rows: int) -> torch.Tensor:
        return F.normalize(torch.randn(rows, dim, generator=generator), dim=-1)

    if inputs == "random":
        image = unit(num)
        return image.to(device), F.normalize(image + unit(num), dim=-1).to(device)
    shared, cluster, sample, caption = (part**0.5 for part in TRAINED_PARTS)
    clusters = unit(-(-num // CLUSTER_SIZE)).repeat_interleave(CLUSTER_SIZE, dim=0)[:num]
    image = shared * unit(1) + cluster * clusters + sample * unit(num)
    text = image + caption * unit(num)
    return F.normalize(image, dim=-1).to(device), F.normalize(text, dim=-1).to(device)


# The synthesized captions (`make_tokens`): CLIP's context length and vocabulary, its start, end and pad tokens.
CONTEXT_LENGTH, VOCABULARY_SIZE, START_TOKEN, END_TOKEN, PAD = 77, 49408, 49406, 49407, 0
CAPTION_WORDS = (8, 30)  # a cluster's template has this many words at least and at most
REPLACED_SHARE = 0.2  # each caption replaces this share of its cluster's template words (at least one)


def make_tokens(num: int, seed: int = 0) -> torch.Tensor:
    """num x 77 int64 token ids (see the module's docstring): captions of a trained-like cluster (rows
    CLUSTER_SIZE at a time, as `make_features` groups them) share most of their words."""
    generator = torch.Generator().manual_seed(seed)
    words = VOCABULARY_SIZE - 3  # ids 1..49405: neither padding nor the start and end tokens
    zipf = 1.0 / torch.arange(1, words + 1, dtype=torch.float64)

    def draw(count: int) -> torch.Tensor:
        return torch.multinomial(zipf, count, replacement=True, generator=generator) + 1

    tokens = torch.full((num, CONTEXT_LENGTH), PAD, dtype=torch.long)
    tokens[:, 0] = START_TOKEN
    for first in range(0, num, CLUSTER_SIZE):
        length = int(torch.randint(CAPTION_WORDS[0], CAPTION_WORDS[1] + 1, (1,), generator=generator))
        template = draw(length)
        replaced = max(1, round(REPLACED_SHARE * length))
        for row in range(first, min(first + CLUSTER_SIZE, num)):
            caption = template.clone()
            caption[torch.randperm(length, generator=generator)[:replaced]] = draw(replaced)
            tokens[row, 1 : length + 1] = caption
            tokens[row, length + 1] = END_TOKEN
    return tokens


def train_step(loss_fn, image: torch.Tensor, text: torch.Tensor, scale: float = INPUTS["random"]) -> None:
    image = image.clone().requires_grad_()
    text = text.clone().requires_grad_()
    loss_fn(image, text, torch.tensor(scale, device=image.device, requires_grad=True)).backward()


def run_case(
    case: str,
    loss_fn,
    image: torch.Tensor,
    text: torch.Tensor,
    scale: float,
    tokens: Optional[torch.Tensor] = None,
) -> None:
    """One training step of `case`, its selection path set for the step; a discovery case takes the captions'
    `tokens` and the sample ids as the trainer passes them, and commits its state after the step."""
    if discovery_of(case) is not None:
        os.environ["OPEN_CLIP_ADACL_FUSED"] = PATHS["auto"]
        image = image.clone().requires_grad_()
        text = text.clone().requires_grad_()
        sample_index = torch.arange(image.shape[0], device=image.device)
        scale_tensor = torch.tensor(scale, device=image.device, requires_grad=True)
        loss_fn(image, text, scale_tensor, text_tokens=tokens, sample_index=sample_index).backward()
        loss_fn.commit()
        return
    if case != "clip":
        os.environ["OPEN_CLIP_ADACL_FUSED"] = PATHS[case.split("/")[1]]
    train_step(loss_fn, image, text, scale)


def rotated(items: Sequence[str], round_index: int) -> List[str]:
    """`items` starting from the round's own: each goes first in turn, so that order hits all alike."""
    shift = round_index % len(items)
    return list(items[shift:]) + list(items[:shift])


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_cases(
    num: int,
    dim: int,
    device: str,
    repeats: int,
    inputs: str,
    paths: Sequence[str],
    discoveries: Sequence[str] = (),
) -> Tuple[Dict[str, List[float]], Dict[str, List[float]]]:
    """Wall-clock seconds and CPU seconds (this process, all threads) of each round's forward+backward of
    each case, rounds interleaved (in an order rotated each round) so drift and order hit all alike. On a
    machine shared with other jobs the CPU time moves less than the wall clock: it leaves out the time the
    process waits for a core."""
    image, text = make_features(num, dim, device, inputs)
    tokens = make_tokens(num).to(device) if discoveries else None
    scale = INPUTS[inputs]
    names = cases(paths, discoveries)
    losses = {case: build_loss(case) for case in names}
    for case, loss_fn in losses.items():
        run_case(case, loss_fn, image, text, scale, tokens)
    seconds: Dict[str, List[float]] = {case: [] for case in names}
    cpu_seconds: Dict[str, List[float]] = {case: [] for case in names}
    for round_index in range(repeats):
        for case in rotated(names, round_index):
            _synchronize(device)
            start, cpu_start = time.perf_counter(), time.process_time()
            run_case(case, losses[case], image, text, scale, tokens)
            _synchronize(device)
            seconds[case].append(time.perf_counter() - start)
            cpu_seconds[case].append(time.process_time() - cpu_start)
    return seconds, cpu_seconds


def _resident_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_memory_worker(
    case: str, num: int, dim: int, device: str, inputs: str, rank: int = 0, world_size: int = 1
) -> int:
    """Peak bytes of two training steps above what the inputs already take (this process only). On several
    ranks (the process group from torchrun's environment variables) this rank's rows of the global batch."""
    if world_size > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", rank=rank, world_size=world_size)

    def own_rows(features: Tuple[torch.Tensor, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        rows = features[0].shape[0] // world_size
        return tuple(part[rank * rows : (rank + 1) * rows].clone() for part in features)

    scale = INPUTS[inputs]
    warmup_image, warmup_text = own_rows(make_features(min(num, COMPILE_WARMUP_SIZE), dim, device, inputs))
    run_case(case, build_loss(case, rank, world_size), warmup_image, warmup_text, scale)  # compiles
    del warmup_image, warmup_text
    image, text = own_rows(make_features(num, dim, device, inputs))
    loss_fn = build_loss(case, rank, world_size)
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(2):
            run_case(case, loss_fn, image, text, scale)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    base = _resident_bytes("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # resets the peak (VmHWM) to the current resident set
    for _ in range(2):
        run_case(case, loss_fn, image, text, scale)
    return _resident_bytes("VmHWM") - base


def measure_peak_memory(
    case: str, num: int, dim: int, device: str, threads: int, inputs: str, world_size: int = 1
) -> List[int]:
    """`peak_memory_worker` in fresh interpreters, so no earlier case's memory counts: one per rank (gloo, on
    this machine, each with threads / ranks torch threads); each rank's peak."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--memory-worker",
        case,
        "--sizes",
        str(num),
        "--dim",
        str(dim),
        "--device",
        device,
        "--threads",
        str(max(1, threads // world_size)),
        "--inputs",
        inputs,
    ]
    environment = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": str(world_size),
    }
    workers = [
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**environment, "RANK": str(rank)}
        )
        for rank in range(world_size)
    ]
    outputs = [worker.communicate() for worker in workers]
    for worker, (_, errors) in zip(workers, outputs):
        if worker.returncode:
            raise SystemExit(
                f"error: the memory measurement of {case} at N = {num} on {world_size} rank(s) failed "
                f"(exit status {worker.returncode}): {errors.strip().splitlines()[-1:]}"
            )
    return [int(json.loads(out.strip().splitlines()[-1])["peak_bytes"]) for out, _ in outputs]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def memory_rows(
    sizes: Sequence[int],
    dim: int,
    device: str,
    threads: int,
    inputs_kinds: Sequence[str],
    paths: Sequence[str],
    ranks: Sequence[int],
) -> List[dict]:
    """Peak memory of each case (each rank's, on several ranks) and its ratio to ClipLoss's in the same setting."""
    rows = []
    for inputs in inputs_kinds:
        for num in sizes:
            for world_size in [1, *ranks]:
                peaks = {
                    case: measure_peak_memory(case, num, dim, device, threads, inputs, world_size)
                    for case in cases(paths)
                }
                for case, per_rank in peaks.items():
                    loss, _, path = case.partition("/")
                    # Tiny batches can reuse freed heap memory, leaving nothing to compare.
                    clip = max(peaks["clip"])
                    rows.append(
                        {
                            "inputs": inputs,
                            "N": num,
                            "ranks": world_size,
                            "loss": loss,
                            "path": path or "-",
                            "peak_bytes": max(per_rank),
                            "rank_peak_bytes": per_rank,
                            "memory_ratio": max(per_rank) / clip if clip > 0 else float("nan"),
                        }
                    )
    return rows


def memory_table(rows: Sequence[dict]) -> str:
    """One row per input kind, N, ranks, loss and path: the peak (on several ranks the highest rank's, then each
    rank's) and its ratio to ClipLoss's, with the extra peak in percent."""
    lines = [
        "| inputs | N | ranks | loss | path | peak memory (MiB) | each rank (MiB) | memory ratio | extra peak |",
        "|---|---:|---:|---|---|---:|---|---:|---:|",
    ]
    for row in rows:
        each = " / ".join(f"{peak / 2**20:.0f}" for peak in row["rank_peak_bytes"]) if row["ranks"] > 1 else "-"
        lines.append(
            f"| {row['inputs']} | {row['N']} | {row['ranks']} | {row['loss']} | {row['path']} | "
            f"{row['peak_bytes'] / 2**20:.1f} | {each} | {row['memory_ratio']:.3f} | "
            f"{(row['memory_ratio'] - 1) * 100:+.1f}% |"
        )
    return "\n".join(lines)


def markdown_table(rows: Sequence[dict]) -> str:
    """One row per input kind, N, loss and path; `auto / best`: auto's time over the faster of fused and
    eager in that mode (wall clock, and CPU time)."""
    spread = any("processes" in row for row in rows)
    paired = any("paired_ratio" in row for row in rows)
    paired_cpu = any("paired_cpu_ratio" in row for row in rows)
    lines = [
        "| inputs | N | loss | path | time (ms) | time ratio | "
        + ("ratio range | " if spread else "")
        + ("paired ratio (95%) | " if paired else "")
        + "CPU time (ms) | CPU time ratio | "
        + ("CPU ratio range | " if spread else "")
        + ("paired CPU time ratio (95%) | " if paired_cpu else "")
        + "auto / best | "
        + ("paired auto / best (95%) | " if paired else "")
        + "auto / best, CPU time |",
        "|---|---:|---|---|---:|---:|"
        + ("---:|" if spread else "")
        + ("---:|" if paired else "")
        + "---:|---:|"
        + ("---:|" if spread else "")
        + ("---:|" if paired_cpu else "")
        + "---:|"
        + ("---:|" if paired else "")
        + "---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['inputs']} | {row['N']} | {row['loss']} | {row['path']} | {row['seconds'] * 1e3:.1f} | "
            f"{row['time_ratio']:.3f} | "
            + (f"{_range(row.get('time_ratio_range'))} | " if spread else "")
            + (f"{ratio_text(row.get('paired_ratio'))} | " if paired else "")
            + f"{row['cpu_seconds'] * 1e3:.1f} | {row['cpu_ratio']:.3f} | "
            + (f"{_range(row.get('cpu_ratio_range'))} | " if spread else "")
            + (f"{ratio_text(row.get('paired_cpu_ratio'))} | " if paired_cpu else "")
            + f"{_optional(row.get('auto_over_best'))} | "
            + (f"{_against(row.get('paired_auto_over_best'), row.get('best_path'))} | " if paired else "")
            + f"{_optional(row.get('auto_over_best_cpu'))} |"
        )
    return "\n".join(lines)


def _against(ratio: Optional[Tuple[float, float, float]], path: Optional[str]) -> str:
    return ratio_text(ratio) + (f" vs {path}" if ratio is not None else "")


def _range(bounds: Optional[Tuple[float, float]]) -> str:
    return "-" if bounds is None or bounds[0] == bounds[1] == 1.0 else f"{bounds[0]:.3f}-{bounds[1]:.3f}"


def _optional(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3f}"


def best_path(seconds: Dict[str, float], mode: str) -> Optional[str]:
    """The faster of fused and eager in `mode` by their median times (None unless both were measured)."""
    times = {path: seconds.get(case_name(mode, path)) for path in ("fused", "eager")}
    return None if None in times.values() else min(times, key=times.__getitem__)


def auto_over_best(seconds: Dict[str, float], mode: str) -> Optional[float]:
    """Auto's time over the faster of fused and eager in `mode` (None unless all three were measured)."""
    best, auto = best_path(seconds, mode), seconds.get(case_name(mode, "auto"))
    return None if best is None or auto is None else auto / seconds[case_name(mode, best)]


def benchmark_in_processes(args: argparse.Namespace) -> Tuple[List[dict], List[dict]]:
    """`benchmark` with each path in `args.processes` fresh processes of its own (see the module's docstring):
    rows with the median over the processes and their range; and the decisions of every `auto` process."""
    runs: Dict[str, List[dict]] = {path: [] for path in args.paths}
    choices: List[dict] = []
    base = [
        sys.executable,
        os.path.abspath(__file__),
        "--sizes",
        *map(str, args.sizes),
        "--dim",
        str(args.dim),
        "--device",
        args.device,
        "--repeats",
        str(args.repeats),
        "--threads",
        str(args.threads),
        "--inputs",
        *args.inputs,
    ]
    for index in range(args.processes):
        for path in rotated(args.paths, index):
            output = Path(args.scratch) / f"{path}-{index}.json"
            subprocess.run(base + ["--paths", path, "--json", str(output)], check=True, capture_output=True)
            payload = json.loads(output.read_text())
            runs[path].append(payload)
            choices += payload["auto_choices"]
            print(f"process {index + 1}/{args.processes}, path {path}: done", file=sys.stderr, flush=True)
    rows = []
    for path in args.paths:
        for position, row in enumerate(runs[path][0]["rows"]):
            if row["loss"] == "clip" and path != args.paths[0]:
                continue  # one ClipLoss row: the first path's processes
            samples = [payload["rows"][position] for payload in runs[path]]
            # A process's own pairs by round say nothing of the others: the row pairs each process's ratio with
            # its own ClipLoss instead (the geometric mean over the processes and its 95% interval).
            merged = {key: value for key, value in row.items() if not key.startswith(("paired_", "best_path"))}
            merged["processes"] = len(samples)
            for field in ("seconds", "time_ratio", "cpu_seconds", "cpu_ratio"):
                values = [sample[field] for sample in samples]
                merged[field] = statistics.median(values)
                merged[field + "_range"] = (min(values), max(values))
            if row["loss"] != "clip":
                ratios = [sample["time_ratio"] for sample in samples]
                merged["paired_ratio"] = paired_ratio(ratios, [1.0] * len(ratios))
            rows.append(merged)
    order = {case: index for index, case in enumerate(cases(args.paths))}
    rows.sort(
        key=lambda row: (row["inputs"], row["N"], order["/".join(filter(None, (row["loss"], row["path"].strip("-"))))])
    )
    for row in rows:
        if row["path"] == "auto":
            medians = {(r["loss"], r["path"]): r for r in rows if r["inputs"] == row["inputs"] and r["N"] == row["N"]}
            other = [medians.get((row["loss"], path)) for path in ("fused", "eager")]
            if None not in other:
                row["auto_over_best"] = row["time_ratio"] / min(r["time_ratio"] for r in other)
                row["auto_over_best_cpu"] = row["cpu_ratio"] / min(r["cpu_ratio"] for r in other)
    return rows, choices


def benchmark(
    sizes: Sequence[int],
    dim: int,
    device: str,
    repeats: int,
    inputs_kinds: Sequence[str],
    paths: Sequence[str],
    discoveries: Sequence[str] = (),
) -> List[dict]:
    rows = []
    for inputs in inputs_kinds:
        for num in sizes:
            rounds, cpu_rounds = time_cases(num, dim, device, repeats, inputs, paths, discoveries)
            seconds = {case: statistics.median(values) for case, values in rounds.items()}
            cpu_seconds = {case: statistics.median(values) for case, values in cpu_rounds.items()}
            for case in seconds:
                loss, _, path = (case, "", "") if discovery_of(case) is not None else case.partition("/")
                mode = loss.partition("-")[2]  # "" for clip
                row = {
                    "inputs": inputs,
                    "N": num,
                    "loss": loss,
                    "path": path or "-",
                    "seconds": seconds[case],
                    "time_ratio": seconds[case] / seconds["clip"],
                    "cpu_seconds": cpu_seconds[case],
                    "cpu_ratio": cpu_seconds[case] / cpu_seconds["clip"],
                    "auto_over_best": auto_over_best(seconds, mode) if path == "auto" else None,
                    "auto_over_best_cpu": auto_over_best(cpu_seconds, mode) if path == "auto" else None,
                }
                if case != "clip":
                    row["paired_ratio"] = paired_ratio(rounds[case], rounds["clip"])
                    row["paired_cpu_ratio"] = paired_ratio(cpu_rounds[case], cpu_rounds["clip"])
                    best = best_path(seconds, mode) if path == "auto" else None
                    if best is not None:
                        row.update(
                            best_path=best,
                            paired_auto_over_best=paired_ratio(rounds[case], rounds[case_name(mode, best)]),
                        )
                rows.append(row)
    return rows


def combined_table(step_json: str, loss_json: str) -> str:
    """One table of a training-step run (scripts/bench_step.py) and a loss run: time and ratio to clip."""
    try:
        with open(step_json) as step_file, open(loss_json) as loss_file:
            step, loss = json.load(step_file), json.load(loss_file)
        lines = ["| part | inputs | N | loss | path | time (ms) | ratio to clip |", "|---|---|---:|---|---|---:|---:|"]
        lines += [
            f"| training step, {row['model']} | - | {row['batch_size']} | {row['loss']} | "
            f"{'auto' if row['loss'] != 'clip' else '-'} | {row['seconds'] * 1e3:.1f} | {row['ratio']:.3f} |"
            for row in step["rows"]
        ]
        lines += [
            f"| loss | {row['inputs']} | {row['N']} | {row['loss']} | {row['path']} | "
            f"{row['seconds'] * 1e3:.1f} | {row['time_ratio']:.3f} |"
            for row in loss["rows"]
        ]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(
            f"error: cannot combine {step_json} and {loss_json} ({type(error).__name__}: {error}); "
            f"pass a bench_step.py --output and a bench_loss.py --json file"
        )
    return "\n".join(lines) + f"\n\n{step['settings']}\n\n{loss['settings']}"


def auto_choices(decisions: Optional[List[dict]] = None) -> str:
    """What `auto` chose (in this process unless `decisions` are given), one line per shape and process (its
    timings of the selection passes)."""
    from open_clip_adacl import fused

    return "\n".join(
        f"- {d['passes']} passes, {d['rows']} x {d['cols']} {d['dtype']} on {d['device']}: {d['choice']} "
        f"(fused {'-' if d['fused_ms'] is None else format(d['fused_ms'], '.1f')} ms, eager {d['eager_ms']:.1f} ms)"
        for d in (fused.decisions() if decisions is None else decisions)
    )


def describe_machine(device: str, threads: int) -> str:
    """CPU model (with family and model numbers), cores, torch threads, the GPU when measuring on one, and the
    code version measured."""
    from training.trainer.run_folder.provenance import machine_info

    info = machine_info(device)
    return (
        f"CPU {info['cpu']}, {info['cores']} cores, {threads} torch thread(s){info.get('gpu', '')}; code {info['code']}"
    )


def load_average() -> str:
    return ", ".join(f"{value:.1f}" for value in os.getloadavg())


def parse_args(argv=None) -> argparse.Namespace:
    from open_clip_adacl.clone_signals import SIGNALS
    from training.trainer.launch.tool_flags import add_trainer_flags

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 8192], help="global batch sizes N")
    parser.add_argument("--dim", type=int, default=512, help="feature width D")
    add_trainer_flags(parser, ("device",), defaults={"device": "cpu"}, notes={"device": "Here: cpu or cuda."})
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per case (median reported)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch CPU threads")
    parser.add_argument(
        "--inputs",
        nargs="+",
        choices=tuple(INPUTS),
        default=list(INPUTS),
        help="input kinds (see the docstring; default all)",
    )
    parser.add_argument(
        "--paths",
        nargs="*",
        choices=tuple(PATHS),
        default=list(PATHS),
        help="AdaCL's selection paths (OPEN_CLIP_ADACL_FUSED auto/on/off; default all three; none: no AdaCL case, "
        "with --discoveries)",
    )
    parser.add_argument(
        "--discoveries",
        nargs="+",
        choices=tuple(SIGNALS),
        default=[],
        metavar="NAME",
        help="also time adaclw with each of these discoveries (case adaclw/NAME; see the docstring): "
        + ", ".join(SIGNALS),
    )
    parser.add_argument("--memory", action="store_true", help="also measure peak memory (a fresh process per case)")
    parser.add_argument("--memory-only", action="store_true", help="measure peak memory only, no timed rounds")
    parser.add_argument(
        "--ranks",
        type=int,
        nargs="+",
        default=[],
        help="with --memory: also each rank's peak on this many gloo ranks (CPU), OpenCLIP's "
        "--local-loss --gather-with-grad at the same global N (see the docstring)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=0,
        help="run each path alone in this many fresh processes and report the median and range of "
        "their ratios (see the docstring; 0: every path in this one process)",
    )
    parser.add_argument("--output", help="also write the report to this file")
    parser.add_argument("--json", help="also write the settings, rows and auto's choices as JSON to this file")
    parser.add_argument(
        "--combine",
        nargs=2,
        metavar=("STEP_JSON", "LOSS_JSON"),
        help="print one table of a bench_step.py --output and a bench_loss.py --json, nothing else",
    )
    parser.add_argument("--memory-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1 or min(args.sizes) < 3 or args.dim < 1 or args.threads < 1 or args.processes < 0:
        parser.error(
            "--repeats, --dim and --threads must be at least 1, --processes at least 0 and every --sizes "
            "value at least 3"
        )
    args.memory = args.memory or args.memory_only
    if not args.paths and not args.discoveries and not args.combine:
        parser.error("--paths without a value times no AdaCL case: add --discoveries NAME ...")
    if args.discoveries and (args.memory or args.processes):
        parser.error("--discoveries are timed in one process only: not with --memory, --memory-only or --processes")
    if args.processes and args.memory:
        parser.error("--memory runs its own fresh process per case; measure it without --processes")
    if args.ranks and not args.memory:
        parser.error("--ranks measures peak memory per rank: add --memory (or --memory-only)")
    if any(world_size < 2 or any(num % world_size for num in args.sizes) for world_size in args.ranks) or (
        args.ranks and args.device != "cpu"
    ):
        parser.error(
            "every --ranks value must be at least 2 and divide every --sizes value, on --device cpu "
            "(the ranks are gloo processes on this machine)"
        )
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.combine:
        print(combined_table(*args.combine))
        return
    torch.set_num_threads(args.threads)
    if args.memory_worker:
        peak = peak_memory_worker(
            args.memory_worker,
            args.sizes[0],
            args.dim,
            args.device,
            args.inputs[0],
            int(os.environ.get("RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)),
        )
        print(json.dumps({"peak_bytes": peak}))
        return
    load_before = load_average()
    if args.processes:
        import tempfile

        with tempfile.TemporaryDirectory() as scratch:
            args.scratch = scratch
            rows, decisions = benchmark_in_processes(args)
        how = (
            f"each path alone in {args.processes} fresh processes (median of {args.repeats} rounds in each; "
            f"the row: the median over the processes and their range); ratios against ClipLoss in the same process"
        )
    elif args.memory_only:
        rows, decisions, how = [], None, "peak memory only"
    else:
        rows = benchmark(args.sizes, args.dim, args.device, args.repeats, args.inputs, args.paths, args.discoveries)
        decisions, how = None, f"median of {args.repeats} rounds; ratios against ClipLoss in the same run"
    peaks = (
        memory_rows(args.sizes, args.dim, args.device, args.threads, args.inputs, args.paths, args.ranks)
        if args.memory
        else []
    )
    report = (
        f"Loss forward+backward, D={args.dim}, torch {torch.__version__}, "
        f"{describe_machine(args.device, args.threads)}; load average {load_before} before, {load_average()} "
        f"after; {how}.\n\n"
    )
    if rows:
        report += (
            f"{markdown_table(rows)}\n\nauto's choices (its own timing of the selection passes):\n"
            f"{auto_choices(decisions) or '- none (auto not run, or no AdaCL step)'}\n"
        )
    if peaks:
        report += ("\n" if rows else "") + (
            f"Peak memory of two steps above the inputs, each case in fresh processes ({MEMORY_MEASURE[args.device]}); "
            f"ranks > 1: OpenCLIP's --local-loss --gather-with-grad on gloo, the highest rank's peak; ratios against "
            f"ClipLoss's peak in the same setting:\n\n{memory_table(peaks)}\n"
        )
    print(report)
    from training.discover.store import write_atomically

    if args.output:
        write_atomically(Path(args.output), report)
    if args.json:
        from open_clip_adacl import fused

        payload = {
            "settings": report.split("\n\n")[0],
            "rows": rows,
            "memory_rows": peaks,
            "auto_choices": fused.decisions() if decisions is None else decisions,
        }
        write_atomically(Path(args.json), json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
