"""`oracle`: a control, not a method: InfoNCE that knows which negatives are clones of the query.

The data's family ids (the synthetic scenes' json `"family"`: one-edit siblings of one base scene)
reach the loss with the batch (`needs_family`). A negative from the query's own family counts
`weight` times in the softmax denominator, i.e. `log weight` is added to its logit; the positive
and every other negative count once, so `weight` 1 is exactly `clip`. With weight > 1 the loss
trains on the clone negatives as harder negatives, with full knowledge of which they are: the
ceiling of what clone-aware reweighting can do on data written in families. Samples without a
family (id -1) have none. Exact over the global batch: the family ids are gathered with the
features, like the sample indices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict

import torch

from .base import FAMILY_FIELD, ContrastiveLoss, GlobalBatch
from .options import LossOptions, option
from .registry import register_loss


def family_negative_mask(batch: GlobalBatch) -> torch.Tensor:
    """rows x N, True where column j is a negative of row i from row i's own family (never for id -1; with
    group ids, sharing any one: `GlobalBatch.sibling_mask`)."""
    if batch.family is None:
        raise ValueError(
            "the oracle loss needs each sample's family id (family=): the trainer reads it from the "
            "json 'family' field of the training shards, which data written in families has "
            "(python -m training.synthetic_scenes)"
        )
    return batch.sibling_mask()


@register_loss("oracle")
class OracleFamilyLoss(ContrastiveLoss):
    """InfoNCE whose same-family negatives count `weight` times in the denominator (a control).

    Stats, over the global batch: `family_negatives` (mean same-family negatives per row) and, per
    direction `d`, `d/family_prob` (mean softmax probability the weighted rows put on them).
    """

    @dataclass(frozen=True)
    class Options(LossOptions):
        weight: float = option(
            16.0,
            "how many times a negative from the query's own family counts in the softmax "
            "denominator (1: exactly clip; 0: family negatives removed)",
        )
        family_field: str = option(
            FAMILY_FIELD,
            "the json field of the data holding each sample's family id, or a list of group ids (one per kind of "
            "sibling: a negative sharing the k-th id with the query is its clone; docs/losses.md)",
        )

        def check(self) -> None:
            super().check()
            if self.weight < 0:
                raise ValueError(f"weight must be >= 0 (1 is clip), got {self.weight}")

    needs_family = True
    console_stats = ("family_negatives", "family_prob")

    def adjust_logits(self, batch: GlobalBatch, direction: str) -> torch.Tensor:
        logits = batch.logits(direction)
        family = family_negative_mask(batch)
        log_weight = math.log(self.options.weight) if self.options.weight > 0 else -math.inf
        adjusted = torch.where(family, logits + log_weight, logits)
        with torch.no_grad():
            self.stats.update(self._direction_stats(batch, direction, adjusted, family))
        return adjusted

    @staticmethod
    def _direction_stats(
        batch: GlobalBatch, direction: str, adjusted: torch.Tensor, family: torch.Tensor
    ) -> Dict[str, torch.Tensor]:
        probability = torch.softmax(adjusted.float(), dim=1)
        totals = batch.rows.sum(torch.stack([family.sum().float(), (probability * family).sum()]))
        num_rows = adjusted.shape[1]
        return {"family_negatives": totals[0] / num_rows, f"{direction}/family_prob": totals[1] / num_rows}
