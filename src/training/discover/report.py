"""What a run shows: summary.json, the console table, the plots and the static page index.html.

Everything here is computed from the output folder (batches.jsonl, pairs.jsonl, thumbs/), so a
resumed run reports over all of its batches, those before the interruption included.

- Flagged fraction: flagged pairs / negatives (every off-diagonal entry of each batch's matrix).
- Candidates per row: flagged pairs / rows (queries), per direction.
- With ground-truth families (every sample's json has "family", as the demo data's): precision
  (flagged pairs that are siblings / flagged pairs), recall (flagged siblings / sibling pairs),
  and the sibling fraction (siblings / negatives): the precision of flagging every negative, the
  base rate a discovery must beat. `kept_precision` is the precision of the pairs written to
  pairs.jsonl (each row's most probable candidates).
"""
from __future__ import annotations

import heapq
import html
import json
import math
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from open_clip_adacl import adacl

from ..data import SKIP_REASONS
from .batch import DIRECTIONS, HISTOGRAM_BINS
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
    """The selection as it stood after the pairs already in pairs.jsonl (for --resume)."""
    page = PageSelection(size)
    for pair in read_jsonl(output / PAIRS_FILE):
        page.offer(pair)
    return page


# ---------------------------------------------------------------------------------------------
# Summary


def summarize(records: Sequence[dict]) -> Dict[str, object]:
    """Totals over batches, per direction and pooled (see the module docstring for each metric)."""
    per_direction: Dict[str, Dict[str, float]] = {name: {} for name in (*DIRECTIONS, POOLED)}
    for record in records:
        for direction in record["directions"]:
            for name in (direction["direction"], POOLED):
                totals = per_direction[name]
                for field in ("rows", "negatives", "flagged", "flagged_siblings", "siblings", "kept_siblings"):
                    if direction.get(field) is not None:
                        totals[field] = totals.get(field, 0) + direction[field]
                totals["batches"] = totals.get("batches", 0) + 1
                totals["empty_batches"] = totals.get("empty_batches", 0) + (direction["flagged"] == 0)
                totals["flat_reference_batches"] = (totals.get("flat_reference_batches", 0)
                                                    + direction["flat_reference"])
    skipped = {reason: sum(record["skipped"].get(reason, 0) for record in records) for reason in SKIP_REASONS}
    return {
        "batches": len(records),
        "samples": sum(record["rows"] for record in records),
        "batches_too_small": sum(1 for record in records if not record["directions"]),
        "skipped": {reason: count for reason, count in skipped.items() if count},
        "directions": {name: _metrics(totals) for name, totals in per_direction.items() if totals},
    }


def _metrics(totals: Dict[str, float]) -> Dict[str, float]:
    metrics = {
        "flagged_fraction": _ratio(totals["flagged"], totals["negatives"]),
        "candidates_per_row": _ratio(totals["flagged"], totals["rows"]),
        "flagged": totals["flagged"], "negatives": totals["negatives"], "rows": totals["rows"],
        "batches": totals["batches"], "batches_without_candidates": totals["empty_batches"],
        "flat_reference_batches": totals["flat_reference_batches"],
    }
    if "siblings" in totals:  # ground-truth families
        metrics.update(precision=_ratio(totals["flagged_siblings"], totals["flagged"]),
                       recall=_ratio(totals["flagged_siblings"], totals["siblings"]),
                       sibling_fraction=_ratio(totals["siblings"], totals["negatives"]),
                       kept_precision=None, kept_siblings=totals["kept_siblings"])
    return metrics


def _ratio(numerator: float, denominator: float) -> Optional[float]:
    return numerator / denominator if denominator else None


def add_kept_precision(summary: Dict[str, object], output: Path) -> None:
    """The precision of the pairs in pairs.jsonl, per direction (they are counted as they are written)."""
    kept: Dict[str, int] = {}
    for pair in read_jsonl(output / PAIRS_FILE):
        kept[pair["direction"]] = kept.get(pair["direction"], 0) + 1
    kept[POOLED] = sum(kept.values())
    for name, metrics in summary["directions"].items():
        metrics["kept_pairs"] = kept.get(name, 0)
        if "kept_siblings" in metrics:
            metrics["kept_precision"] = _ratio(metrics.pop("kept_siblings"), metrics["kept_pairs"])


def console_table(summary: Dict[str, object]) -> str:
    """The per-direction metrics as a fixed-width table."""
    with_families = "precision" in summary["directions"].get(POOLED, {})
    columns = [("direction", None), ("flagged", "flagged_fraction"), ("per row", "candidates_per_row")]
    if with_families:
        columns += [("precision", "precision"), ("recall", "recall"), ("sibling rate", "sibling_fraction"),
                    ("kept precision", "kept_precision")]
    lines = ["  ".join(f"{title:>14}" for title, _ in columns)]
    for name, metrics in summary["directions"].items():
        cells = [f"{name:>14}"] + [f"{_format(metrics.get(key)):>14}" for _, key in columns[1:]]
        lines.append("  ".join(cells))
    return "\n".join(lines)


def _format(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def write_summary(output: Path, summary: Dict[str, object]) -> None:
    write_atomically(output / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------
# Plots


def typical_batch(records: Sequence[dict]) -> Optional[dict]:
    """The batch whose pooled flagged fraction is the median over batches (the lower one of two)."""
    discovered = [record for record in records if record["directions"]]
    if not discovered:
        return None
    def fraction(record):
        return sum(d["flagged"] for d in record["directions"]) / sum(d["negatives"] for d in record["directions"])
    return sorted(discovered, key=fraction)[(len(discovered) - 1) // 2]


def write_plots(output: Path, records: Sequence[dict], settings: Dict[str, object]) -> List[str]:
    """The fits of the typical batch and the flagged fraction per batch, as PNGs; their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (output / "plots").mkdir(exist_ok=True)
    typical = typical_batch(records)
    if typical is None:
        return []
    edges = torch.linspace(-1, 1, HISTOGRAM_BINS + 1).numpy()
    figure, axes = plt.subplots(1, len(typical["directions"]), figsize=(12, 4.8), squeeze=False)
    for axis, direction in zip(axes[0], typical["directions"]):
        _plot_fits(axis, direction, edges, settings)
    figure.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center", ncol=4, fontsize=9)
    figure.suptitle(f"batch {typical['batch']} (median flagged fraction): the loss's two Gaussian fits and its "
                    f"candidate region ({settings['candidate_region']})", fontsize=11)
    figure.tight_layout(rect=(0, 0.12, 1, 1))
    figure.savefig(output / FITS_PLOT, dpi=110)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(12, 3.6))
    batches = [record["batch"] for record in records if record["directions"]]
    for index, name in enumerate(DIRECTIONS):
        values = [record["directions"][index] for record in records if record["directions"]]
        axis.plot(batches, [d["flagged"] / d["negatives"] for d in values], ".-", label=f"{name}: flagged fraction")
        if values and values[0].get("siblings") is not None:
            axis.plot(batches, [d["flagged_siblings"] / d["flagged"] if d["flagged"] else math.nan for d in values],
                      "x:", label=f"{name}: precision against families")
    if records and records[0]["directions"] and records[0]["directions"][0].get("siblings") is not None:
        rate = sum(d["siblings"] for r in records for d in r["directions"]) / \
            sum(d["negatives"] for r in records for d in r["directions"])
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
        axis.stairs((siblings / density).numpy(), edges, fill=True, color="#e69f00", alpha=0.8,
                    label="siblings (true clones)")
    flagged = torch.tensor(histograms["flagged"], dtype=torch.float64)
    axis.stairs((flagged / density).numpy(), edges, color="#0072b2", linewidth=1.5, label="flagged")
    mu_c, sigma_c, mu_n, sigma_n = direction["fits"]
    grid = torch.linspace(-1, 1, 801, dtype=torch.float64)
    for mu, sigma, color, name in ((mu_c, sigma_c, "#d55e00", "clone fit (least salient row)"),
                                   (mu_n, sigma_n, "#009e73", "not-clone fit (most salient row)")):
        curve = torch.exp(-0.5 * ((grid - mu) / sigma) ** 2) / (sigma * math.sqrt(2 * math.pi))
        axis.plot(grid.numpy(), curve.numpy(), color=color, linewidth=2, label=name)
    # The candidate region on the similarity axis: one query row over the grid, with no positive column.
    region = adacl.clone_candidate_mask(grid[None, :], torch.tensor([-1]), mu_c, sigma_c, mu_n, sigma_n,
                                        prior_ratio=settings["prior_ratio"], region=settings["candidate_region"])[0]
    top = axis.get_ylim()[1]
    axis.fill_between(grid.numpy(), 0, top, where=region.numpy(), color="#56b4e9", alpha=0.15, step="mid",
                      label="candidate region")
    axis.set_ylim(0, top)
    occupied = negatives.nonzero()
    if len(occupied):  # the similarities' range, and a margin
        axis.set_xlim(max(-1.0, edges[int(occupied.min())] - 0.1), min(1.0, edges[int(occupied.max()) + 1] + 0.1))
    flagged_share = direction["flagged"] / direction["negatives"]
    axis.set_title(f"{direction['direction']}: {direction['flagged']} of {direction['negatives']} negatives flagged "
                   f"({flagged_share:.1%})", fontsize=10)
    axis.set_xlabel("cosine similarity")
    axis.set_ylabel("density")


# ---------------------------------------------------------------------------------------------
# The page


def write_page(output: Path, summary: Dict[str, object], settings: Dict[str, object], pairs: Sequence[dict],
               plots: Sequence[str], table: str) -> None:
    rows = "\n".join(_pair_row(rank, pair) for rank, pair in enumerate(pairs, start=1))
    plot_tags = "\n".join(f'<img class="plot" src="{path}" alt="{path}">' for path in plots)
    description = (f"{settings['model']} on {settings['data']}, global batch {settings['global_batch_size']}, "
                   f"--adacl-salient {settings['salient']} --adacl-candidate-region {settings['candidate_region']}")
    skipped = ", ".join(f"{reason} {count}" for reason, count in summary["skipped"].items()) or "none"
    page = _PAGE.format(
        description=html.escape(description), samples=summary["samples"], batches=summary["batches"],
        skipped=html.escape(skipped), table=html.escape(table), plots=plot_tags, rows=rows, shown=len(pairs),
        kept=summary["directions"].get(POOLED, {}).get("kept_pairs", 0))
    write_atomically(output / PAGE_FILE, page)


def page_thumbnails(pairs: Iterable[dict]) -> set:
    return {thumbnail_name(pair[f"{side}_source"], pair[f"{side}_key"]) for pair in pairs
            for side in ("query", "negative")}


def _pair_row(rank: int, pair: dict) -> str:
    image_side = "query" if pair["direction"] == "i2t" else "negative"  # whose image met the other's caption
    cells = []
    for side in ("query", "negative"):
        key, caption = html.escape(pair[f"{side}_key"]), html.escape(pair[f"{side}_caption"])
        confused = "image" if side == image_side else "caption"
        thumbnail = thumbnail_name(pair[f"{side}_source"], pair[f"{side}_key"])
        cells.append(f'<td class="sample {confused}-confused"><img src="{thumbnail}" alt="{key}"><div class="caption">{caption}</div>'
                     f'<div class="key">{key}{_family_text(pair, side)}</div></td>')
    truth = ""
    if "same_family" in pair:
        truth = ('<span class="sibling">siblings</span>' if pair["same_family"]
                 else '<span class="other">other family</span>')
    what = "image &rarr; caption" if pair["direction"] == "i2t" else "caption &rarr; image"
    return (f'<tr data-posterior="{pair["posterior"]:.6f}" data-gap="{pair["gap"]:.6f}">'
            f'<td class="rank">{rank}</td>'
            f'<td class="numbers"><b>{pair["posterior"]:.3f}</b><br>gap {pair["gap"]:.4f}<br>'
            f'sim {pair["similarity"]:.3f}<br><span class="direction">{what}</span><br>batch {pair["batch"]}<br>'
            f'{truth}</td>' + "".join(cells) + "</tr>")


def _family_text(pair: dict, side: str) -> str:
    family = pair.get(f"{side}_family")
    if family is None:
        return ""
    edit = pair.get(f"{side}_family_edit")
    return f" &middot; family {family}" + (f" ({html.escape(edit)} edit)" if edit else " (base)")


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Clone negatives discovered</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1340px; }}
h1 {{ font-size: 22px; margin-bottom: 4px; }}
p.meta {{ color: #555; margin-top: 0; }}
pre {{ background: #f5f5f5; padding: 10px; font-size: 14px; overflow-x: auto; }}
img.plot {{ max-width: 100%; display: block; margin: 8px 0; }}
table.pairs {{ border-collapse: collapse; width: 100%; }}
table.pairs td {{ border-top: 1px solid #ddd; padding: 8px; vertical-align: top; }}
td.rank {{ color: #888; width: 32px; }}
td.numbers {{ width: 160px; font-size: 14px; line-height: 1.45; white-space: nowrap; }}
td.sample {{ width: 45%; }}
td.sample img {{ width: 112px; height: 112px; object-fit: contain; image-rendering: pixelated; float: left;
  margin-right: 12px; border: 3px solid transparent; background: #eee; }}
td.image-confused img {{ border-color: #d55e00; }}
td.caption-confused .caption {{ background: #fde8d7; }}
.caption {{ font-size: 16px; line-height: 1.35; padding: 2px 4px; }}
.key {{ color: #777; font-size: 12px; margin-top: 4px; }}
.direction {{ color: #555; }}
.sibling {{ color: #fff; background: #2a9d3a; padding: 1px 6px; border-radius: 3px; }}
.other {{ color: #fff; background: #888; padding: 1px 6px; border-radius: 3px; }}
button {{ font-size: 14px; margin-right: 8px; padding: 4px 10px; }}
button.active {{ font-weight: bold; }}
</style></head><body>
<h1>Clone negatives discovered</h1>
<p class="meta">{description}<br>{samples} samples in {batches} batches; skipped: {skipped}</p>
<pre>{table}</pre>
{plots}
<h2>Top pairs</h2>
<p class="meta">{shown} pairs of the {kept} in pairs.jsonl: the highest posteriors and the smallest gaps. Each row is a
query (left) and a negative the loss flagged as its clone (right): the outlined image was confused with the
highlighted caption.</p>
<p>Sort by <button id="by-posterior" class="active" onclick="sortPairs('posterior', -1)">posterior (high first)</button>
<button id="by-gap" onclick="sortPairs('gap', 1)">gap (small first)</button></p>
<table class="pairs"><tbody id="pairs">
{rows}
</tbody></table>
<script>
function sortPairs(key, sign) {{
  const body = document.getElementById('pairs');
  const rows = Array.from(body.rows);
  rows.sort((a, b) => sign * (parseFloat(a.dataset[key]) - parseFloat(b.dataset[key])));
  rows.forEach((row, index) => {{ row.cells[0].textContent = index + 1; body.appendChild(row); }});
  document.getElementById('by-posterior').classList.toggle('active', key === 'posterior');
  document.getElementById('by-gap').classList.toggle('active', key === 'gap');
}}
</script>
</body></html>
"""
