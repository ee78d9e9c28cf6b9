"""Collectives used by the losses, kept apart from the math (see docs/method.md §5).

`RowGroup` abstracts "the ranks that together hold the rows of the global similarity matrix":
with one process, or when every rank holds all rows (OpenCLIP's full logits), its
reductions are the identity and cost nothing; with `--local-loss` each rank holds its own rows and
the reductions are all-reduces over the default process group. Every method is a tensor op with no
host synchronisation.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.distributed as dist
from open_clip.loss import gather_features


class RowGroup:
    """Reductions over the ranks that share the rows of the similarity matrix."""

    def __init__(self, split_across_ranks: bool):
        self.split_across_ranks = split_across_ranks and dist.is_available() and dist.is_initialized()

    def _reduce(self, tensor: torch.Tensor, op_name: str) -> torch.Tensor:
        if not self.split_across_ranks:
            return tensor
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=getattr(dist.ReduceOp, op_name))
        return tensor

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._reduce(tensor, "SUM")

    def max(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._reduce(tensor, "MAX")

    def min(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._reduce(tensor, "MIN")

    def from_owner(self, value: torch.Tensor, is_owner: torch.Tensor) -> torch.Tensor:
        """The value held by the (single) owning rank, on every rank, bit-exactly.

        Non-owners contribute zeros to a sum, and adding zeros is exact in floating point.
        """
        return self.sum(torch.where(is_owner, value, torch.zeros_like(value)))


def gather_batch(
    image_features: torch.Tensor,
    text_features: torch.Tensor,
    *,
    rank: int,
    world_size: int,
    local_loss: bool,
    gather_with_grad: bool,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """All ranks' features concatenated in rank order, with OpenCLIP's gradient semantics.

    Every rank must pass the same number of rows (OpenCLIP's gather, and a row's global index
    rank * rows + local row, assume it); unequal local batches are a ValueError on every rank, at
    the cost of one 2-element all-reduce and one host read per step.
    """
    if world_size == 1:
        return image_features, text_features
    check_equal_local_rows(image_features.shape[0], image_features.device)
    return gather_features(
        image_features,
        text_features,
        local_loss=local_loss,
        gather_with_grad=gather_with_grad,
        rank=rank,
        world_size=world_size,
    )


def gather_no_grad(tensor: Optional[torch.Tensor], world_size: int) -> Optional[torch.Tensor]:
    """All ranks' copies of `tensor` concatenated along dim 0 (no gradient); O(N) for indices."""
    if tensor is None or world_size == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(world_size)]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts, dim=0)


def check_equal_local_rows(num_rows: int, device: torch.device) -> None:
    """Raise the same ValueError on every rank unless all ranks hold `num_rows` rows."""
    extremes = torch.full((2,), num_rows, dtype=torch.int64, device=device)
    extremes[1] = -num_rows  # filled on the device: a tensor copied from the host would wait for it
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
    largest, negative_smallest = extremes.tolist()  # the one host read of the step
    smallest = -negative_smallest
    if largest != smallest:
        raise ValueError(
            f"the ranks hold different local batch sizes (between {smallest} and {largest} rows); the loss "
            f"gathers features across ranks and needs the same number of rows on every rank: drop the last "
            f"partial batch on each rank (the trainer's data loader always does)"
        )
