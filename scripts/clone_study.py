"""The clone-negative study behind docs/RESULTS.md: AdaCL against CLIP in the paper's three regimes, on
paired seeds, with the endpoints pre-registered in docs/preregistration.md.

    python scripts/clone_study.py                               # every regime, seeds 0-4
    python scripts/clone_study.py --regimes scratch --seeds 0,1   # a slice (reuses finished runs)
    python scripts/clone_study.py --losses clip,adacl:paper       # some of each regime's variants first
    python scripts/clone_study.py --report-only                 # rewrite the reports from the runs
    python scripts/clone_study.py --controls --regimes transfer # the positive controls in a regime

Every regime trains the tiny model on the demo scenes (`training.synthetic_scenes`, written in families of 8
one-edit siblings, with `--train-group-size 8` so that each batch holds whole families: the clone
negatives) for the budget at which `clip` learns the colour, shape and size clones
(docs/results/learnability.md): the regime's recipe (`training.trainer.launch.recipes`: clone-scratch, clone-pseudo,
clone-transfer), which `python -m training.main --recipe NAME` also trains with. One
`python -m training.loss_comparison --recipe clone-<regime>` call per regime, into
runs/clone_study/<regime>, writes the regime's report (docs/results/<regime>.md, plot, per-run CSV);
this script then assembles docs/RESULTS.md from them, keeping RESULTS.md's hand-written sections
below the comparison's marker. Regimes (docs/adacl.md §5):

- scratch: pretraining from scratch on clone-dense batches, gold captions;
- pseudo: the same on the generic captioner's pseudo captions (`txt_pseudo`: siblings differing in a
  size or the relation share one caption), evaluation on gold captions;
- transfer: `clip` pretrained on scenes of one half of the colour x shape combinations, then each
  loss fine-tunes it on the clone-dense scenes of the other half, where it is also evaluated.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from training.loss_comparison.cli import main as compare_losses
from training.loss_comparison.data import QUICK
from training.loss_comparison.report import kept_tail
from training.main import run
from training.trainer.launch.params import config_from_values
from training.trainer.launch.recipes import recipe_values
from training.trainer.run_folder.layout import RunDir
from training.trainer.run_folder.provenance import check_or_record_identity, training_identity

PREREGISTRATION = "docs/preregistration.md"  # each regime's endpoint, margin and reference, as json blocks
# The controls of every regime (docs/preregistration.md): CLIP, AdaCL's default, the paper's Algorithm 1,
# A0 (no discovery: every negative a clone candidate), and the calibrated margins with the paper's steep positive.
CONTROLS = "clip,adacl,adacl:paper,adacl:candidate_region=all,adacl:positive_grad=fixed"
TRANSFER_PRETRAIN_SEED = 1000
PRETRAIN_RECIPE = "clone-scratch"  # the transfer regime's pretraining: `clip` as the scratch regime trains it
# The pretraining scenes' data seed: not the fine-tuning scenes' (0), so no base scene's geometry (positions,
# sizes) is seen in pretraining and again, recoloured, in fine-tuning (tests/test_bench_scripts.py checks it).
TRANSFER_PRETRAIN_DATA_SEED = 1
# `--controls`: the positive controls (the oracle, HN-NCE) against `clip` in a regime, before AdaCL, on the
# endpoint registered for them there (docs/preregistration.md#controls_<regime>). The scratch regime's are the
# controls study's (docs/results/controls.md).
POSITIVE_CONTROLS = "clip,oracle:weight=16,hnnce"


@dataclass(frozen=True)
class Regime:
    title: str
    losses: str
    recipe: str  # every run's trainer flags (training.trainer.launch.recipes: clone-<regime>)
    combinations: str = "all"  # the scenes' colour-shape combinations (SceneConfig.combinations)
    pretrain_combinations: Optional[str] = None  # transfer: `clip` is first pretrained on these (clone-scratch)
    controls: Optional[str] = None  # the variants of `--controls`, positive controls first


REGIMES = {
    "scratch": Regime("Scratch: clone-dense batches, gold captions", f"{CONTROLS},glofnd,fne", "clone-scratch"),
    "pseudo": Regime(
        "Pseudo captions: training on a generic captioner's captions, evaluation on gold captions",
        CONTROLS,
        "clone-pseudo",
        controls=f"{POSITIVE_CONTROLS},adacl",
    ),
    "transfer": Regime(
        "Transfer: CLIP pretrained on other scenes, fine-tuned on clone-dense ones",
        CONTROLS,
        "clone-transfer",
        combinations="odd",
        pretrain_combinations="even",
        controls=f"{POSITIVE_CONTROLS},adacl,adacl:paper",
    ),
}
# Where the regime reports stand: the controls and the amended judgments come first (docs/preregistration.md).
READ_FIRST = (
    "**Read first:** the positive controls (an oracle and HN-NCE) from scratch, on pseudo captions and "
    "when fine-tuning ([results/controls.md](results/controls.md), "
    "[results/controls_scratch2.md](results/controls_scratch2.md), "
    "[results/controls_pseudo.md](results/controls_pseudo.md), "
    "[results/controls_transfer.md](results/controls_transfer.md)), the registered fine-tuning study of "
    "the clone cosine margin and shape accuracy on ten new seeds "
    "([results/margins_transfer.md](results/margins_transfer.md), "
    "[results/margins_transfer_shape.md](results/margins_transfer_shape.md)), the readings of our Algorithm 1 "
    "([results/controls_readings.md](results/controls_readings.md), "
    "[results/controls_paper.md](results/controls_paper.md), "
    "[results/controls_mechanism.md](results/controls_mechanism.md), "
    "[results/controls_more_mechanism.md](results/controls_more_mechanism.md); the cells that ran across "
    "commits re-run on one, [results/cells_one_commit.md](results/cells_one_commit.md)), and every regime's "
    "runs "
    "judged by the "
    "amended collapse rule and registered secondary family ([results/reassessed.md](results/reassessed.md)). "
    "The regime reports below hold their runs as first run, judged again by that rule and family "
    "(`python scripts/reassess_study.py` rewrites them from their per-run CSVs); their "
    "`adacl:preset=paper` runs ran our first reading of Algorithm 1, now `--adacl-preset first-reading`."
)
# The sections of each regime's report that RESULTS.md repeats (the rest stays in the regime's page).
KEPT_SECTIONS = (
    "Summary",
    "Primary endpoint",
    "Paired against `clip`",
    "Clone-negative selection",
    "AdaCL mechanism",
    "Clone detection",
)


def endpoint_argv(study: str) -> List[str]:
    """The study's pre-registered endpoint, margin and reference (a json block of its registration)."""
    source = MARGIN_PREREGISTRATION if study in MARGIN_ENDPOINTS else PREREGISTRATION
    return ["--preregistration", f"{source}#{study}"]


def study_name(regime: str, controls: bool, margins: bool = False) -> str:
    """A regime's study: its own (`transfer`), its positive controls' (`controls_transfer`) or the registered
    margin study on the controls' variants (`margins_transfer`), each with its own runs folder, report and
    registration."""
    return f"margins_{regime}" if margins else f"controls_{regime}" if controls else regime


# `--margins`: the fine-tuning study whose co-primary endpoints are the shape cosine margin (its registration,
# docs/preregistration_margins.md#margins_transfer) and shape accuracy (#margins_transfer_shape, reported from
# the same runs); the transfer controls' variants on seeds of their own.
MARGIN_ENDPOINTS = ("margins_transfer", "margins_transfer_shape")
MARGIN_PREREGISTRATION = "docs/preregistration_margins.md"


def scenes_dir(output_root: Path, combinations: str) -> Path:
    """Where the scenes of these colour-shape combinations live: `data` (all of them) or `data_<half>`."""
    return output_root / ("data" if combinations == "all" else f"data_{combinations}")


def write_scenes(data_dir: Path, combinations: str, seed: int = 0) -> None:
    """The demo data of QUICK's sizes with the given colour-shape combinations and data seed (written once)."""
    from training.synthetic_scenes.scenes import SceneConfig
    from training.synthetic_scenes.writers import write_demo_dataset

    if (data_dir / "manifest.json").is_file():
        manifest = json.loads((data_dir / "manifest.json").read_text())
        written = (manifest["scene_config"]["combinations"], manifest["seed"])
        if written != (combinations, seed):
            raise ValueError(
                f"{data_dir} holds scenes of combinations {written[0]!r} and data seed {written[1]}, "
                f"not {combinations!r} and {seed}: remove it"
            )
        return
    write_demo_dataset(
        data_dir,
        seed=seed,
        num_train=QUICK.num_train,
        num_val=QUICK.num_val,
        num_test=QUICK.num_test,
        shard_size=QUICK.shard_size,
        config=replace(SceneConfig(), combinations=combinations),
    )


def pretrain(regime: Regime, output_root: Path) -> Path:
    """Train `clip` on the regime's pretraining scenes (once); returns its final checkpoint. A run folder there
    is reused, or resumed, only when it recorded this recipe, seed, data seed and code."""
    data_dir = scenes_dir(output_root, regime.pretrain_combinations)
    write_scenes(data_dir, regime.pretrain_combinations, TRANSFER_PRETRAIN_DATA_SEED)
    manifest = json.loads((data_dir / "manifest.json").read_text())
    logs, name = output_root / "pretrain", f"clip-{regime.pretrain_combinations}-seed{TRANSFER_PRETRAIN_SEED}"
    epochs = recipe_values(PRETRAIN_RECIPE, world_size=1)["epochs"]
    run_dir = RunDir(logs / name)
    try:
        check_or_record_identity(
            run_dir.path, training_identity(PRETRAIN_RECIPE, TRANSFER_PRETRAIN_SEED, manifest["seed"])
        )
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    checkpoint = run_dir.epoch_checkpoint(epochs)
    if checkpoint.is_file():
        return checkpoint
    splits = manifest["splits"]
    values = {
        "train_data": str(data_dir / splits["train"]["data"]),
        "val_data": str(data_dir / splits["val"]["data"]),
        "dataset_type": "webdataset",
        "loss": "clip",
        "seed": TRANSFER_PRETRAIN_SEED,
        "save_frequency": epochs,
        "log_every_n_steps": 64,
        "logs": str(logs),
        "name": name,
        "resume": "latest",
    }
    print(f"== pretraining {name} on {data_dir} ({epochs} epochs, recipe {PRETRAIN_RECIPE})", flush=True)
    run(config_from_values(values, recipe=PRETRAIN_RECIPE))
    return checkpoint


def regime_losses(regime: Regime, only: Optional[str], controls: bool = False) -> str:
    """The regime's variants (or its controls'), or those of `only` (which must all be among them), in order."""
    losses = regime.controls if controls else regime.losses
    if only is None:
        return losses
    from training.loss_comparison.variants import parse_loss_variants

    labels = [variant.label for variant in parse_loss_variants(losses)]
    wanted = {variant.label for variant in parse_loss_variants(only)}
    if wanted - set(labels):
        raise ValueError(f"--losses {sorted(wanted - set(labels))} are not variants of this regime: {labels}")
    return ",".join(label for label in labels if label in wanted)


def regime_argv(
    name: str,
    seeds: str,
    output_root: Path,
    results_dir: Path,
    extra: Sequence[str],
    losses: Optional[str] = None,
    controls: bool = False,
    margins: bool = False,
) -> List[str]:
    regime, study = REGIMES[name], study_name(name, controls, margins)
    controls = controls or margins  # the margin study runs the controls' variants
    data_dir = scenes_dir(output_root, regime.combinations)
    if regime.combinations != "all":  # the comparison writes the default scenes itself
        write_scenes(data_dir, regime.combinations)
    pretrained = (
        ["--train-args", f"--pretrained {pretrain(regime, output_root)}"] if regime.pretrain_combinations else []
    )
    return [
        "--quick",
        "--recipe",
        regime.recipe,
        "--losses",
        regime_losses(regime, losses, controls),
        "--seeds",
        seeds,
        "--output-dir",
        str(output_root / study),
        "--data-dir",
        str(data_dir),
        "--results-md",
        str(results_dir / f"{study}.md"),
        *pretrained,
        *endpoint_argv(study),
        *extra,
    ]


def sections(markdown: str) -> dict:
    """'## Title' -> its body, from a comparison report."""
    parts = re.split(r"^## (.+)$", markdown, flags=re.MULTILINE)
    return {title.strip(): body.strip() for title, body in zip(parts[1::2], parts[2::2])}


def kept_section_lines(report: str) -> List[str]:
    """The sections of a regime's report that RESULTS.md repeats (`KEPT_SECTIONS`), one level down."""
    found, lines = sections(report), []
    for title in KEPT_SECTIONS:
        if title in found:
            lines += [f"### {title}", "", linked_from_results_md(found[title]), ""]
    return lines


def linked_from_results_md(text: str) -> str:
    """A regime report's text with its relative links pointing into results/, where its plot and CSV sit
    beside its page, as RESULTS.md reads them."""
    return re.sub(r"\]\((?!https?:|results/)([^)]+)\)", r"](results/\1)", text)


def setup_lines(markdown: str) -> List[str]:
    """The report's run description: the bullet lines before its first section."""
    head = markdown.split("\n## ", 1)[0]
    return [line for line in head.splitlines() if line.startswith("- ")]


def regime_caption_keys(regime: Regime) -> Tuple[str, ...]:
    """The caption fields whose likeness the regime's section prints: gold, and what it trains on if not gold."""
    trained = recipe_values(regime.recipe, world_size=1).get("caption_key", "txt")
    return tuple(dict.fromkeys(("txt", trained)))


def caption_likeness_lines(data_dir: Path, keys: Sequence[str]) -> List[str]:
    """The measured likeness of the training captions `keys` in the regime's data (its manifest)."""
    manifest_path = data_dir / "manifest.json"
    if not manifest_path.is_file():
        return []
    likeness = json.loads(manifest_path.read_text())["train_caption_likeness"]
    return [
        f"- training captions `{key}`: {value['shared_in_split']:.1%} of training images share their exact "
        f"caption with another image, {value['shared_in_family']:.1%} with another of their own family (so in "
        f"their batch); a sibling's caption is {value['sibling_word_distance']:.2f} words from its base's on "
        f"average, within one word for {value['sibling_within_one_word']:.1%}"
        for key, value in likeness.items()
        if key in keys
    ]


def missing_variants(regime: Regime, output_dir: Path) -> List[str]:
    """The regime's variants that its last comparison (comparison.json in `output_dir`) did not include."""
    from training.loss_comparison.runner import COMPARISON_FILE
    from training.loss_comparison.variants import parse_loss_variants

    saved = output_dir / COMPARISON_FILE
    compared = set(json.loads(saved.read_text())["labels"]) if saved.is_file() else set()
    return [variant.label for variant in parse_loss_variants(regime.losses) if variant.label not in compared]


def assemble(regimes: Sequence[str], results_dir: Path, results_md: Path, output_root: Path, command: str) -> str:
    lines = [
        "# Results: the clone-negative study",
        "",
        "Generated by `scripts/clone_study.py` from the regime reports in [results/](results/); every number "
        "comes from the runs listed there. The endpoints, margins and decision rules were committed before the "
        "runs in [preregistration.md](preregistration.md); the verdict and what it means for AdaCL are in "
        "[adacl.md](adacl.md#verdict). The budget is the one at which `clip` learns the colour, shape and size "
        "clones ([results/learnability.md](results/learnability.md)).",
        "",
        READ_FIRST,
        "",
        "Reproduce (from the repository root):",
        "",
        "```bash",
        command,
        "```",
        "",
    ]
    for name in regimes:
        page = results_dir / f"{name}.md"
        regime = REGIMES[name]
        if not page.is_file():
            lines += [
                f"## {regime.title} (`{name}`)",
                "",
                f"Not run yet: `python scripts/clone_study.py --regimes {name}` runs it.",
                "",
            ]
            continue
        report = page.read_text()
        data_dir = scenes_dir(output_root, regime.combinations)
        lines += [
            f"## {regime.title} (`{name}`)",
            "",
            f"Full report: [results/{name}.md](results/{name}.md).",
            "",
            *map(linked_from_results_md, setup_lines(report)),
            *caption_likeness_lines(data_dir, regime_caption_keys(regime)),
        ]
        if regime.pretrain_combinations:
            epochs = recipe_values(PRETRAIN_RECIPE, world_size=1)["epochs"]
            lines.append(
                f"- pretraining: `clip`, seed {TRANSFER_PRETRAIN_SEED}, {epochs} epochs (recipe "
                f"{PRETRAIN_RECIPE}) on "
                f"4096 scenes (data seed {TRANSFER_PRETRAIN_DATA_SEED}) whose objects use only the "
                f"`{regime.pretrain_combinations}` half of the "
                f"colour x shape combinations; fine-tuning and evaluation scenes use only the "
                f"`{regime.combinations}` half (no evaluation image holds a pair seen in pretraining)"
            )
        missing = missing_variants(regime, output_root / name)
        if missing:
            lines.append(
                f"- not run yet in this regime: {', '.join(f'`{label}`' for label in missing)} "
                f"(`python scripts/clone_study.py --regimes {name}` runs them, reusing the finished runs)"
            )
        lines += ["", *kept_section_lines(report)]
    text = "\n".join(lines)
    results_md.write_text(text + kept_tail(results_md))
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--regimes", default=",".join(REGIMES), help=f"comma-separated, of {', '.join(REGIMES)}")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument(
        "--losses",
        default=None,
        help="run only these of each regime's variants (comma-separated labels; the report then "
        "covers them only until a call with all of them)",
    )
    parser.add_argument("--output-dir", type=Path, default=Path("runs/clone_study"))
    parser.add_argument("--results-dir", type=Path, default=Path("docs/results"))
    parser.add_argument("--results-md", type=Path, default=Path("docs/RESULTS.md"))
    parser.add_argument("--report-only", action="store_true", help="rewrite every report from the finished runs")
    parser.add_argument("--jobs", type=int, default=None, help="runs at a time (default: the quick budget's)")
    parser.add_argument(
        "--controls",
        action="store_true",
        help="run (or report) each regime's positive controls instead of its study: "
        "<output-dir>/controls_<regime>, <results-dir>/controls_<regime>.md",
    )
    parser.add_argument(
        "--margins",
        action="store_true",
        help="run (or report) the registered fine-tuning margin study (docs/preregistration_margins.md) "
        "instead: --regimes transfer, the transfer controls' variants, <output-dir>/margins_transfer, "
        "<results-dir>/margins_transfer.md and margins_transfer_shape.md",
    )
    args = parser.parse_args(argv)
    regimes = [name.strip() for name in args.regimes.split(",") if name.strip()]
    unknown = sorted(set(regimes) - set(REGIMES))
    if unknown:
        parser.error(f"unknown regime(s) {unknown}; choose from {', '.join(REGIMES)}")
    if args.controls and any(REGIMES[name].controls is None for name in regimes):
        parser.error(
            "the scratch regime's positive controls are the controls study (docs/results/controls.md, "
            "docs/preregistration.md#controls); give --regimes "
            + ",".join(name for name, regime in REGIMES.items() if regime.controls)
        )
    if args.margins and (regimes != ["transfer"] or args.controls):
        parser.error("--margins is the transfer regime's study: give --regimes transfer, without --controls")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    extra = ["--jobs", str(args.jobs)] if args.jobs else []
    for name in regimes:
        study = study_name(name, args.controls, args.margins)
        if not args.report_only:
            print(f"== {study}: {REGIMES[name].title}", flush=True)
            compare_losses(
                regime_argv(
                    name, args.seeds, args.output_dir, args.results_dir, extra, args.losses, args.controls, args.margins
                )
            )
        for report in MARGIN_ENDPOINTS if args.margins else (study,):
            if args.report_only or report != study:  # a run writes its own study's report
                compare_losses(
                    [
                        "--report-only",
                        "--output-dir",
                        str(args.output_dir / study),
                        "--results-md",
                        str(args.results_dir / f"{report}.md"),
                        *endpoint_argv(report),
                    ]
                )
    if args.margins:
        print(f"wrote {', '.join(str(args.results_dir / report) + '.md' for report in MARGIN_ENDPOINTS)}")
        return
    if args.controls:  # RESULTS.md is assembled from the regimes' own studies
        print(f"wrote {', '.join(str(args.results_dir / study_name(name, True)) + '.md' for name in regimes)}")
        return
    command = "python scripts/clone_study.py" + (f" --seeds {args.seeds}" if args.seeds != "0,1,2,3,4" else "")
    assemble(list(REGIMES), args.results_dir, args.results_md, args.output_dir, command)
    print(f"wrote {args.results_md} and {args.results_dir}/")


if __name__ == "__main__":
    main()
