"""The stream each reader (a DataLoader worker, or the main process) runs: ShardStream.

It splits and shuffles the shards, shuffles samples in a buffer, skips what fails its checks and
assembles whole batches, every random choice seeded by (seed, epoch, rank, reader); see
docs/data.md for what that buys (exact mid-epoch resume, batches independent of the process).
"""

from __future__ import annotations

import functools
import itertools
import random
from typing import Callable, Iterator, Sequence

import torch
import webdataset
from open_clip_train.data import SharedEpoch
from PIL import Image
from torch.utils.data import IterableDataset, default_collate, get_worker_info

from .batch import Batch
from .config import DataConfig, DataError
from .samples import Candidate, SkipCounter, decode_image, describe_counts, family_tensor, seeded, stable_hash
from .shards import check_shard_sample, read_shard

_SHUFFLE_INITIAL = 1000  # OpenCLIP's _SAMPLE_SHUFFLE_INITIAL


class ShardStream(IterableDataset):
    """Yields whole batches; run by each DataLoader worker (or the main process with workers=0)."""

    def __init__(
        self,
        *,
        urls: tuple[str, ...],
        weights: tuple[float, ...] | None,
        cfg: DataConfig,
        preprocess: Callable,
        tokenizer: Callable,
        shared_epoch: SharedEpoch,
        start_epoch: int,
        batches_per_reader: int | None,
        shuffle_size: int,
    ) -> None:
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

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.batches_per_reader is None:
            yield from self._validation_batches(worker, num_workers)
        else:
            yield from self._training_batches(worker, num_workers)

    def _training_batches(self, worker: int, num_workers: int) -> Iterator[Batch]:
        epoch = self.shared_epoch.get_value()
        skip = self.cfg.skip_batches if epoch == self.start_epoch else 0
        reader = (worker + skip) % num_workers  # rotated so the resumed loader starts at batch `skip`
        reader_skip = len(range(reader, skip, num_workers))  # global batches g < skip with g % W == reader
        counter = SkipCounter()
        shuffled = self._training_candidates(epoch, reader, num_workers, counter)
        images = self._decoded(shuffled, counter, bad_image_limit=max(1000, 10 * self.shuffle_size))
        for local_batch in range(self.batches_per_reader):
            if local_batch < reader_skip:
                for _ in itertools.islice(images, self.cfg.batch_size):  # decoded, not transformed
                    pass
                counter.take()  # these skips were reported by the interrupted run
                continue
            batch_number = local_batch * num_workers + reader
            # Seed augmentation per batch of this rank's epoch; the RNGs are restored before yielding, so a
            # main-process reader (workers=0) never disturbs the trainer's random state.
            with seeded(stable_hash(self.cfg.seed, epoch, self.cfg.rank, batch_number, "augment")):
                batch = self._assemble(images, counter)
            yield batch

    def _validation_batches(self, worker: int, num_workers: int) -> Iterator[Batch]:
        counter = SkipCounter()
        images = self._decoded(self._validation_candidates(worker, num_workers, counter), counter, bad_image_limit=None)
        while (batch := self._assemble(images, counter)) is not None:
            yield batch

    def _validation_candidates(self, worker: int, num_workers: int, counter: SkipCounter) -> Iterator[Candidate]:
        """One pass over this worker's share of the val shards, in order."""
        shards = ((url, True) for url in self.urls[worker::num_workers])
        return self._candidates(shards, epoch=0, counter=counter, caption_keys=(self.val_caption_key,), give_up=None)

    def _training_candidates(
        self, epoch: int, reader: int, num_readers: int, counter: SkipCounter
    ) -> Iterator[Candidate]:
        """One reader's shuffled samples, forever.

        Resampled: shards drawn with replacement (weighted). Otherwise: this reader's share of the
        epoch's shard permutation, in passes; each pass's shuffle buffer drains before the next
        starts (like OpenCLIP's `with_epoch` repeating its pipeline), so a pass has no repeats.
        """
        cfg = self.cfg
        rng = random.Random(stable_hash(cfg.seed, epoch, cfg.rank, reader, "samples"))
        if cfg.dataset_resampled:
            checked = self._candidates(
                self._resampled_shards(epoch, reader),
                epoch=epoch,
                counter=counter,
                caption_keys=self.caption_keys,
                give_up=_reader_name(cfg, reader, self.urls),
            )
            yield from self._shuffled(checked, rng)
            return
        order = random.Random(stable_hash(cfg.seed, epoch, "shard order")).sample(self.urls, len(self.urls))
        mine = order[cfg.rank :: cfg.world_size][reader::num_readers]
        checked = functools.partial(
            self._candidates,
            epoch=epoch,
            counter=counter,
            caption_keys=self.caption_keys,
            give_up=_reader_name(cfg, reader, mine),
        )
        while True:
            one_pass = ((url, position == len(mine) - 1) for position, url in enumerate(mine))
            yield from self._shuffled(checked(one_pass), rng)

    def _shuffled(self, candidates: Iterator[Candidate], rng: random.Random) -> Iterator[Candidate]:
        """The sample shuffle buffer, over runs of `group_size` consecutive samples of a shard as units.

        With group_size 1 this is webdataset's public `shuffle` filter over single samples, draw for draw (the
        filter is its buffer shuffle applied to a stream, so the data order, and exact resume, are unchanged).
        """
        group_size = self.cfg.group_size
        runs = (list(run) for _, run in itertools.groupby(candidates, key=lambda candidate: candidate.shard_run))
        units = max(1, self.shuffle_size // group_size)
        initial = max(1, min(_SHUFFLE_INITIAL, self.shuffle_size) // group_size)
        for run in webdataset.shuffle(units, initial, rng=rng)(runs):
            yield from run

    def _resampled_shards(self, epoch: int, reader: int) -> Iterator[tuple[str, bool]]:
        """(url, every drawable shard has now been tried), drawn with replacement forever."""
        rng = random.Random(stable_hash(self.cfg.seed, epoch, self.cfg.rank, reader, "shards"))
        weights = self.weights or (1.0,) * len(self.urls)
        drawable = {url for url, weight in zip(self.urls, weights) if weight > 0}
        tried: set[str] = set()
        while True:
            url = rng.choices(self.urls, weights=weights)[0]
            tried.add(url)
            yield url, tried >= drawable

    def _candidates(
        self,
        shards: Iterator[tuple[str, bool]],
        *,
        epoch: int,
        counter: SkipCounter,
        caption_keys: tuple[str, ...],
        give_up: str | None,
    ) -> Iterator[Candidate]:
        """Samples that pass the checks needing no image decoding.

        give_up names this reader in the error raised when all of its shards have been tried
        (in this pass) without one usable sample (None: never raise, for single-pass validation).
        """
        found = False
        for visit, (url, all_tried) in enumerate(shards):
            for position, sample in enumerate(
                read_shard(url, counter, self.cfg.shard_timeout, self.cfg.max_member_bytes)
            ):
                candidate = self._check(
                    sample, epoch, counter, caption_keys, shard_run=(visit, position // self.cfg.group_size)
                )
                if candidate is not None:
                    found = True
                    yield candidate
            if give_up is not None and all_tried and not found:
                raise DataError(
                    f"{give_up}: none of its shards yielded a usable sample, so it cannot fill a batch "
                    f"(skips: {describe_counts(counter.counts)}). Check that these files are readable "
                    "img2dataset-style webdataset tars (<key>.jpg|png, <key>.txt, <key>.json)."
                )

    def _check(
        self,
        sample: dict,
        epoch: int,
        counter: SkipCounter,
        caption_keys: tuple[str, ...],
        *,
        shard_run: tuple[int, int],
    ) -> Candidate | None:
        """Cheap per-sample checks; returns None (and counts the reason) for a sample to skip."""
        reason, candidate = check_shard_sample(
            sample,
            caption_keys=caption_keys,
            family_field=self.cfg.family_field,
            seed=self.cfg.seed,
            epoch=epoch,
            shard_run=shard_run,
            max_image_bytes=self.cfg.max_image_bytes,
            max_caption_bytes=self.cfg.max_caption_bytes,
            sample_index_limit=self.cfg.sample_index_limit,
        )
        if reason is not None:
            counter.add(reason)
        return candidate

    def _decoded(
        self, candidates: Iterator[Candidate], counter: SkipCounter, *, bad_image_limit: int | None
    ) -> Iterator[tuple[Image.Image, Candidate]]:
        """Decode images, skipping bad or huge ones; raise after `bad_image_limit` failures in a row."""
        failures_in_a_row = 0
        for candidate in candidates:
            image, reason = decode_image(candidate.image_bytes, self.cfg.max_image_pixels)
            if reason is None:
                failures_in_a_row = 0
                yield image, candidate
                continue
            counter.add(reason)
            failures_in_a_row += 1
            if bad_image_limit is not None and failures_in_a_row >= bad_image_limit:
                raise DataError(
                    f"rank {self.cfg.rank}: {failures_in_a_row} images in a row could not be "
                    f"decoded ({describe_counts(counter.counts)}); are the shards' images corrupt?"
                )

    def _assemble(self, images: Iterator[tuple[Image.Image, Candidate]], counter: SkipCounter) -> Batch | None:
        """Transform and tokenize up to batch_size samples (fewer only when `images` runs out; None if empty),
        with the family ids when `cfg.family_field` is set.

        A transform that raises on an image skips it (bad_image) and the next sample takes its
        place, so training batches always have batch_size rows.
        """
        tensors, texts, indices, families = [], [], [], []
        while len(tensors) < self.cfg.batch_size:
            try:
                image, candidate = next(images)
            except StopIteration:
                break
            try:
                tensors.append(self.preprocess(image))
            except Exception:  # noqa: BLE001 - a hostile image the transform cannot handle is a skip, not a crash
                counter.add("bad_image")
                continue
            texts.append(candidate.text)
            indices.append(candidate.sample_index)
            families.append(candidate.family)
        if not tensors:
            return None
        # default_collate stacks straight into shared memory inside a DataLoader worker, so handing the
        # batch to the trainer does not copy the images a second time (torch.stack would).
        return Batch(
            default_collate(tensors),
            self.tokenizer(texts),
            torch.tensor(indices, dtype=torch.long),
            counter.take(),
            None if self.cfg.family_field is None else family_tensor(families),
        )


def _reader_name(cfg: DataConfig, reader: int, urls: Sequence[str]) -> str:
    """ "rank 0 reader 1 (shards: [...])" for error messages, listing at most 8 shards."""
    distinct = sorted(set(urls))
    more = f" and {len(distinct) - 8} more" if len(distinct) > 8 else ""
    return f"rank {cfg.rank} reader {reader} (shards: {distinct[:8]}{more})"
