"""Samples/s of our webdataset pipeline (`training.trainer.data.build_train_data`) against OpenCLIP's
(`open_clip_train.data.get_wds_dataset`) on the same shards, workers, batch size and transforms.

    python scripts/bench_data.py                          # generated img2dataset-like shards, cached
    python scripts/bench_data.py --shards '/data/cc3m/train/{00000..00031}.tar' --num-samples 320000 --workers 8

Shards: by default --num-shards tars of --shard-size samples, each a 256 x 256 JPEG (what
img2dataset --image_size 256 writes), a caption and a json key, generated once and cached under
--shard-cache. Both pipelines apply the same open_clip training transform (RandomResizedCrop to the
model's image size, normalisation) and tokenizer, and run one training epoch of --num-samples
samples in a fresh process each (DataLoader workers started, as in training, at the epoch's start).

OpenCLIP's tar pipeline fails with webdataset >= 0.2.96 (docs/ecosystem.md §2), so its side runs with
webdataset 0.2.86 first on PYTHONPATH, installed on first use with
`pip install --no-deps --target <shard-cache>/webdataset-0.2.86 webdataset==0.2.86`.
Rounds alternate the two pipelines; reported: the median over --repeats rounds of samples/s over
the whole epoch (worker start-up and shuffle-buffer fill included, as training sees it) and in the
steady state (from the first batch on), ours / OpenCLIP's of those, the median of each round's
ratio (the two ran back to back, so load drift on a shared machine cancels), and samples per
CPU-second of the trainer process and its workers together (what the pipeline costs, whatever
else the machine runs; on a dedicated machine with CPU-bound workers it sets the samples/s).
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List

import numpy as np

OPENCLIP_WEBDATASET = "0.2.86"  # the last release OpenCLIP 3.3.0's tar pipeline works with
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "open_clip_adacl"
IMAGE_SIDE = 256


# ---------------------------------------------------------------------------------------------
# Shards


def smooth_image(rng: np.random.Generator, side: int) -> np.ndarray:
    """A photo-like RGB image: smooth random colour fields plus mild noise (JPEG size like a photo's)."""
    coarse = rng.uniform(0, 255, (8, 8, 3))
    image = np.kron(coarse, np.ones((side // 8, side // 8, 1)))
    rows = np.linspace(0, 2 * np.pi * rng.uniform(1, 4), side)[:, None, None]
    image = image * 0.7 + 60 * np.sin(rows + rng.uniform(0, 6, 3)) + rng.normal(0, 12, (side, side, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def write_shards(directory: Path, num_shards: int, shard_size: int, seed: int = 0) -> str:
    """img2dataset-like shards 00000.tar ...: <key>.jpg, <key>.txt, <key>.json; returns the brace pattern."""
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for shard in range(num_shards):
        path = directory / f"{shard:05d}.tar"
        if path.exists():
            continue
        partial = path.with_suffix(".tar.partial")
        with tarfile.open(partial, "w") as tar:
            for row in range(shard_size):
                key = f"{shard * 10000 + row:09d}"
                buffer = io.BytesIO()
                Image.fromarray(smooth_image(rng, IMAGE_SIDE)).save(buffer, format="JPEG", quality=90)
                members = {
                    "jpg": buffer.getvalue(),
                    "txt": f"a photo of item {key} in a generated scene".encode(),
                    "json": json.dumps({"key": key, "status": "success"}).encode(),
                }
                for extension, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{extension}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        partial.rename(path)
    return str(directory / f"{{00000..{num_shards - 1:05d}}}.tar")


def openclip_webdataset(cache_dir: Path) -> Path:
    """A folder holding webdataset 0.2.86 (installed there with pip on first use)."""
    target = cache_dir / f"webdataset-{OPENCLIP_WEBDATASET}"
    if (target / "webdataset" / "__init__.py").is_file():
        return target
    print(f"installing webdataset=={OPENCLIP_WEBDATASET} into {target} (OpenCLIP's side needs it)", file=sys.stderr)
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--target",
        str(target),
        f"webdataset=={OPENCLIP_WEBDATASET}",
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(
            f"error: could not install webdataset=={OPENCLIP_WEBDATASET} (needed to run OpenCLIP's pipeline, "
            f"which fails with newer webdataset): {result.stderr.strip()[-500:]}\nInstall it yourself with "
            f"`{' '.join(command)}` or pass --shard-cache pointing at a folder that has it."
        )
    return target


# ---------------------------------------------------------------------------------------------
# One epoch of one pipeline (run in a fresh process)


def transforms(model: str):
    """The model's open_clip training transform and tokenizer (without building the model)."""
    import open_clip

    import open_clip_adacl  # noqa: F401  (our model configs)

    vision = open_clip.get_model_config(model)["vision_cfg"]
    return open_clip.image_transform(vision["image_size"], is_train=True), open_clip.get_tokenizer(model)


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have ended (the DataLoader workers)."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def measure_epoch(build_loader: Callable[[], Iterable], batch_size: int) -> Dict[str, float]:
    """Wall time of one epoch of the loader `build_loader` returns, and the CPU time it took in all processes.

    CPU time per sample does not depend on what else runs on the machine, wall time does.
    """
    cpu_before = cpu_seconds()
    loader = build_loader()
    start = time.perf_counter()
    first = None
    num_batches = 0
    for _ in loader:
        first = first or time.perf_counter()
        num_batches += 1
    end = time.perf_counter()
    del loader
    gc.collect()  # shuts down persistent workers (OpenCLIP's), so that their CPU time is counted
    cpu = cpu_seconds() - cpu_before
    return {
        "batches": num_batches,
        "seconds": end - start,
        "first_batch_seconds": first - start,
        "samples_per_second": num_batches * batch_size / (end - start),
        "steady_samples_per_second": (num_batches - 1) * batch_size / (end - first),
        "samples_per_cpu_second": num_batches * batch_size / cpu,
    }


def run_ours(args: argparse.Namespace) -> Dict[str, float]:
    from training.trainer.data import DataConfig, build_train_data

    preprocess, tokenizer = transforms(args.model)
    cfg = DataConfig(
        train_data=args.shards,
        train_num_samples=args.num_samples,
        dataset_type="webdataset",
        batch_size=args.batch_size,
        workers=args.workers,
        seed=0,
    )
    return measure_epoch(lambda: build_train_data(cfg, preprocess, tokenizer, epoch=0).dataloader, args.batch_size)


def run_openclip(args: argparse.Namespace) -> Dict[str, float]:
    import webdataset
    from open_clip_train.data import get_wds_dataset

    if webdataset.__version__ != OPENCLIP_WEBDATASET:
        raise RuntimeError(f"OpenCLIP's side imported webdataset {webdataset.__version__}, not {OPENCLIP_WEBDATASET}")
    preprocess, tokenizer = transforms(args.model)
    openclip_args = argparse.Namespace(
        train_data=args.shards,
        val_data=None,
        train_num_samples=args.num_samples,
        dataset_resampled=False,
        train_data_upsampling_factors=None,
        seed=0,
        batch_size=args.batch_size,
        workers=args.workers,
        world_size=1,
    )
    return measure_epoch(
        lambda: (
            get_wds_dataset(
                openclip_args, preprocess, is_train=True, epoch=0, floor=True, tokenizer=tokenizer
            ).dataloader
        ),
        args.batch_size,
    )


def run_pipeline(pipeline: str, args: argparse.Namespace, webdataset_dir: Path) -> Dict[str, float]:
    """One epoch of `pipeline` in a fresh interpreter; its measurements."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if pipeline == "openclip":
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(webdataset_dir), env.get("PYTHONPATH")]))
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--run",
        pipeline,
        "--shards",
        args.shards,
        "--num-samples",
        str(args.num_samples),
        "--batch-size",
        str(args.batch_size),
        "--workers",
        str(args.workers),
        "--model",
        args.model,
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"the {pipeline} pipeline failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# Driver


def benchmark(args: argparse.Namespace, webdataset_dir: Path) -> Dict[str, object]:
    rounds: Dict[str, List[Dict[str, float]]] = {"ours": [], "openclip": []}
    for _ in range(args.repeats):
        for pipeline in rounds:
            rounds[pipeline].append(run_pipeline(pipeline, args, webdataset_dir))
    summary = {}
    for pipeline, runs in rounds.items():
        if len({run["batches"] for run in runs}) != 1:
            raise RuntimeError(f"{pipeline} gave different epoch lengths: {runs}")
        summary[pipeline] = {
            key: statistics.median(run[key] for run in runs)
            for key in (
                "samples_per_second",
                "steady_samples_per_second",
                "first_batch_seconds",
                "samples_per_cpu_second",
            )
        }
        summary[pipeline]["batches"] = runs[0]["batches"]
    summary["ratio"] = summary["ours"]["samples_per_second"] / summary["openclip"]["samples_per_second"]
    # Per round, the two pipelines ran back to back: the median of those ratios discounts slow drift.
    summary["paired_ratio"] = statistics.median(
        ours["samples_per_second"] / theirs["samples_per_second"]
        for ours, theirs in zip(rounds["ours"], rounds["openclip"])
    )
    summary["steady_ratio"] = (
        summary["ours"]["steady_samples_per_second"] / summary["openclip"]["steady_samples_per_second"]
    )
    summary["cpu_ratio"] = summary["ours"]["samples_per_cpu_second"] / summary["openclip"]["samples_per_cpu_second"]
    return {"rounds": rounds, "summary": summary}


def report(args: argparse.Namespace, summary: Dict[str, Dict[str, float]]) -> str:
    lines = [
        f"Data pipeline, {args.model} training transform, batch {args.batch_size}, {args.workers} worker(s), "
        f"{args.num_samples} samples per epoch from {args.shards}; median of {args.repeats} alternating rounds.",
        "",
        "| pipeline | batches | samples/s (epoch) | samples/s (after 1st batch) | 1st batch (s) | "
        "samples per CPU-second |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for pipeline, name in (
        ("ours", "training.trainer.data.build_train_data"),
        ("openclip", f"open_clip_train get_wds_dataset (webdataset {OPENCLIP_WEBDATASET})"),
    ):
        row = summary[pipeline]
        lines.append(
            f"| {name} | {row['batches']} | {row['samples_per_second']:.1f} | "
            f"{row['steady_samples_per_second']:.1f} | {row['first_batch_seconds']:.2f} | "
            f"{row['samples_per_cpu_second']:.1f} |"
        )
    lines += [
        "",
        f"ratio ours / OpenCLIP: {summary['ratio']:.3f} (epoch), {summary['steady_ratio']:.3f} "
        f"(after the first batch), {summary['paired_ratio']:.3f} (median of the rounds' epoch ratios), "
        f"{summary['cpu_ratio']:.3f} (samples per CPU-second, all processes)",
    ]
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    from training.trainer.launch.tool_flags import add_trainer_flags

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", help="brace pattern of existing shards (default: generated ones)")
    parser.add_argument("--num-shards", type=int, default=8, help="generated shards")
    parser.add_argument("--shard-size", type=int, default=512, help="samples per generated shard")
    parser.add_argument(
        "--num-samples",
        type=int,
        default=None,
        help="samples per epoch (default: all generated samples, rounded to batch x workers)",
    )
    add_trainer_flags(
        parser.add_argument_group("the trainer's flags"),
        ("batch_size", "workers", "model"),
        defaults={"batch_size": 64, "workers": 2, "model": "ViT-B-32"},
        notes={"model": "Here: whose image size and tokenizer to use."},
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds per pipeline (median reported)")
    parser.add_argument(
        "--shard-cache",
        dest="cache_dir",
        type=Path,
        default=DEFAULT_CACHE,
        help="where generated shards and webdataset 0.2.86 are kept",
    )
    parser.add_argument("--output", help="also write the measurements as JSON to this file")
    parser.add_argument("--run", choices=("ours", "openclip"), help=argparse.SUPPRESS)  # one epoch, in a subprocess
    args = parser.parse_args(argv)
    if args.shards is None and args.run is None:
        shard_dir = args.cache_dir / f"bench-shards-{args.num_shards}x{args.shard_size}"
        args.shards = write_shards(shard_dir, args.num_shards, args.shard_size)
        if args.num_samples is None:
            per_epoch = args.batch_size * max(1, args.workers)
            args.num_samples = args.num_shards * args.shard_size // per_epoch * per_epoch
    if args.num_samples is None:
        parser.error("--num-samples is required with --shards")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.run is not None:
        print(json.dumps(run_ours(args) if args.run == "ours" else run_openclip(args)))
        return
    webdataset_dir = openclip_webdataset(args.cache_dir)
    result = benchmark(args, webdataset_dir)
    print(report(args, result["summary"]))
    if args.output:
        with open(args.output, "w") as handle:
            json.dump({"settings": vars(args) | {"cache_dir": str(args.cache_dir)}, **result}, handle, indent=1)


if __name__ == "__main__":
    main()
