"""Webdataset (and csv) streaming for training and validation, with OpenCLIP's behaviour plus what it lacks.

Batches are tuples `(images, texts, sample_index, skip_counts)`:
  images        float B x 3 x H x W, through the model's open_clip preprocess transform
  texts         LongTensor B x context, through the open_clip tokenizer
  sample_index  LongTensor B, a stable global id per sample: the json "key" field when it is a
                non-negative integer (img2dataset writes "000012345"), else a 63-bit hash of the
                tar member prefix `__key__` (blake2b, the same in every process and run). A dense
                per-sample state bank needs the json keys; `::` sources whose keys overlap (two
                img2dataset runs both start at 0) share ids, so give each source its own key range.
  skip_counts   LongTensor [len(SKIP_REASONS)]: samples this worker skipped, per reason, since its
                previous batch (workers are separate processes; summing over batches gives totals).

What OpenCLIP (3.3.0, `open_clip_train.data.get_wds_dataset`) does and we keep: shards from
brace-expanded `::`-separated sources; `--dataset-resampled` draws shards with replacement,
weighted per shard by `--train-data-upsampling-factors` (a source's factor applies to each of
its shards, as in OpenCLIP); otherwise shards are shuffled per epoch and split over ranks and
workers; a sample shuffle buffer; `num_batches` per epoch and rank, a whole number per worker.
Differences, each deliberate:
  - Built on webdataset's `gopen` / `tar_file_iterator` / `base_plus_ext` (not OpenCLIP's tar
    pipeline, which fails on webdataset >= 0.2.96), grouping members into samples ourselves so
    duplicates, truncation and unreadable shards are seen and counted instead of logged.
  - Every random choice is seeded by (seed, epoch, rank, reader): shard order, shard draws,
    sample shuffle, caption field, and the augmentation of each batch (torch and Python RNG are
    seeded per global batch inside the worker and restored after), so a batch's content does
    not depend on the process it is built in, and iterating a loader never moves the caller's
    global random state (the DataLoader's own base seed comes from a private generator).
  - Epoch length rounds down (OpenCLIP rounds up by default and repeats a few samples).
  - Exact mid-epoch resume (`skip_batches`): the DataLoader takes batches round-robin from its
    workers, so global batch g comes from reader g % W. A resumed loader rotates readers so its
    worker 0 plays reader skip_batches % W, and each reader drops its share of the skipped
    batches. Skipped batches are read, checked and image-decoded (needed to know exactly which
    samples the uninterrupted run dropped) but neither transformed nor tokenized. Skip counts
    met while fast-forwarding are not reported again (the interrupted run reported them).
    The stream depends on data, seed, batch_size, workers, world_size, caption_key and group_size:
    a resume must use the same values (store them with the checkpoint's data position).
    Residual inexactness: an image that decodes but makes the preprocess transform raise is
    dropped only when transformed, so inside the skipped range it shifts later batches by one.
  - The sample shuffle buffer is OpenCLIP's 5000 (initial 1000) capped at half the mean shard
    size (OpenCLIP's 5000 is half an img2dataset shard of 10000), so small shards keep the same
    shard-local mixing. Each pass over a reader's shards drains its buffer before the next pass
    (like OpenCLIP's `with_epoch` restarting its pipeline), so a pass never repeats a sample.
  - With several `caption_key` fields ("txt,txt_alt") each sample picks one uniformly, by a hash
    of (seed, epoch, sample_index); validation uses the first, or `val_caption_key` (train on
    weak captions, validate on gold ones).
  - `group_size` K > 1 (not in OpenCLIP): the shuffle buffer holds runs of K consecutive samples
    of a shard (positions 0..K-1, K..2K-1, ... of each shard visit) and shuffles them as units,
    so data written in families of K (e.g. one-edit siblings, docs/data.md) reaches a batch as
    whole families. The buffer keeps its size in samples (shuffle size / K units).
  - Validation reads every val shard once on every rank (OpenCLIP evaluates on rank 0 only),
    split over workers, unshuffled, with a partial last batch.

OpenCLIP's csv data (`--dataset-type csv`: one csv/tsv file, `--csv-separator`, a header naming
the `--csv-img-key` image-path and `--csv-caption-key` caption columns) goes through the same
checks, decoding and batching (`CsvStream`): sample_index is the row number (0-based, after the
header); a row whose image file is missing or whose caption is empty or absent is skipped and
counted under the same reasons as a tar sample. An epoch is every row (OpenCLIP's len(dataset)),
in a seeded per-epoch permutation split over ranks and readers.

Corrupt input never stops the loader: see SKIP_REASONS. Where it cannot go on, it says so
instead of looping forever: a training reader that has tried all of its shards without one
usable sample, or meets max(1000, 10 x shuffle buffer) undecodable images in a row, raises a
DataError (a RuntimeError) naming its shards; building the data raises FileNotFoundError naming
missing local shards and DataError when no shard opens as a tar.
"""
from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import io
import itertools
import json
import logging
import math
import os
import random
import tarfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from open_clip_train.data import DataInfo, SharedEpoch, expand_urls
from PIL import Image
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, default_collate, get_worker_info
from webdataset.filters import _shuffle
from webdataset.gopen import gopen
from webdataset.tariterators import base_plus_ext, tar_file_iterator

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
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
DATASET_TYPES = ("webdataset", "csv", "synthetic", "auto")

_SHUFFLE_SIZE = 5000  # OpenCLIP's _SAMPLE_SHUFFLE_SIZE / _SAMPLE_SHUFFLE_INITIAL
_SHUFFLE_INITIAL = 1000
_SYNTHETIC_CAPTION = "Dummy caption"  # what OpenCLIP's SyntheticDataset uses

logger = logging.getLogger(__name__)


class DataError(RuntimeError):
    """The data cannot fill the epoch: every shard unreadable, or images that keep failing to decode."""


def data_error_reason(error: DataError) -> str:
    """The message a DataError was raised with, also when a DataLoader worker raised it (torch then
    re-raises it in the trainer with the worker's traceback prepended)."""
    text = str(error)
    if "Original Traceback" not in text:
        return text
    return text.rsplit(f"{DataError.__name__}: ", 1)[-1].strip()


@dataclass
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
    """"webdataset", "synthetic" or "auto" (webdataset when the data ends in .tar) (--dataset-type)."""
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
    dataset_size = _dataset_size(urls)
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
    _check_shards(urls, "val_data (--val-data)")
    num_samples = cfg.val_num_samples or _dataset_size(urls) or 0
    stream = ShardStream(
        urls=tuple(urls), weights=None, cfg=cfg, preprocess=preprocess, tokenizer=tokenizer,
        shared_epoch=SharedEpoch(0), start_epoch=0, batches_per_reader=None, shuffle_size=0,
    )
    return _loader_info(_stream_loader(stream, cfg.workers), stream.shared_epoch,
                        num_samples, math.ceil(num_samples / cfg.batch_size))


# ---------------------------------------------------------------------------------------------
# The stream each reader (DataLoader worker, or the main process) runs


class _SkipCounter:
    """Per-reason skip counts of one reader since its previous batch."""

    def __init__(self) -> None:
        self.counts = np.zeros(len(SKIP_REASONS), dtype=np.int64)

    def add(self, reason: str) -> None:
        self.counts[SKIP_REASONS.index(reason)] += 1

    def take(self) -> torch.Tensor:
        counts, self.counts = self.counts, np.zeros_like(self.counts)
        return torch.from_numpy(counts)


@dataclass(frozen=True)
class _Candidate:
    """A sample that passed the cheap checks; its image is still undecoded bytes."""

    sample_index: int
    text: str
    image_bytes: bytes
    shard_run: tuple[int, int]  # (shard visit, position in the shard // group_size): the shuffle's unit


class ShardStream(IterableDataset):
    """Yields whole batches; run by each DataLoader worker (or the main process with workers=0)."""

    def __init__(self, *, urls: tuple[str, ...], weights: tuple[float, ...] | None, cfg: DataConfig,
                 preprocess: Callable, tokenizer: Callable, shared_epoch: SharedEpoch, start_epoch: int,
                 batches_per_reader: int | None, shuffle_size: int) -> None:
        super().__init__()
        self.urls = urls
        self.weights = weights
        self.cfg = cfg
        self.preprocess = preprocess
        self.tokenizer = tokenizer
        self.shared_epoch = shared_epoch
        self.start_epoch = start_epoch
        self.batches_per_reader = batches_per_reader  # None: validation, one pass over the shards
        self.shuffle_size = shuffle_size
        self.caption_keys = tuple(key.strip() for key in cfg.caption_key.split(","))
        self.val_caption_key = (cfg.val_caption_key or self.caption_keys[0]).strip()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.batches_per_reader is None:
            yield from self._validation_batches(worker, num_workers)
        else:
            yield from self._training_batches(worker, num_workers)

    def _training_batches(self, worker: int, num_workers: int) -> Iterator[tuple[torch.Tensor, ...]]:
        epoch = self.shared_epoch.get_value()
        skip = self.cfg.skip_batches if epoch == self.start_epoch else 0
        reader = (worker + skip) % num_workers  # rotated so the resumed loader starts at batch `skip`
        reader_skip = len(range(reader, skip, num_workers))  # global batches g < skip with g % W == reader
        counter = _SkipCounter()
        shuffled = self._training_candidates(epoch, reader, num_workers, counter)
        images = self._decoded(shuffled, counter, bad_image_limit=max(1000, 10 * self.shuffle_size))
        for local_batch in range(self.batches_per_reader):
            if local_batch < reader_skip:
                for _ in itertools.islice(images, self.cfg.batch_size):  # decoded, not transformed
                    pass
                counter.take()  # these skips were reported by the interrupted run
                continue
            global_batch = local_batch * num_workers + reader
            # Seed augmentation per global batch; the RNGs are restored before yielding, so a
            # main-process reader (workers=0) never disturbs the trainer's random state.
            with _seeded(_stable_hash(self.cfg.seed, epoch, self.cfg.rank, global_batch, "augment")):
                batch = self._assemble(images, counter)
            yield batch

    def _validation_batches(self, worker: int, num_workers: int) -> Iterator[tuple[torch.Tensor, ...]]:
        counter = _SkipCounter()
        images = self._decoded(self._validation_candidates(worker, num_workers, counter), counter,
                               bad_image_limit=None)
        while (batch := self._assemble(images, counter)) is not None:
            yield batch

    def _validation_candidates(self, worker: int, num_workers: int, counter: _SkipCounter) -> Iterator[_Candidate]:
        """One pass over this worker's share of the val shards, in order."""
        shards = ((url, True) for url in self.urls[worker::num_workers])
        return self._candidates(shards, epoch=0, counter=counter, caption_keys=(self.val_caption_key,), give_up=None)

    def _training_candidates(self, epoch: int, reader: int, num_readers: int,
                             counter: _SkipCounter) -> Iterator[_Candidate]:
        """One reader's shuffled samples, forever.

        Resampled: shards drawn with replacement (weighted). Otherwise: this reader's share of the
        epoch's shard permutation, in passes; each pass's shuffle buffer drains before the next
        starts (like OpenCLIP's `with_epoch` repeating its pipeline), so a pass has no repeats.
        """
        cfg = self.cfg
        rng = random.Random(_stable_hash(cfg.seed, epoch, cfg.rank, reader, "samples"))
        if cfg.dataset_resampled:
            checked = self._candidates(self._resampled_shards(epoch, reader), epoch=epoch, counter=counter,
                                       caption_keys=self.caption_keys, give_up=_reader_name(cfg, reader, self.urls))
            yield from self._shuffled(checked, rng)
            return
        order = random.Random(_stable_hash(cfg.seed, epoch, "shard order")).sample(self.urls, len(self.urls))
        mine = order[cfg.rank::cfg.world_size][reader::num_readers]
        checked = functools.partial(self._candidates, epoch=epoch, counter=counter, caption_keys=self.caption_keys,
                                    give_up=_reader_name(cfg, reader, mine))
        while True:
            one_pass = ((url, position == len(mine) - 1) for position, url in enumerate(mine))
            yield from self._shuffled(checked(one_pass), rng)

    def _shuffled(self, candidates: Iterator[_Candidate], rng: random.Random) -> Iterator[_Candidate]:
        """The sample shuffle buffer, over runs of `group_size` consecutive samples of a shard as units.

        With group_size 1 this is webdataset's `_shuffle` over single samples, draw for draw.
        """
        group_size = self.cfg.group_size
        runs = (list(run) for _, run in itertools.groupby(candidates, key=lambda candidate: candidate.shard_run))
        units = max(1, self.shuffle_size // group_size)
        initial = max(1, min(_SHUFFLE_INITIAL, self.shuffle_size) // group_size)
        for run in _shuffle(runs, units, initial, rng):
            yield from run

    def _resampled_shards(self, epoch: int, reader: int) -> Iterator[tuple[str, bool]]:
        """(url, every drawable shard has now been tried), drawn with replacement forever."""
        rng = random.Random(_stable_hash(self.cfg.seed, epoch, self.cfg.rank, reader, "shards"))
        weights = self.weights or (1.0,) * len(self.urls)
        drawable = {url for url, weight in zip(self.urls, weights) if weight > 0}
        tried: set[str] = set()
        while True:
            url = rng.choices(self.urls, weights=weights)[0]
            tried.add(url)
            yield url, tried >= drawable

    def _candidates(self, shards: Iterator[tuple[str, bool]], *, epoch: int, counter: _SkipCounter,
                    caption_keys: tuple[str, ...], give_up: str | None) -> Iterator[_Candidate]:
        """Samples that pass the checks needing no image decoding.

        give_up names this reader in the error raised when all of its shards have been tried
        (in this pass) without one usable sample (None: never raise, for single-pass validation).
        """
        found = False
        for visit, (url, all_tried) in enumerate(shards):
            for position, sample in enumerate(_read_shard(url, counter)):
                candidate = self._check(sample, epoch, counter, caption_keys,
                                        shard_run=(visit, position // self.cfg.group_size))
                if candidate is not None:
                    found = True
                    yield candidate
            if give_up is not None and all_tried and not found:
                raise DataError(
                    f"{give_up}: none of its shards yielded a usable sample, so it cannot fill a batch "
                    f"(skips: {_describe(counter.counts)}). Check that these files are readable "
                    "img2dataset-style webdataset tars (<key>.jpg|png, <key>.txt, <key>.json).")

    def _check(self, sample: dict, epoch: int, counter: _SkipCounter, caption_keys: tuple[str, ...], *,
               shard_run: tuple[int, int]) -> _Candidate | None:
        """Cheap per-sample checks; returns None (and counts the reason) for a sample to skip."""
        image_key = next((ext for ext in IMAGE_EXTENSIONS if ext in sample), None)
        if image_key is None:
            counter.add("missing_image")
            return None
        try:
            sample_index = _sample_index(sample)
        except ValueError:
            counter.add("bad_json")
            return None
        field = caption_keys[0]
        if len(caption_keys) > 1:
            field = caption_keys[_stable_hash(self.cfg.seed, epoch, sample_index, "caption") % len(caption_keys)]
        reason, text = _caption(sample.get(field))
        if reason is not None:
            counter.add(reason)
            return None
        return _Candidate(sample_index, text, sample[image_key], shard_run)

    def _decoded(self, candidates: Iterator[_Candidate], counter: _SkipCounter, *,
                 bad_image_limit: int | None) -> Iterator[tuple[Image.Image, _Candidate]]:
        """Decode images, skipping bad or huge ones; raise after `bad_image_limit` failures in a row."""
        failures_in_a_row = 0
        for candidate in candidates:
            image, reason = _decode_image(candidate.image_bytes, self.cfg.max_image_pixels)
            if reason is None:
                failures_in_a_row = 0
                yield image, candidate
                continue
            counter.add(reason)
            failures_in_a_row += 1
            if bad_image_limit is not None and failures_in_a_row >= bad_image_limit:
                raise DataError(f"rank {self.cfg.rank}: {failures_in_a_row} images in a row could not be "
                                f"decoded ({_describe(counter.counts)}); are the shards' images corrupt?")

    def _assemble(self, images: Iterator[tuple[Image.Image, _Candidate]],
                  counter: _SkipCounter) -> tuple[torch.Tensor, ...] | None:
        """Transform and tokenize up to batch_size samples (fewer only when `images` runs out; None if empty).

        A transform that raises on an image skips it (bad_image) and the next sample takes its
        place, so training batches always have batch_size rows.
        """
        tensors, texts, indices = [], [], []
        while len(tensors) < self.cfg.batch_size:
            try:
                image, candidate = next(images)
            except StopIteration:
                break
            try:
                tensors.append(self.preprocess(image))
            except Exception:  # a hostile image the transform cannot handle is a skip, not a crash
                counter.add("bad_image")
                continue
            texts.append(candidate.text)
            indices.append(candidate.sample_index)
        if not tensors:
            return None
        # default_collate stacks straight into shared memory inside a DataLoader worker, so handing the
        # batch to the trainer does not copy the images a second time (torch.stack would).
        return (default_collate(tensors), self.tokenizer(texts), torch.tensor(indices, dtype=torch.long),
                counter.take())


@dataclass(frozen=True)
class CsvRow:
    """One data row of a csv file: image path and caption (None where the row lacks the column)."""

    image_path: str | None
    caption: str | None


def read_csv_rows(path: str | None, cfg: DataConfig, flag: str) -> tuple[CsvRow, ...]:
    """The rows of OpenCLIP's csv data (a header naming --csv-img-key and --csv-caption-key columns).

    Row k (0-based, after the header) is sample k: its sample_index. A row with too few fields keeps
    its place and is skipped when read (missing_image / missing_caption), like a bad tar sample.
    """
    if path is None or not os.path.isfile(path):
        raise FileNotFoundError(f"{flag}: {path} does not exist; --dataset-type csv reads one csv/tsv file")
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter=cfg.csv_separator)
        header = next(reader, [])
        missing = [f"{column!r} ({option})" for column, option in ((cfg.csv_img_key, "--csv-img-key"),
                                                                   (cfg.csv_caption_key, "--csv-caption-key"))
                   if column not in header]
        if missing:
            raise ValueError(f"{flag}: {path} has no column {' or '.join(missing)}; its header is {header} "
                             f"with --csv-separator {cfg.csv_separator!r}; pass the flags naming its columns")
        image_column, caption_column = header.index(cfg.csv_img_key), header.index(cfg.csv_caption_key)
        rows = tuple(CsvRow(row[image_column] if len(row) > image_column else None,
                            row[caption_column] if len(row) > caption_column else None) for row in reader)
    if not rows:
        raise ValueError(f"{flag}: {path} has a header but no rows")
    return rows


class CsvStream(ShardStream):
    """ShardStream's batches from csv rows: image files read by path, the caption from its column.

    Training: each epoch a seeded permutation of the rows, split over ranks and readers (passes
    repeat it should bad rows leave a reader short). Validation: the rows in order.
    """

    def __init__(self, *, rows: tuple[CsvRow, ...], cfg: DataConfig, preprocess: Callable, tokenizer: Callable,
                 shared_epoch: SharedEpoch, start_epoch: int, batches_per_reader: int | None) -> None:
        super().__init__(urls=(), weights=None, cfg=cfg, preprocess=preprocess, tokenizer=tokenizer,
                         shared_epoch=shared_epoch, start_epoch=start_epoch, batches_per_reader=batches_per_reader,
                         shuffle_size=0)
        self.rows = rows

    def _validation_candidates(self, worker: int, num_workers: int, counter: _SkipCounter) -> Iterator[_Candidate]:
        return self._row_candidates(range(worker, len(self.rows), num_workers), counter)

    def _training_candidates(self, epoch: int, reader: int, num_readers: int,
                             counter: _SkipCounter) -> Iterator[_Candidate]:
        order = random.Random(_stable_hash(self.cfg.seed, epoch, "row order")).sample(range(len(self.rows)),
                                                                                      len(self.rows))
        mine = order[self.cfg.rank::self.cfg.world_size][reader::num_readers]
        while True:
            found = False
            for candidate in self._row_candidates(mine, counter):
                found = True
                yield candidate
            if not found:
                raise DataError(f"rank {self.cfg.rank} reader {reader}: none of its {len(mine)} csv rows yielded "
                                f"a usable sample (skips: {_describe(counter.counts)}); check the image paths")

    def _row_candidates(self, indices: Iterable[int], counter: _SkipCounter) -> Iterator[_Candidate]:
        for index in indices:
            row = self.rows[index]
            reason, text = _caption(None if row.caption is None else row.caption.encode("utf-8"))
            if not row.image_path:
                reason = "missing_image"
            if reason is not None:
                counter.add(reason)
                continue
            try:
                image_bytes = Path(row.image_path).read_bytes()
            except OSError:  # missing, unreadable or a directory
                counter.add("missing_image")
                continue
            yield _Candidate(index, text, image_bytes, shard_run=(0, index))  # rows are permuted, never buffer-shuffled


def _read_shard(url: str, counter: _SkipCounter) -> Iterator[dict]:
    """The samples of one shard visit: {"__key__", "__url__", ext: bytes}; duplicates skipped.

    Members are grouped by key prefix (webdataset's `base_plus_ext`); a key seen before in this
    shard, adjacent or not, makes the whole later sample a duplicate. A failure while opening
    counts `unreadable_shard`, a tar format error or truncation `bad_tar`; either ends the
    visit after the samples read so far.
    """
    try:
        stream = gopen(url)
    except Exception as error:  # missing, permission, directory, failing pipe: never fatal mid-run
        counter.add("unreadable_shard")
        _warn_once(url, f"skipping unreadable shard {url}: {error!r}")
        return
    seen: set[str] = set()
    errors: list[Exception] = []

    def stop_shard(error: Exception) -> bool:  # a member-level error: the rest of the stream is suspect
        errors.append(error)
        return False

    def emit(sample: dict | None) -> Iterator[dict]:
        if sample is None:
            return
        if sample["__key__"] in seen:
            counter.add("duplicate_key")
            return
        seen.add(sample["__key__"])
        yield sample

    current = None
    try:
        for member in tar_file_iterator(stream, handler=stop_shard):
            prefix, suffix = base_plus_ext(member["fname"])
            if prefix is None:
                continue
            suffix = suffix.lower()
            if current is None or prefix != current["__key__"] or suffix in current:
                yield from emit(current)
                current = {"__key__": prefix, "__url__": url}
            current[suffix] = member["data"]
    except Exception as error:  # tarfile raises ReadError / EOFError / OSError on corrupt streams
        errors.append(error)
    finally:
        stream.close()
    yield from emit(current)
    if errors:
        reason = "unreadable_shard" if isinstance(errors[0], OSError) else "bad_tar"
        counter.add(reason)
        _warn_once(url, f"shard {url} ended early ({reason}): {errors[0]!r}")


_warned_shards: set[str] = set()  # per process: a resampled bad shard would otherwise warn at every draw


def _warn_once(url: str, message: str) -> None:
    if url not in _warned_shards:
        _warned_shards.add(url)
        logger.warning(message)


def _sample_index(sample: dict) -> int:
    """The json "key" when it is a non-negative integer, else a 63-bit hash of `__key__`.

    Raises ValueError when a json member is present but does not parse.
    """
    if "json" in sample:
        meta = json.loads(sample["json"])  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        key = meta.get("key") if isinstance(meta, dict) else None
        if isinstance(key, str) and key.isascii() and key.isdigit():
            key = int(key)
        if isinstance(key, int) and not isinstance(key, bool) and 0 <= key < 2**63:  # fits a LongTensor
            return key
    return _stable_hash(sample["__key__"]) >> 1


def _caption(data: bytes | None) -> tuple[str | None, str]:
    """(skip reason or None, stripped caption)."""
    if data is None:
        return "missing_caption", ""
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        return "non_utf8_caption", ""
    return (None, text) if text else ("empty_caption", "")


def _decode_image(data: bytes, max_pixels: int) -> tuple[Image.Image | None, str | None]:
    """(RGB image, None) or (None, skip reason); the size check reads only the header."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            if image.width * image.height > max_pixels:
                return None, "huge_image"
            return image.convert("RGB"), None
    except Image.DecompressionBombError:
        return None, "huge_image"
    except Exception:  # PIL raises many types (OSError, SyntaxError, ValueError, ...) on bad bytes
        return None, "bad_image"


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed torch's CPU RNG and Python's `random` for the block, then restore both."""
    python_state = random.getstate()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        try:
            yield
        finally:
            random.setstate(python_state)


def _stable_hash(*parts: object) -> int:
    """A 64-bit hash of the parts' reprs, identical in every process (unlike `hash`)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _reader_name(cfg: DataConfig, reader: int, urls: Sequence[str]) -> str:
    """"rank 0 reader 1 (shards: [...])" for error messages, listing at most 8 shards."""
    distinct = sorted(set(urls))
    more = f" and {len(distinct) - 8} more" if len(distinct) > 8 else ""
    return f"rank {cfg.rank} reader {reader} (shards: {distinct[:8]}{more})"


def _describe(counts: np.ndarray) -> str:
    return ", ".join(f"{reason}={int(n)}" for reason, n in zip(SKIP_REASONS, counts) if n) or "none"


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
    _check_shards(urls, "train_data (--train-data)")
    num_readers = max(1, cfg.workers) * cfg.world_size
    if not cfg.dataset_resampled and len(urls) < num_readers:
        raise ValueError(f"{len(urls)} shards cannot be split over world_size x workers = "
                         f"{cfg.world_size} x {max(1, cfg.workers)} readers: use fewer workers, more shards, "
                         "or dataset_resampled (--dataset-resampled)")
    return urls, weights


def _is_local(url: str) -> bool:
    return "://" not in url and not url.startswith("pipe:")


def _check_shards(urls: Sequence[str], flag: str) -> None:
    """Missing local shards are an error naming them; so is having no readable shard at all."""
    if not urls:
        raise ValueError(f"{flag} expands to no shards")
    missing = [url for url in urls if _is_local(url) and not os.path.exists(url)]
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} of the {len(urls)} shards given by {flag} do not exist, e.g. {missing[:3]}. "
            "Check the path and the brace range (e.g. 'dir/shard-{000000..000007}.tar').")
    local = [url for url in urls if _is_local(url)]
    if local and len(local) == len(urls) and not any(_opens_as_tar(url) for url in local):
        raise DataError(f"none of the {len(urls)} shards given by {flag} can be read as a tar "
                        f"(e.g. {local[:3]}); check the files and their permissions.")


def _opens_as_tar(path: str) -> bool:
    """Whether the file opens as a (possibly compressed) tar with a first member; reads one header."""
    try:
        with open(path, "rb") as file, tarfile.open(fileobj=file, mode="r|*") as tar:
            return tar.next() is not None
    except Exception:  # any failure means "not readable as a shard"
        return False


def _dataset_size(urls: Sequence[str]) -> int | None:
    """Sum of the shards' entries in their directories' sizes.json; None if any is unknown."""
    sizes_by_dir: dict[str, dict] = {}
    total = 0
    for url in urls:
        directory, name = os.path.split(url)
        if directory not in sizes_by_dir:
            sizes_file = Path(directory) / "sizes.json"
            sizes_by_dir[directory] = json.loads(sizes_file.read_text()) if sizes_file.is_file() else {}
        if name not in sizes_by_dir[directory]:
            return None
        total += int(sizes_by_dir[directory][name])
    return total


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


# ---------------------------------------------------------------------------------------------
# Synthetic data (OpenCLIP's --dataset-type synthetic), same batch format


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
        with _seeded(_stable_hash(self.seed, index, "augment")):
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


def _transform_size(preprocess: Callable) -> tuple[int, int]:
    """(height, width) the transform's first step produces, as OpenCLIP's synthetic data reads it."""
    size = getattr(getattr(preprocess, "transforms", [None])[0], "size", 224)
    return (size, size) if isinstance(size, int) else tuple(size)
