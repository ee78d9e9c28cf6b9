"""`open_clip_adacl.discovery.clone_pairs`: the pairs the loss's own selection flags, listed (ranks holding
unequal rows of a global batch: tests/training/discover/test_discover.py runs the command on 2 gloo ranks)."""

import pytest
import torch
import torch.nn.functional as F

from open_clip_adacl import adacl_math, row_passes
from open_clip_adacl.discovery import clone_pairs
from open_clip_adacl.distributed import RowGroup

SCALE = 14.3
N = 48
LOCAL = RowGroup(split_across_ranks=False)


def _logits(seed=2, noise=0.8):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(N, 16, generator=g, dtype=torch.float64), dim=-1)
    y = F.normalize(x + noise * torch.randn(N, 16, generator=g, dtype=torch.float64), dim=-1)
    return (SCALE * x @ y.T).float()


def _pairs(logits, positive_col, rows=LOCAL, salient="max", region="upper"):
    return clone_pairs(logits, positive_col, rows, salient=salient, region=region, prior_ratio=1.0, std_floor=1e-3)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of 5 rows: the listing runs over several chunks, the last one partial."""
    monkeypatch.setitem(row_passes.CHUNK_ELEMENTS, "cpu", 5 * N)


@pytest.mark.parametrize("salient", adacl_math.SALIENT_KINDS)
@pytest.mark.parametrize("region", adacl_math.CANDIDATE_REGIONS)
def test_the_listed_pairs_are_the_selections_candidates(salient, region):
    logits = _logits()
    positive_col = torch.arange(N)
    found = _pairs(logits, positive_col, salient=salient, region=region)
    # The loss's own count, and the dense definition under the loss's fits, pair for pair.
    assert found.row.numel() == found.selection.num_candidates.item() > 0
    expected = adacl_math.clone_candidate_mask(logits, positive_col, *found.selection.reference, region=region)
    assert torch.equal(torch.stack([found.row, found.col]), torch.stack(expected.nonzero(as_tuple=True)))
    assert (found.row != found.col).all()
    assert torch.equal(found.score, logits[found.row, found.col].double())
    assert torch.allclose(found.gap, (logits[found.row, found.row] - logits[found.row, found.col]).double())
    if region != "all":
        assert (found.posterior > 0.5).all()
    if region == "upper":
        assert (found.score > found.selection.reference[2]).all()


def test_scores_in_cosine_or_logit_units_flag_the_same_pairs():
    logits = _logits(seed=5)
    positive_col = torch.arange(N)
    in_logits = _pairs(logits, positive_col)
    in_cosines = clone_pairs(
        logits.double() / SCALE,
        positive_col,
        LOCAL,
        salient="max",
        region="upper",
        prior_ratio=1.0,
        std_floor=1e-3 / SCALE,
    )
    assert torch.equal(in_logits.row, in_cosines.row) and torch.equal(in_logits.col, in_cosines.col)
    assert torch.allclose(in_logits.posterior, in_cosines.posterior)
