"""Which clone distinctions can a loss learn at a budget? Per-edit-type clone accuracy against steps.

    python -m studies learnability --data-dir runs/clone_study/data --output runs/learnability \
        --steps 1536 --every 256 [--loss clip] [--seed 0] [--results-md docs/results/learnability.md]

Trains one run (the loss comparison's recipe: adacl-tiny, batch 64, AdamW, cosine schedule,
`--train-group-size 8`) with a step checkpoint every `--every` steps, then scores every checkpoint
with the clone-selection evaluation (`training.evaluation.clone_selection`, test scenes). Writes
`curve.csv` (step, edit type, accuracy, mean cosine margin) under --output, and with --results-md a
Markdown page with the table, the plot (beside it) and the command. An edit type whose accuracy stays
near 0.5 at the budget is one no loss can be compared on at that budget.
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
from pathlib import Path
from typing import Dict, List

from training import RunDir
from training.trainer.launch.tool_flags import add_trainer_flags
from training.trainer.run_folder.layout import step_checkpoint_number

from .command import Command, register_command

# The trainer's flags this script takes (training.trainer.launch.tool_flags.add_trainer_flags), with the comparison's values.
TRAINER_FLAGS = {"loss": "clip", "model": "adacl-tiny", "batch_size": 64, "lr": 2e-3, "warmup": 20, "seed": 0}


def train(args: argparse.Namespace, manifest: dict) -> RunDir:
    """The run (in this process; continued if an earlier call stopped), a step checkpoint every --every steps."""
    from training import config_from_values, run
    from training.trainer.launch.params import given_values

    splits = manifest["splits"]
    steps_per_epoch = splits["train"]["num_samples"] // args.batch_size
    epochs = -(-args.steps // steps_per_epoch)
    run_dir = RunDir(args.output / "run")
    values = {
        **{dest: getattr(args, dest) for dest in TRAINER_FLAGS},
        "train_data": str(args.data_dir / splits["train"]["data"]),
        "val_data": str(args.data_dir / splits["val"]["data"]),
        "dataset_type": "webdataset",
        "epochs": epochs,
        "wd": 0.1,
        "workers": 0,
        "device": "cpu",
        "log_every_n_steps": 64,
        "train_group_size": 8,
        "save_every_n_steps": args.every,
        "keep_step_checkpoints": 0,  # every one is scored
        "logs": str(args.output),
        "name": "run",
        **given_values(shlex.split(args.train_args)),
        **({"resume": "latest"} if run_dir.path.exists() else {}),
    }
    if not run_dir.epoch_checkpoint(epochs).is_file():
        run(config_from_values(values))
    return run_dir


def score(run: RunDir, data_dir: Path, output: Path) -> List[Dict[str, float]]:
    from training.evaluation.clone_selection import evaluate_clone_selection
    from training.evaluation.zero_shot import export_checkpoint, load_model

    rows = []
    for path in run.step_checkpoints():
        model_name = export_checkpoint(path, output / "exports" / path.stem)
        model, preprocess, tokenizer = load_model(model_name, "none", "cpu")
        metrics = evaluate_clone_selection(model, preprocess, tokenizer, data_dir / "clone_selection", margins=True)
        scale = float(model.logit_scale.exp())
        for name, value in sorted(metrics.items()):
            if name.endswith("_acc"):
                edit = name.removesuffix("_acc")
                rows.append(
                    {
                        "step": step_checkpoint_number(path),
                        "edit": edit,
                        "accuracy": value,
                        "cosine_margin": metrics[f"{edit}_margin"] / scale,
                    }
                )
        print(
            f"step {step_checkpoint_number(path):5d}: "
            + ", ".join(
                f"{row['edit']} {row['accuracy']:.3f}" for row in rows if row["step"] == step_checkpoint_number(path)
            ),
            flush=True,
        )
    return rows


def plot(rows: List[Dict[str, float]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for edit in sorted({row["edit"] for row in rows}):
        points = [(row["step"], row["accuracy"]) for row in rows if row["edit"] == edit]
        axis.plot(*zip(*points), marker="o", label=edit)
    axis.axhline(0.5, color="grey", linestyle=":", label="chance")
    axis.axhline(0.6, color="grey", linestyle="--", linewidth=0.8, label="learnable (0.60)")
    axis.set_xlabel("training step (batch 64)")
    axis.set_ylabel("clone-selection accuracy (test scenes)")
    axis.set_ylim(0.4, 1.0)
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


CURVE_FIELDS = ("step", "edit", "accuracy", "cosine_margin")


def write_curve(rows: List[Dict[str, float]], path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CURVE_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def read_curve(path: Path) -> List[Dict[str, float]]:
    """The rows `write_curve` wrote: the committed record the page's table is rendered from."""
    with open(path, newline="") as handle:
        return [
            {"step": int(row["step"]), "edit": row["edit"], **{key: float(row[key]) for key in CURVE_FIELDS[2:]}}
            for row in csv.DictReader(handle)
        ]


def table_lines(rows: List[Dict[str, float]]) -> List[str]:
    """Accuracy (and the cosine margin) per step and edit type, as the page shows them."""
    steps = sorted({row["step"] for row in rows})
    edits = sorted({row["edit"] for row in rows} - {"overall"})
    value = {(row["step"], row["edit"]): row for row in rows}
    return ["| step | " + " | ".join(edits) + " |", "|---|" + "---|" * len(edits)] + [
        f"| {step} | "
        + " | ".join(
            f"{value[step, edit]['accuracy']:.3f} ({value[step, edit]['cosine_margin']:+.3f})" for edit in edits
        )
        + " |"
        for step in steps
    ]


def write_page(
    rows: List[Dict[str, float]], path: Path, plot_name: str, command: str, manifest: dict, curve_name: str
) -> None:
    from training.trainer.run_folder.provenance import machine_info

    machine = machine_info("cpu")
    config = manifest["scene_config"]
    lines = [
        "# Learnability: which clone edits `clip` learns at which budget",
        "",
        "Clone-selection accuracy of one `clip` run on the test scenes (chance 0.5) after each number of steps, "
        "and in brackets the mean clone margin in cosine units (cos(image, true) - cos(image, clone)). Written by "
        "`python -m studies learnability`; the study's budget and endpoints follow from it "
        "([../preregistration.md](../preregistration.md)).",
        "",
        f"- scenes: {manifest['splits']['train']['num_samples']} training scenes in families of "
        f"{config['family_size']}, {config['image_size']} px, objects of radius {config['small_radius']} (small) and "
        f"{config['large_radius']} (large) of the image side, noise std {config['noise_std']}, combinations "
        f"`{config['combinations']}`",
        f"- command: `{command}`",
        f"- machine: {machine['cpu']}, {machine['cores']} cores, load average {machine['load']} at the end; code "
        f"{machine['code']}",
        f"- per-step numbers: [{curve_name}]({curve_name})",
        "",
        *table_lines(rows),
    ]
    lines += ["", f"![clone-selection accuracy against steps]({plot_name})", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir", type=Path, required=True, help="demo data written by python -m training.synthetic_scenes"
    )
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=1536, help="at least this many steps (whole epochs)")
    parser.add_argument("--every", type=int, default=128, help="checkpoint and score every this many steps")
    add_trainer_flags(parser.add_argument_group("the trainer's flags"), list(TRAINER_FLAGS), defaults=TRAINER_FLAGS)
    parser.add_argument("--train-args", default="", help="extra trainer flags, one string")
    parser.add_argument(
        "--results-md",
        type=Path,
        default=None,
        help="Markdown page to write; its plot goes beside it (default: only OUTPUT/curve.png)",
    )


def measure(args: argparse.Namespace) -> None:
    args.output.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((args.data_dir / "manifest.json").read_text())
    rows = score(train(args, manifest), args.data_dir, args.output)
    write_curve(rows, args.output / "curve.csv")
    plot_path = args.results_md.with_suffix(".png") if args.results_md else args.output / "curve.png"
    plot(rows, plot_path, f"{args.loss}, {args.model}, batch {args.batch_size}, lr {args.lr}, seed {args.seed}")
    if args.results_md:
        command = args.command_line
        curve = args.results_md.with_name(f"{args.results_md.stem}_curve.csv")
        write_curve(rows, curve)
        write_page(rows, args.results_md, plot_path.name, command, manifest, curve.name)
        print(f"wrote {args.results_md}")
    print(f"wrote {args.output / 'curve.csv'} and {plot_path}")


register_command(Command("learnability", __doc__, measure, options))
