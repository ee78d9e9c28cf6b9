"""How many of a batch's negatives are siblings: measured on the real training batch stream.

Data written in families (e.g. the one-edit siblings of `training.synthetic_scenes.edits`) stores a family id in each
sample's json (`"family": 123`). A row's *siblings* are the other rows of its batch from the same
family: for a contrastive loss they are the hardest negatives (clone negatives). The shuffle
buffer scatters families unless the trainer keeps runs of consecutive samples together
(`--train-group-size`, docs/data.md); `measure_siblings` says what a configuration gives.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Iterable, Mapping

import torch
from open_clip_train.data import expand_urls

from training.trainer.data import DataConfig, SkipCounter, build_train_data, read_shard, sample_index_of


@dataclass(frozen=True)
class SiblingStats:
    """In-batch siblings of the rows of `num_batches` batches of `batch_size`."""

    batch_size: int
    group_size: int
    num_batches: int
    siblings_per_row: float
    """Mean over rows of the number of other rows in the batch from the same family."""
    sibling_fraction: float
    """siblings_per_row / (batch_size - 1): the fraction of a row's in-batch negatives that are siblings."""


def read_families(train_data: str, family_field: str = "family") -> dict[int, int]:
    """sample_index (as the training batches carry it) -> family id, from the shards' json members.

    Raises ValueError naming a sample whose json lacks `family_field`.
    """
    urls, _ = expand_urls(train_data)
    families = {}
    for url in urls:
        for sample in read_shard(url, SkipCounter()):
            meta = json.loads(sample.get("json", b"{}"))
            if family_field not in meta:
                raise ValueError(
                    f"sample {sample['__key__']} of {url} has no {family_field!r} in its json: name "
                    "the json field that holds the family id, or write the data in families "
                    "(python -m training.synthetic_scenes --family-size)"
                )
            families[sample_index_of(sample)] = meta[family_field]
    return families


def count_siblings(batches: Iterable[torch.Tensor], families: Mapping[int, int], group_size: int) -> SiblingStats:
    """SiblingStats of batches given as their `sample_index` tensors (all of one size)."""
    num_batches = sibling_pairs = rows = 0
    batch_size = 0
    for sample_index in batches:
        family = torch.tensor([families[index] for index in sample_index.tolist()])
        same = family[:, None] == family[None, :]
        sibling_pairs += int(same.sum()) - len(family)  # the diagonal is each row itself
        rows += len(family)
        batch_size = len(family)
        num_batches += 1
    if not num_batches:
        raise ValueError("no batches to count siblings in")
    per_row = sibling_pairs / rows
    return SiblingStats(
        batch_size=batch_size,
        group_size=group_size,
        num_batches=num_batches,
        siblings_per_row=per_row,
        sibling_fraction=per_row / max(1, batch_size - 1),
    )


def measure_siblings(cfg: DataConfig, *, epochs: int = 1, family_field: str = "family") -> SiblingStats:
    """In-batch siblings of the training stream `cfg` describes (its rank's batches, epochs 0..epochs-1).

    Runs the real loader (shard split, shuffle buffer, grouping by `cfg.group_size`) but skips the
    image transform and tokenizer. Each sample's family is read from `family_field` of its json.
    """
    families = read_families(cfg.train_data, family_field)
    info = build_train_data(replace(cfg, skip_batches=0), _no_transform, _no_tokenizer)

    def sample_indices():
        for epoch in range(epochs):
            info.set_epoch(epoch)
            for batch in info.dataloader:
                yield batch.sample_index

    return count_siblings(sample_indices(), families, cfg.group_size)


def _no_transform(image) -> torch.Tensor:
    return torch.empty(0)


def _no_tokenizer(texts) -> torch.Tensor:
    return torch.empty(len(texts), 0, dtype=torch.long)
