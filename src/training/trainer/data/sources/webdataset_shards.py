"""Webdataset shards (`--dataset-type webdataset`, or `auto` for data ending in .tar): brace-expanded
tar URLs, several sources joined by `::`, read by `ShardStream`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterator

from open_clip_train.data import SharedEpoch, expand_urls

from ..config import DataConfig
from ..loader import batches_per_epoch, check_skip, stream_data, validation_batches
from ..ordered import OrderedPass, PassItem, PassSample
from ..samples import SkipCounter
from ..shards import check_sample_fields, check_shard_sample, check_shards, declared_dataset_size, read_shard
from ..source import DataSource, LoaderInfo, register_data_source
from ..stream import ShardStream

_SHUFFLE_SIZE = 5000  # OpenCLIP's _SAMPLE_SHUFFLE_SIZE

logger = logging.getLogger(__name__)


@register_data_source("webdataset")
class WebdatasetShards(DataSource):
    description = "webdataset tar shards (img2dataset layout), several sources joined by '::'"
    suffixes = (".tar",)

    def train_data(self, cfg: DataConfig, preprocess: Callable, tokenizer: Callable, epoch: int) -> LoaderInfo:
        urls, weights = _train_urls(cfg)
        dataset_size = declared_dataset_size(urls)
        num_samples = cfg.train_num_samples or dataset_size
        if not num_samples:
            raise ValueError(
                f"no sizes.json next to the shards of {cfg.train_data!r}: pass train_num_samples "
                "(--train-num-samples) with the number of training samples"
            )
        num_readers = max(1, cfg.workers)
        num_batches = batches_per_epoch(num_samples, cfg, num_readers)
        if cfg.batch_size % cfg.group_size:
            logger.warning(
                f"batch size {cfg.batch_size} is not a multiple of --train-group-size {cfg.group_size}: "
                "batch boundaries cut some groups in two"
            )
        check_skip(cfg.skip_batches, num_batches)
        # OpenCLIP's 5000-sample buffer is half an img2dataset shard of 10000; keep that ratio.
        shuffle_size = max(1, min(_SHUFFLE_SIZE, (dataset_size or num_samples) // len(urls) // 2))
        stream = ShardStream(
            urls=tuple(urls),
            weights=None if weights is None else tuple(weights),
            cfg=cfg,
            preprocess=preprocess,
            tokenizer=tokenizer,
            shared_epoch=SharedEpoch(epoch),
            start_epoch=epoch,
            batches_per_reader=num_batches // num_readers,
            shuffle_size=shuffle_size,
        )
        info = stream_data(stream, cfg.workers, num_batches * cfg.batch_size, num_batches)
        info.data_size = dataset_size
        return info

    def val_data(self, cfg: DataConfig, preprocess: Callable, tokenizer: Callable) -> LoaderInfo:
        urls, _ = expand_urls(cfg.val_data)
        check_shards(urls, "val_data (--val-data)")
        num_samples = cfg.val_num_samples or declared_dataset_size(urls) or 0
        stream = ShardStream(
            urls=tuple(urls),
            weights=None,
            cfg=cfg,
            preprocess=preprocess,
            tokenizer=tokenizer,
            shared_epoch=SharedEpoch(0),
            start_epoch=0,
            batches_per_reader=None,
            shuffle_size=0,
        )
        return stream_data(stream, cfg.workers, num_samples, validation_batches(num_samples, cfg.batch_size))

    def ordered_pass(self, cfg: DataConfig, data: str | None, data_flag: str) -> OrderedPass:
        urls, _ = expand_urls(data)
        check_shards(urls, data_flag)
        caption_keys = tuple(key.strip() for key in cfg.caption_key.split(","))
        check_sample_fields(
            urls,
            caption_keys,
            key_flag="--caption-key",
            data_flag=data_flag,
            timeout_s=cfg.shard_timeout,
            max_member_bytes=cfg.max_member_bytes,
        )
        return ShardPass(
            tuple(urls),
            caption_keys,
            cfg.seed,
            cfg.shard_timeout,
            num_samples=declared_dataset_size(urls) or cfg.train_num_samples,
            caption_field=cfg.caption_key,
            max_image_bytes=cfg.max_image_bytes,
            max_caption_bytes=cfg.max_caption_bytes,
        )

    def check_fields(self, cfg: DataConfig) -> None:
        caption_keys = [key.strip() for key in cfg.caption_key.split(",")]
        check_sample_fields(
            expand_urls(cfg.train_data)[0],
            caption_keys,
            key_flag="--caption-key",
            data_flag="--train-data",
            timeout_s=cfg.shard_timeout,
            max_member_bytes=cfg.max_member_bytes,
        )
        if cfg.val_data is not None:
            check_sample_fields(
                expand_urls(cfg.val_data)[0],
                [(cfg.val_caption_key or caption_keys[0]).strip()],
                key_flag="--val-caption-key" if cfg.val_caption_key else "--caption-key",
                data_flag="--val-data",
                timeout_s=cfg.shard_timeout,
                max_member_bytes=cfg.max_member_bytes,
            )


@dataclass(frozen=True)
class ShardPass(OrderedPass):
    """The shards in the order given, each sample in shard order (its epoch-0 caption when several keys)."""

    urls: tuple[str, ...]
    caption_keys: tuple[str, ...]
    seed: int
    shard_timeout: float
    num_samples: int | None
    caption_field: str
    max_image_bytes: int
    max_caption_bytes: int

    def items(self, events: SkipCounter) -> Iterator[PassItem]:
        for url in self.urls:
            for sample in read_shard(
                url, events, self.shard_timeout, max(self.max_image_bytes, self.max_caption_bytes)
            ):
                reason, candidate = check_shard_sample(
                    sample,
                    caption_keys=self.caption_keys,
                    family_field=None,
                    seed=self.seed,
                    epoch=0,
                    shard_run=(0, 0),
                    max_image_bytes=self.max_image_bytes,
                    max_caption_bytes=self.max_caption_bytes,
                )
                yield (
                    reason
                    if candidate is None
                    else PassSample(sample["__key__"], url, candidate.text, candidate.image_bytes, sample.get("json"))
                )


def _train_urls(cfg: DataConfig) -> tuple[list[str], list[float] | None]:
    """Expanded training shards and per-shard weights, checked against the sources and readers."""
    factors = cfg.train_data_upsampling_factors
    if factors is not None:
        if not cfg.dataset_resampled:
            raise ValueError(
                "train_data_upsampling_factors (--train-data-upsampling-factors) needs "
                "dataset_resampled (--dataset-resampled), as in OpenCLIP"
            )
        num_sources, num_factors = len(cfg.train_data.split("::")), len(factors.split("::"))
        if num_sources != num_factors:
            raise ValueError(f"{num_factors} upsampling factors for {num_sources} '::'-separated train_data sources")
    urls, weights = expand_urls(cfg.train_data, factors)
    check_shards(urls, "train_data (--train-data)")
    num_readers = max(1, cfg.workers) * cfg.world_size
    if not cfg.dataset_resampled and len(urls) < num_readers:
        raise ValueError(
            f"{len(urls)} shards cannot be split over world_size x workers = "
            f"{cfg.world_size} x {max(1, cfg.workers)} readers: use fewer workers, more shards, "
            "or dataset_resampled (--dataset-resampled)"
        )
    return urls, weights
