"""What the data pipeline takes (DataConfig) and what it reports (skip reasons, DataError)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from PIL import Image

from ..flags import LAUNCH_SETTING, SAMPLE_ORDER, ConfigError, HelpGroup, flag, from_flag
from .registry import AUTO, dataset_type_help, makes_its_own_samples, registered_dataset_types

SKIP_REASONS = (
    "unreadable_shard",  # the shard file could not be opened or read (counted once per visit)
    "bad_tar",  # not a tar, or truncated / corrupt mid-way (counted once per visit)
    "duplicate_key",  # a sample whose key already appeared in the same shard
    "missing_image",  # no jpg/jpeg/png/webp/gif member
    "bad_image",  # the image does not decode (or the transform raises on it)
    "huge_image",  # more pixels than DataConfig.max_image_pixels (checked before decoding)
    "missing_caption",  # the chosen caption field is absent
    "non_utf8_caption",  # the caption bytes are not UTF-8
    "empty_caption",  # the caption is empty or whitespace
    "bad_json",  # the json member does not parse (its key could not be trusted)
    "not_a_file",  # a csv image path names a device, FIFO or socket, not a regular file (never read)
    "oversized_image",  # an image of more bytes than DataConfig.max_image_bytes (never decoded)
    "oversized_caption",  # a caption of more bytes than DataConfig.max_caption_bytes (never tokenized)
    "bad_path",  # a csv image path no file can have (a NUL byte in it; never looked up)
    "bad_sample_key",  # for a loss with per-sample state: no json "key" that is an integer in [0, --data-size)
)


def global_batch(batch_size: int, world_size: int) -> int:
    """OpenCLIP's global batch: the samples of one batch over all ranks (`--batch-size` per rank x the ranks).
    With `--accum-freq K` an optimizer step takes K of them (`samples_per_step`)."""
    return batch_size * world_size


def samples_per_step(batch_size: int, world_size: int, accum_freq: int) -> int:
    """The samples of one optimizer step: `accum_freq` global batches."""
    return global_batch(batch_size, world_size) * accum_freq


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

    FLAG_GROUP: ClassVar[str] = HelpGroup.DATA

    train_data: str | None = flag(
        None, "Training shards (braceexpand patterns); several sources joined with `::`.", resume=SAMPLE_ORDER
    )
    train_data_upsampling_factors: str | None = flag(
        None,
        "With --dataset-resampled and several `::` sources: one weight per source (e.g. 1::2::0.5). By "
        "default sources are sampled uniformly.",
        resume=SAMPLE_ORDER,
    )
    val_data: str | None = flag(None, "Validation shards.")
    train_num_samples: int | None = flag(
        None, "Samples per epoch; needed when the shards have no sizes.json.", resume=SAMPLE_ORDER
    )
    val_num_samples: int | None = flag(None, "Validation samples.")
    """Validation size for progress; default: sizes.json, else unknown (0)."""
    dataset_type: str = flag(AUTO, dataset_type_help, choices=registered_dataset_types, resume=SAMPLE_ORDER)
    """A registered data source (webdataset, csv, synthetic, ...) or "auto": the one declaring the data's
    suffix."""
    dataset_resampled: bool = flag(False, "Sample shards with replacement.", resume=SAMPLE_ORDER)
    caption_key: str = flag(
        "txt", "Caption field of each sample; a comma list samples one field per sample.", resume=SAMPLE_ORDER
    )
    val_caption_key: str | None = flag(
        None,
        "Caption field for validation (default: the first of --caption-key), e.g. train on pseudo captions, "
        "validate on gold ones (docs/data.md).",
    )
    group_size: int = flag(
        1,
        "Shuffle runs of this many consecutive samples of a shard as units, so data written in families "
        "(one-edit siblings) reaches a batch as whole families (docs/data.md). 1: shuffle single samples, as "
        "OpenCLIP.",
        name="--train-group-size",
        resume=SAMPLE_ORDER,
    )
    shard_timeout: float = flag(
        300.0,
        "Seconds a `pipe:` shard's command may send no data before it is ended and the shard skipped "
        "(counted as unreadable_shard, its URL logged); 0: wait forever.",
        metavar="SECONDS",
        resume=LAUNCH_SETTING,
    )
    max_image_bytes: int = flag(
        64 * 2**20,
        "Images of more bytes are skipped as oversized_image before decoding; a csv image path is read "
        "only up to this many bytes, and only when it names a regular file (else not_a_file).",
        metavar="BYTES",
    )
    max_caption_bytes: int = flag(
        65536, "Captions of more bytes (UTF-8) are skipped as oversized_caption before tokenizing.", metavar="BYTES"
    )
    workers: int = flag(4, "Number of dataloader workers per GPU.", field_default=1, resume=SAMPLE_ORDER)
    """DataLoader worker processes per rank; 0 reads in the main process (in code: 1)."""
    batch_size: int = flag(64, "Batch size per GPU.", resume=SAMPLE_ORDER)
    seed: int = from_flag("seed", default=0)
    """Seeds shard order, shuffling, caption choice and augmentation."""
    source_options: Any = None
    """The data source's own options (its `Options`, e.g. csv's --csv-separator), for the source that reads
    --train-data; None: its declared defaults (`DataSource.options`)."""
    rank: int = 0
    """This process's rank: training shards are split over ranks without a process group."""
    world_size: int = 1
    """Number of ranks."""
    skip_batches: int = 0
    """Batches of the starting epoch already consumed (all ranks alike), for exact mid-epoch resume."""
    family_field: str | None = None
    """The json field of each sample's family id; when set, batches carry the ids as a fifth tensor (-1: the
    sample has none). The trainer sets it for a loss that `needs_family`."""
    sample_index_limit: int | None = None
    """For a loss that keeps state per sample (the trainer sets it to --data-size): each shard sample's id must be its
    json "key", an integer in [0, limit); a sample without one is skipped as bad_sample_key. A csv's ids, its row
    numbers, are known before any is read (`LoaderInfo.sample_ids_below`): the trainer refuses a csv of more rows."""
    max_image_pixels: int = Image.MAX_IMAGE_PIXELS
    """Images with more pixels are skipped as huge_image before decoding."""

    @property
    def max_member_bytes(self) -> int:
        """The largest tar member read: a larger one could pass neither --max-image-bytes nor --max-caption-bytes."""
        return max(self.max_image_bytes, self.max_caption_bytes)

    def check(self) -> None:
        if self.train_data is None and not makes_its_own_samples(self.dataset_type):
            raise ConfigError(
                "--train-data is required (shards such as 'data/train/shard-{000000..000009}.tar'); "
                "or use --dataset-type synthetic for a smoke test"
            )
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.shard_timeout < 0:
            raise ConfigError(f"--shard-timeout must be >= 0 seconds (0: no timeout), got {self.shard_timeout}")
        for name, value in ("--max-image-bytes", self.max_image_bytes), ("--max-caption-bytes", self.max_caption_bytes):
            if value < 1:
                raise ConfigError(f"{name} must be >= 1 byte, got {value}")
        if self.workers < 0:
            raise ConfigError(f"--workers must be >= 0, got {self.workers}")
        if self.train_num_samples is not None and self.train_num_samples < 1:
            raise ConfigError(f"--train-num-samples must be >= 1, got {self.train_num_samples}")
