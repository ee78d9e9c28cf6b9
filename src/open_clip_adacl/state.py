"""Per-sample state indexed by the global sample index (GloFND's thresholds and their Adam moments).

The bank is a `data_size x num_fields` float buffer of a loss, so `loss.state_dict()` checkpoints it
and `loss.to(device)` moves it; it also follows the device of the indices it is given. Under DDP
every rank holds a full replica: the loss reads and writes the rows of the *global* batch
(`GlobalBatch.sample_index` is gathered, O(global batch) bytes), and every rank applies the same
update, so the replicas stay identical without ever communicating the bank itself.

Duplicate indices in one `update` (a sample drawn twice into one global batch): the value given at
the *last* position wins, deterministically on every device (CUDA's plain `index_put_` leaves the
winner unspecified). `gather` returns the stored row for every occurrence.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from . import row_passes


class SampleStateBank(nn.Module):
    """Float state per sample, one column per named field, for sample indices in [0, data_size)."""

    def __init__(self, data_size: int, fields: Sequence[str], initial: Optional[Mapping[str, float]] = None):
        super().__init__()
        if data_size <= 0:
            raise ValueError(f"data_size must be positive (the number of training samples), got {data_size}")
        if not fields or len(set(fields)) != len(fields):
            raise ValueError(f"fields must be non-empty and unique, got {tuple(fields)}")
        initial = dict(initial or {})
        unknown = sorted(set(initial) - set(fields))
        if unknown:
            raise ValueError(f"initial values for unknown fields {unknown}; the fields are {tuple(fields)}")
        self.data_size = data_size
        self.fields: Tuple[str, ...] = tuple(fields)
        self.initial = tuple(float(initial.get(name, 0.0)) for name in self.fields)
        self.register_buffer("state", torch.empty(data_size, len(self.fields)))
        self.reset()

    def reset(self) -> None:
        """Every sample back to the initial values (e.g. to start the state afresh on resume)."""
        with torch.no_grad():
            self.state.copy_(torch.tensor(self.initial).expand_as(self.state))

    def check_index(self, index: torch.Tensor) -> None:
        """Raise a ValueError naming the first sample index outside [0, data_size)."""
        if index.dtype.is_floating_point or index.dtype == torch.bool:
            raise TypeError(f"sample indices must be integers, got {index.dtype}")
        outside = (index < 0) | (index >= self.data_size)
        if not row_passes.reading_back_is_free(index.device):  # the device checks it, with no host wait
            row_passes.require(
                ~outside.any(),
                f"a sample index is outside the per-sample state bank of data_size={self.data_size}; set "
                f"--data-size (data_size) to at least the largest sample index + 1, i.e. the training set size",
            )
            return
        if bool(outside.any()):
            raise ValueError(
                f"sample index {int(index[outside][0])} is outside the per-sample state bank of data_size="
                f"{self.data_size} (indices seen: min {int(index.min())}, max {int(index.max())}); set "
                f"--data-size (data_size) to at least the largest sample index + 1, i.e. the training set size"
            )

    def gather(self, index: torch.Tensor) -> Dict[str, torch.Tensor]:
        """The state of samples `index` (shape B), as `{field: tensor of shape B}`."""
        rows = self.state[self._prepare(index)]
        return {name: rows[:, column] for column, name in enumerate(self.fields)}

    def field(self, name: str) -> torch.Tensor:
        """Field `name` of every sample (shape data_size), a view of the bank."""
        return self.state[:, self.fields.index(name)]

    @torch.no_grad()
    def update(self, index: torch.Tensor, values: Mapping[str, torch.Tensor]) -> None:
        """Write `values[field]` (shape B each) for samples `index` (shape B); fields not given keep theirs."""
        unknown = sorted(set(values) - set(self.fields))
        if unknown:
            raise ValueError(f"unknown fields {unknown}; the fields are {self.fields}")
        index = self._prepare(index)
        columns = torch.tensor([self.fields.index(name) for name in values], device=index.device)
        new_rows = torch.stack([values[name].to(self.state) for name in values], dim=1)
        sorted_index, winner = last_occurrence(index)
        # Every duplicate of an index writes the same (winning) row, so the write order cannot matter.
        self.state[sorted_index[:, None], columns[None, :]] = new_rows[winner]

    def _prepare(self, index: torch.Tensor) -> torch.Tensor:
        self.check_index(index)
        if self.state.device != index.device:
            self.state = self.state.to(index.device)
        return index.long()


def last_occurrence(index: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """`index` sorted, and for each sorted entry the position in `index` of that value's last occurrence.

    A stable sort keeps equal values in their original order, so the last entry of each run of equal
    values is the last occurrence. No host synchronisation.
    """
    sorted_index, order = torch.sort(index, stable=True)
    starts_run = torch.ones_like(sorted_index, dtype=torch.bool)
    starts_run[1:] = sorted_index[1:] != sorted_index[:-1]
    run = torch.cumsum(starts_run, dim=0) - 1
    positions = torch.arange(index.numel(), device=index.device)
    run_end = torch.zeros_like(positions).scatter_reduce_(0, run, positions, reduce="amax", include_self=False)
    return sorted_index, order[run_end[run]]
