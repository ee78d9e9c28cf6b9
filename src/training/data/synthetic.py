"""Synthetic data (OpenCLIP's `--dataset-type synthetic`) in the same batch format: random-noise
images seeded by index, OpenCLIP's dummy caption, batches of a seeded per-epoch permutation."""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import torch
from open_clip_train.data import SharedEpoch
from PIL import Image
from torch.utils.data import Dataset, Sampler

from .config import DataConfig
from .samples import seeded, stable_hash

_SYNTHETIC_CAPTION = "Dummy caption"  # what OpenCLIP's SyntheticDataset uses


class SyntheticDataset(Dataset):
    """Random-noise images (seeded by index) with OpenCLIP's dummy caption."""

    def __init__(self, preprocess: Callable, num_samples: int, seed: int) -> None:
        self.preprocess = preprocess
        self.num_samples = num_samples
        self.seed = seed
        self.image_size = _transform_size(preprocess)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str, int]:
        pixels = np.random.default_rng([self.seed, index]).integers(0, 256, (*self.image_size, 3), dtype=np.uint8)
        with seeded(stable_hash(self.seed, index, "augment")):
            image = self.preprocess(Image.fromarray(pixels))
        return image, _SYNTHETIC_CAPTION, index


class _SyntheticBatches(Sampler):
    """Per-rank batches of a seeded per-epoch permutation, skipping `skip` at the start epoch."""

    def __init__(self, num_samples: int, cfg: DataConfig, num_batches: int, shared_epoch: SharedEpoch,
                 start_epoch: int, shuffle: bool) -> None:
        self.num_samples = num_samples
        self.cfg = cfg
        self.num_batches = num_batches
        self.shared_epoch = shared_epoch
        self.start_epoch = start_epoch
        self.shuffle = shuffle

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.shared_epoch.get_value()
        order = torch.arange(self.num_samples)
        if self.shuffle:
            order = torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.cfg.seed + epoch))
        mine = order[self.cfg.rank::self.cfg.world_size].tolist()
        for batch in range(self._skip(epoch), self.num_batches):
            yield mine[batch * self.cfg.batch_size:(batch + 1) * self.cfg.batch_size]

    def __len__(self) -> int:
        return self.num_batches - self._skip(self.shared_epoch.get_value())

    def _skip(self, epoch: int) -> int:
        return self.cfg.skip_batches if self.shuffle and epoch == self.start_epoch else 0


def _transform_size(preprocess: Callable) -> tuple[int, int]:
    """(height, width) the transform's first step produces, as OpenCLIP's synthetic data reads it."""
    size = getattr(getattr(preprocess, "transforms", [None])[0], "size", 224)
    return (size, size) if isinstance(size, int) else tuple(size)
