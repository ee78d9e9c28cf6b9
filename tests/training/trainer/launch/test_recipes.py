"""Recipes in code (`training.trainer.launch.recipes`): `--recipe NAME` sets its flags, flags beside it override them,
its global batch is split over the ranks, and params.txt records the recipe and what was overridden."""

import subprocess
import sys
from unittest import mock

import pytest

from training import RECIPES, ConfigError
from training.trainer.launch.params import arg_values, build_parser, parse_args
from training.trainer.launch.recipes import GLOBAL_BATCH, recipe_values


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_sets_flags_of_the_trainer(name):
    dests = {action.dest for action in build_parser()._actions}
    values = RECIPES[name]()
    assert set(values) - {GLOBAL_BATCH} <= dests
    args = parse_args(["--recipe", name, "--train-data", "x.tar"])
    for dest, value in recipe_values(name, world_size=1).items():
        assert getattr(args, dest) == value, dest
    assert args.recipe == name and args.recipe_overrides == []


def test_flags_beside_a_recipe_override_it_and_are_recorded():
    args = parse_args(["--recipe", "cc3m-rn50", "--train-data", "x.tar", "--lr", "5e-4", "--device", "cpu"])
    assert (args.model, args.loss, args.lr, args.device, args.local_loss) == ("RN50", "adacl", 5e-4, "cpu", True)
    assert args.recipe_overrides == ["device", "lr"]
    recorded = arg_values(args)  # what params.txt and the checkpoints record
    assert (recorded["recipe"], recorded["recipe_overrides"]) == ("cc3m-rn50", ["device", "lr"])
    assert parse_args(["--train-data", "x.tar"]).recipe is None  # no recipe: OpenCLIP's defaults


def test_the_global_batch_is_split_over_the_ranks_the_environment_announces():
    with mock.patch.dict("os.environ", {"WORLD_SIZE": "8", "RANK": "0", "LOCAL_RANK": "0"}):
        assert parse_args(["--recipe", "cc3m-rn50", "--train-data", "x.tar"]).batch_size == 128
    with mock.patch.dict("os.environ", {"WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0"}):
        with pytest.raises(
            ConfigError, match="global batch 1024 does not split evenly over 3 ranks; give --batch-size"
        ):
            parse_args(["--recipe", "cc3m-rn50", "--train-data", "x.tar"])
        args = parse_args(["--recipe", "cc3m-rn50", "--train-data", "x.tar", "--batch-size=300"])
        assert args.batch_size == 300 and args.recipe_overrides == []  # the split was never the recipe's value


@pytest.mark.slow
def test_the_shell_check_refuses_a_bad_split_fast_and_prints_argv():
    recipes = [sys.executable, "-m", "training.trainer.launch.recipes"]
    check = subprocess.run([*recipes, "cc12m-vitb32", "--world-size", "3", "--check"], capture_output=True, text=True)
    assert check.returncode == 2 and "the global batch 2048 does not split evenly over 3 ranks" in check.stderr
    printed = subprocess.run(
        [*recipes, "cc12m-vitb32", "--world-size", "16"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert printed[printed.index("--batch-size") + 1] == "128" and "--grad-checkpointing" in printed
    with mock.patch.dict("os.environ", {"WORLD_SIZE": "16", "RANK": "0", "LOCAL_RANK": "0"}):
        by_recipe = vars(parse_args(["--recipe", "cc12m-vitb32", "--train-data", "x.tar"]))
        by_flags = vars(parse_args([*printed, "--train-data", "x.tar"]))  # the printed flags mean the same
    assert {k: v for k, v in by_recipe.items() if k not in ("recipe", "recipe_overrides")} == {
        k: v for k, v in by_flags.items() if k not in ("recipe", "recipe_overrides")
    }
    # The check runs before every launch: it reads the recipes without importing torch (the trainer's parser).
    check_imports = (
        "import runpy, sys; sys.argv = ['recipes', 'demo', '--check']; "
        "runpy.run_module('training.trainer.launch.recipes', run_name='__main__'); print(sorted({'torch', "
        "'open_clip'} & set(sys.modules)))"
    )
    imported = subprocess.run([sys.executable, "-c", check_imports], capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "[]"
    unknown = subprocess.run([*recipes, "cc15m", "--check"], capture_output=True, text=True)
    assert unknown.returncode == 2 and "unknown recipe 'cc15m'; the recipes are" in unknown.stderr


def test_the_product_lists_its_own_recipes_only():
    """The trainer's recipe book holds the product's recipes; the lab's (studies.recipes) join it only in a
    process that loads the lab, so `--recipe` and `python -m training.trainer.launch.recipes` list these three."""
    listed = subprocess.run(
        [sys.executable, "-c", "import training; print(sorted(training.RECIPES))"], capture_output=True, text=True
    )
    assert listed.stdout.strip() == "['cc12m-vitb32', 'cc3m-rn50', 'demo']", listed.stderr[-2000:]
    shown = subprocess.run(
        [sys.executable, "-m", "training.trainer.launch.recipes", "--help"], capture_output=True, text=True
    ).stdout
    assert "one of cc12m-vitb32, cc3m-rn50, demo" in " ".join(shown.split())
    unknown = subprocess.run(
        [sys.executable, "-m", "training.trainer.launch.recipes", "clone-scratch"], capture_output=True, text=True
    )
    assert unknown.returncode == 2 and "unknown recipe 'clone-scratch'" in unknown.stderr
