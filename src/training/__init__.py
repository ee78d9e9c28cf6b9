"""The trainer: `python -m training.main` (training), `training.export`; data, checkpoints, logging, validation.

Built on the library `open_clip_adacl`. The tools that use the trainer live beside it as subpackages,
and nothing else in the trainer imports them: evaluation after training (`training.evaluation`), the
demo data (`training.synthetic_scenes`), the loss comparison (`training.loss_comparison`) and clone
discovery over a dataset (`training.discover`).
"""
