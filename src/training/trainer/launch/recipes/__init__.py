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
    """The README's demo: adacl-tiny with AdaCL on the generated scenes, on the CPU, in minutes; whole
    families of one-edit siblings in each batch (the clone negatives)."""
    return dict(
        model="adacl-tiny",
        loss="adacl",
        dataset_type="webdataset",
        batch_size=128,
        epochs=8,
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


# The loss comparison's budgets: its runs' trainer flags (training.loss_comparison.data.QUICK and FULL add the
# data sizes and how many runs go at a time).
@recipe("comparison-quick")
def comparison_quick() -> Dict[str, Any]:
    """The loss comparison's CPU budget: adacl-tiny, 3 epochs of the 4096 demo scenes at batch 64 (192 steps)."""
    return dict(
        model="adacl-tiny",
        batch_size=64,
        epochs=3,
        lr=2e-3,
        warmup=20,
        wd=0.1,
        workers=0,
        device="cpu",
        log_every_n_steps=1,
    )


@recipe("comparison-full")
def comparison_full() -> Dict[str, Any]:
    """The loss comparison's GPU budget: 4x the batch and about 12x the steps of the quick one."""
    return dict(
        model="adacl-tiny",
        batch_size=256,
        epochs=20,
        lr=1e-3,
        warmup=200,
        wd=0.1,
        workers=4,
        device="cuda",
        log_every_n_steps=10,
    )


# The clone study's settings (training.studies.clone_study, docs/adacl.md §5): the quick budget at the steps where
# `clip` learns the clones (docs/results/learnability.md), on batches of whole families of one-edit siblings.
@recipe("clone-scratch")
def clone_scratch() -> Dict[str, Any]:
    """Pretraining from scratch on clone-dense batches with gold captions (1536 steps)."""
    return {**comparison_quick(), "epochs": 24, "train_group_size": 8}


@recipe("clone-pseudo")
def clone_pseudo() -> Dict[str, Any]:
    """The scratch setting on a generic captioner's pseudo captions, validated on gold ones."""
    return {**clone_scratch(), "caption_key": "txt_pseudo", "val_caption_key": "txt"}


@recipe("clone-transfer")
def clone_transfer() -> Dict[str, Any]:
    """Fine-tuning a pretrained `clip` (--pretrained) on clone-dense batches: 8 epochs at a lower lr."""
    return {**clone_scratch(), "epochs": 8, "lr": 1e-3, "warmup": 10}


# The glyph benchmark (training.studies.glyph_benchmark, docs/glyphs.md): real font glyphs in families of eight
# one-attribute siblings (python -m training.glyphs), whole families in each batch of 64, 96 steps an epoch.
@recipe("glyphs-scratch-weak")
def glyphs_scratch_weak() -> Dict[str, Any]:
    """From scratch on the weak captioner's captions (validated on gold ones), 4 epochs (384 steps)."""
    return {
        **comparison_quick(),
        "epochs": 4,
        "train_group_size": 8,
        "caption_key": "txt_weak",
        "val_caption_key": "txt",
    }


@recipe("glyphs-pretrain")
def glyphs_pretrain() -> Dict[str, Any]:
    """The fine-tuning settings' common checkpoint: `clip` 16 epochs (1536 steps) on the weak captions."""
    return {**glyphs_scratch_weak(), "loss": "clip", "epochs": 16}


@recipe("glyphs-finetune-weak")
def glyphs_finetune_weak() -> Dict[str, Any]:
    """Fine-tuning the common checkpoint (--pretrained) on the weak captions: 4 epochs at lr 5e-4."""
    return {**glyphs_scratch_weak(), "lr": 5e-4, "warmup": 10}


@recipe("glyphs-finetune-gold")
def glyphs_finetune_gold() -> Dict[str, Any]:
    """Fine-tuning the common checkpoint (--pretrained) on the gold captions: 4 epochs at lr 5e-4."""
    return {**glyphs_finetune_weak(), "caption_key": "txt"}


# The headroom cells (training.studies.headroom, docs/preregistration_headroom.md): the fine-tuning cells with one
# lever moved each; the frozen benchmark's recipes above stay as they are.
@recipe("glyphs-finetune-gold-long")
def glyphs_finetune_gold_long() -> Dict[str, Any]:
    """`glyphs-finetune-gold` for 8 epochs (768 steps): the steps lever."""
    return {**glyphs_finetune_gold(), "epochs": 8}


@recipe("glyphs-finetune-gold-short")
def glyphs_finetune_gold_short() -> Dict[str, Any]:
    """`glyphs-finetune-gold` for 2 epochs (192 steps): the steps lever shortened."""
    return {**glyphs_finetune_gold(), "epochs": 2}


@recipe("glyphs-finetune-weak-long")
def glyphs_finetune_weak_long() -> Dict[str, Any]:
    """`glyphs-finetune-weak` for 8 epochs (768 steps): the weak-caption lever, with the steps lever."""
    return {**glyphs_finetune_weak(), "epochs": 8}


@recipe("glyphs-finetune-gold-long-16fam")
def glyphs_finetune_gold_long_16fam() -> Dict[str, Any]:
    """`glyphs-finetune-gold-long` at batch 128 (16 families a batch, 384 steps): the families-per-batch lever."""
    return {**glyphs_finetune_gold_long(), "batch_size": 128}
