"""Every registered loss honours the interface the trainer relies on."""
import pytest
import torch
import torch.nn.functional as F

import open_clip_adacl
from open_clip_adacl import create_loss, list_losses


def _features(n=8, d=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(n, d, generator=g, dtype=dtype), dim=-1).requires_grad_()
    y = F.normalize(torch.randn(n, d, generator=g, dtype=dtype), dim=-1).requires_grad_()
    return x, y


def _default_options(name):
    """Options a loss needs to be constructible with defaults in a unit test (e.g. a state bank size)."""
    cls = open_clip_adacl.get_loss_class(name)
    return {opt.name: 64 for opt in cls.options if opt.name == "data_size"}


@pytest.mark.parametrize("name", list_losses())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_forward_returns_finite_scalar_and_dict(name, dtype):
    loss_fn = create_loss(name, **_default_options(name))
    x, y = _features(dtype=dtype)
    scale = torch.tensor(10.0, dtype=dtype)
    bias = torch.tensor(-10.0, dtype=dtype)
    index = torch.arange(8)
    value = loss_fn(x, y, scale, bias, sample_index=index)
    assert value.dim() == 0 and torch.isfinite(value)
    value.backward()
    assert torch.isfinite(x.grad).all()
    out = loss_fn(x, y, scale, bias, sample_index=index, output_dict=True)
    assert set(out) == {"contrastive_loss"}
    assert isinstance(loss_fn.stats, dict)
    assert all(torch.is_tensor(v) and v.dim() == 0 for v in loss_fn.stats.values())


@pytest.mark.parametrize("name", list_losses())
def test_state_dict_round_trip(name):
    loss_fn = create_loss(name, **_default_options(name))
    x, y = _features()
    loss_fn(x, y, torch.tensor(10.0), torch.tensor(-10.0), sample_index=torch.arange(8))
    clone = create_loss(name, **_default_options(name))
    clone.load_state_dict(loss_fn.state_dict())
    for key, value in loss_fn.state_dict().items():
        assert torch.equal(value, clone.state_dict()[key]), key


def test_unknown_loss_and_option_are_clear_errors():
    with pytest.raises(ValueError, match="unknown loss 'nope'.*clip"):
        create_loss("nope")
    with pytest.raises(TypeError, match="unknown option"):
        create_loss("clip", not_an_option=1)


def test_duplicate_registration_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        open_clip_adacl.register_loss("clip")(type("Dup", (torch.nn.Module,), {}))
