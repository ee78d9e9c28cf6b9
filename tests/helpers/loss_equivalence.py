"""Run a stateful loss for a few steps in one process and on gloo ranks, and compare the two.

Stateful losses (per-sample thresholds, running statistics) must match the single process on the
concatenated batch at every step (value and gradients, with OpenCLIP's gradient-scale semantics of
each regime; see tests/open_clip_adacl/losses/test_clip_loss.py) and leave the same state on every rank.
"""

from __future__ import annotations

import io
from typing import Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F

from helpers.distributed_utils import run_on_ranks
from open_clip_adacl import DistributedSetup, create_loss

LOGIT_SCALE = 14.3
REGIMES = ((False, False), (True, True))  # (local_loss, gather_with_grad): full logits, local loss

# image features, text features, sample_index[, family: for a loss that needs_family]
Batch = Tuple[torch.Tensor, ...]


def make_batches(num_steps: int, n: int, d: int, *, data_size: int, noise: float = 0.6, seed: int = 0) -> List[Batch]:
    """Unit features whose pairs are correlated (so rows can be matched), and sample ids drawn from
    [0, data_size) without repeats within a batch."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(num_steps):
        x = torch.randn(n, d, generator=g)
        y = x + noise * torch.randn(n, d, generator=g)
        index = torch.randperm(data_size, generator=g)[:n]
        batches.append((F.normalize(x, dim=-1), F.normalize(y, dim=-1), index))
    return batches


def value_and_grads(
    loss_fn, x: torch.Tensor, y: torch.Tensor, index: torch.Tensor, scale: float = LOGIT_SCALE, **inputs
) -> Tuple[torch.Tensor, ...]:
    """Loss value and gradients with respect to both features and the logit scale; `inputs` (e.g.
    `family`) go to the loss with `sample_index`."""
    x = x.clone().requires_grad_()
    y = y.clone().requires_grad_()
    scale = torch.tensor(scale, requires_grad=True)
    value = loss_fn(x, y, scale, sample_index=index, **inputs)
    value.backward()
    return value.detach(), x.grad, y.grad, scale.grad


def run_steps(loss_fn, batches: Sequence[Batch], rank: int = 0, world_size: int = 1):
    """Each step's (value, grad x, grad y, grad scale) on this rank's slice, and the final state_dict.
    Each step's state update is committed, as the trainer does after the optimizer step."""
    steps = []
    for x, y, index, *family in batches:
        rows = slice(rank * (len(x) // world_size), (rank + 1) * (len(x) // world_size))
        inputs = {"family": family[0][rows]} if family else {}
        steps.append(value_and_grads(loss_fn, x[rows], y[rows], index[rows], **inputs))
        loss_fn.commit()
    return steps, {key: value.clone() for key, value in loss_fn.state_dict().items()}


def assert_resume_is_exact(name: str, options: Dict, batches: Sequence[Batch], resume_at: int = 2):
    """A run saved after `resume_at` steps and loaded into a fresh loss continues exactly like the
    uninterrupted run (every step's value and gradients, and the final state). Returns the resumed loss."""
    steps, final_state = run_steps(create_loss(name, **options), batches)
    first = create_loss(name, **options)
    run_steps(first, batches[:resume_at])
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = create_loss(name, **options)
    resumed.load_state_dict(torch.load(buffer))
    resumed_steps, resumed_state = run_steps(resumed, batches[resume_at:])
    for ours, ref in zip(resumed_steps, steps[resume_at:]):
        for a, b in zip(ours, ref):
            assert torch.equal(a, b)
    assert final_state.keys() == resumed_state.keys()
    for key in final_state:
        assert torch.equal(resumed_state[key], final_state[key]), key
    return resumed


def _rank_steps(rank: int, world_size: int, name: str, options: Dict, batches: Sequence[Batch]):
    results = {}
    for local_loss, gather_with_grad in REGIMES:
        dist = DistributedSetup(
            rank=rank, world_size=world_size, local_loss=local_loss, gather_with_grad=gather_with_grad
        )
        loss_fn = create_loss(name, dist=dist, **options)
        results[local_loss] = run_steps(loss_fn, batches, rank, world_size)
    return results


def assert_ranks_match_single_process(name: str, options: Dict, batches: Sequence[Batch], world_size: int = 2) -> None:
    """Both regimes on `world_size` gloo ranks against one process, step by step, state included."""
    reference_steps, reference_state = run_steps(create_loss(name, **options), batches)
    per_rank = run_on_ranks(_rank_steps, world_size, name, options, batches)
    for local_loss, _ in REGIMES:
        for step, reference in enumerate(reference_steps):
            ref_value, ref_gx, ref_gy, _ = reference
            values = torch.stack([per_rank[r][local_loss][0][step][0] for r in range(world_size)])
            gx = torch.cat([per_rank[r][local_loss][0][step][1] for r in range(world_size)])
            gy = torch.cat([per_rank[r][local_loss][0][step][2] for r in range(world_size)])
            context = f"{name}, local_loss={local_loss}, step {step}"
            # Local loss: the ranks' mean is the global loss and feature gradients are world_size
            # times the global ones (DDP's averaging restores them). Full logits: every rank
            # computes the global loss, and gradients reach its own rows only.
            scale = world_size if local_loss else 1
            if local_loss:
                torch.testing.assert_close(values.mean(), ref_value, atol=1e-5, rtol=1e-5, msg=context)
            else:
                for value in values:
                    torch.testing.assert_close(value, ref_value, atol=1e-5, rtol=1e-5, msg=context)
            torch.testing.assert_close(gx, ref_gx * scale, atol=1e-5, rtol=1e-4, msg=context)
            torch.testing.assert_close(gy, ref_gy * scale, atol=1e-5, rtol=1e-4, msg=context)
        states = [per_rank[r][local_loss][1] for r in range(world_size)]
        for key, reference in reference_state.items():
            for rank_state in states[1:]:
                assert torch.equal(rank_state[key], states[0][key]), f"{key} differs between ranks ({name})"
            torch.testing.assert_close(
                states[0][key], reference, atol=1e-5, rtol=1e-5, msg=f"{key}: {name}, local_loss={local_loss}"
            )
