"""`python -m training.benchmark`: the same tiny model trained with each loss over several seeds, one report.

Every loss variant trains the same model under the same budget, each final model is evaluated
the same way, and the numbers go into one Markdown report with a plot and a per-run CSV.

    python -m training.benchmark --quick                   # 2-core CPU, under 20 minutes
    python -m training.benchmark --full --jobs 4           # a GPU: more data, more steps
    python -m training.benchmark --quick --losses clip,adacl:mode=literal,adacl:calibrated --seeds 0,1,2

Steps:
1. Demo data (`training.scenes.write_demo_dataset`) with a fixed data seed, written once into
   --data-dir and reused while its manifest matches the budget.
2. For every (loss variant, seed) one job, run as its own process (`--jobs` at a time, each with
   an equal share of the CPU threads; its output goes to <output-dir>/logs/<run>.log). A job
   trains with `training.main.main(argv)` (adacl-tiny, same steps, batch, lr schedule, workers),
   then evaluates its final checkpoint: validation retrieval R@1/R@5 both ways (the trainer's
   results.jsonl), clip-benchmark zero-shot classification and retrieval on the demo's `wds/`
   sets (`training.evaluate.evaluate_dataset`, the in-process path) and clone-negative
   selection per edit type (`training.clone_selection`). It writes a JSON record; a finished
   record whose job is unchanged is reused on the next call, so an interrupted benchmark resumes.
3. Every run gets a verdict (`assess_run`): failed (crashed, or no record), nonfinite (NaN/inf
   loss or metric), collapsed (training loss pinned near ln(batch) for a softmax loss, or val
   R@1 under twice chance, docs/method.md §4b) or ok. Means and standard deviations are over the ok
   runs only; each row says how many runs were ok, and the flagged runs are listed by name.
4. Writes the Markdown report (--results-md, with the machine, the command that reproduces it,
   wall time and budget), a PNG of the main metrics next to it, and a per-run CSV; copies of
   all three, the per-variant summary CSV and the records stay under --output-dir, with
   benchmark.json, from which `--report-only` writes the report again without training.

A loss variant is `name`, `name:option=value,...` or `name:value` (the one option of `name` whose
choices hold `value`), e.g. `adacl:mode=literal` or `adacl:literal` -> `--loss adacl --adacl-mode
literal`. Several variants are joined with commas (`clip,adacl:mode=literal,eps=0.01,siglip`): a
`key=value` item continues the variant before it. A loss with a `data_size` option gets the
training data's key range automatically.
"""
from __future__ import annotations

import argparse
import csv
import importlib.metadata
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from open_clip_adacl import LossOption, get_loss_class, list_losses
from open_clip_adacl.losses import ContrastiveLoss

from training.params import loss_option_flag

DEFAULT_LOSSES = "clip,siglip,adacl:mode=literal,adacl:mode=calibrated,glofnd,fne"
BASELINE = "clip"    # the report compares every variant with this one (the first variant when absent)
TIE = 5e-4           # mean differences below this are reported as ties (the tables show 3 decimals)
TRACKING = 0.01      # a variant within this of the baseline on every metric, seed for seed, is reported so
BENCHMARK_FILE = "benchmark.json"  # in --output-dir: the variants and report context, for --report-only
MODEL = "adacl-tiny"
OK, COLLAPSED, NONFINITE, FAILED = "ok", "collapsed", "nonfinite", "failed"
# Pooled over every run of a variant: the headline of the report and the bars of the plot.
HEADLINE_METRICS = ("val/i2t_R@1", "val/t2i_R@1", "clone/overall", "train/final_loss")
PLOT_PREFIXES = ("val/", "cls/", "clone/")
PLOT_EXCLUDED = ("val/clip_loss",)
# Report sections: (title, metric-name prefix, what the numbers are).
SECTIONS = (
    ("Clone-negative selection", "clone/",
     "accuracy of preferring an image's true caption over a clone that changes one detail "
     "(`training.clone_selection`, the test scenes; chance 0.5), and `_margin`: the mean logit margin "
     "logit_scale * (cos(image, true) - cos(image, clone)), which still moves when accuracy saturates"),
    ("clip-benchmark zero-shot", ("cls/", "ret/"),
     "classification acc1 per `wds/` set, retrieval recall@k (`training.evaluate`, in process)"),
    ("Validation retrieval", "val/",
     "R@k over the val split, both directions, and OpenCLIP's CLIP val loss (the trainer's results.jsonl)"),
    ("Training", "train/", "final loss: mean of the logged step losses over the last tenth of training"),
    ("AdaCL mechanism", "adacl/",
     "from every logged step, both directions pooled: the fraction of steps that were modulated (no fallback) "
     "and on which each bound changed the closed forms, and the mean and spread (population std over steps) "
     "of the applied m1 / logit_scale, m2, the anchor similarity and the anchor's clone gap (cosine)"),
    ("Clone detection", "detect/",
     "the loss's discovery step replayed on the final model over batches of whole families of the training "
     "data (`training.clone_detection`): per `<salient>-<region>`, the precision and recall of the flagged "
     "negatives against the true one-edit siblings and the fraction of negatives flagged; `sibling_fraction` "
     "is the fraction of negatives that are siblings in those batches"),
)


# ---------------------------------------------------------------------------------------------
# Loss variants
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossVariant:
    """A registered loss and option values (as typed on the command line) for one benchmark row."""

    loss: str
    options: Tuple[Tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        """`name` or `name:key=value,...`: the row's name and, parsed back, the same variant."""
        if not self.options:
            return self.loss
        return f"{self.loss}:" + ",".join(f"{key}={value}" for key, value in self.options)

    @property
    def slug(self) -> str:
        """The label as a file-name part."""
        return re.sub(r"[^A-Za-z0-9.]+", "-", self.label).strip("-")

    def flags(self, data_size: int) -> List[str]:
        """Trainer flags: `--loss NAME`, one flag per option, and `--data-size` if the loss declares it."""
        options = {option.name: option for option in get_loss_class(self.loss).options}
        flags = ["--loss", self.loss]
        for key, value in self.options:
            flags += option_flag(self.loss, options[key], value)
        if "data_size" in options and "data_size" not in dict(self.options):
            flags += option_flag(self.loss, options["data_size"], str(data_size))
        return flags


def option_flag(loss: str, option: LossOption, value: str) -> List[str]:
    """The trainer's flag(s) for one option value; a bool is `--flag` / `--no-flag` (argparse's form)."""
    flag = loss_option_flag(loss, option)
    if option.type is bool:
        return [flag] if parse_bool(value) else ["--no-" + flag[2:]]
    return [flag, value]


def parse_bool(value: str) -> bool:
    lowered = value.lower()
    if lowered not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"{value!r} is not a boolean (true/false)")
    return lowered in ("true", "1", "yes")


def parse_loss_variant(spec: str) -> LossVariant:
    """`name`, `name:key=value,...` or `name:value` -> LossVariant; unknown names, options or values are errors."""
    name, _, rest = spec.strip().partition(":")
    get_loss_class(name)  # raises for an unregistered loss, listing the registered ones
    options = [check_option(name, item) for item in rest.split(",") if item.strip()]
    keys = [key for key, _ in options]
    duplicated = sorted({key for key in keys if keys.count(key) > 1})
    if duplicated:
        raise ValueError(f"{spec!r} sets {', '.join(duplicated)} more than once")
    return LossVariant(name, tuple(options))


def check_option(loss: str, item: str) -> Tuple[str, str]:
    """One `key=value` (or bare choice `value`) of `loss`, checked against its LossOption; returns (key, value)."""
    options = {option.name: option for option in get_loss_class(loss).options}
    key, has_value, value = (part.strip() for part in item.partition("="))
    if not has_value:  # a bare value: the option whose choices hold it
        value = key
        owners = [option.name for option in options.values() if option.choices and value in option.choices]
        if len(owners) != 1:
            raise ValueError(f"{loss}:{value}: {'no' if not owners else 'more than one'} option of {loss!r} has "
                             f"the choice {value!r}; write {loss}:<option>={value} "
                             f"(options: {', '.join(options) or 'none'})")
        key = owners[0]
    key = key.replace("-", "_")
    if key not in options:
        raise ValueError(f"loss {loss!r} has no option {key!r}; it has: {', '.join(options) or 'none'}")
    option = options[key]
    try:
        typed = parse_bool(value) if option.type is bool else option.type(value)
    except ValueError as error:
        raise ValueError(f"{loss}:{key}={value}: not a {option.type.__name__} ({error})") from None
    if option.choices and typed not in option.choices:
        raise ValueError(f"{loss}:{key}={value}: choose one of {[c for c in option.choices if c is not None]}")
    return key, value


def parse_loss_variants(text: str) -> List[LossVariant]:
    """Comma-separated variants; an item with `=` and no `:` belongs to the variant before it."""
    specs: List[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if "=" in item and ":" not in item:
            if not specs:
                raise ValueError(f"option {item!r} comes before any loss name in {text!r}")
            specs[-1] += "," + item
        else:
            specs.append(item)
    variants = [parse_loss_variant(spec) for spec in specs]
    labels = [variant.label for variant in variants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"a loss variant is listed twice in {text!r}")
    return variants


def parse_seeds(text: str) -> List[int]:
    seeds = [int(part) for part in text.split(",") if part.strip()]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds needs distinct integers, got {text!r}")
    return seeds


# ---------------------------------------------------------------------------------------------
# Budget and data
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """What every run of one benchmark shares: the data sizes and the training recipe."""

    num_train: int
    num_val: int
    num_test: int        # test scenes: clone selection and retrieval; also each classification set
    shard_size: int
    batch_size: int
    epochs: int
    lr: float
    warmup: int          # steps
    wd: float
    workers: int
    device: str
    jobs: int            # runs at a time
    log_every_n_steps: int
    precision: Optional[str] = None  # the trainer's default: fp32 on CPU, amp on CUDA
    train_args: Tuple[str, ...] = ()  # trainer flags every run gets (e.g. --train-group-size 8)
    # Fine-tuning regime: > 0 first trains one `clip` model for this many epochs at `pretrain_lr`
    # (seed PRETRAIN_SEED), then every run starts from it (--pretrained) at `lr`.
    pretrain_epochs: int = 0
    pretrain_lr: float = 2e-3

    @property
    def steps(self) -> int:
        return self.epochs * (self.num_train // self.batch_size)


# Quick: 192 steps. Measured on the 2-core CPU, shared with other work (load 3-5): 6 variants x 3 seeds
# at 2 jobs took 17.1 min, 85-146 s per run (docs/RESULTS.md); one step of adacl-tiny at batch 64 on one
# thread is ~0.22 s. Workers 0: with one core per run, a loader process only competes with the step.
QUICK = Budget(num_train=4096, num_val=512, num_test=512, shard_size=512, batch_size=64, epochs=3, lr=2e-3,
               warmup=20, wd=0.1, workers=0, device="cpu", jobs=2, log_every_n_steps=1)
# Full: a GPU; 8x the data, 4x the batch and about 12x the steps of quick (not tuned on a GPU yet).
FULL = Budget(num_train=32768, num_val=2048, num_test=1024, shard_size=2048, batch_size=256, epochs=20, lr=1e-3,
              warmup=200, wd=0.1, workers=4, device="cuda", jobs=4, log_every_n_steps=10)


PRETRAIN_SEED = 1000  # the pretraining run's seed, apart from the runs' seeds


@dataclass(frozen=True)
class BenchmarkData:
    """The demo data one benchmark trains and evaluates on."""

    root: str
    train_data: str      # shard pattern for --train-data
    val_data: str
    num_train: int
    data_size: int       # the training keys' upper bound: per-sample state banks need [0, data_size)


def prepare_data(data_dir: Path, budget: Budget, data_seed: int) -> BenchmarkData:
    """Reuse the demo data in `data_dir` if its manifest matches, else write it (atomically).

    A folder that holds anything else is never overwritten: that is an error naming it.
    """
    from synthetic_scenes.scenes import write_demo_dataset

    wanted = {"seed": data_seed, "num_samples": demo_sizes(budget)}
    manifest_path = data_dir / "manifest.json"
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if manifest_summary(manifest) != wanted:
            raise ValueError(f"{data_dir} holds other demo data ({manifest_summary(manifest)}, this budget needs "
                             f"{wanted}); pass another --data-dir or remove it")
        return data_from_manifest(data_dir, manifest)
    if data_dir.exists() and any(data_dir.iterdir()):
        raise ValueError(f"{data_dir} exists and holds no demo data manifest; pass another --data-dir")
    partial = data_dir.with_name(data_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    write_demo_dataset(partial, seed=data_seed, num_train=budget.num_train, num_val=budget.num_val,
                       num_test=budget.num_test, shard_size=budget.shard_size)
    if data_dir.exists():
        data_dir.rmdir()  # empty, checked above
    os.replace(partial, data_dir)
    return data_from_manifest(data_dir, json.loads(manifest_path.read_text()))


def demo_sizes(budget: Budget) -> Dict[str, int]:
    return {"train": budget.num_train, "val": budget.num_val, "test": budget.num_test}


def manifest_summary(manifest: Mapping[str, Any]) -> Dict[str, Any]:
    return {"seed": manifest["seed"],
            "num_samples": {split: info["num_samples"] for split, info in manifest["splits"].items()}}


def data_from_manifest(root: Path, manifest: Mapping[str, Any]) -> BenchmarkData:
    splits = manifest["splits"]
    return BenchmarkData(root=str(root), train_data=str(root / splits["train"]["data"]),
                         val_data=str(root / splits["val"]["data"]), num_train=splits["train"]["num_samples"],
                         data_size=splits["train"]["keys"][1])


# ---------------------------------------------------------------------------------------------
# Jobs: one (variant, seed) each, trained and evaluated in its own process
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunJob:
    """Everything one run needs; written as JSON for the worker process (`--run-job`)."""

    label: str
    loss: str
    options: Dict[str, str]
    seed: int
    name: str
    train_argv: List[str]
    logs_dir: str        # the trainer's --logs; the run lives in <logs_dir>/<name>
    data_root: str
    batch_size: int
    device: str
    record_path: str

    @property
    def run_dir(self) -> Path:
        return Path(self.logs_dir) / self.name


def train_argv(variant: LossVariant, seed: int, name: str, budget: Budget, data: BenchmarkData,
               logs_dir: Path, pretrained: Optional[str] = None) -> List[str]:
    """`training.main` arguments: identical for every run but for the loss flags, seed and name.

    Validation runs after the last epoch only, and only the final checkpoint is saved. With
    `pretrained`, the run fine-tunes that checkpoint.
    """
    argv = [
        "--train-data", data.train_data, "--val-data", data.val_data, "--train-num-samples", str(data.num_train),
        "--model", MODEL, *variant.flags(data.data_size),
        "--batch-size", str(budget.batch_size), "--epochs", str(budget.epochs), "--lr", str(budget.lr),
        "--warmup", str(budget.warmup), "--wd", str(budget.wd), "--workers", str(budget.workers),
        "--device", budget.device, "--seed", str(seed),
        "--val-frequency", str(budget.epochs), "--save-frequency", "0",
        "--log-every-n-steps", str(budget.log_every_n_steps), "--logs", str(logs_dir), "--name", name,
    ]
    if budget.precision:
        argv += ["--precision", budget.precision]
    if pretrained:
        argv += ["--pretrained", pretrained]
    return argv + list(budget.train_args)


def pretrain_job(budget: Budget, data: BenchmarkData, output_dir: Path) -> RunJob:
    """The fine-tuning regime's starting point: `clip` for `budget.pretrain_epochs` at `pretrain_lr`."""
    pretrain_budget = replace(budget, epochs=budget.pretrain_epochs, lr=budget.pretrain_lr)
    return make_job(LossVariant(BASELINE), PRETRAIN_SEED, pretrain_budget, data, output_dir, name_prefix="pretrain-")


def pretrained_checkpoint(job: RunJob) -> str:
    """The final checkpoint of a finished run."""
    checkpoints = sorted((job.run_dir / "checkpoints").glob("epoch_*.pt"), key=lambda path: int(path.stem[6:]))
    if not checkpoints:
        raise ValueError(f"the pretraining run {job.name} left no checkpoint; see {log_file(job)}")
    return str(checkpoints[-1])


def make_job(variant: LossVariant, seed: int, budget: Budget, data: BenchmarkData, output_dir: Path, *,
             pretrained: Optional[str] = None, name_prefix: str = "") -> RunJob:
    name = f"{name_prefix}{variant.slug}-seed{seed}"
    return RunJob(
        label=variant.label, loss=variant.loss, options=dict(variant.options), seed=seed, name=name,
        train_argv=train_argv(variant, seed, name, budget, data, output_dir / "runs", pretrained),
        logs_dir=str(output_dir / "runs"), data_root=data.root, batch_size=budget.batch_size,
        device=budget.device, record_path=str(output_dir / "records" / f"{name}.json"),
    )


def plan_jobs(variants: Sequence[LossVariant], seeds: Sequence[int], budget: Budget, data: BenchmarkData,
              output_dir: Path, pretrained: Optional[str] = None) -> List[RunJob]:
    """One job per (variant, seed), seeds outer: an interrupted benchmark has every variant's first seeds."""
    return [make_job(variant, seed, budget, data, output_dir, pretrained=pretrained)
            for seed in seeds for variant in variants]


def run_job(job: RunJob) -> Dict[str, Any]:
    """Train and evaluate one run in this process; returns its record (status ok, nonfinite or failed)."""
    from training.main import main as train_main
    from training.train import NonFiniteLossError

    record = base_record(job)
    start = time.time()
    checkpoint = None
    try:
        checkpoint = train_main(job.train_argv).checkpoint
    except NonFiniteLossError as error:
        record.update(status=NONFINITE, error=str(error))
    except Exception as error:  # the record says why, the log (this process's stderr) shows where
        traceback.print_exc()
        record.update(status=FAILED, error=f"training: {type(error).__name__}: {error}")
    record["train_seconds"] = time.time() - start
    record["metrics"].update(training_metrics(job.run_dir))
    record["val_num_samples"] = record["metrics"].pop("val/num_samples", None)
    if record["status"] == OK:
        start = time.time()
        try:
            record["metrics"].update(evaluate_run(Path(checkpoint), job))
        except Exception as error:
            traceback.print_exc()
            record.update(status=FAILED, error=f"evaluation: {type(error).__name__}: {error}")
        record["eval_seconds"] = time.time() - start
    return record


def base_record(job: RunJob) -> Dict[str, Any]:
    return {
        "label": job.label, "loss": job.loss, "options": job.options, "seed": job.seed, "name": job.name,
        "status": OK, "error": None, "batch_size": job.batch_size,
        # Softmax losses over the batch sit at ln(batch) when nothing is learned (all logits equal).
        "softmax_loss": issubclass(get_loss_class(job.loss), ContrastiveLoss),
        "train_argv": job.train_argv, "train_seconds": None, "eval_seconds": None, "wall_seconds": None,
        "val_num_samples": None, "metrics": {},
    }


def training_metrics(run_dir: Path) -> Dict[str, float]:
    """From <run>/metrics.jsonl and checkpoints/results.jsonl: final loss, logit scale, steps, val retrieval."""
    metrics: Dict[str, float] = {}
    metrics_path = run_dir / "metrics.jsonl"
    if metrics_path.is_file():
        steps = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
        steps = [record for record in steps if record["kind"] == "train"]
        if steps:
            tail = steps[-max(1, math.ceil(len(steps) / 10)):]
            metrics["train/final_loss"] = statistics.fmean(float(record["loss"]) for record in tail)
            metrics["train/logit_scale"] = float(steps[-1]["logit_scale"])
            metrics["train/steps"] = float(steps[-1]["step"])
            metrics.update(mechanism_metrics(steps))
    results_path = run_dir / "checkpoints" / "results.jsonl"
    if results_path.is_file():
        lines = [line for line in results_path.read_text().splitlines() if line.strip()]
        if lines:
            val = json.loads(lines[-1])
            for direction, short in (("image_to_text", "i2t"), ("text_to_image", "t2i")):
                for k in (1, 5):
                    metrics[f"val/{short}_R@{k}"] = float(val[f"val/{direction}_R@{k}"])
            metrics["val/clip_loss"] = float(val["val/clip_val_loss"])
            metrics["val/num_samples"] = float(val["val/num_samples"])
    return metrics


# AdaCL's per-step stats summarised per run (both directions pooled): how often each guard and bound
# changed the margins, and how much the applied margins moved (docs/adacl.md).
MECHANISM_FRACTIONS = ("modulated", "anchor_clamped", "scale_bounded", "offset_bounded")
MECHANISM_SPREADS = ("m1_over_scale", "m2", "anchor", "anchor_gap")


def mechanism_metrics(steps: Sequence[Mapping[str, Any]]) -> Dict[str, float]:
    """`adacl/<stat>` fractions of logged steps and `adacl/<stat>_mean|_std` over logged steps, for a run
    whose loss logged AdaCL's stats; {} otherwise."""
    metrics: Dict[str, float] = {}
    for name in MECHANISM_FRACTIONS + MECHANISM_SPREADS:
        values = [float(record[f"stats/{direction}/{name}"]) for record in steps for direction in ("i2t", "t2i")
                  if f"stats/{direction}/{name}" in record]
        if not values:
            continue
        if name in MECHANISM_FRACTIONS:
            metrics[f"adacl/{name}"] = statistics.fmean(values)
        else:
            metrics[f"adacl/{name}_mean"] = statistics.fmean(values)
            metrics[f"adacl/{name}_std"] = statistics.pstdev(values)
    return metrics


def evaluate_run(checkpoint: Path, job: RunJob) -> Dict[str, float]:
    """Export the final checkpoint, then clip-benchmark (in process) and clone selection on the demo sets."""
    import torch

    from evaluation.clone_detection import evaluate_clone_detection
    from evaluation.clone_selection import evaluate_clone_selection
    from evaluation.zero_shot import (CLASSIFICATION, RETRIEVAL, dataset_root, demo_datasets, evaluate_dataset,
                                      export_checkpoint, infer_task, load_model, result_path, write_result)

    device = "cuda" if job.device.startswith("cuda") and torch.cuda.is_available() else "cpu"
    model_name = export_checkpoint(checkpoint, job.run_dir / "export")
    model, preprocess, tokenizer = load_model(model_name, "none", device)
    root = Path(job.data_root)
    root_template = str(root / "benchmark" / "{dataset}")
    metrics: Dict[str, float] = {}
    for dataset in demo_datasets(root):
        set_root = dataset_root(root_template, dataset)
        task = infer_task(dataset, set_root)
        result = evaluate_dataset(model, preprocess, tokenizer, dataset, set_root, task, device=device,
                                  batch_size=job.batch_size, recall_k=(1, 5))
        write_result(result_path(job.run_dir / "eval", dataset, task), dataset, model_name, "none", task, result)
        short = dataset.split("/")[-1]
        if task == CLASSIFICATION:
            metrics[f"cls/{short}/acc1"] = float(result["acc1"])
        elif task == RETRIEVAL:
            for side in ("image", "text"):
                for k in (1, 5):
                    metrics[f"ret/{short}/{side}_R@{k}"] = float(result[f"{side}_retrieval_recall@{k}"])
    clone = evaluate_clone_selection(model, preprocess, tokenizer, root / "clone_selection", device=device,
                                     batch_size=job.batch_size, margins=True)
    metrics.update({f"clone/{name.removesuffix('_acc')}": float(value) for name, value in clone.items()})
    shards = family_shards(job)
    if shards:
        caption_key = flag_value(job.train_argv, "--caption-key", "txt")  # what the loss saw in training
        detection = evaluate_clone_detection(model, preprocess, tokenizer, shards, batch_size=job.batch_size,
                                             device=device, caption_key=caption_key)
        metrics.update({f"detect/{name}": value for name, value in detection.items()})
    return metrics


def flag_value(argv: Sequence[str], flag: str, default: str) -> str:
    """The value of `flag` in trainer arguments (the first of a comma list), or `default`."""
    argv = list(argv)
    value = argv[argv.index(flag) + 1] if flag in argv else default
    return value.split(",")[0].strip()


def family_shards(job: RunJob) -> List[str]:
    """The run's training shards when they are written in families (their samples' json has a
    `family`), for `clone_detection`; [] otherwise."""
    import braceexpand
    import webdataset as wds

    shards = list(braceexpand.braceexpand(flag_value(job.train_argv, "--train-data", "")))
    if not shards or not Path(shards[0]).is_file():
        return []
    first = next(iter(wds.WebDataset(shards[:1], shardshuffle=False).decode()), {})
    return shards if "family" in first.get("json", {}) else []


def worker_environment(jobs: int) -> Dict[str, str]:
    """The environment of a job's process: an equal share of the CPU threads each, never more than
    the caller's own OMP_NUM_THREADS (on a shared machine, more threads than free cores make every
    OpenMP barrier wait for descheduled threads: measured 2.5 s instead of 0.2 s per step)."""
    threads = max(1, (os.cpu_count() or 1) // jobs)
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        threads = min(threads, max(1, int(os.environ["OMP_NUM_THREADS"])))
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def launch_job(job: RunJob, *, jobs: int, timeout: Optional[float], reuse: bool = True) -> Dict[str, Any]:
    """Run `job` in a fresh process (`python -m training.benchmark --run-job`), output to its log file.

    A finished (status ok) record left by an earlier call for the same job is returned as it is
    (when `reuse`); otherwise the run's folder is removed first, since the trainer refuses to
    overwrite a run. A process that dies without a record (or runs past `timeout` seconds) yields
    a failed record. `wall_seconds` is the whole process, start-up included.
    """
    record_path = Path(job.record_path)
    job_path = record_path.with_suffix(".job.json")
    if reuse and record_path.is_file() and job_path.is_file() and json.loads(job_path.read_text()) == asdict(job):
        earlier = json.loads(record_path.read_text())
        if earlier["status"] == OK:
            return {**earlier, "reused": True}
    record_path.unlink(missing_ok=True)
    shutil.rmtree(job.run_dir, ignore_errors=True)
    record_path.parent.mkdir(parents=True, exist_ok=True)
    job_path.write_text(json.dumps(asdict(job), indent=1))
    log_path = log_file(job)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "loss_comparison", "--run-job", str(job_path)]
    start = time.time()
    with log_path.open("w") as log:
        try:
            returncode = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT,
                                        env=worker_environment(jobs), timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            returncode = None
    if record_path.is_file():
        record = json.loads(record_path.read_text())
    else:
        record = base_record(job)
        reason = f"ran past --run-timeout {timeout:g} s" if returncode is None else f"exited with status {returncode}"
        record.update(status=FAILED, error=f"the run's process {reason} without a record; see {log_path}")
    record["wall_seconds"] = time.time() - start
    write_json_atomic(record_path, record)
    return record


def log_file(job: RunJob) -> Path:
    return Path(job.record_path).parent.parent / "logs" / f"{job.name}.log"


def run_all(jobs: Sequence[RunJob], *, parallel: int, timeout: Optional[float], reuse: bool = True,
            echo=print) -> List[Dict[str, Any]]:
    """Launch every job, `parallel` at a time; returns the records in job order."""
    records: Dict[int, Dict[str, Any]] = {}
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {pool.submit(launch_job, job, jobs=parallel, timeout=timeout, reuse=reuse): index
                   for index, job in enumerate(jobs)}
        for done, future in enumerate(as_completed(futures), start=1):
            index = futures[future]
            records[index] = assess_run(future.result())
            echo(f"[{done}/{len(jobs)}] {run_line(records[index])}")
    return [records[index] for index in range(len(jobs))]


def run_line(record: Mapping[str, Any]) -> str:
    """One line per finished run for the console."""
    metrics = record["metrics"]
    parts = [f"{record['label']} seed {record['seed']}: {record['verdict']}"]
    for key in HEADLINE_METRICS:
        if key in metrics:
            parts.append(f"{key} {metrics[key]:.3f}")
    parts.append("reused" if record.get("reused") else f"{record['wall_seconds']:.0f} s")
    if record["verdict"] != OK:
        parts.append("; ".join(record["reasons"]))
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# Verdicts and aggregation
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CollapseCriteria:
    """When a finished run counts as collapsed (docs/method.md §4b: loss pinned at ln(batch), recall at chance).

    loss_fraction: a softmax loss whose final training loss is at least this fraction of
        ln(batch size) has learned (next to) nothing: within 5% of the all-logits-equal value.
    recall_factor: mean val R@1 of the two directions below this many times chance (1 / val size).
    """

    loss_fraction: float = 0.95
    recall_factor: float = 2.0


def assess_run(record: Mapping[str, Any], criteria: CollapseCriteria = CollapseCriteria()) -> Dict[str, Any]:
    """The record with `verdict` (ok, collapsed, nonfinite, failed) and `reasons` (why it is not ok)."""
    metrics = record["metrics"]
    if record["status"] in (FAILED, NONFINITE):
        return {**record, "verdict": record["status"], "reasons": [record["error"] or record["status"]]}
    nonfinite = sorted(key for key, value in metrics.items() if not math.isfinite(value))
    if nonfinite:
        return {**record, "verdict": NONFINITE, "reasons": [f"non-finite {', '.join(nonfinite)}"]}
    missing = [key for key in ("train/final_loss", "val/i2t_R@1", "val/t2i_R@1") if key not in metrics]
    if missing or not record.get("val_num_samples"):
        return {**record, "verdict": FAILED, "reasons": [f"no {', '.join(missing) or 'val/num_samples'} recorded"]}
    reasons = []
    chance_loss = math.log(record["batch_size"])
    if record["softmax_loss"] and metrics["train/final_loss"] >= criteria.loss_fraction * chance_loss:
        reasons.append(f"final loss {metrics['train/final_loss']:.3f} >= {criteria.loss_fraction:g} x "
                       f"ln({record['batch_size']}) = {criteria.loss_fraction * chance_loss:.3f}")
    chance_recall = 1.0 / record["val_num_samples"]
    mean_recall = (metrics["val/i2t_R@1"] + metrics["val/t2i_R@1"]) / 2
    if mean_recall < criteria.recall_factor * chance_recall:
        reasons.append(f"val R@1 {mean_recall:.4f} < {criteria.recall_factor:g} x chance "
                       f"(1/{record['val_num_samples']:g})")
    return {**record, "verdict": COLLAPSED if reasons else OK, "reasons": reasons}


@dataclass
class MetricStats:
    mean: float
    std: float           # sample standard deviation (n - 1); NaN with one run
    n: int


@dataclass
class VariantSummary:
    label: str
    verdicts: Dict[str, int]                     # verdict -> number of runs
    metrics: Dict[str, MetricStats] = field(default_factory=dict)

    @property
    def num_runs(self) -> int:
        return sum(self.verdicts.values())

    @property
    def num_ok(self) -> int:
        return self.verdicts.get(OK, 0)

    def runs_text(self) -> str:
        """e.g. `3/3 ok` or `1/3 ok (2 collapsed)`."""
        flagged = ", ".join(f"{count} {verdict}" for verdict, count in self.verdicts.items()
                            if verdict != OK and count)
        return f"{self.num_ok}/{self.num_runs} ok" + (f" ({flagged})" if flagged else "")


def summarize(records: Sequence[Mapping[str, Any]]) -> List[VariantSummary]:
    """Per variant (first-seen order): verdict counts, and mean/std of each metric over its ok runs only."""
    summaries: Dict[str, VariantSummary] = {}
    for record in records:
        summary = summaries.setdefault(record["label"], VariantSummary(record["label"], {}))
        summary.verdicts[record["verdict"]] = summary.verdicts.get(record["verdict"], 0) + 1
    for label, summary in summaries.items():
        ok_runs = [record for record in records if record["label"] == label and record["verdict"] == OK]
        for key in metric_keys(ok_runs):
            values = [record["metrics"][key] for record in ok_runs if key in record["metrics"]]
            std = statistics.stdev(values) if len(values) > 1 else math.nan
            summary.metrics[key] = MetricStats(statistics.fmean(values), std, len(values))
    return list(summaries.values())


def metric_order(key: str) -> Tuple[int, bool, str]:
    """Sort key: by section (clone, cls, ret, val, train, others), `clone/overall` last in its section."""
    prefixes = ("clone/", "cls/", "ret/", "val/", "train/")
    section = next((index for index, prefix in enumerate(prefixes) if key.startswith(prefix)), len(prefixes))
    return section, key == "clone/overall", key


def metric_keys(records: Iterable[Mapping[str, Any]]) -> List[str]:
    """Every metric name in `records`, in `metric_order`."""
    return sorted({key for record in records for key in record["metrics"]}, key=metric_order)


# ---------------------------------------------------------------------------------------------
# Report: Markdown, CSV, PNG
# ---------------------------------------------------------------------------------------------


def format_stats(stats: Optional[MetricStats]) -> str:
    if stats is None:
        return "-"
    if stats.n < 2:
        return f"{stats.mean:.3f} (1 run)"
    return f"{stats.mean:.3f} ± {stats.std:.3f}"


def section_keys(summaries: Sequence[VariantSummary], prefix: str | Tuple[str, ...]) -> List[str]:
    """The metric names (any variant has) that start with `prefix`, in `metric_order`."""
    keys = {key for summary in summaries for key in summary.metrics}
    return sorted((key for key in keys if key.startswith(prefix) and key != "train/steps"), key=metric_order)


def markdown_table(summaries: Sequence[VariantSummary], keys: Sequence[str]) -> List[str]:
    """Rows: variants; columns: runs ok, then `keys` as mean ± std over ok runs."""
    lines = ["| variant | runs | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for summary in summaries:
        cells = [format_stats(summary.metrics.get(key)) for key in keys]
        lines.append(f"| `{summary.label}` | {summary.runs_text()} | " + " | ".join(cells) + " |")
    return lines


def flagged_runs(records: Sequence[Mapping[str, Any]]) -> List[str]:
    """A Markdown list item per run that is not ok, with why."""
    return [f"- `{record['name']}`: **{record['verdict']}**: {'; '.join(record['reasons'])}"
            for record in records if record["verdict"] != OK]


def compare(summaries: Sequence[VariantSummary], key: str) -> Optional[str]:
    """Which variant is best on `key` (higher is better) and whether its lead exceeds the seed spread."""
    ranked = sorted((s for s in summaries if key in s.metrics), key=lambda s: s.metrics[key].mean, reverse=True)
    if not ranked:
        return None
    best = ranked[0]
    text = f"`{best.label}` is best on {key} ({format_stats(best.metrics[key])})"
    if len(ranked) == 1:
        return text + ", the only variant with an ok run."
    second = ranked[1]
    gap = best.metrics[key].mean - second.metrics[key].mean
    spread = max(best.metrics[key].std, second.metrics[key].std)
    if gap < TIE:
        return f"`{best.label}` and `{second.label}` tie for best on {key} ({format_stats(best.metrics[key])})."
    if math.isnan(spread):
        verdict = "a single run on one side, so the seed spread is unknown"
    elif gap > spread:
        verdict = f"larger than the larger of their standard deviations ({spread:.3f})"
    else:
        verdict = f"within the larger of their standard deviations ({spread:.3f}): not a clear difference"
    return (text + f", ahead of `{second.label}` ({format_stats(second.metrics[key])}) by {gap:.3f}, "
            + verdict + ".")


def versus_baseline(summaries: Sequence[VariantSummary], baseline: VariantSummary, key: str) -> Optional[str]:
    """Each variant's difference to the baseline on `key`, marked where it exceeds both stds."""
    if key not in baseline.metrics:
        return None
    reference = baseline.metrics[key]
    parts = []
    for summary in summaries:
        if summary is baseline or key not in summary.metrics:
            continue
        stats = summary.metrics[key]
        gap = stats.mean - reference.mean
        spread = max(stats.std, reference.std)
        clear = not math.isnan(spread) and abs(gap) > spread
        parts.append(f"`{summary.label}` {gap:+.3f}"
                     + (" (beyond the seed spread)" if clear else " (within the seed spread)"))
    if not parts:
        return None
    return f"Against `{baseline.label}` on {key} ({format_stats(reference)}): " + ", ".join(parts) + "."


def baseline_difficulty(baseline: VariantSummary, threshold: float = 0.9, chance_margin: float = 0.05) -> Optional[str]:
    """How hard the clone benchmark is for the baseline: edit types below `threshold` (issue 4 asks for
    at least two) and those still within `chance_margin` of chance (0.5), where no loss can show a gain."""
    edits = {key.removeprefix("clone/"): stats.mean for key, stats in baseline.metrics.items()
             if key.startswith("clone/") and key != "clone/overall" and not key.endswith("_margin")}
    if not edits:
        return None
    below = sorted(edit for edit, mean in edits.items() if mean < threshold)
    text = (f"`{baseline.label}` is below {threshold} on {len(below)} of {len(edits)} clone edit types"
            + (f" ({', '.join(below)})" if below else ""))
    at_chance = sorted(edit for edit, mean in edits.items() if abs(mean - 0.5) < chance_margin)
    if at_chance:
        text += f", and within {chance_margin} of chance (0.5) on {', '.join(at_chance)}"
    return text + "."


def tracking_baseline(records: Sequence[Mapping[str, Any]], label: str, baseline: str) -> Optional[float]:
    """The largest |difference| on any metric between `label`'s ok runs and the baseline's of the same
    seed, when both have ok runs for the same seeds (else None): near 0, the loss changed nothing."""
    def ok_runs(name: str) -> Dict[int, Mapping[str, float]]:
        return {r["seed"]: r["metrics"] for r in records if r["label"] == name and r["verdict"] == OK}

    mine, theirs = ok_runs(label), ok_runs(baseline)
    if not mine or mine.keys() != theirs.keys():
        return None
    return max(abs(mine[seed][key] - theirs[seed][key]) for seed in mine
               for key in mine[seed].keys() & theirs[seed].keys() if key != "train/steps")


# Metrics compared seed for seed against the baseline, with a 95% interval (the "Paired" section).
PAIRED_PREFIXES = ("clone/", "val/i2t_R@", "val/t2i_R@")


@dataclass
class PairedDifference:
    mean: float          # mean over seeds of (variant - baseline)
    half_width: float    # 95% paired-t half interval; NaN with one pair
    n: int

    @property
    def clear(self) -> bool:
        """The interval excludes 0, and the difference is not a tie (below TIE: float noise between runs
        that compute the same thing, e.g. a loss whose mechanism never fired)."""
        return self.n > 1 and abs(self.mean) > self.half_width and abs(self.mean) >= TIE

    def text(self) -> str:
        if self.n < 2:
            return f"{self.mean:+.3f} (1 pair)"
        return f"{self.mean:+.3f} ± {self.half_width:.3f}" + (" *" if self.clear else "")


def paired_difference(records: Sequence[Mapping[str, Any]], label: str, baseline: str, key: str
                      ) -> Optional[PairedDifference]:
    """`label` minus `baseline` on `key`, over the seeds where both runs are ok (same init and data
    order: the pairing removes the seed-to-seed variance both share), with a paired-t 95% interval."""
    from scipy import stats

    def by_seed(name: str) -> Dict[int, float]:
        return {r["seed"]: r["metrics"][key] for r in records
                if r["label"] == name and r["verdict"] == OK and key in r["metrics"]}

    mine, theirs = by_seed(label), by_seed(baseline)
    differences = [mine[seed] - theirs[seed] for seed in sorted(mine.keys() & theirs.keys())]
    if not differences:
        return None
    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return PairedDifference(mean, math.nan, 1)
    half = stats.t.ppf(0.975, len(differences) - 1) * statistics.stdev(differences) / math.sqrt(len(differences))
    return PairedDifference(mean, float(half), len(differences))


def paired_differences(summaries: Sequence[VariantSummary], records: Sequence[Mapping[str, Any]],
                       baseline: VariantSummary) -> Dict[str, Dict[str, Optional[PairedDifference]]]:
    """variant label -> metric -> its paired difference to the baseline, for every variant but the baseline."""
    keys = section_keys(summaries, PAIRED_PREFIXES)
    return {summary.label: {key: paired_difference(records, summary.label, baseline.label, key) for key in keys}
            for summary in summaries if summary is not baseline}


def paired_table(differences: Mapping[str, Mapping[str, Optional[PairedDifference]]]) -> List[str]:
    """Rows: variants other than the baseline; cells: paired difference ± 95% half interval."""
    keys = list(next(iter(differences.values()), {}))
    lines = ["| variant | pairs | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for label, by_key in differences.items():
        cells = ["-" if difference is None else difference.text() for difference in by_key.values()]
        pairs = max((difference.n for difference in by_key.values() if difference), default=0)
        lines.append(f"| `{label}` | {pairs} | " + " | ".join(cells) + " |")
    return lines


def paired_findings(differences: Mapping[str, Mapping[str, Optional[PairedDifference]]],
                    summaries: Sequence[VariantSummary], baseline: VariantSummary) -> List[str]:
    """One sentence per variant: the metrics where its paired interval against the baseline excludes 0."""
    runs = {summary.label: summary.runs_text() for summary in summaries}
    lines = []
    for label, by_key in differences.items():
        prefix = f"`{label}` vs `{baseline.label}`: "
        if all(difference is None for difference in by_key.values()):
            lines.append(prefix + f"no seed where both runs are ok ({runs[label]}).")
            continue
        clear = {key: difference for key, difference in by_key.items() if difference is not None and difference.clear}
        better = [f"{key} {d.text().rstrip(' *')}" for key, d in clear.items() if d.mean > 0]
        worse = [f"{key} {d.text().rstrip(' *')}" for key, d in clear.items() if d.mean < 0]
        if not clear:
            lines.append(prefix + "no paired difference excludes 0.")
            continue
        parts = [f"{side} on {', '.join(items)}" for side, items in (("better", better), ("worse", worse)) if items]
        lines.append(prefix + "; ".join(parts) + " (95% paired intervals).")
    return lines


def findings(summaries: Sequence[VariantSummary], records: Sequence[Mapping[str, Any]]) -> List[str]:
    """The "what this shows" paragraph, computed from the numbers alone."""
    lines = []
    for key in ("clone/overall", "val/t2i_R@1", "val/i2t_R@1"):
        sentence = compare(summaries, key)
        if sentence:
            lines.append(sentence)
    baseline = next((s for s in summaries if s.label == BASELINE), summaries[0] if summaries else None)
    if baseline is not None and baseline.num_ok:
        for sentence in (versus_baseline(summaries, baseline, "clone/overall"), baseline_difficulty(baseline)):
            if sentence:
                lines.append(sentence)
        for summary in summaries:
            difference = None if summary is baseline else tracking_baseline(records, summary.label, baseline.label)
            if difference is not None and difference < TRACKING:
                lines.append(f"`{summary.label}` matches `{baseline.label}` seed for seed (largest difference on "
                             f"any metric {difference:.4f}): under this budget it trains like `{baseline.label}`.")
    flagged = [s for s in summaries if s.num_ok < s.num_runs]
    if flagged:
        lines.append("Runs excluded from the means: " + "; ".join(f"`{s.label}` {s.runs_text()}" for s in flagged)
                     + " (listed below with the reason).")
    else:
        lines.append(f"All {len(records)} runs finished with finite losses and above-chance recall (none excluded).")
    return lines


@dataclass
class ReportContext:
    """What the report says besides the numbers."""

    command: str
    budget: Budget
    data: BenchmarkData
    data_seed: int
    seeds: List[int]
    wall_seconds: float
    machine: Dict[str, str]
    started: str
    siblings: Optional[Dict[str, float]] = None  # in-batch siblings of the training stream (`training.families`)


def budget_lines(context: ReportContext) -> List[str]:
    budget = context.budget
    return [
        f"- model `{MODEL}`; every run: {budget.epochs} epochs x {budget.num_train // budget.batch_size} steps = "
        f"**{budget.steps} steps** at batch {budget.batch_size}, AdamW lr {budget.lr:g} (cosine, {budget.warmup} "
        f"warmup steps), wd {budget.wd:g}, {budget.workers} data worker(s), device {budget.device}, "
        f"precision {budget.precision or 'the trainer default'}",
        f"- demo data (`training.scenes`, data seed {context.data_seed}): {budget.num_train} train, "
        f"{budget.num_val} val, {budget.num_test} test scenes (clone selection and retrieval; each "
        f"classification set has as many); in `{context.data.root}`",
        f"- seeds {', '.join(map(str, context.seeds))} (model init and data order); {budget.jobs} run(s) at a time",
    ] + ([f"- every run also gets `{shlex.join(budget.train_args)}`"] if budget.train_args else []) + (
        [f"- fine-tuning: every run starts from one `{BASELINE}` model pretrained for {budget.pretrain_epochs} "
         f"epochs at lr {budget.pretrain_lr:g} (seed {PRETRAIN_SEED}, same data), with `--pretrained`"]
        if budget.pretrain_epochs else []) + (
        [f"- clone negatives in the training batches (the real loader, seed 0, epoch 0): "
         f"{context.siblings['siblings_per_row']:.2f} one-edit siblings per row, "
         f"{context.siblings['sibling_fraction']:.1%} of the in-batch negatives "
         f"(`--train-group-size {context.siblings['group_size']}`, `training.families.measure_siblings`)"]
        if context.siblings else [])


def render_markdown(summaries: Sequence[VariantSummary], records: Sequence[Mapping[str, Any]],
                    context: ReportContext, plot_name: Optional[str], csv_name: str) -> str:
    """The whole report."""
    machine = context.machine
    run_seconds = [r["wall_seconds"] for r in records if r.get("wall_seconds")]
    num_reused = sum(bool(r.get("reused")) for r in records)
    timing = (f"; one run (its process: start, train, evaluate) took {statistics.fmean(run_seconds):.0f} s on "
              f"average ({min(run_seconds):.0f}-{max(run_seconds):.0f} s), {context.budget.jobs} at a time"
              if run_seconds else "")
    if num_reused:
        timing += (f"; {num_reused} of the runs were reused from an earlier call (their times are from it), "
                   f"so this call's wall time is not the benchmark's")
    lines = [
        "# Benchmark results",
        "",
        "Generated by `training.benchmark`; every number below comes from the runs it lists. Means and "
        "standard deviations are over the runs whose verdict is ok; collapsed, non-finite and failed runs "
        "are counted in the `runs` column and listed at the end, never averaged in.",
        "",
        "Reproduce (from the repository root):",
        "",
        "```bash",
        context.command,
        "```",
        "",
        f"- machine: {machine['cpu']}, {machine['cores']} cores{machine.get('gpu', '')}; load average "
        f"{machine['load']} at the start",
        f"- software: Python {machine['python']}, torch {machine['torch']}, open_clip {machine['open_clip']}, "
        f"clip-benchmark {machine['clip_benchmark']}; code {machine['code']}",
        f"- started {context.started}; wall time **{context.wall_seconds / 60:.1f} min** for {len(records)} runs"
        + timing,
        *budget_lines(context),
        "",
        "## Summary",
        "",
        *markdown_table(summaries, [k for k in HEADLINE_METRICS if any(k in s.metrics for s in summaries)]),
        "",
    ]
    if plot_name:
        lines += [f"![main metrics, mean and standard deviation over ok runs]({plot_name})", ""]
    lines += ["## What this shows", "", *findings(summaries, records), ""]
    baseline = next((summary for summary in summaries if summary.label == BASELINE and summary.num_ok), None)
    if baseline is not None and len(summaries) > 1:
        differences = paired_differences(summaries, records, baseline)
        lines += ["## Paired against `clip`", "",
                  f"Each cell: mean over seeds of (variant - `{BASELINE}`) on runs with the same seed (same "
                  "initialisation and data order), ± the half width of its 95% paired-t interval; `*` marks an "
                  "interval that excludes 0. Only seeds where both runs are ok are paired.", "",
                  *paired_table(differences), "", *paired_findings(differences, summaries, baseline), ""]
    for title, prefix, description in SECTIONS:
        keys = section_keys(summaries, prefix)
        if keys:
            lines += [f"## {title}", "", description + ".", "", *markdown_table(summaries, keys), ""]
    flagged = flagged_runs(records)
    lines += ["## Flagged runs", "", *(flagged or ["None."]), "",
              f"Per-run numbers: [{csv_name}]({csv_name}). Collapse criteria: a softmax loss whose final "
              f"training loss is at least {CollapseCriteria().loss_fraction:g} x ln(batch), or mean val R@1 "
              f"below {CollapseCriteria().recall_factor:g} x chance.", ""]
    return "\n".join(lines)


RUN_FIELDS = ("label", "loss", "options", "seed", "name", "verdict", "reasons", "train_seconds", "eval_seconds",
              "wall_seconds")


def write_runs_csv(records: Sequence[Mapping[str, Any]], path: Path) -> None:
    """One row per run: identity, verdict and reasons, timing, every metric."""
    keys = metric_keys(records)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*RUN_FIELDS, *keys])
        for record in records:
            identity = [record["label"], record["loss"], json.dumps(record["options"], sort_keys=True),
                        record["seed"], record["name"], record["verdict"], "; ".join(record["reasons"]),
                        record.get("train_seconds"), record.get("eval_seconds"), record.get("wall_seconds")]
            writer.writerow([*identity, *(record["metrics"].get(key, "") for key in keys)])


def write_summary_csv(summaries: Sequence[VariantSummary], path: Path) -> None:
    """One row per (variant, metric): mean, std, n ok, runs."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["label", "metric", "mean", "std", "n_ok", "runs"])
        for summary in summaries:
            for key, stats in summary.metrics.items():
                writer.writerow([summary.label, key, stats.mean, stats.std, stats.n, summary.runs_text()])


def plot_keys(summaries: Sequence[VariantSummary]) -> List[str]:
    """The [0, 1] metrics (accuracies, recalls); logit margins and losses have their own tables."""
    return [key for key in section_keys(summaries, PLOT_PREFIXES)
            if key not in PLOT_EXCLUDED and not key.endswith("_margin")]


def write_plot(summaries: Sequence[VariantSummary], path: Path) -> bool:
    """Grouped bars (one group per main metric, one bar per variant) with std error bars; False if nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = plot_keys(summaries)
    if not keys:
        return False
    width = 0.8 / len(summaries)
    figure, axes = plt.subplots(figsize=(min(16.0, max(8.0, 0.22 * len(keys) * len(summaries) + 2)), 5.5))
    for index, summary in enumerate(summaries):
        means = [summary.metrics[k].mean if k in summary.metrics else math.nan for k in keys]
        stds = [0.0 if k not in summary.metrics or math.isnan(summary.metrics[k].std) else summary.metrics[k].std
                for k in keys]
        positions = [position + (index - (len(summaries) - 1) / 2) * width for position in range(len(keys))]
        bars = axes.bar(positions, means, width, yerr=stds, capsize=2, label=f"{summary.label} ({summary.runs_text()})")
        # A variant without ok runs has no bar: an x on the axis marks its slot, so it is not mistaken for 0.
        missing = [position for position, mean in zip(positions, means) if math.isnan(mean)]
        axes.plot(missing, [0.01] * len(missing), "x", color=bars.patches[0].get_facecolor(), clip_on=False)
    axes.set_xticks(range(len(keys)))
    axes.set_xticklabels(keys, rotation=30, ha="right", fontsize=8)
    axes.set_ylim(0, 1)
    axes.set_ylabel("mean over ok runs (± std)")
    axes.grid(axis="y", alpha=0.3)
    axes.legend(fontsize=8, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


KEEP_MARKER = "<!-- Everything below this line is kept when the benchmark rewrites this file. -->"


def kept_tail(results_md: Path) -> str:
    """The hand-written sections after KEEP_MARKER in an existing report (other measurements that
    live in the same results page), so that re-running the benchmark does not erase them."""
    if not results_md.is_file():
        return ""
    text = results_md.read_text()
    index = text.find(KEEP_MARKER)
    return "" if index < 0 else "\n" + text[index:]


def write_report(records: Sequence[Mapping[str, Any]], context: ReportContext, results_md: Path,
                 output_dir: Path) -> str:
    """Write the report next to `results_md` (plot and per-run CSV beside it) and copies under `output_dir`."""
    summaries = summarize(records)
    results_md.parent.mkdir(parents=True, exist_ok=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    plot_path = results_md.with_suffix(".png")
    csv_path = results_md.with_name(results_md.stem + "_runs.csv")
    has_plot = write_plot(summaries, plot_path)
    write_runs_csv(records, csv_path)
    markdown = render_markdown(summaries, records, context, plot_path.name if has_plot else None, csv_path.name)
    results_md.write_text(markdown + kept_tail(results_md))
    write_summary_csv(summaries, output_dir / "summary.csv")
    for source, name in ((results_md, "results.md"), (csv_path, "runs.csv"), (plot_path, "results.png")):
        if source.is_file() and source.resolve() != (output_dir / name).resolve():
            shutil.copyfile(source, output_dir / name)
    return markdown


# ---------------------------------------------------------------------------------------------
# Machine description and the command line
# ---------------------------------------------------------------------------------------------


def machine_info(device: str) -> Dict[str, str]:
    """CPU, cores, load, library versions, code version (and the GPU when running on one)."""
    import torch

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        models = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                  if line.startswith("model name")]
        cpu = models[0] if models else cpu
    info = {
        "cpu": cpu, "cores": str(os.cpu_count()), "python": platform.python_version(), "torch": torch.__version__,
        "open_clip": package_version("open_clip_torch"), "clip_benchmark": package_version("clip-benchmark"),
        "load": ", ".join(f"{value:.1f}" for value in os.getloadavg()) if hasattr(os, "getloadavg") else "?",
        "code": code_version(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = f", GPU {torch.cuda.get_device_name(0)}"
    return info


def package_version(name: str) -> str:
    """The installed distribution's version (clip_benchmark's own `__version__` is stale)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def code_version() -> str:
    """`git <commit>` of the source tree (marked when it has uncommitted changes), or `unknown`."""
    source = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=source, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=source, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"git {commit}" + (" with uncommitted changes" if dirty else "")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m training.benchmark", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="budget", action="store_const", const="quick",
                      help="2-core CPU budget, under 20 minutes for 6 variants x 3 seeds (default)")
    mode.add_argument("--full", dest="budget", action="store_const", const="full",
                      help="GPU budget (--device cuda): more data and steps")
    parser.set_defaults(budget="quick")
    parser.add_argument("--losses", default=DEFAULT_LOSSES,
                        help=f"loss variants, comma-separated (default: {DEFAULT_LOSSES}; registered: "
                             f"{', '.join(list_losses())})")
    parser.add_argument("--seeds", default="0,1,2", help="training seeds, comma-separated")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/benchmark"),
                        help="runs, logs, records and report copies")
    parser.add_argument("--results-md", type=Path, default=Path("docs/RESULTS.md"),
                        help="the report; its plot (.png) and per-run CSV (_runs.csv) go beside it")
    parser.add_argument("--data-dir", type=Path, default=None, help="demo data (default: OUTPUT_DIR/data)")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the demo data")
    parser.add_argument("--jobs", type=int, default=None, help="runs at a time (default: the budget's)")
    parser.add_argument("--run-timeout", type=float, default=None, help="seconds before a run counts as failed")
    parser.add_argument("--no-reuse", action="store_true", help="re-run jobs that already have a record")
    parser.add_argument("--report-only", action="store_true",
                        help="write the report again from OUTPUT_DIR's records (e.g. after changing the collapse "
                             "criteria); trains nothing")
    overrides = parser.add_argument_group("budget overrides (recorded in the report's command)")
    overrides.add_argument("--epochs", type=int)
    overrides.add_argument("--batch-size", type=int)
    overrides.add_argument("--lr", type=float)
    overrides.add_argument("--num-train", type=int, help="training scenes")
    overrides.add_argument("--workers", type=int, help="data loader workers per run")
    overrides.add_argument("--device", type=str)
    overrides.add_argument("--warmup", type=int, help="warmup steps")
    overrides.add_argument("--train-args", type=shlex.split, default=None,
                           help="extra trainer flags every run gets, one quoted string (e.g. '--train-group-size 8 "
                                "--caption-key weak')")
    overrides.add_argument("--pretrain-epochs", type=int,
                           help="fine-tuning regime: first pretrain one `clip` model this many epochs, then every run "
                                "fine-tunes it (--pretrained) at --lr")
    overrides.add_argument("--pretrain-lr", type=float, help="learning rate of that pretraining run")
    parser.add_argument("--run-job", type=Path, help=argparse.SUPPRESS)  # what each job's process runs
    return parser


def resolve_budget(args: argparse.Namespace) -> Budget:
    budget = QUICK if args.budget == "quick" else FULL
    overrides = {name: getattr(args, name) for name in ("epochs", "batch_size", "lr", "num_train", "workers", "device",
                                                    "jobs", "warmup", "pretrain_epochs", "pretrain_lr")
                 if getattr(args, name) is not None}
    if args.train_args is not None:
        overrides["train_args"] = tuple(args.train_args)
    budget = replace(budget, **overrides)
    if min(budget.epochs, budget.batch_size, budget.num_train, budget.jobs) < 1 or budget.workers < 0:
        raise ValueError("--epochs, --batch-size, --num-train and --jobs must be >= 1, --workers >= 0")
    if budget.num_train < budget.batch_size:
        raise ValueError(f"--num-train {budget.num_train} is less than one batch of {budget.batch_size}")
    return budget


def training_siblings(budget: Budget, data: BenchmarkData) -> Optional[Dict[str, float]]:
    """Siblings per row in the runs' training batches (their batch size and `--train-group-size`), when
    the training shards are written in families; None otherwise."""
    from synthetic_scenes.families import measure_siblings
    from training.data import DataConfig

    group_size = int(flag_value(budget.train_args, "--train-group-size", "1"))
    cfg = DataConfig(train_data=data.train_data, train_num_samples=data.num_train, batch_size=budget.batch_size,
                     workers=0, seed=0, group_size=group_size, dataset_type="webdataset")
    try:
        stats = measure_siblings(cfg)
    except ValueError:  # shards without family ids
        return None
    return {"siblings_per_row": stats.siblings_per_row, "sibling_fraction": stats.sibling_fraction,
            "group_size": group_size}


def run_benchmark(variants: Sequence[LossVariant], seeds: Sequence[int], budget: Budget, *, output_dir: Path,
                  results_md: Path, data_dir: Optional[Path] = None, data_seed: int = 0, command: str = "",
                  timeout: Optional[float] = None, reuse: bool = True, echo=print) -> List[Dict[str, Any]]:
    """Data, every run, the report; returns the assessed records."""
    start = time.time()
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = machine_info(budget.device)
    data = prepare_data(data_dir or output_dir / "data", budget, data_seed)
    pretrained = None
    if budget.pretrain_epochs:
        job = pretrain_job(budget, data, output_dir)
        echo(f"pretraining {job.name} ({budget.pretrain_epochs} epochs) for the fine-tuning runs")
        record = assess_run(launch_job(job, jobs=1, timeout=timeout, reuse=reuse))
        echo(run_line(record))
        if record["verdict"] != OK:
            raise ValueError(f"the pretraining run {job.name} is {record['verdict']}: {'; '.join(record['reasons'])}")
        pretrained = pretrained_checkpoint(job)
    jobs = plan_jobs(variants, seeds, budget, data, output_dir, pretrained)
    echo(f"{len(jobs)} runs ({len(variants)} variants x {len(seeds)} seeds), {budget.steps} steps each, "
         f"{budget.jobs} at a time; logs in {output_dir / 'logs'}")
    records = run_all(jobs, parallel=budget.jobs, timeout=timeout, reuse=reuse, echo=echo)
    context = ReportContext(command=command, budget=budget, data=data, data_seed=data_seed, seeds=list(seeds),
                            wall_seconds=time.time() - start, machine=machine, started=started,
                            siblings=training_siblings(budget, data))
    write_json_atomic(output_dir / BENCHMARK_FILE,
                      {"labels": [variant.label for variant in variants], "context": asdict(context)})
    write_report(records, context, results_md, output_dir)
    return records


def rebuild_report(output_dir: Path, results_md: Path) -> List[Dict[str, Any]]:
    """Write the report again from `output_dir`'s records and benchmark.json, training nothing.

    The verdicts are recomputed (e.g. after changing `CollapseCriteria`); the command, machine and
    wall time are those of the call that ran the benchmark.
    """
    saved_path = output_dir / BENCHMARK_FILE
    if not saved_path.is_file():
        raise ValueError(f"no {saved_path}: run the benchmark into --output-dir {output_dir} first")
    saved = json.loads(saved_path.read_text())
    fields = saved["context"]
    budget = Budget(**{**fields["budget"], "train_args": tuple(fields["budget"].get("train_args", ()))})
    context = ReportContext(**{**fields, "budget": budget, "data": BenchmarkData(**fields["data"])})
    variants = [parse_loss_variant(label) for label in saved["labels"]]
    pretrained = (pretrained_checkpoint(pretrain_job(context.budget, context.data, output_dir))
                  if context.budget.pretrain_epochs else None)
    jobs = plan_jobs(variants, context.seeds, context.budget, context.data, output_dir, pretrained)
    missing = [job.name for job in jobs if not Path(job.record_path).is_file()]
    if missing:
        raise ValueError(f"{output_dir} has no record of {', '.join(missing)}; run the benchmark to finish them")
    records = [assess_run(json.loads(Path(job.record_path).read_text())) for job in jobs]
    write_report(records, context, results_md, output_dir)
    return records


def main(argv: Optional[Sequence[str]] = None) -> Optional[List[Dict[str, Any]]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.run_job:
        job = RunJob(**json.loads(args.run_job.read_text()))
        record = run_job(job)
        write_json_atomic(Path(job.record_path), record)
        return None
    if args.report_only:
        records = rebuild_report(args.output_dir, args.results_md)
        print(f"wrote {args.results_md} from the records in {args.output_dir}")
        return records
    budget = resolve_budget(args)
    variants = parse_loss_variants(args.losses)
    seeds = parse_seeds(args.seeds)
    records = run_benchmark(variants, seeds, budget, output_dir=args.output_dir, results_md=args.results_md,
                            data_dir=args.data_dir, data_seed=args.data_seed,
                            command="python -m training.benchmark " + shlex.join(argv),
                            timeout=args.run_timeout, reuse=not args.no_reuse)
    print(f"wrote {args.results_md} (plot and per-run CSV beside it); runs in {args.output_dir}")
    return records


def write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(payload, indent=1))
    os.replace(temporary, path)


def cli() -> None:
    """Console entry point: a bad argument or unusable data dir prints one line and exits with status 2."""
    try:
        main()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
