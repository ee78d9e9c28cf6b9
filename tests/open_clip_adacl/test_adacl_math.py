"""open_clip_adacl.adacl_math: every function against a naive loop or an independent formula."""

import math

import pytest
import torch

from helpers import adacl_reference as reference
from open_clip_adacl import adacl_math


def _similarities(rows=6, cols=9, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = torch.rand(rows, cols, generator=g, dtype=torch.float64) * 2 - 1
    positive_col = torch.randperm(cols, generator=g)[:rows]
    return s, positive_col


def _negatives(row, positive_col, cols):
    return [j for j in range(cols) if j != positive_col[row]]


@pytest.mark.parametrize("kind", adacl_math.SALIENT_KINDS)
def test_salient_scores_match_loop(kind):
    s, pc = _similarities()
    expected = []
    for i in range(s.shape[0]):
        negatives = [s[i, j].item() for j in _negatives(i, pc, s.shape[1])]
        other = max(negatives) if kind == "max" else sum(negatives) / len(negatives)
        expected.append(s[i, pc[i]].item() - other)
    torch.testing.assert_close(reference.salient_scores(s, pc, kind), torch.tensor(expected, dtype=torch.float64))


def test_reference_rows_break_ties_to_the_lowest_row():
    salient = torch.tensor([0.1, 0.5, -0.2, 0.5, -0.2])
    most, least = reference.reference_rows(salient)
    assert (most.item(), least.item()) == (1, 2)


def test_gaussian_fit_matches_loop_and_floors_the_std():
    values = torch.tensor([0.3, -0.1, 0.7, 0.2, 0.2])
    weights = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0])
    kept = [v for v, w in zip(values.tolist(), weights.tolist()) if w]
    mean = sum(kept) / len(kept)
    std = math.sqrt(sum((v - mean) ** 2 for v in kept) / len(kept))
    fit_mean, fit_std = adacl_math.gaussian_fit(values, weights)
    assert fit_mean.item() == pytest.approx(mean) and fit_std.item() == pytest.approx(std)
    assert adacl_math.gaussian_fit(torch.full((4,), 0.25), std_floor=1e-3)[1].item() == 1e-3


@pytest.mark.parametrize("prior_ratio", [1.0, 0.3, 4.0])
def test_posterior_is_bayes_rule_with_two_gaussians(prior_ratio):
    s = torch.linspace(-1, 1, 101, dtype=torch.float64)
    mu_c, sigma_c, mu_n, sigma_n = 0.35, 0.08, 0.05, 0.12
    pi_c = 1 / (1 + prior_ratio)

    def density(mu, sigma):
        return torch.distributions.Normal(torch.tensor(mu, dtype=torch.float64), sigma).log_prob(s).exp()

    clone = density(mu_c, sigma_c) * pi_c
    not_clone = density(mu_n, sigma_n) * (1 - pi_c)
    posterior = adacl_math.gda_posterior(s, mu_c, sigma_c, mu_n, sigma_n, prior_ratio)
    torch.testing.assert_close(posterior, clone / (clone + not_clone), atol=1e-12, rtol=1e-9)


def test_posterior_is_finite_at_extremes_and_keeps_the_dtype():
    s = torch.tensor([-1e30, -1.0, 0.0, 1.0, 1e30], dtype=torch.float32)
    posterior = adacl_math.gda_posterior(s, 0.3, 1e-6, -0.2, 0.5)
    assert posterior.dtype == torch.float32
    assert torch.isfinite(posterior).all() and ((posterior >= 0) & (posterior <= 1)).all()


def test_log_odds_coefficients_give_the_same_quadratic():
    s = torch.linspace(-3, 3, 61, dtype=torch.float64)
    params = (0.4, 0.05, -0.1, 0.2, 2.0)
    a, b, c = adacl_math.gda_log_odds_coefficients(*params)
    torch.testing.assert_close((a * s + b) * s + c, adacl_math.gda_log_odds(s, *params), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("quadratic", [-2.0, -0.3, 0.0, 1e-9, 0.5])
@pytest.mark.parametrize("linear", [-3.0, 0.0, 2.0])
@pytest.mark.parametrize("constant", [-4.0, 0.0, 7.0])
@pytest.mark.parametrize("lower", [None, -1.0, 3.0])
def test_positive_quadratic_intervals_are_where_the_quadratic_is_positive(quadratic, linear, constant, lower):
    s = torch.cat([torch.linspace(-60, 60, 24001, dtype=torch.float64), torch.tensor([0.0, -0.0, 1e-300])])
    intervals = adacl_math.positive_quadratic_intervals(quadratic, linear, constant, lower)
    value = quadratic * s * s + linear * s + constant
    expected = (value > 0) & (s > lower if lower is not None else True)
    inside = torch.zeros_like(expected)
    for a, b in intervals:
        inside |= (s > a) & (s < b)
    scale = abs(quadratic) * s * s + abs(linear) * s.abs() + abs(constant)
    near_a_root = value.abs() <= 1e-12 * scale  # where float64 rounding may decide either way
    assert torch.equal(inside[~near_a_root], expected[~near_a_root])


def test_positive_quadratic_intervals_of_non_finite_coefficients_are_empty():
    for coefficients, lower in (
        ((float("nan"), 1.0, 0.0), None),
        ((1.0, float("inf"), 0.0), None),
        ((1.0, 0.0, -1.0), float("nan")),
    ):
        intervals = adacl_math.positive_quadratic_intervals(*coefficients, lower)
        assert (intervals[:, 0] >= intervals[:, 1]).all()


def test_clone_candidate_mask_matches_loop():
    s, pc = _similarities(8, 12, seed=3)
    params = (0.2, 0.3, -0.3, 0.25, 1.0)
    mask = adacl_math.clone_candidate_mask(s, pc, *params)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            expected = j != pc[i] and adacl_math.gda_posterior(s[i, j], *params).item() > 0.5
            assert mask[i, j].item() == expected, (i, j)


def test_positive_gaps_match_loop():
    s, pc = _similarities()
    gaps = reference.positive_gaps(s, pc)
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            assert gaps[i, j].item() == s[i, pc[i]].item() - s[i, j].item()


def _naive_anchor(gaps, mask, stat):
    elements = [(gaps[i, j].item(), i, j) for i in range(gaps.shape[0]) for j in range(gaps.shape[1]) if mask[i, j]]
    values = sorted(v for v, _, _ in elements)
    if stat == "mean":
        mean = sum(values) / len(values)
        return min(elements, key=lambda e: (abs(e[0] - mean), e[1], e[2]))
    target = {"median": values[(len(values) - 1) // 2], "min": values[0], "max": values[-1]}[stat]
    return min(e for e in elements if e[0] == target)[0:3]


@pytest.mark.parametrize("stat", adacl_math.ANCHOR_STATS)
def test_anchor_statistic_matches_loop_with_ties(stat):
    g = torch.Generator().manual_seed(7)
    gaps = (torch.randint(-3, 4, (5, 7), generator=g) / 4).double()  # few distinct values: many ties
    mask = torch.rand(5, 7, generator=g) > 0.3
    value, row, col = reference.anchor_statistic(gaps, mask, stat)
    assert (value.item(), row.item(), col.item()) == _naive_anchor(gaps, mask, stat)


def test_anchor_probability_vanilla_and_progressive():
    g = torch.Generator().manual_seed(1)
    s = torch.rand(7, generator=g, dtype=torch.float64) * 2 - 1  # row u: s[0] positive, others negatives
    scale, bias = 14.3, -2.0
    logits = scale * s + bias
    log_z_u = torch.logsumexp(logits[1:], 0) - bias
    vanilla = math.exp(logits[0]) / (math.exp(logits[0]) + sum(math.exp(v) for v in logits[1:]))
    assert reference.anchor_probability(s[0], log_z_u, scale).item() == pytest.approx(vanilla, rel=1e-12)
    m1, m2 = 17.0, 0.05
    modulated = math.exp(m1 * (s[0] - m2) + bias)
    progressive = modulated / (modulated + sum(math.exp(v) for v in logits[1:]))
    assert reference.anchor_probability(s[0], log_z_u, scale, m1, m2).item() == pytest.approx(progressive, rel=1e-12)


def test_closed_forms_meet_both_conditions_on_random_inputs():
    g = torch.Generator().manual_seed(2)
    for _ in range(200):
        anchor = torch.rand((), generator=g, dtype=torch.float64) * 1.8 - 0.9
        log_z_u = torch.rand((), generator=g, dtype=torch.float64) * 30
        p_u = torch.rand((), generator=g, dtype=torch.float64) * 0.9 + 0.01
        eps = 10 ** -(torch.rand((), generator=g, dtype=torch.float64) * 7 + 1)
        if p_u >= 1 - eps:
            continue
        m1, m2 = reference.margins_from_anchor(anchor, p_u, log_z_u, eps)
        assert m1.dim() == 0 and m2.dim() == 0
        torch.testing.assert_close(reference.modulated_probability(anchor, m1, m2, log_z_u), p_u, rtol=1e-9, atol=0)
        torch.testing.assert_close(reference.modulated_probability(1.0, m1, m2, log_z_u), 1 - eps, rtol=1e-9, atol=0)


@pytest.mark.parametrize(
    "scale,anchor,log_z,eps,ratio,m2",
    [
        (14.3, 0.02, 5.5, 1e-2, 0.70, -0.008),
        (14.3, 0.02, 5.5, 1e-4, 1.03, 0.001),
        (100.0, 0.30, 27.9, 1e-4, 0.10, -2.65),
        (100.0, 0.30, 27.9, 1e-8, 0.23, -0.99),
    ],
)
def test_literal_margins_reproduce_the_clip_regime_table(scale, anchor, log_z, eps, ratio, m2):
    """docs/method.md §4's table: the literal closed forms flatten the positive at CLIP temperatures."""
    margins = adacl_math.literal_margins(anchor, log_z, scale, eps)
    assert (margins.m1 / scale).item() == pytest.approx(ratio, abs=0.006)
    assert margins.m2.item() == pytest.approx(m2, abs=0.006)
    assert margins.valid


def test_margins_valid_rejects_degenerate_closed_forms():
    log_z = torch.tensor(3.0, dtype=torch.float64)
    assert not adacl_math.literal_margins(0.9, log_z, 100.0, 1e-3).valid  # p_u >= 1 - eps
    assert not adacl_math.literal_margins(1.0, log_z, 14.3, 1e-3).valid  # anchor at the boundary: m1 = inf
    assert adacl_math.literal_margins(0.2, log_z, 14.3, 1e-3).valid


def test_calibrated_eps_is_relative_to_the_vanilla_boundary_error():
    scale, log_z, rho = 14.3, 6.0, 0.1
    vanilla_boundary = math.exp(scale) / (math.exp(scale) + math.exp(log_z))
    assert reference.calibrated_eps(log_z, scale, rho).item() == pytest.approx(rho * (1 - vanilla_boundary), rel=1e-12)
    # With Z_u << exp(t b): m1 ~ t + log(1/rho) / (b - a) and m2 = a (1 - t / m1).
    anchor = 0.3
    margins = adacl_math.calibrated_margins(
        anchor, log_z, scale, rho, anchor_min=0.0, anchor_max=0.9, max_scale_ratio=100.0, max_offset=1.0
    )
    expected_m1 = scale + math.log(1 / rho) / (1 - anchor)
    assert margins.m1.item() == pytest.approx(expected_m1, rel=1e-3)
    assert margins.m2.item() == pytest.approx(anchor * (1 - scale / margins.m1.item()), rel=1e-9)


def test_calibrated_margins_are_never_weaker_than_vanilla():
    g = torch.Generator().manual_seed(4)
    for _ in range(300):
        scale = torch.rand((), generator=g, dtype=torch.float64) * 99 + 1
        anchor = torch.rand((), generator=g, dtype=torch.float64) * 2.4 - 1.2
        log_z = torch.rand((), generator=g, dtype=torch.float64) * 40 - 5
        previous = (
            scale * (1 + torch.rand((), generator=g, dtype=torch.float64)),
            torch.rand((), generator=g, dtype=torch.float64) * 0.2,
        )
        for prev_m1, prev_m2 in [(None, None), previous]:
            margins = adacl_math.calibrated_margins(
                anchor,
                log_z,
                scale,
                0.1,
                anchor_min=0.0,
                anchor_max=0.9,
                max_scale_ratio=1.1,
                max_offset=0.1,
                previous_m1=prev_m1,
                previous_m2=prev_m2,
            )
            assert scale <= margins.m1 <= 1.1 * scale * (1 + 1e-12)
            assert 0 <= margins.m2 <= 0.1
            assert torch.isfinite(margins.m1) and torch.isfinite(margins.m2)


def test_bounds_and_smoothing():
    assert adacl_math.clamp_anchor(0.99, 0.0, 0.9).item() == 0.9
    assert adacl_math.clamp_anchor(-0.5, 0.0, 0.9).item() == 0.0
    scale = torch.tensor(10.0, dtype=torch.float64)
    assert adacl_math.bound_scale(torch.tensor(5.0, dtype=torch.float64), scale, 1.1).item() == 10.0
    assert adacl_math.bound_scale(torch.tensor(50.0, dtype=torch.float64), scale, 1.1).item() == pytest.approx(11.0)
    assert adacl_math.bound_offset(torch.tensor(-0.3), 0.1).item() == 0.0
    average, value = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
    torch.testing.assert_close(adacl_math.ema_update(average, value, 0.9, torch.tensor(True)), torch.tensor([1.2, 2.2]))
    torch.testing.assert_close(adacl_math.ema_update(average, value, 0.9, torch.tensor(False)), value)


@pytest.mark.parametrize("positive_grad", adacl_math.POSITIVE_GRADS)
def test_modulated_positive_value_and_gradients(positive_grad):
    s = torch.tensor([0.3, -0.2, 0.8], requires_grad=True)
    scale = torch.tensor(14.0, requires_grad=True)
    m1, m2 = torch.tensor(15.4, dtype=torch.float64), torch.tensor(0.05, dtype=torch.float64)
    positive = adacl_math.modulated_positive(s, scale, m1, m2, positive_grad)
    torch.testing.assert_close(positive, (15.4 * (s - 0.05)).float(), rtol=1e-6, atol=1e-6)
    positive.sum().backward()
    if positive_grad == "fixed":  # Algorithm 1 as written: m1 a constant
        torch.testing.assert_close(s.grad, torch.full((3,), 15.4), rtol=1e-6, atol=0)
        assert scale.grad is None
    elif positive_grad == "scaled":  # d/dt [t * (m1/t) * (s - m2)] with m1/t held fixed
        torch.testing.assert_close(s.grad, torch.full((3,), 15.4), rtol=1e-6, atol=0)
        assert scale.grad.item() == pytest.approx(1.1 * (s - 0.05).sum().item(), rel=1e-5)
    else:  # vanilla's gradient: d/ds = t, d/dt = s
        torch.testing.assert_close(s.grad, torch.full((3,), 14.0), rtol=1e-6, atol=0)
        assert scale.grad.item() == pytest.approx(s.sum().item(), rel=1e-6)


def test_unknown_positive_grad_is_an_error():
    with pytest.raises(ValueError, match="positive_grad"):
        adacl_math.modulated_positive(torch.zeros(2), torch.tensor(1.0), torch.tensor(1.0), torch.tensor(0.0), "nope")


def test_candidate_regions_nest_and_upper_is_one_sided():
    g = torch.Generator().manual_seed(4)
    s = torch.randn(20, 30, generator=g, dtype=torch.float64) * 0.3
    pc = torch.arange(20)
    # A wide clone class around 0.1 and a narrow not-clone class around 0: the GDA region is two-sided.
    params = (0.1, 0.3, 0.0, 0.1)
    gda = adacl_math.clone_candidate_mask(s, pc, *params, region="gda")
    upper = adacl_math.clone_candidate_mask(s, pc, *params, region="upper")
    everything = adacl_math.clone_candidate_mask(s, pc, *params, region="all")
    assert torch.equal(everything, adacl_math.negative_mask(20, 30, pc))
    assert torch.equal(upper, gda & (s > 0.0))
    assert (gda & (s < 0.0)).any() and not (upper & (s <= 0.0)).any()
    with pytest.raises(ValueError, match="candidate_region"):
        adacl_math.clone_candidate_mask(s, pc, *params, region="below")


def test_gap_boundary_makes_the_slope_follow_the_clone_gap():
    scale, log_z, rho = 20.0, 3.0, 0.5
    common = dict(anchor_min=0.0, anchor_max=0.99, max_scale_ratio=100.0, max_offset=1.0)
    close = adacl_math.calibrated_margins(0.8, log_z, scale, rho, gap=0.02, **common)
    far = adacl_math.calibrated_margins(0.8, log_z, scale, rho, gap=0.2, **common)
    for margins, gap in ((close, 0.02), (far, 0.2)):
        assert margins.boundary.item() == pytest.approx(0.8 + gap)
        # Algorithm 1's two conditions hold at the gap boundary while no bound binds.
        assert not (margins.scale_bounded or margins.offset_bounded or margins.anchor_clamped)
        p_anchor = reference.modulated_probability(0.8, margins.m1, margins.m2, log_z)
        assert p_anchor.item() == pytest.approx(margins.p_u.item(), rel=1e-9)
        eps = reference.calibrated_eps(log_z, scale, rho, margins.boundary)
        assert reference.modulated_probability(margins.boundary, margins.m1, margins.m2, log_z).item() == pytest.approx(
            1 - eps.item(), rel=1e-9
        )
    # Close clones sharpen more; about 1 + log(1/rho) / (t d) when Z_u << exp(t b).
    assert close.m1.item() / scale > far.m1.item() / scale > 1.0
    assert far.m1.item() / scale == pytest.approx(1 + math.log(1 / rho) / (scale * 0.2), rel=0.05)
    # A gap at or below zero (clones above the positive) is raised to the floor: the bound then caps m1.
    capped = adacl_math.calibrated_margins(0.8, log_z, scale, rho, gap=-0.1, **{**common, "max_scale_ratio": 3.0})
    assert capped.scale_bounded and capped.m1.item() == pytest.approx(3 * scale)


def test_bound_flags_say_which_bound_changed_the_margins():
    free = adacl_math.calibrated_margins(
        0.5, 3.0, 14.3, 0.1, anchor_min=0.0, anchor_max=0.9, max_scale_ratio=10.0, max_offset=1.0
    )
    assert not (free.anchor_clamped or free.scale_bounded or free.offset_bounded)
    bound = adacl_math.calibrated_margins(
        0.95, 3.0, 14.3, 0.1, anchor_min=0.0, anchor_max=0.9, max_scale_ratio=1.1, max_offset=0.01
    )
    assert bound.anchor_clamped and bound.scale_bounded and bound.offset_bounded
    assert bound.anchor.item() == 0.9 and bound.m1.item() == pytest.approx(1.1 * 14.3) and bound.m2.item() == 0.01
