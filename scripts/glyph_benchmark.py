"""The glyph benchmark (docs/glyphs.md): real font glyphs in families of one-attribute siblings, a calibration
grid on the positive controls, then every loss on the frozen setting, on paired seeds.

    python scripts/glyph_benchmark.py --calibrate                       # the grid: clip, oracle, hnnce, seeds 0-2
    python scripts/glyph_benchmark.py --cells finetune-weak --seeds 10,11,...,19 --losses clip,oracle:weight=16,...
    python scripts/glyph_benchmark.py --report-only --cells finetune-weak
    python scripts/glyph_benchmark.py --summary --cells finetune-gold   # docs/results/glyphs.md from the CSVs

Each cell is a recipe of `training.trainer.launch.recipes` (glyphs-<cell>) on the data `python -m training.glyphs` writes
(data seed 0, written once into <output-dir>/data); the fine-tuning cells start every run from one common
checkpoint, `clip` trained with recipe glyphs-pretrain (seed 1000, written once into <output-dir>/pretrain).
One `python -m training.loss_comparison` call per cell, into <output-dir>/<study>, writes
<results-dir>/<study>.md with its plot and per-run CSV; the endpoint, margin and reference are the
pre-registered ones (docs/preregistration_glyphs.md#<study>). The summary is computed from those committed
per-run CSVs alone (the run folders are not committed), so it regenerates from a fresh clone.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from training.glyphs import write_glyph_dataset
from training.glyphs.writers import RETRIEVAL_SET
from training.loss_comparison.cli import main as compare_losses
from training.loss_comparison.jobs import MECHANISM_FRACTIONS, OK
from training.loss_comparison.preregistration import from_file
from training.loss_comparison.report import read_runs_csv, rendered_again
from training.loss_comparison.stats import paired_difference, primary_verdict
from training.main import run
from training.trainer.launch.params import config_from_values
from training.trainer.launch.recipes import recipe_values
from training.trainer.run_folder.layout import RunDir
from training.trainer.run_folder.provenance import check_or_record_identity, training_identity

ROOT = Path(__file__).resolve().parent.parent
PREREGISTRATION = "docs/preregistration_glyphs.md"
DATA_SEED = 0
PRETRAIN_SEED = 1000
PRETRAIN_RECIPE = "glyphs-pretrain"
CELLS = ("scratch-weak", "finetune-weak", "finetune-gold")  # the calibration grid (recipes glyphs-<cell>)
CONTROLS = "clip,oracle:weight=16,hnnce"
# The frozen benchmark's variants, in the registered order (docs/preregistration_glyphs.md).
VARIANTS = f"{CONTROLS},adacl,adacl:preset=paper,adacl:positive_grad=fixed,adaclw"
ENDPOINT = "clone/family"
ORACLE = "oracle:weight=16"
# Secondary columns of the summary: pairwise sibling accuracy, retrieval, the closest sibling's cosine margin.
SECONDARY = ("clone/overall", "clone/mark", "ret/glyph_retrieval/image_R@1", "clone/family_cos_margin")


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
    return {
        "train_data": str(data_dir / splits["train"]["data"]),
        "val_data": str(data_dir / splits["val"]["data"]),
        "train_num_samples": splits["train"]["num_samples"],
    }


def pretrain(output_root: Path, manifest: dict) -> Path:
    """`clip` on the glyphs' weak captions (recipe glyphs-pretrain, once); returns its final checkpoint. A run
    folder there is reused, or resumed, only when it recorded this recipe, seed, data seed and code."""
    logs, name = output_root / "pretrain", f"clip-seed{PRETRAIN_SEED}"
    epochs = recipe_values(PRETRAIN_RECIPE, world_size=1)["epochs"]
    run_dir = RunDir(logs / name)
    try:
        check_or_record_identity(run_dir.path, training_identity(PRETRAIN_RECIPE, PRETRAIN_SEED, manifest["seed"]))
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    checkpoint = run_dir.epoch_checkpoint(epochs)
    if checkpoint.is_file():
        return checkpoint
    values = {
        **data_values(output_root, manifest),
        "dataset_type": "webdataset",
        "seed": PRETRAIN_SEED,
        "save_frequency": epochs,
        "log_every_n_steps": 32,
        "logs": str(logs),
        "name": name,
        "resume": "latest",
    }
    print(f"== pretraining {name} ({epochs} epochs, recipe {PRETRAIN_RECIPE})", flush=True)
    run(config_from_values(values, recipe=PRETRAIN_RECIPE))
    return checkpoint


def cell_argv(
    cell: str, study: str, losses: str, seeds: str, output_root: Path, results_dir: Path, extra: Sequence[str]
) -> List[str]:
    manifest = prepare_data(output_root)
    data = data_values(output_root, manifest)
    data_dir = output_root / "data"
    pretrained = (
        ["--train-args", f"--pretrained {pretrain(output_root, manifest)}"] if cell.startswith("finetune") else []
    )
    return [
        "--quick",
        "--recipe",
        f"glyphs-{cell}",
        "--losses",
        losses,
        "--seeds",
        seeds,
        "--train-data",
        data["train_data"],
        "--train-num-samples",
        str(data["train_num_samples"]),
        "--val-data",
        data["val_data"],
        "--data-size",
        str(data["train_num_samples"]),
        "--benchmark-datasets",
        f"wds/{RETRIEVAL_SET}",
        "--benchmark-root",
        str(data_dir / "benchmark" / "{dataset}"),
        "--clone-selection-dir",
        str(data_dir / manifest["clone_selection"]),
        "--output-dir",
        str(output_root / study),
        "--results-md",
        str(results_dir / f"{study}.md"),
        "--preregistration",
        f"{PREREGISTRATION}#{study}",
        *pretrained,
        *extra,
    ]


def study_records(results_dir: Path, study: str) -> List[Dict[str, Any]]:
    """The records of a study's runs as its committed per-run CSV holds them (<results-dir>/<study>_runs.csv,
    written with its report; verdicts as the report judged them); [] before the study ran."""
    path = results_dir / f"{study}_runs.csv"
    return read_runs_csv(path) if path.is_file() else []


def labels_of(records: Sequence[Mapping[str, Any]]) -> List[str]:
    """The variants in the registered order, then any others (exploratory looks), in the order of their records."""
    found = list(dict.fromkeys(record["label"] for record in records))
    return [label for label in VARIANTS.split(",") if label in found] + [
        label for label in found if label not in VARIANTS.split(",")
    ]


def difference_text(records: Sequence[Mapping[str, Any]], label: str, key: str) -> str:
    difference = paired_difference(records, label, "clip", key)
    if difference is None:
        return "n/a"
    return f"{difference.mean:+.3f} {difference.interval_text(0.95)} ({difference.n})"


def mean_text(records: Sequence[Mapping[str, Any]], label: str, key: str) -> str:
    values = [
        r["metrics"][key] for r in records if r["label"] == label and r["verdict"] == "ok" and key in r["metrics"]
    ]
    if not values:
        return "n/a"
    spread = f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):.3f}{spread}"


def mechanism_text(records: Sequence[Mapping[str, Any]], label: str) -> str:
    """AdaCL's guard and bound rates (`adacl/<stat>`: the share of logged steps, per run) averaged over a
    variant's ok runs, as the per-run CSV records them; `-` for a loss whose records hold none."""
    runs = [r for r in records if r["label"] == label and r["verdict"] == OK]
    parts = []
    for name in MECHANISM_FRACTIONS:
        values = [r["metrics"][f"adacl/{name}"] for r in runs if f"adacl/{name}" in r["metrics"]]
        if values:
            parts.append(f"{name} {statistics.fmean(values):.3g}")
    return ", ".join(parts) or "-"


def verdict_text(records: Sequence[Mapping[str, Any]], label: str, margin: float, beyond_margin: bool) -> str:
    """The primary endpoint's verdict against `clip`: outside 0 (as the runs' report judged it) or outside
    the margin (`beyond_margin`, as docs/preregistration_glyphs.md registers it)."""
    return primary_verdict(paired_difference(records, label, "clip", ENDPOINT), margin, beyond_margin)[0]


def oracle_share(records: Sequence[Mapping[str, Any]], label: str) -> str:
    """(variant - clip) / (oracle - clip) on the paired means of the endpoint: the share of the oracle's gain."""
    oracle, mine = (
        paired_difference(records, ORACLE, "clip", ENDPOINT),
        paired_difference(records, label, "clip", ENDPOINT),
    )
    if oracle is None or mine is None or oracle.mean <= 0:
        return "n/a"
    return f"{mine.mean / oracle.mean:.0%}"


def summary_lines(results_dir: Path, cells: Sequence[str]) -> List[str]:
    """docs/results/glyphs.md: the calibration grid, then each frozen cell's variants, from the committed
    per-run CSVs in `results_dir` alone."""
    lines = [
        "# Results: the glyph benchmark",
        "",
        "Generated by `python scripts/glyph_benchmark.py --summary` from the committed per-run CSVs "
        "(`<study>_runs.csv` beside each report; the run folders are not committed); the design, "
        "endpoints and freezing rule were committed first in [preregistration_glyphs.md](../preregistration_glyphs.md); "
        "the data and endpoints are described in [glyphs.md](../glyphs.md). Differences are paired by seed (same "
        "initialisation and data order) against `clip`, with their 95% paired-t interval and the number of "
        "pairs; the endpoint is held-out family accuracy (`clone/family`, chance about 0.125).",
        "",
        "## Calibration grid: the positive controls",
        "",
        "| cell | `clip` family acc. | oracle - clip | HN-NCE - clip | `clip` pairwise acc. | oracle - clip, pairwise | "
        "HN-NCE - clip, pairwise | report |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell in CELLS:
        study = study_name(cell, True)
        records = study_records(results_dir, study)
        if not records:
            lines.append(f"| `{cell}` | not run | | | | | | |")
            continue
        lines.append(
            f"| `{cell}` | {mean_text(records, 'clip', ENDPOINT)} | {difference_text(records, ORACLE, ENDPOINT)} | "
            f"{difference_text(records, 'hnnce', ENDPOINT)} | {mean_text(records, 'clip', 'clone/overall')} | "
            f"{difference_text(records, ORACLE, 'clone/overall')} | "
            f"{difference_text(records, 'hnnce', 'clone/overall')} | [{study}.md]({study}.md) |"
        )
    for cell in cells:
        study = study_name(cell, False)
        records = study_records(results_dir, study)
        if not records:
            continue
        margin = from_file(f"{ROOT / PREREGISTRATION}#{study}").margin
        lines += [
            "",
            f"## The frozen benchmark: `{cell}`",
            "",
            f"Full report with every secondary test (Holm-corrected): [{study}.md]({study}.md); per-run "
            f"numbers: [{study}_runs.csv]({study}_runs.csv). Two readings of the verdict: *outside 0* "
            "(helps when the 95% interval lies above 0, hurts below 0; the loss comparison's rule, which "
            f"judged the runs' report) and *outside ±{margin:g}* (helps only when it lies above +{margin:g}, "
            f'hurts below -{margin:g}: "above 0 and outside the margin", as the pre-registration words '
            "it); both call a 90% interval inside the margin no effect (TOST). Mechanism: AdaCL's guard and "
            "bound rates, the share of logged steps, from the per-run CSV; the other losses' per-step stats "
            "are not in the committed records.",
            "",
            "| variant | runs ok | family acc. | - clip [95%] (pairs) | verdict, outside 0 | "
            f"verdict, outside ±{margin:g} (registered) | share of the oracle's gain | "
            + " | ".join(f"{key} - clip" for key in SECONDARY)
            + " | mechanism (share of steps) |",
            "|---" * (7 + len(SECONDARY) + 1) + "|",
        ]
        for label in labels_of(records):
            runs = [r for r in records if r["label"] == label]
            ok = sum(r["verdict"] == OK for r in runs)
            reference = label == "clip"
            registered = "" if label in VARIANTS.split(",") else " (exploratory)"
            verdicts = (
                ["", ""] if reference else [verdict_text(records, label, margin, beyond) for beyond in (False, True)]
            )
            lines.append(
                f"| `{label}`{registered} | {ok}/{len(runs)} | {mean_text(records, label, ENDPOINT)} | "
                f"{'(reference)' if reference else difference_text(records, label, ENDPOINT)} | "
                f"{verdicts[0]} | {verdicts[1]} | {'' if reference else oracle_share(records, label)} | "
                + " | ".join("" if reference else difference_text(records, label, key) for key in SECONDARY)
                + f" | {mechanism_text(records, label)} |"
            )
    return lines


def render_reports_again(results_dir: Path) -> List[Path]:
    """Each glyph report in `results_dir` whose per-run CSV is there, its sections rendered again from that CSV
    under its registration as amended after the runs (docs/preregistration_glyphs.md: the verdict rule and the
    secondary family as registered), its header as first written; returns the reports."""
    pages = []
    for calibrate in (True, False):
        for cell in CELLS:
            study = study_name(cell, calibrate)
            page, runs_csv = results_dir / f"{study}.md", results_dir / f"{study}_runs.csv"
            if not (page.is_file() and runs_csv.is_file()):
                continue
            spec = f"{PREREGISTRATION}#{study}"
            registration = replace(from_file(f"{ROOT / spec}"), source=spec)
            rule = (
                f"the verdict rule as registered (helps or hurts only outside ±{registration.margin:g}) and "
                if registration.helps_beyond_margin
                else ""
            )
            note = (
                f"the lines above are as first written; every section below is rendered again from "
                f"[{runs_csv.name}]({runs_csv.name}) (the run folders are not committed) by `python "
                f"scripts/glyph_benchmark.py --summary`, under {rule}the registered secondary family "
                "(docs/preregistration_glyphs.md, amendment after the runs); the runs' verdicts are the CSV's, "
                "as first judged (none collapsed)."
            )
            rendered_again(page, read_runs_csv(runs_csv), registration, note)
            pages.append(page)
    return pages


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help=f"the calibration grid: the positive controls ({CONTROLS}) in every cell",
    )
    parser.add_argument(
        "--cells", default=None, help=f"comma-separated, of {', '.join(CELLS)} (default: all with --calibrate)"
    )
    parser.add_argument(
        "--losses", default=None, help=f"variants (default: with --calibrate the controls {CONTROLS}; else {VARIANTS})"
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/glyphs"))
    parser.add_argument("--results-dir", type=Path, default=Path("docs/results"))
    parser.add_argument("--jobs", type=int, default=None, help="runs at a time (default: the quick budget's, 2)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the reports from the finished runs")
    parser.add_argument(
        "--summary",
        action="store_true",
        help="from the per-run CSVs in <results-dir>: render each glyph report's sections again and "
        "write glyphs.md (the calibration grid and the frozen --cells' variants)",
    )
    args = parser.parse_args(argv)
    cells = [cell.strip() for cell in (args.cells or ",".join(CELLS)).split(",") if cell.strip()]
    unknown = sorted(set(cells) - set(CELLS))
    if unknown:
        parser.error(f"unknown cell(s) {unknown}; choose from {', '.join(CELLS)}")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    extra = ["--jobs", str(args.jobs)] if args.jobs else []
    if args.summary:
        for page in render_reports_again(args.results_dir):
            print(f"rendered {page} again from its per-run CSV")
        (args.results_dir / "glyphs.md").write_text("\n".join(summary_lines(args.results_dir, cells)) + "\n")
        print(f"wrote {args.results_dir / 'glyphs.md'}")
        return
    for cell in cells:
        study = study_name(cell, args.calibrate)
        if args.report_only:
            compare_losses(
                [
                    "--report-only",
                    "--output-dir",
                    str(args.output_dir / study),
                    "--results-md",
                    str(args.results_dir / f"{study}.md"),
                    "--preregistration",
                    f"{PREREGISTRATION}#{study}",
                    *(["--losses", args.losses] if args.losses else []),
                ]
            )
            continue
        print(f"== {study}", flush=True)
        losses = args.losses or (CONTROLS if args.calibrate else VARIANTS)
        compare_losses(cell_argv(cell, study, losses, args.seeds, args.output_dir, args.results_dir, extra))


if __name__ == "__main__":
    main()
