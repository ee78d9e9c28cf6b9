"""Label-free clone scores for every pair of the global batch (docs/clone_signals.md).

A clone negative of a query is another sample that nearly fits it: a caption that differs by a detail, an
image that differs by a mark. AdaCL's discovery reads that off one direction's cross-modal similarities
through two Gaussian fits (docs/method.md §3.1-3.3, `gda`). The other signals here read it off what the
batch already holds: the captions' features against each other (`text`), the images' (`image`), the
captions' token ids (`tokens`: the share of a caption's information the two captions share), both
cross-modal directions at once (`cross_both`, `gda_both`), combinations of them (the mean of their
scores, each standardized over its row's negatives), and persistence over steps (`persistence`: a pair's score
averaged over the steps where it met, from a `score_memory.PairScoreMemory` keyed by sample ids). A score that is not a posterior flags a negative that
stands `STANDARD_THRESHOLD` standard deviations above its row's negatives (`flag_clones`).

Every signal is a function of one `PairInputs` (this rank's rows against the N columns of the global
batch) that returns a rows x N score, larger for a likelier clone, with no gradient: the model's own
features are read detached. Each is exact across ranks: every input is either the rank's own rows or
gathered over the global batch (`pair_inputs` does the gathering, once per step; the math never calls a
collective except through `RowGroup`, as the selection does), so a rank's rows score exactly as the same
rows of one process holding the whole batch. `SIGNALS` names them for the loss (`adaclw:discovery=...`),
and `python -m studies signals` (their precision and recall against known families, in the laboratory).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Callable, Dict, Optional, Tuple, Union

import torch

from . import adacl_math
from .distributed import RowGroup, gather_no_grad
from .registry import Registry
from .score_memory import PairScoreMemory
from .selection import batch_reference, summarize_rows

DIRECTIONS = ("i2t", "t2i")
PAD_TOKEN = 0  # OpenCLIP's tokenizers pad with 0
# The operating point of a score that is not a posterior, in standard deviations of its row's negatives: chosen on
# the glyph measurement (docs/results/clone_signals.md shows the neighbouring cuts too).
STANDARD_THRESHOLD = 1.5


@dataclass
class PairInputs:
    """What the signals read of one global batch, on one rank (every tensor detached).

    Rows are this rank's queries (their global indices in `positive_col`), columns the N samples of the
    global batch; `logits` holds both directions' rows x N logits (`t2i` row i, column j: caption i against
    image j), so a pair (i, j) of samples is at the same place in both.
    """

    logits: Dict[str, torch.Tensor]  # "i2t", "t2i": rows x N, logit_scale * cos (+ bias)
    positive_col: torch.Tensor  # rows, each row's own column
    query_image: torch.Tensor  # rows x D, normalized
    query_text: torch.Tensor  # rows x D, normalized
    all_image: torch.Tensor  # N x D, normalized
    all_text: torch.Tensor  # N x D, normalized
    logit_scale: torch.Tensor  # 0-dim, exponentiated (the GDA's std floor is in cosine units)
    rows: RowGroup  # reductions over the ranks sharing the rows
    query_tokens: Optional[torch.Tensor] = None  # rows x L token ids (0: padding), or None
    all_tokens: Optional[torch.Tensor] = None  # N x L
    all_ids: Optional[torch.Tensor] = None  # N sample ids of the columns (the trainer's sample index), or None
    memory: Optional[PairScoreMemory] = None  # past scores per pair of sample ids (`persistence`), or None
    draw: Optional[torch.Tensor] = None  # 0-dim int64: which draw the `random` control makes (a step count); None: 0

    @property
    def query_ids(self) -> torch.Tensor:
        return self.all_ids[self.positive_col]

    @cached_property
    def negatives(self) -> Negatives:
        """Each row's negatives (False at its own column; `negative_mask`), made once per step, never written."""
        columns = torch.arange(self.all_image.shape[0], device=self.positive_col.device)
        return Negatives.of(columns[None, :] != self.positive_col[:, None])


@dataclass(frozen=True)
class Negatives:
    """A rows x N mask of negatives with what standardizing over it reads, for scores standardized over the same
    negatives one after the other."""

    mask: torch.Tensor  # rows x N bool
    positive: torch.Tensor  # ~mask
    count: torch.Tensor  # rows x 1 int64: each row's negatives, at least 1 (a row without any divides by 1)

    @classmethod
    def of(cls, negative: Union[torch.Tensor, Negatives]) -> Negatives:
        if isinstance(negative, Negatives):
            return negative
        return cls(negative, ~negative, negative.sum(1, keepdim=True).clamp(min=1))


def pair_inputs(
    logits_per_image: torch.Tensor,
    logits_per_text: torch.Tensor,
    positive_col: torch.Tensor,
    query_image: torch.Tensor,
    query_text: torch.Tensor,
    all_image: torch.Tensor,
    all_text: torch.Tensor,
    logit_scale: torch.Tensor,
    rows: RowGroup,
    local_tokens: Optional[torch.Tensor] = None,
    world_size: int = 1,
    all_ids: Optional[torch.Tensor] = None,
    memory: Optional[PairScoreMemory] = None,
    draw: Optional[torch.Tensor] = None,
) -> PairInputs:
    """The signals' inputs from what a loss holds (features already gathered), detached. `local_tokens` are this
    rank's samples' token ids; they are gathered here, once per step (every rank holds the same number of
    samples, as for the features); a rank that holds every row (no `--local-loss`) queries with all of them.
    `all_ids` (the global batch's sample ids, gathered as the loss gathers them) and `memory` feed
    `persistence`; `draw` the `random` control."""
    all_tokens = gather_no_grad(local_tokens, world_size)
    query_tokens = local_tokens if rows.split_across_ranks else all_tokens
    return PairInputs(
        {"i2t": logits_per_image.detach(), "t2i": logits_per_text.detach()},
        positive_col,
        query_image.detach(),
        query_text.detach(),
        all_image.detach(),
        all_text.detach(),
        logit_scale.detach(),
        rows,
        query_tokens,
        all_tokens,
        all_ids,
        memory,
        draw,
    )


# --- the signals' math: small pure functions ----------------------------------------------------------------


def cosine_pairs(queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """rows x N cosines of normalized features (intra-modal when both are one modality's)."""
    return queries.float() @ candidates.float().T


def standardized_over_negatives(scores: torch.Tensor, negative: Union[torch.Tensor, Negatives]) -> torch.Tensor:
    """rows x N: each score minus the mean of its row's negatives, over their standard deviation (0 off the
    negatives). Rows differ in how similar everything is to them (a plain glyph is close to many): a clone
    stands out of its own row, where one threshold over the whole batch would flag every negative of a crowded
    row and none of a sparse one (docs/clone_signals.md measures both)."""
    negatives = Negatives.of(negative)
    centered, spread = _centered_over_negatives(scores, negatives)
    return centered.div_(spread).masked_fill_(negatives.positive, 0.0)


def standard_flags(scores: torch.Tensor, negative: Union[torch.Tensor, Negatives], threshold: float) -> torch.Tensor:
    """rows x N: the negatives whose `standardized_over_negatives` score exceeds `threshold`, as the same floats
    compare, without writing the standardized scores' zeros off the negatives (the mask drops those entries)."""
    negatives = Negatives.of(negative)
    centered, spread = _centered_over_negatives(scores, negatives)
    return centered.div_(spread).gt(threshold).logical_and_(negatives.mask)


def _centered_over_negatives(scores: torch.Tensor, negatives: Negatives) -> Tuple[torch.Tensor, torch.Tensor]:
    """(rows x N scores minus their row's negatives' mean, rows x 1 standard deviation of those negatives floored
    at 1e-12): `standardized_over_negatives` before its division. The centered scores are a fresh tensor, which
    the caller may divide in place."""
    positive, count = negatives.positive, negatives.count
    # masked_fill takes its 0 as a scalar: one op where torch.where would add one to make a 0-dim zero
    mean = scores.masked_fill(positive, 0.0).sum(1, keepdim=True) / count
    centered = scores - mean  # one N x N pass, read by the spread and divided in place after it
    spread = centered.masked_fill(positive, 0.0).pow_(2).sum(1, keepdim=True) / count
    return centered, spread.sqrt().clamp(min=1e-12)


def max_standardized_score(negatives: int) -> float:
    """The most a score of a row of `negatives` negatives can stand above their mean in `standardized_over_negatives`,
    whatever they hold: sqrt(negatives - 1), reached when all the others are equal (Samuelson's inequality, for the
    population standard deviation it divides by); 0 for one negative. A threshold at or above it flags nothing (at
    it, float rounding may flag the outlier of such a row of equal negatives)."""
    return math.sqrt(max(negatives - 1, 0))


NO_TOKEN = torch.iinfo(torch.long).max  # sorts after every token id: where a slot holds no token of a set


def caption_token_sets(tokens: torch.Tensor, pad_token: int = PAD_TOKEN) -> Tuple[torch.Tensor, torch.Tensor]:
    """rows x L each: every caption's token ids sorted, and whether each is a member of the caption's set of
    tokens (not padding, not a repeat of the token before it). A fixed shape, whatever the captions hold."""
    ordered = tokens.sort(dim=1).values
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    return ordered, first & (ordered != pad_token)


def token_idf(all_tokens: torch.Tensor, pad_token: int = PAD_TOKEN) -> Tuple[torch.Tensor, torch.Tensor]:
    """(vocabulary, idf), N x L entries each: the batch's captions' token sets, every caption's members in one
    sorted list (NO_TOKEN in the slots that hold none, at its end), and at each entry log(N / captions holding
    its token). A token's column is the position of its first entry (`token_presence`), so columns keep the
    tokens' order, and the sizes depend on the batch's shape only, not on what it holds.

    A token every caption holds (the start and end tokens, a word every caption repeats) weighs 0; a token of
    few captions (the detail that tells a caption apart) weighs most. Computed over the global batch, so every
    rank gets the same weights."""
    return _idf_of_sets(*caption_token_sets(all_tokens, pad_token))


def _idf_of_sets(ordered: torch.Tensor, member: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """`token_idf` of the batch's `caption_token_sets`."""
    vocabulary = torch.where(member, ordered, NO_TOKEN).reshape(-1).sort().values
    # a caption holds a token once, so the entries of a token are the captions holding it
    document_frequency = torch.searchsorted(vocabulary, vocabulary, right=True) - torch.searchsorted(
        vocabulary, vocabulary
    )
    return vocabulary, torch.log(ordered.shape[0] / document_frequency.float().clamp(min=1))


def token_presence(
    tokens: torch.Tensor, vocabulary: torch.Tensor, unused_column: int, pad_token: int = PAD_TOKEN
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(rows x L column of each slot, whether it holds a token of `vocabulary`), the columns of each row
    ascending: a held token's column is its first entry in `vocabulary` (`token_idf`); a slot holding none
    (padding, a repeat, a token not in the vocabulary) gets column `unused_column` + its slot, after every held
    one. A set of tokens, not counts, of a fixed number of slots per caption."""
    return _presence_of_sets(*caption_token_sets(tokens, pad_token), vocabulary, unused_column)


def _presence_of_sets(
    ordered: torch.Tensor, member: torch.Tensor, vocabulary: torch.Tensor, unused_column: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """`token_presence` of captions' `caption_token_sets`."""
    position = torch.searchsorted(vocabulary, ordered).clamp(max=vocabulary.numel() - 1)
    held = member & (vocabulary[position] == ordered)
    slots = torch.arange(ordered.shape[1], device=ordered.device)
    columns, order = torch.where(held, position, unused_column + slots).sort(dim=1)
    return columns, held.gather(1, order)


def _sparse_rows(columns: torch.Tensor, values: torch.Tensor, width: int) -> torch.Tensor:
    """The rows x `width` sparse matrix of `values` at `columns` (rows x L, each row's columns ascending and
    distinct: coalesced as it is)."""
    rows = torch.arange(columns.shape[0], device=columns.device)[:, None].expand_as(columns)
    return torch.sparse_coo_tensor(
        torch.stack([rows.reshape(-1), columns.reshape(-1)]),
        values.reshape(-1),
        (columns.shape[0], width),
        check_invariants=False,
        is_coalesced=True,
    )


def _row_sums(values: torch.Tensor) -> torch.Tensor:
    """Each row's sum, added up slot by slot (the sparse product's order, so a row's mass and its shared mass with
    an identical caption are the same float)."""
    rows = torch.arange(values.shape[0], device=values.device)[:, None].expand_as(values)
    return values.new_zeros(values.shape[0]).index_add_(0, rows.reshape(-1), values.reshape(-1))


def weighted_token_overlap(
    query_tokens: torch.Tensor, all_tokens: torch.Tensor, pad_token: int = PAD_TOKEN
) -> torch.Tensor:
    """rows x N weighted Jaccard of the token sets: the idf of the tokens both captions hold over the idf of
    the tokens either holds (1: the same words; 0: nothing rare in common); 0 where neither holds any.
    One sparse product: each caption meets only the captions that share a token with it. Every caption has
    one entry per slot (0 where the slot holds no token, in columns of the query's and the candidates' own past
    the vocabulary, so two such entries never meet): shapes fixed by the batch's, nothing read back."""
    candidate_sets = caption_token_sets(all_tokens, pad_token)
    vocabulary, idf = _idf_of_sets(*candidate_sets)
    length, size = all_tokens.shape[1], vocabulary.numel()
    candidate_columns, candidate_held = _presence_of_sets(*candidate_sets, vocabulary, size + length)
    width = size + 2 * length
    weights = torch.cat([idf, idf.new_zeros(2 * length)])
    candidate_weights = torch.where(candidate_held, weights[candidate_columns], 0.0)
    if query_tokens is all_tokens:  # every row queries: the candidates' own entries, spare slots moved apart
        query_columns, query_weights = _own_spare_columns(candidate_columns, candidate_held, length), candidate_weights
        query_mass = candidate_mass = _row_sums(candidate_weights)
    else:
        query_columns, query_held = token_presence(query_tokens, vocabulary, size, pad_token)
        query_weights = torch.where(query_held, weights[query_columns], 0.0)
        query_mass, candidate_mass = _row_sums(query_weights), _row_sums(candidate_weights)
    query = _sparse_rows(query_columns, query_weights, width)
    candidates = _sparse_rows(candidate_columns, candidate_held.float(), width)
    with warnings.catch_warnings():
        # torch's CPU kernel for this COO product goes through CSR and warns once a process that CSR is in beta; the
        # product is exact and tested (tests/open_clip_adacl/test_clone_signals.py), so the line is only noise.
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta", category=UserWarning)
        shared = torch.sparse.mm(query, candidates.t()).to_dense()
    either = query_mass[:, None] + candidate_mass[None, :] - shared
    return torch.where(either > 0, shared / either.clamp(min=1e-12), 0.0)


def _own_spare_columns(columns: torch.Tensor, held: torch.Tensor, length: int) -> torch.Tensor:
    """The columns `token_presence` gives captions as queries, from their columns as candidates (spare slots
    `length` further on): the held columns precede the spare ones and are distinct, so both sort alike."""
    return torch.where(held, columns, columns - length)


def gda_clone_posterior(
    logits: torch.Tensor,
    positive_col: torch.Tensor,
    rows: RowGroup,
    logit_scale: torch.Tensor,
    *,
    salient: str = "max",
    prior_ratio: float = 1.0,
    std_floor: float = 1e-4,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(rows x N float64 p(clone | logit), the reference fits) under AdaCL's two Gaussians fitted over the global
    batch (docs/method.md §3.1-3.3; `std_floor` in cosine units, as the loss's option; the fits, as
    `selection.batch_reference` returns them, in logit units). The one place AdaCL's posterior of every pair is
    computed: `adaclw` weights by it and the `gda` signals read it."""
    logits = logits.detach()
    summary = summarize_rows(logits, positive_col, with_mean=salient == "mean")
    floor = std_floor * logit_scale.detach().double()
    reference = batch_reference(logits, summary, positive_col, rows, salient=salient, std_floor=floor)
    return adacl_math.gda_posterior(logits.double(), *reference, prior_ratio=prior_ratio), reference


# --- the registry: each signal as a declared entry ----------------------------------------------------------

Score = Callable[[PairInputs, str], torch.Tensor]


@dataclass(frozen=True)
class CloneSignal:
    """A registered clone signal: its score of every pair for a direction, and what it declares about itself."""

    score: Score  # (inputs, direction) -> rows x N, larger for a likelier clone
    needs_tokens: bool = False  # reads the captions' token ids (PairInputs.query_tokens / all_tokens)
    directed: bool = False  # reads the direction; every other signal scores a pair alike in both
    posterior: bool = False  # a probability, flagged above 1/2 (as AdaCL reads its candidates)
    persistent: bool = False  # reads a PairScoreMemory of past scores (PairInputs.memory, keyed by sample ids)
    random: bool = False  # a control that reads no content: scores drawn afresh each step (PairInputs.draw)


SIGNALS: Registry[CloneSignal] = Registry("clone signal")


def register_signal(
    name: str,
    *,
    needs_tokens: bool = False,
    directed: bool = False,
    posterior: bool = False,
    persistent: bool = False,
    random: bool = False,
) -> Callable[[Score], Score]:
    def add(score: Score) -> Score:
        SIGNALS.add(name, CloneSignal(score, needs_tokens, directed, posterior, persistent, random))
        return score

    return add


def signal(name: str) -> CloneSignal:
    """The registered signal `name`; ValueError naming the registered ones if there is none."""
    return SIGNALS.get(name)


@register_signal("gda", directed=True, posterior=True)
def gda_signal(inputs: PairInputs, direction: str) -> torch.Tensor:
    """AdaCL's reading: this direction's posterior p(clone | logit), under the loss's default options."""
    posterior, _ = gda_clone_posterior(inputs.logits[direction], inputs.positive_col, inputs.rows, inputs.logit_scale)
    return posterior.float()


@register_signal("gda_both", posterior=True)
def gda_both_signal(inputs: PairInputs, direction: str) -> torch.Tensor:
    """Both directions must call the pair a clone: the smaller of the two directions' posteriors."""
    return torch.minimum(gda_signal(inputs, "i2t"), gda_signal(inputs, "t2i"))


@register_signal("cross", directed=True)
def cross_signal(inputs: PairInputs, direction: str) -> torch.Tensor:
    """This direction's cosine (the query's image against the negative's caption, or the other way)."""
    query, candidates = (
        (inputs.query_image, inputs.all_text) if direction == "i2t" else (inputs.query_text, inputs.all_image)
    )
    return cosine_pairs(query, candidates)


@register_signal("cross_both")
def cross_both_signal(inputs: PairInputs, direction: str) -> torch.Tensor:
    """The smaller of the pair's two cross-modal cosines: image i to caption j and caption i to image j."""
    return torch.minimum(cross_signal(inputs, "i2t"), cross_signal(inputs, "t2i"))


@register_signal("text")
def text_signal(inputs: PairInputs, direction: str) -> torch.Tensor:
    """The two captions' features against each other (the text tower's view of the pair, any direction)."""
    return cosine_pairs(inputs.query_text, inputs.all_text)


@register_signal("image")
def image_signal(inputs: PairInputs, direction: str) -> torch.Tensor:
    """The two images' features against each other."""
    return cosine_pairs(inputs.query_image, inputs.all_image)


@register_signal("tokens", needs_tokens=True)
def tokens_signal(inputs: PairInputs, direction: str) -> torch.Tensor:
    """The captions' idf-weighted token overlap (`weighted_token_overlap`)."""
    if inputs.query_tokens is None or inputs.all_tokens is None:
        raise ValueError("the tokens signal needs the captions' token ids (PairInputs.query_tokens)")
    return weighted_token_overlap(inputs.query_tokens, inputs.all_tokens)


def mean_of_standardized(inputs: PairInputs, direction: str, names: Tuple[str, ...]) -> torch.Tensor:
    """The mean of the named signals, each standardized over its row's negatives first (so a cosine, an overlap
    and a posterior count alike): a negative that several views place far above its row's other negatives."""
    negatives = inputs.negatives
    return sum(
        standardized_over_negatives(signal(name).score(inputs, direction).float(), negatives) for name in names
    ) / len(names)


# Combinations: the views that need no token ids, and with them.
COMBINATIONS = {
    "text_image": ("text", "image"),
    "features": ("text", "image", "cross_both"),
    "text_image_tokens": ("text", "image", "tokens"),
    "all": ("text", "image", "cross_both", "tokens"),
}


def register_combination(name: str, parts: Tuple[str, ...]) -> None:
    """`name` as the mean of the standardized `parts`, declaring what any of its parts declares."""
    declared = [signal(part) for part in parts]
    register_signal(
        name,
        needs_tokens=any(part.needs_tokens for part in declared),
        directed=any(part.directed for part in declared),
        persistent=any(part.persistent for part in declared),
    )(partial(mean_of_standardized, names=parts))


for _name, _parts in COMBINATIONS.items():
    register_combination(_name, _parts)


# Persistence over steps: the memory holds the row-standardized score of this signal (the model's own views; no
# token ids needed), and the combination adds the best signal measured without memory.
PERSISTENCE_BASE = "features"


def persistence_current(inputs: PairInputs) -> torch.Tensor:
    """rows x N: this step's row-standardized PERSISTENCE_BASE score (the same in both directions)."""
    return standardized_over_negatives(signal(PERSISTENCE_BASE).score(inputs, "i2t").float(), negative_mask(inputs))


@register_signal("persistence", persistent=True)
def persistence_signal(inputs: PairInputs, direction: str) -> torch.Tensor:
    """This step's score averaged with the pair's past ones (`PairScoreMemory.blend`); without a memory, or for
    a pair met for the first time, this step's score."""
    current = persistence_current(inputs)
    if inputs.memory is None:
        return current
    if inputs.all_ids is None:
        raise ValueError("the persistence signal keys its memory by sample ids (PairInputs.all_ids)")
    return inputs.memory.blend(inputs.query_ids, inputs.all_ids, current)


register_combination("persistence_text_image_tokens", ("persistence", "text_image_tokens"))


@register_signal("random", random=True)
def random_signal(inputs: PairInputs, direction: str) -> torch.Tensor:
    """A control, no clone signal: a uniform score per pair, drawn afresh at each draw (`PairInputs.draw`), the
    same for a pair wherever its row is held (a hash of the pair's places in the global batch and the draw, so
    exact across ranks with no random generator to keep in step). With a quota it flags a random share of every
    row's negatives."""
    columns = torch.arange(inputs.all_image.shape[0], device=inputs.positive_col.device)
    draw = torch.zeros((), dtype=torch.long) if inputs.draw is None else inputs.draw  # a tool's one batch: draw 0
    return uniform_hash(inputs.positive_col[:, None], columns[None, :], draw.to(columns.device))


HASH_MASK = 2**31 - 1  # every product below stays under 2**62: no int64 overflow on any device


def uniform_hash(row: torch.Tensor, col: torch.Tensor, draw: torch.Tensor) -> torch.Tensor:
    """Broadcast float32 in [0, 1): an integer hash of (row, col, draw) (three rounds of multiply and xorshift in
    31 bits), the same on every device."""
    mixed = (row * 40503 + col * 65599 + (draw & HASH_MASK) * 1103) & HASH_MASK
    for multiplier in (1274126177, 1911520717, 2048419325):
        mixed = ((mixed ^ (mixed >> 15)) * multiplier) & HASH_MASK
    return (mixed >> 7).float() / float(2**24)


def persistence_update(inputs: PairInputs, world_size: int):
    """What the memory should take from this step: (row ids, column ids, scores, pairs to keep) for every row of
    the global batch, a rank's rows gathered from every rank (a collective: call it on every rank, in the
    forward), so that every rank's memory takes the same update. Write it with `inputs.memory.update(*...)`."""
    current = persistence_current(inputs)
    if inputs.rows.split_across_ranks:
        current = gather_no_grad(current, world_size)  # ranks hold consecutive rows, in rank order
        rows = torch.arange(current.shape[0], device=current.device)
        return inputs.all_ids, inputs.all_ids, current, rows[:, None] != rows[None, :]
    return inputs.query_ids, inputs.all_ids, current, negative_mask(inputs)


def negative_mask(inputs: PairInputs) -> torch.Tensor:
    """rows x N, False at each row's own column (the one mask of `inputs`: not to be written)."""
    return inputs.negatives.mask


def clone_scores(inputs: PairInputs, name: str, direction: str) -> torch.Tensor:
    """rows x N scores of the registered signal `name` for `direction`; the positives are set to -inf, so a
    threshold or a top-k over a row never picks its own pair."""
    return signal(name).score(inputs, direction).float().masked_fill(~negative_mask(inputs), float("-inf"))


def flag_quota(scores: torch.Tensor, quota: float) -> torch.Tensor:
    """rows x N: each row's round(quota x negatives) highest-scoring negatives (at least one), the same number in
    every row; `scores` as `clone_scores` returns them (the positives at -inf, so never among them)."""
    count = min(max(1, round(quota * (scores.shape[1] - 1))), scores.shape[1] - 1)
    top = scores.topk(count, dim=1).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter_(1, top, True)


def flag_clones(
    name: str, scores: torch.Tensor, negative: Union[torch.Tensor, Negatives], threshold: float
) -> torch.Tensor:
    """rows x N: the negatives the signal calls clones at the loss's operating point. A posterior
    (`CloneSignal.posterior`) above 1/2, as AdaCL's candidates; any other score `threshold` standard deviations above the mean of its row's
    negatives (`standardized_over_negatives`). Per row, so the flags of a rank's rows need no collective."""
    if signal(name).posterior:
        return (scores > 0.5) & Negatives.of(negative).mask
    return standard_flags(scores, negative, threshold)


def signal_flags(inputs: PairInputs, name: str, direction: str, threshold: float) -> torch.Tensor:
    """`flag_clones` of the registered signal `name` for `direction`: the same flags, from its scores as they are
    (the flags never hold a positive, so `clone_scores`' -inf there would change none and cost a pass)."""
    scores = signal(name).score(inputs, direction).float()
    return flag_clones(name, scores, inputs.negatives, threshold)
