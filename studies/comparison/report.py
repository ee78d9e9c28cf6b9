"""The report: Markdown, a PNG of the main metrics and CSVs, from the assessed outcomes.

The Markdown says what was run (the machine, the command that reproduces it, wall time, budget
and data), then the summary, what it shows, the primary endpoint's verdict per variant (with a
pre-registration), the Holm-corrected paired comparison with the reference (`clip` by default; these
three in studies.comparison.findings), one table per section and the flagged and missing runs. Hand-written sections below KEEP_MARKER in an existing report are
kept when it is written again.
"""

from __future__ import annotations

import csv
import json
import math
import shlex
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from training.trainer.data import global_batch
from training.trainer.launch.params import argv_from_values

from .data import PRETRAIN_SEED, Budget, ComparisonData
from .findings import (
    check_endpoint,
    findings,
    flagged_runs,
    markdown_table,
    paired_section,
    primary_section,
    reference_label,
)
from .jobs import BASELINE, MODEL
from .preregistration import DEFAULT_MARGIN, Preregistration
from .stats import (
    CollapseCriteria,
    VariantSummary,
    chance_level,
    check_same_code,
    metric_keys,
    paired_difference,
    section_keys,
    summarize,
    with_endpoint,
)

# Pooled over every run of a variant: the headline of the report and the bars of the plot.
HEADLINE_METRICS = ("val/i2t_R@1", "val/t2i_R@1", "clone/overall", "train/final_loss")
PLOT_PREFIXES = ("val/", "cls/", "sel/", "clone/")
PLOT_EXCLUDED = ("val/clip_loss", "val/clip_loss_chance")
# Report sections: (title, metric-name prefix, what the numbers are).
SECTIONS = (
    (
        "Clone-negative selection",
        "clone/",
        "accuracy of preferring an image's true caption over a clone that changes one detail "
        "(`training.evaluation.clone_selection`, the test scenes; chance 0.5); the margin cos(image, true) - cos(image, clone) "
        "over the test scenes, which still moves when accuracy saturates: `_cos_margin` its mean, `_cos_margin_p10` "
        "its 10th percentile (the worst-handled tenth of the scenes), `_margin` its mean in logits (x the model's "
        "logit scale)",
    ),
    (
        "clip-benchmark zero-shot",
        ("cls/", "ret/", "sel/"),
        "classification acc1 per set, retrieval recall@k, and for caption-selection sets (e.g. `sugar_crepe/*`) "
        "text_acc, the accuracy of preferring the true caption over its one-edit negative "
        "(`training.evaluation.zero_shot`, in process)",
    ),
    (
        "Validation retrieval",
        "val/",
        "R@k over the val split, both directions, and OpenCLIP's CLIP val loss (the trainer's results.jsonl)",
    ),
    ("Training", "train/", "final loss: mean of the logged step losses over the last tenth of training"),
    (
        "AdaCL mechanism",
        "adacl/",
        "from every logged step, both directions pooled: the fraction of steps that were modulated (no fallback) "
        "and on which each bound changed the closed forms, and the mean and spread (population std over steps) "
        "of the applied m1 / logit_scale, m2, the anchor similarity and the anchor's clone gap (cosine)",
    ),
    (
        "Clone detection",
        "detect/",
        "the loss's discovery step replayed on the final model over batches of whole families of the training "
        "data (`training.evaluation.clone_detection`): per `<salient>-<region>`, the precision and recall of the flagged "
        "negatives against the true one-edit siblings and the fraction of negatives flagged; `sibling_fraction` "
        "is the fraction of negatives that are siblings in those batches",
    ),
)


@dataclass
class ReportContext:
    """What the report says besides the numbers."""

    command: str
    budget: Budget
    data: ComparisonData
    data_seed: int
    seeds: List[int]
    wall_seconds: float
    machine: Dict[str, str]
    started: str
    siblings: Optional[Dict[str, float]] = None  # in-batch siblings in training (`training.synthetic_scenes.families`)
    model: str = MODEL
    benchmarks: Optional[Dict[str, Any]] = None  # the user's evaluation sets (`jobs.Benchmarks`); None: the demo's
    ranks: int = 1  # processes each run trains on (emitted jobs)
    emitted: bool = False  # the runs were written as cluster jobs (`cluster`), not run here


def data_lines(context: ReportContext) -> List[str]:
    """What the runs trained and were evaluated on: the demo data, or the user's."""
    budget, data, benchmarks = context.budget, context.data, context.benchmarks
    if benchmarks is None:
        return [
            f"- demo data (`training.synthetic_scenes`, data seed {context.data_seed}): {budget.num_train} train, "
            f"{budget.num_val} val, {budget.num_test} test scenes (clone selection and retrieval; each "
            f"classification set has as many); in `{data.root}`"
        ]
    sets = ", ".join(f"`{name}`" for name in benchmarks["datasets"]) or "none"
    clone = f"`{benchmarks['clone_selection_dir']}`" if benchmarks.get("clone_selection_dir") else "none"
    return [
        f"- training data `{data.train_data}` ({data.num_train} samples per epoch), validation `{data.val_data}`",
        f"- clip-benchmark sets {sets} (`--dataset_root {benchmarks['root']}`); clone-selection set {clone}",
    ]


def budget_lines(context: ReportContext) -> List[str]:
    budget = context.budget
    batch = global_batch(budget.batch_size, context.ranks)
    steps_per_epoch = budget.num_train // batch
    ranks = f" ({context.ranks} ranks x {budget.batch_size})" if context.ranks > 1 else ""
    concurrency = "each run one cluster job" if context.emitted else f"{budget.jobs} run(s) at a time"
    return (
        [
            f"- model `{context.model}`; every run: {budget.epochs} epochs x {steps_per_epoch} steps = "
            f"**{budget.epochs * steps_per_epoch} steps** at batch {batch}{ranks}, AdamW lr {budget.lr:g} (cosine, "
            f"{budget.warmup} warmup steps), wd {budget.wd:g}, {budget.workers} data worker(s), device {budget.device}, "
            f"precision {budget.precision or 'the trainer default'}",
            *data_lines(context),
            f"- seeds {', '.join(map(str, context.seeds))} (model init and data order); {concurrency}",
        ]
        + (
            [f"- every run also gets `{shlex.join(argv_from_values(budget.trainer_values))}`"]
            if budget.trainer_values
            else []
        )
        + (
            [
                f"- fine-tuning: every run starts from one `{BASELINE}` model pretrained for {budget.pretrain_epochs} "
                f"epochs at lr {budget.pretrain_lr:g} (seed {PRETRAIN_SEED}, same data), with `--pretrained`"
            ]
            if budget.pretrain_epochs
            else []
        )
        + (
            [
                f"- clone negatives in the training batches (the real loader, seed 0, epoch 0): "
                f"{context.siblings['siblings_per_row']:.2f} one-edit siblings per row, "
                f"{context.siblings['sibling_fraction']:.1%} of the in-batch negatives "
                f"(`--train-group-size {context.siblings['group_size']}`, `training.synthetic_scenes.families.measure_siblings`)"
            ]
            if context.siblings
            else []
        )
    )


def machine_lines(machine: Mapping[str, str]) -> List[str]:
    return [
        f"- machine: {machine['cpu']}, {machine['cores']} cores{machine.get('gpu', '')}; load average "
        f"{machine['load']} at the start",
        f"- software: Python {machine['python']}, torch {machine['torch']}, open_clip {machine['open_clip']}, "
        f"clip-benchmark {machine['clip_benchmark']}; code {machine['code']}",
    ]


def render_markdown(
    summaries: Sequence[VariantSummary],
    outcomes: Sequence[Mapping[str, Any]],
    context: ReportContext,
    plot_name: Optional[str],
    csv_name: str,
    preregistration: Preregistration = Preregistration(),
    missing: Sequence[str] = (),
) -> str:
    """The whole report; `missing`: the planned runs without an outcome (not finished, or not started)."""
    run_seconds = [r["wall_seconds"] for r in outcomes if r.get("wall_seconds")]
    num_reused = sum(bool(r.get("reused")) for r in outcomes)
    timing = (
        f"; one run (its process: start, train, evaluate) took {statistics.fmean(run_seconds):.0f} s on "
        f"average ({min(run_seconds):.0f}-{max(run_seconds):.0f} s), {context.budget.jobs} at a time"
        if run_seconds
        else ""
    )
    if num_reused:
        timing += (
            f"; {num_reused} of the runs were reused from an earlier call (their times are from it), "
            f"so this call's wall time is not the comparison's"
        )
    summed = f" ({sum(run_seconds) / 60:.1f} min of run time in all)" if run_seconds else ""
    when = (
        f"- started {context.started}; wall time **{context.wall_seconds / 60:.1f} min** for {len(outcomes)} runs"
        + summed
        + timing
    )
    if context.emitted:
        # Cluster jobs run when the scheduler starts them: only each run's own time is known.
        when = (
            f"- jobs written {context.started}; {len(outcomes)} runs with an outcome, "
            f"{sum(run_seconds) / 60:.1f} min of run time in all (each run: train, then evaluate)"
            + (f", {statistics.fmean(run_seconds):.0f} s per run on average" if run_seconds else "")
        )
    lines = [
        "# Loss comparison results",
        "",
        "Generated by `studies.comparison`; every number below comes from the runs it lists. Means and "
        "standard deviations are over the runs whose verdict is ok; collapsed, non-finite and failed runs "
        "are counted in the `runs` column and listed at the end, never averaged in.",
        "",
        "Reproduce (from the repository root):",
        "",
        "```bash",
        context.command,
        "```",
        "",
        *machine_lines(context.machine),
        when,
        *budget_lines(context),
        "",
        *report_sections(summaries, outcomes, plot_name, csv_name, preregistration, missing),
    ]
    return "\n".join(lines)


def report_sections(
    summaries: Sequence[VariantSummary],
    outcomes: Sequence[Mapping[str, Any]],
    plot_name: Optional[str],
    csv_name: str,
    preregistration: Preregistration = Preregistration(),
    missing: Sequence[str] = (),
) -> List[str]:
    """The report's sections, from `## Summary` on: everything its runs' outcomes decide (the verdicts, the
    pairs, the tables), without the header that describes how and where they ran."""
    lines = [
        "## Summary",
        "",
        *markdown_table(
            summaries,
            [
                k
                for k in (*HEADLINE_METRICS, *([preregistration.key] if preregistration.endpoint else []))
                if any(k in s.metrics for s in summaries)
            ],
        ),
        "",
    ]
    if plot_name:
        lines += [
            f"![main metrics: mean and standard deviation over ok runs, chance where known; below, the paired "
            f"differences to the reference with their 95% intervals]({plot_name})",
            "",
        ]
    labels = [summary.label for summary in summaries]
    reference = reference_label(labels, preregistration)
    lines += ["## What this shows", "", *findings(summaries, outcomes, reference), ""]
    if reference is not None and len(summaries) > 1:
        if preregistration.endpoint:
            lines += primary_section(outcomes, labels, reference, preregistration)
        lines += paired_section(outcomes, summaries, reference, preregistration)
    for title, prefix, description in SECTIONS:
        keys = section_keys(summaries, prefix)
        if keys:
            lines += [f"## {title}", "", description + ".", "", *markdown_table(summaries, keys), ""]
    flagged = flagged_runs(outcomes) + [
        f"- `{name}`: **missing**: no outcome (not finished, or not started)" for name in missing
    ]
    lines += [
        "## Flagged runs",
        "",
        *(flagged or ["None."]),
        "",
        f"Per-run numbers: [{csv_name}]({csv_name}). {collapse_rule_text()}",
        "",
    ]
    return lines


def collapse_rule_text(criteria: CollapseCriteria = CollapseCriteria()) -> str:
    """The collapse rule `stats.assess_run` judges by, as a report's footer states it."""
    return (
        f"Collapse criteria: the final val CLIP loss (ClipLoss within each val batch, whatever loss trained the "
        f"model) within {criteria.loss_band:.0%} of its chance value ln(val batch) with mean val R@1 below "
        f"{criteria.above_chance_factor:g} x chance, or mean val R@1 below {criteria.recall_factor:g} x chance."
    )


RUN_FIELDS = (
    "label",
    "loss",
    "options",
    "seed",
    "name",
    "code",
    "verdict",
    "reasons",
    "train_seconds",
    "eval_seconds",
    "wall_seconds",
)


def write_runs_csv(outcomes: Sequence[Mapping[str, Any]], path: Path) -> None:
    """One row per run: identity, verdict and reasons, timing, every metric."""
    keys = metric_keys(outcomes)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*RUN_FIELDS, *keys])
        for outcome in outcomes:
            identity = [
                outcome["label"],
                outcome["loss"],
                json.dumps(outcome["options"], sort_keys=True),
                outcome["seed"],
                outcome["name"],
                outcome.get("code") or "unknown",
                outcome["verdict"],
                "; ".join(outcome["reasons"]),
                outcome.get("train_seconds"),
                outcome.get("eval_seconds"),
                outcome.get("wall_seconds"),
            ]
            writer.writerow([*identity, *(outcome["metrics"].get(key, "") for key in keys)])


def read_runs_csv(path: Path) -> List[Dict[str, Any]]:
    """The outcomes `write_runs_csv` wrote (identity, verdict, reasons, timing, metrics), as a report's
    committed per-run CSV holds them: what a study's summary is computed from when its run folders are not
    committed. A failed run's `error` is its reasons."""
    outcomes = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            timing = {key: float(row[key]) if row.get(key) else None for key in RUN_FIELDS[8:]}
            reasons = row["reasons"].split("; ") if row["reasons"] else []
            outcomes.append(
                {
                    "label": row["label"],
                    "loss": row["loss"],
                    "options": json.loads(row["options"]),
                    "seed": int(row["seed"]),
                    "name": row["name"],
                    "code": row.get("code") or None,
                    "verdict": row["verdict"],
                    "reasons": reasons,
                    **timing,
                    "metrics": {
                        key: float(value) for key, value in row.items() if key not in RUN_FIELDS and value != ""
                    },
                }
            )
    return outcomes


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
    return [key for key in section_keys(summaries, PLOT_PREFIXES) if key not in PLOT_EXCLUDED and "_margin" not in key]


@dataclass
class PairedPoint:
    """One variant's paired difference to the reference on one metric, as the plot draws it."""

    label: str
    key: str
    mean: float
    interval: Optional[tuple]  # the 95% paired-t interval; None with fewer than 2 pairs or zero variance
    pairs: int


def paired_points(
    outcomes: Sequence[Mapping[str, Any]], labels: Sequence[str], reference: str, keys: Sequence[str]
) -> List[PairedPoint]:
    """(variant - reference) per plotted metric, seed for seed, with the interval the verdicts rest on."""
    points = []
    for label in labels:
        for key in keys:
            difference = paired_difference(outcomes, label, reference, key) if label != reference else None
            if difference is not None:
                points.append(PairedPoint(label, key, difference.mean, difference.interval(0.95), difference.n))
    return points


def paired_axis_limits(points: Sequence[PairedPoint], margin: float) -> Tuple[float, float]:
    """The difference panel's y range: every point and interval, and at least three equivalence margins either
    side, so that a difference well inside the margin (-0.002 for 0.02) looks as small as it is instead of
    filling the axis."""
    ends = [end for point in points for end in (point.interval or (point.mean, point.mean))]
    low, high = min(ends, default=0.0), max(ends, default=0.0)
    pad = 0.1 * (high - low)
    return min(low - pad, -3 * margin), max(high + pad, 3 * margin)


def write_plot(
    summaries: Sequence[VariantSummary],
    outcomes: Sequence[Mapping[str, Any]],
    reference: Optional[str],
    path: Path,
    margin: float = DEFAULT_MARGIN,
) -> bool:
    """Two panels: grouped bars (one group per main metric, one bar per variant, std error bars) with the chance
    level where known; below, each variant's paired difference to `reference` with its 95% interval, the
    numbers the verdicts rest on, over the band of +-`margin` (the equivalence margin: no effect inside it).
    False if nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = plot_keys(summaries)
    if not keys:
        return False
    labels = [summary.label for summary in summaries]
    points = paired_points(outcomes, labels, reference, keys) if reference is not None else []
    width = 0.8 / len(summaries)
    figure, (axes, paired_axes) = plt.subplots(
        2,
        1,
        figsize=(min(16.0, max(8.0, 0.22 * len(keys) * len(summaries) + 2)), 9.5),
        sharex=True,
        gridspec_kw={"height_ratios": (3, 2)},
        layout="constrained",
    )
    offsets = {label: (index - (len(summaries) - 1) / 2) * width for index, label in enumerate(labels)}
    colors = {}
    for summary in summaries:
        means = [summary.metrics[k].mean if k in summary.metrics else math.nan for k in keys]
        stds = [
            0.0 if k not in summary.metrics or math.isnan(summary.metrics[k].std) else summary.metrics[k].std
            for k in keys
        ]
        positions = [position + offsets[summary.label] for position in range(len(keys))]
        bars = axes.bar(positions, means, width, yerr=stds, capsize=2, label=f"{summary.label} ({summary.runs_text()})")
        colors[summary.label] = bars.patches[0].get_facecolor()
        # A variant without ok runs has no bar: an x on the axis marks its slot, so it is not mistaken for 0.
        missing = [position for position, mean in zip(positions, means) if math.isnan(mean)]
        if missing:  # an empty unclipped line would stretch the layout to the figure's origin
            axes.plot(missing, [0.01] * len(missing), "x", color=colors[summary.label], clip_on=False)
    chance = [(position, chance_level(key)) for position, key in enumerate(keys) if chance_level(key) is not None]
    for index, (position, level) in enumerate(chance):
        axes.hlines(
            level,
            position - 0.45,
            position + 0.45,
            colors="black",
            linestyles="--",
            linewidth=1,
            label="chance" if index == 0 else None,
        )
    axes.set_ylim(0, 1)
    axes.set_ylabel("mean over ok runs (± std)")
    axes.grid(axis="y", alpha=0.3)
    figure.legend(*axes.get_legend_handles_labels(), fontsize=8, ncol=3, loc="outside upper center", frameon=False)
    paired_axes.axhline(0.0, color="black", linewidth=1)
    paired_axes.axhspan(
        -margin,
        margin,
        color="tab:green",
        alpha=0.15,
        linewidth=0,
        label=f"equivalence margin ±{margin:g} (no effect inside)",
    )
    paired_axes.set_ylim(*paired_axis_limits(points, margin))
    paired_axes.legend(fontsize=8, loc="upper right", frameon=False)
    for point in points:
        position = keys.index(point.key) + offsets[point.label]
        low, high = point.interval if point.interval is not None else (point.mean, point.mean)
        paired_axes.errorbar(
            position,
            point.mean,
            yerr=[[point.mean - low], [high - point.mean]],
            fmt="o",
            markersize=3,
            capsize=2,
            color=colors[point.label],
        )
    paired_axes.set_ylabel(
        f"variant - {reference}, paired by seed\n(mean, 95% paired-t interval)" if reference else "no reference variant"
    )
    paired_axes.grid(axis="y", alpha=0.3)
    paired_axes.set_xticks(range(len(keys)))
    paired_axes.set_xticklabels(keys, rotation=30, ha="right", fontsize=8)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


KEEP_MARKER = "<!-- Everything below this line is kept when the loss comparison rewrites this file. -->"


# The line a report rendered again from its per-run CSV carries above its sections (`rendered_again`).
JUDGED_AGAIN = "**Judged again:** "


def rendered_again(
    page: Path, outcomes: Sequence[Mapping[str, Any]], preregistration: Preregistration, note: str
) -> str:
    """The report `page` with its header as first written (how, where and when its runs ran: up to `## Summary`,
    without an earlier JUDGED_AGAIN line), then `JUDGED_AGAIN + note`, then every section rendered again from
    `outcomes` (its per-run CSV, `read_runs_csv`, when the run folders are not committed) and its plot redrawn
    beside it; returns the new text, also written to `page`."""
    header = "\n".join(
        line for line in page.read_text().split("\n## Summary", 1)[0].split("\n") if not line.startswith(JUDGED_AGAIN)
    ).rstrip()
    summaries = summarize(outcomes)
    plot = page.with_suffix(".png")
    has_plot = write_plot(summaries, outcomes, "clip", plot, preregistration.margin)
    body = report_sections(
        summaries, outcomes, plot.name if has_plot else None, f"{page.stem}_runs.csv", preregistration
    )
    new_text = "\n".join([header, "", JUDGED_AGAIN + note, "", *body]) + kept_tail(page)
    page.write_text(new_text)
    return new_text


def kept_tail(results_md: Path) -> str:
    """The hand-written sections after KEEP_MARKER in an existing report (other measurements that
    live in the same results page), so that running the comparison again does not erase them."""
    if not results_md.is_file():
        return ""
    text = results_md.read_text()
    index = text.find(KEEP_MARKER)
    return "" if index < 0 else "\n" + text[index:]


def write_report(
    outcomes: Sequence[Mapping[str, Any]],
    context: ReportContext,
    results_md: Path,
    output_dir: Path,
    preregistration: Preregistration = Preregistration(),
    missing: Sequence[str] = (),
    pair_across_code: bool = False,
) -> str:
    """Write the report next to `results_md` (plot and per-run CSV beside it) and copies under `output_dir`.

    With a primary endpoint, each outcome gains its per-run value (`primary/<name>`) first. Pairs whose runs
    ran different code are refused unless `pair_across_code` (`stats.check_same_code`)."""
    labels = list(dict.fromkeys(outcome["label"] for outcome in outcomes))
    reference = reference_label(labels, preregistration)
    if reference is not None and not pair_across_code:
        check_same_code(outcomes, labels, reference)
    if preregistration.endpoint:
        check_endpoint(outcomes, preregistration)
        outcomes = with_endpoint(outcomes, preregistration.metrics, preregistration.key)
    summaries = summarize(outcomes)
    results_md.parent.mkdir(parents=True, exist_ok=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    plot_path = results_md.with_suffix(".png")
    csv_path = results_md.with_name(results_md.stem + "_runs.csv")
    has_plot = write_plot(summaries, outcomes, reference, plot_path, preregistration.margin)
    write_runs_csv(outcomes, csv_path)
    markdown = render_markdown(
        summaries, outcomes, context, plot_path.name if has_plot else None, csv_path.name, preregistration, missing
    )
    results_md.write_text(markdown + kept_tail(results_md))
    write_summary_csv(summaries, output_dir / "summary.csv")
    for source, name in ((results_md, "results.md"), (csv_path, "runs.csv"), (plot_path, "results.png")):
        if source.is_file() and source.resolve() != (output_dir / name).resolve():
            shutil.copyfile(source, output_dir / name)
    return markdown
