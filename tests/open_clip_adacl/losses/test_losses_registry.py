"""Every registered loss honours the interface the trainer relies on."""

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

import open_clip_adacl
from helpers.registries import scratch_entries
from open_clip_adacl import LossOptions, create_loss, list_losses, option
from open_clip_adacl.losses import ContrastiveLoss, SampleStateOptions, registry


def _features(n=8, d=16, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(n, d, generator=g, dtype=dtype), dim=-1).requires_grad_()
    y = F.normalize(torch.randn(n, d, generator=g, dtype=dtype), dim=-1).requires_grad_()
    return x, y


def _default_options(name):
    """Options a loss needs to be constructible with defaults in a unit test (e.g. a state bank size)."""
    cls = open_clip_adacl.get_loss_class(name)
    return {"data_size": 64} if cls.needs_sample_index else {}


def _inputs(loss_fn, sample_index):
    """The per-sample inputs the trainer passes the loss: sample indices, and families (of four) if it needs them."""
    return {"sample_index": sample_index, **({"family": sample_index // 4} if loss_fn.needs_family else {})}


# Options under which a stateful loss's state moves on the first training step.
MOVING_STATE = {"adacl": {"queue_size": 8}, "fne": {"start_epoch": 0, "min_matched": 1}}


def _stateful_loss(name):
    return create_loss(name, **_default_options(name), **MOVING_STATE.get(name, {}))


def _step(loss_fn, seed):
    """One training step's loss value (forward and backward) on fresh features whose pairs match."""
    x, noise = _features(seed=seed)
    y = F.normalize(x.detach() + 0.5 * noise.detach(), dim=-1).requires_grad_()
    value = loss_fn(x, y, torch.tensor(10.0), torch.tensor(-10.0), **_inputs(loss_fn, torch.arange(8) + 8 * seed))
    value.backward()
    return value.detach()


def _states_equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


@pytest.mark.parametrize("name", list_losses())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_forward_returns_finite_scalar_and_dict(name, dtype):
    loss_fn = create_loss(name, **_default_options(name))
    x, y = _features(dtype=dtype)
    scale = torch.tensor(10.0, dtype=dtype)
    bias = torch.tensor(-10.0, dtype=dtype)
    inputs = _inputs(loss_fn, torch.arange(8))
    value = loss_fn(x, y, scale, bias, **inputs)
    assert value.dim() == 0 and torch.isfinite(value)
    value.backward()
    assert torch.isfinite(x.grad).all()
    out = loss_fn(x, y, scale, bias, **inputs, output_dict=True)
    assert set(out) == {"contrastive_loss"}
    assert isinstance(loss_fn.stats, dict)
    assert all(torch.is_tensor(v) and v.dim() == 0 for v in loss_fn.stats.values())


@pytest.mark.parametrize("name", list_losses())
def test_forward_stages_the_state_update_and_commit_applies_it(name):
    loss_fn = _stateful_loss(name)
    fresh = {key: value.clone() for key, value in loss_fn.state_dict().items()}
    _step(loss_fn, seed=0)
    assert _states_equal(loss_fn.state_dict(), fresh)  # forward (and backward) alone move nothing
    _step(loss_fn, seed=1)  # a new forward drops the update of the one before, never committed
    loss_fn.commit()
    loss_fn.commit()  # nothing staged any more
    once = _stateful_loss(name)
    _step(once, seed=1)
    once.commit()
    assert _states_equal(loss_fn.state_dict(), once.state_dict())
    # A stateful loss's state moved; a stateless one has none to checkpoint.
    assert (not fresh) or not _states_equal(loss_fn.state_dict(), fresh)


@pytest.mark.parametrize("name", list_losses())
def test_state_dict_round_trip_continues_exactly(name):
    """A loss loaded from another's state_dict continues exactly as the original (value, stats, state)."""
    original = _stateful_loss(name)
    _step(original, seed=0)
    original.commit()
    clone = _stateful_loss(name)
    clone.load_state_dict(original.state_dict())
    assert _states_equal(clone.state_dict(), original.state_dict())
    for loss_fn in (original, clone):
        loss_fn.continued = _step(loss_fn, seed=1)
        loss_fn.commit()
    assert torch.equal(clone.continued, original.continued)
    assert clone.stats.keys() == original.stats.keys()
    assert all(torch.equal(clone.stats[key], original.stats[key]) for key in original.stats)
    assert _states_equal(clone.state_dict(), original.state_dict())
    if original.state_dict():  # the restored state mattered: a fresh loss continues differently
        fresh = _stateful_loss(name)
        _step(fresh, seed=1)
        fresh.commit()
        assert not _states_equal(fresh.state_dict(), original.state_dict())


def test_unknown_loss_and_option_are_clear_errors():
    with pytest.raises(ValueError, match="unknown loss 'nope'.*clip"):
        create_loss("nope")
    with pytest.raises(TypeError, match="unknown option"):
        create_loss("clip", not_an_option=1)


def test_duplicate_registration_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        open_clip_adacl.register_loss("clip")(type("Dup", (torch.nn.Module,), {}))


@pytest.mark.parametrize("name", list_losses())
def test_declared_capabilities_match_the_loss(name):
    """keeps_state <=> checkpointed buffers; the data_size option <=> Options derive SampleStateOptions, which
    needs_sample_index implies (a loss without it keeps per-sample state only under some options, not its
    defaults: AdaCL's memory bank); every option has help text and its default passes validation."""
    cls = open_clip_adacl.get_loss_class(name)
    loss_fn = create_loss(name, **_default_options(name))
    assert bool(loss_fn.state_dict()) == cls.keeps_state
    specs = cls.Options.specs()
    per_sample = issubclass(cls.Options, SampleStateOptions)
    assert ("data_size" in {spec.name for spec in specs}) == per_sample
    assert (per_sample and loss_fn.options.keeps_sample_state) == cls.needs_sample_index
    assert all(spec.help for spec in specs)


def _undeclared_loss(**attributes):
    return type("Undeclared", (ContrastiveLoss,), attributes)


class _UndecoratedOptions(LossOptions):  # forgot @dataclass: x would not be a field
    x: int = option(1, "an option")


@dataclass(frozen=True)
class _PlainFieldOptions(LossOptions):
    x: int = 1


@pytest.mark.parametrize(
    "attributes, message",
    [
        ({"Options": _UndecoratedOptions}, "must be a @dataclass\\(frozen=True\\) deriving from LossOptions"),
        ({"Options": _PlainFieldOptions}, "declare x with option\\(default, help\\)"),
        ({"needs_sample_index": True}, "must derive from SampleStateOptions"),
    ],
)
def test_registration_refuses_an_inconsistent_declaration(monkeypatch, attributes, message):
    scratch_entries(monkeypatch, registry.LOSSES)
    with pytest.raises(TypeError, match=message):
        open_clip_adacl.register_loss("undeclared")(_undeclared_loss(**attributes))
    with pytest.raises(TypeError, match="not a subclass of open_clip_adacl.losses.Loss"):
        open_clip_adacl.register_loss("module")(torch.nn.Module)


def test_options_are_typed_and_checked_when_built():
    options = open_clip_adacl.get_loss_class("adacl").Options
    assert options(max_offset=2).max_offset == 2.0 and isinstance(options(max_offset=2).max_offset, float)
    with pytest.raises(ValueError, match="option queue_size must be an int, got 1.5"):
        options(queue_size=1.5)
    with pytest.raises(ValueError, match="option mode must be one of \\['literal', 'calibrated'\\], got 'x'"):
        options(mode="x")
    with pytest.raises(ValueError, match="ema must be in \\[0, 1\\), got 1.0"):
        options(ema=1.0)
