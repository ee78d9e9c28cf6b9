"""`python -m loss_comparison`: the same tiny model trained with each loss over several seeds, one report.

Every loss variant trains the same model under the same budget, each final model is evaluated
the same way, and the numbers go into one Markdown report with a plot and a per-run CSV.

    python -m loss_comparison --quick                   # 2-core CPU, under 20 minutes
    python -m loss_comparison --full --jobs 4           # a GPU: more data, more steps
    python -m loss_comparison --quick --losses clip,adacl:mode=literal,adacl:calibrated --seeds 0,1,2

Steps:
1. Demo data (`synthetic_scenes.scenes.write_demo_dataset`) with a fixed data seed, written once
   into --data-dir and reused while its manifest matches the budget (`data`).
2. For every (loss variant, seed) one job, run as its own process (`--jobs` at a time, each with
   an equal share of the CPU threads; its output goes to <output-dir>/logs/<run>.log). A job
   trains with `training.main.main(argv)` (adacl-tiny, same steps, batch, lr schedule, workers),
   then evaluates its final checkpoint: validation retrieval R@1/R@5 both ways (the trainer's
   results.jsonl), clip-benchmark zero-shot classification and retrieval on the demo's `wds/`
   sets (`evaluation.zero_shot.evaluate_dataset`, the in-process path) and clone-negative
   selection per edit type (`evaluation.clone_selection`). It writes a JSON record; a finished
   record whose job is unchanged is reused on the next call, so an interrupted comparison resumes
   (`jobs`, `runner`).
3. Every run gets a verdict (`stats.assess_run`): failed (crashed, or no record), nonfinite (NaN/inf
   loss or metric), collapsed (training loss pinned near ln(batch) for a softmax loss, or val
   R@1 under twice chance, docs/method.md §4b) or ok. Means and standard deviations are over the ok
   runs only; each row says how many runs were ok, and the flagged runs are listed by name.
4. Writes the Markdown report (--results-md, with the machine, the command that reproduces it,
   wall time and budget), a PNG of the main metrics next to it, and a per-run CSV; copies of
   all three, the per-variant summary CSV and the records stay under --output-dir, with
   comparison.json, from which `--report-only` writes the report again without training (`report`).

Loss variants (`--losses`) are written as `name`, `name:option=value,...` or `name:value`, e.g.
`adacl:mode=literal` or `adacl:literal` (`variants`).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from open_clip_adacl import list_losses

from .data import FULL, QUICK, Budget
from .jobs import RunJob, run_job, write_json_atomic
from .runner import rebuild_report, run_comparison
from .variants import parse_loss_variants, parse_seeds

DEFAULT_LOSSES = "clip,siglip,adacl:mode=literal,adacl:mode=calibrated,glofnd,fne"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loss_comparison", description=__doc__.split("\n")[0],
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
    parser.add_argument("--output-dir", type=Path, default=Path("runs/loss_comparison"),
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
    records = run_comparison(variants, seeds, budget, output_dir=args.output_dir, results_md=args.results_md,
                            data_dir=args.data_dir, data_seed=args.data_seed,
                            command="python -m loss_comparison " + shlex.join(argv),
                            timeout=args.run_timeout, reuse=not args.no_reuse)
    print(f"wrote {args.results_md} (plot and per-run CSV beside it); runs in {args.output_dir}")
    return records


def cli() -> None:
    """Console entry point: a bad argument or unusable data dir prints one line and exits with status 2."""
    try:
        main()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
