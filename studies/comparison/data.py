"""What every run of one comparison shares: the budget (data sizes, training recipe) and the demo data.

The demo data (`training.synthetic_scenes.writers.write_demo_dataset`) is written with a fixed data seed,
once, into --data-dir and reused while its manifest matches the budget.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

import studies.recipes  # noqa: F401  (registers the budgets' recipes, comparison-quick and comparison-full)


@dataclass(frozen=True)
class Budget:
    """What every run of one comparison shares: the data sizes and the training recipe."""

    num_train: int
    num_val: int
    num_test: int  # test scenes: clone selection and retrieval; also each classification set
    shard_size: int
    batch_size: int
    epochs: int
    lr: float
    warmup: int  # steps
    wd: float
    workers: int
    device: str
    jobs: int  # runs at a time
    log_every_n_steps: int
    precision: Optional[str] = None  # the trainer's default: fp32 on CPU, amp on CUDA
    # Trainer flag values every run gets, by destination (e.g. {"train_group_size": 8}): a recipe's other
    # flags and the command line's --train-args, applied after the fields above.
    trainer_values: Mapping[str, Any] = field(default_factory=dict)
    # Fine-tuning: > 0 first trains one `clip` model for this many epochs at `pretrain_lr`
    # (seed PRETRAIN_SEED), then every run starts from it (--pretrained) at `lr`.
    pretrain_epochs: int = 0
    pretrain_lr: float = 2e-3

    @property
    def steps(self) -> int:
        return self.epochs * (self.num_train // self.batch_size)

    @classmethod
    def from_recipe(cls, name: str, **sizes: Any) -> "Budget":
        """A budget of these data sizes and jobs (`sizes`) that trains with recipe `name`'s flags."""
        own, others = recipe_parts(name)
        return cls(**sizes, **own, trainer_values=others)

    @classmethod
    def from_saved(cls, fields: Mapping[str, Any]) -> "Budget":
        """The budget as comparison.json saved it; a folder that saved the other trainer flags as an argv
        (`train_args`) has them read back as values."""
        fields = dict(fields)
        argv = fields.pop("train_args", None)
        if argv:
            from training.trainer.launch.params import given_values

            fields["trainer_values"] = given_values(argv)
        return cls(**fields)

    def with_recipe(self, name: str) -> "Budget":
        """This budget with recipe `name`'s flags: those the budget holds replace its values, the others (e.g.
        --train-group-size) join its `trainer_values`, which keep their own where both set one."""
        own, others = recipe_parts(name)
        return replace(self, **own, trainer_values={**others, **self.trainer_values})


# The Budget fields a recipe sets (trainer flags of the same name).
RECIPE_FIELDS = ("batch_size", "epochs", "lr", "warmup", "wd", "workers", "device", "log_every_n_steps", "precision")


def recipe_parts(name: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Recipe `name`'s flag values (the trainer's recipe book, `studies.recipes` among them) as (the Budget fields it sets, the other
    flags' values); its --model is left to the comparison's own."""
    from training.trainer.launch.recipes import recipe_values

    values = recipe_values(name, world_size=1)
    values.pop("model", None)
    own = {key: values.pop(key) for key in list(values) if key in RECIPE_FIELDS}
    return own, values


# Quick: 192 steps. Measured on the 2-core CPU, shared with other work (load 3-5): 6 variants x 3 seeds
# at 2 jobs took 17.1 min, 85-146 s per run (docs/RESULTS.md); one step of adacl-tiny at batch 64 on one
# thread is ~0.22 s. Workers 0: with one core per run, a loader process only competes with the step.
QUICK = Budget.from_recipe("comparison-quick", num_train=4096, num_val=512, num_test=512, shard_size=512, jobs=2)
# Full: a GPU; 8x the data, 4x the batch and about 12x the steps of quick (not tuned on a GPU yet).
FULL = Budget.from_recipe("comparison-full", num_train=32768, num_val=2048, num_test=1024, shard_size=2048, jobs=4)


PRETRAIN_SEED = 1000  # the pretraining run's seed, apart from the runs' seeds


@dataclass(frozen=True)
class ComparisonData:
    """The demo data one comparison trains and evaluates on."""

    root: str
    train_data: str  # shard pattern for --train-data
    val_data: str
    num_train: int
    data_size: int  # the training keys' upper bound: per-sample state banks need [0, data_size)


def prepare_data(data_dir: Path, budget: Budget, data_seed: int) -> ComparisonData:
    """Reuse the demo data in `data_dir` if its manifest matches, else write it (atomically).

    A folder that holds anything else is never overwritten: that is an error naming it.
    """
    from training.synthetic_scenes.writers import write_demo_dataset

    wanted = {"seed": data_seed, "num_samples": demo_sizes(budget)}
    manifest_path = data_dir / "manifest.json"
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        if manifest_summary(manifest) != wanted:
            raise ValueError(
                f"{data_dir} holds other demo data ({manifest_summary(manifest)}, this budget needs "
                f"{wanted}); pass another --data-dir or remove it"
            )
        return data_from_manifest(data_dir, manifest)
    if data_dir.exists() and any(data_dir.iterdir()):
        raise ValueError(f"{data_dir} exists and holds no demo data manifest; pass another --data-dir")
    partial = data_dir.with_name(data_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    write_demo_dataset(
        partial,
        seed=data_seed,
        num_train=budget.num_train,
        num_val=budget.num_val,
        num_test=budget.num_test,
        shard_size=budget.shard_size,
    )
    if data_dir.exists():
        data_dir.rmdir()  # empty, checked above
    os.replace(partial, data_dir)
    return data_from_manifest(data_dir, json.loads(manifest_path.read_text()))


def demo_sizes(budget: Budget) -> Dict[str, int]:
    return {"train": budget.num_train, "val": budget.num_val, "test": budget.num_test}


def manifest_summary(manifest: Mapping[str, Any]) -> Dict[str, Any]:
    return {
        "seed": manifest["seed"],
        "num_samples": {split: info["num_samples"] for split, info in manifest["splits"].items()},
    }


def data_from_manifest(root: Path, manifest: Mapping[str, Any]) -> ComparisonData:
    splits = manifest["splits"]
    return ComparisonData(
        root=str(root),
        train_data=str(root / splits["train"]["data"]),
        val_data=str(root / splits["val"]["data"]),
        num_train=splits["train"]["num_samples"],
        data_size=splits["train"]["keys"][1],
    )
