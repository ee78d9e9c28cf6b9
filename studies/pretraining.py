"""A study's common pretraining: one `clip` run that every fine-tuning run of the study starts from.

Written once under <output root>/pretrain/<name> and reused, or resumed, only when its run folder recorded the
same identity (recipe, seed, data seed and code: `run_folder.provenance.training_identity`); a folder trained
otherwise, or one that recorded nothing, is an error naming what differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from training import RunDir, config_from_values, run
from training.trainer.launch.recipes import recipe_values
from training.trainer.run_folder.provenance import check_or_record_identity, training_identity

from .data import DataSet


@dataclass(frozen=True)
class Pretraining:
    """`clip` trained with `recipe` and `seed` on `data`, into <output root>/pretrain/<name>."""

    name: str
    recipe: str
    seed: int
    data: DataSet
    log_every_n_steps: int = 64


def pretrain(pretraining: Pretraining, output_root: Path) -> Path:
    """The pretraining's final checkpoint, trained here unless a run folder of the same identity holds it."""
    training = pretraining.data.training(output_root)
    logs = output_root / "pretrain"
    epochs = recipe_values(pretraining.recipe, world_size=1)["epochs"]
    run_dir = RunDir(logs / pretraining.name)
    identity = training_identity(pretraining.recipe, pretraining.seed, training.data_seed)
    try:
        check_or_record_identity(run_dir.path, identity)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    checkpoint = run_dir.epoch_checkpoint(epochs)
    if checkpoint.is_file():
        return checkpoint
    values = {
        "train_data": training.train_data,
        "val_data": training.val_data,
        **({"train_num_samples": training.num_samples} if training.num_samples else {}),
        "dataset_type": "webdataset",
        "loss": "clip",
        "seed": pretraining.seed,
        "save_frequency": epochs,
        "log_every_n_steps": pretraining.log_every_n_steps,
        "logs": str(logs),
        "name": pretraining.name,
        "resume": "latest",
    }
    print(f"== pretraining {pretraining.name} ({epochs} epochs, recipe {pretraining.recipe})", flush=True)
    run(config_from_values(values, recipe=pretraining.recipe))
    return checkpoint
