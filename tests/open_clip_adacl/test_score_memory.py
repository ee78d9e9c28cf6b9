"""`open_clip_adacl.score_memory` and the persistence signals: the memory's moving average on numbers worked by
hand, and the persistence scores over several steps on 2 and 3 gloo ranks against one process, bit for bit,
with samples that move between ranks from step to step."""

import pytest
import torch
import torch.nn.functional as F

from helpers.distributed_utils import run_on_ranks
from open_clip_adacl.clone_signals import (
    DIRECTIONS,
    SIGNALS,
    clone_scores,
    pair_inputs,
    persistence_current,
    persistence_update,
)
from open_clip_adacl.distributed import RowGroup, gather_no_grad
from open_clip_adacl.score_memory import PairScoreMemory, pair_keys

N, DIM, STEPS, SCALE = 12, 8, 4, 14.3


def test_a_pair_reads_its_score_until_met_then_the_moving_average():
    memory = PairScoreMemory(momentum=0.25)
    ids = torch.tensor([5, 9])
    first = torch.tensor([[0.0, 2.0], [4.0, 0.0]])
    keep = ~torch.eye(2, dtype=torch.bool)
    assert torch.equal(memory.blend(ids, ids, first), first)  # never met: this step's score
    memory.update(ids, ids, first, keep)
    assert len(memory) == 2  # the two ordered pairs, not a row's own
    second = torch.tensor([[1.0, 6.0], [0.0, 0.0]])
    blended = memory.blend(ids, ids, second)
    assert blended[0, 1] == pytest.approx(0.75 * 2.0 + 0.25 * 6.0)
    assert blended[1, 0] == pytest.approx(0.75 * 4.0 + 0.25 * 0.0)
    assert blended[0, 0] == 1.0  # (5, 5) was never kept: its own score
    # keyed by sample ids, not positions: the same pair in other places of another batch reads the same
    swapped = memory.blend(torch.tensor([9, 5]), torch.tensor([9, 5]), second.flip(0).flip(1))
    assert swapped[1, 0] == blended[0, 1]


def test_an_update_writes_the_blend_and_a_pair_listed_twice_keeps_the_mean():
    memory = PairScoreMemory(momentum=0.5)
    rows, cols = torch.tensor([1, 1]), torch.tensor([2, 3])
    memory.update(rows, cols, torch.tensor([[2.0, 8.0], [4.0, 0.0]]), torch.tensor([[True, False], [True, False]]))
    assert len(memory) == 1 and memory.blend(torch.tensor([1]), torch.tensor([2]), torch.tensor([[3.0]])) == 3.0
    memory.clear()
    assert len(memory) == 0


def test_keys_and_momentum_are_checked():
    assert pair_keys(torch.tensor([1]), torch.tensor([2])).item() == (1 << 31) + 2
    with pytest.raises(ValueError, match="sample ids must lie in"):
        pair_keys(torch.tensor([-1]), torch.tensor([2]))
    with pytest.raises(ValueError, match="momentum must be in"):
        PairScoreMemory(momentum=0)


def _steps():
    """STEPS batches of N samples drawn from 2N ids (so pairs meet again), features in families of 3."""
    g = torch.Generator().manual_seed(7)
    centre = torch.randn(2 * N // 3, DIM, generator=g)
    batches = []
    for _ in range(STEPS):
        ids = torch.randperm(2 * N, generator=g)[:N]
        image = F.normalize(centre[ids // 3] + 0.6 * torch.randn(N, DIM, generator=g), dim=-1)
        text = F.normalize(centre[ids // 3] + 0.6 * torch.randn(N, DIM, generator=g), dim=-1)
        tokens = torch.stack([torch.tensor([49406, 100 + int(i) // 3, 200 + int(i) % 2, 49407]) for i in ids])
        batches.append((ids, image, text, tokens))
    return batches


def _persistence_scores(rank: int, world_size: int):
    """Every step's persistence scores of this rank's rows, the memory updated after each step as a loss does."""
    memory, found = PairScoreMemory(), []
    per_rank = N // world_size
    rows = slice(rank * per_rank, (rank + 1) * per_rank)
    for ids, image, text, tokens in _steps():
        query_image, query_text = image[rows], text[rows]
        all_image, all_text = gather_no_grad(query_image, world_size), gather_no_grad(query_text, world_size)
        inputs = pair_inputs(
            SCALE * query_image @ all_text.T,
            SCALE * query_text @ all_image.T,
            torch.arange(rows.start, rows.stop),
            query_image,
            query_text,
            all_image,
            all_text,
            torch.tensor(SCALE),
            RowGroup(world_size > 1),
            local_tokens=tokens[rows],
            world_size=world_size,
            all_ids=gather_no_grad(ids[rows], world_size),
            memory=memory,
        )
        found.append(
            {
                (name, d): clone_scores(inputs, name, d)
                for name, signal in SIGNALS.items()
                if signal.persistent
                for d in DIRECTIONS
            }
        )
        found[-1]["current"] = persistence_current(inputs)
        memory.update(*persistence_update(inputs, world_size))
    return found


@pytest.mark.parametrize("world_size", [2, 3])
def test_persistence_on_ranks_matches_one_process_over_steps(world_size):
    whole = _persistence_scores(0, 1)
    per_rank = run_on_ranks(_persistence_scores, world_size)
    for step, scores in enumerate(whole):
        for key, value in scores.items():
            assert torch.equal(torch.cat([found[step][key] for found in per_rank]), value), (step, key)
    # the memory is in use: from the second step on, pairs met before read their average, not this step's score
    assert torch.equal(
        whole[0]["persistence", "i2t"], whole[0]["current"].masked_fill(torch.eye(N, dtype=torch.bool), float("-inf"))
    )
    later = whole[-1]["persistence", "i2t"] != whole[-1]["current"]
    assert later.sum() > N  # besides the diagonal
