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
`memory_momentum` the weight of the newest score), which a training step updates at `commit()`; it is a buffer
of the loss, so a checkpoint holds it and a resumed run continues with it. docs/clone_signals.md measures each
signal's precision and recall.

The controls at a fixed dose: with `quota` q > 0, every row's round(q (N - 1)) highest-scoring negatives are
flagged instead (`clone_signals.flag_quota`), so `discovery=random` (a fresh uniform draw per step, its count a
buffer of the loss) and `discovery=cross` (the row's hardest negatives by its own cross-modal score) weight the
same share of negatives as a discovery that flags that share on average: what is specific to finding clones.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from .. import adacl_math, clone_signals
from ..score_memory import PairScoreMemory
from .base import DIRECTIONS, FAMILY_FIELD, ContrastiveLoss, GlobalBatch, MechanismStats
from .options import DistributedSetup, LossOptions, option
from .registry import register_loss


def posterior_log_weights(posterior: torch.Tensor, positive: torch.Tensor, weight: float) -> torch.Tensor:
    """log(1 + (weight - 1) p) on the negatives, 0 on the positives: the oracle's log weight in expectation."""
    return torch.log1p((weight - 1.0) * posterior).masked_fill(positive, 0.0)


def flag_log_weights(flags: torch.Tensor, weight: float, dtype: torch.dtype) -> torch.Tensor:
    """`posterior_log_weights` of flags that hold no positive, as 0 or 1, in `dtype`: the same floats (log1p(weight
    - 1) computed as there, in float64 on the device, then rounded), written in one pass over the flags."""
    flagged = torch.full((), weight - 1.0, dtype=torch.float64, device=flags.device).log1p_().to(dtype)
    return torch.where(flags, flagged, flagged.new_zeros(()))


@register_loss("adaclw")
class PosteriorWeightedLoss(ContrastiveLoss):
    """InfoNCE whose negatives count 1 + (weight - 1) p(clone | score) times in the denominator (ours).

    Stats, per direction `d`, over the global batch: `d/clone_share` (share of negatives with posterior > 1/2:
    AdaCL's clone candidates), `d/posterior_mean` (mean posterior over the negatives), `d/flat_fit` (1 when a
    reference fit sat at the std floor: its posterior is then degenerate), `d/weighted_mass` (mean over rows of
    the weighted negatives' softmax mass over the unweighted one: how much the weights changed the loss); and where
    the trainer passes families (`takes_family`: data whose json holds them), `d/sibling_share` (negatives of the
    query's own family), `d/flag_precision` and `d/flag_recall` (the flags, p > 1/2, against those siblings).
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
        family_field: str = option(
            FAMILY_FIELD,
            "where the data has families: the json field of the family ids (or group ids) its stats measure the "
            "discovery against (as oracle's family_field)",
        )
        quota: float = option(
            0.0,
            "flag each row's top share of its negatives by the discovery's score, the same number in every row "
            "(the controls at a fixed dose: random, cross), instead of by threshold or posterior (0)",
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
            if not 0 <= self.quota < 1:
                raise ValueError(f"quota must be in [0, 1) (0: off), got {self.quota}")

    console_stats = ("clone_share",)
    # What a comparison summarises per run: how many negatives the discovery flagged, how much the weights moved.
    # Where the data carries families, also the share of negatives that are siblings and the flags' precision and
    # recall against them, on the training batches.
    mechanism_stats = MechanismStats(
        "adaclw", spreads=("clone_share", "weighted_mass", "sibling_share", "flag_precision", "flag_recall")
    )
    takes_text_tokens = True
    takes_family = True  # where the data carries families: the discovery's precision and recall, per logged step

    def __init__(self, options: Optional[LossOptions] = None, dist: DistributedSetup = DistributedSetup()):
        super().__init__(options, dist)
        self.discovery = clone_signals.signal(self.options.discovery)
        # The persistence signals' past scores per pair of sample ids: a buffer of the loss, so checkpointed.
        self.memory = PairScoreMemory(self.options.memory_momentum) if self.discovery.persistent else None
        if self.discovery.random:  # the random control's draw: its training steps so far, checkpointed
            self.register_buffer("draws", torch.zeros((), dtype=torch.long))

    def reads_text_tokens(self) -> bool:
        return self.discovery.needs_tokens

    def reads_sample_index(self) -> bool:
        return self.discovery.persistent  # the persistence signals key their memory by sample ids

    def idle_options(self, global_batch: int) -> List[str]:
        """A threshold no standardized score of a row can pass (`clone_signals.max_standardized_score` of its
        global_batch - 1 negatives, with --accum-freq the accumulated batch's): every step flags nothing, no negative
        is weighted, and the loss is clip. Where the threshold is read at all: a discovery without a posterior and
        no quota."""
        threshold = self.options.threshold
        reachable = clone_signals.max_standardized_score(global_batch - 1)
        if self.discovery.posterior or self.options.quota or threshold < reachable:
            return []
        return [
            f"threshold {threshold:g} flags nothing at a global batch of {global_batch}: no score of a row's "
            f"{global_batch - 1} negatives stands more than sqrt({global_batch - 2}) = {reachable:.3g} standard "
            f"deviations above their mean, so every negative counts once and the loss trains as clip; pass a "
            f"threshold below {reachable:.3g} (the default is {clone_signals.STANDARD_THRESHOLD:g})"
        ]

    def reset_state(self) -> None:
        if self.memory is not None:
            self.memory.clear()
        if self.discovery.random:
            self.draws.zero_()

    def symmetric_loss(self, batch: GlobalBatch) -> torch.Tensor:
        if self.options.discovery == "gda":
            weights = {direction: self._posterior_weights(batch, direction) for direction in DIRECTIONS}
        else:
            inputs = self._discovery_inputs(batch)  # read once per step, by both directions
            if self.memory is not None and self.training:
                self._stage_memory_update(inputs)
            if self.discovery.random and self.training:
                draws = self.draws
                self.stage_update(lambda: draws.add_(1))
            weights = self._signal_weights(batch, inputs)
        return (
            self._direction_loss(batch, "i2t", *weights["i2t"]) + self._direction_loss(batch, "t2i", *weights["t2i"])
        ) / 2

    def _direction_loss(self, batch: GlobalBatch, direction: str, log_weight, stats) -> torch.Tensor:
        if self.wants_stats and stats is not None:
            with torch.no_grad():
                self.stats.update(stats())
        logits = batch.logits(direction)
        return F.cross_entropy(logits if log_weight is None else logits + log_weight, batch.labels)

    def _discovery_inputs(self, batch: GlobalBatch) -> clone_signals.PairInputs:
        """What the discovery reads of the global batch (the batch's gathered token ids and sample ids, and the
        pair memory), detached."""
        name = self.options.discovery
        if self.discovery.needs_tokens and batch.text_tokens is None:
            raise ValueError(
                f"adaclw:discovery={name} reads the captions' token ids: pass text_tokens= (the trainer does)"
            )
        if self.discovery.persistent and batch.sample_index is None:
            raise ValueError(
                f"adaclw:discovery={name} keys its memory by sample ids: pass sample_index= (the trainer does)"
            )
        return clone_signals.PairInputs(
            {"i2t": batch.logits_per_image.detach(), "t2i": batch.logits_per_text.detach()},
            batch.labels,
            batch.image_features.detach(),
            batch.text_features.detach(),
            batch.all_image_features.detach(),
            batch.all_text_features.detach(),
            batch.logit_scale.detach(),
            batch.rows,
            batch.query_text_tokens() if self.discovery.needs_tokens else None,
            batch.text_tokens if self.discovery.needs_tokens else None,
            batch.sample_index,
            self.memory,
            self.draws if self.discovery.random else None,
        )

    def _stage_memory_update(self, inputs: clone_signals.PairInputs) -> None:
        """This step's scores of the whole global batch (gathered now, on every rank) for the memory, written at
        `commit()`; an evaluation pass reads the memory and leaves it."""
        update = clone_signals.persistence_update(inputs, self.dist.world_size)
        memory = self.memory
        self.stage_update(lambda: memory.update(*update))

    def _posterior_weights(self, batch: GlobalBatch, direction: str):
        """(log weight, its stats) of AdaCL's posterior under this loss's options, for `direction`."""
        logits = batch.logits(direction)
        if logits.shape[1] < 2:  # no negatives to weight
            return None, None
        options = self.options
        posterior, reference = clone_signals.gda_clone_posterior(
            logits,
            batch.labels,
            batch.rows,
            batch.logit_scale,
            salient=options.salient,
            prior_ratio=options.prior_ratio,
            std_floor=options.std_floor,
        )
        positive = batch.positive_mask()
        log_weight = posterior_log_weights(posterior, positive, options.weight).to(logits.dtype)
        floor = options.std_floor * batch.logit_scale.detach().double()

        def stats():
            flat = ((reference[1] <= floor) | (reference[3] <= floor)).double()
            weighed = _weight_stats(batch, direction, logits.detach(), posterior, log_weight, positive)
            return {**weighed, f"{direction}/flat_fit": flat}

        return log_weight, stats

    def _signal_weights(self, batch: GlobalBatch, inputs: clone_signals.PairInputs):
        """Per direction, (log weight, its stats) of the discovery's p: a posterior as it is, any other score's flags
        as 0 or 1. A signal that reads no direction (`CloneSignal.directed`) is computed once, for both."""
        if batch.logits_per_image.shape[1] < 2:  # no negatives to weight
            return {direction: (None, None) for direction in DIRECTIONS}
        positive = batch.positive_mask()
        dtype = batch.logits_per_image.dtype
        weights, clone, log_weight = {}, None, None
        name, options = self.options.discovery, self.options
        for direction in DIRECTIONS:
            if clone is None or self.discovery.directed:
                if options.quota or self.discovery.posterior:
                    scores = clone_signals.clone_scores(inputs, name, direction)
                    clone = (
                        clone_signals.flag_quota(scores, options.quota) if options.quota else scores.clamp(min=0)
                    ).double()
                    log_weight = posterior_log_weights(clone, positive, options.weight).to(dtype)
                else:  # flags of negatives only: their log weights straight from the flags
                    clone = clone_signals.signal_flags(inputs, name, direction, options.threshold)
                    log_weight = flag_log_weights(clone, options.weight, dtype)
            weights[direction] = (
                log_weight,
                partial(_weight_stats, batch, direction, batch.logits(direction).detach(), clone, log_weight, positive),
            )
        return weights


def _weight_stats(
    batch: GlobalBatch,
    direction: str,
    scores: torch.Tensor,
    posterior: torch.Tensor,
    log_weight: torch.Tensor,
    positive: torch.Tensor,
) -> Dict[str, torch.Tensor]:
    """`direction`'s share of flagged negatives, mean posterior and weighted softmax mass over the global batch;
    where the batch carries families, the share of negatives that are siblings (of the query's family) and the
    flags' precision and recall against them."""
    negative = ~positive
    posterior = posterior.double()  # a discovery's flags are bool until their stats are asked for
    flagged = (posterior > 0.5) & negative
    negatives = scores.masked_fill(positive, float("-inf")).double()
    log_ratio = torch.logsumexp(negatives + log_weight.double(), dim=1) - torch.logsumexp(negatives, dim=1)
    counts = [flagged.sum().double(), (posterior * negative).sum(), log_ratio.exp().sum()]
    if batch.family is not None:
        sibling = batch.sibling_mask()
        counts += [sibling.sum().double(), (flagged & sibling).sum().double()]
    totals = batch.rows.sum(torch.stack(counts))
    num_rows, num_negatives = scores.shape[1], scores.shape[1] * (scores.shape[1] - 1)
    stats = {
        f"{direction}/clone_share": totals[0] / num_negatives,
        f"{direction}/posterior_mean": totals[1] / num_negatives,
        f"{direction}/weighted_mass": totals[2] / num_rows,
    }
    if batch.family is not None:
        stats[f"{direction}/sibling_share"] = totals[3] / num_negatives
        stats[f"{direction}/flag_precision"] = totals[4] / totals[0].clamp(min=1)
        stats[f"{direction}/flag_recall"] = totals[4] / totals[3].clamp(min=1)
    return stats
