"""AdaCL's steps as the method states them (docs/method.md §3.1-3.7 and §4): dense, on one process, in
probabilities where the paper has them. The loss never calls these: it computes the same quantities across
ranks (`open_clip_adacl.selection`) and through the log-odds forms of `open_clip_adacl.adacl_math`; the tests
check it against them.
"""

from typing import Optional, Tuple

import torch

from open_clip_adacl.adacl_math import (
    ANCHOR_STATS,
    SALIENT_KINDS,
    Scalar,
    anchor_log_odds,
    calibrated_eps_log_odds,
    margins_from_log_odds,
    negative_mask,
)


def _f64(value: Scalar) -> torch.Tensor:
    return torch.as_tensor(value, dtype=torch.float64)


def salient_scores(similarities: torch.Tensor, positive_col: torch.Tensor, kind: str = "max") -> torch.Tensor:
    """How far each query's positive stands out (section 3.1; Eq. 7's formula was not recovered).

    `max`: s_ii - max_{j != i} s_ij. `mean`: s_ii - mean_{j != i} s_ij. Shapes: rows x C -> rows.
    The loss: `selection.select_anchor`, from `summarize_rows`' positives and negatives' max or mean.
    """
    if kind not in SALIENT_KINDS:
        raise ValueError(f"salient must be one of {SALIENT_KINDS}, got {kind!r}")
    negatives = negative_mask(*similarities.shape, positive_col)
    positive = similarities.gather(1, positive_col[:, None]).squeeze(1)
    if kind == "max":
        other = similarities.masked_fill(~negatives, float("-inf")).amax(dim=1)
    else:
        other = torch.where(negatives, similarities, 0).sum(dim=1) / negatives.sum(dim=1)
    return positive - other


def reference_rows(salient: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(most salient row, least salient row) (section 3.2), ties to the lowest index.

    The most salient row's negatives form S_sln (class "not clone"); the least salient row's
    negatives form S_cln (class "clone"). Shapes: rows -> two 0-dim int64.
    The loss: `selection.global_reference_rows` (across the ranks that share the rows).
    """
    return torch.argmax(salient), torch.argmin(salient)  # both return the first extreme index


def positive_gaps(similarities: torch.Tensor, positive_col: torch.Tensor) -> torch.Tensor:
    """d_ij = s_ii - s_ij (section 3.5): how far each entry sits below its row's positive. rows x C.
    The loss: `selection.select_anchor` reads them off the logits."""
    positive = similarities.gather(1, positive_col[:, None])
    return positive - similarities


def anchor_statistic(
    gaps: torch.Tensor, candidates: torch.Tensor, stat: str = "median"
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The anchor element of the candidate gaps (section 3.5): (gap value, row u, column).

    `median` is the lower median ((K-1)//2-th smallest of the K candidate gaps, an actual element);
    `min` and `max` the extremes; `mean` picks the candidate whose gap is nearest to the mean gap
    (float64 distances). Among several qualifying elements the lowest (row, column) wins. This is
    the dense single-process definition; `selection.py` computes the same element across ranks
    without materialising the candidate list. Needs at least one candidate.
    """
    if stat not in ANCHOR_STATS:
        raise ValueError(f"anchor_stat must be one of {ANCHOR_STATS}, got {stat!r}")
    flat_index = candidates.flatten().nonzero().squeeze(1)  # row-major, so in (row, column) order
    values = gaps.flatten()[flat_index]
    if stat == "mean":
        distance = (values.double() - values.double().mean()).abs()
        position = torch.argmin(distance)  # first minimum = lowest index
    else:
        if stat == "median":
            target = torch.sort(values).values[(values.numel() - 1) // 2]
        else:
            target = values.min() if stat == "min" else values.max()
        position = torch.argmax((values == target).int())  # first element equal to the target
    element = flat_index[position]
    return values[position], element // gaps.shape[1], element % gaps.shape[1]


def anchor_probability(
    anchor: Scalar,
    log_z_u: Scalar,
    scale: Scalar,
    previous_m1: Optional[Scalar] = None,
    previous_m2: Optional[Scalar] = None,
) -> torch.Tensor:
    """p_u (section 3.6): the sigmoid of `anchor_log_odds`, which the loss uses instead (exact near 1)."""
    return torch.sigmoid(anchor_log_odds(anchor, log_z_u, scale, previous_m1, previous_m2))


def modulated_probability(s: Scalar, m1: Scalar, m2: Scalar, log_z_u: Scalar) -> torch.Tensor:
    """p^(s) = exp(m1 (s - m2)) / (exp(m1 (s - m2)) + Z_u): the anchor row's positive probability
    when its positive logit is m1 (s - m2) (section 3.7, Eq. 4). Float64. The two conditions
    the closed forms meet are stated with it: p^(a) = p_u and p^(b) = 1 - eps."""
    return torch.sigmoid(_f64(m1) * (_f64(s) - _f64(m2)) - _f64(log_z_u))


def margins_from_anchor(
    anchor: Scalar, p_u: Scalar, log_z_u: Scalar, eps: Scalar, boundary: Scalar = 1.0
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(m1, m2) from Algorithm 1 (section 3.7) given the anchor a = s_uu, its probability p_u,
    log Z_u and the boundary error eps; 0-dim float64 tensors. The loss: `margins_from_log_odds`."""
    return margins_from_log_odds(anchor, torch.logit(_f64(p_u)), log_z_u, torch.logit(_f64(eps)), boundary)


def calibrated_eps(log_z_u: Scalar, scale: Scalar, rho: Scalar, boundary: Scalar = 1.0) -> torch.Tensor:
    """eps = rho (1 - p_vanilla(b)) (section 4), float64 0-dim. The loss: `calibrated_eps_log_odds`."""
    return torch.sigmoid(calibrated_eps_log_odds(log_z_u, scale, rho, boundary))
