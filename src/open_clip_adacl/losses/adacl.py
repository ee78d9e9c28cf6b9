"""`adacl`: Adaptive Contrastive Learning (Pan, Dong, Yang, ICLR 2025) for CLIP pretraining.

Per direction (image-to-text "i2t", text-to-image "t2i") and per batch:
1. select an anchor over the global batch (selection.py: salient scores, reference rows, GDA clone
   candidates, the median / mean / min / max candidate gap and the row u that owns it);
2. compute the margins without gradient (adacl_math.py): Algorithm 1's closed forms (`literal` mode) or
   the calibrated, bounded and smoothed variant (`calibrated` mode, docs/method.md §4 and §4b);
3. replace every row's positive logit t s_ii by m1 (s_ii - m2); the negatives' logits and the
   averaging of the two directions' cross-entropies are ClipLoss's.

A degenerate batch (fewer than 3 rows, a flat reference fit, no clone candidate, or unusable
closed forms) is trained as vanilla CL for that direction and counted in `fallback_counts`.

The cross-entropy is log(exp(positive) + sum_neg exp(logit)) - positive, with the negatives'
log-sum-exp taken from one pass over the logits that the selection shares; no modified N x N
logit matrix is ever built. `modulate=False` skips all that and trains with ClipLoss's exact code
path while still computing and logging the margins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Dict, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from .. import adacl_math, fused, row_passes
from ..selection import AnchorSelection, RowSummary, row_value_from_owner, select_anchor, summarize_rows
from ..state import last_occurrence
from .base import DIRECTIONS, ContrastiveLoss, GlobalBatch, MechanismStats
from .options import DistributedSetup, SampleStateOptions, option
from .registry import register_loss

MODES = ("literal", "calibrated")
# Why a direction fell back to vanilla CL this step (first failing guard wins; docs/method.md §3 "Guards").
FALLBACK_REASONS = ("few_rows", "flat_reference", "no_candidates", "bad_margins")
MIN_ROWS = 3  # two reference rows with at least two negatives each
ALGORITHM_1 = {
    "mode": "literal",
    "salient": "max",
    "prior_ratio": 1.0,
    "candidate_region": "gda",
    "anchor_stat": "median",
    "positive_grad": "fixed",
    "boundary": 1.0,
    "boundary_kind": "fixed",
    "modulate": True,
}
# Per-step 0/1 stats: which of calibrated mode's bounds changed the closed forms (docs/adacl.md).
BOUND_STATS = ("anchor_clamped", "scale_bounded", "offset_bounded")


class _NegativeLogSumExp(torch.autograd.Function):
    """Per row: log sum_{j != positive} exp(logits_ij), value precomputed by `summarize_rows`.

    Its backward writes softmax-over-negatives weights straight into the gradient, so neither pass
    allocates anything N x N besides the gradient itself. It works on the whole matrix: in chunks
    it would be no faster (the first touch of the fresh gradient's pages and the exp bound it), and
    with several threads each op on a chunk would cost a fork-join.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, positive_col: torch.Tensor, negative_lse: torch.Tensor):
        ctx.save_for_backward(logits, positive_col, negative_lse)
        return negative_lse.clone()

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        logits, positive_col, negative_lse = ctx.saved_tensors
        # negative_lse has the working dtype, so the difference is float32 for half-precision logits.
        weights = torch.sub(logits, negative_lse[:, None])
        weights.exp_().mul_(grad_output[:, None])
        weights[torch.arange(logits.shape[0], device=logits.device), positive_col] = 0
        return weights.to(logits.dtype), None, None


class DirectionSelection(NamedTuple):
    """What `_select` read from one direction's logits (no gradient, identical on every rank)."""

    summary: RowSummary
    anchor: Optional[AnchorSelection]  # None: fewer than MIN_ROWS rows, no anchor to select


class DirectionMargins(NamedTuple):
    """What `_margins` decided for one direction (0-dim, no gradient, identical on every rank)."""

    m1: torch.Tensor  # the applied margins (vanilla's on a fallback step)
    m2: torch.Tensor
    modulated: torch.Tensor  # bool: no guard failed
    row: torch.Tensor  # global anchor row u (-1: none)
    anchor: torch.Tensor  # a, as the closed forms took it (before any clamp)
    log_z_u: torch.Tensor
    gap: torch.Tensor  # the anchor element's gap, cosine units


@register_loss("adacl")
class AdaCLLoss(ContrastiveLoss):
    """AdaCL's positive margins on top of OpenCLIP's ClipLoss, exact over the global batch."""

    @dataclass(frozen=True)
    class Options(SampleStateOptions):
        # Algorithm 1 as docs/method.md §3 reconstructs it, with none of the project's bounds (literal mode has
        # none): the GDA candidate set, the median anchor, the steep positive of slope m1 and boundary 1. eps was
        # not recovered and stays free; so do the readings the method text leaves open (§3.6-3.7: the anchor
        # probability, whether the margins carry gradient, the anchor's value), which `algorithm1` leaves to the
        # other options. `paper` fixes them to the one reading of ours that trained without collapsing in the
        # controls study (closed-form margins, vanilla p_u, the positive as anchor, eps 1e-4: docs/adacl.md §5.0);
        # `first-reading` to our first reading (detached margins, progressive p_u, the positive as anchor).
        PRESETS = {
            "algorithm1": ALGORITHM_1,
            "paper": {
                **ALGORITHM_1,
                "anchor_prob": "vanilla",
                "margin_grad": "closed_form",
                "anchor_value": "positive",
                "eps": 1e-4,
            },
            "first-reading": {
                **ALGORITHM_1,
                "anchor_prob": "progressive",
                "margin_grad": "detached",
                "anchor_value": "positive",
            },
        }

        preset: Optional[str] = option(
            None,
            "'algorithm1': every choice the method text fixes set to our reconstruction of Algorithm 1 "
            "(docs/method.md §3: literal closed forms, GDA candidates, median anchor, the steep positive, boundary "
            "1), the open readings left to --adacl-anchor-prob, --adacl-margin-grad and --adacl-anchor-value; "
            "'paper': algorithm1 with the one reading of ours that trained without collapsing (closed-form "
            "margins, vanilla p_u, the positive as anchor, eps 1e-4; docs/adacl.md §5.0); 'first-reading': "
            "algorithm1 with our first reading (progressive p_u, detached margins, the owning row's positive as "
            "anchor), which collapses; options given with a preset that contradict it are refused",
            choices=(None, "algorithm1", "paper", "first-reading"),
        )
        mode: str = option(
            "calibrated",
            "'literal': Algorithm 1's closed forms exactly (docs/method.md §3.7); 'calibrated': our "
            "extension: m1 >= logit_scale and m2 >= 0, bounded and smoothed; the positive logit is below vanilla's "
            "for pairs less similar than the anchor and above it for the others (docs/adacl.md)",
            choices=MODES,
        )
        eps: float = option(
            1e-3, "literal mode: boundary error eps, the modulated probability at the boundary similarity is 1 - eps"
        )
        rho: float = option(
            0.1,
            "calibrated mode: eps = rho * (1 - p_vanilla(boundary)), the boundary error relative to vanilla "
            "CL's, in (0, 1); smaller sharpens more",
        )
        anchor_stat: str = option(
            "median",
            "statistic of the clone candidates' gaps s_ii - s_ij that picks the anchor (the paper's "
            "ablation: median best, max worst)",
            choices=adacl_math.ANCHOR_STATS,
        )
        salient: str = option(
            "max", "salient score of a query: s_ii - max (or mean) of its negatives", choices=adacl_math.SALIENT_KINDS
        )
        anchor_prob: str = option(
            "vanilla",
            "p_u of the anchor pair: its vanilla probability, or 'progressive': its probability under "
            "the previous step's margins",
            choices=adacl_math.ANCHOR_PROBS,
        )
        margin_grad: str = option(
            "detached",
            "literal mode: 'detached': m1, m2 are constants of each step; 'closed_form': the loss's "
            "gradient flows through the closed forms m1(a, log Z_u), m2(a, log Z_u) to the anchor row's "
            "features and the temperature (the selection stays non-differentiable; docs/method.md §3.7)",
            choices=adacl_math.MARGIN_GRADS,
        )
        anchor_value: str = option(
            "positive",
            "the anchor a of the closed forms: 'positive': the owning row's positive cosine s_uu; "
            "'gap': the selected candidate gap itself, as the method text names the anchor (docs/method.md §3.5)",
            choices=adacl_math.ANCHOR_VALUES,
        )
        prior_ratio: float = option(1.0, "GDA prior ratio pi_not_clone / pi_clone")
        boundary: float = option(
            1.0, "boundary similarity b of Algorithm 1 (the paper: 1), used by --adacl-boundary-kind fixed"
        )
        boundary_kind: str = option(
            "fixed",
            "'fixed': the boundary is --adacl-boundary; 'gap': b = a + d, the anchor plus the anchor's "
            "clone gap, so the sharpening follows how close clone negatives sit (docs/adacl.md)",
            choices=adacl_math.BOUNDARY_KINDS,
        )
        candidate_region: str = option(
            "upper",
            "clone candidates: 'gda' (posterior > 1/2, as the paper), 'upper' (its part above the "
            "not-clone mean), 'all' (no discovery: every negative; a control)",
            choices=adacl_math.CANDIDATE_REGIONS,
        )
        queue_size: int = option(
            0,
            "FIFO of past batches' (detached, gathered) features used as extra negatives, in the anchor "
            "statistics and in the denominator; 0 disables it",
        )
        bank_size: int = option(
            0,
            "momentum memory bank (docs/method.md §6): one image and one text feature per training sample; the "
            "M most recently written entries of samples outside the global batch are extra negatives, in the "
            "anchor statistics and in the denominator (the paper: 4096); needs --data-size; 0 disables it",
        )
        bank_momentum: float = option(
            0.99, "memory bank: a seen sample's entry moves as v <- normalize(m v + (1 - m) f), m this momentum"
        )
        modulate: bool = option(
            True, "apply the margins; --no-adacl-modulate computes and logs them but trains with ClipLoss exactly"
        )
        positive_grad: Optional[str] = option(
            None,
            "gradient of the modulated positive m1 (s - m2): 'fixed' (slope m1, none to logit_scale, as "
            "Algorithm 1 reads), 'scaled' (slope m1, keeps its gradient to logit_scale), 'balanced' (vanilla's "
            "gradient; the margins act as a per-row logit offset); default: 'fixed' in literal mode, 'balanced' in "
            "calibrated mode",
            choices=(None,) + adacl_math.POSITIVE_GRADS,
        )
        max_scale_ratio: float = option(4.0, "calibrated mode: upper bound of m1 / logit_scale (>= 1)")
        max_offset: float = option(1.0, "calibrated mode: upper bound of m2 (lower bound 0)")
        anchor_min: float = option(0.0, "calibrated mode: the anchor similarity is clamped to at least this")
        anchor_max: float = option(0.9, "calibrated mode: ... and at most this (below the boundary)")
        ema: float = option(
            0.9,
            "calibrated mode: momentum of the moving average of (m1/logit_scale, m2) across steps; 0 uses "
            "each batch's margins as they are",
        )
        std_floor: float = option(
            1e-4,
            "a reference row whose negatives' std (cosine units) is at most this is degenerate: the "
            "direction falls back to vanilla",
        )

        @property
        def keeps_sample_state(self) -> bool:
            return self.bank_size > 0

        def check(self) -> None:
            super().check()  # data_size, with the memory bank
            _check(0 < self.eps < 1, f"eps must be in (0, 1), got {self.eps}")
            _check(0 < self.rho < 1, f"rho must be in (0, 1), got {self.rho}")
            _check(self.prior_ratio > 0, f"prior_ratio must be > 0, got {self.prior_ratio}")
            _check(self.queue_size >= 0, f"queue_size must be >= 0, got {self.queue_size}")
            _check(self.bank_size >= 0, f"bank_size must be >= 0, got {self.bank_size}")
            _check(0 <= self.bank_momentum < 1, f"bank_momentum must be in [0, 1), got {self.bank_momentum}")
            _check(
                not (self.queue_size and self.bank_size),
                "queue_size and bank_size are two kinds of extra negatives; set one of them, not both",
            )
            _check(self.max_scale_ratio >= 1, f"max_scale_ratio must be >= 1, got {self.max_scale_ratio}")
            _check(self.max_offset >= 0, f"max_offset must be >= 0, got {self.max_offset}")
            _check(
                self.anchor_min <= self.anchor_max,
                f"need anchor_min <= anchor_max, got {self.anchor_min}, {self.anchor_max}",
            )
            _check(
                self.boundary_kind == "gap" or self.anchor_max < self.boundary,
                f"a fixed boundary must lie above anchor_max, got anchor_max {self.anchor_max}, "
                f"boundary {self.boundary}",
            )
            _check(0 <= self.ema < 1, f"ema must be in [0, 1), got {self.ema}")
            _check(self.std_floor >= 0, f"std_floor must be >= 0, got {self.std_floor}")
            if self.margin_grad == "closed_form":
                _check(
                    self.mode == "literal" and self.positive_grad in (None, "fixed"),
                    "margin_grad='closed_form' is a reading of Algorithm 1's closed forms: it needs mode='literal' "
                    f"and the steep positive (positive_grad 'fixed'), got mode={self.mode!r}, "
                    f"positive_grad={self.positive_grad!r}",
                )
                _check(
                    self.anchor_value == "positive",
                    "margin_grad='closed_form' differentiates the anchor row's positive cosine; with "
                    "anchor_value='gap' the gap's negative column is not tracked: use anchor_value='positive'",
                )

    keeps_state = True
    console_stats = ("m2", "anchor", "candidates", "fallbacks")  # fallbacks: cumulative
    # How often each guard and bound changed the margins, and how much the applied margins moved (docs/adacl.md).
    mechanism_stats = MechanismStats(
        "adacl",
        fractions=("modulated", "anchor_clamped", "scale_bounded", "offset_bounded"),
        spreads=("m1_over_scale", "m2", "anchor", "anchor_gap"),
    )
    plots = ("margins",)

    def __init__(self, options: Optional[Options] = None, dist: DistributedSetup = DistributedSetup()):
        super().__init__(options, dist)
        # Literal mode is Algorithm 1 as written, its gradient included.
        self.positive_grad = self.options.positive_grad or ("fixed" if self.options.mode == "literal" else "balanced")

        directions = len(DIRECTIONS)
        self.register_buffer("fallback_counts", torch.zeros(directions, len(FALLBACK_REASONS), dtype=torch.long))
        self.register_buffer("modulated_steps", torch.zeros(directions, dtype=torch.long))
        # (m1, m2) applied at the previous modulated step: `progressive` p_u.
        self.register_buffer("previous_margins", torch.zeros(directions, 2, dtype=torch.float64))
        self.register_buffer("previous_valid", torch.zeros(directions, dtype=torch.bool))
        # Moving average of (m1 / logit_scale, m2): calibrated mode's smoothing.
        self.register_buffer("ema_margins", torch.zeros(directions, 2, dtype=torch.float64))
        self.register_buffer("ema_valid", torch.zeros(directions, dtype=torch.bool))
        # The feature queue: allocated at the first step (the feature width is not known before).
        self.register_buffer("queue_image", torch.zeros(0, 0))
        self.register_buffer("queue_text", torch.zeros(0, 0))
        self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("queue_filled", torch.zeros((), dtype=torch.long))
        # Host copies of queue_ptr / queue_filled so the hot path never reads a tensor back.
        self._queue_ptr = 0
        self._queue_filled = 0
        # The memory bank: per sample, its features (allocated at the first write) and the order of its last write
        # (1, 2, ... across steps and batch positions; 0: never written).
        self.register_buffer("bank_image", torch.zeros(0, 0))
        self.register_buffer("bank_text", torch.zeros(0, 0))
        self.register_buffer("bank_stamp", torch.zeros(self._bank_rows, dtype=torch.long))
        # Host copies: the latest stamp, and how many samples have an entry while that may be fewer than a
        # step needs (so a full bank never reads a tensor back in the hot path).
        self._bank_writes = 0
        self._bank_entries = 0
        # Per direction, the features of the extra negative columns of this forward (the queue's or the bank's).
        self._extra_columns: Dict[str, torch.Tensor] = {}
        self._update_state = False

    @property
    def shares_logit_matmul(self) -> bool:
        """One matmul for both directions' logits (`ContrastiveLoss`), except with `modulate=False`, which trains
        with ClipLoss's exact code path, its second matmul included."""
        return self.options.modulate

    # --- state -------------------------------------------------------------------------------------

    def reset_state(self) -> None:
        """Back to a fresh loss: no margin history (progressive p_u, moving average), an empty
        queue and memory bank, counters at 0."""
        for buffer in self.buffers():
            buffer.zero_()
        self._queue_ptr = self._queue_filled = self._bank_writes = self._bank_entries = 0

    def journals(self) -> Dict[str, Any]:
        """`adacl_selection`: the choices between the fused and the eager selection passes that `auto` made in
        this process so far (`fused.decisions`: one per shape, timed on its first batch); none before the first."""
        choices = fused.decisions()
        return {"adacl_selection": choices} if choices else {}

    @property
    def _bank_rows(self) -> int:
        return self.options.data_size if self.options.bank_size else 0

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):
        options = self.options
        what = {
            "queue": ("queue", options.queue_size, f"queue_size is {options.queue_size}"),
            "bank": (
                "memory bank",
                self._bank_rows,
                f"this loss's holds {self._bank_rows} (data_size {options.data_size}, bank_size {options.bank_size})",
            ),
        }
        for name in ("queue_image", "queue_text", "bank_image", "bank_text", "bank_stamp"):
            saved = state_dict.get(prefix + name)
            kind, rows, expected = what[name.split("_")[0]]
            # Features are allocated at the first write (empty before it); the stamps always have their rows.
            if saved is not None and (saved.numel() or name == "bank_stamp") and saved.shape[0] != rows:
                raise ValueError(f"the checkpoint's AdaCL {kind} holds {saved.shape[0]} entries but {expected}")
            if saved is not None and saved.shape != getattr(self, name).shape:
                setattr(self, name, torch.zeros(saved.shape, dtype=saved.dtype, device=getattr(self, name).device))
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if not self.options.bank_size:  # a checkpoint written before the bank existed holds an empty bank
            missing_keys[:] = [key for key in missing_keys if not key.startswith(prefix + "bank_")]
        # Loading is not the hot path: reading these integers back once is fine.
        self._queue_ptr, self._queue_filled = int(self.queue_ptr), int(self.queue_filled)
        if self.options.bank_size:
            self._bank_writes, self._bank_entries = int(self.bank_stamp.max()), int((self.bank_stamp > 0).sum())

    # --- forward -----------------------------------------------------------------------------------

    def forward(
        self,
        image_features,
        text_features,
        logit_scale,
        logit_bias=None,
        *,
        sample_index=None,
        family=None,
        text_tokens=None,
        output_dict=False,
    ):
        if self.fallback_counts.device != image_features.device:
            self.to(image_features.device)  # the state follows the features (a Python-side check)
        # Only training steps stage a state update (applied by `commit`), not evaluation passes under no_grad.
        self._update_state = self.training and torch.is_grad_enabled()
        options = self.options
        if options.bank_size and sample_index is None:
            raise ValueError("adacl: the memory bank (bank_size > 0) needs each sample's index: pass sample_index")
        batch = self.build_batch(image_features, text_features, logit_scale, logit_bias, sample_index)
        batch_features = (batch.all_image_features.detach(), batch.all_text_features.detach())
        if self._update_state and (options.queue_size or options.bank_size):
            # Staged first, so that a refused commit writes nothing.
            self.stage_update(lambda: _check_finite_entries(*batch_features))
        batch = self._with_extra_negatives(batch)
        self.stats = {"mean_cosine": _mean_cross_modal_cosine(batch)}
        loss = self.symmetric_loss(batch)
        if self._update_state and options.queue_size:
            self.stage_update(lambda: self._enqueue(*batch_features))
        if self._update_state and options.bank_size:
            self.stage_update(lambda: self._write_bank(batch.sample_index, *batch_features))
        return self.wrap_output(loss, output_dict)

    def symmetric_loss(self, batch: GlobalBatch) -> torch.Tensor:
        """ClipLoss's average of the two directions' losses. Their selections read the logits only, without
        gradient, so on the CPU they run side by side, one thread each (`row_passes.side_by_side`), unless
        the ranks split the rows: the selection's collectives must then reach every rank in one order."""
        device = batch.logits_per_image.device
        apart = row_passes.can_run_side_by_side(device, len(DIRECTIONS)) and not batch.rows.split_across_ranks
        calls = [partial(self._select, batch, direction) for direction in DIRECTIONS]
        selections = row_passes.side_by_side(device, calls) if apart else [call() for call in calls]
        return (
            sum(
                self._direction_loss(batch, direction, selection)
                for direction, selection in zip(DIRECTIONS, selections)
            )
            / 2
        )

    def direction_loss(self, batch: GlobalBatch, direction: str) -> torch.Tensor:
        """One direction's loss, its selection made alone (`symmetric_loss` makes both at once)."""
        return self._direction_loss(batch, direction, self._select(batch, direction))

    @torch.no_grad()
    def _select(self, batch: GlobalBatch, direction: str) -> "DirectionSelection":
        """What `direction`'s logits say without gradient: its rows' summary and, with at least `MIN_ROWS`
        rows, its anchor (docs/method.md §3.1-3.5). Reads the batch and the options only.

        The text-to-image logits may be the image-to-text ones transposed (`ContrastiveLoss.build_batch`); the
        selection's row passes then read a contiguous copy, freed when it returns: on the transposed view a row's
        entries lie N apart, and the passes' chunks no longer stay in the cache they are sized for (row_passes.py)."""
        logits, labels, options = batch.logits(direction).detach().contiguous(), batch.labels, self.options
        summary = summarize_rows(logits, labels, with_mean=options.salient == "mean")
        if batch.all_image_features.shape[0] < MIN_ROWS:
            return DirectionSelection(summary, None)
        scale = batch.logit_scale.detach().double()
        return DirectionSelection(
            summary,
            select_anchor(
                logits,
                summary,
                labels,
                batch.rows,
                salient=options.salient,
                anchor_stat=options.anchor_stat,
                prior_ratio=options.prior_ratio,
                std_floor=options.std_floor * scale,
                region=options.candidate_region,
            ),
        )

    def _direction_loss(self, batch: GlobalBatch, direction: str, selected: "DirectionSelection") -> torch.Tensor:
        logits, labels = batch.logits(direction), batch.labels
        summary = selected.summary
        positive_features = batch.candidate_features(direction).index_select(0, labels)
        similarity = (batch.query_features(direction) * positive_features).sum(dim=-1)
        margins = self._margins(batch, direction, selected, similarity.detach())
        vanilla = batch.to_logits(similarity)
        # CLIP's loss on the same logits, beside the trained one: a loss far below it with recall at chance is
        # a positive logit that stopped tracking the features (docs/adacl.md §5).
        clip_terms = torch.logaddexp(summary.negative_lse, vanilla.detach()) - vanilla.detach()
        self.stats[f"{direction}/clip_loss"] = (
            batch.rows.sum(clip_terms.double().sum()) / batch.all_image_features.shape[0]
        )
        if not self.options.modulate:
            return super().direction_loss(batch, direction)
        m1, m2 = margins.m1, margins.m2
        if self.options.margin_grad == "closed_form":
            m1, m2 = self._differentiable_margins(batch, direction, margins)
            modulated_logit = adacl_math.closed_form_positive(similarity, m1, m2)
        else:
            modulated_logit = adacl_math.modulated_positive(similarity, batch.logit_scale, m1, m2, self.positive_grad)
        if batch.logit_bias is not None:
            modulated_logit = modulated_logit + batch.logit_bias
        # A fallback step uses vanilla's t * s_ii (from the features: gathering it from the logits
        # would cost an N x N scatter in the backward).
        positive = torch.where(margins.modulated, modulated_logit, vanilla)
        negative_lse = _NegativeLogSumExp.apply(logits, labels, summary.negative_lse)
        return (torch.logaddexp(negative_lse, positive) - positive).mean()

    def _differentiable_margins(
        self, batch: GlobalBatch, direction: str, margins: "DirectionMargins"
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """(m1, m2) of the `closed_form` reading: the values `_margins` applied, with the gradient of the closed
        forms through the anchor row's a and log Z_u (from the gathered features, so every rank differentiates
        the same global row) and the temperature. A fallback step gets vanilla's margins and no such gradient."""
        queries = batch.all_image_features if direction == "i2t" else batch.all_text_features
        row = margins.row.clamp(min=0)
        columns = batch.candidate_features(direction)
        if direction in self._extra_columns:  # log Z_u sums over the extra negatives too
            columns = torch.cat([columns, self._extra_columns[direction]])
        anchor, log_z_u = adacl_math.anchor_row_terms(
            queries.index_select(0, row.view(1))[0], columns, row, batch.logit_scale
        )
        modulated = margins.modulated
        zero = torch.zeros((), dtype=torch.float64, device=anchor.device)
        # Inputs of a fallback step are replaced, not only its outputs: the closed forms of a degenerate row may
        # be infinite, and a discarded infinite branch still poisons the gradient of torch.where.
        anchor = torch.where(modulated, adacl_math.with_gradient_of(margins.anchor, anchor), zero)
        log_z_u = torch.where(modulated, adacl_math.with_gradient_of(margins.log_z_u, log_z_u), zero)
        scale = batch.logit_scale.double()
        closed = self._closed_forms(DIRECTIONS.index(direction), anchor, log_z_u, scale, margins.gap)
        return torch.where(modulated, closed.m1, scale), torch.where(modulated, closed.m2, zero)

    # --- margins -----------------------------------------------------------------------------------

    @torch.no_grad()
    def _margins(
        self, batch: GlobalBatch, direction: str, selected: "DirectionSelection", similarity: torch.Tensor
    ) -> "DirectionMargins":
        """One direction's applied margins and the anchor they came from, all 0-dim and identical on every
        rank; logs stats."""
        summary, selection = selected
        index = DIRECTIONS.index(direction)
        logits, labels = batch.logits(direction), batch.labels
        scale = batch.logit_scale.detach().double()
        bias = 0.0 if batch.logit_bias is None else batch.logit_bias.detach().double()
        vanilla_m1, vanilla_m2 = adacl_math.vanilla_margins(batch.logit_scale)
        zero = torch.zeros((), dtype=torch.float64, device=logits.device)
        if selection is None:  # fewer than MIN_ROWS rows
            failed = torch.tensor([True, False, False, False], device=logits.device)
            self._record(
                index,
                failed,
                vanilla_m1,
                vanilla_m2,
                torch.zeros((), dtype=torch.bool, device=logits.device),
                {
                    "anchor": zero,
                    "anchor_used": zero,
                    "p_u": zero,
                    "log_z_u": zero,
                    "candidates": zero,
                    "anchor_gap": zero,
                    "closed_m1_over_scale": zero,
                    "closed_m2": zero,
                    "boundary": zero,
                    **{name: zero for name in BOUND_STATS},
                },
                scale,
            )
            no_row = torch.full((), -1, dtype=torch.long, device=logits.device)
            return DirectionMargins(
                vanilla_m1,
                vanilla_m2,
                torch.zeros((), dtype=torch.bool, device=logits.device),
                no_row,
                zero,
                zero,
                zero,
            )

        options = self.options
        gap = selection.gap.double() / scale  # cosine units
        anchor = (
            gap
            if options.anchor_value == "gap"
            else row_value_from_owner(similarity, selection.row, labels, batch.rows).double()
        )
        log_z_u = row_value_from_owner(summary.negative_lse, selection.row, labels, batch.rows).double() - bias
        margins = self._closed_forms(index, anchor, log_z_u, scale, gap)
        failed = torch.stack(
            [torch.zeros_like(margins.valid), selection.flat_reference, selection.num_candidates == 0, ~margins.valid]
        )
        modulated = ~failed.any()
        m1, m2 = margins.m1, margins.m2
        if options.mode == "calibrated" and options.ema > 0:
            m1, m2 = self._smoothed(index, m1 / scale, m2, modulated)
            m1 = m1 * scale
        m1 = torch.where(modulated, m1, vanilla_m1)
        m2 = torch.where(modulated, m2, vanilla_m2)
        self._record(
            index,
            failed,
            m1,
            m2,
            modulated,
            {
                "anchor": anchor,
                "anchor_used": margins.anchor,
                "p_u": margins.p_u,
                "log_z_u": log_z_u,
                "candidates": selection.num_candidates.double(),
                "anchor_gap": gap,
                "closed_m1_over_scale": margins.closed_m1 / scale,
                "closed_m2": margins.closed_m2,
                "boundary": margins.boundary,
                "anchor_clamped": margins.anchor_clamped,
                "scale_bounded": margins.scale_bounded,
                "offset_bounded": margins.offset_bounded,
            },
            scale,
        )
        return DirectionMargins(m1, m2, modulated, selection.row, anchor, log_z_u, gap)

    def _closed_forms(
        self, index: int, anchor: torch.Tensor, log_z_u: torch.Tensor, scale: torch.Tensor, gap: torch.Tensor
    ) -> adacl_math.Margins:
        """Literal or calibrated margins; `gap` (cosine) sets the boundary when boundary_kind is 'gap'."""
        options = self.options
        previous_m1: Optional[torch.Tensor] = None
        previous_m2: Optional[torch.Tensor] = None
        if options.anchor_prob == "progressive":
            # Before any modulated step, the previous margins are vanilla's (t, 0): p_u is vanilla.
            valid = self.previous_valid[index]
            previous_m1 = torch.where(valid, self.previous_margins[index, 0], scale)
            previous_m2 = torch.where(valid, self.previous_margins[index, 1], 0.0)
        gap_or_none = gap if options.boundary_kind == "gap" else None
        if options.mode == "literal":
            return adacl_math.literal_margins(
                anchor, log_z_u, scale, options.eps, options.boundary, previous_m1, previous_m2, gap=gap_or_none
            )
        return adacl_math.calibrated_margins(
            anchor,
            log_z_u,
            scale,
            options.rho,
            options.boundary,
            anchor_min=options.anchor_min,
            anchor_max=options.anchor_max,
            max_scale_ratio=options.max_scale_ratio,
            max_offset=options.max_offset,
            previous_m1=previous_m1,
            previous_m2=previous_m2,
            gap=gap_or_none,
        )

    def _smoothed(
        self, index: int, scale_ratio: torch.Tensor, m2: torch.Tensor, modulated: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Moving average of (m1/t, m2) over modulated steps; a fallback step leaves it untouched."""
        average = adacl_math.ema_update(
            self.ema_margins[index], torch.stack([scale_ratio, m2]), self.options.ema, self.ema_valid[index]
        )
        if self._update_state:
            kept = torch.where(modulated, average, self.ema_margins[index])

            def write_average() -> None:
                self.ema_margins[index] = kept
                self.ema_valid[index] |= modulated

            self.stage_update(write_average)
        return average[0], average[1]

    def _record(
        self,
        index: int,
        failed: torch.Tensor,
        m1: torch.Tensor,
        m2: torch.Tensor,
        modulated: torch.Tensor,
        diagnostics: Dict[str, torch.Tensor],
        scale: torch.Tensor,
    ) -> None:
        """Stage the counters' and the progressive state's update (training steps only) and fill `stats`
        (the counters as they are once this step is committed)."""
        fallback_counts = self.fallback_counts[index]
        if self._update_state:
            first_failure = torch.zeros_like(failed)
            first_failure[torch.argmax(failed.int()).view(1)] = True  # argmax: the first failing guard
            fallback_counts = fallback_counts + (first_failure & failed).long()
            margins = torch.where(modulated, torch.stack([m1, m2]), self.previous_margins[index])

            def write_counters_and_margins() -> None:
                self.fallback_counts[index] = fallback_counts
                self.modulated_steps[index] += modulated.long()
                self.previous_margins[index] = margins
                self.previous_valid[index] |= modulated

            self.stage_update(write_counters_and_margins)
        # The margins and everything computed from the anchor have no value at a fallback step (its inputs were
        # replaced, and vanilla's (t, 0) is not a margin the method chose): NaN, which the trainer leaves out of
        # metrics.jsonl and the dashboards. One stacked op instead of one per stat.
        anchored = {"m1": m1, "m2": m2, "m1_over_scale": m1 / scale, **diagnostics}
        candidates = anchored.pop("candidates")
        values = torch.stack([value.double() for value in anchored.values()])
        values = torch.where(modulated & values.isfinite(), values, torch.full_like(values, math.nan))
        stats = {
            **dict(zip(anchored, values.unbind())),
            "modulated": modulated.double(),
            "candidates": candidates,
            "fallbacks": fallback_counts.sum().double(),
        }
        stats.update({f"fallback_{reason}": fallback_counts[i].double() for i, reason in enumerate(FALLBACK_REASONS)})
        self.stats.update({f"{DIRECTIONS[index]}/{name}": value for name, value in stats.items()})

    # --- extra negatives: feature queue or memory bank ---------------------------------------------

    def _with_extra_negatives(self, batch: GlobalBatch) -> GlobalBatch:
        """Appends the queue's entries, or the bank's selected ones, as extra negative columns after the batch's
        N (docs/method.md §6)."""
        self._extra_columns = {}
        if self.options.bank_size:
            entries = self.bank_selection(batch.sample_index)
            image, text = self.bank_image[entries], self.bank_text[entries]
        elif self._queue_filled:
            image, text = self.queue_image[: self._queue_filled], self.queue_text[: self._queue_filled]
        else:
            return batch
        if not image.shape[0]:
            return batch
        # Copies: the backward needs these entries even when the caller commits (overwrites them) first.
        image = image.to(batch.image_features.dtype, copy=True)
        text = text.to(batch.text_features.dtype, copy=True)
        self._extra_columns = {"i2t": text, "t2i": image}
        extra_per_image = batch.logit_scale * batch.image_features @ text.T
        extra_per_text = batch.logit_scale * batch.text_features @ image.T
        if batch.logit_bias is not None:
            extra_per_image = extra_per_image + batch.logit_bias
            extra_per_text = extra_per_text + batch.logit_bias
        return replace(
            batch,
            logits_per_image=torch.cat([batch.logits_per_image, extra_per_image], dim=1),
            logits_per_text=torch.cat([batch.logits_per_text, extra_per_text], dim=1),
        )

    def bank_selection(self, sample_index: torch.Tensor) -> torch.Tensor:
        """The samples whose bank entries are this step's extra negatives: the bank_size most recently written
        ones outside the global batch `sample_index` (so no positive is its own negative), most recent first;
        identical on every rank."""
        stamps = self.bank_stamp.index_fill(0, sample_index.to(self.bank_stamp.device), 0)
        if not self._bank_writes:
            return stamps[:0]
        recent = stamps.topk(min(self.options.bank_size, stamps.shape[0]))
        if self._bank_entries < self.options.bank_size + sample_index.shape[0]:
            # Fewer entries than a full step may qualify (the first steps, or data smaller than bank_size + N):
            # one read of how many do.
            return recent.indices[: int((recent.values > 0).sum())]
        return recent.indices

    @torch.no_grad()
    def _write_bank(
        self, sample_index: torch.Tensor, image_features: torch.Tensor, text_features: torch.Tensor
    ) -> None:
        """v <- normalize(m v + (1 - m) f) for every sample of the global batch (a sample drawn twice: its last
        occurrence), stamped in batch order; a first write stores f (v is 0). Identical on every rank."""
        if self.bank_image.shape != (self._bank_rows, image_features.shape[1]):
            # At least float32: a half-precision entry could not move by (1 - m) f at m = 0.99.
            dtype = torch.promote_types(image_features.dtype, torch.float32)
            self.bank_image = image_features.new_zeros(self._bank_rows, image_features.shape[1], dtype=dtype)
            self.bank_text = text_features.new_zeros(self._bank_rows, text_features.shape[1], dtype=dtype)
        index, winner = last_occurrence(sample_index.to(self.bank_stamp.device))
        momentum = self.options.bank_momentum
        for bank, features in ((self.bank_image, image_features), (self.bank_text, text_features)):
            moved = momentum * bank[index] + (1 - momentum) * features[winner].to(bank.dtype)
            bank[index] = F.normalize(moved, dim=-1)
        self.bank_stamp[index] = self._bank_writes + 1 + winner
        self._bank_writes += sample_index.shape[0]
        if self._bank_entries < min(self._bank_rows, self.options.bank_size + sample_index.shape[0]):
            self._bank_entries = int((self.bank_stamp > 0).sum())  # commit, not the loss call: once per step

    @torch.no_grad()
    def _enqueue(self, image_features: torch.Tensor, text_features: torch.Tensor) -> None:
        """Writes the global batch's features over the oldest entries (identical on every rank)."""
        queue_size = self.options.queue_size
        if self.queue_image.shape != (queue_size, image_features.shape[1]):
            self.queue_image = image_features.new_zeros(queue_size, image_features.shape[1])
            self.queue_text = text_features.new_zeros(queue_size, text_features.shape[1])
        count = min(image_features.shape[0], queue_size)
        slots = (self._queue_ptr + torch.arange(count, device=image_features.device)) % queue_size
        self.queue_image.index_copy_(0, slots, image_features[-count:].to(self.queue_image.dtype))
        self.queue_text.index_copy_(0, slots, text_features[-count:].to(self.queue_text.dtype))
        self._queue_ptr = (self._queue_ptr + count) % queue_size
        self._queue_filled = min(self._queue_filled + count, queue_size)
        self.queue_ptr.fill_(self._queue_ptr)
        self.queue_filled.fill_(self._queue_filled)


@torch.no_grad()
def _mean_cross_modal_cosine(batch: GlobalBatch) -> torch.Tensor:
    """Mean image-text similarity over every pair of the global batch (queue excluded), from the feature sums:
    the common mode whose drift is the collapse of docs/adacl.md §5."""
    total = batch.all_image_features.sum(dim=0).double() @ batch.all_text_features.sum(dim=0).double()
    return total / batch.all_image_features.shape[0] ** 2


def _check_finite_entries(image_features: torch.Tensor, text_features: torch.Tensor) -> None:
    """Non-finite features would poison the queue's next queue_size steps, or the bank's entries for good: refuse
    to commit them."""
    if not bool(torch.isfinite(image_features).all() & torch.isfinite(text_features).all()):
        raise ValueError(
            "adacl: this step's features are not finite and cannot enter the feature queue or memory "
            "bank; do not commit a step whose loss is not finite (the trainer skips such steps without "
            "committing)"
        )


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
