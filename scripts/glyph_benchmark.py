"""The glyph benchmark (docs/glyphs.md): real font glyphs in families of one-attribute siblings, a calibration
grid on the positive controls, then every loss on the frozen setting, on paired seeds.

    python scripts/glyph_benchmark.py --calibrate                       # the grid: clip, oracle, hnnce, seeds 0-2
    python scripts/glyph_benchmark.py --cells finetune-weak --seeds 10,11,...,19 --losses clip,oracle:weight=16,...
    python scripts/glyph_benchmark.py --report-only --cells finetune-weak

Each cell is a recipe of `training.recipe_book` (glyphs-<cell>) on the data `python -m training.glyphs` writes
(data seed 0, written once into <output-dir>/data); the fine-tuning cells start every run from one common
checkpoint, `clip` trained with recipe glyphs-pretrain (seed 1000, written once into <output-dir>/pretrain).
One `python -m training.loss_comparison` call per cell, into <output-dir>/<study>, writes
<results-dir>/<study>.md with its plot and per-run CSV; the endpoint, margin and reference are the
pre-registered ones (docs/preregistration_glyphs.md#<study>).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import List, Optional, Sequence

from training.glyphs import write_glyph_dataset
from training.glyphs.writers import RETRIEVAL_SET
from training.loss_comparison.cli import main as compare_losses
from training.main import run
from training.params import config_from_values
from training.recipe_book import recipe_values
from training.run_dir import RunDir

PREREGISTRATION = "docs/preregistration_glyphs.md"
DATA_SEED = 0
PRETRAIN_SEED = 1000
PRETRAIN_RECIPE = "glyphs-pretrain"
CELLS = ("scratch-weak", "finetune-weak", "finetune-gold")  # the calibration grid (recipes glyphs-<cell>)
CONTROLS = "clip,oracle:weight=16,hnnce"


def study_name(cell: str, calibrate: bool) -> str:
    return f"glyphs_calibration_{cell.replace('-', '_')}" if calibrate else f"glyphs_{cell.replace('-', '_')}"


def prepare_data(output_root: Path) -> dict:
    """The glyph data of data seed 0 in <output_root>/data (written once); returns its manifest."""
    data_dir = output_root / "data"
    manifest_path = data_dir / "manifest.json"
    if not manifest_path.is_file():
        print(f"== writing the glyph data into {data_dir}", flush=True)
        write_glyph_dataset(data_dir, seed=DATA_SEED)
    manifest = json.loads(manifest_path.read_text())
    if manifest["seed"] != DATA_SEED:
        raise ValueError(f"{data_dir} holds glyph data of data seed {manifest['seed']}, not {DATA_SEED}: remove it")
    return manifest


def data_values(output_root: Path, manifest: dict) -> dict:
    data_dir = output_root / "data"
    splits = manifest["splits"]
    return {"train_data": str(data_dir / splits["train"]["data"]), "val_data": str(data_dir / splits["val"]["data"]),
            "train_num_samples": splits["train"]["num_samples"]}


def pretrain(output_root: Path, manifest: dict) -> Path:
    """`clip` on the glyphs' weak captions (recipe glyphs-pretrain, once); returns its final checkpoint."""
    logs, name = output_root / "pretrain", f"clip-seed{PRETRAIN_SEED}"
    epochs = recipe_values(PRETRAIN_RECIPE, world_size=1)["epochs"]
    checkpoint = RunDir(logs / name).epoch_checkpoint(epochs)
    if checkpoint.is_file():
        return checkpoint
    values = {**data_values(output_root, manifest), "dataset_type": "webdataset", "seed": PRETRAIN_SEED,
              "save_frequency": epochs, "log_every_n_steps": 32, "logs": str(logs), "name": name,
              **({"resume": "latest"} if (logs / name).exists() else {})}
    print(f"== pretraining {name} ({epochs} epochs, recipe {PRETRAIN_RECIPE})", flush=True)
    run(config_from_values(values, recipe=PRETRAIN_RECIPE))
    return checkpoint


def cell_argv(cell: str, study: str, losses: str, seeds: str, output_root: Path, results_dir: Path,
              extra: Sequence[str]) -> List[str]:
    manifest = prepare_data(output_root)
    data = data_values(output_root, manifest)
    data_dir = output_root / "data"
    pretrained = ["--train-args", f"--pretrained {pretrain(output_root, manifest)}"] if cell.startswith("finetune") else []
    return ["--quick", "--recipe", f"glyphs-{cell}", "--losses", losses, "--seeds", seeds,
            "--train-data", data["train_data"], "--train-num-samples", str(data["train_num_samples"]),
            "--val-data", data["val_data"], "--data-size", str(data["train_num_samples"]),
            "--benchmark-datasets", f"wds/{RETRIEVAL_SET}", "--benchmark-root", str(data_dir / "benchmark" / "{dataset}"),
            "--clone-selection-dir", str(data_dir / manifest["clone_selection"]),
            "--output-dir", str(output_root / study), "--results-md", str(results_dir / f"{study}.md"),
            "--preregistration", f"{PREREGISTRATION}#{study}", *pretrained, *extra]


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calibrate", action="store_true",
                        help=f"the calibration grid: the positive controls ({CONTROLS}) in every cell")
    parser.add_argument("--cells", default=None, help=f"comma-separated, of {', '.join(CELLS)} (default: all with "
                                                      "--calibrate)")
    parser.add_argument("--losses", default=CONTROLS)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/glyphs"))
    parser.add_argument("--results-dir", type=Path, default=Path("docs/results"))
    parser.add_argument("--jobs", type=int, default=None, help="runs at a time (default: the quick budget's, 2)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the reports from the finished runs")
    args = parser.parse_args(argv)
    cells = [cell.strip() for cell in (args.cells or ",".join(CELLS)).split(",") if cell.strip()]
    unknown = sorted(set(cells) - set(CELLS))
    if unknown:
        parser.error(f"unknown cell(s) {unknown}; choose from {', '.join(CELLS)}")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    extra = ["--jobs", str(args.jobs)] if args.jobs else []
    for cell in cells:
        study = study_name(cell, args.calibrate)
        if args.report_only:
            compare_losses(["--report-only", "--output-dir", str(args.output_dir / study),
                            "--results-md", str(args.results_dir / f"{study}.md"),
                            "--preregistration", f"{PREREGISTRATION}#{study}"])
            continue
        print(f"== {study}", flush=True)
        compare_losses(cell_argv(cell, study, args.losses, args.seeds, args.output_dir, args.results_dir, extra))


if __name__ == "__main__":
    main()
