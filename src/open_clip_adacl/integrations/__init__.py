"""The library's losses inside other trainers.

`open_clip_train`: stock OpenCLIP 3.3.0's trainer (`python -m open_clip_train.main`) with `--loss NAME` and
the loss's option flags, for a user who keeps that trainer (`python -m open_clip_adacl.integrations.open_clip_train`).
"""
