"""`python -m studies.comparison`: the same tiny model trained with each loss over several seeds, one report.

Every loss variant trains the same model under the same budget, each final model is evaluated
the same way, and the numbers go into one Markdown report with a plot and a per-run CSV.

    python -m studies.comparison --quick                   # 2-core CPU, under 20 minutes
    python -m studies.comparison --full --jobs 4           # a GPU: more data, more steps
    python -m studies.comparison --quick --losses clip,adacl:mode=literal,adacl:calibrated --seeds 0,1,2
    # pre-registered: one verdict per variant on the endpoint (helps / hurts / no effect / inconclusive)
    python -m studies.comparison --quick --losses clip,adacl --seeds 0,1,2,3,4 \
        --primary-endpoint clone_learnable=clone/color+clone/shape+clone/size --equivalence-margin 0.02
    # your own shards and clip-benchmark sets, as cluster jobs (torchrun scripts and a SLURM array), then the report
    python -m studies.comparison --full --losses clip,adacl --seeds 0,1,2,3,4 --model RN50 \
        --train-data '/data/cc3m/train/{00000..00331}.tar' --train-num-samples 2800000 \
        --val-data '/data/cc3m/val/{00000..00015}.tar' --train-args '--precision amp' \
        --benchmark-datasets imagenet1k,mscoco_captions --benchmark-root '/data/{dataset}' \
        --nproc-per-node 8 --emit-jobs jobs/ --output-dir runs/cc3m
    sbatch jobs/array.sh
    python -m studies.comparison --report-only --output-dir runs/cc3m --results-md cc3m.md

Steps:
1. Demo data (`training.synthetic_scenes.writers.write_demo_dataset`) with a fixed data seed, written once
   into --data-dir and reused while its manifest matches the budget (`data`).
2. For every (loss variant, seed) one job, run as its own process (`--jobs` at a time, each with
   an equal share of the CPU threads; its output goes to <output-dir>/logs/<run>.log). A job
   trains with `training.main.main(argv)` (--model, same steps, batch, lr schedule, workers),
   then evaluates its final checkpoint: validation retrieval R@1/R@5 both ways (the trainer's
   results.jsonl), clip-benchmark zero-shot classification and retrieval on the demo's `wds/`
   sets or --benchmark-datasets (`training.evaluation.zero_shot.evaluate_dataset`, the in-process path) and
   clone-negative selection per edit type, accuracy and margins (`training.evaluation.clone_selection`). It
   writes a JSON outcome; a finished outcome whose job is unchanged is reused on the next call, so
   an interrupted comparison resumes (`jobs`, `runner`).
3. Every run gets a verdict (`stats.assess_run`): failed (crashed, or no outcome), nonfinite (NaN/inf
   loss or metric), collapsed (training loss pinned near ln(negatives) for a softmax loss: the
   global batch plus any feature queue; or val R@1 under twice chance, docs/method.md §4b) or ok.
   Means and standard deviations are over the ok runs only; each row says how many runs were ok,
   and the flagged runs are listed by name.
4. Writes the Markdown report (--results-md, default OUTPUT_DIR/results.md, with the machine, the
   command that reproduces it, wall time and budget), a PNG of the main metrics next to it, and a per-run CSV; copies of
   all three, the per-variant summary CSV and the outcomes stay under --output-dir, with
   comparison.json, from which `--report-only` writes the report again without training (`report`).

Loss variants (`--losses`) are written as `name`, `name:option=value,...` or `name:value`, e.g.
`adacl:mode=literal` or `adacl:literal` (`variants`).

Statistics (`stats`, `preregistration`): every variant is paired seed for seed with the reference
(`--reference`, default `clip`). With a primary endpoint (`--primary-endpoint NAME=m1+m2+...`, the
per-run mean of those metrics, and `--equivalence-margin`, or both from a committed
`--preregistration FILE[#NAME]`), each variant gets one verdict on it: helps, hurts, no effect
(TOST), inconclusive. Every other paired metric is a secondary test, Holm-corrected over all of
them x all variants.

Your own data (instead of the demo data): `--train-data` shards (webdataset, or csv with
`--dataset-type csv`), `--train-num-samples`, `--val-data` (the collapse check and val retrieval need
it), optionally `--dataset-type`, `--caption-key`, `--data-size` (losses with per-sample state) and
any trainer flag in `--train-args`; the final models are evaluated on `--benchmark-datasets` (clip-
benchmark names, found through the `--benchmark-root` template) and, with `--clone-selection-dir`,
on clone selection. `--emit-jobs DIR` writes the runs as cluster jobs instead of running them
(`cluster`); `--report-only` then reports on whichever runs have finished and lists the others.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from open_clip_adacl import get_loss_class, list_losses
from training.trainer.launch.params import given_values
from training.trainer.launch.tool_flags import add_trainer_flags
from training.trainer.run_folder.provenance import machine_info

from .data import FULL, QUICK, Budget, ComparisonData
from .jobs import FAILED, MODEL, OK, Benchmarks, RunJob, finish_job, log_file, run_job, write_json_atomic
from .preregistration import resolve
from .runner import OwnData, emit_comparison, rebuild_report, run_comparison
from .variants import LossVariant, parse_loss_variants, parse_seeds

DEFAULT_LOSSES = "clip,siglip,adacl:mode=literal,adacl:mode=calibrated,glofnd,fne"
# The trainer's flags this tool takes (training.trainer.launch.tool_flags.add_trainer_flags): its own data, and the budget's overrides.
OWN_DATA_FLAGS = ("train_data", "train_num_samples", "val_data", "dataset_type", "caption_key", "data_size")
BUDGET_FLAGS = ("epochs", "batch_size", "lr", "workers", "device", "warmup")
DEFAULT_SEEDS = "0,1,2"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m studies.comparison",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick",
        dest="budget",
        action="store_const",
        const="quick",
        help="2-core CPU budget, under 20 minutes for 6 variants x 3 seeds (default)",
    )
    mode.add_argument(
        "--full",
        dest="budget",
        action="store_const",
        const="full",
        help="GPU budget (--device cuda): more data and steps",
    )
    parser.set_defaults(budget="quick")
    parser.add_argument(
        "--losses",
        default=None,
        help=f"loss variants, comma-separated (default: {DEFAULT_LOSSES}; registered: "
        f"{', '.join(list_losses())}); with --report-only: report on these only",
    )
    parser.add_argument(
        "--seeds",
        default=None,
        help=f"training seeds, comma-separated (default: {DEFAULT_SEEDS}); with --report-only: report on these only",
    )
    parser.add_argument(
        "--output-dir", type=Path, default=Path("runs/loss_comparison"), help="runs, logs, outcomes and report copies"
    )
    parser.add_argument(
        "--results-md",
        type=Path,
        default=None,
        help="the report; its plot (.png) and per-run CSV (_runs.csv) go beside it (default: "
        "OUTPUT_DIR/results.md: a tool writes only under the folders its flags name)",
    )
    parser.add_argument("--data-dir", type=Path, default=None, help="demo data (default: OUTPUT_DIR/data)")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the demo data")
    parser.add_argument("--jobs", type=int, default=None, help="runs at a time (default: the budget's)")
    parser.add_argument("--run-timeout", type=float, default=None, help="seconds before a run counts as failed")
    parser.add_argument("--no-reuse", action="store_true", help="re-run jobs that already have an outcome")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="write the report from OUTPUT_DIR's outcomes (whichever runs finished; the others are "
        "listed), e.g. after cluster jobs or a change of the collapse criteria; trains nothing",
    )
    parser.add_argument(
        "--pair-across-code",
        action="store_true",
        help="pair runs that ran different code (each outcome keeps its commit and a hash of any "
        "uncommitted change); by default the report refuses such pairs. The report prints each "
        "pair's code either way",
    )
    statistics = parser.add_argument_group(
        "pre-registered statistics (saved for --report-only, which may replace them)"
    )
    statistics.add_argument(
        "--primary-endpoint",
        metavar="NAME=METRIC+METRIC...",
        help="the endpoint each variant gets a verdict on: the per-run mean of these metrics, e.g. "
        "clone_learnable=clone/color+clone/shape+clone/size",
    )
    statistics.add_argument(
        "--equivalence-margin", type=float, help="|variant - reference| below this is no effect (default 0.02)"
    )
    statistics.add_argument("--reference", help="the variant every other is paired with (default: clip)")
    statistics.add_argument(
        "--preregistration",
        metavar="FILE[#NAME]",
        help="a committed JSON or Markdown file holding those three (studies.comparison.preregistration "
        "documents the format); the report cites it",
    )
    own = parser.add_argument_group(
        "your own data (instead of the demo data): the trainer's flags, given to every "
        "run; --val-data is needed (val retrieval and the collapse check), --data-size by "
        "losses with per-sample state (img2dataset shards: number of shards x 10000)"
    )
    add_trainer_flags(own, OWN_DATA_FLAGS, defaults=dict.fromkeys(OWN_DATA_FLAGS))
    own.add_argument(
        "--benchmark-datasets",
        default="",
        help="clip-benchmark datasets every final model is evaluated on, comma-separated "
        "(e.g. imagenet1k,mscoco_captions,wds/my_set)",
    )
    own.add_argument("--benchmark-root", help="clip-benchmark --dataset_root template, e.g. '/data/{dataset}'")
    own.add_argument(
        "--clone-selection-dir", help="a clone-selection set (training.evaluation.clone_selection's layout)"
    )
    add_trainer_flags(parser, ("model",), defaults={"model": MODEL})
    cluster = parser.add_argument_group("cluster jobs")
    cluster.add_argument(
        "--emit-jobs",
        type=Path,
        metavar="DIR",
        help="write each run as a torchrun job script, DIR/array.sh (a SLURM array over them) and "
        "DIR/jobs.tsv; run nothing (then --report-only)",
    )
    cluster.add_argument("--nproc-per-node", type=int, default=1, help="torchrun processes (GPUs) per emitted run")
    overrides = parser.add_argument_group(
        "budget overrides: the trainer's flags, replacing the budget's values (recorded in the report's command)"
    )
    add_trainer_flags(
        overrides,
        ("recipe",),
        notes={
            "recipe": "Here: every run's flags, on the budget's data (e.g. "
            "clone-scratch: the clone study's scratch setting)."
        },
    )
    add_trainer_flags(overrides, BUDGET_FLAGS, defaults=dict.fromkeys(BUDGET_FLAGS))
    overrides.add_argument("--num-train", type=int, help="training scenes")
    overrides.add_argument(
        "--train-args",
        type=shlex.split,
        default=None,
        help="extra trainer flags every run gets, one quoted string (e.g. '--train-group-size 8 --caption-key weak')",
    )
    overrides.add_argument(
        "--pretrain-epochs",
        type=int,
        help="fine-tuning: first pretrain one `clip` model this many epochs, then every run "
        "fine-tunes it (--pretrained) at --lr",
    )
    overrides.add_argument("--pretrain-lr", type=float, help="learning rate of that pretraining run")
    # What each job's process runs: --run-job trains and evaluates; an emitted job trains under torchrun,
    # then --finish-job evaluates and writes the outcome.
    parser.add_argument("--run-job", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--finish-job", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--train-status", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--train-seconds", type=float, default=None, help=argparse.SUPPRESS)
    return parser


def resolve_budget(args: argparse.Namespace) -> Budget:
    budget = QUICK if args.budget == "quick" else FULL
    if args.recipe:
        budget = budget.with_recipe(args.recipe)
    overrides = {
        name: getattr(args, name)
        for name in (
            "epochs",
            "batch_size",
            "lr",
            "num_train",
            "workers",
            "device",
            "jobs",
            "warmup",
            "pretrain_epochs",
            "pretrain_lr",
        )
        if getattr(args, name) is not None
    }
    data_flags = [flag for flag in ("dataset_type", "caption_key") if getattr(args, flag)]
    if args.train_data:
        overrides["num_train"] = args.train_num_samples
    if args.train_args is not None or data_flags:
        # Over the budget's own (a --recipe's other flags, e.g. --train-group-size): the command line wins.
        overrides["trainer_values"] = {
            **budget.trainer_values,
            **{flag: getattr(args, flag) for flag in data_flags},
            **given_values(args.train_args or ()),
        }
    budget = replace(budget, **overrides)
    if min(budget.epochs, budget.batch_size, budget.num_train, budget.jobs) < 1 or budget.workers < 0:
        raise ValueError("--epochs, --batch-size, --num-train and --jobs must be >= 1, --workers >= 0")
    if budget.num_train < budget.batch_size:
        raise ValueError(f"--num-train {budget.num_train} is less than one batch of {budget.batch_size}")
    return budget


def own_data(args: argparse.Namespace, variants: Sequence[LossVariant]) -> Optional[OwnData]:
    """The user's data and evaluation sets from the flags (None: the demo data); incomplete flags are errors."""
    given = [
        flag
        for flag in (
            "train_num_samples",
            "val_data",
            "dataset_type",
            "caption_key",
            "data_size",
            "benchmark_root",
            "clone_selection_dir",
        )
        if getattr(args, flag) is not None
    ]
    if not args.train_data:
        if given or args.benchmark_datasets:
            raise ValueError(
                f"--{(given or ['benchmark_datasets'])[0].replace('_', '-')} is for your own data: "
                "give --train-data too (without it the comparison writes and uses the demo data)"
            )
        return None
    for flag, why in (
        ("train_num_samples", "the samples per epoch"),
        ("val_data", "val retrieval and the collapse check need a validation set"),
    ):
        if getattr(args, flag) is None:
            raise ValueError(f"--train-data needs --{flag.replace('_', '-')} ({why})")
    datasets = tuple(name.strip() for name in args.benchmark_datasets.split(",") if name.strip())
    if datasets and not args.benchmark_root:
        raise ValueError(
            "--benchmark-datasets needs --benchmark-root, clip-benchmark's --dataset_root template "
            "(e.g. '/data/{dataset}')"
        )
    indexed = [
        variant.label
        for variant in variants
        if get_loss_class(variant.loss).needs_sample_index and "data_size" not in dict(variant.options)
    ]
    if indexed and args.data_size is None:
        raise ValueError(
            f"{', '.join(indexed)} keep per-sample state: give --data-size, above the largest sample key "
            "(img2dataset shards: number of shards x 10000)"
        )
    data = ComparisonData(
        root="",
        train_data=args.train_data,
        val_data=args.val_data,
        num_train=args.train_num_samples,
        data_size=args.data_size or 0,
    )
    return OwnData(data, Benchmarks(datasets, args.benchmark_root or "", args.clone_selection_dir))


def finish(job_path: Path, train_status: int, train_seconds: Optional[float]) -> Dict[str, Any]:
    """An emitted job's last step: evaluate the run torchrun trained (exit status `train_status`), write its outcome."""
    job = RunJob(**json.loads(job_path.read_text()))
    error = (
        None
        if train_status == 0
        else (
            f"training exited with status {train_status} (a non-finite loss, bad data or a crash); see {log_file(job)}"
        )
    )
    outcome = finish_job(job, OK if train_status == 0 else FAILED, error, train_seconds)
    outcome["wall_seconds"] = (train_seconds or 0.0) + (outcome["eval_seconds"] or 0.0)
    outcome["machine"] = machine_info(job.device)
    write_json_atomic(Path(job.outcome_path), outcome)
    return outcome


def main(argv: Optional[Sequence[str]] = None) -> Optional[List[Dict[str, Any]]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.results_md = args.results_md or args.output_dir / "results.md"
    if args.run_job:
        job = RunJob(**json.loads(args.run_job.read_text()))
        outcome = run_job(job)
        write_json_atomic(Path(job.outcome_path), outcome)
        return None
    if args.finish_job:
        finish(args.finish_job, args.train_status, args.train_seconds)
        return None
    registration_flags = (args.primary_endpoint, args.equivalence_margin, args.reference)
    if args.report_only:
        given = args.preregistration or any(value is not None for value in registration_flags)
        outcomes, missing = rebuild_report(
            args.output_dir,
            args.results_md,
            resolve(args.preregistration, *registration_flags) if given else None,
            args.pair_across_code,
            labels=args.losses and [v.label for v in parse_loss_variants(args.losses)],
            seeds=args.seeds and parse_seeds(args.seeds),
        )
        print(
            f"wrote {args.results_md} from the outcomes in {args.output_dir}"
            + (f"; no outcome yet of {len(missing)} run(s): {', '.join(missing)}" if missing else "")
        )
        return outcomes
    preregistration = resolve(args.preregistration, *registration_flags)
    variants = parse_loss_variants(args.losses or DEFAULT_LOSSES)
    labels = [variant.label for variant in variants]
    if preregistration.reference is not None and preregistration.reference not in labels:
        raise ValueError(
            f"the reference variant {preregistration.reference!r} is not in --losses ({', '.join(labels)})"
        )
    seeds = parse_seeds(args.seeds or DEFAULT_SEEDS)
    own = own_data(args, variants)
    budget = resolve_budget(args)
    if budget.pretrain_epochs and (own or args.emit_jobs):
        raise ValueError(
            "--pretrain-epochs pretrains on the demo data, here; with --train-data or --emit-jobs start "
            "every run from a model you have: --train-args '--pretrained CHECKPOINT_OR_TAG'"
        )
    command = "python -m studies.comparison " + shlex.join(argv)
    if args.emit_jobs:
        if args.nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
        jobs = emit_comparison(
            variants,
            seeds,
            budget,
            output_dir=args.output_dir,
            emit_dir=args.emit_jobs,
            own_data=own,
            data_dir=args.data_dir,
            data_seed=args.data_seed,
            command=command,
            model=args.model,
            nproc_per_node=args.nproc_per_node,
            preregistration=preregistration,
        )
        print(
            f"wrote {len(jobs)} job scripts, {args.emit_jobs / 'array.sh'} (sbatch it) and "
            f"{args.emit_jobs / 'jobs.tsv'}; then: python -m studies.comparison --report-only --output-dir "
            f"{args.output_dir.resolve()}"
        )
        return None
    outcomes = run_comparison(
        variants,
        seeds,
        budget,
        output_dir=args.output_dir,
        results_md=args.results_md,
        data_dir=args.data_dir,
        data_seed=args.data_seed,
        command=command,
        timeout=args.run_timeout,
        reuse=not args.no_reuse,
        own_data=own,
        model=args.model,
        preregistration=preregistration,
        pair_across_code=args.pair_across_code,
    )
    print(f"wrote {args.results_md} (plot and per-run CSV beside it); runs in {args.output_dir}")
    return outcomes


def cli() -> None:
    """Console entry point: a bad argument or unusable data dir prints one line and exits with status 2."""
    try:
        main()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
