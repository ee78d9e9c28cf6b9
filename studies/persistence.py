"""Persistence over steps as a clone signal, measured against the glyph families (docs/clone_signals.md).

    python -m studies persistence     # data, checkpoints (once), a fine-tuning trajectory, the report

A pair's score depends on the step: the features move, and a row's standardization depends on the other
samples of its batch. `persistence` reads a pair's score averaged over the steps where it met
(`open_clip_adacl.score_memory.PairScoreMemory`, keyed by sample ids). To measure it on features as training
moves them, this measurement fine-tunes `clip` from the glyph cells' common checkpoint (recipe
glyphs-finetune-gold, --trajectory-seed, a checkpoint per epoch; written once into <output-dir>/persistence), then replays
training's batching: epoch e's batches (8 whole families of 64 in a seeded order, a new order each epoch)
scored with the features of the checkpoint at the start of epoch e, the memory updated after every batch as
the loss updates it after every step. On the last epoch's batches every registered signal is scored, both
directions pooled, and compared with the families at the loss's operating point (`clone_signals.flag_clones`)
on the gold captions: <results-dir>/<report-name>.md, _pr.csv and _pr.png.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from open_clip_adacl.clone_signals import (
    DIRECTIONS,
    PERSISTENCE_BASE,
    SIGNALS,
    STANDARD_THRESHOLD,
    clone_scores,
    flag_clones,
    persistence_update,
    standardized_over_negatives,
)
from open_clip_adacl.score_memory import PairScoreMemory
from training import RunDir, config_from_values, run
from training.trainer.launch.recipes import recipe_values
from training.trainer.run_folder.provenance import check_or_record_identity, training_identity

from . import signal_precision
from .command import Command, register_command
from .glyph_benchmark import DATA, PRETRAINING
from .pretraining import pretrain

RECIPE = "glyphs-finetune-gold"
CAPTIONS = "txt"  # the gold captions the recipe trains on


def trajectory(output_root: Path, manifest: dict, seed: int, start: Optional[Path]) -> List[Path]:
    """The checkpoints at the start of each epoch of a `clip` fine-tuning run (recipe RECIPE) from `start` (default:
    the common checkpoint): `start`, then epoch 1, 2, ...; trained once, reused only for this recipe, seed, data
    and code."""
    start = start or pretrain(PRETRAINING, output_root)
    logs, name = output_root / "persistence", f"clip-seed{seed}"
    epochs = recipe_values(RECIPE, world_size=1)["epochs"]
    run_dir, training = RunDir(logs / name), DATA.training(output_root)
    check_or_record_identity(run_dir.path, training_identity(RECIPE, seed, manifest["seed"]))
    checkpoints = [start] + [run_dir.epoch_checkpoint(epoch) for epoch in range(1, epochs)]
    if not all(path.is_file() for path in checkpoints):
        values = {
            "train_data": training.train_data,
            "val_data": training.val_data,
            "train_num_samples": training.num_samples,
            "dataset_type": "webdataset",
            "seed": seed,
            "pretrained": str(start),
            "save_frequency": 1,
            "log_every_n_steps": 32,
            "logs": str(logs),
            "name": name,
            "resume": "latest",
        }
        print(f"== fine-tuning {name} ({epochs} epochs, recipe {RECIPE}, a checkpoint per epoch)", flush=True)
        run(config_from_values(values, recipe=RECIPE))
    return checkpoints


def replay(samples, checkpoints: Sequence[Path], momentum: float, threshold: float) -> Dict[str, dict]:
    """Epoch e's batches on checkpoint e's features, the memory updated after each batch; every signal scored on
    the last epoch (flags, standardized scores, sibling labels of every negative, both directions)."""
    memory, found = PairScoreMemory(momentum), {name: {} for name in SIGNALS}
    for epoch, checkpoint in enumerate(checkpoints):
        print(f"== epoch {epoch + 1}: features of {checkpoint}", flush=True)
        encoded = signal_precision.encode_samples(samples, checkpoint)
        last = epoch == len(checkpoints) - 1
        for index in signal_precision.training_batches(encoded.family, seed=epoch, limit=None):
            inputs = signal_precision.batch_inputs(encoded, CAPTIONS, index, memory)
            if last:
                family = encoded.family[index]
                negative = inputs.positive_col[:, None] != inputs.positive_col[None, :]
                sibling = (family[:, None] == family[None, :]) & negative
                for name in SIGNALS:
                    for direction in DIRECTIONS:
                        scores = clone_scores(inputs, name, direction)
                        parts = {
                            "score": scores,
                            "standardized": standardized_over_negatives(scores, negative),
                            "sibling": sibling,
                            "flagged": flag_clones(name, scores, negative, threshold),
                            **{
                                cut: (standardized_over_negatives(scores, negative) > cut) & negative
                                for cut in signal_precision.CUTS
                            },
                        }
                        for key, value in parts.items():
                            found[name].setdefault(key, []).append(value[negative])
            memory.update(*persistence_update(inputs, world_size=1))
    print(f"memory: {len(memory)} pairs", flush=True)
    return {name: {key: torch.cat(parts) for key, parts in values.items()} for name, values in found.items()}


def report_lines(rows: Dict[str, dict], command: str, seed: int, epochs: int, momentum: float, threshold: float):
    lines = [
        "# Results: persistence over steps against the glyph families",
        "",
        f"Generated by `{command}` ([clone_signals.md](../clone_signals.md)). Features: `clip` fine-tuned from the "
        f"glyph cells' common checkpoint with recipe {RECIPE} (seed {seed}, gold captions), read at the start of "
        f"each of its {epochs} epochs; batches as training makes them (8 whole families of 64 in a new seeded "
        "order each epoch, so a row's 7 siblings meet it every epoch and another sample rarely). The memory "
        f"(`PairScoreMemory`, momentum {momentum}: the weight of the newest score) takes every batch's "
        f"row-standardized `{PERSISTENCE_BASE}` score, as the loss does after every step; the table scores the "
        f"last epoch's 96 batches, both directions pooled. Operating point (`flag_clones`): a posterior above 1/2 "
        f"for `gda`/`gda_both`, else z > {threshold} over the row's negatives. `best`: the best precision one "
        "threshold over all negatives reaches at recall >= 0.5 (placed with the labels). Goal: precision >= 0.8 "
        "at recall >= 0.5.",
        "",
        "| signal | flagged | precision | recall | sibling base rate | "
        + " | ".join(f"z > {cut}" for cut in signal_precision.CUTS)
        + " | best precision at recall >= 0.5, raw | the same, row-standardized |",
        "|---" * (7 + len(signal_precision.CUTS)) + "|",
    ]
    for name, row in rows.items():
        cuts = " | ".join(
            "-" if name in ("gda", "gda_both") else f"{precision:.2f} / {recall:.2f}"
            for precision, recall in row["cuts"].values()
        )
        lines.append(
            f"| `{name}` | {row['flagged']:.3f} | **{row['precision']:.3f}** | **{row['recall']:.3f}** | "
            f"{row['base_rate']:.3f} | {cuts} | {row['raw_best']:.3f} | {row['standardized_best']:.3f} |"
        )
    return lines


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-dir", type=Path, default=Path("runs/glyphs"))
    parser.add_argument("--results-dir", type=Path, default=Path("docs/results"))
    parser.add_argument("--trajectory-seed", type=int, default=1001, help="the fine-tuning trajectory's seed")
    parser.add_argument("--memory-momentum", type=float, default=0.5, help="the memory's weight of the newest score")
    parser.add_argument("--threshold", type=float, default=STANDARD_THRESHOLD)
    parser.add_argument("--report-name", default="clone_persistence")
    parser.add_argument(
        "--start-checkpoint",
        type=Path,
        default=None,
        help="fine-tune from this checkpoint of the common pretraining (recipe glyphs-pretrain, seed 1000) instead "
        "of training it here",
    )


def measure(args: argparse.Namespace) -> None:
    manifest = DATA.prepare(args.output_dir)
    checkpoints = trajectory(args.output_dir, manifest, args.trajectory_seed, args.start_checkpoint)
    samples = signal_precision.read_training_samples(DATA.folder(args.output_dir), manifest)
    scored = replay(samples, checkpoints, args.memory_momentum, args.threshold)
    rows = {name: signal_precision.signal_row(values) for name, values in scored.items()}
    command = "python -m studies persistence" + "".join(
        f" --{flag} {value}"
        for flag, value, default in (
            ("trajectory-seed", args.trajectory_seed, 1001),
            ("memory-momentum", args.memory_momentum, 0.5),
            ("threshold", args.threshold, STANDARD_THRESHOLD),
            ("report-name", args.report_name, "clone_persistence"),
            ("start-checkpoint", args.start_checkpoint, None),
        )
        if value != default
    )
    args.results_dir.mkdir(parents=True, exist_ok=True)
    page = args.results_dir / f"{args.report_name}.md"
    page.write_text(
        "\n".join(
            report_lines(rows, command, args.trajectory_seed, len(checkpoints), args.memory_momentum, args.threshold)
        )
        + "\n"
    )
    curves = {
        "finetune-gold, last epoch": {
            name: (
                *signal_precision.precision_recall_curve(values["standardized"], values["sibling"])[:2],
                values["sibling"].float().mean().item(),
            )
            for name, values in scored.items()
        }
    }
    signal_precision.write_curves(curves, args.results_dir, args.report_name)
    print(page.read_text())


register_command(Command("persistence", __doc__, measure, options))
