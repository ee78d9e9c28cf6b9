"""`adaclw`: our label-free extension of AdaCL, not the paper's method: negatives weighted by AdaCL's clone posterior.

The oracle (`oracle`) shows what knowing each query's clone negatives buys: a negative of the query's own
family counts `weight` times in the softmax denominator. AdaCL's discovery (docs/method.md §3.1-3.3) guesses
the same thing without labels: two Gaussians fitted over the global batch (the least salient row's negatives,
class clone; the most salient row's, class not clone) give each negative score s_ij a posterior
p_ij = p(clone | s_ij) (`adacl_math.gda_posterior`). This loss weights each negative by the oracle's weight in
expectation under that posterior,

    w_ij = 1 + (weight - 1) p_ij,    i.e. log w_ij added to the negative's logit,

so weight 1 is exactly `clip`, and a posterior equal to the true family indicator is exactly the oracle. The
posterior is a constant of the step (no gradient through the fits or the weights). Exact over the global batch:
the fits are `selection.batch_reference`'s, shared by every rank; the weights are per entry. docs/losses.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import torch

from .. import adacl_math
from ..selection import batch_reference, summarize_rows
from .base import ContrastiveLoss, GlobalBatch
from .options import LossOptions, option
from .registry import register_loss


def posterior_log_weights(posterior: torch.Tensor, positive: torch.Tensor, weight: float) -> torch.Tensor:
    """log(1 + (weight - 1) p) on the negatives, 0 on the positives: the oracle's log weight in expectation."""
    return torch.log1p((weight - 1.0) * posterior).masked_fill(positive, 0.0)


@register_loss("adaclw")
class PosteriorWeightedLoss(ContrastiveLoss):
    """InfoNCE whose negatives count 1 + (weight - 1) p(clone | score) times in the denominator (ours).

    Stats, per direction `d`, over the global batch: `d/clone_share` (share of negatives with posterior > 1/2:
    AdaCL's clone candidates), `d/posterior_mean` (mean posterior over the negatives), `d/flat_fit` (1 when a
    reference fit sat at the std floor: its posterior is then degenerate), `d/weighted_mass` (mean over rows of
    the weighted negatives' softmax mass over the unweighted one: how much the weights changed the loss).
    """

    @dataclass(frozen=True)
    class Options(LossOptions):
        weight: float = option(16.0, "how many times a negative counts when its clone posterior is 1 (the oracle's "
                                     "weight for a true clone; 1: exactly clip)")
        salient: str = option("max", "salient score of a query for the reference rows: s_ii - max (or mean) of its "
                                     "negatives", choices=adacl_math.SALIENT_KINDS)
        prior_ratio: float = option(1.0, "GDA prior ratio pi_not_clone / pi_clone")
        std_floor: float = option(1e-4, "floor of the reference fits' std, in cosine units")

        def check(self) -> None:
            super().check()
            if self.weight < 1:
                raise ValueError(f"weight must be >= 1 (1 is clip), got {self.weight}")
            if self.prior_ratio <= 0:
                raise ValueError(f"prior_ratio must be > 0, got {self.prior_ratio}")
            if self.std_floor < 0:
                raise ValueError(f"std_floor must be >= 0, got {self.std_floor}")

    console_stats = ("clone_share",)

    def adjust_logits(self, batch: GlobalBatch, direction: str) -> torch.Tensor:
        logits = batch.logits(direction)
        if logits.shape[1] < 2:  # no negatives to weight
            return logits
        options = self.options
        scores = logits.detach()
        summary = summarize_rows(scores, batch.labels, with_mean=options.salient == "mean")
        floor = options.std_floor * batch.logit_scale.detach().double()  # the fits are in logit units
        reference = batch_reference(scores, summary, batch.labels, batch.rows, salient=options.salient,
                                    std_floor=floor)
        positive = batch.positive_mask()
        posterior = adacl_math.gda_posterior(scores.double(), *reference, prior_ratio=options.prior_ratio)
        log_weight = posterior_log_weights(posterior, positive, options.weight).to(logits.dtype)
        with torch.no_grad():
            self.stats.update(self._direction_stats(batch, direction, scores, posterior, log_weight, positive,
                                                    reference, floor))
        return logits + log_weight

    @staticmethod
    def _direction_stats(batch: GlobalBatch, direction: str, scores: torch.Tensor, posterior: torch.Tensor,
                         log_weight: torch.Tensor, positive: torch.Tensor, reference: torch.Tensor,
                         floor: torch.Tensor) -> Dict[str, torch.Tensor]:
        negative = ~positive
        negatives = scores.masked_fill(positive, float("-inf")).double()
        log_ratio = torch.logsumexp(negatives + log_weight.double(), dim=1) - torch.logsumexp(negatives, dim=1)
        totals = batch.rows.sum(torch.stack([((posterior > 0.5) & negative).sum().double(),
                                             (posterior * negative).sum(), log_ratio.exp().sum()]))
        num_rows, num_negatives = scores.shape[1], scores.shape[1] * (scores.shape[1] - 1)
        flat = ((reference[1] <= floor) | (reference[3] <= floor)).double()
        return {f"{direction}/clone_share": totals[0] / num_negatives,
                f"{direction}/posterior_mean": totals[1] / num_negatives,
                f"{direction}/weighted_mass": totals[2] / num_rows, f"{direction}/flat_fit": flat}
