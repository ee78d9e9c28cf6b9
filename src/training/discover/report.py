"""What a run shows: summary.json, the console table, the plots and the static page index.html.

Everything here is computed from the output folder (batches.jsonl, pairs.jsonl, thumbs/), so a
resumed run reports over all of its batches, those before the interruption included.

- Flagged fraction: flagged pairs / negatives (every off-diagonal entry of each batch's matrix).
- Candidates per row: flagged pairs / rows (queries), per direction.
- With ground-truth families (every sample's json has "family", as the demo data's): the family
  precision (flagged pairs of one family / flagged pairs), the family recall (flagged sibling pairs /
  sibling pairs), and the sibling fraction (siblings / negatives): the family precision of flagging
  every negative, the base rate a discovery must beat. `kept_family_precision` is the family
  precision of the pairs written to pairs.jsonl (each row's most probable candidates). The family
  precision is a proxy of the precision: it counts every pair of one family as a clone (also two
  siblings two facts apart) and every pair of two families as a false positive (also paraphrases
  and pairs one fact apart), hence its name.
- With facts too (the json's "facts": what the caption says, each fact stated one way): the flagged
  pairs of two families whose captions state the same facts ("A below B" against "B above A") are
  paraphrases: `paraphrases` counts them and `family_precision_with_paraphrases` counts them as
  clones (also for the kept pairs). Each kept pair carries a label (`pair_label`: its families and
  how many facts its captions differ in, `facts.facts_apart`); `kept_labels` counts the kept pairs
  per label and `kept_within_one_fact` is the share of kept pairs at most one fact apart.
"""

from __future__ import annotations

import collections
import heapq
import html
import itertools
import json
import math
import string
import textwrap
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from open_clip_adacl import adacl_math

from ..trainer.data import SKIP_REASONS
from .batch import DIRECTIONS, HISTOGRAM_BINS
from .facts import differing_positions
from .store import PAIRS_FILE, read_jsonl, thumbnail_name, write_atomically

SUMMARY_FILE = "summary.json"
PAGE_FILE = "index.html"
FITS_PLOT = "plots/fits.png"
FLAGGED_PLOT = "plots/flagged.png"
POOLED = "both"


class PageSelection:
    """The pairs the page shows: the `size` with the highest posterior and the `size` with the smallest
    gap among all pairs offered so far (ties: the earlier pair)."""

    def __init__(self, size: int):
        self.size = size
        self._by_posterior: List[Tuple[float, float, int, dict]] = []  # min-heaps of the kept ones
        self._by_gap: List[Tuple[float, float, int, dict]] = []
        self._offered = 0

    def offer(self, pair: dict) -> bool:
        """Whether `pair` enters the page (now; a later pair may push it out again)."""
        self._offered += 1
        order = -self._offered  # earlier pairs win ties
        entered = self._push(self._by_posterior, (pair["posterior"], -pair["gap"], order, pair))
        return self._push(self._by_gap, (-pair["gap"], pair["posterior"], order, pair)) or entered

    def _push(self, heap: list, item: tuple) -> bool:
        if len(heap) < self.size:
            heapq.heappush(heap, item)
            return True
        if item[:3] > heap[0][:3]:
            heapq.heapreplace(heap, item)
            return True
        return False

    def pairs(self) -> List[dict]:
        """The page's pairs, most probable first (ties: smaller gap)."""
        unique = {id(item[3]): item[3] for item in self._by_posterior + self._by_gap}
        return sorted(unique.values(), key=lambda pair: (-pair["posterior"], pair["gap"]))


def page_selection_from(output: Path, size: int) -> PageSelection:
    """The selection as it stood after the pairs already in pairs.jsonl (for --continue)."""
    page = PageSelection(size)
    for pair in read_jsonl(output / PAIRS_FILE):
        page.offer(pair)
    return page


# ---------------------------------------------------------------------------------------------
# Summary


def summarize(batch_lines: Sequence[dict]) -> Dict[str, object]:
    """Totals over batches, per direction and pooled (see the module docstring for each metric)."""
    per_direction: Dict[str, Dict[str, float]] = {name: {} for name in (*DIRECTIONS, POOLED)}
    for batch_line in batch_lines:
        for direction in batch_line["directions"]:
            for name in (direction["direction"], POOLED):
                totals = per_direction[name]
                for field in (
                    "rows",
                    "negatives",
                    "flagged",
                    "flagged_siblings",
                    "siblings",
                    "kept_siblings",
                    "flagged_paraphrases",
                    "kept_paraphrases",
                ):
                    if direction.get(field) is not None:
                        totals[field] = totals.get(field, 0) + direction[field]
                for signal, counts in direction.get("signals", {}).items():
                    signal_totals = totals.setdefault("signals", {}).setdefault(signal, {})
                    for field, count in counts.items():
                        signal_totals[field] = signal_totals.get(field, 0) + count
                totals["batches"] = totals.get("batches", 0) + 1
                totals["empty_batches"] = totals.get("empty_batches", 0) + (direction["flagged"] == 0)
                totals["flat_reference_batches"] = totals.get("flat_reference_batches", 0) + direction["flat_reference"]
    skipped = {
        reason: sum(batch_line["skipped"].get(reason, 0) for batch_line in batch_lines) for reason in SKIP_REASONS
    }
    return {
        "batches": len(batch_lines),
        "samples": sum(batch_line["rows"] for batch_line in batch_lines),
        "batches_too_small": sum(1 for batch_line in batch_lines if not batch_line["directions"]),
        "skipped": {reason: count for reason, count in skipped.items() if count},
        "directions": {name: _metrics(totals) for name, totals in per_direction.items() if totals},
    }


def _metrics(totals: Dict[str, float]) -> Dict[str, float]:
    metrics = {
        "flagged_fraction": _ratio(totals["flagged"], totals["negatives"]),
        "candidates_per_row": _ratio(totals["flagged"], totals["rows"]),
        "flagged": totals["flagged"],
        "negatives": totals["negatives"],
        "rows": totals["rows"],
        "batches": totals["batches"],
        "batches_without_candidates": totals["empty_batches"],
        "flat_reference_batches": totals["flat_reference_batches"],
    }
    if "siblings" in totals:  # ground-truth families
        metrics.update(
            family_precision=_ratio(totals["flagged_siblings"], totals["flagged"]),
            family_recall=_ratio(totals["flagged_siblings"], totals["siblings"]),
            sibling_fraction=_ratio(totals["siblings"], totals["negatives"]),
            kept_family_precision=None,
            kept_siblings=totals["kept_siblings"],
        )
    if totals.get("signals"):  # --clone-signals: each one's flags at its operating point
        metrics["signals"] = {
            name: {
                "flagged_fraction": _ratio(counts["flagged"], totals["negatives"]),
                **(
                    {
                        "family_precision": _ratio(counts["flagged_siblings"], counts["flagged"]),
                        "family_recall": _ratio(counts["flagged_siblings"], totals["siblings"]),
                    }
                    if "flagged_siblings" in counts
                    else {}
                ),
            }
            for name, counts in totals["signals"].items()
        }
    if "flagged_paraphrases" in totals:  # facts known: other-family pairs that say the same thing are clones too
        metrics.update(
            paraphrases=totals["flagged_paraphrases"],
            family_precision_with_paraphrases=_ratio(
                totals["flagged_siblings"] + totals["flagged_paraphrases"], totals["flagged"]
            ),
            kept_paraphrases=totals["kept_paraphrases"],
        )
    return metrics


def _ratio(numerator: float, denominator: float) -> Optional[float]:
    return numerator / denominator if denominator else None


def add_kept_metrics(summary: Dict[str, object], output: Path) -> None:
    """What the pairs in pairs.jsonl are, per direction: their number, their family precision (the family
    counts are taken as the pairs are written), and, when they carry families, their count per label
    (`kept_labels`, the names in `label_names`) and the share at most one fact apart (of those whose facts
    could be counted)."""
    kept: Dict[str, int] = collections.Counter()
    labels: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    apart: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)  # "known", "within"
    for pair in read_jsonl(output / PAIRS_FILE):
        for name in (pair["direction"], POOLED):
            kept[name] += 1
            labels[name][pair_label(pair)] += 1
            if pair.get("facts_apart") is not None:
                apart[name]["known"] += 1
                apart[name]["within"] += pair["facts_apart"] <= 1
    for name, metrics in summary["directions"].items():
        metrics["kept_pairs"] = kept[name]
        if "kept_paraphrases" in metrics:
            metrics["kept_family_precision_with_paraphrases"] = _ratio(
                metrics["kept_siblings"] + metrics.pop("kept_paraphrases"), metrics["kept_pairs"]
            )
        if "kept_siblings" in metrics:
            metrics["kept_family_precision"] = _ratio(metrics.pop("kept_siblings"), metrics["kept_pairs"])
        if set(labels[name]) - {"none"}:
            metrics["kept_labels"] = {label: labels[name][label] for label in TRUTHS if labels[name][label]}
        if apart[name]["known"]:
            metrics["kept_within_one_fact"] = _ratio(apart[name]["within"], apart[name]["known"])
    used = {label for metrics in summary["directions"].values() for label in metrics.get("kept_labels", {})}
    if used:
        summary["label_names"] = {label: text for label, text in TRUTHS.items() if label in used}


# The console table's rows: (title, summary key); the family precision's rows carry FAMILY_NOTE's mark.
FAMILY_COLUMNS = [
    ("family precision*", "family_precision"),
    ("family recall", "family_recall"),
    ("sibling rate", "sibling_fraction"),
    ("kept family precision*", "kept_family_precision"),
]
FACTS_COLUMNS = [
    ("+ paraphrases*", "family_precision_with_paraphrases"),
    ("kept + paraphrases*", "kept_family_precision_with_paraphrases"),
    ("kept <=1 fact apart", "kept_within_one_fact"),
]
FAMILY_NOTE = (
    "* precision against the data's families, a proxy: a pair of one family counts as a clone (also "
    "siblings 2 facts apart), a pair of two families as a false positive (also paraphrases and pairs "
    "1 fact apart); + paraphrases: other families' pairs with the same facts count as clones too"
)
FACTS_NOTE = "kept <=1 fact apart: the kept pairs whose captions differ in at most 1 fact (paraphrases: 0)"


# The console table's widest line, so that it reads without wrapping in a terminal 800 px wide (about 100 columns).
TABLE_WIDTH = 88


def console_table(summary: Dict[str, object]) -> str:
    """The per-direction metrics as a fixed-width table, one metric a row and one direction a column (a column per
    metric would run past TABLE_WIDTH), what the family precision measures, and the kept pairs per label (pooled)."""
    pooled = summary["directions"].get(POOLED, {})
    rows = [("flagged", "flagged_fraction"), ("per row", "candidates_per_row")]
    if "family_precision" in pooled:
        rows += FAMILY_COLUMNS
    if "family_precision_with_paraphrases" in pooled:
        rows += [row for row in FACTS_COLUMNS if row[1] in pooled]
    directions = list(summary["directions"])
    title_width = max(len(title) for title, _ in rows)
    lines = [f"{'':<{title_width}}" + "".join(f"  {name:>9}" for name in directions)]
    for title, key in rows:
        lines.append(
            f"{title:<{title_width}}"
            + "".join(f"  {_format(summary['directions'][name].get(key)):>9}" for name in directions)
        )
    if "family_precision" in pooled:
        lines += ["", *textwrap.wrap(FAMILY_NOTE, TABLE_WIDTH)]
    if "kept_within_one_fact" in pooled:
        lines += textwrap.wrap(FACTS_NOTE, TABLE_WIDTH)
    for name, metrics in pooled.get("signals", {}).items():
        lines += textwrap.wrap(
            f"clone signal {name} (both directions): flagged {_format(metrics['flagged_fraction'])}"
            + (
                f", family precision {_format(metrics['family_precision'])}, recall {_format(metrics['family_recall'])}"
                if "family_precision" in metrics
                else ""
            ),
            TABLE_WIDTH,
        )
    if pooled.get("kept_labels"):
        shares = [
            f"{count / pooled['kept_pairs']:.1%} {TRUTHS[label]}" for label, count in pooled["kept_labels"].items()
        ]
        lines += textwrap.wrap(
            f"kept pairs ({pooled['kept_pairs']}, both directions): " + "; ".join(shares), TABLE_WIDTH
        )
    return "\n".join(lines)


def _format(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def write_summary(output: Path, summary: Dict[str, object]) -> None:
    write_atomically(output / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------
# Plots


def typical_batch(batch_lines: Sequence[dict]) -> Optional[dict]:
    """The batch whose pooled flagged fraction is the median over batches (the lower one of two)."""
    discovered = [batch_line for batch_line in batch_lines if batch_line["directions"]]
    if not discovered:
        return None

    def fraction(batch_line):
        return sum(d["flagged"] for d in batch_line["directions"]) / sum(
            d["negatives"] for d in batch_line["directions"]
        )

    return sorted(discovered, key=fraction)[(len(discovered) - 1) // 2]


def write_plots(output: Path, batch_lines: Sequence[dict], settings: Dict[str, object]) -> List[str]:
    """The fits of the typical batch and the flagged fraction per batch, as PNGs; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (output / "plots").mkdir(exist_ok=True)
    typical = typical_batch(batch_lines)
    if typical is None:
        return []
    edges = torch.linspace(-1, 1, HISTOGRAM_BINS + 1).numpy()
    figure, axes = plt.subplots(1, len(typical["directions"]), figsize=(12, 4.8), squeeze=False)
    for axis, direction in zip(axes[0], typical["directions"]):
        _plot_fits(axis, direction, edges, settings)
    figure.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=9)
    figure.suptitle(
        f"batch {typical['batch']} (median flagged fraction): the loss's two Gaussian fits and its "
        f"candidate region ({settings['candidate_region']})",
        fontsize=11,
    )
    figure.tight_layout(rect=(0, 0.12, 1, 1))
    figure.savefig(output / FITS_PLOT, dpi=110)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(12, 3.6))
    batches = [batch_line["batch"] for batch_line in batch_lines if batch_line["directions"]]
    for index, name in enumerate(DIRECTIONS):
        values = [batch_line["directions"][index] for batch_line in batch_lines if batch_line["directions"]]
        axis.plot(batches, [d["flagged"] / d["negatives"] for d in values], ".-", label=f"{name}: flagged fraction")
        if values and values[0].get("siblings") is not None:
            axis.plot(
                batches,
                [d["flagged_siblings"] / d["flagged"] if d["flagged"] else math.nan for d in values],
                "x:",
                label=f"{name}: family precision (a proxy)",
            )
    empty = [
        batch_line["batch"]
        for batch_line in batch_lines
        if batch_line["directions"] and not sum(d["flagged"] for d in batch_line["directions"])
    ]
    if empty:  # a drop to 0 is a batch where no negative reached the candidate region, not a plotting gap
        axis.plot(
            empty,
            [0] * len(empty),
            "v",
            color="tab:red",
            markersize=8,
            label=f"no candidates in the batch ({len(empty)} of {len(batches)})",
        )
    if batch_lines and batch_lines[0]["directions"] and batch_lines[0]["directions"][0].get("siblings") is not None:
        rate = sum(d["siblings"] for r in batch_lines for d in r["directions"]) / sum(
            d["negatives"] for r in batch_lines for d in r["directions"]
        )
        axis.axhline(rate, color="grey", linestyle="--", label=f"sibling base rate {rate:.3f}")
    axis.set_xlabel("batch")
    axis.set_ylim(0, 1)
    axis.set_title("per batch: the fraction of negatives flagged", fontsize=11)
    axis.legend(fontsize=9, ncol=3, loc="upper right")
    figure.tight_layout()
    figure.savefig(output / FLAGGED_PLOT, dpi=110)
    plt.close(figure)
    return [FITS_PLOT, FLAGGED_PLOT]


def _plot_fits(axis, direction: dict, edges, settings: Dict[str, object]) -> None:
    histograms = direction["histograms"]
    negatives = torch.tensor(histograms["negatives"], dtype=torch.float64)
    density = negatives.sum() * (edges[1] - edges[0])  # densities of the negatives; subsets on the same scale
    axis.stairs((negatives / density).numpy(), edges, fill=True, color="#bbbbbb", label="negatives")
    if "siblings" in histograms:
        siblings = torch.tensor(histograms["siblings"], dtype=torch.float64)
        axis.stairs(
            (siblings / density).numpy(), edges, fill=True, color="#e69f00", alpha=0.8, label="siblings (same family)"
        )
    flagged = torch.tensor(histograms["flagged"], dtype=torch.float64)
    axis.stairs((flagged / density).numpy(), edges, color="#0072b2", linewidth=1.5, label="flagged")
    mu_c, sigma_c, mu_n, sigma_n = direction["fits"]
    grid = torch.linspace(-1, 1, 801, dtype=torch.float64)
    for mu, sigma, color, name in (
        (mu_c, sigma_c, "#d55e00", "clone fit (least salient row)"),
        (mu_n, sigma_n, "#009e73", "not-clone fit (most salient row)"),
    ):
        curve = torch.exp(-0.5 * ((grid - mu) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
        axis.plot(grid.numpy(), curve.numpy(), color=color, linewidth=2, label=name)
    # The candidate region on the similarity axis: one query row over the grid, with no positive column.
    region = adacl_math.clone_candidate_mask(
        grid[None, :],
        torch.tensor([-1]),
        mu_c,
        sigma_c,
        mu_n,
        sigma_n,
        prior_ratio=settings["prior_ratio"],
        region=settings["candidate_region"],
    )[0]
    top = axis.get_ylim()[1]
    axis.fill_between(
        grid.numpy(), 0, top, where=region.numpy(), color="#56b4e9", alpha=0.15, step="mid", label="candidate region"
    )
    axis.set_ylim(0, top)
    occupied = negatives.nonzero()
    if len(occupied):  # the similarities' range, and a margin
        axis.set_xlim(max(-1.0, edges[int(occupied.min())] - 0.1), min(1.0, edges[int(occupied.max()) + 1] + 0.1))
    flagged_share = direction["flagged"] / direction["negatives"]
    axis.set_title(
        f"{direction['direction']}: {direction['flagged']} of {direction['negatives']} negatives flagged "
        f"({flagged_share:.1%})",
        fontsize=10,
    )
    axis.set_xlabel("cosine similarity")
    axis.set_ylabel("density")


# ---------------------------------------------------------------------------------------------
# The page


# Rows the default view shows at most per query (batch, direction, query row) and per batch; the page's own
# inputs change them (0: no limit), and pairs.jsonl holds every kept pair.
PER_QUERY = 1
PER_BATCH = 10


# The labels in the order a reader looks for them: the data's own clones (siblings) first, the pairs of two families
# that differ in 2 or more facts (which AdaCL should not flag) last.
LABEL_ORDER = (
    "sibling-1",
    "sibling-0",
    "sibling-2",
    "sibling-3",
    "sibling",
    "paraphrase",
    "other-1",
    "none",
    "other",
    "other-2",
)


def reading_order(pairs: Sequence[dict]) -> List[dict]:
    """The page's rows: by label (LABEL_ORDER), then each batch's best pair before any batch's second, so that the
    first screen spans the batches instead of one batch's tied posteriors; ties by posterior, then the smaller gap."""
    place: Dict[int, int] = {}
    per_batch: Dict[Tuple[str, int], int] = {}
    for pair in sorted(pairs, key=lambda pair: (-pair["posterior"], pair["gap"])):
        key = (pair_label(pair), pair["batch"])
        place[id(pair)] = per_batch[key] = per_batch.get(key, -1) + 1
    return sorted(
        pairs, key=lambda pair: (LABEL_ORDER.index(pair_label(pair)), place[id(pair)], -pair["posterior"], pair["gap"])
    )


def write_page(
    output: Path,
    summary: Dict[str, object],
    settings: Dict[str, object],
    pairs: Sequence[dict],
    plots: Sequence[str],
    table: str,
) -> None:
    pairs = reading_order(pairs)
    rows = "\n".join(_pair_row(rank, pair) for rank, pair in enumerate(pairs, start=1))
    plot_tags = "\n".join(f'<img class="plot" src="{path}" alt="{path}">' for path in plots)
    description = (
        f"{settings['model']} on {settings['data']}, global batch {settings['global_batch_size']}, "
        f"--adacl-salient {settings['salient']} --adacl-candidate-region {settings['candidate_region']}"
    )
    skipped = ", ".join(f"{reason} {count}" for reason, count in summary["skipped"].items()) or "none"
    truths = {pair_label(pair) for pair in pairs}
    page = string.Template(_PAGE).substitute(
        description=html.escape(description),
        samples=summary["samples"],
        batches=summary["batches"],
        skipped=html.escape(skipped),
        table=html.escape(table),
        plots=plot_tags,
        rows=rows,
        shown=len(pairs),
        kept=summary["directions"].get(POOLED, {}).get("kept_pairs", 0),
        per_query=PER_QUERY,
        per_batch=PER_BATCH,
        truth_options=_options(truth_options(truths)),
        edit_options=_options([(edit, f"{edit} edit") for edit in sorted({e for p in pairs for e in _edits(p)})]),
        batch_options=_options([(str(batch), f"batch {batch}") for batch in sorted({p["batch"] for p in pairs})]),
        truth_counts=html.escape(_truth_counts(pairs)),
    )
    write_atomically(output / PAGE_FILE, page)


def page_thumbnails(pairs: Iterable[dict]) -> set:
    return {
        thumbnail_name(pair[f"{side}_source"], pair[f"{side}_key"]) for pair in pairs for side in ("query", "negative")
    }


# A pair's label: what the data's ground truth says of its two samples, when the data has one (the demo's
# "family" and "facts"): one family or two, and how many facts the captions differ in (`facts.facts_apart`,
# the pair's `facts_apart`). The page's legend defines them in the same words.
TRUTHS = {
    "sibling-0": "sibling, same facts",
    "sibling-1": "sibling, 1 fact apart",
    "sibling-2": "sibling, 2 facts apart",
    "sibling-3": "sibling, 3 or more facts apart",
    "sibling": "sibling (facts apart not known)",
    "paraphrase": "paraphrase (other family, same facts)",
    "other-1": "other family, 1 fact apart",
    "other-2": "other family, 2 or more facts apart",
    "other": "other family (facts apart not known)",
    "none": "no family known",
}
# The page's filter also offers each side as a whole: every pair of one family, every pair of two.
TRUTH_GROUPS = {"sibling": "sibling, any", "other": "other family, any (paraphrases too)"}


def pair_label(pair: dict) -> str:
    """The pair's TRUTHS label from its pairs.jsonl fields; a pair written without `facts_apart` (facts of
    another form) gets the facts-unknown label of its side unless its `same_facts` says 0 apart."""
    if "same_family" not in pair:
        return "none"
    side = "sibling" if pair["same_family"] else "other"
    apart = pair.get("facts_apart")
    if apart is None:
        if not pair.get("same_facts"):
            return side
        apart = 0
    if side == "sibling":
        return f"sibling-{min(apart, 3)}"
    return "paraphrase" if apart == 0 else f"other-{min(apart, 2)}"


def _label_tokens(label: str) -> str:
    """The row's data-truth: its label and its side ("sibling sibling-2", "other paraphrase"), so that the
    filter finds a row by either; a facts-unknown label is its side's name already."""
    side = "other" if label == "paraphrase" else label.split("-")[0]
    return f"{side} {label}" if side in TRUTH_GROUPS and side != label else label


def truth_options(labels: Iterable[str]) -> List[Tuple[str, str]]:
    """The ground-truth filter's (value, text) options for the labels on the page: each side present as a
    whole, then each label (a facts-unknown one is its side's group already)."""
    labels = set(labels)
    groups = {token for label in labels for token in _label_tokens(label).split() if token in TRUTH_GROUPS}
    return [(group, text) for group, text in TRUTH_GROUPS.items() if group in groups] + [
        (label, text) for label, text in TRUTHS.items() if label in labels and label not in TRUTH_GROUPS
    ]


def _edits(pair: dict) -> List[str]:
    """The one-edit types that separate two siblings (each one's edit from their family's base)."""
    if not pair.get("same_family"):
        return []
    return sorted({edit for edit in (pair.get("query_family_edit"), pair.get("negative_family_edit")) if edit})


def _truth_counts(pairs: Sequence[dict]) -> str:
    counts = collections.Counter(pair_label(pair) for pair in pairs)
    return "; ".join(f"{counts[name]} {text}" for name, text in TRUTHS.items() if counts[name])


def _options(values: Sequence[Tuple[str, str]]) -> str:
    return "".join(f'<option value="{html.escape(value)}">{html.escape(label)}</option>' for value, label in values)


def differing_words(caption: str, other: str) -> str:
    """`caption` as HTML with the words that say what `other` does not marked (`facts.differing_positions`:
    "red" against "orange", "above" in "A above B" against "B above A", nothing in "A below B" against "B
    above A")."""
    words = caption.split()
    marked = differing_positions(words, other.split())
    runs = itertools.groupby(enumerate(words), key=lambda item: item[0] in marked)  # one <mark> per run of words
    return " ".join(
        f"<mark>{text}</mark>" if is_marked else text
        for is_marked, run in runs
        for text in [" ".join(html.escape(word) for _, word in run)]
    )


def _pair_row(rank: int, pair: dict) -> str:
    image_side = "query" if pair["direction"] == "i2t" else "negative"  # whose image met the other's caption
    cells = []
    for side, other in (("query", "negative"), ("negative", "query")):
        key = html.escape(pair[f"{side}_key"])
        caption = differing_words(pair[f"{side}_caption"], pair[f"{other}_caption"])
        confused = "image" if side == image_side else "caption"
        thumbnail = thumbnail_name(pair[f"{side}_source"], pair[f"{side}_key"])
        cells.append(
            f'<td class="sample {confused}-confused"><img src="{thumbnail}" alt="{key}" title="click to '
            f'enlarge"><div class="caption">{caption}</div>'
            f'<div class="key">{key}{_family_text(pair, side)}</div></td>'
        )
    truth = pair_label(pair)
    badge = "" if truth == "none" else f'<span class="truth {truth}">{TRUTHS[truth]}</span>'
    what = "image &rarr; caption" if pair["direction"] == "i2t" else "caption &rarr; image"
    searchable = " ".join(pair[f"{side}_{field}"] for side in ("query", "negative") for field in ("key", "caption"))
    query = f"{pair['batch']}/{pair['direction']}/{pair['query_index']}"
    return (
        f'<tr class="pair" data-posterior="{pair["posterior"]:.6f}" data-gap="{pair["gap"]:.6f}" '
        f'data-direction="{pair["direction"]}" data-truth="{_label_tokens(truth)}" data-edits="{" ".join(_edits(pair))}" '
        f'data-batch="{pair["batch"]}" data-query="{query}" data-text="{html.escape(searchable.lower())}">'
        f'<td class="rank">{rank}</td>'
        f'<td class="numbers"><b>posterior {pair["posterior"]:.3f}</b><br>gap {pair["gap"]:.4f}<br>'
        f'sim {pair["similarity"]:.3f}<br><span class="direction">{what}</span><br>batch {pair["batch"]}<br>'
        f"{badge}</td>" + "".join(cells) + "</tr>"
    )


def _family_text(pair: dict, side: str) -> str:
    family = pair.get(f"{side}_family")
    if family is None:
        return ""
    edit = pair.get(f"{side}_family_edit")
    return f" &middot; family {family}" + (f" ({html.escape(edit)} edit)" if edit else " (base)")


_PAGE = (Path(__file__).with_name("page.html")).read_text()
