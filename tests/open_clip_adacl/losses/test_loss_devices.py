"""Every registered loss computes on each device this machine has what it computes on the CPU.

On a CPU-only machine the CPU is the one device and the test checks that the loss's values, gradients,
stats and state stay on the device of its inputs; where CUDA is present (`scripts/gpu_bench.sh` runs this
file first), the same steps also run on the GPU and must match the CPU's within float32 rounding. Devices
are listed, not skipped: a machine without CUDA runs the CPU cases only.
"""

import pytest
import torch
import torch.nn.functional as F

import open_clip_adacl
from open_clip_adacl import create_loss, list_losses

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# Each AdaCL mode once (the selection and both closed forms), and the memory bank's extra columns.
VARIANTS = [(name, {}) for name in list_losses()] + [
    ("adacl", {"mode": "literal"}),
    ("adacl", {"mode": "calibrated"}),
    ("adacl", {"preset": "paper"}),
]
N, D, STEPS = 64, 32, 3


def _options(name, options):
    cls = open_clip_adacl.get_loss_class(name)
    return {**({"data_size": 4 * N} if cls.needs_sample_index else {}), **options}


def _steps(name, options, device):
    """(value, grad image, grad text, grad scale, stats) of STEPS training steps on `device`, moved to the CPU;
    and the device of every tensor the loss left in `stats` or its state."""
    loss_fn = create_loss(name, **_options(name, options)).to(device)
    g = torch.Generator().manual_seed(0)
    results, devices = [], set()
    for step in range(STEPS):
        x = F.normalize(torch.randn(N, D, generator=g), dim=-1)
        y = F.normalize(x + 0.6 * torch.randn(N, D, generator=g), dim=-1)
        index = torch.randperm(4 * N, generator=g)[:N]
        inputs = {"sample_index": index.to(device)}
        if loss_fn.needs_family:
            inputs["family"] = (index // 4).to(device)
        x, y = x.to(device).requires_grad_(), y.to(device).requires_grad_()
        scale = torch.tensor(14.3, device=device, requires_grad=True)
        bias = torch.tensor(-10.0, device=device, requires_grad=True)
        value = loss_fn(x, y, scale, bias, **inputs)
        value.backward()
        loss_fn.commit()
        devices |= {t.device.type for t in [value, *loss_fn.stats.values(), *loss_fn.state_dict().values()]}
        results.append(
            [t.detach().cpu() for t in (value, x.grad, y.grad, scale.grad)]
            + [{k: v.detach().cpu() for k, v in loss_fn.stats.items()}]
        )
    return results, devices


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "name,options", VARIANTS, ids=[f"{n}-{'-'.join(map(str, o.values())) or 'default'}" for n, o in VARIANTS]
)
def test_loss_runs_on_the_device_and_matches_the_cpu(name, options, device):
    results, devices = _steps(name, options, device)
    assert devices == {torch.device(device).type}, f"{name} left tensors on {devices - {device}}"
    if device == "cpu":
        assert all(torch.isfinite(step[0]) for step in results)
        return
    expected, _ = _steps(name, options, "cpu")
    for got, want in zip(results, expected):
        for a, b in zip(got[:4], want[:4]):
            if b is None:
                assert a is None
            else:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        assert got[4].keys() == want[4].keys()
        for key in want[4]:
            torch.testing.assert_close(
                got[4][key].double(),
                want[4][key].double(),
                rtol=1e-3,
                atol=1e-4,
                equal_nan=True,
                msg=lambda m, key=key: f"stat {key}: {m}",
            )
