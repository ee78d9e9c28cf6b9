"""The loss's clone discovery as a list of pairs (docs/method.md §3.1-3.4), for tools that show it.

Inside the loss, `selection.select_anchor` decides which negatives of a direction are clone
candidates (salient scores, reference rows, the two Gaussian fits, the candidate region) but never
lists them: it needs only their count and the anchor. `clone_pairs` runs that same selection and
then lists the candidates under its fits with `adacl_math.clone_candidate_mask`, the dense definition
that the selection's exactness tests hold equal to its own candidate set; with the fits it gives
each pair's posterior p(clone | score). Row chunks keep the temporaries at the selection's chunk
size, so memory is that of the scores plus the pairs. Ranks holding different rows of one global
batch (`RowGroup` over them) get the pairs of their own rows, selected over the global batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import adacl_math
from .distributed import RowGroup
from .row_passes import row_chunks
from .selection import AnchorSelection, select_anchor, summarize_rows


@dataclass
class ClonePairs:
    """One direction's clone candidates on this rank, in (row, column) order."""

    row: torch.Tensor  # K int64: the query's global row (its positive column)
    col: torch.Tensor  # K int64: the candidate negative's column
    score: torch.Tensor  # K float64: the pair's score, in the units the scores were given in
    gap: torch.Tensor  # K float64: the row's positive score minus the pair's (section 3.5's d_ij)
    posterior: torch.Tensor  # K float64: p(clone | score) under the batch's two Gaussians
    selection: AnchorSelection  # the loss's own selection: reference fits, candidate count, anchor


@torch.no_grad()
def clone_pairs(
    scores: torch.Tensor,
    positive_col: torch.Tensor,
    rows: RowGroup,
    *,
    salient: str,
    region: str,
    prior_ratio: float,
    std_floor: float,
) -> ClonePairs:
    """The clone candidates of this rank's rows x C `scores` (cosines, or logits t cos + b with
    `std_floor` scaled alike, as the loss passes them); `positive_col` is each row's global index.
    The median anchor is computed as the loss's default computes it; it costs one pass."""
    summary = summarize_rows(scores, positive_col, with_mean=salient == "mean")
    selection = select_anchor(
        scores,
        summary,
        positive_col,
        rows,
        salient=salient,
        anchor_stat="median",
        prior_ratio=prior_ratio,
        std_floor=std_floor,
        region=region,
    )
    fits = selection.reference.to(scores.device)
    found_rows, found_cols = [], []
    for start, stop in row_chunks(*scores.shape, scores.device):
        mask = adacl_math.clone_candidate_mask(
            scores[start:stop], positive_col[start:stop], *fits, prior_ratio=prior_ratio, region=region
        )
        local_row, col = mask.nonzero(as_tuple=True)
        found_rows.append(local_row + start)
        found_cols.append(col)
    local_row = torch.cat(found_rows) if found_rows else positive_col.new_empty(0)
    col = torch.cat(found_cols) if found_cols else positive_col.new_empty(0)
    row = positive_col[local_row]
    score = scores[local_row, col].double()
    gap = scores[local_row, row].double() - score
    posterior = adacl_math.gda_posterior(score, *fits, prior_ratio=prior_ratio)
    return ClonePairs(row, col, score, gap, posterior, selection)
