"""hnnce: InfoNCE with each negative weighted by (N - 1) softmax(beta * logit) over its row (HN-NCE)."""

import pytest
import torch

from helpers.loss_equivalence import assert_ranks_match_single_process, make_batches, value_and_grads
from open_clip_adacl import create_loss


def _dense_hnnce(beta, alpha):
    """The paper's formula written out on the N x N matrix, per direction: the loss as a function of
    the features (the weights carry gradient)."""

    def loss(x, y, scale, sample_index):
        total = 0
        for logits in (scale * x @ y.T, scale * y @ x.T):
            n = len(logits)
            negative = ~torch.eye(n, dtype=torch.bool)
            hardness = torch.exp(beta * logits) * negative
            weights = (n - 1) * hardness / hardness.sum(dim=1, keepdim=True)
            positive = logits.diagonal()
            denominator = alpha * positive.exp() + (weights * logits.exp() * negative).sum(dim=1)
            total = total + (denominator.log() - positive).mean()
        return total / 2

    return loss


def _double(batch):
    return [t.double() if t.is_floating_point() else t for t in batch]


@pytest.mark.parametrize("beta, alpha", [(0.5, 1.0), (2.0, 0.5), (1.0, 0.0)])
def test_matches_dense_formula_in_value_and_gradient(beta, alpha):
    x, y, index = _double(make_batches(1, 12, 8, data_size=12, seed=1)[0])
    ours = value_and_grads(create_loss("hnnce", beta=beta, alpha=alpha), x, y, index)
    reference = value_and_grads(_dense_hnnce(beta, alpha), x, y, index)
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_beta_zero_is_clip():
    x, y, index = _double(make_batches(1, 16, 8, data_size=16, seed=2)[0])
    ours = value_and_grads(create_loss("hnnce", beta=0.0), x, y, index)
    for a, b in zip(ours, value_and_grads(create_loss("clip", shared_matmul=True), x, y, index)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_stats_show_the_weights_concentrating_on_hard_negatives():
    x, y, index = make_batches(1, 16, 8, data_size=16, seed=3)[0]
    loss_fn = create_loss("hnnce", beta=0.0)
    loss_fn(x, y, torch.tensor(14.3), sample_index=index)
    assert loss_fn.stats["i2t/weight_max"] == pytest.approx(1.0)
    assert loss_fn.stats["t2i/negative_mass_ratio"] == pytest.approx(1.0)
    loss_fn = create_loss("hnnce", beta=1.0)
    loss_fn(x, y, torch.tensor(14.3), sample_index=index)
    assert 1.0 < loss_fn.stats["i2t/weight_max"] < 15
    assert loss_fn.stats["i2t/negative_mass_ratio"] > 1.0 and loss_fn.stats["t2i/negative_mass_ratio"] > 1.0


def test_negative_options_are_refused():
    with pytest.raises(ValueError, match="beta must be >= 0"):
        create_loss("hnnce", beta=-0.5)
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        create_loss("hnnce", alpha=-1.0)


def test_two_ranks_match_single_process():
    batches = make_batches(2, 8, 8, data_size=16, seed=4)
    assert_ranks_match_single_process("hnnce", {"beta": 1.0, "alpha": 0.5}, batches)
