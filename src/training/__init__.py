"""The trainer: `python -m training.main` (training), `training.export`, `training.evaluate`; data, checkpoints, logging."""
