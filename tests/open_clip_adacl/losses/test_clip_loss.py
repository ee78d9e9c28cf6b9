"""`clip` equals open_clip.ClipLoss: value and gradients, single process and 2 gloo ranks."""

import open_clip
import pytest
import torch
import torch.nn.functional as F

from helpers.distributed_utils import run_on_ranks
from open_clip_adacl import DistributedSetup, create_loss
from training.trainer.launch.params import loss_option_flag


def _batch(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    return (F.normalize(torch.randn(n, d, generator=g), dim=-1), F.normalize(torch.randn(n, d, generator=g), dim=-1))


def _value_and_grads(loss_fn, x, y, scale):
    x = x.clone().requires_grad_()
    y = y.clone().requires_grad_()
    scale = scale.clone().requires_grad_()
    value = loss_fn(x, y, scale)
    value.backward()
    return value.detach(), x.grad, y.grad, scale.grad


def test_single_process_bit_exact():
    x, y = _batch(32, 24, 0)
    scale = torch.tensor(14.3)
    ours = _value_and_grads(create_loss("clip"), x, y, scale)
    ref = _value_and_grads(open_clip.ClipLoss(), x, y, scale)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)


def _rank_fn(rank, world_size, x, y, local_loss, gather_with_grad):
    b = x.shape[0] // world_size
    loss_fn = create_loss(
        "clip",
        dist=DistributedSetup(
            rank=rank, world_size=world_size, local_loss=local_loss, gather_with_grad=gather_with_grad
        ),
    )
    value, gx, gy, gs = _value_and_grads(
        loss_fn, x[rank * b : (rank + 1) * b], y[rank * b : (rank + 1) * b], torch.tensor(14.3)
    )
    return value, gx, gy, gs


@pytest.mark.parametrize("local_loss,gather_with_grad", [(False, False), (True, True)])
def test_two_ranks_match_single_process(local_loss, gather_with_grad):
    world_size = 2
    x, y = _batch(16, 8, 1)
    ref_value, ref_gx, ref_gy, _ = _value_and_grads(open_clip.ClipLoss(), x, y, torch.tensor(14.3))
    results = run_on_ranks(_rank_fn, world_size, x, y, local_loss, gather_with_grad)
    gx = torch.cat([r[1] for r in results])
    gy = torch.cat([r[2] for r in results])
    values = torch.stack([r[0] for r in results])
    if local_loss:
        # Each rank's loss covers its own rows; their mean is the global loss. The gather's backward
        # sums every rank's contribution, so a rank's feature gradient is world_size times the
        # global one, and DDP's averaging over ranks restores the exact global gradient.
        torch.testing.assert_close(values.mean(), ref_value, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(gx, ref_gx * world_size, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(gy, ref_gy * world_size, atol=1e-5, rtol=1e-4)
    else:
        # Every rank computes the full global loss; gradients reach only its own rows.
        for value in values:
            torch.testing.assert_close(value, ref_value, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(gx, ref_gx, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(gy, ref_gy, atol=1e-5, rtol=1e-4)


def test_shared_matmul_is_one_matmul_within_rounding_of_open_clip():
    x, y = _batch(32, 24, 2)
    scale = torch.tensor(14.3)
    shared = create_loss("clip", shared_matmul=True)
    assert shared.shares_logit_matmul and not create_loss("clip").shares_logit_matmul
    batch = shared.build_batch(x, y, scale)
    assert batch.logits_per_text.data_ptr() == batch.logits_per_image.data_ptr()  # a view: no second matmul
    for a, b in zip(_value_and_grads(shared, x, y, scale), _value_and_grads(open_clip.ClipLoss(), x, y, scale)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    flags = {loss_option_flag("clip", spec) for spec in type(shared).Options.specs()}
    assert "--clip-shared-matmul" in flags
