"""Verdicts and aggregation: which runs count, and what the ok runs say per variant and against the baseline.

Every run gets a verdict (`assess_run`): failed (crashed, or no record), nonfinite (NaN/inf loss
or metric), collapsed (training loss pinned near ln(batch) for a softmax loss, or val R@1 under
twice chance, docs/method.md §4b) or ok. Means and standard deviations (`summarize`) and paired
differences to the baseline over seeds (`paired_difference`) are over the ok runs only.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .jobs import FAILED, NONFINITE, OK

TIE = 5e-4  # mean differences below this are reported as ties (the tables show 3 decimals)
COLLAPSED = "collapsed"  # the verdict of a run that finished but learned (next to) nothing


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


def section_keys(summaries: Sequence[VariantSummary], prefix: str | Tuple[str, ...]) -> List[str]:
    """The metric names (any variant has) that start with `prefix`, in `metric_order`."""
    keys = {key for summary in summaries for key in summary.metrics}
    return sorted((key for key in keys if key.startswith(prefix) and key != "train/steps"), key=metric_order)


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
