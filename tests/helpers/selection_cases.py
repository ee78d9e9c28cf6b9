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
    return selection.select_anchor(logits, summary, positive_col, rows, salient=salient, anchor_stat=anchor_stat,
                                   prior_ratio=prior_ratio, std_floor=1e-3, region=region)
