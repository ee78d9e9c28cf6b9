"""What the data pipeline takes (DataConfig) and what it reports (skip reasons, DataError)."""
from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

SKIP_REASONS = (
    "unreadable_shard",  # the shard file could not be opened or read (counted once per visit)
    "bad_tar",  # not a tar, or truncated / corrupt mid-way (counted once per visit)
    "duplicate_key",  # a sample whose key already appeared in the same shard
    "missing_image",  # no jpg/jpeg/png/webp member
    "bad_image",  # the image does not decode (or the transform raises on it)
    "huge_image",  # more pixels than DataConfig.max_image_pixels (checked before decoding)
    "missing_caption",  # the chosen caption field is absent
    "non_utf8_caption",  # the caption bytes are not UTF-8
    "empty_caption",  # the caption is empty or whitespace
    "bad_json",  # the json member does not parse (its key could not be trusted)
)


class DataError(RuntimeError):
    """The data cannot fill the epoch: every shard unreadable, or images that keep failing to decode."""


def data_error_reason(error: DataError) -> str:
    """The message a DataError was raised with, also when a DataLoader worker raised it (torch then
    re-raises it in the trainer with the worker's traceback prepended)."""
    text = str(error)
    if "Original Traceback" not in text:
        return text
    return text.rsplit(f"{DataError.__name__}: ", 1)[-1].strip()


@dataclass(frozen=True)
class DataConfig:
    """Everything the data pipeline needs; the trainer fills it from OpenCLIP-named flags."""

    train_data: str | None = None
    """Shard URLs, brace-expanded, several sources joined by `::` (--train-data)."""
    train_data_upsampling_factors: str | None = None
    """`::`-separated weight per source, only with dataset_resampled (--train-data-upsampling-factors)."""
    train_num_samples: int | None = None
    """Samples per epoch; default: the sum of the shards' sizes.json entries (--train-num-samples)."""
    val_data: str | None = None
    """Validation shards (--val-data)."""
    val_num_samples: int | None = None
    """Validation size for progress (--val-num-samples); default: sizes.json, else unknown (0)."""
    dataset_type: str = "auto"
    """A registered data source (webdataset, csv, synthetic, ...) or "auto": the one declaring the data's
    suffix, webdataset for .tar, csv for .csv/.tsv (--dataset-type)."""
    dataset_resampled: bool = False
    """Draw shards with replacement instead of an epoch-wise shuffle (--dataset-resampled)."""
    batch_size: int = 64
    """Per-rank batch size (--batch-size)."""
    workers: int = 1
    """DataLoader worker processes per rank; 0 reads in the main process (--workers)."""
    seed: int = 0
    """Seeds shard order, shuffling, caption choice and augmentation (--seed)."""
    rank: int = 0
    """This process's rank: training shards are split over ranks without a process group."""
    world_size: int = 1
    """Number of ranks."""
    caption_key: str = "txt"
    """Caption field; a comma list samples one of them per sample (--caption-key)."""
    val_caption_key: str | None = None
    """Validation's caption field (--val-caption-key); default: the first of caption_key."""
    group_size: int = 1
    """Training shuffles runs of this many consecutive samples of a shard as units (--train-group-size)."""
    skip_batches: int = 0
    """Batches of the starting epoch already consumed (all ranks alike), for exact mid-epoch resume."""
    max_image_pixels: int = Image.MAX_IMAGE_PIXELS
    """Images with more pixels are skipped as huge_image before decoding."""
    csv_separator: str = "\t"
    """Field separator of csv data (--csv-separator; OpenCLIP's default: tab)."""
    csv_img_key: str = "filepath"
    """Column of csv data holding the image path (--csv-img-key)."""
    csv_caption_key: str = "title"
    """Column of csv data holding the caption (--csv-caption-key)."""
