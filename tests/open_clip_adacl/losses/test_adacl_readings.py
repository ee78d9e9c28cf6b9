"""The readings of Algorithm 1 the method text leaves open (docs/method.md §3.5-3.7): margins detached or
differentiable through the closed forms, and the anchor's value. Checked against a dense re-computation from
the reference functions of `open_clip_adacl.adacl`, and the mechanism behind the detached reading's collapse
(docs/adacl.md §5) measured on the loss itself."""
import pytest
import torch
import torch.nn.functional as F

from open_clip_adacl import adacl, create_loss

SCALE = 14.3
EPS = 1e-3
STD_FLOOR = 1e-4


def _features(n, d, seed, noise=0.8):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1)
    y = F.normalize(x + noise * torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1)
    return x.float(), y.float()


def _closed_form_direction(queries, candidates, scale, previous):
    """One direction of Algorithm 1 with m1, m2 differentiable through a = s_uu and log Z_u (the selection
    under no_grad): (cross-entropy, m1, m2)."""
    logits = scale * queries @ candidates.T
    n = logits.shape[0]
    labels = torch.arange(n)
    negatives = adacl.negative_mask(n, n, labels)
    with torch.no_grad():
        detached = logits.detach()
        most, least = adacl.reference_rows(adacl.salient_scores(detached, labels, "max"))
        floor = STD_FLOOR * scale.detach()
        mu_n, sigma_n = adacl.gaussian_fit(detached[most], negatives[most], floor)
        mu_c, sigma_c = adacl.gaussian_fit(detached[least], negatives[least], floor)
        candidates_mask = adacl.clone_candidate_mask(detached, labels, mu_c, sigma_c, mu_n, sigma_n, 1.0, "gda")
        assert candidates_mask.any()
        _, row, _ = adacl.anchor_statistic(adacl.positive_gaps(detached, labels), candidates_mask, "median")
    anchor = (queries[row] * candidates[row]).sum().double()
    log_z_u = torch.logsumexp(logits[row][negatives[row]].double(), 0)
    log_odds = adacl.anchor_log_odds(anchor, log_z_u, scale.double(), *previous)
    m1, m2 = adacl.margins_from_log_odds(anchor, log_odds, log_z_u, torch.logit(torch.tensor(EPS, dtype=torch.float64)))
    positive = m1.float() * ((queries * candidates).sum(-1) - m2.float())
    modulated = torch.where(torch.eye(n, dtype=torch.bool), positive[:, None].expand_as(logits), logits)
    return F.cross_entropy(modulated, labels), m1.detach(), m2.detach()


@pytest.mark.parametrize("anchor_prob", ["vanilla", "progressive"])
def test_closed_form_margins_train_with_the_gradient_of_the_closed_forms(anchor_prob):
    loss_fn = create_loss("adacl", preset="algorithm1", anchor_prob=anchor_prob, margin_grad="closed_form", eps=EPS)
    detached_fn = create_loss("adacl", preset="algorithm1", anchor_prob=anchor_prob, eps=EPS)
    previous = {"i2t": (None, None), "t2i": (None, None)}
    for step, seed in enumerate((21, 22)):
        x, y = _features(24, 16, seed)
        x_ours, y_ours = x.clone().requires_grad_(), y.clone().requires_grad_()
        scale_ours = torch.tensor(SCALE, requires_grad=True)
        value = loss_fn(x_ours, y_ours, scale_ours)
        value.backward()
        stats = {name: float(v) for name, v in loss_fn.stats.items()}
        loss_fn.commit()
        # Same forward as the detached reading, bit for bit: only the gradient differs.
        assert torch.equal(value.detach(), detached_fn(x, y, torch.tensor(SCALE)))
        detached_fn.commit()

        x_ref, y_ref = x.clone().requires_grad_(), y.clone().requires_grad_()
        scale_ref = torch.tensor(SCALE, requires_grad=True)
        losses = []
        for direction, (queries, candidates) in (("i2t", (x_ref, y_ref)), ("t2i", (y_ref, x_ref))):
            loss, m1, m2 = _closed_form_direction(queries, candidates, scale_ref, previous[direction])
            assert stats[f"{direction}/modulated"] == 1, f"step {step} {direction} fell back"
            assert stats[f"{direction}/m1"] == pytest.approx(float(m1), rel=1e-6)
            if anchor_prob == "progressive":
                previous[direction] = (m1, m2)
            losses.append(loss)
        reference = (losses[0] + losses[1]) / 2
        reference.backward()
        torch.testing.assert_close(value.detach(), reference.detach(), rtol=1e-5, atol=1e-6)
        for ours, ref in ((x_ours.grad, x_ref.grad), (y_ours.grad, y_ref.grad), (scale_ours.grad, scale_ref.grad)):
            torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)


def _common_mode_force(loss_fn, x, y):
    """dL/d delta where every image-text cosine of the batch is shifted by delta (an extra coordinate
    delta on the images, 1 on the texts), at delta = 0; and the stats of that step."""
    delta = torch.zeros(1, requires_grad=True)
    images = torch.cat([x, delta.expand(x.shape[0], 1)], dim=1)
    texts = torch.cat([y, torch.ones(y.shape[0], 1)], dim=1)
    loss_fn(images, texts, torch.tensor(SCALE)).backward()
    return float(delta.grad), {name: value.detach() for name, value in loss_fn.stats.items()}


def _positive_probabilities(x, y, m1, m2):
    """p_i of each row of one direction under the positive logit m1 (s_ii - m2)."""
    logits = SCALE * x @ y.T
    positive = m1 * ((x * y).sum(-1) - m2)
    return torch.sigmoid(positive - torch.logsumexp(logits.masked_fill(torch.eye(len(x), dtype=torch.bool),
                                                                       float("-inf")), dim=1))


def test_detached_margins_push_the_whole_batch_by_mean_one_minus_p_times_t_minus_m1():
    """docs/adacl.md §5: with m1, m2 constants, a common shift of every cosine changes the loss by
    mean_i (1 - p_i)(t - m1) per direction (zero for CLIP, whose slope is t)."""
    x, y = _features(32, 16, seed=5)
    force, stats = _common_mode_force(create_loss("adacl", preset="paper", eps=EPS), x, y)
    predicted = 0.0
    for direction, (queries, candidates) in (("i2t", (x, y)), ("t2i", (y, x))):
        assert stats[f"{direction}/modulated"] == 1
        m1, m2 = stats[f"{direction}/m1"].float(), stats[f"{direction}/m2"].float()
        p = _positive_probabilities(queries, candidates, m1, m2)
        predicted += float(((1 - p) * (SCALE - m1)).mean()) / 2
    assert force == pytest.approx(predicted, rel=1e-4)
    assert abs(force) > 0.1
    clip_force, _ = _common_mode_force(create_loss("clip"), x, y)
    assert abs(clip_force) < 1e-5


def test_closed_form_margins_feel_almost_no_common_mode_force_on_a_near_uniform_batch():
    """With the gradient through the closed forms and vanilla p_u the positive logit is t a + m1 (s_ii - a): a
    shift moves it like CLIP's, up to (s_ii - a) dm1, which vanishes when the positives sit at the anchor."""
    g = torch.Generator().manual_seed(6)
    x = F.normalize(torch.randn(32, 64, generator=g, dtype=torch.float64), dim=-1)
    noise = torch.randn(32, 64, generator=g, dtype=torch.float64)
    noise = F.normalize(noise - (noise * x).sum(-1, keepdim=True) * x, dim=-1)  # orthogonal to each x_i
    positive = 0.3 + 1e-3 * torch.rand(32, 1, generator=g, dtype=torch.float64)  # every s_ii within 1e-3
    x, y = x.float(), (positive * x + (1 - positive ** 2).sqrt() * noise).float()
    detached, stats = _common_mode_force(create_loss("adacl", preset="algorithm1", eps=EPS), x, y)
    closed, closed_stats = _common_mode_force(
        create_loss("adacl", preset="algorithm1", margin_grad="closed_form", eps=EPS), x, y)
    assert stats["i2t/modulated"] == 1 and closed_stats["i2t/modulated"] == 1
    assert abs(detached) > 0.1
    assert abs(closed) < 0.05 * abs(detached)


def test_the_gap_anchor_enters_the_closed_forms_as_the_selected_gap():
    x, y = _features(24, 16, seed=7)
    loss_fn = create_loss("adacl", preset="algorithm1", anchor_value="gap", eps=EPS)
    loss_fn(x, y, torch.tensor(SCALE))
    stats = loss_fn.stats
    assert stats["i2t/modulated"] == 1
    assert float(stats["i2t/anchor"]) == pytest.approx(float(stats["i2t/anchor_gap"]))


def test_readings_that_do_not_exist_are_refused_in_one_line():
    with pytest.raises(ValueError, match="needs mode='literal'"):
        create_loss("adacl", margin_grad="closed_form")  # the calibrated default
    with pytest.raises(ValueError, match="use anchor_value='positive'"):
        create_loss("adacl", preset="algorithm1", margin_grad="closed_form", anchor_value="gap")
    paper = create_loss("adacl", preset="paper").options
    assert (paper.anchor_prob, paper.margin_grad, paper.anchor_value) == ("progressive", "detached", "positive")
    with pytest.raises(ValueError, match="preset 'paper' sets margin_grad='detached'"):
        create_loss("adacl", preset="paper", margin_grad="closed_form")


def test_the_trained_loss_logs_clip_loss_on_the_same_logits():
    x, y = _features(24, 16, seed=8)
    loss_fn = create_loss("adacl", preset="paper", eps=EPS)
    loss_fn(x, y, torch.tensor(SCALE))
    clip = create_loss("clip")
    expected = float(clip(x, y, torch.tensor(SCALE)))
    logged = (float(loss_fn.stats["i2t/clip_loss"]) + float(loss_fn.stats["t2i/clip_loss"])) / 2
    assert logged == pytest.approx(expected, rel=1e-5)


def test_the_batch_mean_cross_modal_cosine_is_logged():
    x, y = _features(24, 16, seed=9)
    loss_fn = create_loss("adacl", preset="paper", eps=EPS)
    loss_fn(x, y, torch.tensor(SCALE))
    assert float(loss_fn.stats["mean_cosine"]) == pytest.approx(float((x.double() @ y.double().T).mean()), rel=1e-6)
