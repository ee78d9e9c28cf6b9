"""The clone-negative study behind docs/RESULTS.md: AdaCL against CLIP in the paper's three cells, on
paired seeds, with the endpoints pre-registered in docs/preregistration.md.

    python -m studies clone                                # every cell, seeds 0-4
    python -m studies clone --cells scratch --seeds 0,1     # a slice (reuses finished runs)
    python -m studies clone --losses clip,adacl:paper       # some of each cell's variants first
    python -m studies clone --report-only                  # rewrite the reports from the runs
    python -m studies clone --controls --cells transfer     # the positive controls in a cell

Every cell trains the tiny model on the demo scenes (`training.synthetic_scenes`, written in families of 8
one-edit siblings, with `--train-group-size 8` so that each batch holds whole families: the clone
negatives) for the budget at which `clip` learns the colour, shape and size clones
(docs/results/learnability.md): the cell's recipe (`studies.recipes`: clone-scratch, clone-pseudo,
clone-transfer), which `python -m studies train --recipe NAME ...` also trains with. Each cell's comparison is a
registered `Study` (`STUDIES`: scratch, pseudo, transfer, their positive controls controls_<cell> and the
margin study margins_transfer), run into <output-dir>/<study>, writing docs/results/<study>.md (plot, per-run
CSV); `assemble` then writes docs/RESULTS.md from the cells' reports, keeping RESULTS.md's hand-written sections
below the comparison's marker. Cells (docs/adacl.md §5):

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
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from training.trainer.launch.recipes import recipe_values

from .command import Command, comparison_flags, names, register_command, report_sections_of, run_or_report
from .comparison import COMPARISON_FILE, LossVariant, kept_tail, loss_variants
from .data import SceneData
from .pretraining import Pretraining
from .study import STUDIES, Study, register_study

PREREGISTRATION = "docs/preregistration.md"  # each cell's endpoint, margin and reference, as json blocks
# The controls of every cell (docs/preregistration.md): CLIP, AdaCL's default, the paper's Algorithm 1,
# A0 (no discovery: every negative a clone candidate), and the calibrated margins with the paper's steep positive.
CONTROLS = loss_variants("clip", "adacl", "adacl:paper", "adacl:candidate_region=all", "adacl:positive_grad=fixed")
TRANSFER_PRETRAIN_SEED = 1000
PRETRAIN_RECIPE = "clone-scratch"  # the transfer cell's pretraining: `clip` as the scratch cell trains it
# The pretraining scenes' data seed: not the fine-tuning scenes' (0), so no base scene's geometry (positions,
# sizes) is seen in pretraining and again, recoloured, in fine-tuning (tests/studies/test_clone_study.py checks it).
TRANSFER_PRETRAIN_DATA_SEED = 1
# `--controls`: the positive controls (the oracle, HN-NCE) against `clip` in a cell, before AdaCL, on the
# endpoint registered for them there (docs/preregistration.md#controls_<cell>). The scratch cell's are the
# controls study's (docs/results/controls.md).
POSITIVE_CONTROLS = loss_variants("clip", "oracle:weight=16", "hnnce")
SEEDS = (0, 1, 2, 3, 4)


@dataclass(frozen=True)
class Cell:
    title: str
    losses: Tuple[LossVariant, ...]
    recipe: str  # every run's trainer flags (the lab's recipes, studies.recipes: clone-<cell>)
    combinations: str = "all"  # the scenes' colour-shape combinations (SceneConfig.combinations)
    pretrain_combinations: Optional[str] = None  # transfer: `clip` is first pretrained on these (clone-scratch)
    controls: Optional[Tuple[LossVariant, ...]] = None  # the variants of `--controls`, positive controls first

    @property
    def pretraining(self) -> Optional[Pretraining]:
        if self.pretrain_combinations is None:
            return None
        data = SceneData(self.pretrain_combinations, TRANSFER_PRETRAIN_DATA_SEED)
        name = f"clip-{self.pretrain_combinations}-seed{TRANSFER_PRETRAIN_SEED}"
        return Pretraining(name, PRETRAIN_RECIPE, TRANSFER_PRETRAIN_SEED, data)


CELLS = {
    "scratch": Cell(
        "Scratch: clone-dense batches, gold captions", CONTROLS + loss_variants("glofnd", "fne"), "clone-scratch"
    ),
    "pseudo": Cell(
        "Pseudo captions: training on a generic captioner's captions, evaluation on gold captions",
        CONTROLS,
        "clone-pseudo",
        controls=POSITIVE_CONTROLS + loss_variants("adacl"),
    ),
    "transfer": Cell(
        "Transfer: CLIP pretrained on other scenes, fine-tuned on clone-dense ones",
        CONTROLS,
        "clone-transfer",
        combinations="odd",
        pretrain_combinations="even",
        controls=POSITIVE_CONTROLS + loss_variants("adacl", "adacl:paper"),
    ),
}
# The margin study (docs/preregistration_margins.md): co-primary endpoints, the shape cosine margin
# (#margins_transfer) and shape accuracy (#margins_transfer_shape, reported from the same runs); the transfer
# controls' variants on seeds of their own.
MARGIN_ENDPOINTS = ("margins_transfer", "margins_transfer_shape")
MARGIN_PREREGISTRATION = "docs/preregistration_margins.md"
MARGIN_SEEDS = tuple(range(10, 20))
# Where the cell reports stand: the controls and the amended judgments come first (docs/preregistration.md).
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
    "commits re-run on one, [results/cells_one_commit.md](results/cells_one_commit.md)), and every cell's "
    "runs "
    "judged by the "
    "amended collapse rule and registered secondary family ([results/reassessed.md](results/reassessed.md)). "
    "The cell reports below hold their runs as first run, judged again by that rule and family "
    "(`python -m studies reassess` rewrites them from their per-run CSVs); their "
    "`adacl:preset=paper` runs ran our first reading of Algorithm 1, now `--adacl-preset first-reading`."
)
# The sections of each cell's report that RESULTS.md repeats (the rest stays in the cell's page).
KEPT_SECTIONS = (
    "Summary",
    "Primary endpoint",
    "Paired against `clip`",
    "Clone-negative selection",
    "AdaCL mechanism",
    "Clone detection",
)


def study_name(cell: str, controls: bool, margins: bool = False) -> str:
    """A cell's study: its own (`transfer`), its positive controls' (`controls_transfer`) or the registered
    margin study on the controls' variants (`margins_transfer`), each with its own runs folder, report and
    registration."""
    return f"margins_{cell}" if margins else f"controls_{cell}" if controls else cell


def cell_study(name: str, controls: bool = False, margins: bool = False) -> Study:
    cell, study = CELLS[name], study_name(name, controls, margins)
    return Study(
        name=study,
        data=SceneData(cell.combinations),
        recipe=cell.recipe,
        variants=cell.controls if controls or margins else cell.losses,
        seeds=MARGIN_SEEDS if margins else SEEDS,
        preregistration=MARGIN_PREREGISTRATION if margins else PREREGISTRATION,
        endpoints=MARGIN_ENDPOINTS if margins else (study,),
        report=f"docs/results/{study}.md",
        pretraining=cell.pretraining,
    )


for _name, _cell in CELLS.items():
    register_study(cell_study(_name))
    if _cell.controls:
        register_study(cell_study(_name, controls=True))
register_study(cell_study("transfer", margins=True))


def clone_studies(cells: Sequence[str], controls: bool, margins: bool) -> List[Study]:
    return [STUDIES.get(study_name(cell, controls, margins)) for cell in cells]


def sections(markdown: str) -> dict:
    """'## Title' -> its body, from a comparison report."""
    parts = re.split(r"^## (.+)$", markdown, flags=re.MULTILINE)
    return {title.strip(): body.strip() for title, body in zip(parts[1::2], parts[2::2])}


def kept_section_lines(report: str) -> List[str]:
    """The sections of a cell's report that RESULTS.md repeats (`KEPT_SECTIONS`), one level down."""
    found, lines = sections(report), []
    for title in KEPT_SECTIONS:
        if title in found:
            lines += [f"### {title}", "", linked_from_results_md(found[title]), ""]
    return lines


def linked_from_results_md(text: str) -> str:
    """A cell report's text with its relative links pointing into results/, where its plot and CSV sit
    beside its page, as RESULTS.md reads them."""
    return re.sub(r"\]\((?!https?:|results/)([^)]+)\)", r"](results/\1)", text)


def setup_lines(markdown: str) -> List[str]:
    """The report's run description: the bullet lines before its first section."""
    head = markdown.split("\n## ", 1)[0]
    return [line for line in head.splitlines() if line.startswith("- ")]


def cell_caption_keys(cell: Cell) -> Tuple[str, ...]:
    """The caption fields whose likeness the cell's section prints: gold, and what it trains on if not gold."""
    trained = recipe_values(cell.recipe, world_size=1).get("caption_key", "txt")
    return tuple(dict.fromkeys(("txt", trained)))


def caption_likeness_lines(data_dir: Path, keys: Sequence[str]) -> List[str]:
    """The measured likeness of the training captions `keys` in the cell's data (its manifest)."""
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


def missing_variants(cell: Cell, output_dir: Path) -> List[str]:
    """The cell's variants that its last comparison (comparison.json in `output_dir`) did not include."""
    saved = output_dir / COMPARISON_FILE
    compared = set(json.loads(saved.read_text())["labels"]) if saved.is_file() else set()
    return [variant.label for variant in cell.losses if variant.label not in compared]


def assemble(cells: Sequence[str], results_dir: Path, results_md: Path, output_root: Path, command: str) -> str:
    """RESULTS.md from the cells' reports in `results_dir` (their setup lines and the sections it repeats), the
    data's caption likeness and what is not run yet (from the comparisons under `output_root`), keeping the
    hand-written part below KEEP_MARKER; returns the assembled part."""
    lines = [
        "# Results: the clone-negative study",
        "",
        "Generated by `python -m studies clone` from the cell reports in [results/](results/); every number "
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
    for name in cells:
        page = results_dir / f"{name}.md"
        cell = CELLS[name]
        if not page.is_file():
            lines += [
                f"## {cell.title} (`{name}`)",
                "",
                f"Not run yet: `python -m studies clone --cells {name}` runs it.",
                "",
            ]
            continue
        report = page.read_text()
        data_dir = SceneData(cell.combinations).folder(output_root)
        lines += [
            f"## {cell.title} (`{name}`)",
            "",
            f"Full report: [results/{name}.md](results/{name}.md).",
            "",
            *map(linked_from_results_md, setup_lines(report)),
            *caption_likeness_lines(data_dir, cell_caption_keys(cell)),
        ]
        if cell.pretrain_combinations:
            epochs = recipe_values(PRETRAIN_RECIPE, world_size=1)["epochs"]
            lines.append(
                f"- pretraining: `clip`, seed {TRANSFER_PRETRAIN_SEED}, {epochs} epochs (recipe "
                f"{PRETRAIN_RECIPE}) on "
                f"4096 scenes (data seed {TRANSFER_PRETRAIN_DATA_SEED}) whose objects use only the "
                f"`{cell.pretrain_combinations}` half of the "
                f"colour x shape combinations; fine-tuning and evaluation scenes use only the "
                f"`{cell.combinations}` half (no evaluation image holds a pair seen in pretraining)"
            )
        missing = missing_variants(cell, output_root / name)
        if missing:
            lines.append(
                f"- not run yet in this cell: {', '.join(f'`{label}`' for label in missing)} "
                f"(`python -m studies clone --cells {name}` runs them, reusing the finished runs)"
            )
        lines += ["", *kept_section_lines(report)]
    text = "\n".join(lines)
    results_md.write_text(text + kept_tail(results_md))
    return text


# The clone study's comparisons that ran before its studies were registered (the scratch cell's controls, the
# readings of Algorithm 1, the memory bank, the cells re-run on one commit), each with the registration its
# sections were judged under (None: the comparison's defaults); the registered ones' follow from their studies.
EARLIER_COMPARISONS = {
    "cells_one_commit": None,
    "controls": f"{PREREGISTRATION}#controls",
    "controls_bank": None,
    "controls_paper": f"{PREREGISTRATION}#controls",
    "controls_readings": f"{PREREGISTRATION}#controls",
    "controls_scratch2": f"{PREREGISTRATION}#controls_scratch2",
}


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cells", default=None, help=f"comma-separated, of {', '.join(CELLS)}")
    parser.add_argument(
        "--controls", action="store_true", help="each cell's positive controls (controls_<cell>) instead"
    )
    parser.add_argument(
        "--margins",
        action="store_true",
        help="the registered fine-tuning margin study (docs/preregistration_margins.md): --cells transfer",
    )
    parser.add_argument("--results-md", type=Path, default=Path("docs/RESULTS.md"))
    comparison_flags(parser, "runs/clone_study", "default: each study's registered seeds")


def run(args: argparse.Namespace) -> None:
    cells = names(args.cells, CELLS, "cell")
    if args.controls and any(CELLS[name].controls is None for name in cells):
        raise SystemExit(
            "error: the scratch cell's positive controls are the controls study (docs/results/controls.md); "
            "give --cells " + ",".join(name for name, cell in CELLS.items() if cell.controls)
        )
    if args.margins and (cells != ["transfer"] or args.controls):
        raise SystemExit("error: --margins is the transfer cell's study: give --cells transfer, without --controls")
    run_or_report(clone_studies(cells, args.controls, args.margins), args)
    if not (args.controls or args.margins):  # RESULTS.md is assembled from the cells' own studies
        results_dir = args.results_dir or Path("docs/results")
        assemble(list(CELLS), results_dir, args.results_md, args.output_dir, args.command_line)
        print(f"wrote {args.results_md}")


register_command(
    Command(
        "clone",
        __doc__,
        run,
        options,
        section_reports={
            **EARLIER_COMPARISONS,
            **{
                name: spec
                for study in (*clone_studies(["pseudo", "transfer"], True, False), STUDIES.get("margins_transfer"))
                for name, spec in report_sections_of(study).items()
            },
        },
    )
)
