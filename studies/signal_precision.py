"""How well each label-free clone signal finds the true families of the glyph data (docs/clone_signals.md).

    python -m studies signals                 # data, pretraining (once), scoring, the report
    python -m studies signals --batches 24    # fewer batches (a quicker look)

The glyph data (data seed 0) and the fine-tuning cells' common checkpoint (`clip`, recipe glyphs-pretrain, seed
1000) come from the glyph benchmark (`glyph_benchmark.DATA`, `PRETRAINING`), written once into <output-dir>; everything after that is a
deterministic computation of about a minute on a CPU: the checkpoint encodes the training samples once, batches
of 64 are made as training makes them (8 whole families, shuffled with --batch-order-seed; --families-per-batch 16
for the 16-families cell's batches of 128), and every registered signal
(`open_clip_adacl.clone_signals.SIGNALS`) scores every negative of every batch, in both directions. Per cell
(its captions: `finetune-gold` the gold ones, `finetune-weak` the weak captioner's) and signal it writes the
precision and recall against the families at the operating point the loss uses (`clone_signals.flag_clones`:
the GDA posterior above 1/2 for `gda`/`gda_both`; for the others a score `--threshold` standard deviations
above its row's negatives), the same at neighbouring cuts, the best a single threshold could reach on the raw
and on the row-standardized scores (read off their precision-recall curves, with the labels), and the sibling
base rate: <results-dir>/clone_signals.md, clone_signals_pr.csv and clone_signals_pr.png (standardized scores).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
import webdataset as wds
from PIL import Image

from open_clip_adacl.clone_signals import (
    SIGNALS,
    STANDARD_THRESHOLD,
    PairInputs,
    clone_scores,
    flag_clones,
    pair_inputs,
    standardized_over_negatives,
)
from open_clip_adacl.distributed import RowGroup
from open_clip_adacl.score_memory import PairScoreMemory
from training.discover.model import load_discovery_model

from .command import Command, register_command
from .glyph_benchmark import DATA, PRETRAINING
from .pretraining import pretrain

CELLS = {"finetune-gold": "txt", "finetune-weak": "txt_weak"}  # cell -> the captions it trains on
FAMILIES_PER_BATCH = 8  # --train-group-size 8 at batch 64 (recipes glyphs-*)
GOAL = (0.8, 0.5)  # precision at recall
CUTS = (1.0, 1.25, 1.75, 2.0)  # neighbouring operating points, in standard deviations


@dataclass
class EncodedSamples:
    family: torch.Tensor  # S
    image: torch.Tensor  # S x D, normalized
    text: Dict[str, torch.Tensor]  # caption key -> S x D, normalized
    tokens: Dict[str, torch.Tensor]  # caption key -> S x L
    logit_scale: torch.Tensor


def read_training_samples(data_dir: Path, manifest: dict) -> List[dict]:
    urls = str(data_dir / manifest["splits"]["train"]["data"])
    return [sample for sample in wds.WebDataset(urls, shardshuffle=False)]


@torch.no_grad()
def encode_samples(samples: Sequence[dict], checkpoint: Path) -> EncodedSamples:
    loaded = load_discovery_model(None, None, str(checkpoint), torch.device("cpu"))
    model = loaded.model.eval()
    images = torch.stack([loaded.preprocess(Image.open(io.BytesIO(s["png"])).convert("RGB")) for s in samples])
    image = torch.cat([model.encode_image(part, normalize=True) for part in images.split(512)])
    text, tokens = {}, {}
    for key in CELLS.values():
        tokens[key] = loaded.tokenizer([s[key].decode() for s in samples])
        text[key] = torch.cat([model.encode_text(part, normalize=True) for part in tokens[key].split(512)])
    family = torch.tensor([json.loads(s["json"])["family"] for s in samples])
    return EncodedSamples(family, image, text, tokens, model.logit_scale.exp().detach())


def training_batches(
    family: torch.Tensor, seed: int, limit: Optional[int], families_per_batch: int = FAMILIES_PER_BATCH
) -> List[torch.Tensor]:
    """Sample indices of batches of `families_per_batch` whole families, in a seeded random order of families."""
    families = torch.unique(family)
    order = families[torch.randperm(families.numel(), generator=torch.Generator().manual_seed(seed))]
    batches = [
        torch.cat([torch.nonzero(family == f).flatten() for f in order[start : start + families_per_batch]])
        for start in range(0, order.numel() - families_per_batch + 1, families_per_batch)
    ]
    return batches[:limit] if limit else batches


def batch_inputs(
    encoded: EncodedSamples, caption_key: str, index: torch.Tensor, memory: Optional[PairScoreMemory] = None
) -> PairInputs:
    """The signals' inputs of one training batch held by one process; its sample indices key `memory` (the
    persistence signals' past scores; without one they read this batch's scores alone)."""
    image, text = encoded.image[index], encoded.text[caption_key][index]
    logits = encoded.logit_scale * image @ text.T
    return pair_inputs(
        logits,
        logits.T,
        torch.arange(index.numel()),
        image,
        text,
        image,
        text,
        encoded.logit_scale,
        RowGroup(False),
        local_tokens=encoded.tokens[caption_key][index],
        all_ids=index,
        memory=memory,
    )


def score_cell(
    encoded: EncodedSamples, caption_key: str, batches: Sequence[torch.Tensor], threshold: float
) -> Dict[str, dict]:
    """Per signal, every negative (both directions pooled): its raw and row-standardized score, its family label,
    and its flags at the operating point (`flagged`) and at the neighbouring cuts."""
    found = {name: {} for name in SIGNALS}
    for index in batches:
        inputs = batch_inputs(encoded, caption_key, index)
        positive_col = inputs.positive_col
        family = encoded.family[index]
        negative = positive_col[:, None] != positive_col[None, :]
        sibling = (family[:, None] == family[None, :]) & negative
        for name in SIGNALS:
            for direction in ("i2t", "t2i"):
                scores = clone_scores(inputs, name, direction)
                standardized = standardized_over_negatives(scores, negative)
                parts = {
                    "score": scores,
                    "standardized": standardized,
                    "sibling": sibling,
                    "flagged": flag_clones(name, scores, negative, threshold),
                    **{cut: (standardized > cut) & negative for cut in CUTS},
                }
                for key, value in parts.items():
                    found[name].setdefault(key, []).append(value[negative])
    return {name: {key: torch.cat(parts) for key, parts in values.items()} for name, values in found.items()}


def precision_recall_curve(score: torch.Tensor, sibling: torch.Tensor):
    """(precision, recall, threshold) of flagging every negative scored at or above each distinct score."""
    order = torch.argsort(score.double(), descending=True, stable=True)
    ranked, hits = score[order].double(), sibling[order].double()
    last_of_value = torch.ones_like(ranked, dtype=torch.bool)
    last_of_value[:-1] = ranked[1:] != ranked[:-1]
    true_positives = hits.cumsum(0)[last_of_value]
    flagged = torch.arange(1, ranked.numel() + 1, dtype=torch.float64)[last_of_value]
    return true_positives / flagged, true_positives / hits.sum().clamp(min=1), ranked[last_of_value]


def precision_and_recall(flagged: torch.Tensor, sibling: torch.Tensor):
    hits = (flagged & sibling).sum().item()
    return hits / max(flagged.sum().item(), 1), hits / max(sibling.sum().item(), 1)


def best_precision_at_half_recall(score: torch.Tensor, sibling: torch.Tensor) -> float:
    precision, recall, _ = precision_recall_curve(score, sibling)
    return precision[recall >= GOAL[1]].max().item()


def signal_row(values: dict) -> dict:
    sibling = values["sibling"]
    precision, recall = precision_and_recall(values["flagged"], sibling)
    return {
        "flagged": values["flagged"].float().mean().item(),
        "precision": precision,
        "recall": recall,
        "cuts": {cut: precision_and_recall(values[cut], sibling) for cut in CUTS},
        "raw_best": best_precision_at_half_recall(values["score"], sibling),
        "standardized_best": best_precision_at_half_recall(values["standardized"], sibling),
        "base_rate": sibling.float().mean().item(),
    }


def write_report(
    results: Dict[str, Dict[str, dict]],
    curves: Dict[str, Dict[str, tuple]],
    results_dir: Path,
    command: str,
    batches: int,
    threshold: float,
    checkpoint: Optional[Path] = None,
    report_name: str = "clone_signals",
    batch_size: int = 64,
    families_per_batch: int = FAMILIES_PER_BATCH,
) -> None:
    cut_names = " | ".join(f"z > {cut}" for cut in CUTS)
    lines = [
        "# Results: label-free clone signals against the glyph families",
        "",
        f"Generated by `{command}` (the signals: `open_clip_adacl.clone_signals`, described in "
        "[clone_signals.md](../clone_signals.md)). Model: "
        + (
            f"`{checkpoint}`; "
            if checkpoint
            else "the glyph fine-tuning cells' common checkpoint (`clip`, recipe "
            "glyphs-pretrain, seed 1000), the features every fine-tuning run starts from; "
        )
        + f"{batches} batches of {batch_size} training samples ({families_per_batch} whole families in a seeded "
        f"random order, so {batch_size // families_per_batch - 1} of a row's {batch_size - 1} negatives are "
        "siblings), both directions pooled. Each cell is read with the captions it trains on. "
        "Operating point (`flag_clones`): for `gda` and `gda_both` a posterior above 1/2 (AdaCL's candidates "
        f"at prior ratio 1, what `adaclw` weights); for the others a score more than z = {threshold} standard "
        "deviations above the mean of its row's negatives. Precision / recall at neighbouring cuts beside it. "
        "The `best` columns read the precision-recall curve of one threshold over all scored negatives, on the "
        "raw scores and on the row-standardized ones: they use the labels to place the threshold (what a "
        f"signal could reach, not what it reaches). Goal: precision >= {GOAL[0]} at recall >= {GOAL[1]}.",
        "",
    ]
    for cell, rows in results.items():
        lines += [
            f"## `{cell}` (captions `{CELLS[cell]}`)",
            "",
            "| signal | flagged | precision | recall | sibling base rate | "
            + cut_names
            + " | best precision at recall >= 0.5, raw | the same, row-standardized |",
            "|---" * (7 + len(CUTS)) + "|",
        ]
        for name, row in rows.items():
            cuts = " | ".join(
                "-" if SIGNALS.get(name).posterior else f"{precision:.2f} / {recall:.2f}"
                for precision, recall in row["cuts"].values()
            )
            lines.append(
                f"| `{name}` | {row['flagged']:.3f} | **{row['precision']:.3f}** | **{row['recall']:.3f}** | "
                f"{row['base_rate']:.3f} | {cuts} | {row['raw_best']:.3f} | {row['standardized_best']:.3f} |"
            )
        lines.append("")
    lines += [
        f"Curves (row-standardized scores): [{report_name}_pr.png]({report_name}_pr.png) (data: "
        f"[{report_name}_pr.csv]({report_name}_pr.csv), 101 recall levels per cell and signal, the best "
        "precision at or above each).",
        "",
    ]
    (results_dir / f"{report_name}.md").write_text("\n".join(lines))
    write_curves(curves, results_dir, report_name)


def write_curves(curves: Dict[str, Dict[str, tuple]], results_dir: Path, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = np.linspace(0, 1, 101)
    figure, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 5), squeeze=False)
    with (results_dir / f"{name}_pr.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["cell", "signal", "recall", "precision"])
        for axis, (cell, signals) in zip(axes[0], curves.items()):
            for number, (signal, (precision, recall, base_rate)) in enumerate(signals.items()):
                # the interpolated curve: the best precision at recall >= each level
                best = [precision[recall >= level].max().item() if (recall >= level).any() else 0.0 for level in levels]
                writer.writerows([cell, signal, f"{level:.2f}", f"{value:.4f}"] for level, value in zip(levels, best))
                axis.plot(levels, best, label=signal, color=plt.cm.tab20(number))
            axis.axhline(base_rate, color="grey", linestyle=":", label="sibling base rate")
            axis.plot([GOAL[1]], [GOAL[0]], marker="*", color="black", markersize=12, linestyle="", label="goal")
            axis.set(title=cell, xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02))
            axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(results_dir / f"{name}_pr.png", dpi=110)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path("runs/glyphs"),
        help="where the glyph data and the pretraining checkpoint are written once",
    )
    parser.add_argument("--results-dir", type=Path, default=Path("docs/results"))
    parser.add_argument("--batches", type=int, default=None, help="score only the first N batches (default: all 96)")
    parser.add_argument("--batch-order-seed", type=int, default=0, help="the order of families into batches")
    parser.add_argument(
        "--families-per-batch",
        type=int,
        default=FAMILIES_PER_BATCH,
        help="whole families in a batch, as the cell's --train-group-size makes them (16: the 16-families cell)",
    )
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="score another model state (a trainer checkpoint of adacl-tiny on this data, e.g. a "
        "fine-tuned run's) instead of the common pretraining checkpoint",
    )
    parser.add_argument(
        "--report-name", default="clone_signals", help="<results-dir>/<name>.md, <name>_pr.csv and <name>_pr.png"
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=STANDARD_THRESHOLD,
        help="the operating point of a score, in standard deviations of its row's negatives",
    )


def run(args: argparse.Namespace) -> None:
    manifest = DATA.prepare(args.output_dir)
    checkpoint = args.checkpoint or pretrain(PRETRAINING, args.output_dir)
    encoded = encode_samples(read_training_samples(DATA.folder(args.output_dir), manifest), checkpoint)
    batches = training_batches(encoded.family, args.batch_order_seed, args.batches, args.families_per_batch)
    results, curves = {}, {}
    for cell, caption_key in CELLS.items():
        scored = score_cell(encoded, caption_key, batches, args.threshold)
        results[cell] = {name: signal_row(values) for name, values in scored.items()}
        curves[cell] = {
            name: (
                *precision_recall_curve(values["standardized"], values["sibling"])[:2],
                values["sibling"].float().mean().item(),
            )
            for name, values in scored.items()
        }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    command = "python -m studies signals" + "".join(
        f" --{flag} {value}"
        for flag, value, default in (
            ("batches", args.batches, None),
            ("batch-order-seed", args.batch_order_seed, 0),
            ("families-per-batch", args.families_per_batch, FAMILIES_PER_BATCH),
            ("threshold", args.threshold, STANDARD_THRESHOLD),
            ("checkpoint", args.checkpoint, None),
            ("report-name", args.report_name, "clone_signals"),
        )
        if value != default
    )
    write_report(
        results,
        curves,
        args.results_dir,
        command,
        len(batches),
        args.threshold,
        args.checkpoint,
        args.report_name,
        batches[0].numel(),
        args.families_per_batch,
    )
    print((args.results_dir / f"{args.report_name}.md").read_text())


register_command(Command("signals", __doc__, run, options))
