"""`fne`: a CLIP port of False Negative Elimination (Li et al., ACM MM 2023); ours, not the authors'.

The original (docs/peers.md §1, github LuminosityX/FNE) is a *triplet-loss negative sampler* for
image-text matching: epoch 0 trains VSE++ with the hardest in-batch negative; later epochs keep
Gaussians of the similarities of correctly matched positives and of their hardest in-batch
negatives, turn a candidate's similarity into a false-negative probability by Bayes' rule with a
positive prior of 1e-4, and sample one negative per anchor with weights built from it
(`exp(-0.5 P_FN)` where P_FN > 1e-3, else a hardness weight `exp(-0.5 (s_ij - s_ii)^2)`, easy
negatives below `mean_pos - 0.2` cut to zero), over the batch plus a momentum-encoder queue.

This port keeps the false-negative model and uses it inside InfoNCE instead of a sampler. Per
direction (image anchors "i2t", text anchors "t2i"), every step:

1. rows whose positive beats their hardest negative (`s_ii > max_{j != i} s_ij`) are "matched";
   their `s_ii` and `max_{j != i} s_ij` update running first and second moments (an exponential
   moving average with `momentum`, the first batch taken as is), summed over ranks when the rows
   are split (`--local-loss`), so every rank holds identical statistics;
2. once `min_matched` matched rows have been seen, every negative gets
   `P_FN(s) = prior N(s; pos) / (prior N(s; pos) + (1 - prior) N(s; neg))`;
3. the negative's term in the softmax denominator is weighted by `w_ij = 1 - P_FN(s_ij)`, i.e.
   `log w_ij` (detached, at least log 1e-6 so logits stay finite) is added to its logit; positives
   keep weight 1.

Differences from the original, by design: soft weights in the denominator instead of sampling one
negative (the softmax already weights hard negatives, so the hardness weight and the easy-negative
cut-off have no counterpart); statistics per direction and matched per direction (the original
pools both directions and needs a top-1 match both ways); an exponential moving average instead of
a per-epoch cumulative mean reset each epoch; in-batch candidates only (no momentum encoder, no
queue). `start_epoch` (default 1) mirrors the original's plain epoch 0: before it, and in eval mode,
the loss is plain InfoNCE and the statistics do not move. A step's weights use the statistics with
its own batch folded in; the buffers take them at `commit()`. `unit_weights` keeps every weight at 1
(the loss is then exactly `clip`) while the statistics and diagnostics still run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from .base import DIRECTIONS, EpochGatedLoss, GlobalBatch
from .options import DistributedSetup, EpochGatedOptions, option
from .registry import register_loss

MIN_WEIGHT = 1e-6  # floor of w_ij: log w stays finite, a near-certain false negative is all but removed
VAR_FLOOR = 1e-6  # a Gaussian fitted to (nearly) equal similarities keeps a usable width
DOWNWEIGHTED = 0.5  # diagnostics: a negative counts as down-weighted when w_ij < 0.5


def update_moments(
    moments: torch.Tensor, num_seen: torch.Tensor, batch_sums: torch.Tensor, batch_count: torch.Tensor, momentum: float
) -> torch.Tensor:
    """Exponential moving average of per-class moments; the first batch with samples is taken as is.

    moments: (classes, 2) running [mean, mean of squares]; batch_sums: (classes, 2) this batch's
    [sum, sum of squares]; batch_count: 0-dim number of samples per class in the batch; num_seen: 0-dim
    samples seen before. A batch with no samples leaves the moments unchanged.
    """
    batch_moments = batch_sums / batch_count.clamp_min(1)
    rate = torch.where(num_seen > 0, 1.0 - momentum, 1.0)
    return torch.where(batch_count > 0, moments + rate * (batch_moments - moments), moments)


def gaussians(moments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std), each of shape (classes,), from running [mean, mean of squares] moments."""
    mean = moments[:, 0]
    variance = (moments[:, 1] - mean.square()).clamp_min(VAR_FLOOR)
    return mean, variance.sqrt()


def false_negative_log_odds(
    similarity: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, prior: float
) -> torch.Tensor:
    """log P_FN / (1 - P_FN) of each similarity, by Bayes' rule on two Gaussians (FNE).

    similarity: any shape; mean, std: (2,) for [positive, negative]; prior: P(positive).
    `sigmoid` of the result is `prior N(s; pos) / (prior N(s; pos) + (1 - prior) N(s; neg))`.
    """
    z_positive = (similarity - mean[0]) / std[0]
    z_negative = (similarity - mean[1]) / std[1]
    log_prior_odds = math.log(prior) - math.log1p(-prior)
    return log_prior_odds - 0.5 * (z_positive.square() - z_negative.square()) - (std[0] / std[1]).log()


@register_loss("fne")
class FNELoss(EpochGatedLoss):
    """InfoNCE with each negative's denominator term weighted by 1 - P(false negative) (FNE, CLIP port).

    Stats, per direction `d` in ("i2t", "t2i"), over the global batch: `d/weight_mean`,
    `d/downweighted_frac` (w < 0.5), `d/p_fn_mean`, `d/p_fn_max` (over negatives; with `unit_weights`
    they describe the weights that would apply), `d/matched_frac` (rows matched this step), and the
    running Gaussians `d/pos_mean`, `d/pos_std`, `d/neg_mean`, `d/neg_std`.
    """

    @dataclass(frozen=True)
    class Options(EpochGatedOptions):
        prior: float = option(
            1e-4, "prior probability that a negative is a false negative (the original's 1 / match_para)"
        )
        momentum: float = option(0.99, "momentum of the running Gaussian statistics")
        start_epoch: int = option(
            1,
            "first epoch with statistics and weights; earlier epochs are plain InfoNCE "
            "(the original's epoch-0 warm-up)",
        )
        min_matched: int = option(200, "matched pairs to see before weights apply (the original's nums_right_sims)")
        unit_weights: bool = option(
            False, "keep every weight at 1 (exactly the clip loss) while statistics and diagnostics still run"
        )

        def check(self) -> None:
            super().check()
            if not 0.0 < self.prior < 1.0:
                raise ValueError(f"prior must be in (0, 1), got {self.prior}")
            if not 0.0 <= self.momentum < 1.0:
                raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")

    keeps_state = True

    def __init__(self, options: Optional[Options] = None, dist: DistributedSetup = DistributedSetup()):
        super().__init__(options, dist)
        for direction in DIRECTIONS:
            # rows: [positive, hardest negative]; columns: [mean, mean of squares] of the similarity
            self.register_buffer(f"{direction}_moments", torch.zeros(2, 2))
            self.register_buffer(f"{direction}_num_matched", torch.zeros(()))

    def reset_state(self) -> None:
        """Forget the running statistics: weights wait for `min_matched` matched pairs again."""
        for buffer in self.buffers():
            buffer.zero_()

    def adjust_logits(self, batch: GlobalBatch, direction: str) -> torch.Tensor:
        logits = batch.logits(direction)
        if not self.active or logits.shape[1] < 2:
            return logits
        with torch.no_grad():
            matched_frac, moments, num_matched = self._updated_statistics(batch, direction)
            mean, std = gaussians(moments)
            ready = num_matched >= self.options.min_matched
            similarity = batch.to_similarity(logits.detach()).float()
            log_odds = false_negative_log_odds(similarity, mean, std, self.options.prior)
            # Not ready: every P_FN is 0 (weights 1); positives are never down-weighted.
            log_odds = torch.where(ready, log_odds, -math.inf)
            log_odds[torch.arange(len(batch.labels), device=logits.device), batch.labels] = -math.inf
            log_weight = F.logsigmoid(-log_odds).clamp_min(math.log(MIN_WEIGHT))
            self.stats.update(self._direction_stats(batch, direction, log_odds, log_weight, mean, std, matched_frac))
        if self.options.unit_weights:
            return logits
        return logits + log_weight

    def _updated_statistics(
        self, batch: GlobalBatch, direction: str
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(matched fraction, moments, matched count) with this batch's matched rows folded into the
        running statistics; the update of the buffers is staged for `commit()`."""
        logits = batch.logits(direction).detach()
        rows = torch.arange(len(batch.labels), device=logits.device)
        positive = logits[rows, batch.labels]
        hardest = logits.index_put(
            (rows, batch.labels), torch.tensor(-math.inf, dtype=logits.dtype, device=logits.device)
        ).amax(dim=1)
        matched = positive > hardest
        zero = torch.zeros((), device=logits.device)
        s_positive = torch.where(matched, batch.to_similarity(positive).float(), zero)
        s_hardest = torch.where(matched, batch.to_similarity(hardest).float(), zero)
        totals = batch.rows.sum(
            torch.stack(
                [
                    matched.float().sum(),
                    s_positive.sum(),
                    s_positive.square().sum(),
                    s_hardest.sum(),
                    s_hardest.square().sum(),
                ]
            )
        )
        count, sums = totals[0], totals[1:].view(2, 2)
        moments_buffer = getattr(self, f"{direction}_moments")
        num_matched_buffer = getattr(self, f"{direction}_num_matched")
        moments = update_moments(moments_buffer, num_matched_buffer, sums, count, self.options.momentum)
        num_matched = num_matched_buffer + count

        def write_statistics() -> None:
            moments_buffer.copy_(moments)
            num_matched_buffer.copy_(num_matched)

        self.stage_update(write_statistics)
        return count / logits.shape[1], moments, num_matched

    @staticmethod
    def _direction_stats(
        batch: GlobalBatch,
        direction: str,
        log_odds: torch.Tensor,
        log_weight: torch.Tensor,
        mean: torch.Tensor,
        std: torch.Tensor,
        matched_frac: torch.Tensor,
    ) -> Dict[str, torch.Tensor]:
        """Global-batch diagnostics of the weights (over negatives only) and the running Gaussians."""
        num_rows = log_odds.shape[1]
        num_negatives = num_rows * (num_rows - 1)
        weight = log_weight.exp()
        p_fn = torch.sigmoid(log_odds)  # 0 on positives, so sums run over negatives
        totals = batch.rows.sum(
            torch.stack(
                [
                    weight.sum() - len(batch.labels),  # positives carry weight 1
                    (weight < DOWNWEIGHTED).float().sum(),
                    p_fn.sum(),
                ]
            )
        )
        return {
            f"{direction}/weight_mean": totals[0] / num_negatives,
            f"{direction}/downweighted_frac": totals[1] / num_negatives,
            f"{direction}/p_fn_mean": totals[2] / num_negatives,
            f"{direction}/p_fn_max": batch.rows.max(p_fn.max()),
            f"{direction}/matched_frac": matched_frac,
            f"{direction}/pos_mean": mean[0],
            f"{direction}/pos_std": std[0],
            f"{direction}/neg_mean": mean[1],
            f"{direction}/neg_std": std[1],
        }
