"""The readings of Algorithm 1 the method text leaves open (docs/method.md §3.5-3.7): margins detached or
differentiable through the closed forms, and the anchor's value. Checked against a dense re-computation from
`open_clip_adacl.adacl_math` and the method's dense definitions (helpers/adacl_reference.py), and the mechanism behind the detached reading's collapse
(docs/adacl.md §5) measured on the loss itself."""

import pytest
import torch
import torch.nn.functional as F

from helpers.selection_cases import algorithm_1_anchor_row
from open_clip_adacl import adacl_math, create_loss

SCALE = 14.3
EPS = 1e-3
STD_FLOOR = 1e-4


def _features(n, d, seed, noise=0.8):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1)
    y = F.normalize(x + noise * torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1)
    return x.float(), y.float()


def _closed_form_direction(queries, candidates, scale, previous, extra=None):
    """One direction of Algorithm 1 with m1, m2 differentiable through a = s_uu and log Z_u (the selection
    under no_grad): (cross-entropy, m1, m2). `extra`: features of negatives appended after the batch's columns."""
    columns = candidates if extra is None else torch.cat([candidates, extra])
    logits = scale * queries @ columns.T
    n = logits.shape[0]
    labels = torch.arange(n)
    negatives = adacl_math.negative_mask(n, columns.shape[0], labels)
    row = algorithm_1_anchor_row(logits, STD_FLOOR * scale.detach())
    anchor = (queries[row] * candidates[row]).sum().double()
    log_z_u = torch.logsumexp(logits[row][negatives[row]].double(), 0)
    log_odds = adacl_math.anchor_log_odds(anchor, log_z_u, scale.double(), *previous)
    m1, m2 = adacl_math.margins_from_log_odds(
        anchor, log_odds, log_z_u, torch.logit(torch.tensor(EPS, dtype=torch.float64))
    )
    positive = m1.float() * ((queries * candidates).sum(-1) - m2.float())
    modulated = torch.where(torch.eye(*logits.shape, dtype=torch.bool), positive[:, None].expand_as(logits), logits)
    return F.cross_entropy(modulated, labels), m1.detach(), m2.detach()


def _value_and_grads(loss_fn, x, y, **inputs):
    """The loss of one step and its gradients with respect to x, y and the logit scale."""
    x, y = x.clone().requires_grad_(), y.clone().requires_grad_()
    scale = torch.tensor(SCALE, requires_grad=True)
    value = loss_fn(x, y, scale, **inputs)
    value.backward()
    return value.detach(), x.grad, y.grad, scale.grad


def _closed_form_reference(x, y, previous, extra=(None, None)):
    """`_value_and_grads` of the dense closed-form loss, and each direction's (m1, m2). `previous`: each
    direction's previous margins; `extra`: the features of extra negative columns for i2t (texts) and t2i
    (images)."""
    x, y = x.clone().requires_grad_(), y.clone().requires_grad_()
    scale = torch.tensor(SCALE, requires_grad=True)
    losses, margins = [], {}
    for (direction, queries, candidates), columns in zip((("i2t", x, y), ("t2i", y, x)), extra):
        loss, *margins[direction] = _closed_form_direction(queries, candidates, scale, previous[direction], columns)
        losses.append(loss)
    reference = (losses[0] + losses[1]) / 2
    reference.backward()
    return (reference.detach(), x.grad, y.grad, scale.grad), margins


def _assert_matches(ours, reference, stats, margins):
    """The loss's value and gradients are the reference's, and so are the margins of both (modulated) directions."""
    for direction, (m1, _) in margins.items():
        assert stats[f"{direction}/modulated"] == 1, f"{direction} fell back"
        assert float(stats[f"{direction}/m1"]) == pytest.approx(float(m1), rel=1e-6)
    torch.testing.assert_close(ours[0], reference[0], rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(ours[1:], reference[1:]):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("anchor_prob", ["vanilla", "progressive"])
def test_closed_form_margins_train_with_the_gradient_of_the_closed_forms(anchor_prob):
    loss_fn = create_loss("adacl", preset="algorithm1", anchor_prob=anchor_prob, margin_grad="closed_form", eps=EPS)
    detached_fn = create_loss("adacl", preset="algorithm1", anchor_prob=anchor_prob, eps=EPS)
    previous = {"i2t": (None, None), "t2i": (None, None)}
    for seed in (21, 22):
        x, y = _features(24, 16, seed)
        ours = _value_and_grads(loss_fn, x, y)
        stats = dict(loss_fn.stats)
        loss_fn.commit()
        # Same forward as the detached reading, bit for bit: only the gradient differs.
        assert torch.equal(ours[0], detached_fn(x, y, torch.tensor(SCALE)))
        detached_fn.commit()
        reference, margins = _closed_form_reference(x, y, previous)
        _assert_matches(ours, reference, stats, margins)
        if anchor_prob == "progressive":
            previous = margins


def test_memory_bank_entries_enter_the_selection_and_the_denominator_as_extra_columns():
    """Step 3 of a run with the memory bank (docs/method.md §6; 64 samples, 30 entries): the batch of samples
    40..63 gets as extra negative columns the 30 most recently written entries of other samples: not its own
    samples 40..47, written last, but samples 24..39 of step 2 and 10..23 of step 1, each holding its features (a
    first write stores them). Both readings of the margins, against the dense re-computation with those columns."""
    options = dict(preset="algorithm1", eps=EPS, bank_size=30, data_size=64)
    loss_fn = create_loss("adacl", margin_grad="closed_form", **options)
    detached_fn = create_loss("adacl", **options)
    (x1, y1), (x2, y2), (x3, y3) = (_features(24, 16, seed) for seed in (31, 32, 33))
    for fn in (loss_fn, detached_fn):
        for x, y, index in ((x1, y1, torch.arange(24)), (x2, y2, torch.arange(24, 48))):
            fn(x, y, torch.tensor(SCALE), sample_index=index)
            fn.commit()
    index = torch.arange(40, 64)
    ours = _value_and_grads(loss_fn, x3, y3, sample_index=index)
    assert torch.equal(ours[0], detached_fn(x3, y3, torch.tensor(SCALE), sample_index=index))
    bank_text, bank_image = torch.cat([y2[:16], y1[10:]]), torch.cat([x2[:16], x1[10:]])
    reference, margins = _closed_form_reference(
        x3, y3, {"i2t": (None, None), "t2i": (None, None)}, (bank_text, bank_image)
    )
    _assert_matches(ours, reference, loss_fn.stats, margins)


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
    return torch.sigmoid(
        positive - torch.logsumexp(logits.masked_fill(torch.eye(len(x), dtype=torch.bool), float("-inf")), dim=1)
    )


def test_detached_margins_push_the_whole_batch_by_mean_one_minus_p_times_t_minus_m1():
    """docs/adacl.md §5: with m1, m2 constants, a common shift of every cosine changes the loss by
    mean_i (1 - p_i)(t - m1) per direction (zero for CLIP, whose slope is t)."""
    x, y = _features(32, 16, seed=5)
    force, stats = _common_mode_force(create_loss("adacl", preset="first-reading", eps=EPS), x, y)
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
    x, y = x.float(), (positive * x + (1 - positive**2).sqrt() * noise).float()
    detached, stats = _common_mode_force(create_loss("adacl", preset="algorithm1", eps=EPS), x, y)
    closed, closed_stats = _common_mode_force(
        create_loss("adacl", preset="algorithm1", margin_grad="closed_form", eps=EPS), x, y
    )
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
    first = create_loss("adacl", preset="first-reading").options
    assert (first.anchor_prob, first.margin_grad, first.anchor_value) == ("progressive", "detached", "positive")
    with pytest.raises(ValueError, match="preset 'first-reading' sets margin_grad='detached'"):
        create_loss("adacl", preset="first-reading", margin_grad="closed_form")


def test_the_trained_loss_logs_clip_loss_on_the_same_logits():
    x, y = _features(24, 16, seed=8)
    loss_fn = create_loss("adacl", preset="first-reading", eps=EPS)
    loss_fn(x, y, torch.tensor(SCALE))
    clip = create_loss("clip")
    expected = float(clip(x, y, torch.tensor(SCALE)))
    logged = (float(loss_fn.stats["i2t/clip_loss"]) + float(loss_fn.stats["t2i/clip_loss"])) / 2
    assert logged == pytest.approx(expected, rel=1e-5)


def test_the_batch_mean_cross_modal_cosine_is_logged():
    x, y = _features(24, 16, seed=9)
    loss_fn = create_loss("adacl", preset="first-reading", eps=EPS)
    loss_fn(x, y, torch.tensor(SCALE))
    assert float(loss_fn.stats["mean_cosine"]) == pytest.approx(float((x.double() @ y.double().T).mean()), rel=1e-6)
