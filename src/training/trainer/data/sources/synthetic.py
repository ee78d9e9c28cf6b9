"""Synthetic data (OpenCLIP's `--dataset-type synthetic`) in the same batch format: random-noise
images seeded by index, OpenCLIP's dummy caption, batches of a seeded per-epoch permutation."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from ..config import DataConfig
from ..loader import indexed_data
from ..ordered import OrderedPass, PassItem, PassSample
from ..samples import SkipCounter, seeded, stable_hash
from ..source import DataSource, LoaderInfo, register_data_source

_SYNTHETIC_CAPTION = "Dummy caption"  # what OpenCLIP's SyntheticDataset uses
_PASS_IMAGE_SIZE = (224, 224)  # an ordered pass has no transform to size its images for: OpenCLIP's default


@register_data_source("synthetic")
class Synthetic(DataSource):
    description = "random-noise images with a dummy caption, --train-num-samples of them (a smoke test)"
    reads_data = False
    one_caption = True  # OpenCLIP's dummy caption

    def train_data(self, cfg: DataConfig, preprocess: Callable, tokenizer: Callable, epoch: int) -> LoaderInfo:
        dataset = SyntheticDataset(preprocess, _num_samples(cfg.train_num_samples), cfg.seed)
        return indexed_data(dataset, cfg, tokenizer, epoch, train=True, source="synthetic")

    def val_data(self, cfg: DataConfig, preprocess: Callable, tokenizer: Callable) -> LoaderInfo:
        dataset = SyntheticDataset(preprocess, _num_samples(cfg.val_num_samples or cfg.train_num_samples), cfg.seed)
        return indexed_data(dataset, cfg, tokenizer, 0, train=False, source="synthetic")

    def ordered_pass(self, cfg: DataConfig, data: str | None, data_flag: str) -> OrderedPass:
        return SyntheticPass(_num_samples(cfg.train_num_samples), cfg.seed)


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
        with seeded(stable_hash(self.seed, index, "augment")):
            image = self.preprocess(noise_image(self.seed, index, self.image_size))
        return image, _SYNTHETIC_CAPTION, index


def noise_image(seed: int, index: int, size: tuple[int, int]) -> Image.Image:
    """Sample `index`'s random-noise image, (height, width) = `size`."""
    return Image.fromarray(np.random.default_rng([seed, index]).integers(0, 256, (*size, 3), dtype=np.uint8))


@dataclass(frozen=True)
class SyntheticPass(OrderedPass):
    """The samples in index order, their images PNG-encoded."""

    num_samples: int
    seed: int
    caption_field: str = "(one dummy caption)"

    def items(self, events: SkipCounter) -> Iterator[PassItem]:
        for index in range(self.num_samples):
            png = io.BytesIO()
            noise_image(self.seed, index, _PASS_IMAGE_SIZE).save(png, format="PNG")
            yield PassSample(str(index), "synthetic", _SYNTHETIC_CAPTION, png.getvalue())


def _transform_size(preprocess: Callable) -> tuple[int, int]:
    """(height, width) the transform's first step produces, as OpenCLIP's synthetic data reads it."""
    size = getattr(getattr(preprocess, "transforms", [None])[0], "size", 224)
    return (size, size) if isinstance(size, int) else tuple(size)
