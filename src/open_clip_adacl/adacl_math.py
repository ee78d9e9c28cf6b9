"""AdaCL's math as small pure functions (docs/method.md §3, §4, §4b; our extensions: docs/adacl.md §4).

Conventions. `similarities` is a rows x C matrix whose row `i` holds one query's scores against C
candidates; `positive_col` (rows,) is the column of each row's positive and every other column is
a negative. Scores may be cosines or logits `t * cos + bias`: every selection step (salient scores,
reference rows, the GDA candidate set, the order of the gaps) is invariant under such a positive
affine map, which is why `selection.py` can work on the logits it already has. Scalars are 0-dim
tensors; the closed forms are evaluated in float64. Nothing here communicates across ranks
(`selection.py` does) or keeps state across steps (the loss does). The steps the loss computes another
way (across ranks, or in log-odds) are also written in the method's own form, for the tests to check the
loss against: tests/helpers/adacl_reference.py.

Section numbers refer to docs/method.md; "Eq." to the paper (Pan, Dong, Yang, ICLR 2025).
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple, Union

import torch
import torch.nn.functional as F

SALIENT_KINDS = ("max", "mean")
ANCHOR_STATS = ("median", "mean", "min", "max")
ANCHOR_PROBS = ("vanilla", "progressive")
CANDIDATE_REGIONS = ("gda", "upper", "all")
BOUNDARY_KINDS = ("fixed", "gap")
MARGIN_GRADS = ("detached", "closed_form")
ANCHOR_VALUES = ("positive", "gap")

Scalar = Union[float, torch.Tensor]


def _f64(value: Scalar) -> torch.Tensor:
    return torch.as_tensor(value, dtype=torch.float64)


def negative_mask(num_rows: int, num_cols: int, positive_col: torch.Tensor) -> torch.Tensor:
    """rows x C bool, True where the entry is a negative (every column but the row's positive)."""
    cols = torch.arange(num_cols, device=positive_col.device)
    return cols[None, :] != positive_col[:, None]


# --- 3.3-3.4: Gaussian discriminant analysis and the clone candidates --------------------------


def gaussian_fit(
    values: torch.Tensor, weights: Optional[torch.Tensor] = None, std_floor: Scalar = 0.0
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Maximum-likelihood 1-D Gaussian (mean, population std) of `values` (section 3.3), in float64.

    `weights` (same shape, 0/1) selects the entries, e.g. a row's negatives. The std is floored at
    `std_floor` so the posterior stays finite; a fit whose std equals the floor is flat, and the
    loss treats it as a degenerate batch (guard "flat_reference").
    """
    values = values.double()
    weights = torch.ones_like(values) if weights is None else weights.double()
    count = weights.sum()
    mean = (weights * values).sum() / count
    variance = (weights * (values - mean) ** 2).sum() / count
    return mean, torch.maximum(variance.sqrt(), _f64(std_floor).to(values.device))


def gda_log_odds(
    s: torch.Tensor, mu_c: Scalar, sigma_c: Scalar, mu_n: Scalar, sigma_n: Scalar, prior_ratio: Scalar = 1.0
) -> torch.Tensor:
    """log p(C|s) - log p(not C|s) for two 1-D Gaussians (section 3.3, Eq. 8-9), elementwise.

    log-odds = -log(pi_n/pi_c) - log sigma_c + log sigma_n - (s-mu_c)^2/(2 sigma_c^2)
               + (s-mu_n)^2/(2 sigma_n^2).
    Computed in float64 and in log space, so nothing is exponentiated; returned in s's dtype.
    """
    s64 = s.double()
    z_c = (s64 - _f64(mu_c)) / _f64(sigma_c)
    z_n = (s64 - _f64(mu_n)) / _f64(sigma_n)
    log_odds = (
        -torch.log(_f64(prior_ratio))
        - torch.log(_f64(sigma_c))
        + torch.log(_f64(sigma_n))
        + 0.5 * (z_n - z_c) * (z_n + z_c)
    )
    return log_odds.to(s.dtype)


def gda_posterior(
    s: torch.Tensor, mu_c: Scalar, sigma_c: Scalar, mu_n: Scalar, sigma_n: Scalar, prior_ratio: Scalar = 1.0
) -> torch.Tensor:
    """p(C|s) = 1 / (1 + (pi_n/pi_c)(sigma_c/sigma_n) exp[(s-mu_c)^2/(2 sigma_c^2) - (s-mu_n)^2/(2 sigma_n^2)])

    (section 3.3, Eq. 9; `prior_ratio` = pi_n / pi_c). The sigmoid of `gda_log_odds`: no overflow
    for any s, in s's dtype, same shape as s.
    """
    return torch.sigmoid(gda_log_odds(s.double(), mu_c, sigma_c, mu_n, sigma_n, prior_ratio)).to(s.dtype)


def gda_log_odds_coefficients(
    mu_c: Scalar, sigma_c: Scalar, mu_n: Scalar, sigma_n: Scalar, prior_ratio: Scalar = 1.0
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(A, B, C) with gda_log_odds(s) = A s^2 + B s + C, in float64.

    The expanded quadratic lets the selection test millions of entries with one Horner evaluation;
    it differs from `gda_log_odds` only by rounding.
    """
    inv_c = 0.5 / _f64(sigma_c) ** 2
    inv_n = 0.5 / _f64(sigma_n) ** 2
    mu_c, mu_n = _f64(mu_c), _f64(mu_n)
    quadratic = inv_n - inv_c
    linear = 2 * (mu_c * inv_c - mu_n * inv_n)
    constant = (
        -torch.log(_f64(prior_ratio))
        - torch.log(_f64(sigma_c))
        + torch.log(_f64(sigma_n))
        + mu_n**2 * inv_n
        - mu_c**2 * inv_c
    )
    return quadratic, linear, constant


def positive_quadratic_intervals(
    quadratic: Scalar, linear: Scalar, constant: Scalar, lower: Optional[Scalar] = None
) -> torch.Tensor:
    """{s : A s^2 + B s + C > 0} (and s > `lower`) as the union of two open intervals, float64 (2, 2).

    Row k is (a_k, b_k), the interval a_k < s < b_k; a_k >= b_k is empty, and the bounds may be
    infinite. Non-finite coefficients give the empty set. The roots are computed in float64 with
    the cancellation-free formula, so the set differs from the sign of the dense `gda_log_odds`
    only for s within float64 rounding of a root. Testing two intervals costs a few comparisons
    per entry, which is what lets the selection scan millions of entries cheaply.
    """
    a, b, c = _f64(quadratic), _f64(linear), _f64(constant)
    inf = torch.full_like(a, float("inf"))
    minus_inf = -inf
    discriminant = b * b - 4 * a * c
    q = -0.5 * (b + torch.copysign(discriminant.clamp(min=0).sqrt(), b))
    # q = 0 only if b = 0 and the discriminant is 0, i.e. c = 0: a double root at 0.
    first, second = q / a, torch.where(q == 0, torch.zeros_like(q), c / q)
    low, high = torch.minimum(first, second), torch.maximum(first, second)
    real_roots = discriminant >= 0
    # Each case as (a_0, b_0, a_1, b_1). a > 0: outside the roots (everything without real roots); a < 0:
    # between them (nothing).
    outside = torch.stack([minus_inf, torch.where(real_roots, low, inf), torch.where(real_roots, high, inf), inf])
    between = torch.stack([low, torch.where(real_roots, high, minus_inf), inf, minus_inf])
    # a = 0: the line b s + c > 0 (everything or nothing when b = 0 too).
    root, falling = -c / b, b < 0
    rising_start = torch.where(b > 0, root, torch.where(falling | (c > 0), minus_inf, inf))
    line = torch.stack([rising_start, torch.where(falling, root, inf), inf, minus_inf])
    intervals = torch.where(a > 0, outside, torch.where(a < 0, between, line)).view(2, 2)
    parameters = [a, b, c]
    if lower is not None:
        parameters.append(_f64(lower).to(a.device))
        intervals = torch.maximum(intervals, torch.stack([parameters[-1], minus_inf]))  # a_k raised to `lower`
    finite = torch.isfinite(torch.stack(parameters)).all()
    empty = torch.stack([inf, minus_inf]).expand(2, 2)  # made on the device: a tensor from host values would wait
    return torch.where(finite, intervals, empty)


def clone_candidate_mask(
    similarities: torch.Tensor,
    positive_col: torch.Tensor,
    mu_c: Scalar,
    sigma_c: Scalar,
    mu_n: Scalar,
    sigma_n: Scalar,
    prior_ratio: Scalar = 1.0,
    region: str = "gda",
) -> torch.Tensor:
    """S~ = {(i, j): j negative of i, p(C|s_ij) > 1/2} (section 3.4). rows x C -> rows x C bool.

    Uses log-odds > 0, which is the same set as posterior > 1/2 without the sigmoid's rounding.
    `region` (docs/adacl.md §4): `gda` is that set as written; with unequal variances it is two-sided
    (the quadratic log-odds is also positive far *below* both means). `upper` keeps only its part
    above the not-clone mean, s > mu_n: the side where clone negatives (close to the positive)
    live. `all` skips the discovery (every negative is a candidate): the control that tells
    whether the GDA matters.
    """
    if region not in CANDIDATE_REGIONS:
        raise ValueError(f"candidate_region must be one of {CANDIDATE_REGIONS}, got {region!r}")
    mask = negative_mask(*similarities.shape, positive_col)
    if region == "all":
        return mask
    mask &= gda_log_odds(similarities, mu_c, sigma_c, mu_n, sigma_n, prior_ratio) > 0
    if region == "upper":
        mask &= similarities.double() > _f64(mu_n).to(similarities.device)
    return mask


# --- 3.6: the anchor probability ----------------------------------------------------------------


def anchor_log_odds(
    anchor: Scalar,
    log_z_u: Scalar,
    scale: Scalar,
    previous_m1: Optional[Scalar] = None,
    previous_m2: Optional[Scalar] = None,
) -> torch.Tensor:
    """logit(p_u) for the anchor pair (section 3.6), float64 0-dim.

    `vanilla` (no previous margins): p_u = exp(t a) / (exp(t a) + Z_u), so logit(p_u) = t a - log Z_u.
    `progressive`: the anchor's probability under the previous step's margins,
    logit(p_u) = m1' (a - m2') - log Z_u. Z_u = sum_{k != u} exp(t s_uk) is the anchor row's
    negative sum (without any logit bias). Working with the log-odds keeps p_u near 1 exact.
    """
    anchor, log_z_u = _f64(anchor), _f64(log_z_u)
    if previous_m1 is None:
        return _f64(scale) * anchor - log_z_u
    return _f64(previous_m1) * (anchor - _f64(previous_m2)) - log_z_u


# --- 3.7: the margins in closed form ------------------------------------------------------------


def margins_from_log_odds(
    anchor: Scalar, anchor_log_odds: Scalar, log_z_u: Scalar, eps_log_odds: Scalar, boundary: Scalar = 1.0
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 1's closed forms with p_u and eps given by their log-odds (section 3.7, Eq. 4 and 6).

    m1 = (logit(eps) + logit(p_u)) / (a - b), i.e. log(eps p_u / ((1-eps)(1-p_u))) / (a - b);
    m2 = a - (logit(p_u) + log Z_u) / m1,       i.e. a + log((1-p_u) / (p_u Z_u)) / m1.
    The unique line with p^(a) = p_u and p^(b) = 1 - eps. Float64 0-dim; may be non-finite or
    m1 <= 0 for degenerate inputs (see `margins_valid`).
    """
    anchor, boundary = _f64(anchor), _f64(boundary)
    anchor_log_odds = _f64(anchor_log_odds)
    m1 = (_f64(eps_log_odds) + anchor_log_odds) / (anchor - boundary)
    m2 = anchor - (anchor_log_odds + _f64(log_z_u)) / m1
    return m1, m2


def margins_valid(
    m1: torch.Tensor,
    m2: torch.Tensor,
    anchor: Scalar,
    anchor_log_odds: Scalar,
    eps_log_odds: Scalar,
    boundary: Scalar = 1.0,
) -> torch.Tensor:
    """Guard "bad_margins" (section 3, Guards): the closed forms are usable.

    False when m1 or m2 is non-finite, m1 <= 0, the anchor is not below the boundary, or
    p_u >= 1 - eps (the anchor already beats the boundary requirement). 0-dim bool.
    """
    return (
        torch.isfinite(m1)
        & torch.isfinite(m2)
        & (m1 > 0)
        & (_f64(anchor) < _f64(boundary))
        & (_f64(anchor_log_odds) + _f64(eps_log_odds) < 0)
    )


# --- 4 and 4b: the calibrated variant and its bounds --------------------------------------------


def calibrated_eps_log_odds(log_z_u: Scalar, scale: Scalar, rho: Scalar, boundary: Scalar = 1.0) -> torch.Tensor:
    """logit(eps) for eps = rho (1 - p_vanilla(b)) (section 4): the boundary error relative to the
    vanilla one, 1 - p_vanilla(b) = Z_u / (exp(t b) + Z_u). In log space; float64 0-dim.

    With vanilla p_u this gives m1 = t + [log(1/rho) + log(1 + (1-rho) Z_u e^{-tb}) ] / (b - a) >= t,
    and m2 = a (1 - t/m1): about t + log(1/rho)/(b - a) when Z_u << exp(t b).
    """
    log_eps = torch.log(_f64(rho)) + F.logsigmoid(_f64(log_z_u) - _f64(scale) * _f64(boundary))
    return log_eps - torch.log1p(-torch.exp(log_eps))


def gap_boundary(anchor: Scalar, gap: Scalar, min_gap: float = 1e-3) -> torch.Tensor:
    """Boundary b = a + d for the `gap` boundary (docs/adacl.md §4, a project extension): the similarity the
    anchor row's positive would reach if it cleared its clone negative by the anchor gap d once more.

    With a fixed b = 1 the calibrated slope is m1/t = 1 + log(1/rho) / (t (1 - a)), which depends on
    how close the anchor sits to 1, not on the clones. With b = a + d it is 1 + log(1/rho) / (t d):
    strongest when clone negatives sit close to the positive (small d), vanilla as they move away.
    A gap at or below `min_gap` (clones above the positive) is raised to it: maximal sharpening,
    which the m1 bound then caps. Float64 0-dim.
    """
    return _f64(anchor) + torch.clamp(_f64(gap), min=min_gap)


def clamp_anchor(anchor: Scalar, anchor_min: float, anchor_max: float) -> torch.Tensor:
    """Guard "anchor clamp" (section 4b): keeps a in [anchor_min, anchor_max].

    An anchor near the boundary b makes m1 ~ 1/(b - a) explode; a negative anchor makes m2 < 0.
    Costs fidelity: the closed forms use the clamped anchor whenever the real one is outside.
    """
    return torch.clamp(_f64(anchor), anchor_min, anchor_max)


def bound_scale(m1: torch.Tensor, scale: Scalar, max_scale_ratio: float) -> torch.Tensor:
    """Guard "m1 bounds" (sections 4 and 4b): m1 in [t, max_scale_ratio * t].

    The lower bound keeps the positive's slope at least vanilla's; the upper bound stops the
    model from buying loss by moving the anchor (4b: m1 / t > 1.5 collapses or stalls training).
    Costs fidelity: p^(b) = 1 - eps no longer holds when a bound is active.
    """
    scale = _f64(scale)
    return torch.minimum(torch.maximum(m1, scale), max_scale_ratio * scale)


def anchor_offset(anchor: Scalar, anchor_logit: Scalar, m1: torch.Tensor) -> torch.Tensor:
    """m2 that keeps the anchor condition p^(a) = p_u for a given m1: m2 = a - z_u / m1, where
    z_u = logit(p_u) + log Z_u is the anchor pair's reference logit (t a for vanilla p_u)."""
    return _f64(anchor) - _f64(anchor_logit) / m1


def bound_offset(m2: torch.Tensor, max_offset: float) -> torch.Tensor:
    """Guard "m2 bounds" (section 4b): m2 in [0, max_offset]; m2 < 0 would be a negative margin
    (a bonus for the positive), a large m2 pins the loss. Costs the anchor condition when active."""
    return torch.clamp(m2, 0.0, max_offset)


def ema_update(average: torch.Tensor, value: torch.Tensor, momentum: float, initialized: torch.Tensor) -> torch.Tensor:
    """Smoothing across steps (section 4b): momentum * average + (1 - momentum) * value, or `value`
    itself on the first update. Damps the feedback loop between the margins and the batch they are
    computed on; costs the per-batch closed-form conditions. Same shapes in and out."""
    return torch.where(initialized, momentum * average + (1 - momentum) * value, value)


class Margins(NamedTuple):
    """One direction's margins for one batch (float64 0-dim tensors)."""

    m1: torch.Tensor  # applied scale of the positive logit
    m2: torch.Tensor  # applied offset of the positive similarity
    closed_m1: torch.Tensor  # Algorithm 1's m1 before any bound (diagnostic)
    closed_m2: torch.Tensor
    anchor: torch.Tensor  # the anchor the closed forms used (clamped in calibrated mode)
    p_u: torch.Tensor
    valid: torch.Tensor  # bool: the closed forms passed `margins_valid`
    boundary: torch.Tensor  # the boundary b the closed forms used
    # Which of section 4b's bounds changed the result (bool; always False in literal mode).
    anchor_clamped: torch.Tensor
    scale_bounded: torch.Tensor
    offset_bounded: torch.Tensor


def literal_margins(
    anchor: Scalar,
    log_z_u: Scalar,
    scale: Scalar,
    eps: float,
    boundary: Scalar = 1.0,
    previous_m1: Optional[Scalar] = None,
    previous_m2: Optional[Scalar] = None,
    gap: Optional[Scalar] = None,
) -> Margins:
    """Section 3.7 exactly: Algorithm 1's m1, m2 with a fixed eps and boundary b (with `gap` given,
    b = `gap_boundary(a, gap)`, docs/adacl.md §4)."""
    # On the anchor's device: the boundary is returned in `Margins` and stacked with the other diagnostics.
    boundary = _f64(boundary).to(_f64(anchor).device) if gap is None else gap_boundary(anchor, gap)
    log_odds = anchor_log_odds(anchor, log_z_u, scale, previous_m1, previous_m2)
    eps_log_odds = torch.logit(_f64(eps))
    m1, m2 = margins_from_log_odds(anchor, log_odds, log_z_u, eps_log_odds, boundary)
    valid = margins_valid(m1, m2, anchor, log_odds, eps_log_odds, boundary)
    inactive = torch.zeros((), dtype=torch.bool, device=m1.device)
    return Margins(m1, m2, m1, m2, _f64(anchor), torch.sigmoid(log_odds), valid, boundary, inactive, inactive, inactive)


def calibrated_margins(
    anchor: Scalar,
    log_z_u: Scalar,
    scale: Scalar,
    rho: float,
    boundary: Scalar = 1.0,
    *,
    anchor_min: float,
    anchor_max: float,
    max_scale_ratio: float,
    max_offset: float,
    previous_m1: Optional[Scalar] = None,
    previous_m2: Optional[Scalar] = None,
    gap: Optional[Scalar] = None,
) -> Margins:
    """Section 4's calibrated variant with section 4b's bounds (a project extension, not the paper).

    1. clamp the anchor (`clamp_anchor`); 2. the boundary: `boundary`, or with `gap` given,
    `gap_boundary(a, gap)` (docs/adacl.md §4); 3. eps = rho (1 - p_vanilla(b)) (`calibrated_eps_log_odds`);
    4. Algorithm 1's closed forms; 5. m1 bounded to [t, max_scale_ratio t] (`bound_scale`);
    6. m2 re-derived from the anchor condition with the bounded m1 (`anchor_offset`), then bounded
    to [0, max_offset] (`bound_offset`). With vanilla p_u and anchor_min >= 0 this guarantees
    m1 >= t and m2 >= 0: the positive logit m1 (s - m2) = t s + (m1 - t)(s - a) is then below
    vanilla's for s < a and above it for s > a (section 4).
    """
    clamped = clamp_anchor(anchor, anchor_min, anchor_max)
    boundary = _f64(boundary).to(clamped.device) if gap is None else gap_boundary(clamped, gap)
    log_odds = anchor_log_odds(clamped, log_z_u, scale, previous_m1, previous_m2)
    eps_log_odds = calibrated_eps_log_odds(log_z_u, scale, rho, boundary)
    closed_m1, closed_m2 = margins_from_log_odds(clamped, log_odds, log_z_u, eps_log_odds, boundary)
    valid = margins_valid(closed_m1, closed_m2, clamped, log_odds, eps_log_odds, boundary)
    m1 = bound_scale(closed_m1, scale, max_scale_ratio)
    unbounded_m2 = anchor_offset(clamped, log_odds + _f64(log_z_u), m1)
    m2 = bound_offset(unbounded_m2, max_offset)
    return Margins(
        m1,
        m2,
        closed_m1,
        closed_m2,
        clamped,
        torch.sigmoid(log_odds),
        valid,
        boundary,
        clamped != _f64(anchor),
        m1 != closed_m1,
        m2 != unbounded_m2,
    )


# --- 3.8: the loss's positive logit -------------------------------------------------------------

POSITIVE_GRADS = ("scaled", "fixed", "balanced")


def modulated_positive(
    similarity: torch.Tensor, scale: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor, positive_grad: str = "balanced"
) -> torch.Tensor:
    """The positive logit m1 (s - m2) (section 3.8), margins without gradient.

    All three forms have that value; they differ in the gradient the positive passes on:
    - `fixed`: m1 is a constant, as Algorithm 1 reads: slope m1 to s, nothing to logit_scale t.
    - `scaled`: t * (m1 / t).detach() * (s - m2): slope m1 to s, and the positive keeps its
      gradient to t (section 4b: without it only the negatives pull on t and it falls).
    - `balanced`: t * s + (m1 (s - m2) - t * s).detach(): vanilla CL's gradient (slope t to s,
      s to t). The margins become a per-row offset of the positive logit, lower than vanilla below
      the anchor and higher above it, so the softmax's pull on a positive stays equal to its push on
      the negatives (with slope m1 > t the pull wins, and every embedding crowds together).
    Shapes: similarity (rows,), scalars 0-dim -> rows.
    """
    m2 = m2.detach().to(similarity.dtype)
    if positive_grad == "fixed":
        return m1.detach().to(similarity.dtype) * (similarity - m2)
    if positive_grad == "scaled":
        ratio = (m1.detach().double() / scale.detach().double()).to(similarity.dtype)
        return scale * ratio * (similarity - m2)
    if positive_grad == "balanced":
        vanilla = scale * similarity
        return vanilla + (m1.detach().to(similarity.dtype) * (similarity - m2) - vanilla).detach()
    raise ValueError(f"positive_grad must be one of {POSITIVE_GRADS}, got {positive_grad!r}")


def closed_form_positive(similarity: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor) -> torch.Tensor:
    """The positive logit m1 (s - m2) with the margins' own gradient (docs/method.md §3.8, the `closed_form`
    reading): m1 and m2 are functions of the anchor a and log Z_u (section 3.7), so the positive passes
    gradient to s with slope m1 and, through the closed forms, to the anchor row and the temperature.
    Shapes: similarity (rows,), m1 and m2 0-dim (float64, may require grad) -> rows."""
    return m1.to(similarity.dtype) * (similarity - m2.to(similarity.dtype))


def anchor_row_terms(
    query: torch.Tensor, candidates: torch.Tensor, positive_col: torch.Tensor, scale: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(a, log Z_u) of one anchor row from its features, differentiable (sections 3.5-3.6):
    a = q_u . c_u, log Z_u = log sum_{k != u} exp(t q_u . c_k) (no logit bias). query (D,), candidates
    C x D, positive_col 0-dim -> two 0-dim float64 tensors. The `closed_form` margins take their gradient
    from these; their values come from the selection's own (bit-identical across ranks)."""
    similarities = candidates @ query
    negatives = torch.arange(candidates.shape[0], device=candidates.device) != positive_col
    log_z_u = torch.logsumexp((scale * similarities).masked_fill(~negatives, float("-inf")).double(), dim=0)
    return similarities[positive_col].double(), log_z_u


def with_gradient_of(value: torch.Tensor, differentiable: torch.Tensor) -> torch.Tensor:
    """`value` exactly, with the gradient of `differentiable` (which computes the same quantity, up to
    rounding): value + (d - d.detach()), whose forward adds an exact zero."""
    return value + (differentiable - differentiable.detach())


def vanilla_margins(scale: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(t, 0): the margins under which the modulated positive equals vanilla CL's t * s."""
    return _f64(scale.detach()), torch.zeros((), dtype=torch.float64, device=scale.device)
