"""The loss table's finding tested where it could fail (docs/preregistration_robustness.md): controls at the same
dose, other pretraining checkpoints, batches drawn at random, weak captions.

    python -m studies robustness --tables dose                # Table 1: seeds 35-44, one commit
    python -m studies robustness --tables random-batches      # Table 3, then replication (Table 2), weak (Table 4)
    python -m studies robustness --summary                    # docs/results/robustness_shares.md from the per-run CSVs

Each table is a registered study whose comparison writes docs/results/robustness_<table>.md with its per-run CSV
beside it; the shares page is computed from those CSVs alone. Its primary endpoint is the loss table's
(`clone/family_without_mark`): each variant's share of the oracle's paired gain over `clip` with Fieller's 95%
interval, and the contrast `text_image_tokens` minus the hard quota (the same share of each row's negatives,
its hardest by its own cross-modal logit, at the same weight), paired by seed.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .command import Command, comparison_flags, names, register_command, report_sections_of, run_or_report
from .comparison import LossVariant, loss_variants, paired_difference, read_runs_csv, share_of_gain
from .glyph_benchmark import DATA, PRETRAINING
from .headroom import ENDPOINT, ok_values
from .pretraining import Pretraining
from .study import STUDIES, Study, register_study

PREREGISTRATION = "docs/preregistration_robustness.md"
REGISTRATION = "robustness"  # its JSON block in PREREGISTRATION
WEIGHT = 16.0
# The share of negatives `text_image_tokens` flagged in the loss table (docs/results/loss_table_shares.md).
QUOTA = 0.078
CLIP, ORACLE = "clip", f"oracle:weight={WEIGHT:g}"
ONE_EDIT_ORACLE = f"oracle:weight={WEIGHT:g},family_field=clone_groups"
FINDING = f"adaclw:weight={WEIGHT:g},discovery=text_image_tokens"
TOKENS = f"adaclw:weight={WEIGHT:g},discovery=tokens"
HARD = f"adaclw:weight={WEIGHT:g},discovery=cross,quota={QUOTA:g}"
RANDOM = f"adaclw:weight={WEIGHT:g},discovery=random,quota={QUOTA:g}"
# The five a replication, the batches users train on and the weak captions run.
CORE = (CLIP, ORACLE, FINDING, TOKENS, HARD)
# Beside the primary endpoint, wherever a share is quoted.
BESIDE = (
    "clone/family",
    "clone/mark",
    "val/i2t_R@1",
    "val/t2i_R@1",
    "ret/glyph_retrieval/image_R@1",
    "ret/glyph_retrieval/text_R@1",
    "cls/glyph_letters/acc1",
)
# "Does no harm" on the batches users train on: each of these above -MARGIN at its paired interval's lower end.
NO_HARM = BESIDE[2:]
MARGIN = 0.02
SIBLINGS = "adaclw/sibling_share_mean"  # share of negatives that are siblings, on the training batches
FLAGGED = "adaclw/clone_share_mean"
PRECISION = "adaclw/flag_precision_mean"


@dataclass(frozen=True)
class Table:
    """One registered table of the pre-registration: its study's cell, checkpoint, variants and seeds."""

    name: str  # the table as the command names it
    title: str
    recipe: str
    variants: Tuple[str, ...]
    seeds: Tuple[int, ...]
    pretraining: Pretraining = PRETRAINING

    @property
    def study(self) -> str:
        return f"robustness_{self.name.replace('-', '_')}"


def pretraining_of(seed: int) -> Pretraining:
    """An independently pretrained common checkpoint: the same recipe and data, another pretraining seed."""
    return Pretraining(f"clip-seed{seed}", PRETRAINING.recipe, seed, DATA, PRETRAINING.log_every_n_steps)


CELL = "glyphs-finetune-gold-long-16fam"
SEEDS = tuple(range(35, 45))
FEWER_SEEDS = tuple(range(35, 41))
TABLES = (
    Table(
        "dose",
        "Table 1: controls at the same dose",
        CELL,
        (CLIP, ORACLE, ONE_EDIT_ORACLE, "hnnce", FINDING, TOKENS, HARD, RANDOM),
        SEEDS,
    ),
    Table("random-batches", "Table 3: batches drawn at random", f"{CELL}-random", CORE, FEWER_SEEDS),
    Table("checkpoint-1001", "Table 2: checkpoint clip-seed1001", CELL, CORE, FEWER_SEEDS, pretraining_of(1001)),
    Table("checkpoint-1002", "Table 2: checkpoint clip-seed1002", CELL, CORE, FEWER_SEEDS, pretraining_of(1002)),
    Table("weak", "Table 4: weak captions", "glyphs-finetune-weak-long-16fam", CORE, FEWER_SEEDS),
)
BY_NAME = {table.name: table for table in TABLES}
# Table 2 pools the first table's runs (checkpoint clip-seed1000) with the two replications'.
REPLICATION = ("dose", "checkpoint-1001", "checkpoint-1002")


def variants(table: Table) -> Tuple[LossVariant, ...]:
    return loss_variants(*table.variants)


for _table in TABLES:
    register_study(
        Study(
            name=_table.study,
            data=DATA,
            recipe=_table.recipe,
            variants=variants(_table),
            seeds=_table.seeds,
            preregistration=PREREGISTRATION,
            endpoints=(REGISTRATION,),
            report=f"docs/results/{_table.study}.md",
            pretraining=_table.pretraining,
        )
    )


# --- the shares page, from the committed per-run CSVs ---------------------------------------------------------


def interval_text(outcomes: Sequence[Mapping[str, Any]], label: str, reference: str, key: str) -> str:
    difference = paired_difference(outcomes, label, reference, key)
    return "n/a" if difference is None else f"{difference.mean:+.3f} {difference.interval_text(0.95)}"


def share_text(outcomes: Sequence[Mapping[str, Any]], label: str, key: str = ENDPOINT) -> str:
    share = share_of_gain(outcomes, label, ORACLE, CLIP, key)
    return "n/a" if share is None else f"{share.text()} ({share.n})"


def mean_text(outcomes: Sequence[Mapping[str, Any]], label: str, key: str) -> str:
    values = ok_values(outcomes, label, key)
    return f"{statistics.fmean(values):.3f}" if values else "-"


def contrast_verdict(outcomes: Sequence[Mapping[str, Any]]) -> str:
    """The registered reading of `text_image_tokens` minus the hard quota on the primary endpoint."""
    difference = paired_difference(outcomes, FINDING, HARD, ENDPOINT)
    if difference is None or len(difference.differences) < 2:
        return "not resolved (fewer than 2 paired seeds)"
    low, high = difference.interval(0.95)
    if low > 0:
        return "clone discovery gains beyond the same dose of hard-negative weighting"
    if -MARGIN <= low and high <= MARGIN:
        return f"no gain beyond the hard quota (within +-{MARGIN:g}): the gain is hard-negative weighting at that dose"
    return "not resolved"


def harm_verdict(outcomes: Sequence[Mapping[str, Any]], label: str) -> str:
    """Does no harm: every NO_HARM endpoint's paired lower end above -MARGIN; harm: one below it with its mean
    below 0; else unresolved."""
    verdicts = []
    for key in NO_HARM:
        difference = paired_difference(outcomes, label, CLIP, key)
        if difference is None or len(difference.differences) < 2:
            return "not resolved"
        low, _ = difference.interval(0.95)
        verdicts.append("ok" if low > -MARGIN else ("harm" if difference.mean < 0 else "unresolved"))
    if "harm" in verdicts:
        return "**harm** on " + ", ".join(f"`{key}`" for key, v in zip(NO_HARM, verdicts) if v == "harm")
    return "does no harm" if all(v == "ok" for v in verdicts) else "unresolved"


def table_lines(table: Table, outcomes: Sequence[Mapping[str, Any]]) -> List[str]:
    lines = [
        f"## {table.title}",
        "",
        f"Study `{table.study}`: recipe `{table.recipe}`, common checkpoint `{table.pretraining.name}`, seeds "
        f"{table.seeds[0]}-{table.seeds[-1]}; per-run CSV [{table.study}_runs.csv]({table.study}_runs.csv). "
        f"Sibling negatives on the training batches (`{SIBLINGS}`, mean over the `adaclw` runs): "
        + (
            f"{statistics.fmean(values):.4f}."
            if (values := [v for label in table.variants for v in ok_values(outcomes, label, SIBLINGS)])
            else "not logged."
        ),
        "",
        f"| variant | ok / runs | `{ENDPOINT}` | gain over `clip` [95%] | share of the oracle's gain [95%] (seeds) | "
        "share on `clone/family` | flagged | flag precision | "
        + " | ".join(f"gain, `{key}`" for key in BESIDE[1:])
        + " |",
        "|---" * (8 + len(BESIDE) - 1) + "|",
    ]
    for label in table.variants:
        runs = [r for r in outcomes if r["label"] == label]
        if not runs:
            lines.append(f"| `{label}` | not run |" + " |" * (6 + len(BESIDE) - 1))
            continue
        ok = sum(r["verdict"] == "ok" for r in runs)
        reference, control = label == CLIP, label in (CLIP, ORACLE)
        lines.append(
            f"| `{label}` | {ok} / {len(runs)} | {mean_text(outcomes, label, ENDPOINT)} | "
            + ("-" if reference else interval_text(outcomes, label, CLIP, ENDPOINT))
            + f" | {'-' if control else share_text(outcomes, label)}"
            + f" | {'-' if control else share_text(outcomes, label, 'clone/family')}"
            + f" | {mean_text(outcomes, label, FLAGGED)} | {mean_text(outcomes, label, PRECISION)} | "
            + " | ".join("-" if reference else interval_text(outcomes, label, CLIP, key) for key in BESIDE[1:])
            + " |"
        )
    lines += [
        "",
        f"Primary contrast, `{FINDING}` minus the hard quota `{HARD}` on `{ENDPOINT}`: "
        f"{interval_text(outcomes, FINDING, HARD, ENDPOINT)}; **{contrast_verdict(outcomes)}**.",
    ]
    if table.name == "random-batches":
        lines += [
            "",
            f"Does no harm (each of {', '.join(f'`{key}`' for key in NO_HARM)} with its paired 95% lower end above "
            f"-{MARGIN:g} against `clip`):",
            "",
            *(f"- `{label}`: {harm_verdict(outcomes, label)}" for label in table.variants if label != CLIP),
        ]
    return lines + [""]


def pooled(outcomes_by_table: Mapping[str, Sequence[Mapping[str, Any]]]) -> List[Dict[str, Any]]:
    """The replication's outcomes as one set, each run's seed made its (checkpoint, seed) pair: pairing stays
    within a checkpoint."""
    return [
        {**run, "seed": position * 1000 + run["seed"]}
        for position, name in enumerate(REPLICATION)
        for run in outcomes_by_table.get(name, [])
        if run["label"] in CORE
    ]


def replication_lines(outcomes_by_table: Mapping[str, Sequence[Mapping[str, Any]]]) -> List[str]:
    lines = [
        "## Table 2: the replication, per checkpoint and pooled",
        "",
        f"Share of the oracle's gain on `{ENDPOINT}` [Fieller 95%] (paired seeds), whole-family share beside it, and "
        "the primary contrast; pooled over every (checkpoint, seed) pair. The finding replicates if the pooled "
        "share's interval lies above 0 and at least two checkpoints' point estimates are >= 50%.",
        "",
        "| checkpoint | `clip` | oracle gain | `text_image_tokens` share | on `clone/family` | `tokens` share | "
        "hard-quota share | `text_image_tokens` - hard |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = [(BY_NAME[name].pretraining.name, outcomes_by_table.get(name, [])) for name in REPLICATION]
    rows.append(("pooled", pooled(outcomes_by_table)))
    for name, outcomes in rows:
        if not outcomes:
            lines.append(f"| `{name}` | not run |" + " |" * 6)
            continue
        lines.append(
            f"| `{name}` | {mean_text(outcomes, CLIP, ENDPOINT)} | {interval_text(outcomes, ORACLE, CLIP, ENDPOINT)} | "
            f"{share_text(outcomes, FINDING)} | {share_text(outcomes, FINDING, 'clone/family')} | "
            f"{share_text(outcomes, TOKENS)} | {share_text(outcomes, HARD)} | "
            f"{interval_text(outcomes, FINDING, HARD, ENDPOINT)} |"
        )
    shares = [share_of_gain(outcomes, FINDING, ORACLE, CLIP, ENDPOINT) for _, outcomes in rows[:-1] if outcomes]
    whole = share_of_gain(rows[-1][1], FINDING, ORACLE, CLIP, ENDPOINT) if rows[-1][1] else None
    if len(shares) == len(REPLICATION) and whole is not None:
        replicates = (
            whole.interval is not None
            and whole.interval[0] > 0
            and sum(share is not None and share.share >= 0.5 for share in shares) >= 2
        )
        lines += ["", f"**The finding {'replicates' if replicates else 'does not replicate'}** by the registered rule."]
    else:
        lines += ["", "The replication is not complete: no verdict."]
    return lines + [""]


def summary_lines(results_dir: Path) -> List[str]:
    outcomes_by_table = {
        table.name: read_runs_csv(path)
        for table in TABLES
        if (path := results_dir / f"{table.study}_runs.csv").is_file()
    }
    lines = [
        "# Results: the loss table's finding tested where it could fail",
        "",
        "Generated by `python -m studies robustness --summary` from the per-run CSVs named under each table (each "
        f"run's commit in its `code` column); registered before its runs in "
        f"[preregistration_robustness.md](../preregistration_robustness.md). Endpoint `{ENDPOINT}`; gains paired by "
        "seed against `clip` with their 95% paired-t interval; shares of the oracle's (`"
        f"{ORACLE}`) gain with Fieller's 95% interval. The quota controls weight round({QUOTA:g} x 127) = 10 of "
        "each row's negatives x16: the hard quota its hardest by its own cross-modal logit, the random quota a "
        "fresh draw each step.",
        "",
    ]
    for table in TABLES:
        if table.name in outcomes_by_table:
            lines += table_lines(table, outcomes_by_table[table.name])
        else:
            lines += [f"## {table.title}", "", "Not run.", ""]
    return lines + replication_lines(outcomes_by_table)


def write_summary(results_dir: Path) -> Path:
    page = results_dir / "robustness_shares.md"
    page.write_text("\n".join(summary_lines(results_dir)).rstrip("\n") + "\n")
    return page


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tables",
        default=None,
        help=f"comma-separated, of {', '.join(BY_NAME)} (default: all, in the registered order)",
    )
    parser.add_argument(
        "--summary", action="store_true", help="<results-dir>/robustness_shares.md from the tables' per-run CSVs"
    )
    comparison_flags(parser, "runs/robustness", "default: each table's registered seeds")


def run(args: argparse.Namespace) -> None:
    if args.summary:
        print(f"wrote {write_summary(args.results_dir or Path('docs/results'))}")
        return
    chosen = names(args.tables, list(BY_NAME), "table")
    run_or_report([STUDIES.get(BY_NAME[name].study) for name in chosen], args)


def section_reports() -> Mapping[str, Optional[str]]:
    found: Dict[str, Optional[str]] = {}
    for table in TABLES:
        if (Path(__file__).resolve().parents[1] / "docs" / "results" / f"{table.study}_runs.csv").is_file():
            found.update(report_sections_of(STUDIES.get(table.study)))
    return found


register_command(
    Command(
        "robustness",
        __doc__,
        run,
        options,
        reports=lambda docs: [write_summary(docs / "results")],
        section_reports=section_reports(),
    )
)
