"""The trainer: `python -m training.main` (training) on the layers of `training.trainer` (data, the run folder, the
engine, the launch), and the tools beside it.

From Python, `training.run(config)` trains the run a `RunConfig` describes
(`training.trainer.launch.params.config_from_values` builds one from flag values) and returns a summary whose
`.record` reads the run folder:

    from training import run
    from training.trainer.launch.params import config_from_values

    summary = run(config_from_values({"train_data": "...", "model": "adacl-tiny", "loss": "adacl"}))

Built on the library `open_clip_adacl`. The tools that use the trainer live beside it as subpackages,
and nothing else in the trainer imports them: evaluation after training (`training.evaluation`), the
demo data (`training.synthetic_scenes`), the loss comparison (`training.loss_comparison`) and clone
discovery over a dataset (`training.discover`).
"""
from typing import Any

__all__ = ["run"]


def __getattr__(name: str) -> Any:
    """`training.run`, imported at its first use: `import training` precedes every `python -m training.<module>`,
    and importing `training.main` costs seconds (torch, open_clip) that a light tool
    (`training.trainer.run_folder.layout`) or `python -m training.main` before its preemption handler is installed
    must not pay."""
    if name == "run":
        from .main import run

        return run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
