"""glofnd: learned per-sample thresholds that drop global false negatives from InfoNCE."""

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

DATA_SIZE = 40
# Thresholds start low and move fast, so negatives are masked from the first step.
ACTIVE = dict(data_size=DATA_SIZE, alpha=0.2, lambda_lr=0.1, init_lambda=0.3)


def _naive_glofnd(batches, *, alpha, lambda_lr, init_lambda, beta1=0.9, beta2=0.98, eps=1e-8):
    """Loop version: per-step loss values and the final per-sample state, per direction."""
    state = {
        d: {
            "lambda": [init_lambda] * DATA_SIZE,
            "m": [0.0] * DATA_SIZE,
            "v": [0.0] * DATA_SIZE,
            "count": [0] * DATA_SIZE,
        }
        for d in ("i2t", "t2i")
    }
    values = []
    for x, y, index in batches:
        x, y, index = x.double(), y.double(), index.tolist()
        n = len(index)
        step_loss = 0.0
        for direction, sims in (("i2t", x @ y.T), ("t2i", y @ x.T)):
            s = state[direction]
            lambdas = [s["lambda"][k] for k in index]
            for i, k in enumerate(index):
                kept = [LOGIT_SCALE * sims[i, j].item() for j in range(n) if j != i and sims[i, j] <= lambdas[i]]
                positive = LOGIT_SCALE * sims[i, i].item()
                step_loss += (math.log(math.exp(positive) + sum(math.exp(v) for v in kept)) - positive) / (2 * n)
                grad = alpha - (n - 1 - len(kept)) / (n - 1)
                s["count"][k] += 1
                s["m"][k] = beta1 * s["m"][k] + (1 - beta1) * grad
                s["v"][k] = beta2 * s["v"][k] + (1 - beta2) * grad**2
                m_hat = s["m"][k] / (1 - beta1 ** s["count"][k])
                v_hat = s["v"][k] / (1 - beta2 ** s["count"][k])
                s["lambda"][k] = min(1.0, max(-1.0, lambdas[i] - lambda_lr * m_hat / (math.sqrt(v_hat) + eps)))
        values.append(step_loss)
    return values, state


def test_matches_naive_loop():
    batches = make_batches(3, 12, 8, data_size=DATA_SIZE, seed=3)
    loss_fn = create_loss("glofnd", **ACTIVE)
    steps, _ = run_steps(loss_fn, batches)
    ref_values, ref_state = _naive_glofnd(batches, alpha=0.2, lambda_lr=0.1, init_lambda=0.3)
    for (value, *_), ref in zip(steps, ref_values):
        assert value.item() == pytest.approx(ref, rel=1e-5)
    for direction in ("i2t", "t2i"):
        bank = loss_fn.thresholds[direction]
        for field in ("lambda", "m", "v", "count"):
            torch.testing.assert_close(
                bank.field(field), torch.tensor(ref_state[direction][field]).float(), atol=1e-5, rtol=1e-5
            )
    assert 0 < loss_fn.stats["i2t/masked_frac"] < 1 and 0 < loss_fn.stats["t2i/masked_frac"] < 1


@pytest.mark.parametrize("direction", ["i2t", "t2i"])
def test_thresholds_converge_to_negative_quantile(direction):
    """Fixed anchors against fresh negatives from a fixed distribution: lambda_i -> its (1-alpha) quantile."""
    n, d, alpha = 256, 16, 0.1
    g = torch.Generator().manual_seed(0)
    anchors = F.normalize(torch.randn(n, d, generator=g), dim=-1)
    center = F.normalize(torch.randn(d, generator=g), dim=0)

    def negatives(k):
        return F.normalize(center + 0.8 * torch.randn(k, d, generator=g), dim=-1)

    loss_fn = create_loss("glofnd", data_size=n, alpha=alpha, lambda_lr=0.01)
    with torch.no_grad():
        for _ in range(400):
            others = negatives(n)
            x, y = (anchors, others) if direction == "i2t" else (others, anchors)
            loss_fn(x, y, torch.tensor(10.0), sample_index=torch.arange(n))
            loss_fn.commit()
    quantile = torch.quantile(anchors @ negatives(50_000).T, 1 - alpha, dim=1)
    error = (loss_fn.thresholds[direction].field("lambda") - quantile).abs()
    assert error.max() < 0.04 and error.mean() < 0.015, (error.max(), error.mean())


def test_bias_correction_counts_each_samples_own_updates():
    """Adam's first step on a sample moves it by lr whenever it comes, not by an epoch-dependent amount."""
    x, y, _ = make_batches(1, 8, 8, data_size=DATA_SIZE)[0]
    loss_fn = create_loss("glofnd", data_size=DATA_SIZE, alpha=0.1, lambda_lr=0.05)
    for step in range(5):
        loss_fn(x, y, torch.tensor(10.0), sample_index=torch.arange(8))
        loss_fn.commit()
    loss_fn.on_epoch_start(3)
    loss_fn(x, y, torch.tensor(10.0), sample_index=torch.arange(8, 16))  # first time for samples 8..15
    loss_fn.commit()
    bank = loss_fn.thresholds["i2t"]
    # No cosine exceeds a threshold of 1, so the gradient is alpha > 0 and Adam's first step is lr.
    torch.testing.assert_close(bank.field("lambda")[8:16], torch.full((8,), 0.95), atol=1e-6, rtol=0)
    assert torch.equal(bank.field("count")[:16], torch.tensor([5.0] * 8 + [1.0] * 8))
    assert loss_fn.stats["i2t/updated_frac"] == 16 / DATA_SIZE


def _clip_steps(batches):
    return run_steps(create_loss("clip", shared_matmul=True), batches)[0]


def test_equals_clip_with_alpha_zero_and_before_start_epoch():
    batches = make_batches(3, 16, 8, data_size=DATA_SIZE, seed=1)
    reference = _clip_steps(batches)
    alpha_zero = create_loss("glofnd", data_size=DATA_SIZE, alpha=0.0, lambda_lr=0.5)
    not_started = create_loss("glofnd", **ACTIVE, start_epoch=2)
    not_started.on_epoch_start(1)
    for loss_fn in (alpha_zero, not_started):
        for ours, ref in zip(run_steps(loss_fn, batches)[0], reference):
            for a, b in zip(ours, ref):
                assert torch.equal(a, b)
    assert torch.equal(alpha_zero.thresholds["i2t"].field("lambda"), torch.ones(DATA_SIZE))
    assert alpha_zero.stats["i2t/masked_frac"] == 0 and alpha_zero.stats["t2i/masked_frac"] == 0
    assert torch.equal(not_started.thresholds["t2i"].field("count"), torch.zeros(DATA_SIZE))
    assert not_started.stats == {}


def test_eval_mode_is_plain_infonce_and_leaves_state():
    x, y, index = make_batches(1, 16, 8, data_size=DATA_SIZE, seed=2)[0]
    loss_fn = create_loss("glofnd", **ACTIVE).eval()
    state = loss_fn.state_dict()["thresholds.i2t.state"].clone()
    value = loss_fn(x, y, torch.tensor(LOGIT_SCALE), sample_index=index)
    assert torch.equal(value, create_loss("clip", shared_matmul=True)(x, y, torch.tensor(LOGIT_SCALE)))
    assert torch.equal(loss_fn.state_dict()["thresholds.i2t.state"], state)


def test_mask_carries_no_gradient():
    """Gradients equal those of InfoNCE over the kept negatives, with the mask a constant."""
    x, y, index = make_batches(1, 16, 8, data_size=DATA_SIZE, seed=4)[0]
    loss_fn = create_loss("glofnd", **ACTIVE)
    masks = {}
    original = loss_fn.adjust_logits

    def record(batch, direction):
        adjusted = original(batch, direction)
        masks[direction] = torch.isinf(adjusted).detach()
        return adjusted

    loss_fn.adjust_logits = record
    ours = value_and_grads(loss_fn, x, y, index)
    assert masks["i2t"].any() and masks["t2i"].any()

    def reference(x, y, scale, sample_index):
        logits = scale * x @ y.T
        labels = torch.arange(len(x))
        return (
            F.cross_entropy(logits.masked_fill(masks["i2t"], -math.inf), labels)
            + F.cross_entropy(logits.T.masked_fill(masks["t2i"], -math.inf), labels)
        ) / 2

    for a, b in zip(ours, value_and_grads(reference, x, y, index)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_state_survives_save_and_resume_exactly():
    batches = make_batches(4, 16, 8, data_size=DATA_SIZE, seed=5)
    resumed = assert_resume_is_exact("glofnd", ACTIVE, batches)
    resumed.reset_state()  # what the trainer calls to restart the state on resume
    for bank in resumed.thresholds.values():
        assert torch.equal(bank.field("lambda"), torch.full((DATA_SIZE,), 0.3))
        assert not bank.field("count").any()


def test_missing_or_out_of_range_sample_index_is_a_clear_error():
    x, y, _ = make_batches(1, 4, 8, data_size=DATA_SIZE)[0]
    loss_fn = create_loss("glofnd", **ACTIVE)
    with pytest.raises(ValueError, match=rf"sample index {DATA_SIZE} .*data_size={DATA_SIZE}.*--data-size"):
        loss_fn(x, y, torch.tensor(10.0), sample_index=torch.tensor([0, 1, DATA_SIZE, 2]))
    with pytest.raises(ValueError, match="needs sample_index"):
        loss_fn(x, y, torch.tensor(10.0))
    with pytest.raises(ValueError, match="data_size"):
        create_loss("glofnd")


def test_two_ranks_match_single_process_and_share_state():
    batches = make_batches(3, 8, 8, data_size=DATA_SIZE, seed=6)
    assert_ranks_match_single_process("glofnd", ACTIVE, batches)
