"""Building the loaders: `build_train_data` and `build_val_data` check the configuration and ask the
data source `--dataset-type` names (`registry`) for its loader; the helpers below are what sources
build their loaders with."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from open_clip_train.data import SharedEpoch
from torch.utils.data import DataLoader, Dataset, Sampler

from .batch import Batch
from .config import DataConfig, global_batch
from .registry import resolve_dataset_type
from .samples import NO_FAMILY, no_skips
from .source import LoaderInfo, get_data_source
from .stream import ShardStream


def build_train_data(cfg: DataConfig, preprocess: Callable, tokenizer: Callable, epoch: int = 0) -> LoaderInfo:
    """The training loader, positioned at `epoch` (and `cfg.skip_batches` into it).

    Call `info.set_epoch(e)` before iterating epoch e; `skip_batches` applies to `epoch` only.
    """
    _check_common(cfg)
    source = get_data_source(resolve_dataset_type(cfg.dataset_type, cfg.train_data))
    return source.train_data(cfg, preprocess, tokenizer, epoch)


def build_val_data(cfg: DataConfig, preprocess: Callable, tokenizer: Callable) -> LoaderInfo | None:
    """The validation loader over `cfg.val_data` (None when there is none); one unshuffled pass."""
    if cfg.val_data is None:
        return None
    _check_common(cfg)
    return get_data_source(resolve_dataset_type(cfg.dataset_type, cfg.val_data)).val_data(cfg, preprocess, tokenizer)


def check_data_fields(cfg: DataConfig) -> None:
    """The training (and validation) data's first samples carry the fields the run reads (`DataSource.check_fields`)."""
    get_data_source(resolve_dataset_type(cfg.dataset_type, cfg.train_data)).check_fields(cfg)


def _check_common(cfg: DataConfig) -> None:
    if cfg.batch_size < 1 or cfg.workers < 0 or cfg.world_size < 1 or not 0 <= cfg.rank < cfg.world_size:
        raise ValueError(
            f"invalid batch_size={cfg.batch_size}, workers={cfg.workers}, rank={cfg.rank}, world_size={cfg.world_size}"
        )
    if cfg.skip_batches < 0:
        raise ValueError(f"skip_batches must be >= 0, got {cfg.skip_batches}")
    if cfg.group_size < 1:
        raise ValueError(
            f"group_size (--train-group-size) must be >= 1 (1: shuffle single samples), got {cfg.group_size}"
        )


# ---------------------------------------------------------------------------------------------
# For data sources: epoch sizes, and loaders over a stream of batches or a map-style dataset


def batches_per_epoch(num_samples: int, cfg: DataConfig, num_readers: int) -> int:
    """Batches per rank and epoch: floor(num_samples / global batch), rounded down to a multiple of readers."""
    samples_per_batch = global_batch(cfg.batch_size, cfg.world_size)
    batches_per_reader = num_samples // samples_per_batch // num_readers
    if batches_per_reader < 1:
        raise ValueError(
            f"{num_samples} samples per epoch do not fill one batch per reader: batch_size x "
            f"world_size = {samples_per_batch} samples per global batch, {num_readers} reader(s) per "
            "rank; use more samples, a smaller batch or fewer workers"
        )
    return batches_per_reader * num_readers


def check_skip(skip_batches: int, num_batches: int) -> None:
    if skip_batches >= num_batches:
        raise ValueError(f"skip_batches={skip_batches} is not inside an epoch of {num_batches} batches")


def validation_batches(num_samples: int, batch_size: int) -> int:
    """Validation keeps a partial last batch."""
    return math.ceil(num_samples / batch_size)


def stream_data(stream: ShardStream, workers: int, num_samples: int, num_batches: int) -> LoaderInfo:
    """The loader of a ShardStream (which yields whole batches); fresh workers each epoch (cheap with
    fork) see set_epoch."""
    dataloader = DataLoader(
        stream, batch_size=None, num_workers=workers, persistent_workers=False, generator=_private_generator()
    )
    return _loader_info(dataloader, stream.shared_epoch, num_samples, num_batches)


def indexed_data(
    dataset: Dataset, cfg: DataConfig, tokenizer: Callable, epoch: int, *, train: bool, source: str
) -> LoaderInfo:
    """The loader of a map-style dataset whose item i is (preprocessed image tensor, caption, sample index).

    Training: each epoch a permutation of the items seeded by (seed, epoch), split over ranks,
    len(dataset) // global batch full batches per rank; validation: the items in order, with a
    partial last batch. Seed any augmentation inside the dataset by index (`samples.seeded`), so
    that a batch does not depend on the worker process that builds it.
    """
    num_samples = len(dataset)
    if train:
        if cfg.group_size != 1:
            raise ValueError(
                f"group_size (--train-group-size) groups consecutive samples of webdataset shards; "
                f"{source} data has none: leave it at 1"
            )
        num_batches = num_samples // global_batch(cfg.batch_size, cfg.world_size)
        if num_batches < 1:
            raise ValueError(
                f"{num_samples} {source} samples do not fill one batch of {cfg.batch_size} x {cfg.world_size} ranks"
            )
        check_skip(cfg.skip_batches, num_batches)
    else:
        num_batches = validation_batches(num_samples, cfg.batch_size)
    batches = _PermutedBatches(num_samples, cfg, num_batches, SharedEpoch(epoch), epoch, shuffle=train)

    def collate(items: list[tuple[torch.Tensor, str, int]]) -> Batch:
        images, texts, indices = zip(*items)
        return Batch(
            torch.stack(images),
            tokenizer(list(texts)),
            torch.tensor(indices, dtype=torch.long),
            no_skips(),
            # Samples of a map-style dataset carry no json, so none has a family.
            None if cfg.family_field is None else torch.full((len(items),), NO_FAMILY),
        )

    dataloader = DataLoader(
        dataset,
        batch_sampler=batches,
        collate_fn=collate,
        num_workers=cfg.workers,
        persistent_workers=False,
        generator=_private_generator(),
    )
    return _loader_info(
        dataloader, batches.shared_epoch, num_batches * cfg.batch_size if train else num_samples, num_batches
    )


@dataclass
class _PermutedBatches(Sampler):
    """Per-rank batches of a seeded per-epoch permutation, skipping `skip_batches` at the start epoch."""

    num_samples: int
    cfg: DataConfig
    num_batches: int
    shared_epoch: SharedEpoch
    start_epoch: int
    shuffle: bool

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.shared_epoch.get_value()
        order = torch.arange(self.num_samples)
        if self.shuffle:
            order = torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.cfg.seed + epoch))
        mine = order[self.cfg.rank :: self.cfg.world_size].tolist()
        for batch in range(self._skip(epoch), self.num_batches):
            yield mine[batch * self.cfg.batch_size : (batch + 1) * self.cfg.batch_size]

    def __len__(self) -> int:
        return self.num_batches - self._skip(self.shared_epoch.get_value())

    def _skip(self, epoch: int) -> int:
        return self.cfg.skip_batches if self.shuffle and epoch == self.start_epoch else 0


def _loader_info(dataloader: DataLoader, shared_epoch: SharedEpoch, num_samples: int, num_batches: int) -> LoaderInfo:
    dataloader.num_samples = num_samples  # OpenCLIP's train loop reads these two attributes
    dataloader.num_batches = num_batches
    return LoaderInfo(
        dataloader=dataloader, shared_epoch=shared_epoch, num_samples=num_samples, num_batches=num_batches
    )


def _private_generator() -> torch.Generator:
    """For the DataLoader's per-epoch worker base seed, which it would otherwise draw from the
    global RNG: iterating the data must not move the trainer's random state (we seed our own)."""
    return torch.Generator().manual_seed(0)
