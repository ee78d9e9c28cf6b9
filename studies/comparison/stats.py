"""Verdicts and aggregation: which runs count, and what the ok runs say per variant and against the reference.

Every run gets a verdict (`assess_run`): failed (crashed, or no outcome), nonfinite (NaN/inf loss
or metric), collapsed (val CLIP loss within 5% of its chance value ln(val batch), or val R@1 under
twice chance, docs/adacl.md §5) or ok. Means and standard deviations (`summarize`) and paired
differences to the reference over seeds (`paired_difference`) are over the ok runs only.

The paired statistics (docs/cluster.md, "Running the loss comparison"), per variant against the
reference, on seeds where both runs are ok:

- the primary endpoint (`preregistration`) gets exactly one verdict (`primary_verdict`): *helps*
  (95% paired-t interval of variant - reference entirely above 0), *hurts* (entirely below 0), *no
  effect* (the 90% interval entirely inside [-margin, +margin]: both one-sided tests of TOST reject at
  5%), else *inconclusive*; helps and hurts are checked first, so a difference that is significant but
  inside the margin is reported as helps or hurts. A registration that puts helps "above 0 and outside
  the margin" (`beyond_margin`, docs/preregistration_glyphs.md) needs the 95% interval entirely above
  +margin (hurts: below -margin); a significant difference inside the margin is then judged by TOST;
- every metric of the registered secondary family (`findings.SECONDARY_FAMILY`: per edit type clone
  accuracy, cosine margin and its 10th percentile; val R@1) x variant is one secondary test
  (two-sided paired t), Holm-Bonferroni corrected over that whole family at a family-wise alpha of
  0.05 (`holm`); a rejected difference smaller than TIE is not marked (float noise);
- fewer than 2 pairs: no interval, inconclusive, never significant;
- zero variance (every pair differs by the same amount, up to float rounding): the t interval is
  degenerate (width 0; a spread estimated as 0 from a few seeds says how coarse the metric is, not
  how sure the difference is), so it is reported as "n/a (zero variance)", is never significant
  (counted in the Holm family with p = 1) and its verdict is inconclusive; except when that common
  difference is exactly 0 on every pair, i.e. the variant scored exactly what the reference scored on
  every seed, which is *no effect* (the report says "identical on every pair").
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .jobs import FAILED, NONFINITE, OK

COLLAPSED = "collapsed"  # the verdict of a run that finished but learned (next to) nothing


@dataclass(frozen=True)
class CollapseCriteria:
    """When a finished run counts as collapsed: its features stopped telling pairs apart (docs/adacl.md §5).

    loss_band: the final val CLIP loss (ClipLoss within each val batch, whatever loss trained the model) lies
        within this fraction of its chance value ln(val batch size): what equal logits give. Judged on the val
        CLIP loss, not the training loss, which a loss may lower without learning (AdaCL's progressive p_u
        carries a positive logit forward that the features no longer earn). A val loss far *above* chance is a
        confidently wrong model (e.g. trained on other captions than it is validated on), not a collapsed one.
    recall_factor: mean val R@1 of the two directions below this many times chance (1 / val size).
    above_chance_factor: a run whose mean val R@1 reaches this many times chance retrieves above chance and is
        not called collapsed by the loss band: with 512 val pairs a model at chance reaches 3 x chance (6 hits of
        2 x 512 at rate 1/512) in under 2% of runs, while a loss near ln(val batch) can also be a weak model
        whose logits are nearly flat (pseudo captions: CLIP's own val CLIP loss ranges 3.6-13.0 there). One rule
        for every setting (docs/preregistration.md, second amendment).
    """

    loss_band: float = 0.05
    recall_factor: float = 2.0
    above_chance_factor: float = 3.0


# Chance level of a metric where its name alone says it (first matching prefix): a choice between two captions;
# None where it depends on the set, as recall on its size and family accuracy on each family's size.
CHANCE_BY_PREFIX = {"clone/family": None, "clone/": 0.5, "sel/": 0.5}


def chance_level(key: str) -> Optional[float]:
    """The metric's chance level when it is known from its name (None: it depends on the set)."""
    return next((level for prefix, level in CHANCE_BY_PREFIX.items() if key.startswith(prefix)), None)


def assess_run(outcome: Mapping[str, Any], criteria: CollapseCriteria = CollapseCriteria()) -> Dict[str, Any]:
    """The outcome with `verdict` (ok, collapsed, nonfinite, failed) and `reasons` (why it is not ok)."""
    metrics = outcome["metrics"]
    if outcome["status"] in (FAILED, NONFINITE):
        return {**outcome, "verdict": outcome["status"], "reasons": [outcome["error"] or outcome["status"]]}
    nonfinite = sorted(key for key, value in metrics.items() if not math.isfinite(value))
    if nonfinite:
        return {**outcome, "verdict": NONFINITE, "reasons": [f"non-finite {', '.join(nonfinite)}"]}
    missing = [key for key in ("val/clip_loss", "val/i2t_R@1", "val/t2i_R@1") if key not in metrics]
    if missing or not outcome.get("val_num_samples"):
        return {**outcome, "verdict": FAILED, "reasons": [f"no {', '.join(missing) or 'val/num_samples'} recorded"]}
    reasons = []
    chance_loss = val_chance_loss(outcome)
    chance_recall = 1.0 / outcome["val_num_samples"]
    mean_recall = (metrics["val/i2t_R@1"] + metrics["val/t2i_R@1"]) / 2
    if (
        abs(metrics["val/clip_loss"] - chance_loss) <= criteria.loss_band * chance_loss
        and mean_recall < criteria.above_chance_factor * chance_recall
    ):
        reasons.append(
            f"val CLIP loss {metrics['val/clip_loss']:.3f} within {criteria.loss_band:.0%} of its chance "
            f"value {chance_loss:.3f} and val R@1 {mean_recall:.4f} below {criteria.above_chance_factor:g} "
            "x chance"
        )
    if mean_recall < criteria.recall_factor * chance_recall:
        reasons.append(
            f"val R@1 {mean_recall:.4f} < {criteria.recall_factor:g} x chance (1/{outcome['val_num_samples']:g})"
        )
    return {**outcome, "verdict": COLLAPSED if reasons else OK, "reasons": reasons}


def val_chance_loss(outcome: Mapping[str, Any]) -> float:
    """The val CLIP loss of equal logits: the trainer's sample-weighted ln(val batch size) when the outcome has it
    (`val/clip_loss_chance`), else ln(min(batch size, val samples)) (outcomes written before it was kept)."""
    recorded = outcome["metrics"].get("val/clip_loss_chance")
    if recorded is not None:
        return recorded
    return math.log(min(outcome["batch_size"], outcome["val_num_samples"]))


@dataclass
class MetricStats:
    mean: float
    std: float  # sample standard deviation (n - 1); NaN with one run
    n: int


@dataclass
class VariantSummary:
    label: str
    verdicts: Dict[str, int]  # verdict -> number of runs
    metrics: Dict[str, MetricStats] = field(default_factory=dict)

    @property
    def num_runs(self) -> int:
        return sum(self.verdicts.values())

    @property
    def num_ok(self) -> int:
        return self.verdicts.get(OK, 0)

    def runs_text(self) -> str:
        """e.g. `3/3 ok` or `1/3 ok (2 collapsed)`."""
        flagged = ", ".join(f"{count} {verdict}" for verdict, count in self.verdicts.items() if verdict != OK and count)
        return f"{self.num_ok}/{self.num_runs} ok" + (f" ({flagged})" if flagged else "")


def summarize(outcomes: Sequence[Mapping[str, Any]]) -> List[VariantSummary]:
    """Per variant (first-seen order): verdict counts, and mean/std of each metric over its ok runs only."""
    summaries: Dict[str, VariantSummary] = {}
    for outcome in outcomes:
        summary = summaries.setdefault(outcome["label"], VariantSummary(outcome["label"], {}))
        summary.verdicts[outcome["verdict"]] = summary.verdicts.get(outcome["verdict"], 0) + 1
    for label, summary in summaries.items():
        ok_runs = [outcome for outcome in outcomes if outcome["label"] == label and outcome["verdict"] == OK]
        for key in metric_keys(ok_runs):
            values = [outcome["metrics"][key] for outcome in ok_runs if key in outcome["metrics"]]
            std = statistics.stdev(values) if len(values) > 1 else math.nan
            summary.metrics[key] = MetricStats(statistics.fmean(values), std, len(values))
    return list(summaries.values())


def metric_order(key: str) -> Tuple[int, bool, str]:
    """Sort key: by section (clone, sel, cls, ret, val, train, others), `clone/overall` last in its section."""
    prefixes = ("clone/", "sel/", "cls/", "ret/", "val/", "train/")
    section = next((index for index, prefix in enumerate(prefixes) if key.startswith(prefix)), len(prefixes))
    return section, key == "clone/overall", key


def metric_keys(outcomes: Iterable[Mapping[str, Any]]) -> List[str]:
    """Every metric name in `outcomes`, in `metric_order`."""
    return sorted({key for outcome in outcomes for key in outcome["metrics"]}, key=metric_order)


def section_keys(summaries: Sequence[VariantSummary], prefix: str | Tuple[str, ...]) -> List[str]:
    """The metric names (any variant has) that start with `prefix`, in `metric_order`."""
    keys = {key for summary in summaries for key in summary.metrics}
    return sorted((key for key in keys if key.startswith(prefix) and key != "train/steps"), key=metric_order)


def tracking_baseline(outcomes: Sequence[Mapping[str, Any]], label: str, baseline: str) -> Optional[float]:
    """The largest |difference| on any metric between `label`'s ok runs and the baseline's of the same
    seed, when both have ok runs for the same seeds (else None): near 0, the loss changed nothing."""

    def ok_runs(name: str) -> Dict[int, Mapping[str, float]]:
        return {r["seed"]: r["metrics"] for r in outcomes if r["label"] == name and r["verdict"] == OK}

    mine, theirs = ok_runs(label), ok_runs(baseline)
    if not mine or mine.keys() != theirs.keys():
        return None
    return max(
        abs(mine[seed][key] - theirs[seed][key])
        for seed in mine
        for key in mine[seed].keys() & theirs[seed].keys()
        if key != "train/steps"
    )


# Metrics compared seed for seed against the reference (the "Paired" section): the secondary tests, every
# evaluation of the final model (clone selection, clip-benchmark sets, val retrieval).
PAIRED_PREFIXES = ("clone/", "sel/", "cls/", "ret/", "val/i2t_R@", "val/t2i_R@")
FAMILY_ALPHA = 0.05  # Holm-Bonferroni's family-wise error rate over the secondary tests
ZERO_SPREAD = 1e-9  # a paired sd at most this x max(1, |difference|) is zero variance (float rounding)
# Differences smaller than this are never reported as findings, however steady: float noise between runs
# that compute the same thing (a loss whose mechanism never fired) is below it, and the tables show 3 decimals.
TIE = 5e-4
HELPS, HURTS, NO_EFFECT, INCONCLUSIVE = "helps", "hurts", "no effect", "inconclusive"


@dataclass(frozen=True)
class PairedDifference:
    """variant - reference on one metric, one value per seed where both runs are ok."""

    differences: Tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.differences)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.differences)

    @property
    def sd(self) -> float:
        """Sample standard deviation of the differences; NaN with one pair."""
        return statistics.stdev(self.differences) if self.n > 1 else math.nan

    @property
    def zero_variance(self) -> bool:
        """Every pair differs by the same amount (up to float rounding)."""
        return self.n > 1 and self.sd <= ZERO_SPREAD * max(1.0, max(abs(d) for d in self.differences))

    @property
    def identical(self) -> bool:
        """The variant scored exactly what the reference scored, on every pair."""
        return self.n > 1 and all(d == 0 for d in self.differences)

    @property
    def testable(self) -> bool:
        """A paired t test means something: at least 2 pairs with a nonzero spread."""
        return self.n > 1 and not self.zero_variance

    def interval(self, confidence: float) -> Optional[Tuple[float, float]]:
        """The two-sided paired-t interval at `confidence` (scipy's one-sample t test of the differences); None when
        not `testable`."""
        if not self.testable:
            return None
        interval = self._t_test().confidence_interval(confidence)
        return float(interval.low), float(interval.high)

    @property
    def p_value(self) -> Optional[float]:
        """Two-sided paired-t p value of `mean == 0` (scipy's); None when not `testable`."""
        if not self.testable:
            return None
        return float(self._t_test().pvalue)

    def _t_test(self):
        from scipy import stats

        return stats.ttest_1samp(self.differences, 0.0)

    def interval_text(self, confidence: float) -> str:
        if self.n < 2:
            return "n/a (1 pair)"
        interval = self.interval(confidence)
        if interval is None:
            return "n/a (identical on every pair)" if self.identical else "n/a (zero variance)"
        return f"[{interval[0]:+.4f}, {interval[1]:+.4f}]"


def values_by_seed(outcomes: Sequence[Mapping[str, Any]], label: str, key: str) -> Dict[int, float]:
    """`label`'s value of `key` per seed, over its ok runs that hold it."""
    return {
        r["seed"]: r["metrics"][key]
        for r in outcomes
        if r["label"] == label and r["verdict"] == OK and key in r["metrics"]
    }


def paired_difference(
    outcomes: Sequence[Mapping[str, Any]], label: str, reference: str, key: str
) -> Optional[PairedDifference]:
    """`label` minus `reference` on `key`, over the seeds where both runs are ok (same init and data
    order: the pairing removes the seed-to-seed variance both share); None without any such seed."""
    mine, theirs = values_by_seed(outcomes, label, key), values_by_seed(outcomes, reference, key)
    differences = tuple(mine[seed] - theirs[seed] for seed in sorted(mine.keys() & theirs.keys()))
    return PairedDifference(differences) if differences else None


@dataclass(frozen=True)
class ShareOfGain:
    """mean(variant - reference) / mean(control - reference) over the seeds where all three runs are ok, with
    Fieller's interval for a ratio of two paired means; `interval` None: unbounded (the control's own gain is
    not resolved at that confidence, Fieller's g >= 1) or fewer than 3 seeds."""

    share: float
    interval: Optional[Tuple[float, float]]
    n: int

    def text(self) -> str:
        bounds = "[unbounded]" if self.interval is None else f"[{self.interval[0]:+.0%}, {self.interval[1]:+.0%}]"
        return f"{self.share:+.0%} {bounds}"


def fieller_interval(
    numerators: Sequence[float], denominators: Sequence[float], confidence: float
) -> Optional[Tuple[float, float]]:
    """Fieller's interval for mean(numerators) / mean(denominators), the two measured on the same units (seeds):
    every theta with (mean_a - theta mean_b)^2 <= t^2 var(mean_a - theta mean_b), t of n - 1 degrees of freedom.
    None when the set is not a bounded interval (g = t^2 var(mean_b) / mean_b^2 >= 1) or n < 3."""
    from scipy import stats

    n = len(numerators)
    if n < 3 or len(denominators) != n:
        return None
    mean_a, mean_b = statistics.fmean(numerators), statistics.fmean(denominators)
    v11 = statistics.variance(numerators) / n
    v22 = statistics.variance(denominators) / n
    v12 = statistics.covariance(numerators, denominators) / n
    t = float(stats.t.ppf(0.5 + confidence / 2, n - 1))
    if v22 == 0 or mean_b == 0 or t * t * v22 / (mean_b * mean_b) >= 1:
        return None
    g = t * t * v22 / (mean_b * mean_b)
    ratio = mean_a / mean_b
    spread = v11 - 2 * ratio * v12 + ratio * ratio * v22 - g * (v11 - v12 * v12 / v22)
    half = t / abs(mean_b) * math.sqrt(max(spread, 0.0))
    centre = ratio - g * v12 / v22
    return (centre - half) / (1 - g), (centre + half) / (1 - g)


def share_of_gain(
    outcomes: Sequence[Mapping[str, Any]], label: str, control: str, reference: str, key: str, confidence: float = 0.95
) -> Optional[ShareOfGain]:
    """`label`'s paired gain over `reference` on `key` as a share of `control`'s (e.g. of the oracle's gain over
    `clip`), over the seeds where all three runs are ok; None without such seeds or when the control's mean gain
    is 0."""
    mine, theirs, base = (values_by_seed(outcomes, name, key) for name in (label, control, reference))
    seeds = sorted(mine.keys() & theirs.keys() & base.keys())
    gains = [mine[seed] - base[seed] for seed in seeds]
    control_gains = [theirs[seed] - base[seed] for seed in seeds]
    if not seeds or statistics.fmean(control_gains) == 0:
        return None
    share = statistics.fmean(gains) / statistics.fmean(control_gains)
    return ShareOfGain(share, fieller_interval(gains, control_gains, confidence), len(seeds))


def paired_codes(outcomes: Sequence[Mapping[str, Any]], label: str, reference: str) -> List[Tuple[int, str, str]]:
    """(seed, code of `label`'s run, code of `reference`'s run) of every pair where both runs are ok: what each
    pair ran (`training.trainer.run_folder.provenance.code_version`; `unknown` for outcomes written before runs kept it)."""

    def by_seed(name: str) -> Dict[int, str]:
        return {r["seed"]: r.get("code") or "unknown" for r in outcomes if r["label"] == name and r["verdict"] == OK}

    mine, theirs = by_seed(label), by_seed(reference)
    return [(seed, mine[seed], theirs[seed]) for seed in sorted(mine.keys() & theirs.keys())]


def check_same_code(outcomes: Sequence[Mapping[str, Any]], labels: Sequence[str], reference: str) -> None:
    """ValueError naming the pairs whose two runs ran different (or unknown) code: a paired difference is then
    not only the loss's."""
    mixed = [
        f"{label} seed {seed} ({mine}) vs {reference} ({theirs})"
        for label in labels
        if label != reference
        for seed, mine, theirs in paired_codes(outcomes, label, reference)
        if mine != theirs or mine.startswith("unknown")
    ]
    if mixed:
        raise ValueError(
            f"{len(mixed)} pair(s) ran different or unknown code, e.g. {'; '.join(mixed[:3])}: rerun "
            "them from one commit, or pass --pair-across-code to pair them anyway (the report then "
            "prints each pair's code)"
        )


def pairs_needed(
    difference: PairedDifference, margin: float, power: float = 0.8
) -> Tuple[Optional[int], Optional[int]]:
    """(pairs to detect the observed mean difference, pairs to show equivalence within ±margin), each with
    `power` at the decision rule's levels (two-sided 5%; TOST at 5%), from the observed spread of the
    differences; None where the observation cannot get there (a zero mean to detect, a mean outside the margin
    for equivalence, or no spread). The smallest n whose paired-t interval would clear the bound."""
    if not difference.testable:
        return None, None
    from scipy import stats

    def smallest(effect: float, alpha: float, beta: float) -> Optional[int]:
        if effect <= 0:
            return None
        for n in range(2, 10_000):
            quantiles = stats.t.ppf(1 - alpha, n - 1) + stats.t.ppf(1 - beta, n - 1)
            if math.sqrt(n) * effect / difference.sd >= quantiles:
                return n
        return None

    return (
        smallest(abs(difference.mean), 0.025, 1 - power),
        smallest(margin - abs(difference.mean), 0.05, (1 - power) / 2),
    )


def primary_verdict(
    difference: Optional[PairedDifference], margin: float, beyond_margin: bool = False
) -> Tuple[str, str]:
    """(verdict, why) on the primary endpoint: helps, hurts, no effect or inconclusive (module docstring);
    `beyond_margin`: helps and hurts need the 95% interval outside ±margin, not only outside 0."""
    if difference is None or difference.n < 2:
        pairs = 0 if difference is None else difference.n
        return INCONCLUSIVE, f"{pairs} pair{'s' * (pairs != 1)} (a paired interval needs 2)"
    if difference.identical:
        return NO_EFFECT, "identical to the reference on every pair"
    if difference.zero_variance:
        return INCONCLUSIVE, "zero variance: every pair differs by the same amount, so no interval can be estimated"
    low, high = difference.interval(0.95)
    if beyond_margin:
        if low > margin:
            return HELPS, f"the 95% interval is above +{margin:g}"
        if high < -margin:
            return HURTS, f"the 95% interval is below -{margin:g}"
    elif low > 0:
        return HELPS, "the 95% interval is above 0" + (" (inside the margin)" if high < margin else "")
    elif high < 0:
        return HURTS, "the 95% interval is below 0" + (" (inside the margin)" if low > -margin else "")
    low, high = difference.interval(0.90)
    if -margin < low and high < margin:
        return NO_EFFECT, f"TOST: the 90% interval is inside ±{margin:g}"
    if beyond_margin:
        return INCONCLUSIVE, f"the 95% interval is not outside ±{margin:g} and the 90% interval is not inside it"
    return INCONCLUSIVE, f"the 95% interval holds 0 and the 90% interval is not inside ±{margin:g}"


def holm(p_values: Sequence[float], alpha: float = FAMILY_ALPHA) -> Tuple[List[float], List[bool]]:
    """Holm-Bonferroni over one family: (adjusted p values, rejected), in the order given.

    Sorted ascending, the i-th smallest of m is rejected while p_(j) <= alpha / (m - j + 1) for every
    j <= i; its adjusted p is max over j <= i of min(1, (m - j + 1) p_(j)), so rejected == adjusted <= alpha.
    """
    m = len(p_values)
    adjusted = [1.0] * m
    running = 0.0
    for rank, index in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted, [value <= alpha for value in adjusted]


@dataclass(frozen=True)
class SecondaryTest:
    difference: PairedDifference
    p_value: Optional[float]  # raw two-sided paired t; None when not testable (then p = 1 in the family)
    adjusted: float  # Holm-adjusted over the family
    significant: bool  # Holm-rejected and at least TIE in size


def secondary_tests(
    outcomes: Sequence[Mapping[str, Any]], labels: Sequence[str], reference: str, keys: Sequence[str]
) -> Dict[str, Dict[str, SecondaryTest]]:
    """variant -> metric -> its test against `reference`, Holm-corrected over every (variant, metric) cell
    with at least one pair; labels other than the reference."""
    cells = [
        (label, key, difference)
        for label in labels
        if label != reference
        for key in keys
        if (difference := paired_difference(outcomes, label, reference, key)) is not None
    ]
    raw = [difference.p_value for _, _, difference in cells]
    adjusted, rejected = holm([1.0 if p is None else p for p in raw])
    tests: Dict[str, Dict[str, SecondaryTest]] = {label: {} for label in labels if label != reference}
    for (label, key, difference), p, p_adjusted, reject in zip(cells, raw, adjusted, rejected):
        tests[label][key] = SecondaryTest(difference, p, p_adjusted, reject and abs(difference.mean) >= TIE)
    return tests


def with_endpoint(outcomes: Sequence[Mapping[str, Any]], metrics: Sequence[str], key: str) -> List[Dict[str, Any]]:
    """The outcomes with `key` = the mean of `metrics` added, where a run has all of them."""
    return [
        {**outcome, "metrics": {**outcome["metrics"], key: statistics.fmean(outcome["metrics"][m] for m in metrics)}}
        if all(m in outcome["metrics"] for m in metrics)
        else dict(outcome)
        for outcome in outcomes
    ]
