"""Jobs: one (loss variant, seed) each, trained and evaluated in its own process.

A job trains with `training.main.run(config)` (adacl-tiny unless --model; the same steps, batch, lr
schedule and workers for every job but for the loss flags and seed; the job holds the trainer's flag
values by destination, `training.trainer.launch.params.config_from_values`), then evaluates its final
checkpoint (`finish_job`): validation retrieval R@1/R@5 both ways (the trainer's results.jsonl),
clip-benchmark zero-shot classification and retrieval (`training.evaluation.zero_shot.evaluate_dataset`, the
in-process path) on the demo's `wds/` sets or the user's own (`Benchmarks`), clone-negative
selection per edit type (`training.evaluation.clone_selection`, when there is a clone-selection set) and, on
training data written in families, clone detection (`training.evaluation.clone_detection`).
`launch_job` runs a job as `python -m studies.comparison --run-job JOB.json`, its output in its log
file; the process writes the job's JSON outcome, which a later call reuses while the job is unchanged.
An emitted job (`cluster`) trains under torchrun instead and then runs `--finish-job JOB.json`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from open_clip_adacl import get_loss_class
from open_clip_adacl.losses import MechanismStats
from training.trainer.run_folder.layout import RunDir
from training.trainer.run_folder.provenance import checkpoint_identity, code_version, dirty_files

from .data import PRETRAIN_SEED, Budget, ComparisonData
from .variants import LossVariant

BASELINE = "clip"  # the report compares every variant with this one (the first variant when absent)
MODEL = "adacl-tiny"
OK, NONFINITE, FAILED = "ok", "nonfinite", "failed"  # an outcome's status; `stats.assess_run` adds "collapsed"
# The folder that holds the lab (the repository root): a job's process (`python -m studies.comparison`) imports
# the lab from it, wherever it starts.
LAB_PATH = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Benchmarks:
    """The user's own evaluation sets (instead of the demo's): clip-benchmark dataset names, their
    `--dataset_root` template (`{dataset}`: the name without `wds/`), and optionally a clone-selection
    folder (`training.evaluation.clone_selection`'s shard layout)."""

    datasets: Tuple[str, ...]
    root: str
    clone_selection_dir: Optional[str] = None


@dataclass(frozen=True)
class RunJob:
    """Everything one run needs; written as JSON for the worker process (`--run-job`, `--finish-job`)."""

    label: str
    loss: str
    options: Dict[str, str]
    seed: int
    name: str
    train_values: Dict[str, Any]  # the trainer's flags by destination (training.trainer.launch.params.args_from_values)
    logs_dir: str  # the trainer's --logs; the run lives in <logs_dir>/<name>
    data_root: Optional[str]  # the demo data (its benchmark/ sets and clone_selection/); None: `benchmark_*`
    batch_size: int  # per rank
    device: str
    outcome_path: str
    benchmark_datasets: List[str] = field(default_factory=list)  # without demo data: the user's sets
    benchmark_root: Optional[str] = None
    clone_selection_dir: Optional[str] = None
    world_size: int = 1  # ranks the run trains on (an emitted job's torchrun processes)

    @property
    def run_dir(self) -> Path:
        return Path(self.logs_dir) / self.name

    @property
    def train_argv(self) -> List[str]:
        """The trainer's command line for this run (an emitted job's torchrun, the outcome)."""
        from training.trainer.launch.params import argv_from_values

        return argv_from_values(self.train_values)

    def train_args(self) -> argparse.Namespace:
        """Every flag the run trains with (the trainer's defaults where `train_values` sets none)."""
        from training.trainer.launch.params import args_from_values

        return args_from_values(self.train_values)


def train_values(
    variant: LossVariant,
    seed: int,
    name: str,
    budget: Budget,
    data: ComparisonData,
    logs_dir: Path,
    pretrained: Optional[str] = None,
    model: str = MODEL,
) -> Dict[str, Any]:
    """`training.main` flag values: identical for every run but for the loss flags, seed and name.

    Validation runs after the last epoch only, and only the final checkpoint is saved. With
    `pretrained`, the run fine-tunes that checkpoint. `budget.trainer_values` (any other trainer flags) last.
    """
    values: Dict[str, Any] = {
        "train_data": data.train_data,
        "val_data": data.val_data,
        "train_num_samples": data.num_train,
        "model": model,
        **variant.values(data.data_size),
        "batch_size": budget.batch_size,
        "epochs": budget.epochs,
        "lr": budget.lr,
        "warmup": budget.warmup,
        "wd": budget.wd,
        "workers": budget.workers,
        "device": budget.device,
        "seed": seed,
        "val_frequency": budget.epochs,
        "save_frequency": 0,
        "log_every_n_steps": budget.log_every_n_steps,
        "logs": str(logs_dir),
        "name": name,
    }
    if budget.precision:
        values["precision"] = budget.precision
    if pretrained:
        values["pretrained"] = pretrained
    return {**values, **budget.trainer_values}


def pretrain_job(budget: Budget, data: ComparisonData, output_dir: Path) -> RunJob:
    """The fine-tuning settings' starting point: `clip` for `budget.pretrain_epochs` at `pretrain_lr`."""
    pretrain_budget = replace(budget, epochs=budget.pretrain_epochs, lr=budget.pretrain_lr)
    return make_job(LossVariant(BASELINE), PRETRAIN_SEED, pretrain_budget, data, output_dir, name_prefix="pretrain-")


def final_checkpoint(job: RunJob) -> str:
    """The final checkpoint of a finished run: its newest epoch_N.pt."""
    try:
        return str(RunDir(job.run_dir).final_checkpoint())
    except FileNotFoundError:
        raise ValueError(f"the run {job.name} left no checkpoint; see {log_file(job)}") from None


def run_name(variant: LossVariant, seed: int, prefix: str = "") -> str:
    """A run's name: its folder, log and outcome file."""
    return f"{prefix}{variant.slug}-seed{seed}"


OUTCOMES = "outcomes"  # <comparison>/outcomes/<run>.json: each run's outcome
LEGACY_OUTCOMES = "records"  # the same folder in comparisons written before it was named for what it holds


def outcome_file(output_dir: Path, name: str) -> Path:
    """Where run `name`'s outcome is: <output_dir>/outcomes/, or records/ in a comparison written under that name."""
    folder = output_dir / OUTCOMES
    if not folder.is_dir() and (output_dir / LEGACY_OUTCOMES).is_dir():
        folder = output_dir / LEGACY_OUTCOMES
    return folder / f"{name}.json"


def make_job(
    variant: LossVariant,
    seed: int,
    budget: Budget,
    data: ComparisonData,
    output_dir: Path,
    *,
    pretrained: Optional[str] = None,
    name_prefix: str = "",
    model: str = MODEL,
    benchmarks: Optional[Benchmarks] = None,
    world_size: int = 1,
) -> RunJob:
    """One run; with `benchmarks`, it is evaluated on the user's sets instead of the demo data's."""
    name = run_name(variant, seed, name_prefix)
    return RunJob(
        label=variant.label,
        loss=variant.loss,
        options=dict(variant.options),
        seed=seed,
        name=name,
        train_values=train_values(variant, seed, name, budget, data, output_dir / "runs", pretrained, model),
        logs_dir=str(output_dir / "runs"),
        data_root=None if benchmarks else data.root,
        batch_size=budget.batch_size,
        device=budget.device,
        outcome_path=str(outcome_file(output_dir, name)),
        benchmark_datasets=list(benchmarks.datasets) if benchmarks else [],
        benchmark_root=benchmarks.root if benchmarks else None,
        clone_selection_dir=benchmarks.clone_selection_dir if benchmarks else None,
        world_size=world_size,
    )


def plan_jobs(
    variants: Sequence[LossVariant],
    seeds: Sequence[int],
    budget: Budget,
    data: ComparisonData,
    output_dir: Path,
    pretrained: Optional[str] = None,
    **settings: Any,
) -> List[RunJob]:
    """One job per (variant, seed), seeds outer: an interrupted comparison has every variant's first seeds.
    `settings`: `make_job`'s model, benchmarks and world_size."""
    return [
        make_job(variant, seed, budget, data, output_dir, pretrained=pretrained, **settings)
        for seed in seeds
        for variant in variants
    ]


def run_job(job: RunJob) -> Dict[str, Any]:
    """Train and evaluate one run in this process; returns its outcome (status ok, nonfinite or failed)."""
    from training.main import run
    from training.trainer.engine.loop import NonFiniteLossError
    from training.trainer.launch.params import config_from_values

    start = time.time()
    status, error = OK, None
    try:
        run(config_from_values(job.train_values))
    except NonFiniteLossError as raised:
        status, error = NONFINITE, str(raised)
    except Exception as raised:  # noqa: BLE001 - the outcome says why, the log (this process's stderr) shows where
        traceback.print_exc()
        status, error = FAILED, f"training: {type(raised).__name__}: {raised}"
    return finish_job(job, status, error, train_seconds=time.time() - start)


def finish_job(job: RunJob, status: str, error: Optional[str], train_seconds: Optional[float]) -> Dict[str, Any]:
    """The outcome of a run whose training ended with `status`: its training metrics and, when ok, the
    evaluation of its final checkpoint (which it runs here)."""
    outcome = base_outcome(job)
    outcome.update(status=status, error=error, train_seconds=train_seconds)
    outcome["metrics"].update(training_metrics(job.run_dir, get_loss_class(job.loss).mechanism_stats))
    outcome["val_num_samples"] = outcome["metrics"].pop("val/num_samples", None)
    if outcome["status"] == OK:
        # The options as the trainer resolved them (defaults included), beside the variant's own.
        trained = job.train_args()
        outcome["loss_options"] = trained.loss_options
        start = time.time()
        try:
            outcome["metrics"].update(evaluate_run(Path(final_checkpoint(job)), job, trained))
        except Exception as raised:  # noqa: BLE001 - as training's: the outcome says why, the log where
            traceback.print_exc()
            outcome.update(status=FAILED, error=f"evaluation: {type(raised).__name__}: {raised}")
        outcome["eval_seconds"] = time.time() - start
    return outcome


def base_outcome(job: RunJob) -> Dict[str, Any]:
    return {
        "label": job.label,
        "loss": job.loss,
        "options": job.options,
        "seed": job.seed,
        "name": job.name,
        "status": OK,
        "error": None,
        "batch_size": job.batch_size,
        "world_size": job.world_size,
        "train_argv": job.train_argv,
        "code": code_version(),
        "code_dirty": dirty_files(),
        "pretrained": pretrained_identity(job.train_argv),
        "train_seconds": None,
        "eval_seconds": None,
        "wall_seconds": None,
        "val_num_samples": None,
        "metrics": {},
    }


def pretrained_identity(train_argv: List[str]) -> Optional[Dict[str, Optional[str]]]:
    """`provenance.checkpoint_identity` of the run's last --pretrained, None when it trains from scratch."""
    values = [
        argument.split("=", 1)[1] if argument.startswith("--pretrained=") else train_argv[index + 1]
        for index, argument in enumerate(train_argv)
        if argument.startswith("--pretrained=") or (argument == "--pretrained" and index + 1 < len(train_argv))
    ]
    return checkpoint_identity(values[-1]) if values else None


def training_metrics(run_dir: Path, mechanism: Optional[MechanismStats] = None) -> Dict[str, float]:
    """From <run>/metrics.jsonl and checkpoints/results.jsonl: final loss, logit scale, steps, val retrieval, and
    the loss's `mechanism` stats."""
    metrics: Dict[str, float] = {}
    run = RunDir(run_dir)
    steps = run.metrics("train")
    if steps:
        tail = steps[-max(1, math.ceil(len(steps) / 10)) :]
        metrics["train/final_loss"] = statistics.fmean(float(step["loss"]) for step in tail)
        clip_losses = [
            float(step[f"stats/{direction}/clip_loss"])
            for step in tail
            for direction in ("i2t", "t2i")
            if f"stats/{direction}/clip_loss" in step
        ]
        if clip_losses:  # CLIP's loss on the trained logits, beside the trained loss (docs/adacl.md §5)
            metrics["train/final_clip_loss"] = statistics.fmean(clip_losses)
        metrics["train/logit_scale"] = float(steps[-1]["logit_scale"])
        metrics["train/steps"] = float(steps[-1]["step"])
        metrics.update(mechanism_metrics(steps, mechanism))
    results = run.results()
    if results:
        val = results[-1]
        for direction, short in (("image_to_text", "i2t"), ("text_to_image", "t2i")):
            for k in (1, 5):
                metrics[f"val/{short}_R@{k}"] = float(val[f"{direction}_R@{k}"])
        metrics["val/clip_loss"] = float(val["clip_val_loss"])
        if "clip_val_loss_chance" in val:
            metrics["val/clip_loss_chance"] = float(val["clip_val_loss_chance"])
        metrics["val/num_samples"] = float(val["num_samples"])
    return metrics


def mechanism_metrics(steps: Sequence[Mapping[str, Any]], stats: Optional[MechanismStats]) -> Dict[str, float]:
    """The loss's declared mechanism stats (`Loss.mechanism_stats`) over the logged steps that hold each stat:
    `<prefix>/<stat>` fractions and `<prefix>/<stat>_mean|_std` spreads; {} for a loss that declares none or
    logged none. AdaCL logs `modulated` every step; its bounds and margins only in a modulated step, so theirs are
    over modulated steps (metrics.jsonl files written before that held the fallback's 0 and 1 too)."""
    if stats is None:
        return {}
    metrics: Dict[str, float] = {}
    for name in stats.fractions + stats.spreads:
        values = [
            float(step[f"stats/{direction}/{name}"])
            for step in steps
            for direction in ("i2t", "t2i")
            if f"stats/{direction}/{name}" in step
        ]
        if not values:
            continue
        if name in stats.fractions:
            metrics[f"{stats.prefix}/{name}"] = statistics.fmean(values)
        else:
            metrics[f"{stats.prefix}/{name}_mean"] = statistics.fmean(values)
            metrics[f"{stats.prefix}/{name}_std"] = statistics.pstdev(values)
    return metrics


def evaluation_sets(job: RunJob) -> Tuple[List[str], str, Optional[Path]]:
    """(clip-benchmark datasets, their --dataset_root template, clone-selection folder or None) of a job:
    the demo data's, or the user's."""
    from training.evaluation.zero_shot import demo_datasets

    if job.data_root is None:
        return (
            job.benchmark_datasets,
            job.benchmark_root or "",
            (Path(job.clone_selection_dir) if job.clone_selection_dir else None),
        )
    root = Path(job.data_root)
    return demo_datasets(root), str(root / "benchmark" / "{dataset}"), root / "clone_selection"


def evaluate_run(checkpoint: Path, job: RunJob, trained: argparse.Namespace) -> Dict[str, float]:
    """Export the final checkpoint, then clip-benchmark (in process) and clone selection on the job's sets;
    `trained`: the flags the run trained with (`job.train_args()`)."""
    import torch

    from training.evaluation.clone_detection import evaluate_clone_detection
    from training.evaluation.clone_selection import evaluate_clone_selection
    from training.evaluation.zero_shot import (
        CAPTION_SELECTION,
        CLASSIFICATION,
        RETRIEVAL,
        dataset_root,
        evaluate_dataset,
        export_checkpoint,
        infer_task,
        load_model,
        result_path,
        worker_count,
        write_result,
    )

    device = "cuda" if job.device.startswith("cuda") and torch.cuda.is_available() else "cpu"
    model_name = export_checkpoint(checkpoint, job.run_dir / "export")
    model, preprocess, tokenizer = load_model(model_name, "none", device)
    datasets, root_template, clone_dir = evaluation_sets(job)
    metrics: Dict[str, float] = {}
    for dataset in datasets:
        set_root = dataset_root(root_template, dataset)
        task = infer_task(dataset, set_root)
        result = evaluate_dataset(
            model,
            preprocess,
            tokenizer,
            dataset,
            set_root,
            task,
            device=device,
            batch_size=job.batch_size,
            recall_k=(1, 5),
            num_workers=worker_count(dataset, set_root, trained.workers),
        )
        write_result(result_path(job.run_dir / "eval", dataset, task), dataset, model_name, "none", task, result)
        short = dataset.split("/")[-1]
        if task == CLASSIFICATION:
            metrics[f"cls/{short}/acc1"] = float(result["acc1"])
        elif task == RETRIEVAL:
            for side in ("image", "text"):
                for k in (1, 5):
                    metrics[f"ret/{short}/{side}_R@{k}"] = float(result[f"{side}_retrieval_recall@{k}"])
        elif task == CAPTION_SELECTION:  # e.g. sugar_crepe/*: the true caption against a one-edit negative
            metrics[f"sel/{short}/text_acc"] = float(result["text_acc"])
    if clone_dir is not None:
        clone = evaluate_clone_selection(
            model, preprocess, tokenizer, clone_dir, device=device, batch_size=job.batch_size, margins=True
        )
        metrics.update({f"clone/{name.removesuffix('_acc')}": float(value) for name, value in clone.items()})
    shards = family_shards(trained.train_data)
    if shards:
        caption_key = first_of(trained.caption_key)  # what the loss saw in training
        detection = evaluate_clone_detection(
            model, preprocess, tokenizer, shards, batch_size=job.batch_size, device=device, caption_key=caption_key
        )
        metrics.update({f"detect/{name}": value for name, value in detection.items()})
    return metrics


def first_of(value: str) -> str:
    """The first item of a comma list (a flag such as --caption-key may name several)."""
    return value.split(",")[0].strip()


def family_shards(train_data: Optional[str]) -> List[str]:
    """A run's training shards (`train_data`) when they are written in families (their samples' json has a
    `family`), for `clone_detection`; [] otherwise."""
    import braceexpand
    import webdataset as wds

    shards = list(braceexpand.braceexpand(first_of(train_data or "")))
    if not shards or not shards[0].endswith(".tar") or not Path(shards[0]).is_file():  # not webdataset shards
        return []
    first = next(iter(wds.WebDataset(shards[:1], shardshuffle=False).decode()), {})
    return shards if "family" in first.get("json", {}) else []


def lab_pythonpath() -> str:
    """PYTHONPATH with the lab's folder first, so that a job's process finds `studies` from any folder."""
    return os.pathsep.join(filter(None, [str(LAB_PATH), os.environ.get("PYTHONPATH")]))


def worker_environment(jobs: int) -> Dict[str, str]:
    """The environment of a job's process: the lab on its path, and an equal share of the CPU threads each,
    never more than the caller's own OMP_NUM_THREADS (on a shared machine, more threads than free cores make
    every OpenMP barrier wait for descheduled threads: measured 2.5 s instead of 0.2 s per step)."""
    threads = max(1, (os.cpu_count() or 1) // jobs)
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        threads = min(threads, max(1, int(os.environ["OMP_NUM_THREADS"])))
    return {
        **os.environ,
        "PYTHONPATH": lab_pythonpath(),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
    }


def launch_job(job: RunJob, *, jobs: int, timeout: Optional[float], reuse: bool = True) -> Dict[str, Any]:
    """Run `job` in a fresh process (`python -m studies.comparison --run-job`), output to its log file.

    A finished (status ok) outcome left by an earlier call for the same job is returned as it is
    (when `reuse`); otherwise the run's folder is removed first, since the trainer refuses to
    overwrite a run. A process that dies without an outcome (or runs past `timeout` seconds) yields
    a failed outcome. `wall_seconds` is the whole process, start-up included.
    """
    outcome_path = Path(job.outcome_path)
    job_path = job_file(job)
    if reuse and outcome_path.is_file() and job_path.is_file() and json.loads(job_path.read_text()) == asdict(job):
        earlier = json.loads(outcome_path.read_text())
        if earlier["status"] == OK:
            return {**earlier, "reused": True}
    outcome_path.unlink(missing_ok=True)
    shutil.rmtree(job.run_dir, ignore_errors=True)
    outcome_path.parent.mkdir(parents=True, exist_ok=True)
    job_path.write_text(json.dumps(asdict(job), indent=1))
    log_path = log_file(job)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "studies.comparison", "--run-job", str(job_path)]
    start = time.time()
    with log_path.open("w") as log:
        try:
            returncode = subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, env=worker_environment(jobs), timeout=timeout
            ).returncode
        except subprocess.TimeoutExpired:
            returncode = None
    if outcome_path.is_file():
        outcome = json.loads(outcome_path.read_text())
    else:
        outcome = base_outcome(job)
        reason = f"ran past --run-timeout {timeout:g} s" if returncode is None else f"exited with status {returncode}"
        outcome.update(status=FAILED, error=f"the run's process {reason} without an outcome; see {log_path}")
    outcome["wall_seconds"] = time.time() - start
    write_json_atomic(outcome_path, outcome)
    return outcome


def job_file(job: RunJob) -> Path:
    """The job's JSON (what `--run-job` and `--finish-job` read), next to its outcome."""
    return Path(job.outcome_path).with_suffix(".job.json")


def log_file(job: RunJob) -> Path:
    return Path(job.outcome_path).parent.parent / "logs" / f"{job.name}.log"


def write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(payload, indent=1))
    os.replace(temporary, path)
