"""The trainer: `python -m training.main` (training) on the layers of `training.trainer` (data, the run folder, the
engine, the launch), and the tools beside it.

From Python, `training.run(config)` trains the run a `RunConfig` describes (`training.config_from_values` builds
one from flag values) and returns a summary whose `.run_folder` reads the run folder (a `RunDir`):

    from training import config_from_values, run

    summary = run(config_from_values({"train_data": "...", "model": "adacl-tiny", "loss": "adacl"}))

The package's face, each name imported from the layer that defines it: `run`, `Trainer` (which owns a run),
`RunConfig`, `config_from_values`, `RunDir` (a run folder read back), `ConfigError` (a configuration the
trainer refuses, shown as one `error:` line), and the registries a new part is added
to: `LOSSES` (`open_clip_adacl.register_loss`), `SCHEDULES` (LR schedules), `SOURCES` (data sources) and
`RECIPES` (named flag sets).

Built on the library `open_clip_adacl`. The tools that use the trainer live beside it as subpackages,
and nothing else in the trainer imports them: evaluation after training (`training.evaluation`), the
demo data (`training.synthetic_scenes`), export (`training.export`) and clone discovery over a dataset
(`training.discover`). The laboratory (the studies and the loss comparison, `studies/` in the repository,
not in the wheel) imports these names; nothing here imports it.
"""

from importlib import import_module
from typing import Any, List

# name -> the module that defines it (relative to this package, or absolute for the library).
PUBLIC_FACE = {
    "run": ".main",
    "Trainer": ".trainer.launch.trainer",
    "RunConfig": ".trainer.launch.config",
    "config_from_values": ".trainer.launch.params",
    "RunDir": ".trainer.run_folder.layout",
    "ConfigError": ".trainer.flags",
    "LOSSES": "open_clip_adacl.losses.registry",
    "SCHEDULES": ".trainer.engine.schedule",
    "SOURCES": ".trainer.data.registry",
    "RECIPES": ".trainer.launch.recipes",
}
__all__ = list(PUBLIC_FACE)


def __getattr__(name: str) -> Any:
    """Each name of the face, imported at its first use: `import training` precedes every `python -m
    training.<module>`, and importing `training.main` costs seconds (torch, open_clip) that a light tool
    (`training.trainer.run_folder.layout`) or `python -m training.main` before its preemption handler is installed
    must not pay."""
    if name not in PUBLIC_FACE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(PUBLIC_FACE[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> List[str]:
    return sorted({*globals(), *PUBLIC_FACE})
