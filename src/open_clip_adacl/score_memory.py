"""A memory of past clone scores per pair of training samples: persistence over steps (docs/clone_signals.md).

A clone pair scores high whenever it meets: the same two glyphs differ by the same mark at every step. A pair
that scores high by chance (a crowded row, features still moving) need not score high the next time it meets.
`PairScoreMemory` keeps, per ordered pair of sample ids (query, negative), an exponential moving average of the
pair's score over the steps where both samples were in one batch; `blend` reads what that average would be with
this step's scores included, `update` writes it. A pair met for the first time reads its current score.

Keyed by sample ids (the trainer's global sample index), not by batch position, so the memory follows a pair
wherever the two samples land. Exact across ranks: every rank updates its copy with the scores of every row of
the global batch (`clone_signals.persistence_update` gathers a rank's rows first), so every copy stays the same
and a rank's rows read what one process holding the whole batch reads. Memory: 12 bytes per pair ever met (an
int64 key and a float32 average); sorted keys, so a read is a binary search. Its buffers are checkpointed with
the loss that holds it, so a resumed run continues with the pairs it had met.
"""

from __future__ import annotations

import torch

from .row_passes import require

ID_BITS = 31  # a sample id must be below 2**31: the pair key packs two ids into one int64


def pair_keys(row_ids: torch.Tensor, col_ids: torch.Tensor) -> torch.Tensor:
    """rows x N int64 keys of the ordered pairs (row_ids[i], col_ids[j])."""
    row_ids, col_ids = row_ids.long(), col_ids.long()
    if row_ids.numel() and col_ids.numel():
        ids = torch.cat([row_ids.reshape(-1), col_ids.reshape(-1)])
        require(
            ((ids >= 0) & (ids < 2**ID_BITS)).all(), f"sample ids must lie in [0, 2**{ID_BITS}) to key the pair memory"
        )
    return (row_ids[:, None] << ID_BITS) | col_ids[None, :]


def moving_average(past: torch.Tensor, current: torch.Tensor, momentum: float) -> torch.Tensor:
    """(1 - momentum) past + momentum current: `momentum` is the weight of the newest score."""
    return past + momentum * (current - past)


class PairScoreMemory(torch.nn.Module):
    """Per ordered pair of sample ids, the moving average of its clone score over the steps it was met.

    Its two buffers (`keys`, sorted and unique, and `averages`) are its state: a loss that holds it as a
    submodule checkpoints it with its `state_dict()`, of whatever size it has grown to, and loading one resizes
    the buffers first. Every rank holds the same copy (see the module's docstring), so a checkpoint written on
    any number of ranks resumes on any other."""

    def __init__(self, momentum: float = 0.5):
        super().__init__()
        if not 0 < momentum <= 1:
            raise ValueError(f"momentum must be in (0, 1] (1: no memory), got {momentum}")
        self.momentum = momentum
        self.register_buffer("keys", torch.empty(0, dtype=torch.long))
        self.register_buffer("averages", torch.empty(0))

    def __len__(self) -> int:
        return self.keys.numel()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in ("keys", "averages"):
            saved = state_dict.get(prefix + name)
            if saved is not None:
                setattr(self, name, torch.empty(saved.shape, dtype=saved.dtype, device=getattr(self, name).device))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _find(self, keys: torch.Tensor):
        """(position in self.keys, found) of each key."""
        stored = self.keys.to(keys.device)
        position = torch.searchsorted(stored, keys).clamp(max=max(stored.numel() - 1, 0))
        found = stored[position] == keys if stored.numel() else torch.zeros_like(keys, dtype=torch.bool)
        return position, found

    def blend(self, row_ids: torch.Tensor, col_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """rows x N: each pair's average with this step's `scores` included (the score itself for a pair met for
        the first time); the memory is unchanged."""
        keys = pair_keys(row_ids, col_ids)
        position, found = self._find(keys.reshape(-1))
        past = self.averages.to(scores.device, scores.dtype)[position] if len(self) else scores.reshape(-1)
        blended = moving_average(past, scores.reshape(-1), self.momentum)
        return torch.where(found, blended, scores.reshape(-1)).reshape(scores.shape)

    def update(self, row_ids: torch.Tensor, col_ids: torch.Tensor, scores: torch.Tensor, keep: torch.Tensor) -> None:
        """Write `blend`'s averages of the pairs where `keep` (rows x N; a row's own pair is never kept). A pair
        listed twice in one step (a sample twice in a batch) keeps the mean of its blended scores."""
        device = self.keys.device
        keys = pair_keys(row_ids, col_ids)[keep]
        blended = self.blend(row_ids, col_ids, scores)[keep].float().to(device)
        keys, inverse = torch.unique(keys.to(device), return_inverse=True)
        sums = torch.zeros(keys.numel(), device=device).index_add_(0, inverse, blended)
        means = sums / torch.bincount(inverse, minlength=keys.numel()).float()
        position, found = self._find(keys)
        self.averages[position[found]] = means[found]
        merged_keys = torch.cat([self.keys, keys[~found]])
        order = torch.argsort(merged_keys)
        self.keys, self.averages = merged_keys[order], torch.cat([self.averages, means[~found]])[order]

    def clear(self) -> None:
        self.keys, self.averages = self.keys[:0], self.averages[:0]
