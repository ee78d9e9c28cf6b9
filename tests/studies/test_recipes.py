"""The lab's recipes (`studies.recipes`): the loss comparison's budgets and the study cells, registered into the
trainer's recipe book when the lab loads, so that the runs the lab starts find them."""

import subprocess
import sys
from pathlib import Path

import pytest

import studies  # noqa: F401  (registers the lab's recipes)
from training import RECIPES
from training.trainer.launch.params import parse_args

ROOT = Path(__file__).resolve().parents[2]


def test_the_comparisons_budgets_and_the_study_cells_are_recipes_of_the_lab():
    from studies.comparison.data import FULL, QUICK

    assert {"comparison-quick", "clone-scratch", "glyphs-pretrain"} <= set(RECIPES)
    assert (QUICK.batch_size, QUICK.epochs, QUICK.lr, QUICK.device) == (64, 3, 2e-3, "cpu")  # comparison-quick's
    assert (FULL.batch_size, FULL.device) == (256, "cuda")
    scratch = QUICK.with_recipe("clone-scratch")
    assert (scratch.epochs, scratch.trainer_values, scratch.num_train) == (24, {"train_group_size": 8}, 4096)
    pseudo = parse_args(["--train-data", "x.tar", "--recipe", "clone-pseudo"])  # one cell's run, by hand
    assert (pseudo.epochs, pseudo.train_group_size, pseudo.caption_key, pseudo.val_caption_key) == (
        24,
        8,
        "txt_pseudo",
        "txt",
    )
    transfer = parse_args(["--train-data", "x.tar", "--recipe", "clone-transfer"])
    assert (transfer.epochs, transfer.lr, transfer.warmup) == (8, 1e-3, 10)


@pytest.mark.slow  # about 11 s on 2 cores: two processes that import the trainer
def test_a_cell_trains_by_hand_through_the_labs_train_command():
    """`python -m studies train --recipe clone-pseudo ...` is the trainer's command line with the lab's recipes:
    its --dry-run checks the recipe's run (the product's own command does not know the recipe)."""
    argv = ["--recipe", "clone-pseudo", "--train-group-size", "1", "--dataset-type", "synthetic"]
    argv += ["--train-num-samples", "64", "--dry-run"]
    lab = subprocess.run([sys.executable, "-m", "studies", "train", *argv], capture_output=True, text=True, cwd=ROOT)
    assert lab.returncode == 0, lab.stderr[-2000:]
    product = subprocess.run([sys.executable, "-m", "training.main", *argv], capture_output=True, text=True)
    assert product.returncode == 2 and "clone-pseudo" in product.stderr
