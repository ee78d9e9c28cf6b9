"""`glofnd`: InfoNCE with global false negatives removed on the fly (Balmaseda et al., ICML 2025).

See docs/peers.md §2. Every sample i owns, per direction (image anchors "i2t", text anchors
"t2i"), a threshold lambda_i meant to be the (1 - alpha) quantile of its similarities to negatives
over the whole data set. It is learned by stochastic sub-gradient steps on the quantile objective
`alpha * lambda + E_j[(s_ij - lambda)_+]`, whose gradient on a batch is

    g_i = alpha - mean_{j != i} 1[s_ij > lambda_i]        (over the batch's N - 1 negatives),

with a per-sample Adam (beta1 0.9, beta2 0.98), clamped to the cosine range [-1, 1], starting at 1
(nothing filtered). Negatives above their anchor's threshold are removed from the softmax
denominator; the mask is computed without gradient and positives are never masked.

Where we differ from the authors' code: Adam's bias correction uses each sample's own update count
(theirs counts epochs, so a threshold's first steps in a late epoch are barely corrected and
lambda can hardly move); thresholds are kept per direction as the paper describes. The mask of a
step uses the thresholds from before that step's update, which `commit()` applies.

Distributed: the bank is replicated. Each rank reads the thresholds of its rows from its replica
(the global `sample_index` is gathered by `ContrastiveLoss`); with `--local-loss` each rank counts
the masked negatives of its own rows and the N per-row counts are all-gathered (O(N) integers, never
a B x B mask), so every rank runs the same Adam update on the same global rows.

Updates and masking run in training mode from epoch `start_epoch` on (the trainer calls
`on_epoch_start`); before that, or in eval mode, the loss is plain InfoNCE (`clip`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch

from ..distributed import gather_no_grad
from ..state import SampleStateBank
from .base import DIRECTIONS, EpochGatedLoss, GlobalBatch
from .options import DistributedSetup, EpochGatedOptions, SampleStateOptions, option
from .registry import register_loss

ADAM_EPS = 1e-8  # the authors' value
THRESHOLD_RANGE = (-1.0, 1.0)  # thresholds live in cosine-similarity space
THRESHOLD_FIELDS = ("lambda", "m", "v", "count")  # per sample: threshold, Adam moments, own update count


def quantile_adam_step(
    state: Dict[str, torch.Tensor],
    num_above: torch.Tensor,
    num_negatives: int,
    *,
    alpha: float,
    lr: float,
    beta1: float,
    beta2: float,
) -> Dict[str, torch.Tensor]:
    """One per-sample Adam step on the quantile objective (GloFND's threshold update).

    state: `lambda`, `m`, `v`, `count`, each of shape B. num_above: B, how many of each sample's
    `num_negatives` negatives lie above its threshold. Returns the new state (same keys and shapes).
    Bias correction uses each sample's own count of updates.
    """
    grad = alpha - num_above.to(state["lambda"]) / max(num_negatives, 1)
    count = state["count"] + 1
    m = beta1 * state["m"] + (1 - beta1) * grad
    v = beta2 * state["v"] + (1 - beta2) * grad.square()
    m_hat = m / (1 - beta1**count)
    v_hat = v / (1 - beta2**count)
    threshold = (state["lambda"] - lr * m_hat / (v_hat.sqrt() + ADAM_EPS)).clamp(*THRESHOLD_RANGE)
    return {"lambda": threshold, "m": m, "v": v, "count": count}


@register_loss("glofnd")
class GloFNDLoss(EpochGatedLoss):
    """InfoNCE whose negatives above their anchor's learned (1 - alpha)-quantile threshold are dropped.

    Stats, per direction `d` in ("i2t", "t2i"), over the global batch: `d/masked_frac` (masked
    negatives / all negatives), `d/threshold_mean`, `d/threshold_min`, `d/threshold_max` (the
    thresholds that made the mask), `d/updated_frac` (fraction of the data set updated at least once).
    """

    @dataclass(frozen=True)
    class Options(SampleStateOptions, EpochGatedOptions):
        alpha: float = option(
            1e-3,
            "fraction of each sample's negatives treated as false negatives (thresholds "
            "learn the 1 - alpha quantile); 0 with init_lambda 1 filters nothing",
        )
        lambda_lr: float = option(0.05, "learning rate of the per-sample threshold Adam")
        start_epoch: int = option(
            0,
            "first epoch that updates thresholds and masks negatives (the authors start "
            "at about half of training, epoch 15-20 of ~30 on CC3M)",
        )
        beta1: float = option(0.9, "Adam beta1 of the threshold updates")
        beta2: float = option(0.98, "Adam beta2 of the threshold updates")
        init_lambda: float = option(1.0, "initial threshold of every sample (1 filters nothing)")

        def check(self) -> None:
            super().check()
            if not 0.0 <= self.alpha < 1.0:
                raise ValueError(f"alpha must be in [0, 1), got {self.alpha}")
            if not THRESHOLD_RANGE[0] <= self.init_lambda <= THRESHOLD_RANGE[1]:
                raise ValueError(f"init_lambda must be in {list(THRESHOLD_RANGE)}, got {self.init_lambda}")

    needs_sample_index = True
    keeps_state = True

    def __init__(self, options: Optional[Options] = None, dist: DistributedSetup = DistributedSetup()):
        super().__init__(options, dist)
        options = self.options
        self.thresholds = torch.nn.ModuleDict(
            {
                direction: SampleStateBank(options.data_size, THRESHOLD_FIELDS, initial={"lambda": options.init_lambda})
                for direction in DIRECTIONS
            }
        )

    def reset_state(self) -> None:
        """Every threshold back to `init_lambda`, its Adam moments and update count to 0."""
        for bank in self.thresholds.values():
            bank.reset()

    def adjust_logits(self, batch: GlobalBatch, direction: str) -> torch.Tensor:
        logits = batch.logits(direction)
        if not self.active:
            return logits
        if batch.sample_index is None:
            raise ValueError(
                "the glofnd loss needs sample_index (the data loader's global sample ids) "
                "to look up per-sample thresholds"
            )
        bank = self.thresholds[direction]
        sample_index = batch.sample_index.to(logits.device)
        with torch.no_grad():
            state = bank.gather(sample_index)  # the N global rows, identical on every rank
            row_threshold = batch.to_logits(state["lambda"][batch.labels])
            above = logits.detach() > row_threshold[:, None]
            above[torch.arange(len(batch.labels), device=above.device), batch.labels] = False
            num_above = self._all_rows(batch, above.sum(dim=1))
            options = self.options
            new_state = quantile_adam_step(
                state,
                num_above,
                logits.shape[1] - 1,
                alpha=options.alpha,
                lr=options.lambda_lr,
                beta1=options.beta1,
                beta2=options.beta2,
            )
            self.stage_update(lambda: bank.update(sample_index, new_state))
            self.stats.update(self._direction_stats(direction, state["lambda"], num_above, bank, sample_index))
        return logits.masked_fill(above, float("-inf"))

    def _all_rows(self, batch: GlobalBatch, per_row: torch.Tensor) -> torch.Tensor:
        """A per-row tensor of this rank's rows -> the same for all N global rows."""
        if batch.rows.split_across_ranks:
            return gather_no_grad(per_row, self.dist.world_size)
        return per_row

    @staticmethod
    def _direction_stats(
        direction: str,
        thresholds: torch.Tensor,
        num_above: torch.Tensor,
        bank: SampleStateBank,
        sample_index: torch.Tensor,
    ) -> Dict[str, torch.Tensor]:
        """Global-batch diagnostics: the masked fraction and the thresholds used; data-set coverage
        once this step's update is committed."""
        num_rows = num_above.numel()
        updated = bank.field("count") > 0
        updated[sample_index] = True
        return {
            f"{direction}/masked_frac": num_above.sum() / max(num_rows * (num_rows - 1), 1),
            f"{direction}/threshold_mean": thresholds.mean(),
            f"{direction}/threshold_min": thresholds.min(),
            f"{direction}/threshold_max": thresholds.max(),
            f"{direction}/updated_frac": updated.float().mean(),
        }
