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

`discovery` picks another label-free clone signal of `open_clip_adacl.clone_signals` in place of the posterior:
`gda_both` (both directions' posteriors must agree; soft, as the posterior), or a score flagged where it stands
`threshold` standard deviations above its row's negatives (`clone_signals.flag_clones`; p is then 0 or 1). The
token signals read the captions' token ids, which the trainer passes to a loss that `takes_text_tokens`.
The persistence signals read a memory of past scores per pair of sample ids (`score_memory.PairScoreMemory`,
`memory_momentum` the weight of the newest score), which a training step updates at `commit()` and which is
not checkpointed (a resumed run starts it empty). docs/clone_signals.md measures each signal's precision and
recall.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch

from .. import adacl_math, clone_signals
from ..score_memory import PairScoreMemory
from ..selection import batch_reference, summarize_rows
from .base import ContrastiveLoss, GlobalBatch, MechanismStats
from .options import DistributedSetup, LossOptions, option
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
        weight: float = option(
            16.0,
            "how many times a negative counts when its clone posterior is 1 (the oracle's "
            "weight for a true clone; 1: exactly clip)",
        )
        salient: str = option(
            "max",
            "salient score of a query for the reference rows: s_ii - max (or mean) of its negatives",
            choices=adacl_math.SALIENT_KINDS,
        )
        prior_ratio: float = option(1.0, "GDA prior ratio pi_not_clone / pi_clone")
        std_floor: float = option(1e-4, "floor of the reference fits' std, in cosine units")
        discovery: str = option(
            "gda",
            "the clone signal that gives p (docs/clone_signals.md): gda is AdaCL's "
            "posterior under the options above (gda_both uses the default ones)",
            choices=tuple(clone_signals.SIGNALS),
        )
        threshold: float = option(
            clone_signals.STANDARD_THRESHOLD,
            "a signal other than gda, gda_both flags a negative this many standard deviations "
            "above its row's negatives",
        )
        memory_momentum: float = option(
            0.5,
            "the persistence signals: the weight of this step's score in a pair's moving average over "
            "the steps it met (1: no memory)",
        )

        def check(self) -> None:
            super().check()
            if self.weight < 1:
                raise ValueError(f"weight must be >= 1 (1 is clip), got {self.weight}")
            if self.prior_ratio <= 0:
                raise ValueError(f"prior_ratio must be > 0, got {self.prior_ratio}")
            if self.std_floor < 0:
                raise ValueError(f"std_floor must be >= 0, got {self.std_floor}")
            if not 0 < self.memory_momentum <= 1:
                raise ValueError(f"memory_momentum must be in (0, 1], got {self.memory_momentum}")

    console_stats = ("clone_share",)
    # What a comparison summarises per run: how many negatives the discovery flagged, how much the weights moved.
    mechanism_stats = MechanismStats("adaclw", spreads=("clone_share", "weighted_mass"))
    takes_text_tokens = True

    def __init__(self, options: Optional[LossOptions] = None, dist: DistributedSetup = DistributedSetup()):
        super().__init__(options, dist)
        persistent = self.options.discovery in clone_signals.PERSISTENT
        self._memory = PairScoreMemory(self.options.memory_momentum) if persistent else None
        self._step_weights = None  # a direction-free discovery's (p, log weight), kept for the step's other direction

    def reset_state(self) -> None:
        if self._memory is not None:
            self._memory.clear()

    def forward(self, image_features, text_features, logit_scale, logit_bias=None, *, text_tokens=None, **inputs):
        if self.options.discovery in clone_signals.NEEDS_TOKENS and text_tokens is None:
            raise ValueError(
                f"adaclw:discovery={self.options.discovery} reads the captions' token ids: pass "
                "text_tokens= (the trainer does)"
            )
        self._text_tokens = text_tokens
        return super().forward(image_features, text_features, logit_scale, logit_bias, **inputs)

    def symmetric_loss(self, batch: GlobalBatch) -> torch.Tensor:
        # The signals' inputs, gathered once per step for both directions.
        self._pairs = (
            None
            if self.options.discovery == "gda"
            else clone_signals.pair_inputs(
                batch.logits_per_image,
                batch.logits_per_text,
                batch.labels,
                batch.image_features,
                batch.text_features,
                batch.all_image_features,
                batch.all_text_features,
                batch.logit_scale,
                batch.rows,
                self._text_tokens if self.options.discovery in clone_signals.NEEDS_TOKENS else None,
                self.dist.world_size,
                batch.sample_index,
                self._memory,
            )
        )
        if self._memory is not None:
            self._stage_memory_update(batch)
        try:
            return super().symmetric_loss(batch)
        finally:
            self._pairs = self._text_tokens = self._step_weights = None  # not kept past the step

    def _stage_memory_update(self, batch: GlobalBatch) -> None:
        """In training, this step's scores of the whole global batch (gathered now, on every rank) for the memory,
        written at `commit()`; an evaluation pass reads the memory and leaves it."""
        if batch.sample_index is None:
            raise ValueError(
                f"adaclw:discovery={self.options.discovery} keys its memory by sample ids: pass sample_index= "
                "(the trainer does)"
            )
        if self.training:
            update = clone_signals.persistence_update(self._pairs, self.dist.world_size)
            memory = self._memory
            self.stage_update(lambda: memory.update(*update))

    def adjust_logits(self, batch: GlobalBatch, direction: str) -> torch.Tensor:
        logits = batch.logits(direction)
        if logits.shape[1] < 2:  # no negatives to weight
            return logits
        if self.options.discovery != "gda":
            return self._signal_weighted(batch, direction, logits)
        options = self.options
        scores = logits.detach()
        summary = summarize_rows(scores, batch.labels, with_mean=options.salient == "mean")
        floor = options.std_floor * batch.logit_scale.detach().double()  # the fits are in logit units
        reference = batch_reference(scores, summary, batch.labels, batch.rows, salient=options.salient, std_floor=floor)
        positive = batch.positive_mask()
        posterior = adacl_math.gda_posterior(scores.double(), *reference, prior_ratio=options.prior_ratio)
        log_weight = posterior_log_weights(posterior, positive, options.weight).to(logits.dtype)
        if self.wants_stats:
            with torch.no_grad():
                self.stats.update(
                    self._direction_stats(batch, direction, scores, posterior, log_weight, positive, reference, floor)
                )
        return logits + log_weight

    def _signal_weighted(self, batch: GlobalBatch, direction: str, logits: torch.Tensor) -> torch.Tensor:
        """The weights of `discovery`'s p: a posterior as it is, any other score's flags as 0 or 1."""
        positive = batch.positive_mask()
        clone, log_weight = self._signal_weights(direction, positive, logits.dtype)
        if self.wants_stats:
            with torch.no_grad():
                self.stats.update(self._weight_stats(batch, direction, logits.detach(), clone, log_weight, positive))
        return logits + log_weight

    def _signal_weights(self, direction: str, positive: torch.Tensor, dtype: torch.dtype):
        """(p, log weight) of this step's discovery for `direction`; a signal that reads no direction
        (`clone_signals.DIRECTED`) is computed for the first direction and reused, the same values, for the other."""
        name = self.options.discovery
        if name not in clone_signals.DIRECTED and self._step_weights is not None:
            return self._step_weights
        scores = clone_signals.clone_scores(self._pairs, name, direction)
        clone = (
            scores.clamp(min=0).double()
            if name in clone_signals.POSTERIORS
            else clone_signals.flag_clones(name, scores, ~positive, self.options.threshold).double()
        )
        self._step_weights = clone, posterior_log_weights(clone, positive, self.options.weight).to(dtype)
        return self._step_weights

    @staticmethod
    def _weight_stats(
        batch: GlobalBatch,
        direction: str,
        scores: torch.Tensor,
        posterior: torch.Tensor,
        log_weight: torch.Tensor,
        positive: torch.Tensor,
    ) -> Dict[str, torch.Tensor]:
        negative = ~positive
        negatives = scores.masked_fill(positive, float("-inf")).double()
        log_ratio = torch.logsumexp(negatives + log_weight.double(), dim=1) - torch.logsumexp(negatives, dim=1)
        totals = batch.rows.sum(
            torch.stack(
                [((posterior > 0.5) & negative).sum().double(), (posterior * negative).sum(), log_ratio.exp().sum()]
            )
        )
        num_rows, num_negatives = scores.shape[1], scores.shape[1] * (scores.shape[1] - 1)
        return {
            f"{direction}/clone_share": totals[0] / num_negatives,
            f"{direction}/posterior_mean": totals[1] / num_negatives,
            f"{direction}/weighted_mass": totals[2] / num_rows,
        }

    @classmethod
    def _direction_stats(
        cls,
        batch: GlobalBatch,
        direction: str,
        scores: torch.Tensor,
        posterior: torch.Tensor,
        log_weight: torch.Tensor,
        positive: torch.Tensor,
        reference: torch.Tensor,
        floor: torch.Tensor,
    ) -> Dict[str, torch.Tensor]:
        flat = ((reference[1] <= floor) | (reference[3] <= floor)).double()
        return {
            **cls._weight_stats(batch, direction, scores, posterior, log_weight, positive),
            f"{direction}/flat_fit": flat,
        }
