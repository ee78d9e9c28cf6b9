"""Building the loaders: `build_train_data` and `build_val_data` pick the source (webdataset shards,
a csv file or synthetic data), check the configuration, size the epoch and wrap the source's
stream in a DataLoader."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable

import torch
from open_clip_train.data import DataInfo, SharedEpoch, expand_urls
from torch.utils.data import DataLoader

from .config import DATASET_TYPES, SKIP_REASONS, DataConfig
from .csv_rows import CsvStream, read_csv_rows
from .shards import check_shards, declared_dataset_size
from .stream import ShardStream
from .synthetic import SyntheticDataset, _SyntheticBatches

_SHUFFLE_SIZE = 5000  # OpenCLIP's _SAMPLE_SHUFFLE_SIZE

logger = logging.getLogger(__name__)


@dataclass
class LoaderInfo(DataInfo):
    """OpenCLIP's DataInfo (dataloader, set_epoch, shared_epoch) plus the epoch's size per rank."""

    num_samples: int = 0
    num_batches: int = 0


def build_train_data(cfg: DataConfig, preprocess: Callable, tokenizer: Callable, epoch: int = 0) -> LoaderInfo:
    """The training loader, positioned at `epoch` (and `cfg.skip_batches` into it).

    Call `info.set_epoch(e)` before iterating epoch e; `skip_batches` applies to `epoch` only.
    """
    _check_common(cfg)
    dataset_type = _resolve_type(cfg.dataset_type, cfg.train_data)
    if dataset_type == "synthetic":
        return _build_synthetic(cfg, preprocess, tokenizer, epoch, cfg.train_num_samples, train=True)
    if dataset_type == "csv":
        rows = read_csv_rows(cfg.train_data, cfg, "train_data (--train-data)")
        num_batches = _num_batches(cfg.train_num_samples or len(rows), cfg.batch_size * cfg.world_size,
                                   max(1, cfg.workers))
        _check_skip(cfg.skip_batches, num_batches)
        stream = CsvStream(rows=rows, cfg=cfg, preprocess=preprocess, tokenizer=tokenizer,
                           shared_epoch=SharedEpoch(epoch), start_epoch=epoch,
                           batches_per_reader=num_batches // max(1, cfg.workers))
        return _loader_info(_stream_loader(stream, cfg.workers), stream.shared_epoch,
                            num_batches * cfg.batch_size, num_batches)
    urls, weights = _train_urls(cfg)
    dataset_size = declared_dataset_size(urls)
    num_samples = cfg.train_num_samples or dataset_size
    if not num_samples:
        raise ValueError(f"no sizes.json next to the shards of {cfg.train_data!r}: pass train_num_samples "
                         "(--train-num-samples) with the number of training samples")
    num_readers = max(1, cfg.workers)
    num_batches = _num_batches(num_samples, cfg.batch_size * cfg.world_size, num_readers)
    if cfg.batch_size % cfg.group_size:
        logger.warning(f"batch size {cfg.batch_size} is not a multiple of --train-group-size {cfg.group_size}: "
                       "batch boundaries cut some groups in two")
    _check_skip(cfg.skip_batches, num_batches)
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
    return _loader_info(_stream_loader(stream, cfg.workers), stream.shared_epoch,
                        num_batches * cfg.batch_size, num_batches)


def build_val_data(cfg: DataConfig, preprocess: Callable, tokenizer: Callable) -> LoaderInfo | None:
    """The validation loader over `cfg.val_data` (None when there is none); one unshuffled pass."""
    if cfg.val_data is None:
        return None
    _check_common(cfg)
    dataset_type = _resolve_type(cfg.dataset_type, cfg.val_data)
    if dataset_type == "synthetic":
        num_samples = cfg.val_num_samples or cfg.train_num_samples
        return _build_synthetic(cfg, preprocess, tokenizer, 0, num_samples, train=False)
    if dataset_type == "csv":
        rows = read_csv_rows(cfg.val_data, cfg, "val_data (--val-data)")
        stream = CsvStream(rows=rows, cfg=cfg, preprocess=preprocess, tokenizer=tokenizer,
                           shared_epoch=SharedEpoch(0), start_epoch=0, batches_per_reader=None)
        num_samples = cfg.val_num_samples or len(rows)
        return _loader_info(_stream_loader(stream, cfg.workers), stream.shared_epoch,
                            num_samples, math.ceil(num_samples / cfg.batch_size))
    urls, _ = expand_urls(cfg.val_data)
    check_shards(urls, "val_data (--val-data)")
    num_samples = cfg.val_num_samples or declared_dataset_size(urls) or 0
    stream = ShardStream(
        urls=tuple(urls), weights=None, cfg=cfg, preprocess=preprocess, tokenizer=tokenizer,
        shared_epoch=SharedEpoch(0), start_epoch=0, batches_per_reader=None, shuffle_size=0,
    )
    return _loader_info(_stream_loader(stream, cfg.workers), stream.shared_epoch,
                        num_samples, math.ceil(num_samples / cfg.batch_size))


def _build_synthetic(cfg: DataConfig, preprocess: Callable, tokenizer: Callable, epoch: int,
                     num_samples: int | None, *, train: bool) -> LoaderInfo:
    if not num_samples:
        raise ValueError("dataset_type synthetic needs train_num_samples (--train-num-samples)")
    if train:
        if cfg.group_size != 1:
            raise ValueError("group_size (--train-group-size) groups consecutive samples of webdataset shards; "
                             "synthetic data has none: leave it at 1")
        num_batches = num_samples // (cfg.batch_size * cfg.world_size)
        if num_batches < 1:
            raise ValueError(f"{num_samples} synthetic samples do not fill one batch of "
                             f"{cfg.batch_size} x {cfg.world_size} ranks")
        _check_skip(cfg.skip_batches, num_batches)
    else:
        num_batches = math.ceil(num_samples / cfg.batch_size)
    batches = _SyntheticBatches(num_samples, cfg, num_batches, SharedEpoch(epoch), epoch, shuffle=train)

    def collate(items: list[tuple[torch.Tensor, str, int]]) -> tuple[torch.Tensor, ...]:
        images, texts, indices = zip(*items)
        return (torch.stack(images), tokenizer(list(texts)), torch.tensor(indices, dtype=torch.long),
                torch.zeros(len(SKIP_REASONS), dtype=torch.long))

    dataloader = DataLoader(SyntheticDataset(preprocess, num_samples, cfg.seed), batch_sampler=batches,
                            collate_fn=collate, num_workers=cfg.workers, persistent_workers=False,
                            generator=_private_generator())
    samples = num_batches * cfg.batch_size if train else num_samples
    return _loader_info(dataloader, batches.shared_epoch, samples, num_batches)


# ---------------------------------------------------------------------------------------------
# Checks and sizes


def _check_common(cfg: DataConfig) -> None:
    if cfg.batch_size < 1 or cfg.workers < 0 or cfg.world_size < 1 or not 0 <= cfg.rank < cfg.world_size:
        raise ValueError(f"invalid batch_size={cfg.batch_size}, workers={cfg.workers}, "
                         f"rank={cfg.rank}, world_size={cfg.world_size}")
    if cfg.skip_batches < 0:
        raise ValueError(f"skip_batches must be >= 0, got {cfg.skip_batches}")
    if cfg.group_size < 1:
        raise ValueError(f"group_size (--train-group-size) must be >= 1 (1: shuffle single samples), "
                         f"got {cfg.group_size}")


def _resolve_type(dataset_type: str, data: str | None) -> str:
    """OpenCLIP's --dataset-type: "auto" means csv for .csv/.tsv data, webdataset for .tar data."""
    if dataset_type not in DATASET_TYPES:
        raise ValueError(f"dataset_type {dataset_type!r} is not supported; choose one of {DATASET_TYPES}")
    if dataset_type == "synthetic":
        return "synthetic"
    if data is None:
        raise ValueError("no data given: pass --train-data/--val-data shards or --dataset-type synthetic")
    if dataset_type != "auto":
        return dataset_type
    extension = data.split(".")[-1]
    if extension in ("csv", "tsv"):
        return "csv"
    if extension != "tar":
        raise ValueError(f"cannot infer the dataset type of {data!r} (expected shards ending in .tar or a "
                         ".csv/.tsv file); pass --dataset-type webdataset, csv or synthetic")
    return "webdataset"


def _train_urls(cfg: DataConfig) -> tuple[list[str], list[float] | None]:
    """Expanded training shards and per-shard weights, checked against the sources and readers."""
    factors = cfg.train_data_upsampling_factors
    if factors is not None:
        if not cfg.dataset_resampled:
            raise ValueError("train_data_upsampling_factors (--train-data-upsampling-factors) needs "
                             "dataset_resampled (--dataset-resampled), as in OpenCLIP")
        num_sources, num_factors = len(cfg.train_data.split("::")), len(factors.split("::"))
        if num_sources != num_factors:
            raise ValueError(f"{num_factors} upsampling factors for {num_sources} '::'-separated train_data sources")
    urls, weights = expand_urls(cfg.train_data, factors)
    check_shards(urls, "train_data (--train-data)")
    num_readers = max(1, cfg.workers) * cfg.world_size
    if not cfg.dataset_resampled and len(urls) < num_readers:
        raise ValueError(f"{len(urls)} shards cannot be split over world_size x workers = "
                         f"{cfg.world_size} x {max(1, cfg.workers)} readers: use fewer workers, more shards, "
                         "or dataset_resampled (--dataset-resampled)")
    return urls, weights


def _num_batches(num_samples: int, global_batch_size: int, num_readers: int) -> int:
    """Batches per rank and epoch: floor(num_samples / global batch), rounded down to a multiple of readers."""
    batches_per_reader = num_samples // global_batch_size // num_readers
    if batches_per_reader < 1:
        raise ValueError(f"{num_samples} samples per epoch do not fill one batch per reader: batch_size x "
                         f"world_size = {global_batch_size} samples per step, {num_readers} reader(s) per "
                         "rank; use more samples, a smaller batch or fewer workers")
    return batches_per_reader * num_readers


def _check_skip(skip_batches: int, num_batches: int) -> None:
    if skip_batches >= num_batches:
        raise ValueError(f"skip_batches={skip_batches} is not inside an epoch of {num_batches} batches")


def _loader_info(dataloader: DataLoader, shared_epoch: SharedEpoch, num_samples: int, num_batches: int) -> LoaderInfo:
    dataloader.num_samples = num_samples  # OpenCLIP's train loop reads these two attributes
    dataloader.num_batches = num_batches
    return LoaderInfo(dataloader=dataloader, shared_epoch=shared_epoch, num_samples=num_samples,
                      num_batches=num_batches)


def _stream_loader(stream: ShardStream, workers: int) -> DataLoader:
    """The stream yields whole batches; fresh workers each epoch (cheap with fork) see set_epoch."""
    return DataLoader(stream, batch_size=None, num_workers=workers, persistent_workers=False,
                      generator=_private_generator())


def _private_generator() -> torch.Generator:
    """For the DataLoader's per-epoch worker base seed, which it would otherwise draw from the
    global RNG: iterating the data must not move the trainer's random state (we seed our own)."""
    return torch.Generator().manual_seed(0)
