"""How well AdaCL's clone discovery finds the true clone negatives of a batch (for the loss comparison).

The loss never sees labels. To judge its discovery step, this module rebuilds batches whose
ground truth is known: training shards written in families of one-edit siblings (each sample's
json carries `"family"`), read in order so that a batch holds whole families. For a model, each
batch's cosine matrix goes through the loss's own discovery (`open_clip_adacl.discovery.clone_pairs`:
the selection's salient scores, reference rows, Gaussian fits and candidate region), and the flagged
negatives are compared with the true siblings (same family, other sample):

- precision: the fraction of flagged negatives that are true siblings;
- recall: the fraction of true siblings that are flagged;
- flagged: the fraction of all negatives flagged (the candidate set's size);
- sibling_fraction: the fraction of all negatives that are siblings (the precision of flagging
  everything, i.e. of `candidate_region all`).

Both directions (image-to-text rows, text-to-image rows) are pooled. Every (salient score,
candidate region) pair is measured on the same batches, so the choice of default compares like
with like (docs/adacl.md).
"""

from __future__ import annotations

import json
from itertools import islice
from typing import Callable, Dict, Iterator, List, Sequence, Tuple

import torch
import webdataset as wds

from open_clip_adacl import adacl_math
from open_clip_adacl.discovery import clone_pairs
from open_clip_adacl.distributed import RowGroup

REGIONS = ("gda", "upper")


def family_batches(
    shards: Sequence[str], batch_size: int, num_batches: int, caption_key: str = "txt"
) -> Iterator[Tuple[list, List[str], torch.Tensor]]:
    """(images, captions, family ids) batches from `shards` in file order (no shuffle), so that
    contiguous families stay whole. Samples without a `family` in their json are an error."""
    dataset = wds.WebDataset(list(shards), shardshuffle=False).decode("pil")
    samples = iter(dataset)
    for _ in range(num_batches):
        chunk = list(islice(samples, batch_size))
        if len(chunk) < batch_size:
            return
        families = []
        for sample in chunk:
            meta = sample["json"] if isinstance(sample["json"], dict) else json.loads(sample["json"])
            if "family" not in meta:
                raise ValueError(
                    f"sample {sample['__key__']} has no 'family' in its json: clone detection needs "
                    "shards written in families (python -m training.synthetic_scenes --family-size K)"
                )
            families.append(int(meta["family"]))
        images = [sample.get("png") or sample.get("jpg") for sample in chunk]
        captions = [_text(sample[caption_key]) for sample in chunk]
        yield images, captions, torch.tensor(families)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def detection_counts(
    similarities: torch.Tensor, siblings: torch.Tensor, *, salient: str, region: str, std_floor: float = 1e-4
) -> torch.Tensor:
    """(flagged, flagged siblings, siblings, negatives) of one direction's rows x N cosine matrix.

    `siblings` (N x N bool) marks true clone negatives; the diagonal holds the positives.
    """
    num_rows = similarities.shape[0]
    positive_col = torch.arange(num_rows)
    flagged = clone_pairs(
        similarities,
        positive_col,
        RowGroup(split_across_ranks=False),
        salient=salient,
        region=region,
        prior_ratio=1.0,
        std_floor=std_floor,
    )
    negatives = adacl_math.negative_mask(num_rows, similarities.shape[1], positive_col)
    return torch.tensor(
        [flagged.row.numel(), siblings[flagged.row, flagged.col].sum(), (siblings & negatives).sum(), negatives.sum()],
        dtype=torch.float64,
    )


@torch.no_grad()
def evaluate_clone_detection(
    model: torch.nn.Module,
    preprocess: Callable,
    tokenizer: Callable,
    shards: Sequence[str],
    *,
    batch_size: int,
    num_batches: int = 8,
    device: str = "cpu",
    caption_key: str = "txt",
) -> Dict[str, float]:
    """Precision, recall and flagged fraction per `<salient>-<region>`, and the sibling fraction."""
    model.eval()
    totals: Dict[str, torch.Tensor] = {}
    batches = 0
    for images, captions, families in family_batches(shards, batch_size, num_batches, caption_key):
        image_features = (
            model.encode_image(torch.stack([preprocess(image) for image in images]).to(device), normalize=True)
            .float()
            .cpu()
        )
        text_features = model.encode_text(tokenizer(captions).to(device), normalize=True).float().cpu()
        similarities = image_features @ text_features.T
        siblings = families[:, None] == families[None, :]
        for salient in adacl_math.SALIENT_KINDS:
            for region in REGIONS:
                key = f"{salient}-{region}"
                for direction in (similarities, similarities.T):
                    counts = detection_counts(direction, siblings, salient=salient, region=region)
                    totals[key] = totals.get(key, 0) + counts
        batches += 1
    if not batches:
        raise ValueError(f"no full batch of {batch_size} samples in {list(shards)[:3]}...")
    metrics: Dict[str, float] = {}
    for key, (flagged, hits, true, negatives) in totals.items():
        metrics[f"{key}/precision"] = float(hits / flagged) if flagged else 0.0  # nothing flagged: none right
        metrics[f"{key}/recall"] = float(hits / true) if true else 0.0
        metrics[f"{key}/flagged"] = float(flagged / negatives)
    _, _, true, negatives = next(iter(totals.values()))  # the same batches for every key
    metrics["sibling_fraction"] = float(true / negatives)
    return metrics
