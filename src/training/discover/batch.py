"""One global batch through the loss's discovery: encode, gather, select, count.

Each rank encodes its slice, the features are gathered (`open_clip_adacl.distributed.gather_no_grad`,
padded since a slice may have lost samples to the checks), and each rank computes its own rows'
logits against the global batch exactly as the loss does with `--local-loss`
(`logit_scale * features @ all_other_features.T`, plus the bias of a SigLIP model). The discovery
itself is `open_clip_adacl.discovery.clone_pairs` with the loss's options: the loss's selection over
the global batch (its reductions span the ranks), then the pairs it flags. Reported values are in
cosine units (logits mapped back through the model's scale and bias), like the page and the plots.

What leaves a batch: per direction its counts (rows, negatives, flagged, and against ground-truth
families when every sample carries one), the fits, the anchor, histograms of the similarities, and
the pairs kept for `pairs.jsonl` (every row's most probable `pairs_per_row` candidates; all with 0),
gathered on rank 0.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Dict, List, Optional, Tuple

import torch

from open_clip_adacl.clone_signals import STANDARD_THRESHOLD, PairInputs, clone_scores, flag_clones
from open_clip_adacl.discovery import clone_pairs
from open_clip_adacl.distributed import RowGroup, gather_no_grad
from open_clip_adacl.losses.adacl import MIN_ROWS

from ..trainer.distributed import DistributedEnv, all_gather_object, all_reduce_sum
from .data import LocalBatch, SampleInfo, thumbnail_png
from .facts import facts_apart

DIRECTIONS = ("i2t", "t2i")
HISTOGRAM_BINS = 100  # over cosine similarity [-1, 1]


@dataclass(frozen=True)
class DiscoveryOptions:
    """The loss options that decide the discovery (AdaCLLoss.Options' names and defaults)."""

    salient: str
    candidate_region: str
    prior_ratio: float
    std_floor: float  # cosine units, as the loss's option
    pairs_per_row: int  # pairs.jsonl keeps each row's most probable ones; 0: all
    clone_signals: Tuple[str, ...] = ()  # other clone signals to count (open_clip_adacl.clone_signals)
    signal_threshold: float = STANDARD_THRESHOLD  # their operating point (clone_signals.flag_clones)


@dataclass
class DirectionResult:
    direction: str
    rows: int
    negatives: int
    flat_reference: bool
    fits: List[float]  # mu_clone, sigma_clone, mu_not_clone, sigma_not_clone (cosine)
    anchor_gap: Optional[float]  # the loss's median-anchor gap (cosine); None without candidates
    histograms: Dict[str, List[int]]  # "negatives", "flagged" (and "siblings") over HISTOGRAM_BINS
    flagged: int = 0
    flagged_siblings: Optional[int] = None  # with ground-truth families only
    siblings: Optional[int] = None
    kept_siblings: Optional[int] = None  # among the pairs kept for pairs.jsonl
    flagged_paraphrases: Optional[int] = None  # with families and facts: other family, same facts
    # per --clone-signals name: its flagged pairs and, with families, its flagged siblings
    signals: Dict[str, Dict[str, int]] = field(default_factory=dict)
    kept_paraphrases: Optional[int] = None
    pairs: List[dict] = field(default_factory=list)  # rank 0: the kept pairs, as pairs.jsonl lines


@dataclass
class BatchResult:
    index: int
    rows: int  # samples that passed the checks
    raw_samples: int  # samples of the batch before the checks
    skip_counts: List[int]
    directions: List[DirectionResult]  # empty when the batch had fewer than MIN_ROWS rows
    samples: List[SampleInfo]  # the rows in order (a pair's query_index / negative_index)

    def pairs_of_batch(self) -> List[dict]:
        return [pair for direction in self.directions for pair in direction.pairs]


class Encoder:
    """The model's normalized features under the run's precision, and its logit scale and bias."""

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        autocast: Callable[[], ContextManager] = nullcontext,
        input_dtype: Optional[torch.dtype] = None,
    ):
        self.model, self.device, self.autocast, self.input_dtype = model, device, autocast, input_dtype

    @torch.no_grad()
    def features(self, images: torch.Tensor, texts: torch.Tensor):
        with self.autocast():
            image_features = self.model.encode_image(images.to(self.device, self.input_dtype), normalize=True)
            text_features = self.model.encode_text(texts.to(self.device), normalize=True)
        return image_features.float(), text_features.float()

    @torch.no_grad()
    def scale_and_bias(self):
        """(logit_scale, as the loss receives it: exponentiated; logit_bias or None), float32."""
        bias = getattr(self.model, "logit_bias", None)
        return self.model.logit_scale.exp().float(), None if bias is None else bias.float()


def discover_batch(
    local: LocalBatch, encoder: Encoder, env: DistributedEnv, options: DiscoveryOptions
) -> Optional[BatchResult]:
    """The batch's result on rank 0 (None on the other ranks). Every rank must call it for every batch."""
    rows = len(local.samples)
    if rows:
        image_features, text_features = encoder.features(local.images, local.texts)
    shapes = all_gather_object((rows, image_features.shape[1] if rows else 0), env)
    counts = [count for count, _ in shapes]
    total = sum(counts)
    # Collectives take tensors on the run's device (NCCL reduces CUDA tensors only).
    skip_counts = all_reduce_sum(local.skip_counts.to(env.device), env).tolist()
    raw_samples = int(all_reduce_sum(torch.tensor(local.raw_samples, device=env.device), env))
    samples = [sample for part in all_gather_object(local.samples, env) for sample in part]
    if total < MIN_ROWS:  # the loss falls back to plain CL there too; nothing to discover
        return BatchResult(local.index, total, raw_samples, skip_counts, [], samples) if env.is_master else None
    if not rows:  # every sample of this rank's slice was skipped
        image_features = text_features = torch.empty(0, max(width for _, width in shapes), device=env.device)
    all_image = _gather_rows(image_features, counts, env)
    all_text = _gather_rows(text_features, counts, env)
    first = sum(counts[: env.rank])
    positive_col = torch.arange(first, first + rows, device=env.device)
    logit_scale, logit_bias = encoder.scale_and_bias()
    families, facts = _families(samples, env.device), _fact_ids(samples, env.device)

    logits = {}
    for direction in DIRECTIONS:
        queries, candidates = (image_features, all_text) if direction == "i2t" else (text_features, all_image)
        logits[direction] = logit_scale * queries @ candidates.T  # the loss's logits (ContrastiveLoss.build_batch)
        if logit_bias is not None:
            logits[direction] = logits[direction] + logit_bias
    results = [
        _direction(
            direction,
            logits[direction],
            positive_col,
            logit_scale,
            logit_bias,
            families,
            facts,
            samples,
            local.index,
            options,
            env,
        )
        for direction in DIRECTIONS
    ]
    if options.clone_signals:
        texts = (
            local.texts.to(env.device)
            if rows
            else torch.zeros(0, local.texts.shape[1], dtype=torch.long, device=env.device)
        )
        inputs = PairInputs(
            logits,
            positive_col,
            image_features,
            text_features,
            all_image,
            all_text,
            logit_scale,
            RowGroup(split_across_ranks=env.distributed),
            texts,
            _gather_rows(texts, counts, env),
        )
        for result in results:
            result.signals = _signal_counts(inputs, result.direction, families, options, env)
    return BatchResult(local.index, total, raw_samples, skip_counts, results, samples) if env.is_master else None


def batch_thumbnails(local: LocalBatch, positions: List[int], env: DistributedEnv, size: int) -> Dict[int, bytes]:
    """PNG thumbnails of the global batch's samples at `positions`, each made by the rank holding it,
    on rank 0 ({} elsewhere)."""
    first = sum(all_gather_object(len(local.samples), env)[: env.rank])
    mine = {
        position: thumbnail_png(local.image_bytes[position - first], size)
        for position in positions
        if first <= position < first + len(local.samples)
    }
    gathered = all_gather_object(mine, env)
    return {position: png for part in gathered for position, png in part.items()} if env.is_master else {}


def _gather_rows(features: torch.Tensor, counts: List[int], env: DistributedEnv) -> torch.Tensor:
    """Every rank's rows in rank order; slices of different lengths are padded for the all-gather."""
    if not env.distributed:
        return features
    padded = features.new_zeros(max(counts), features.shape[1])
    padded[: features.shape[0]] = features
    gathered = gather_no_grad(padded, env.world_size).view(env.world_size, max(counts), -1)
    return torch.cat([gathered[rank, :count] for rank, count in enumerate(counts)])


def _families(samples: List[SampleInfo], device: torch.device) -> Optional[torch.Tensor]:
    """Each sample's ground-truth family, or None unless every sample of the batch has one."""
    if any(sample.family is None for sample in samples):
        return None
    return torch.tensor([sample.family for sample in samples], device=device)


def _fact_ids(samples: List[SampleInfo], device: torch.device) -> Optional[torch.Tensor]:
    """Each sample's facts as a number (equal numbers: the same facts), or None unless every sample has facts.
    Every rank numbers the same gathered samples, so the numbers agree across ranks."""
    if any(sample.facts is None for sample in samples):
        return None
    numbers: Dict[tuple, int] = {}
    return torch.tensor([numbers.setdefault(sample.facts, len(numbers)) for sample in samples], device=device)


def _cosine(logits: torch.Tensor, logit_scale: torch.Tensor, logit_bias: Optional[torch.Tensor]) -> torch.Tensor:
    return (logits - (0 if logit_bias is None else logit_bias)) / logit_scale


def _histogram(cosines: torch.Tensor) -> torch.Tensor:
    """Counts over HISTOGRAM_BINS equal bins of [-1, 1] (a bincount: torch.histc is slow on CPUs)."""
    bins = ((cosines.float() + 1) * (HISTOGRAM_BINS / 2)).long().clamp_(0, HISTOGRAM_BINS - 1)
    return torch.bincount(bins, minlength=HISTOGRAM_BINS)


def _direction(
    direction: str,
    logits: torch.Tensor,
    positive_col: torch.Tensor,
    logit_scale: torch.Tensor,
    logit_bias: Optional[torch.Tensor],
    families: Optional[torch.Tensor],
    facts: Optional[torch.Tensor],
    samples: List[SampleInfo],
    batch_index: int,
    options: DiscoveryOptions,
    env: DistributedEnv,
) -> DirectionResult:
    scale, bias = logit_scale.double(), None if logit_bias is None else logit_bias.double()
    found = clone_pairs(
        logits,
        positive_col,
        RowGroup(split_across_ranks=env.distributed),
        salient=options.salient,
        region=options.candidate_region,
        prior_ratio=options.prior_ratio,
        std_floor=options.std_floor * scale,
    )
    negatives = torch.ones_like(logits, dtype=torch.bool)
    negatives[torch.arange(logits.shape[0], device=logits.device), positive_col] = False
    cosines = _cosine(logits, logit_scale, logit_bias)
    similarity, gap = _cosine(found.score, scale, bias), found.gap / scale
    histograms = {"negatives": _histogram(cosines[negatives]), "flagged": _histogram(similarity)}
    kept = _kept(found.row, found.posterior, found.gap, options.pairs_per_row)
    counts = {"flagged": found.row.numel()}
    if families is not None:
        same_family = families[found.row] == families[found.col]
        siblings = (families[positive_col][:, None] == families[None, :]) & negatives
        histograms["siblings"] = _histogram(cosines[siblings])
        counts.update(
            flagged_siblings=same_family.sum(), siblings=siblings.sum(), kept_siblings=same_family[kept].sum()
        )
        if facts is not None:  # another family's caption that says the same thing: a clone, not a false positive
            paraphrase = ~same_family & (facts[found.row] == facts[found.col])
            counts.update(flagged_paraphrases=paraphrase.sum(), kept_paraphrases=paraphrase[kept].sum())
    totals = dict(
        zip(counts, all_reduce_sum(torch.tensor([int(n) for n in counts.values()], device=env.device), env).tolist())
    )
    histograms = {name: all_reduce_sum(values, env).tolist() for name, values in histograms.items()}
    kept_pairs = all_gather_object(
        {
            "row": found.row[kept].tolist(),
            "col": found.col[kept].tolist(),
            "similarity": similarity[kept].tolist(),
            "gap": gap[kept].tolist(),
            "posterior": found.posterior[kept].tolist(),
        },
        env,
    )
    selection = found.selection
    reference = selection.reference.double()
    mu, sigma = _cosine(reference[[0, 2]], scale, bias), reference[[1, 3]] / scale
    has_anchor = bool(selection.num_candidates > 0)
    result = DirectionResult(
        direction=direction,
        rows=len(samples),
        negatives=len(samples) * (len(samples) - 1),
        flat_reference=bool(selection.flat_reference),
        fits=[mu[0].item(), sigma[0].item(), mu[1].item(), sigma[1].item()],
        anchor_gap=(selection.gap.double() / scale).item() if has_anchor else None,
        histograms=histograms,
        **totals,
    )
    if env.is_master:
        result.pairs = [line for part in kept_pairs for line in _pair_lines(part, direction, samples, batch_index)]
    return result


def _signal_counts(
    inputs: PairInputs, direction: str, families: Optional[torch.Tensor], options: DiscoveryOptions, env: DistributedEnv
) -> Dict[str, Dict[str, int]]:
    """Per --clone-signals name, the pairs it flags at its operating point over the global batch and, with
    ground-truth families, how many of them are siblings."""
    negatives = torch.arange(inputs.all_image.shape[0], device=env.device)[None, :] != inputs.positive_col[:, None]
    found = {}
    for name in options.clone_signals:
        flagged = flag_clones(name, clone_scores(inputs, name, direction), negatives, options.signal_threshold)
        counts = [flagged.sum()]
        if families is not None:
            counts.append((flagged & (families[inputs.positive_col][:, None] == families[None, :])).sum())
        totals = all_reduce_sum(torch.stack(counts).long(), env).tolist()
        found[name] = dict(zip(("flagged", "flagged_siblings"), totals))
    return found


def _kept(row: torch.Tensor, posterior: torch.Tensor, gap: torch.Tensor, per_row: int) -> torch.Tensor:
    """Indices of each row's `per_row` most probable candidates (highest posterior, then smallest gap),
    ordered by row; all candidates when `per_row` is 0."""
    order = torch.argsort(gap, stable=True)
    order = order[torch.argsort(-posterior[order], stable=True)]
    order = order[torch.argsort(row[order], stable=True)]
    if per_row == 0:
        return order
    sorted_rows = row[order]
    starts = torch.searchsorted(sorted_rows, sorted_rows, side="left")
    rank_in_row = torch.arange(order.numel(), device=order.device) - starts
    return order[rank_in_row < per_row]


def _pair_lines(kept: Dict[str, list], direction: str, samples: List[SampleInfo], batch_index: int) -> List[dict]:
    """pairs.jsonl lines; values rounded to 6 decimals (float32 features carry no more); the family
    fields, and `same_facts` and `facts_apart` (the page's labels: `facts.facts_apart`, None when the facts
    are not of the demo's form), only for samples that have them."""
    lines = []
    for position, (row, col) in enumerate(zip(kept["row"], kept["col"])):
        query, negative = samples[row], samples[col]
        line = {
            "batch": batch_index,
            "direction": direction,
            "query_index": row,
            "negative_index": col,
            **{name: round(kept[name][position], 6) for name in ("posterior", "gap", "similarity")},
            "query_key": query.key,
            "query_caption": query.caption,
            "query_source": query.source,
            "negative_key": negative.key,
            "negative_caption": negative.caption,
            "negative_source": negative.source,
        }
        if query.family is not None and negative.family is not None:
            line.update(
                query_family=query.family,
                query_family_edit=query.family_edit,
                negative_family=negative.family,
                negative_family_edit=negative.family_edit,
                same_family=query.family == negative.family,
            )
        if query.facts is not None and negative.facts is not None:
            line["same_facts"] = query.facts == negative.facts
            line["facts_apart"] = facts_apart(query.facts, negative.facts)
        lines.append(line)
    return lines
