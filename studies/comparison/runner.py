"""A whole comparison: the data, every job (`--jobs` at a time), the report; or its jobs written for a
cluster (`--emit-jobs`); or the report from whatever outcomes there are (`--report-only`)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from training.trainer.progress import eta_text
from training.trainer.run_folder.provenance import machine_info

from .cluster import ARRAY_SCRIPT, JOBS_LIST, emit_jobs
from .data import Budget, ComparisonData, prepare_data
from .jobs import (
    MODEL,
    OK,
    Benchmarks,
    RunJob,
    final_checkpoint,
    launch_job,
    outcome_file,
    plan_jobs,
    pretrain_job,
    run_name,
    write_json_atomic,
)
from .preregistration import Preregistration
from .report import HEADLINE_METRICS, ReportContext, write_report
from .stats import assess_run
from .variants import LossVariant, parse_loss_variant

COMPARISON_FILE = "comparison.json"  # in --output-dir: the variants and report context, for --report-only
LEGACY_COMPARISON_FILE = "benchmark.json"  # the same, in output dirs written as `python -m training.benchmark`


def run_all(
    jobs: Sequence[RunJob], *, parallel: int, timeout: Optional[float], reuse: bool = True, echo=print
) -> List[Dict[str, Any]]:
    """Launch every job, `parallel` at a time, echoing each finished run with the runs done / total and the
    time left; returns the outcomes in job order."""
    outcomes: Dict[int, Dict[str, Any]] = {}
    start, trained = time.time(), 0
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {
            pool.submit(launch_job, job, jobs=parallel, timeout=timeout, reuse=reuse): index
            for index, job in enumerate(jobs)
        }
        for done, future in enumerate(as_completed(futures), start=1):
            index = futures[future]
            outcomes[index] = assess_run(future.result())
            trained += not outcomes[index].get("reused")
            eta = comparison_eta(time.time() - start, trained, len(jobs) - done)
            echo(f"[{done}/{len(jobs)}] {run_line(outcomes[index])} ({eta})")
    return [outcomes[index] for index in range(len(jobs))]


def comparison_eta(elapsed: float, trained: int, remaining: int) -> str:
    """The time left for `remaining` runs at the pace of the `trained` ones so far (reused runs cost nothing,
    so they do not count; the rest are assumed to train)."""
    if remaining == 0:
        return "done"
    return eta_text(elapsed, trained, trained + remaining)


def run_line(outcome: Mapping[str, Any]) -> str:
    """One line per finished run for the console."""
    metrics = outcome["metrics"]
    parts = [f"{outcome['label']} seed {outcome['seed']}: {outcome['verdict']}"]
    for key in HEADLINE_METRICS:
        if key in metrics:
            parts.append(f"{key} {metrics[key]:.3f}")
    parts.append("reused" if outcome.get("reused") else f"{outcome['wall_seconds']:.0f} s")
    if outcome["verdict"] != OK:
        parts.append("; ".join(outcome["reasons"]))
    return ", ".join(parts)


def training_siblings(budget: Budget, data: ComparisonData) -> Optional[Dict[str, float]]:
    """Siblings per row in the runs' training batches (their batch size and `--train-group-size`), when
    the training shards are written in families; None otherwise."""
    from training.synthetic_scenes.families import measure_siblings
    from training.trainer.data import DataConfig

    group_size = budget.trainer_values.get("train_group_size", 1)
    cfg = DataConfig(
        train_data=data.train_data,
        train_num_samples=data.num_train,
        batch_size=budget.batch_size,
        workers=0,
        seed=0,
        group_size=group_size,
        dataset_type="webdataset",
    )
    try:
        stats = measure_siblings(cfg)
    except ValueError:  # shards without family ids
        return None
    return {
        "siblings_per_row": stats.siblings_per_row,
        "sibling_fraction": stats.sibling_fraction,
        "group_size": group_size,
    }


@dataclass(frozen=True)
class OwnData:
    """The user's training data and evaluation sets, in place of the demo data."""

    data: ComparisonData
    benchmarks: Benchmarks


def save_comparison(
    output_dir: Path, variants: Sequence[LossVariant], context: ReportContext, preregistration: Preregistration
) -> None:
    """comparison.json: what `--report-only` needs besides the outcomes."""
    write_json_atomic(
        output_dir / COMPARISON_FILE,
        {
            "labels": [variant.label for variant in variants],
            "context": asdict(context),
            "preregistration": asdict(preregistration),
        },
    )


def run_comparison(
    variants: Sequence[LossVariant],
    seeds: Sequence[int],
    budget: Budget,
    *,
    output_dir: Path,
    results_md: Path,
    data_dir: Optional[Path] = None,
    data_seed: int = 0,
    command: str = "",
    timeout: Optional[float] = None,
    reuse: bool = True,
    echo=print,
    own_data: Optional[OwnData] = None,
    model: str = MODEL,
    preregistration: Preregistration = Preregistration(),
    pair_across_code: bool = False,
) -> List[Dict[str, Any]]:
    """Data (the demo's, written or reused, unless `own_data`), every run, the report; returns the assessed outcomes."""
    start = time.time()
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = machine_info(budget.device)
    data = own_data.data if own_data else prepare_data(data_dir or output_dir / "data", budget, data_seed)
    benchmarks = own_data.benchmarks if own_data else None
    pretrained = None
    if budget.pretrain_epochs:
        job = pretrain_job(budget, data, output_dir)
        echo(f"pretraining {job.name} ({budget.pretrain_epochs} epochs) for the fine-tuning runs")
        outcome = assess_run(launch_job(job, jobs=1, timeout=timeout, reuse=reuse))
        echo(run_line(outcome))
        if outcome["verdict"] != OK:
            raise ValueError(f"the pretraining run {job.name} is {outcome['verdict']}: {'; '.join(outcome['reasons'])}")
        pretrained = final_checkpoint(job)
    jobs = plan_jobs(variants, seeds, budget, data, output_dir, pretrained, model=model, benchmarks=benchmarks)
    echo(
        f"{len(jobs)} runs ({len(variants)} variants x {len(seeds)} seeds), {budget.steps} steps each, "
        f"{budget.jobs} at a time; logs in {output_dir / 'logs'}"
    )
    outcomes = run_all(jobs, parallel=budget.jobs, timeout=timeout, reuse=reuse, echo=echo)
    context = ReportContext(
        command=command,
        budget=budget,
        data=data,
        data_seed=data_seed,
        seeds=list(seeds),
        wall_seconds=time.time() - start,
        machine=machine,
        started=started,
        siblings=None if own_data else training_siblings(budget, data),
        model=model,
        benchmarks=asdict(benchmarks) if benchmarks else None,
    )
    save_comparison(output_dir, variants, context, preregistration)
    write_report(outcomes, context, results_md, output_dir, preregistration, pair_across_code=pair_across_code)
    return outcomes


def emit_comparison(
    variants: Sequence[LossVariant],
    seeds: Sequence[int],
    budget: Budget,
    *,
    output_dir: Path,
    emit_dir: Path,
    own_data: Optional[OwnData] = None,
    data_dir: Optional[Path] = None,
    data_seed: int = 0,
    command: str = "",
    model: str = MODEL,
    nproc_per_node: int = 1,
    preregistration: Preregistration = Preregistration(),
) -> List[RunJob]:
    """Write every run as a cluster job (`cluster`) and comparison.json, running nothing; returns the jobs.

    The output and job folders are made absolute and the scripts `cd` to the current folder, so the
    jobs run from anywhere with relative data paths meaning what they mean here; `--report-only` on
    `output_dir` then reports on whichever runs have finished."""
    output_dir, emit_dir = output_dir.resolve(), emit_dir.resolve()
    data = own_data.data if own_data else prepare_data((data_dir or output_dir / "data").resolve(), budget, data_seed)
    benchmarks = own_data.benchmarks if own_data else None
    jobs = plan_jobs(
        variants, seeds, budget, data, output_dir, model=model, benchmarks=benchmarks, world_size=nproc_per_node
    )
    emit_jobs(jobs, emit_dir, nproc_per_node=nproc_per_node, workdir=Path.cwd())
    context = ReportContext(
        command=command,
        budget=budget,
        data=data,
        data_seed=data_seed,
        seeds=list(seeds),
        wall_seconds=0.0,
        machine={},
        started=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        model=model,
        benchmarks=asdict(benchmarks) if benchmarks else None,
        ranks=nproc_per_node,
        emitted=True,
    )
    save_comparison(output_dir, variants, context, preregistration)
    return jobs


def rebuild_report(
    output_dir: Path,
    results_md: Path,
    preregistration: Optional[Preregistration] = None,
    pair_across_code: bool = False,
    labels: Optional[Sequence[str]] = None,
    seeds: Optional[Sequence[int]] = None,
) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Write the report from `output_dir`'s outcomes and comparison.json, training nothing; returns the
    assessed outcomes and the names of the planned runs without an outcome (listed in the report).

    The verdicts are recomputed (e.g. after changing `CollapseCriteria`); the command, machine and
    wall time are those of the call that ran the comparison (of emitted jobs: the machine the runs
    reported, their summed run time). `preregistration` replaces the saved one; `labels` and `seeds` replace
    the saved call's (the runs of several calls into one folder, or a part of them).
    """
    saved = saved_comparison(output_dir)
    fields = saved["context"]
    budget = Budget.from_saved(fields["budget"])
    context = ReportContext(**{**fields, "budget": budget, "data": ComparisonData(**fields["data"])})
    if preregistration is None:
        registered = saved.get("preregistration", {})
        preregistration = Preregistration(**{**registered, "metrics": tuple(registered.get("metrics", ()))})
    if seeds is not None:
        context = replace(context, seeds=list(seeds))
    variants = [parse_loss_variant(label) for label in (labels or saved["labels"])]
    names = [run_name(variant, seed) for seed in context.seeds for variant in variants]
    missing = [name for name in names if not outcome_file(output_dir, name).is_file()]
    if len(missing) == len(names):
        raise ValueError(
            f"{output_dir} has no outcome of any of its {len(names)} runs yet"
            + (f"; run the jobs of {ARRAY_SCRIPT} ({JOBS_LIST} lists them)" if context.emitted else "")
        )
    outcomes = [
        assess_run(json.loads(outcome_file(output_dir, name).read_text())) for name in names if name not in missing
    ]
    if context.emitted:
        context = replace(context, machine=next((r["machine"] for r in outcomes if r.get("machine")), context.machine))
    write_report(outcomes, context, results_md, output_dir, preregistration, missing, pair_across_code)
    return outcomes, missing


def saved_comparison(output_dir: Path) -> Dict[str, Any]:
    """The variants and report context that `run_comparison` saved in `output_dir`; from an output dir
    written under the comparison's old name (`python -m training.benchmark`), with its command renamed."""
    saved_path = output_dir / COMPARISON_FILE
    if saved_path.is_file():
        return json.loads(saved_path.read_text())
    legacy_path = output_dir / LEGACY_COMPARISON_FILE
    if not legacy_path.is_file():
        raise ValueError(f"no {saved_path}: run the comparison into --output-dir {output_dir} first")
    saved = json.loads(legacy_path.read_text())
    command = saved["context"]["command"]
    saved["context"]["command"] = command.replace("python -m training.benchmark", "python -m studies.comparison", 1)
    return saved
