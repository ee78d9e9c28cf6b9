"""`hnnce`: InfoNCE with hard negatives up-weighted (HN-NCE; Radenovic et al., CVPR 2023).

See docs/peers.md §5. Per direction, with logits `l_ij` (logit_scale * cosine, the paper's
`x_i . y_j / tau`) over the global batch of N pairs, row i's loss is

    -l_ii + log(alpha exp(l_ii) + sum_{j != i} w_ij exp(l_ij)),
    w_ij = (N - 1) softmax_{j != i}(beta * l_ij)   (the weights average 1 over the row's negatives),

so alpha = 1, beta = 0 is InfoNCE. It is the cross-entropy over the logits `l_ij + log w_ij`
(negatives) and `l_ii + log alpha` (positive), plus `log alpha`. The weights are functions of
the logits and carry gradient, as in the paper's formula (our choice; docs/losses.md). Every row
holds all N columns with full logits and with local_loss, so the loss is exact over the global batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict

import torch

from .base import ContrastiveLoss, GlobalBatch
from .options import LossOptions, option
from .registry import register_loss


def hard_negative_log_weights(logits: torch.Tensor, positive: torch.Tensor, beta: float) -> torch.Tensor:
    """log w_ij = log((N - 1) softmax_{j != i}(beta * l_ij)) on negatives; -inf on the positives."""
    scaled = (beta * logits).masked_fill(positive, -math.inf)
    num_negatives = logits.shape[1] - 1
    return scaled - torch.logsumexp(scaled, dim=1, keepdim=True) + math.log(num_negatives)


@register_loss("hnnce")
class HardNegativeNCELoss(ContrastiveLoss):
    """HN-NCE: each negative's denominator term weighted by its softmax hardness within its row.

    Stats, per direction `d`, over the global batch: `d/weight_max` (mean over rows of the largest
    weight: 1 is uniform, N - 1 all on one negative) and `d/negative_mass_ratio` (mean over rows of
    sum_j w_ij exp(l_ij) / sum_j exp(l_ij): how much heavier the weighted negatives are than InfoNCE's).
    """

    @dataclass(frozen=True)
    class Options(LossOptions):
        beta: float = option(
            0.5,
            "hardness: the weights are (N - 1) softmax(beta * logit) over the row's negatives, "
            "on the temperature-scaled logits (0: InfoNCE's uniform weights)",
        )
        alpha: float = option(
            1.0, "weight of the positive's own term in the denominator (1: counted once, as in InfoNCE; 0 drops it)"
        )

        def check(self) -> None:
            super().check()
            if self.beta < 0:
                raise ValueError(f"beta must be >= 0 (0 is InfoNCE), got {self.beta}")
            if self.alpha < 0:
                raise ValueError(f"alpha must be >= 0, got {self.alpha}")

    console_stats = ("weight_max",)

    def direction_loss(self, batch: GlobalBatch, direction: str) -> torch.Tensor:
        logits = batch.logits(direction)
        if logits.shape[1] < 2:  # no negatives: the denominator is the positive alone
            return super().direction_loss(batch, direction)
        positive = batch.positive_mask()
        log_weight = hard_negative_log_weights(logits, positive, self.options.beta)
        log_alpha = math.log(self.options.alpha) if self.options.alpha > 0 else -math.inf
        weighted = logits + log_weight.masked_fill(positive, log_alpha)
        positive_logit = logits.gather(1, batch.labels[:, None]).squeeze(1)
        with torch.no_grad():
            self.stats.update(self._direction_stats(batch, direction, logits, log_weight, positive))
        return (torch.logsumexp(weighted, dim=1) - positive_logit).mean()

    @staticmethod
    def _direction_stats(
        batch: GlobalBatch, direction: str, logits: torch.Tensor, log_weight: torch.Tensor, positive: torch.Tensor
    ) -> Dict[str, torch.Tensor]:
        negatives = logits.masked_fill(positive, -math.inf)
        log_ratio = torch.logsumexp(negatives + log_weight, dim=1) - torch.logsumexp(negatives, dim=1)
        totals = batch.rows.sum(torch.stack([log_weight.amax(dim=1).exp().sum(), log_ratio.exp().sum()]))
        num_rows = logits.shape[1]
        return {
            f"{direction}/weight_max": totals[0] / num_rows,
            f"{direction}/negative_mass_ratio": totals[1] / num_rows,
        }
