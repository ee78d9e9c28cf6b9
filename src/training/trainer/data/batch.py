"""What every training and validation loader yields: one rank's `Batch`, typed from the loader to the loss."""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .samples import Skipped


class Batch(NamedTuple):
    """One batch of this rank's samples. A tuple whose first two fields are OpenCLIP's `(images, texts)`, so
    code written for stock loaders (`images, texts = batch[:2]`) reads it too; the trainer reads it by name."""

    images: torch.Tensor  # B x C x H x W, preprocessed
    texts: torch.Tensor  # B x L caption token ids (what a loss that `takes_text_tokens` reads)
    sample_index: torch.Tensor  # B int64, each sample's global index (docs/data.md)
    skipped: Skipped  # what the reader skipped since its previous batch (counted per reason)
    family: Optional[torch.Tensor] = None  # B int64 family ids (-1: none), when DataConfig.family_field asks

    def to(self, device: torch.device, input_dtype: Optional[torch.dtype] = None) -> "Batch":
        """The tensors on `device` (images in `input_dtype`, if given); `skipped` stays where it is, on the host."""
        return Batch(
            self.images.to(device=device, dtype=input_dtype, non_blocking=True),
            self.texts.to(device=device, non_blocking=True),
            self.sample_index.to(device=device, non_blocking=True),
            self.skipped,
            None if self.family is None else self.family.to(device=device, non_blocking=True),
        )
