"""Named recipes: the flags of a known run as a Python function, selected with `--recipe NAME`.

    python -m training.main --recipe cc3m-rn50 --train-data '/data/cc3m/{00000..00331}.tar' --name cc3m-rn50
    python -m training.trainer.launch.recipes cc3m-rn50 --world-size 8     # the flags it sets for 8 ranks, as argv
    python -m training.trainer.launch.recipes cc3m-rn50 --world-size 3 --check   # exit 2: 1024 does not split over 3

A recipe returns trainer flag values (argparse destinations), and may give the global batch
(`GLOBAL_BATCH`) instead of OpenCLIP's per-rank --batch-size: it is split over the run's ranks, and refused
when it does not split evenly unless --batch-size is given. The values become the parser's defaults, so any
flag given beside `--recipe` overrides its value; params.txt records the recipe's name and which of its
values were overridden. Data paths, logs and names belong to the launch, not to the recipe.
A new recipe is one decorated function below; `python -m training.trainer.launch.recipes` prints one.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

Recipe = Callable[[], Dict[str, Any]]
RECIPES: Dict[str, Recipe] = {}
GLOBAL_BATCH = "global_batch"  # a recipe's batch over all ranks; the rest of its keys are flag destinations


class RecipeError(ValueError):
    """A recipe that does not exist or cannot serve this world size; the message says what to change."""


def recipe(name: str) -> Callable[[Recipe], Recipe]:
    def register(function: Recipe) -> Recipe:
        if name in RECIPES:
            raise ValueError(f"recipe {name!r} is defined twice")
        RECIPES[name] = function
        return function

    return register


def per_rank_batch(global_batch: int, world_size: int) -> int:
    """OpenCLIP's --batch-size is per rank: the recipe's global batch over `world_size` ranks."""
    if world_size < 1 or global_batch % world_size:
        raise RecipeError(
            f"the global batch {global_batch} does not split evenly over {world_size} ranks; give "
            f"--batch-size (per rank) yourself, or run on a number of ranks that divides it"
        )
    return global_batch // world_size


def recipe_values(name: str, world_size: int, batch_size_given: bool = False) -> Dict[str, Any]:
    """The flag values of recipe `name` for `world_size` ranks (its global batch split into --batch-size,
    unless the command line gives --batch-size)."""
    if name not in RECIPES:
        raise RecipeError(
            f"unknown recipe {name!r}; the recipes are {', '.join(sorted(RECIPES))} (training.trainer.launch.recipes)"
        )
    values = RECIPES[name]()
    global_batch = values.pop(GLOBAL_BATCH, None)
    if global_batch is not None and not batch_size_given:
        values["batch_size"] = per_rank_batch(global_batch, world_size)
    return values


# Shared by the CC3M/CC12M recipes: a multi-GPU webdataset run that survives preemption.
_CLUSTER = dict(
    loss="adacl",
    dataset_type="webdataset",
    wd=0.1,
    warmup=10000,
    precision="amp",
    workers=8,
    local_loss=True,
    gather_with_grad=True,
    dist_timeout=1800,
    save_frequency=1,
    save_every_n_steps=2000,
    keep_step_checkpoints=2,
    report_to="tensorboard",
    resume="latest",
    device="cuda",
)


@recipe("cc3m-rn50")
def cc3m_rn50() -> Dict[str, Any]:
    """OpenCLIP's CC3M recipe (its README: RN50, lr 1e-3, wd 0.1, warmup 10k, 30 epochs, global batch 1024)
    with --loss adacl."""
    return {
        **_CLUSTER,
        "model": "RN50",
        "train_num_samples": 2_800_000,
        GLOBAL_BATCH: 1024,
        "lr": 1e-3,
        "epochs": 30,
        "zeroshot_frequency": 1,
    }


@recipe("cc12m-vitb32")
def cc12m_vitb32() -> Dict[str, Any]:
    """ViT-B/32 on CC12M (global batch 2048, 32 epochs, gradient checkpointing) with --loss adacl."""
    return {
        **_CLUSTER,
        "model": "ViT-B-32",
        "train_num_samples": 10_000_000,
        GLOBAL_BATCH: 2048,
        "lr": 1e-3,
        "epochs": 32,
        "grad_checkpointing": True,
        "zeroshot_frequency": 2,
    }


@recipe("demo")
def demo() -> Dict[str, Any]:
    """The README's demo: adacl-tiny on the generated scenes, on the CPU, in minutes, with the clone-aware loss the
    findings support (`adaclw` weighting the negatives `text_image_tokens` flags; docs/findings.md); whole families of
    one-edit siblings in each batch (the clone negatives). scripts/demo.sh trains it and `--loss clip` on the same seed
    and data order."""
    return dict(
        model="adacl-tiny",
        loss="adaclw",
        adaclw_discovery="text_image_tokens",
        dataset_type="webdataset",
        batch_size=128,
        epochs=4,
        lr=2e-3,
        wd=0.1,
        warmup=50,
        workers=1,
        device="cpu",
        precision="fp32",
        seed=0,
        log_every_n_steps=16,
        train_group_size=8,
    )
