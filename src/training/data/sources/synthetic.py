"""Synthetic data (OpenCLIP's `--dataset-type synthetic`) in the same batch format: random-noise
images seeded by index, OpenCLIP's dummy caption, batches of a seeded per-epoch permutation."""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ..config import DataConfig
from ..loader import LoaderInfo, indexed_data
from ..registry import DataSource, register_data_source
from ..samples import seeded, stable_hash

_SYNTHETIC_CAPTION = "Dummy caption"  # what OpenCLIP's SyntheticDataset uses


@register_data_source("synthetic")
class Synthetic(DataSource):
    description = "random-noise images with a dummy caption, --train-num-samples of them (a smoke test)"
    reads_data = False

    def train_data(self, cfg: DataConfig, preprocess: Callable, tokenizer: Callable, epoch: int) -> LoaderInfo:
        dataset = SyntheticDataset(preprocess, _num_samples(cfg.train_num_samples), cfg.seed)
        return indexed_data(dataset, cfg, tokenizer, epoch, train=True, source="synthetic")

    def val_data(self, cfg: DataConfig, preprocess: Callable, tokenizer: Callable) -> LoaderInfo:
        dataset = SyntheticDataset(preprocess, _num_samples(cfg.val_num_samples or cfg.train_num_samples), cfg.seed)
        return indexed_data(dataset, cfg, tokenizer, 0, train=False, source="synthetic")


def _num_samples(num_samples: int | None) -> int:
    if not num_samples:
        raise ValueError("dataset_type synthetic needs train_num_samples (--train-num-samples)")
    return num_samples


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


def _transform_size(preprocess: Callable) -> tuple[int, int]:
    """(height, width) the transform's first step produces, as OpenCLIP's synthetic data reads it."""
    size = getattr(getattr(preprocess, "transforms", [None])[0], "size", 224)
    return (size, size) if isinstance(size, int) else tuple(size)
