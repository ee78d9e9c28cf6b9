"""The laboratory's recipes: the loss comparison's budgets and the studies' cells, each a named set of trainer
flags as the product's recipes are (`training.trainer.launch.recipes`), registered into the trainer's recipe book
when the lab loads (`import studies` imports this module first).

The product's `--recipe` lists its own recipes only (`cc3m-rn50`, `cc12m-vitb32`, `demo`); the runs the lab
starts find these too: a study's common pretraining (`config_from_values(..., recipe="glyphs-pretrain")` in a lab
process) and a cell's run by hand, `python -m studies train --recipe clone-scratch --train-data ...` (the trainer's
command line with these recipes). A comparison's jobs get every flag as a value, so their processes need none.
"""

from __future__ import annotations

from typing import Any, Dict

from training.trainer.launch.recipes import recipe


# The loss comparison's budgets: its runs' trainer flags (studies.comparison.data.QUICK and FULL add the
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


# The clone study's settings (studies.clone_study, docs/adacl.md §5): the quick budget at the steps where
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


# The glyph benchmark (studies.glyph_benchmark, docs/glyphs.md): real font glyphs in families of eight
# one-attribute siblings (python -m studies.glyphs), whole families in each batch of 64, 96 steps an epoch.
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


# The headroom cells (studies.headroom, docs/preregistration_headroom.md): the fine-tuning cells with one
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


# The loss table's finding tested where it could fail (studies.robustness, docs/preregistration_robustness.md): the
# frozen cell with its batches drawn at random, and with weak captions.
@recipe("glyphs-finetune-gold-long-16fam-random")
def glyphs_finetune_gold_long_16fam_random() -> Dict[str, Any]:
    """`glyphs-finetune-gold-long-16fam` with batches drawn at random (no family kept whole in a batch)."""
    return {**glyphs_finetune_gold_long_16fam(), "train_group_size": 1}


@recipe("glyphs-finetune-weak-long-16fam")
def glyphs_finetune_weak_long_16fam() -> Dict[str, Any]:
    """`glyphs-finetune-weak-long` at batch 128 (16 whole families a batch, 384 steps): weak captions."""
    return {**glyphs_finetune_weak_long(), "batch_size": 128}
