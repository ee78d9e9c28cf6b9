"""The data as discovery reads it: the data source's ordered pass (training.trainer.data.ordered), checked as training
checks it, in global batches.

The dataset's samples, in the source's order (shards in the order given, samples in shard order; csv
rows in file order), are cut into global batches of `batch_size x world_size` consecutive samples, and
rank r takes slots [r b, (r + 1) b) of each. So a global batch holds the same samples whatever the
number of ranks, and a batch is identified by its number alone (`--continue` skips whole batches without
decoding them). A sample that fails the trainer's checks (`training.trainer.data.SKIP_REASONS`: missing or empty
caption, undecodable image, bad json, ...) is skipped and counted, leaving its batch one row short;
failures of a whole file (unreadable or truncated tar, duplicate key) are counted once, by rank 0.
Every reader of every rank reads the whole pass, and decodes only its own slices: reading and checking
samples is cheap next to decoding and encoding them.

Each DataLoader worker handles every `workers`-th batch from the starting one, so the loader yields
the batches in order; a rank whose slice of a batch is empty still yields it (the ranks run the
batch's collectives together).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..trainer.data import DataConfig, SkipCounter, global_batch
from ..trainer.data.ordered import OrderedPass, PassItem, PassSample
from ..trainer.data.samples import decode_image


@dataclass(frozen=True)
class SampleInfo:
    """What the report shows of a sample besides its image."""

    key: str  # the tar member prefix (`__key__`), or a csv row's image path
    source: str  # its shard, or the csv file
    caption: str
    family: Optional[int] = None  # the json's ground-truth family (the demo data's), if any
    family_edit: Optional[str] = None
    facts: Optional[Tuple[str, ...]] = None  # the json's "facts": what the caption says, each fact stated one way


@dataclass
class LocalBatch:
    """This rank's slice of one global batch, after the checks."""

    index: int  # the global batch's number, from 0
    images: torch.Tensor  # rows x 3 x H x W, preprocessed
    texts: torch.Tensor  # rows x context, tokenized
    samples: List[SampleInfo]
    image_bytes: List[bytes]  # the encoded images, for the thumbnails of the pairs shown
    skip_counts: torch.Tensor  # per SKIP_REASONS, this slice's (and, on rank 0, the shards' events)
    raw_samples: int  # samples of the slice before the checks


class GlobalBatches(IterableDataset):
    """This rank's slices of global batches `start_batch`, `start_batch` + 1, ... of an ordered pass."""

    def __init__(
        self, ordered: OrderedPass, cfg: DataConfig, preprocess: Callable, tokenizer: Callable, start_batch: int
    ):
        super().__init__()
        self.ordered, self.cfg, self.preprocess, self.tokenizer = ordered, cfg, preprocess, tokenizer
        self.start_batch = start_batch

    def __iter__(self) -> Iterator[LocalBatch]:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        events = SkipCounter()
        for index, items in self._slices(self.ordered.items(events)):
            file_events = events.take().counts
            if (index - self.start_batch) % num_workers == worker:
                yield self._batch(index, items, file_events if self.cfg.rank == 0 else torch.zeros_like(file_events))

    def _slices(self, items: Iterator[PassItem]) -> Iterator[Tuple[int, List[PassItem]]]:
        """(batch number, this rank's items of it) for every global batch from `start_batch` on."""
        batch_size = self.cfg.batch_size
        global_size = global_batch(batch_size, self.cfg.world_size)
        first_slot = self.cfg.rank * batch_size
        current, mine, total = self.start_batch, [], 0
        for position, item in enumerate(items):
            total = position + 1
            index, slot = divmod(position, global_size)
            if index < current:
                continue
            while index > current:
                yield current, mine
                current, mine = current + 1, []
            if first_slot <= slot < first_slot + batch_size:
                mine.append(item)
        if current * global_size < total:
            yield current, mine

    def _batch(self, index: int, items: Sequence[PassItem], file_events: torch.Tensor) -> LocalBatch:
        counter = SkipCounter()
        images, texts, samples, image_bytes = [], [], [], []
        for item in items:
            if not isinstance(item, PassSample):
                counter.add(item)
                continue
            image, reason = decode_image(item.image_bytes, self.cfg.max_image_pixels)
            if reason is None:
                try:
                    images.append(self.preprocess(image))
                except Exception:  # noqa: BLE001 - a hostile image the transform cannot handle is a skip, not a crash
                    reason = "bad_image"
            if reason is not None:
                counter.add(reason)
                continue
            texts.append(item.text)
            samples.append(SampleInfo(item.key, item.source, item.text, *_ground_truth(item.meta)))
            image_bytes.append(item.image_bytes)
        image_tensor = torch.stack(images) if images else torch.empty(0)
        return LocalBatch(
            index,
            image_tensor,
            self.tokenizer(texts) if texts else torch.empty(0, dtype=torch.long),
            samples,
            image_bytes,
            counter.take().counts + file_events,
            len(items),
        )


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


def discovery_loader(
    ordered: OrderedPass, cfg: DataConfig, preprocess: Callable, tokenizer: Callable, start_batch: int
) -> DataLoader:
    """The loader of this rank's slices of global batches `start_batch`, `start_batch` + 1, ... of the pass."""
    # batch_size=None: the stream yields whole batches; fresh workers see the stream as built here.
    return DataLoader(
        GlobalBatches(ordered, cfg, preprocess, tokenizer, start_batch),
        batch_size=None,
        num_workers=cfg.workers,
        persistent_workers=False,
    )


def thumbnail_png(image_bytes: bytes, size: int) -> bytes:
    """A PNG of the image fitted in size x size (never enlarged)."""
    image = Image.open(io.BytesIO(image_bytes)).convert("RGB")
    image.thumbnail((size, size))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
