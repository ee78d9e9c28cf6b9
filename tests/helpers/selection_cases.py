"""Logits and one anchor selection, shared by the selection tests (eager and fused passes)."""

import torch
import torch.nn.functional as F

from open_clip_adacl import selection
from open_clip_adacl.distributed import RowGroup

SCALE = 14.3
LOCAL = RowGroup(split_across_ranks=False)


def random_logits(n=48, d=16, seed=2, noise=0.8):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1)
    y = F.normalize(x + noise * torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1)
    return (SCALE * x @ y.T).float()


def select_anchor(logits, positive_col, rows=LOCAL, salient="max", anchor_stat="median", prior_ratio=1.0, region="gda"):
    summary = selection.summarize_rows(logits, positive_col, with_mean=salient == "mean")
    return selection.select_anchor(
        logits,
        summary,
        positive_col,
        rows,
        salient=salient,
        anchor_stat=anchor_stat,
        prior_ratio=prior_ratio,
        std_floor=1e-3,
        region=region,
    )


def algorithm_1_anchor_row(logits, std_floor):
    """Row u of Algorithm 1's median-gap anchor on one process, from the method's dense definitions
    (`helpers.adacl_reference`; docs/method.md §3.1-3.5: max salient score, GDA candidates), without gradient.
    `logits`: rows x C, row i's positive in column i (extra negative columns after the batch's)."""
    from helpers import adacl_reference as reference
    from open_clip_adacl import adacl_math

    with torch.no_grad():
        logits = logits.detach()
        labels = torch.arange(logits.shape[0])
        negatives = adacl_math.negative_mask(*logits.shape, labels)
        most, least = reference.reference_rows(reference.salient_scores(logits, labels, "max"))
        mu_n, sigma_n = adacl_math.gaussian_fit(logits[most], negatives[most], std_floor)  # S_sln: not clone
        mu_c, sigma_c = adacl_math.gaussian_fit(logits[least], negatives[least], std_floor)  # S_cln: clone
        candidates = adacl_math.clone_candidate_mask(logits, labels, mu_c, sigma_c, mu_n, sigma_n, 1.0, "gda")
        assert candidates.any()
        _, row, _ = reference.anchor_statistic(reference.positive_gaps(logits, labels), candidates, "median")
    return row
