"""Changes a resume accepts that still alter the run: named, one warning line per flag.

A resume that changes the learning-rate schedule, the number of epochs, the precision or gradient
clipping continues the same data order, so it is not refused (unlike sample-order changes,
`resume.check_resume`), but the rest of the run then differs from the run the checkpoint began:
each such change is logged with its old and new value and what it alters.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Dict, Mapping, Tuple

from .config import with_canonical_names

# Recorded argument -> what changing it alters from the resume point on.
RUN_CHANGING_ARGS = {
    "lr": "the learning-rate schedule",
    "warmup": "the learning-rate schedule",
    "lr_scheduler": "the learning-rate schedule",
    "epochs_cooldown": "the learning-rate schedule",
    "lr_cooldown_power": "the learning-rate schedule",
    "lr_cooldown_end": "the learning-rate schedule",
    "epochs": "the run's length and its learning-rate schedule",
    "precision": "the numerics of every later step",
    "grad_clip_norm": "gradient clipping",
}


def run_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> Dict[str, Tuple[Any, Any]]:
    """The RUN_CHANGING_ARGS whose recorded value differs (a checkpoint that recorded none: none)."""
    return {name: (old[name], new.get(name)) for name in RUN_CHANGING_ARGS
            if name in old and old[name] != new.get(name)}


def warn_run_changes(checkpoint: Mapping[str, Any], path: os.PathLike, new_args: Mapping[str, Any]) -> None:
    """One warning line per RUN_CHANGING_ARGS flag this resume of `checkpoint` changes."""
    step = checkpoint.get("step", "?")
    for name, (old, new) in run_changes(with_canonical_names(checkpoint.get("args") or {}), new_args).items():
        logging.warning(f"Resuming {path} with --{name.replace('_', '-')} {old} -> {new}: from step {step} on this "
                        f"changes {RUN_CHANGING_ARGS[name]} (the run no longer matches the one the checkpoint began)")
