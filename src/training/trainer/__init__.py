"""The trainer's layers, each a package that imports only the ones below it (`tests/test_layout.py`):

- `launch/`: a command line or a recipe to a checked run config, the checks before any work, resuming,
  the run folder as a launch sets it up;
- `engine/`: the components and the loop: model, optimizer, precision, LR schedule, checkpoint layout, one
  epoch of steps, validation;
- `run_folder/`: everything a run writes and reads back: the folder's layout, its lock, record files that
  outlive a full disk, the metrics log, checkpoint files and digests, provenance, plots;
- `data/`: the training and validation data;
- the foundations, here: `flags` (each flag declared once), `distributed` (process group and collectives),
  `preemption` (a signal ends the run at a step boundary), `progress` (time-left estimates).

`training.main` runs them; the tools beside it (`training.export`, `training.evaluation`, ...) use them.
"""
