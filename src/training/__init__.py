"""The trainer: `python -m training.main` (training), `training.export`; data, checkpoints, logging, validation.

Built on the library `open_clip_adacl`; evaluation after training (`evaluation`), the demo data
(`synthetic_scenes`) and the loss comparison (`loss_comparison`) are packages beside it that use it.
"""
