"""What a comparison shows, in words and tables: the ranking per metric, each variant against the baseline,
the primary endpoint's verdict per variant (with a pre-registration) and the Holm-corrected paired
comparison with the reference; the report (studies.comparison.report) puts them in order."""

from __future__ import annotations

import math
from fnmatch import fnmatchcase
from typing import Any, List, Mapping, Optional, Sequence

from .jobs import BASELINE, OK
from .preregistration import Preregistration
from .stats import (
    FAMILY_ALPHA,
    PAIRED_PREFIXES,
    TIE,
    MetricStats,
    PairedDifference,
    SecondaryTest,
    VariantSummary,
    chance_level,
    metric_order,
    paired_codes,
    paired_difference,
    pairs_needed,
    primary_verdict,
    secondary_tests,
    section_keys,
    tracking_baseline,
)

TRACKING = 0.01  # a variant within this of the baseline on every metric, seed for seed, is reported so
CLONE_EDIT_TYPES = ("color", "shape", "size", "relation")
# The Holm family of the secondary tests, exactly as docs/preregistration.md registers it.
SECONDARY_FAMILY = tuple(
    f"clone/{edit}{suffix}" for edit in CLONE_EDIT_TYPES for suffix in ("", "_cos_margin", "_cos_margin_p10")
) + ("val/i2t_R@1", "val/t2i_R@1")


def format_stats(stats: Optional[MetricStats]) -> str:
    if stats is None:
        return "-"
    if stats.n < 2:
        return f"{stats.mean:.3f} (1 run)"
    return f"{stats.mean:.3f} ± {stats.std:.3f}"


def markdown_table(summaries: Sequence[VariantSummary], keys: Sequence[str]) -> List[str]:
    """Rows: variants; columns: runs ok, then `keys` as mean ± std over ok runs."""
    lines = ["| variant | runs | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for summary in summaries:
        cells = [format_stats(summary.metrics.get(key)) for key in keys]
        lines.append(f"| `{summary.label}` | {summary.runs_text()} | " + " | ".join(cells) + " |")
    return lines


def flagged_runs(outcomes: Sequence[Mapping[str, Any]]) -> List[str]:
    """A Markdown list item per run that is not ok, with why."""
    return [
        f"- `{outcome['name']}`: **{outcome['verdict']}**: {'; '.join(outcome['reasons'])}"
        for outcome in outcomes
        if outcome["verdict"] != OK
    ]


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
    return text + f", ahead of `{second.label}` ({format_stats(second.metrics[key])}) by {gap:.3f}, " + verdict + "."


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
        parts.append(
            f"`{summary.label}` {gap:+.3f}" + (" (beyond the seed spread)" if clear else " (within the seed spread)")
        )
    if not parts:
        return None
    return f"Against `{baseline.label}` on {key} ({format_stats(reference)}): " + ", ".join(parts) + "."


def baseline_difficulty(baseline: VariantSummary, threshold: float = 0.9, chance_margin: float = 0.05) -> Optional[str]:
    """How hard clone selection is for the baseline: edit types below `threshold` (issue 4 asks for
    at least two) and those still within `chance_margin` of chance (0.5), where no loss can show a gain."""
    edits = {
        key.removeprefix("clone/"): stats.mean
        for key, stats in baseline.metrics.items()
        if key.startswith("clone/") and key != "clone/overall" and "_margin" not in key
    }
    if not edits:
        return None
    below = sorted(edit for edit, mean in edits.items() if mean < threshold)
    text = f"`{baseline.label}` is below {threshold} on {len(below)} of {len(edits)} clone edit types" + (
        f" ({', '.join(below)})" if below else ""
    )
    at_chance = sorted(
        edit
        for edit, mean in edits.items()
        if chance_level(f"clone/{edit}") is not None and abs(mean - 0.5) < chance_margin
    )
    if at_chance:
        text += f", and within {chance_margin} of chance (0.5) on {', '.join(at_chance)}"
    return text + "."


def format_p(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if value >= 0.001 else f"{value:.1e}"


def primary_table(
    outcomes: Sequence[Mapping[str, Any]], labels: Sequence[str], reference: str, preregistration: Preregistration
) -> List[str]:
    """One row per variant: the endpoint's paired difference to the reference, both intervals, the verdict."""
    lines = [
        "| variant | endpoint | margin | pairs | mean difference | 95% interval | 90% interval | verdict | "
        "pairs needed (detect / equivalence) | code |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label in labels:
        if label == reference:
            continue
        difference = paired_difference(outcomes, label, reference, preregistration.key)
        verdict, why = primary_verdict(difference, preregistration.margin, preregistration.helps_beyond_margin)
        cells = (
            ["-", "-", "-"]
            if difference is None
            else [f"{difference.mean:+.4f}", difference.interval_text(0.95), difference.interval_text(0.90)]
        )
        lines.append(
            f"| `{label}` | {preregistration.endpoint} | ±{preregistration.margin:g} | "
            f"{0 if difference is None else difference.n} | " + " | ".join(cells) + f" | **{verdict}** ({why}) | "
            f"{needed_text(difference, preregistration.margin)} | {pair_code_text(outcomes, label, reference)} |"
        )
    return lines


def needed_text(difference: Optional[PairedDifference], margin: float) -> str:
    """`12 / 30`: the pairs at which, with the observed mean and spread, the verdict would reach helps/hurts and
    no effect with 80% power (`stats.pairs_needed`); `-` where it cannot."""
    if difference is None:
        return "-"
    return " / ".join("-" if n is None else str(n) for n in pairs_needed(difference, margin))


def pair_code_text(outcomes: Sequence[Mapping[str, Any]], label: str, reference: str) -> str:
    """The code the pairs ran: `git X (5 pairs)`, or each pair's when they differ."""
    pairs = paired_codes(outcomes, label, reference)
    codes = {code for _, mine, theirs in pairs for code in (mine, theirs)}
    if len(codes) == 1:
        return f"{codes.pop()} ({len(pairs)} pair{'s' * (len(pairs) != 1)})"
    return "; ".join(f"seed {seed}: {mine} vs {theirs}" for seed, mine, theirs in pairs) or "-"


def primary_section(
    outcomes: Sequence[Mapping[str, Any]], labels: Sequence[str], reference: str, preregistration: Preregistration
) -> List[str]:
    where = (
        f"pre-registered in `{preregistration.source}`"
        if preregistration.source
        else "given on the command line (no pre-registration file)"
    )
    bound = f"+{preregistration.margin:g} (outside the margin)" if preregistration.helps_beyond_margin else "0"
    return [
        "## Primary endpoint",
        "",
        f"`{preregistration.endpoint}`: the per-run mean of {', '.join(preregistration.metrics)}; equivalence "
        f"margin ±{preregistration.margin:g}; reference `{reference}`; {where}. Each variant is paired with "
        f"`{reference}` seed for seed (runs where both are ok). Verdict: **helps** if the 95% paired-t interval of "
        f"(variant - reference) is above {bound}, **hurts** if below {bound.replace('+', '-')}, else **no effect** if "
        "the 90% interval lies inside "
        "±margin (TOST at 5%), else **inconclusive**. Fewer than 2 pairs, or zero variance (every pair differs by "
        "the same amount), give no interval and are inconclusive; a variant identical to the reference on every "
        "pair is no effect. *Pairs needed*: with the observed mean difference and spread, the pairs at which the "
        "95% interval would exclude 0, and the 90% interval would lie inside ±margin, each with 80% power.",
        "",
        *primary_table(outcomes, labels, reference, preregistration),
        "",
    ]


def secondary_keys(
    summaries: Sequence[VariantSummary], registered: bool, family: Optional[Sequence[str]] = None
) -> List[str]:
    """The paired metrics tested together as secondary endpoints (Holm's family).

    `registered` (a comparison with a pre-registration file): exactly the registered family, those of its metrics
    the runs have: `family` (names or shell patterns, in their order; the registration's `secondary_family`),
    else the scenes' (docs/preregistration.md, "Secondary metrics"): per edit type the clone-selection
    accuracy, the mean cosine margin and its 10th percentile; val R@1 both ways. Otherwise
    every paired metric the runs have. Logit margins (`_margin` without `cos`) are never in it: they are the
    cosine margins times each model's own logit scale, so they test the temperature as much as the clone
    handling (the clone table shows them)."""
    present = section_keys(summaries, PAIRED_PREFIXES)
    if registered:
        return list(
            dict.fromkeys(key for pattern in family or SECONDARY_FAMILY for key in present if fnmatchcase(key, pattern))
        )
    return [key for key in present if not key.endswith("_margin") or key.endswith("_cos_margin")]


def secondary_table(tests: Mapping[str, Mapping[str, SecondaryTest]]) -> List[str]:
    lines = [
        "| variant | metric | pairs | mean difference | 95% interval | p | Holm p | |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, by_key in tests.items():
        for key, test in by_key.items():
            difference = test.difference
            lines.append(
                f"| `{label}` | {key} | {difference.n} | {difference.mean:+.4f} | "
                f"{difference.interval_text(0.95)} | {format_p(test.p_value)} | {format_p(test.adjusted)} | "
                + ("*" if test.significant else "")
                + " |"
            )
    return lines


def secondary_findings(
    tests: Mapping[str, Mapping[str, SecondaryTest]], summaries: Sequence[VariantSummary], reference: str
) -> List[str]:
    """One sentence per variant: the secondary differences that survive the Holm correction."""
    runs = {summary.label: summary.runs_text() for summary in summaries}
    lines = []
    for label, by_key in tests.items():
        prefix = f"`{label}` vs `{reference}`: "
        if not by_key:
            lines.append(prefix + f"no seed where both runs are ok ({runs.get(label, 'no runs')}).")
            continue
        significant = {key: test for key, test in by_key.items() if test.significant}
        if not significant:
            smallest = min(test.adjusted for test in by_key.values())
            lines.append(
                prefix + f"no secondary difference survives the Holm correction (smallest Holm p {format_p(smallest)})."
            )
            continue
        parts = []
        for side, sign in (("better", 1), ("worse", -1)):
            items = [
                f"{key} {test.difference.mean:+.3f} (Holm p {format_p(test.adjusted)})"
                for key, test in significant.items()
                if sign * test.difference.mean > 0
            ]
            if items:
                parts.append(f"{side} on {', '.join(items)}")
        lines.append(prefix + "; ".join(parts) + ".")
    return lines


def paired_section(
    outcomes: Sequence[Mapping[str, Any]],
    summaries: Sequence[VariantSummary],
    reference: str,
    preregistration: Preregistration,
) -> List[str]:
    tests = secondary_tests(
        outcomes,
        [summary.label for summary in summaries],
        reference,
        secondary_keys(summaries, registered=bool(preregistration.source), family=preregistration.secondary_family),
    )
    size = sum(len(by_key) for by_key in tests.values())
    return [
        f"## Paired against `{reference}`",
        "",
        f"Secondary endpoints: each row is the mean over seeds of (variant - `{reference}`) on runs with the same "
        "seed (same initialisation and data order; only seeds where both runs are ok), its 95% paired-t interval, "
        f"the two-sided paired-t p and the Holm-adjusted p over all {size} rows of this table (family-wise alpha "
        f"{FAMILY_ALPHA:g}; a row without an interval counts as p = 1). `*` marks a difference the Holm correction "
        f"rejects (and at least {TIE:g} in size).",
        "",
        *secondary_table(tests),
        "",
        *secondary_findings(tests, summaries, reference),
        "",
    ]


def reference_label(labels: Sequence[str], preregistration: Preregistration) -> Optional[str]:
    """The variant every other is paired with: the registered one (which must be run), else `clip`, else the first."""
    if preregistration.reference is not None:
        if preregistration.reference not in labels:
            raise ValueError(
                f"the reference variant {preregistration.reference!r} is not among the variants "
                f"({', '.join(labels)}); add it to --losses or pass another --reference"
            )
        return preregistration.reference
    return BASELINE if BASELINE in labels else (labels[0] if labels else None)


def check_endpoint(outcomes: Sequence[Mapping[str, Any]], preregistration: Preregistration) -> None:
    """The endpoint's metrics exist in the ok runs (a misspelt name would otherwise just leave it empty)."""
    ok_metrics = {key for outcome in outcomes if outcome["verdict"] == OK for key in outcome["metrics"]}
    unknown = [metric for metric in preregistration.metrics if metric not in ok_metrics]
    if ok_metrics and unknown:
        raise ValueError(
            f"the primary endpoint's {', '.join(unknown)} is in no ok run's metrics; choose from "
            f"{', '.join(sorted(ok_metrics, key=metric_order))}"
        )


def findings(
    summaries: Sequence[VariantSummary], outcomes: Sequence[Mapping[str, Any]], reference: Optional[str]
) -> List[str]:
    """The "what this shows" paragraph, computed from the numbers alone."""
    lines = []
    for key in ("clone/overall", "val/t2i_R@1", "val/i2t_R@1"):
        sentence = compare(summaries, key)
        if sentence:
            lines.append(sentence)
    baseline = next((s for s in summaries if s.label == reference), None)
    if baseline is not None and baseline.num_ok:
        for sentence in (versus_baseline(summaries, baseline, "clone/overall"), baseline_difficulty(baseline)):
            if sentence:
                lines.append(sentence)
        for summary in summaries:
            difference = None if summary is baseline else tracking_baseline(outcomes, summary.label, baseline.label)
            if difference is not None and difference < TRACKING:
                lines.append(
                    f"`{summary.label}` matches `{baseline.label}` seed for seed (largest difference on "
                    f"any metric {difference:.4f}): under this budget it trains like `{baseline.label}`."
                )
    flagged = [s for s in summaries if s.num_ok < s.num_runs]
    if flagged:
        lines.append(
            "Runs excluded from the means: "
            + "; ".join(f"`{s.label}` {s.runs_text()}" for s in flagged)
            + " (listed below with the reason)."
        )
    else:
        lines.append(f"All {len(outcomes)} runs finished with finite losses and above-chance recall (none excluded).")
    return lines
