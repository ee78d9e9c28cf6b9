"""fne: InfoNCE whose negatives are weighted by 1 - P(false negative) (a CLIP port of FNE)."""

import math

import pytest
import torch
import torch.nn.functional as F

from helpers.loss_equivalence import (
    LOGIT_SCALE,
    assert_ranks_match_single_process,
    assert_resume_is_exact,
    make_batches,
    run_steps,
    value_and_grads,
)
from open_clip_adacl import create_loss
from open_clip_adacl.losses.fne import false_negative_log_odds

# A large prior and a short warm-up so that weights apply, and matter, within a few steps.
ACTIVE = dict(prior=0.2, momentum=0.5, start_epoch=0, min_matched=8)


def _normal_pdf(s, mean, std):
    return math.exp(-0.5 * ((s - mean) / std) ** 2) / (std * math.sqrt(2 * math.pi))


def _naive_fne(batches, *, prior, momentum, min_matched):
    """Loop version: per-step loss values, smallest weight, and the final running moments per direction."""
    moments = {d: [0.0, 0.0, 0.0, 0.0] for d in ("i2t", "t2i")}  # pos mean, pos mean sq, neg mean, neg mean sq
    seen = {"i2t": 0, "t2i": 0}
    values, min_weights = [], []
    for x, y, _ in batches:
        x, y = x.double(), y.double()
        n = len(x)
        step_loss, min_weight = 0.0, 1.0
        for direction, sims in (("i2t", x @ y.T), ("t2i", y @ x.T)):
            hardest = [max(sims[i, j].item() for j in range(n) if j != i) for i in range(n)]
            matched = [i for i in range(n) if sims[i, i].item() > hardest[i]]
            if matched:
                batch = [
                    sum(v) / len(matched)
                    for v in (
                        [sims[i, i].item() for i in matched],
                        [sims[i, i].item() ** 2 for i in matched],
                        [hardest[i] for i in matched],
                        [hardest[i] ** 2 for i in matched],
                    )
                ]
                rate = 1.0 if seen[direction] == 0 else 1 - momentum
                moments[direction] = [m + rate * (b - m) for m, b in zip(moments[direction], batch)]
                seen[direction] += len(matched)
            pm, pm2, nm, nm2 = moments[direction]
            pos_std, neg_std = math.sqrt(max(pm2 - pm**2, 1e-6)), math.sqrt(max(nm2 - nm**2, 1e-6))
            for i in range(n):
                denominator = math.exp(LOGIT_SCALE * sims[i, i].item())
                for j in range(n):
                    if j == i:
                        continue
                    s = sims[i, j].item()
                    weight = 1.0
                    if seen[direction] >= min_matched:
                        p_pos = prior * _normal_pdf(s, pm, pos_std)
                        weight = max(1 - p_pos / (p_pos + (1 - prior) * _normal_pdf(s, nm, neg_std)), 1e-6)
                    min_weight = min(min_weight, weight)
                    denominator += weight * math.exp(LOGIT_SCALE * s)
                step_loss += (math.log(denominator) - LOGIT_SCALE * sims[i, i].item()) / (2 * n)
        values.append(step_loss)
        min_weights.append(min_weight)
    return values, min_weights, moments, seen


def test_matches_naive_loop():
    batches = make_batches(4, 12, 8, data_size=100, seed=3)
    loss_fn = create_loss("fne", **ACTIVE)
    steps, _ = run_steps(loss_fn, batches)
    ref_values, min_weights, ref_moments, seen = _naive_fne(batches, prior=0.2, momentum=0.5, min_matched=8)
    assert min(min_weights) < 0.5  # the weights really change the loss in this test
    for (value, *_), ref in zip(steps, ref_values):
        assert value.item() == pytest.approx(ref, rel=1e-5)
    for direction in ("i2t", "t2i"):
        moments = getattr(loss_fn, f"{direction}_moments").flatten()
        torch.testing.assert_close(moments, torch.tensor(ref_moments[direction]).float(), atol=1e-6, rtol=1e-5)
        assert getattr(loss_fn, f"{direction}_num_matched") == seen[direction]
    assert loss_fn.stats["i2t/weight_mean"] < 1 and loss_fn.stats["t2i/p_fn_max"] > 0


def test_log_odds_follow_bayes_rule():
    mean, std, prior = torch.tensor([0.6, 0.2]), torch.tensor([0.1, 0.15]), 1e-4
    s = torch.linspace(-0.2, 1.0, 25)
    positive = torch.distributions.Normal(mean[0], std[0]).log_prob(s).exp() * prior
    negative = torch.distributions.Normal(mean[1], std[1]).log_prob(s).exp() * (1 - prior)
    torch.testing.assert_close(
        torch.sigmoid(false_negative_log_odds(s, mean, std, prior)),
        positive / (positive + negative),
        atol=1e-6,
        rtol=1e-4,
    )


def _clip_steps(batches):
    return run_steps(create_loss("clip", shared_matmul=True), batches)[0]


@pytest.mark.parametrize(
    "options",
    [dict(ACTIVE, unit_weights=True), dict(ACTIVE, min_matched=10**6)],
    ids=["unit_weights", "before_min_matched"],
)
def test_equals_clip_exactly_while_statistics_run(options):
    batches = make_batches(3, 16, 8, data_size=100, seed=1)
    loss_fn = create_loss("fne", **options)
    for ours, ref in zip(run_steps(loss_fn, batches)[0], _clip_steps(batches)):
        for a, b in zip(ours, ref):
            assert torch.equal(a, b)
    assert loss_fn.i2t_num_matched > 0 and loss_fn.t2i_moments.abs().sum() > 0
    assert {"i2t/pos_mean", "t2i/neg_std", "i2t/matched_frac", "t2i/weight_mean", "i2t/p_fn_max"} <= set(loss_fn.stats)


def test_before_start_epoch_or_in_eval_equals_clip_and_state_waits():
    batches = make_batches(2, 16, 8, data_size=100, seed=2)
    warming_up = create_loss("fne", prior=0.05, min_matched=1)  # default start_epoch 1; epoch 0 now
    evaluating = create_loss("fne", **ACTIVE).eval()
    for loss_fn in (warming_up, evaluating):
        for ours, ref in zip(run_steps(loss_fn, batches)[0], _clip_steps(batches)):
            for a, b in zip(ours, ref):
                assert torch.equal(a, b)
        assert all(not value.any() for value in loss_fn.state_dict().values())
        assert loss_fn.stats == {}
    warming_up.on_epoch_start(1)
    warming_up(*batches[0][:2], torch.tensor(LOGIT_SCALE))
    warming_up.commit()
    assert warming_up.i2t_num_matched > 0


def test_weights_carry_no_gradient():
    """Gradients equal those of InfoNCE with the log-weights added as constants."""
    batches = make_batches(3, 16, 8, data_size=100, seed=4)
    loss_fn = create_loss("fne", **ACTIVE)
    run_steps(loss_fn, batches[:2])
    offsets = {}
    original = loss_fn.adjust_logits

    def record(batch, direction):
        adjusted = original(batch, direction)
        offsets[direction] = (adjusted - batch.logits(direction)).detach()
        return adjusted

    loss_fn.adjust_logits = record
    x, y, index = batches[2]
    ours = value_and_grads(loss_fn, x, y, index)
    assert offsets["i2t"].min() < math.log(0.5)

    def reference(x, y, scale, sample_index):
        logits = scale * x @ y.T
        labels = torch.arange(len(x))
        return (
            F.cross_entropy(logits + offsets["i2t"], labels) + F.cross_entropy(logits.T + offsets["t2i"], labels)
        ) / 2

    for a, b in zip(ours, value_and_grads(reference, x, y, index)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_state_survives_save_and_resume_exactly():
    batches = make_batches(4, 16, 8, data_size=100, seed=5)
    resumed = assert_resume_is_exact("fne", ACTIVE, batches)
    resumed.reset_state()  # what the trainer calls to restart the state on resume
    assert all(not value.any() for value in resumed.state_dict().values())


@pytest.mark.slow
def test_two_ranks_match_single_process_and_share_state():
    batches = make_batches(3, 8, 8, data_size=100, seed=6)
    assert_ranks_match_single_process("fne", dict(ACTIVE, min_matched=2), batches)
