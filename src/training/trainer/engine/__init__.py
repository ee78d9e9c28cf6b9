"""The run's components and its loop: model, optimizer, precision, LR schedule, the checkpoint's layout
(`checkpoint`), one epoch of steps (`loop`) and in-training validation."""
