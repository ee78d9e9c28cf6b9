"""The data as discovery reads it: the trainer's readers and checks, one pass in order, in global batches.

The dataset's samples, in order (shards in the order given, samples in shard order; csv rows in file
order), are cut into global batches of `batch_size x world_size` consecutive samples, and rank r
takes slots [r b, (r + 1) b) of each. So a global batch holds the same samples whatever the number
of ranks, and a batch is identified by its number alone (`--continue` skips whole batches without
decoding them). A sample that fails the trainer's checks (`training.data.SKIP_REASONS`: missing or
empty caption, undecodable image, bad json, ...) is skipped and counted, leaving its batch one row
short; shard-level failures (unreadable or truncated tar, duplicate key) are counted once, by
rank 0. Every reader of every rank reads all shards, and decodes only its own slices: reading tar
bytes is cheap next to decoding and encoding.

Each DataLoader worker handles every `workers`-th batch from the starting one, so the loader yields
the batches in order; a rank whose slice of a batch is empty still yields it (the ranks run the
batch's collectives together).
"""
from __future__ import annotations

import io
import itertools
import json
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from open_clip_train.data import SharedEpoch, expand_urls
from PIL import Image
from torch.utils.data import DataLoader, get_worker_info

from ..data import (DataConfig, CsvStream, ShardStream, SkipCounter, get_data_source, read_csv_rows,
                    read_shard, resolve_dataset_type)
from ..data.samples import Candidate
from ..data.shards import check_shards, declared_dataset_size


@dataclass(frozen=True)
class SampleInfo:
    """What the report shows of a sample besides its image."""

    key: str                      # the tar member prefix (`__key__`), or a csv row's image path
    source: str                   # its shard, or the csv file
    caption: str
    family: Optional[int] = None  # the json's ground-truth family (the demo data's), if any
    family_edit: Optional[str] = None
    facts: Optional[Tuple[str, ...]] = None  # the json's "facts": what the caption says, each fact stated one way


@dataclass
class LocalBatch:
    """This rank's slice of one global batch, after the checks."""

    index: int                 # the global batch's number, from 0
    images: torch.Tensor       # rows x 3 x H x W, preprocessed
    texts: torch.Tensor        # rows x context, tokenized
    samples: List[SampleInfo]
    image_bytes: List[bytes]   # the encoded images, for the thumbnails of the pairs shown
    skip_counts: torch.Tensor  # per SKIP_REASONS, this slice's (and, on rank 0, the shards' events)
    raw_samples: int           # samples of the slice before the checks


@dataclass(frozen=True)
class _Checked:
    candidate: Candidate
    info: SampleInfo


class _GlobalBatches:
    """The in-order global batching shared by the tar and csv readers, mixed into their streams, which
    provide `_raw_samples(events)` (every sample of the dataset in order, before any check; shard-level
    skips counted in `events`) and `_checked(raw, counter)` (the trainer's checks of one sample)."""

    start_batch: int
    cfg: DataConfig

    def __iter__(self) -> Iterator[LocalBatch]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        events = SkipCounter()
        for index, raw in self._slices(self._raw_samples(events)):
            shard_events = events.take()
            if (index - self.start_batch) % num_workers == worker:
                yield self._batch(index, raw, shard_events if self.cfg.rank == 0 else torch.zeros_like(shard_events))

    def _slices(self, raw_samples: Iterator[object]) -> Iterator[Tuple[int, list]]:
        """(batch number, this rank's raw samples of it) for every global batch from `start_batch` on."""
        batch_size = self.cfg.batch_size
        global_size = batch_size * self.cfg.world_size
        first_slot = self.cfg.rank * batch_size
        current, mine, total = self.start_batch, [], 0
        for position, raw in enumerate(raw_samples):
            total = position + 1
            index, slot = divmod(position, global_size)
            if index < current:
                continue
            while index > current:
                yield current, mine
                current, mine = current + 1, []
            if first_slot <= slot < first_slot + batch_size:
                mine.append(raw)
        if current * global_size < total:
            yield current, mine

    def _batch(self, index: int, raw: Sequence[object], shard_events: torch.Tensor) -> LocalBatch:
        counter = SkipCounter()
        checked = [item for item in (self._checked(sample, counter) for sample in raw) if item is not None]
        info_of = {id(item.candidate): item.info for item in checked}
        images, texts, samples, image_bytes = [], [], [], []
        for image, candidate in self._decoded((item.candidate for item in checked), counter, bad_image_limit=None):
            try:
                images.append(self.preprocess(image))
            except Exception:  # a hostile image the transform cannot handle is a skip, not a crash (as in training)
                counter.add("bad_image")
                continue
            texts.append(candidate.text)
            samples.append(info_of[id(candidate)])
            image_bytes.append(candidate.image_bytes)
        image_tensor = torch.stack(images) if images else torch.empty(0)
        return LocalBatch(index, image_tensor, self.tokenizer(texts) if texts else torch.empty(0, dtype=torch.long),
                          samples, image_bytes, counter.take() + shard_events, len(raw))


class ShardBatches(_GlobalBatches, ShardStream):
    """Global batches of webdataset shards (img2dataset layout), read with the trainer's `read_shard`."""

    def __init__(self, *, urls: Sequence[str], cfg: DataConfig, preprocess: Callable, tokenizer: Callable,
                 start_batch: int):
        super().__init__(urls=tuple(urls), weights=None, cfg=cfg, preprocess=preprocess, tokenizer=tokenizer,
                         shared_epoch=SharedEpoch(0), start_epoch=0, batches_per_reader=None, shuffle_size=0)
        self.start_batch = start_batch

    def _raw_samples(self, events: SkipCounter) -> Iterator[dict]:
        return itertools.chain.from_iterable(read_shard(url, events) for url in self.urls)

    def _checked(self, raw: dict, counter: SkipCounter) -> Optional[_Checked]:
        candidate = self._check(raw, 0, counter, self.caption_keys, shard_run=(0, 0))
        if candidate is None:
            return None
        return _Checked(candidate, SampleInfo(raw["__key__"], raw["__url__"], candidate.text,
                                              *_ground_truth(raw.get("json"))))


class CsvBatches(_GlobalBatches, CsvStream):
    """Global batches of OpenCLIP csv data (`--dataset-type csv`), rows checked as the trainer checks them."""

    def __init__(self, *, path: str, cfg: DataConfig, preprocess: Callable, tokenizer: Callable, start_batch: int):
        rows = read_csv_rows(path, get_data_source("csv").options(cfg), "--data")
        super().__init__(rows=rows, cfg=cfg, preprocess=preprocess,
                         tokenizer=tokenizer, shared_epoch=SharedEpoch(0), start_epoch=0, batches_per_reader=None)
        self.path = path
        self.start_batch = start_batch

    def _raw_samples(self, events: SkipCounter) -> Iterator[int]:
        return iter(range(len(self.rows)))

    def _checked(self, raw: int, counter: SkipCounter) -> Optional[_Checked]:
        candidate = next(self._row_candidates((raw,), counter), None)
        if candidate is None:
            return None
        return _Checked(candidate, SampleInfo(self.rows[raw].image_path, self.path, candidate.text))


def _ground_truth(meta_bytes: Optional[bytes]) -> Tuple[Optional[int], Optional[str], Optional[Tuple[str, ...]]]:
    """The ground truth a sample's json may carry (synthetic_scenes writes it): its family and the edit from the
    family's base, and its caption's facts (equal facts: the captions say the same thing). The trainer's
    checks have already parsed the json, so it is valid here."""
    meta = json.loads(meta_bytes) if meta_bytes else None
    if not isinstance(meta, dict):
        return None, None, None
    facts = meta.get("facts")
    facts = tuple(facts) if isinstance(facts, list) and all(isinstance(fact, str) for fact in facts) else None
    if not isinstance(meta.get("family"), int):
        return None, None, facts
    return meta["family"], meta.get("family_edit"), facts


# ---------------------------------------------------------------------------------------------
# Building the loader, and the checks before any work


@dataclass
class DiscoveryData:
    loader: DataLoader
    num_samples: Optional[int]  # the dataset's size when known (sizes.json, or the csv's rows)


def build_discovery_data(data: str, cfg: DataConfig, preprocess: Callable, tokenizer: Callable,
                         start_batch: int) -> DiscoveryData:
    """The loader of this rank's slices of global batches `start_batch`, `start_batch` + 1, ... of `data`
    (shards or a csv file, `cfg.dataset_type` as the trainer resolves it)."""
    if resolve_dataset_type(cfg.dataset_type, data) == "csv":
        stream = CsvBatches(path=data, cfg=cfg, preprocess=preprocess, tokenizer=tokenizer, start_batch=start_batch)
        num_samples = len(stream.rows)
    else:
        urls = shard_urls(data)
        stream = ShardBatches(urls=urls, cfg=cfg, preprocess=preprocess, tokenizer=tokenizer, start_batch=start_batch)
        num_samples = declared_dataset_size(urls)
    # batch_size=None: the stream yields whole batches; fresh workers see the stream as built here.
    loader = DataLoader(stream, batch_size=None, num_workers=cfg.workers, persistent_workers=False)
    return DiscoveryData(loader, num_samples)


def shard_urls(data: str) -> List[str]:
    """The shards of `--data` (braces, `::` sources), checked as the trainer checks them."""
    urls, _ = expand_urls(data)
    check_shards(urls, "--data")
    return urls


def thumbnail_png(image_bytes: bytes, size: int) -> bytes:
    """A PNG of the image fitted in size x size (never enlarged)."""
    image = Image.open(io.BytesIO(image_bytes)).convert("RGB")
    image.thumbnail((size, size))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
