"""A checkpoint's content digest: sha256 over everything it holds, stored inside it, checked on load.

The digest covers every key and value of the checkpoint dict except its own (`DIGEST_KEY`): tensors by
dtype, shape and bytes, containers by their entries, plain values by type and repr. It is computed from
the payload before `torch.save` and stored in the same file, so it is written atomically with it; on
load it is recomputed from what `torch.load` returned. Flipped bits or overwritten bytes in the tensors
or the pickled values then fail the check (`CheckpointDamaged`) instead of resuming altered weights or
optimizer state; damage to the zip structure already fails `torch.load`. A checkpoint without a digest
(written before checkpoints carried one, or by OpenCLIP) loads unverified, with one line saying so.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any, Dict, Mapping

import torch

DIGEST_KEY = "digest"


class CheckpointDamaged(ValueError):
    """A checkpoint whose contents do not match the digest written with them."""


def content_digest(checkpoint: Mapping[str, Any]) -> str:
    """ "sha256:<hex>" of every entry of `checkpoint` but the digest itself."""
    digest = hashlib.sha256()
    _feed(digest, {key: value for key, value in checkpoint.items() if key != DIGEST_KEY})
    return "sha256:" + digest.hexdigest()


def _feed(digest, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"tensor {tensor.dtype} {tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, Mapping):
        digest.update(f"mapping {len(value)};".encode())
        for key in sorted(value, key=repr):  # keys may mix types (an optimizer's int parameter ids)
            _feed(digest, key)
            _feed(digest, value[key])
    elif isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__} {len(value)};".encode())
        for item in value:
            _feed(digest, item)
    else:
        digest.update(f"{type(value).__name__} {value!r};".encode())


def with_digest(payload: Dict[str, Any]) -> Dict[str, Any]:
    """`payload` with its content digest added (what the Checkpointer saves)."""
    return {**payload, DIGEST_KEY: content_digest(payload)}


def verify_digest(checkpoint: Mapping[str, Any], path: os.PathLike) -> None:
    """Raise CheckpointDamaged when a training checkpoint's contents do not match its digest; one line for
    a training checkpoint without one (a bare state dict, e.g. --pretrained weights, is not checked)."""
    if DIGEST_KEY not in checkpoint:
        if "state_dict" in checkpoint:
            logging.info(
                f"{path} carries no content digest (written before checkpoints had one, or by OpenCLIP); "
                "loaded without verifying its contents"
            )
        return
    if content_digest(checkpoint) != checkpoint[DIGEST_KEY]:
        raise CheckpointDamaged(
            "its contents do not match the digest written with it (the file was damaged on disk "
            "or in a copy: bytes changed after it was saved)"
        )
