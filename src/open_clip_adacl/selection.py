"""Exact global anchor selection over the ranks that share the rows (docs/method.md §5).

Input: this rank's rows x C logits (C = the N columns of the global batch, plus queue columns),
`positive_col`, the global column of each row's positive, which is also the row's global index,
and a `RowGroup`. With OpenCLIP's full logits every rank holds all N rows and RowGroup's
reductions are the identity; with `--local-loss` each rank holds its own b rows and they are
all-reduces. Nothing of size N x N crosses ranks: the reductions move a few scalars, and the exact
median of the candidates' gaps is a radix select (radix_select.py) whose two passes each all-reduce
one histogram of about 65,536 bins.

Everything runs under `torch.no_grad()`. On a GPU it uses tensor ops only: no `.item()`, no boolean
indexing, no data-dependent Python branch, no tensor made from host values, so the device never
waits for the host. On the CPU, where reading a value back costs nothing
(`row_passes.reading_back_is_free`), a few values are read to skip work they show to be unneeded
(an empty interval of the candidate test, the keys outside the median's radix bin); the results are
the same. Every rank ends with bit-identical results: each value either comes out of an all-reduce
(min/max/integer sums are exact; a sum in which only the owner contributes a non-zero is exact) or
is computed from such values by the same ops.

The selection reads the logits the loss already has: every decision it makes is invariant under
the positive affine map cos -> t cos + bias (see adacl_math.py), so no second matmul is needed. Rows are
processed in chunks small enough to stay in the CPU cache (large on a GPU; row_passes.py). The eager
passes compute the keys of `candidate_keys` a row chunk at a time whenever they read them (`KeyBlocks`),
so they hold no rows x C buffer; the compiled ones write rows x C int32 keys, freed when the selection
returns, so that the backward pass, where the loss's peak memory lies, never holds them
(docs/THROUGHPUT.md).

The passes over the logits and the keys also exist as traceable functions (`_fused_keys`, the
`*_of_logits` functions and radix_select.py's `*_pass` ones) that `fused.run` compiles: each then
reads its input once. On the CPU they write the keys and histogram them in two compiled passes; on a
GPU the median needs no keys at all (three passes over the logits: `_lower_median_from_logits`). They
give the same bits as the eager passes, which remain the reference and the fallback (see fused.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, NamedTuple, Optional, Tuple, Union

import torch

from . import adacl_math, fused, row_passes
from .distributed import RowGroup
from .radix_select import (
    HIGH_BINS,
    INT32_MIN,
    drop_non_finite,
    first_row_holding,
    first_row_with_key,
    high_bin,
    high_histogram,
    high_histogram_pass,
    key_blocks,
    key_in_bin,
    low_histogram_pass,
    lower_median,
    row_min_xor_pass,
)
from .row_passes import NO_ROW, ChunkScratch, min_or, one_cpu_thread, row_chunks


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """Selection statistics run in float32, or float64 for float64 logits (bf16/fp16 are upcast)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# --- per-row summaries ----------------------------------------------------------------------------


@dataclass
class RowSummary:
    """Per-row quantities of this rank's rows, from one pass over the logits."""

    positive: torch.Tensor  # rows: the positive logit, working dtype
    negative_max: torch.Tensor  # rows: max over the row's negatives (-inf without negatives)
    negative_mean: torch.Tensor  # rows, float64: mean over the negatives (NaN unless requested)
    negative_lse: torch.Tensor  # rows: log sum_{j negative} exp(logit_ij) (-inf without negatives)


@torch.no_grad()
def summarize_rows(logits: torch.Tensor, positive_col: torch.Tensor, with_mean: bool = False) -> RowSummary:
    """One chunked pass: positive logit, negatives' max, mean (if `with_mean`) and log-sum-exp.

    The log-sum-exp over the negatives is the loss's denominator without the positive (the loss
    adds its modulated positive to it); the max doubles as the `max` salient score's term. Its rows
    are independent, so on the CPU each core's thread walks a share of them on one torch thread
    (`row_passes.rows_on_cpu_threads`), with the same results: its chunked ops are many short parallel
    regions, and split by torch each waits for a thread that another job has preempted (measured:
    docs/THROUGHPUT.md).
    """
    num_rows, num_cols = logits.shape
    dtype = working_dtype(logits.dtype)
    positive = logits.gather(1, positive_col[:, None]).squeeze(1).to(dtype)
    negative_max = torch.empty(num_rows, dtype=dtype, device=logits.device)
    negative_lse = torch.empty_like(negative_max)
    row_sum = torch.full((num_rows,), float("nan"), dtype=torch.float64, device=logits.device)

    def summarize(first: int, last: int) -> None:
        scratch = ChunkScratch(last - first, num_cols, logits.device)
        for start, stop in row_chunks(last - first, num_cols, logits.device):
            start, stop = first + start, first + stop
            chunk = scratch.get("chunk", dtype, stop - start).copy_(logits[start:stop])  # modified in place below
            if with_mean:
                row_sum[start:stop] = chunk.sum(dim=1, dtype=torch.float64)
            chunk[torch.arange(stop - start, device=logits.device), positive_col[start:stop]] = float("-inf")
            chunk_max = chunk.amax(dim=1)
            shift = torch.where(torch.isfinite(chunk_max), chunk_max, torch.zeros_like(chunk_max))
            negative_max[start:stop] = chunk_max
            negative_lse[start:stop] = shift + chunk.sub_(shift[:, None]).exp_().sum(dim=1).log()

    row_passes.rows_on_cpu_threads(num_rows, logits.device, summarize)
    negative_mean = (row_sum - positive.double()) / max(num_cols - 1, 1)
    return RowSummary(positive, negative_max, negative_mean, negative_lse)


# --- global reductions over rows ------------------------------------------------------------------


def _owned_rows(
    values: torch.Tensor, wanted: torch.Tensor, row_index: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(values[local position of each global row of `wanted` (k,)], whether this rank holds each), (k, ...) and
    (k,). `row_index` (contiguous) is the global index of each local row; for a row this rank does not hold it
    gives some other row of `values` (zeros when it has no rows at all), which callers mask out."""
    if row_index.numel() == 0:
        owned = torch.zeros(wanted.shape, dtype=torch.bool, device=values.device)
        return values.new_zeros(wanted.shape + values.shape[1:]), owned
    local = (wanted - row_index[0]).clamp(0, row_index.shape[0] - 1)
    return values.index_select(0, local), row_index.index_select(0, local) == wanted


def row_value_from_owner(
    values: torch.Tensor, row: torch.Tensor, row_index: torch.Tensor, rows: RowGroup
) -> torch.Tensor:
    """values[global row] on every rank, bit-exactly, from this rank's per-row vector `values`."""
    value, is_owner = _owned_rows(values, row.view(1), row_index)
    return rows.from_owner(value, is_owner).squeeze(0)


def global_reference_rows(
    salient: torch.Tensor, row_index: torch.Tensor, rows: RowGroup
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Global (most salient, least salient) row, ties to the lowest global row: the max/min of the
    value, then the min of the indices attaining it (two all-reduces for both)."""
    extremes = rows.max(torch.stack([-min_or(-salient, float("inf")), -min_or(salient, float("inf"))]))
    attains = torch.stack([salient == extremes[0], salient == -extremes[1]])
    unattained = torch.full((2, 1), NO_ROW, dtype=row_index.dtype, device=row_index.device)
    index = torch.cat([torch.where(attains, row_index, NO_ROW), unattained], dim=1).amin(dim=1)
    index = rows.min(index)
    return index[0], index[1]


def reference_fits(
    logits: torch.Tensor,
    positive_col: torch.Tensor,
    clone_row: torch.Tensor,
    salient_row: torch.Tensor,
    rows: RowGroup,
    std_floor,
) -> torch.Tensor:
    """(mu_c, sigma_c, mu_n, sigma_n), float64 (4,): Gaussians of the least salient row's negatives
    (class clone) and of the most salient row's (class not clone), fitted by each row's owner and
    shared bit-exactly (one all-reduce)."""
    reference_rows = torch.stack([clone_row, salient_row])
    row_logits, is_owner = _owned_rows(logits, reference_rows, positive_col)
    cols = torch.arange(logits.shape[1], device=logits.device)
    # A row's global index is its positive column; a rank that does not own a row fits some other row, which
    # `from_owner` discards.
    fits = [
        value
        for row, values in zip(reference_rows, row_logits)
        for value in adacl_math.gaussian_fit(values, cols != row, std_floor)
    ]
    return rows.from_owner(torch.stack(fits), is_owner.repeat_interleave(2))


# --- candidates and their gaps --------------------------------------------------------------------

# Keys of entries that are not clone candidates have all exponent bits set, so they read as +-inf
# or NaN: they never equal a finite gap's key, and their high 16 bits fall in the 256 bins
# 0x7f80-0x7fff and 0xff80-0xffff, which hold no finite float, so the radix select simply empties
# those bins. An entry whose gap is not finite (a non-finite logit, or an overflow) has these bits
# already, so it is never a candidate whatever its GDA test says. Sign and mantissa are left as
# they were so that these keys spread over the 256 bins: a histogram that increments one counter
# over and over stalls on the store-to-load dependency on CPUs.
NOT_CANDIDATE_BITS = 0x7F800000


def candidate_bounds(intervals: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The open float64 intervals (a, b) of `adacl_math.positive_quadratic_intervals` as closed bounds
    [lo, hi] of `dtype`, (2, 2): for every x of that dtype, a < x < b exactly when lo <= x <= hi.

    lo is the smallest value above a and hi the largest below b. A zero lo is -0.0 and a zero hi
    +0.0, so that x - lo and hi - x are never -0.0; for finite x their sign bits are then clear
    exactly when x >= lo and x <= hi (a non-zero difference of two floats never rounds to zero).
    """
    inf = torch.full((), float("inf"), dtype=dtype, device=intervals.device)
    rounded = intervals.to(dtype)
    lo, hi = rounded.unbind(1)
    lo = torch.where(lo.double() > intervals[:, 0], lo, torch.nextafter(lo, inf))
    hi = torch.where(hi.double() < intervals[:, 1], hi, torch.nextafter(hi, -inf))
    lo = torch.where(lo == 0, -torch.zeros_like(lo), lo)
    return torch.stack([lo, hi + 0.0], dim=1)


class IntervalEdges(NamedTuple):
    """Both closed intervals of `candidate_bounds` as `_outside_bits` tests them where nothing is read back."""

    edges: torch.Tensor  # (4,): `interval_edges`
    bits_by_count: torch.Tensor  # (5,) int32: NOT_CANDIDATE_BITS for an even number of edges below x, else 0


# The (lo, hi) pairs that `_outside_bits` tests, None where a side needs no test; or both intervals as they are.
Bounds = Union[List[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]], IntervalEdges]


def interval_edges(bounds: torch.Tensor) -> torch.Tensor:
    """The sorted edges e (4,) of the two closed intervals `bounds` (`candidate_bounds` of
    `adacl_math.positive_quadratic_intervals`, which never overlap): a finite x of their dtype lies in one of
    them exactly when an odd number of edges lie below it, the count that `torch.bucketize(x, e)` returns.

    [lo, hi] holds x exactly when lo' < x and not hi < x, lo' the float just below lo; an empty interval
    (lo > hi) becomes the empty (hi, hi]. Each interval then adds 1 to the count of x inside it and 0 or 2 to
    that of any other x, and sorting the edges leaves every count as it is.
    """
    lo, hi = bounds.unbind(1)
    below = torch.where(lo <= hi, torch.nextafter(lo, torch.full_like(lo, float("-inf"))), hi)
    return torch.stack([below, hi], dim=1).view(-1).sort().values


def _bounds_to_test(bounds: torch.Tensor) -> Bounds:
    """What `_outside_bits` tests.

    On a GPU both intervals are tested as they are (reading the bounds back would make the device
    wait), by counting the `interval_edges` below each entry: one search per entry instead of a dozen
    passes of arithmetic. On the CPU, where reading them back costs nothing, an empty interval is
    dropped and an unbounded side (every finite x passes it) is not tested, which saves whole passes
    over the logits and gives the same keys.
    """
    if not row_passes.reading_back_is_free(bounds.device):
        counts = torch.arange(5, dtype=torch.int32, device=bounds.device)
        return IntervalEdges(interval_edges(bounds), counts.bitwise_and_(1).sub_(1).bitwise_and_(NOT_CANDIDATE_BITS))
    largest = torch.finfo(bounds.dtype).max
    tested: Bounds = []
    for (lo, hi), (lo_value, hi_value) in zip(bounds, bounds.tolist()):
        if lo_value <= hi_value:
            tested.append((None if lo_value <= -largest else lo, None if hi_value >= largest else hi))
    return tested


def _outside_bits(x: torch.Tensor, bounds: Bounds, out: torch.Tensor, scratch: ChunkScratch) -> bool:
    """Writes into `out` (int32, x's shape) NOT_CANDIDATE_BITS where finite `x` lies in none of the
    closed `bounds` and 0 where it lies in one; returns False, writing nothing, when some interval
    holds every finite x. Non-finite x: any value (see NOT_CANDIDATE_BITS).

    `IntervalEdges`: the count of edges below x looked up. Else an interval's margin min(x - lo, hi - x)
    has its sign bit clear exactly when x is inside (see `candidate_bounds`), and so does the max of the
    intervals' margins for their union: arithmetic and one shift instead of comparisons and `torch.where`,
    which cost more on CPUs.
    """
    rows = x.shape[0]
    if isinstance(bounds, IntervalEdges):
        below = torch.bucketize(x, bounds.edges, out_int32=True, out=scratch.get("below", torch.int32, rows))
        torch.index_select(bounds.bits_by_count, 0, below.view(-1), out=out.view(-1))
        return True
    if not bounds:
        out.fill_(NOT_CANDIDATE_BITS)
        return True
    if any(lo is None and hi is None for lo, hi in bounds):
        return False
    margin = out.view(torch.float32) if x.dtype == torch.float32 else scratch.get("margin", x.dtype, rows)
    for index, (lo, hi) in enumerate(bounds):
        term = margin if index == 0 else scratch.get("term", x.dtype, rows)
        if lo is not None:
            torch.sub(x, lo, out=term)
        if hi is not None and lo is None:
            torch.sub(hi, x, out=term)
        elif hi is not None:
            torch.minimum(term, torch.sub(hi, x, out=scratch.get("upper", x.dtype, rows)), out=term)
        if index:
            torch.maximum(margin, term, out=margin)
    if margin.dtype != torch.float32:
        out.view(torch.float32).copy_(margin)  # float64 -> float32 keeps the sign bit
    # The arithmetic shift spreads the sign bit over all 32 bits.
    out.bitwise_right_shift_(31).bitwise_and_(NOT_CANDIDATE_BITS)
    return True


@torch.no_grad()
def candidate_keys(
    logits: torch.Tensor,
    positive: torch.Tensor,
    positive_col: torch.Tensor,
    coefficients: Tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    lower: Optional[torch.Tensor] = None,
    *,
    fused_passes: bool,
) -> Tuple[Keys, torch.Tensor, torch.Tensor]:
    """(keys, count, high_counts) of this rank's rows (docs/method.md §3.4-3.5).

    keys (rows x C int32): for a clone candidate (a negative whose GDA log-odds A x^2 + B x + C is
    positive, x its logit) the float32 bits of its gap, positive logit - x; for every other entry
    the same bits with `NOT_CANDIDATE_BITS` set. `candidate_gaps(keys)` reads the gaps back.
    count: this rank's number of candidates. high_counts: this rank's first radix histogram
    (see `radix_select`). `lower` (0-dim, logit units): only entries above it are candidates (the `upper` candidate region).
    `fused_passes`: the keys written into one rows x C tensor by two compiled passes (raises
    `fused.Unavailable`); else a `KeyBlocks`, which computes them a row chunk at a time whenever a pass
    reads them, so that the eager passes never hold the rows x C matrix.

    The log-odds test is done as "x lies in one of two intervals" whose float64 bounds are the
    quadratic's roots (`adacl_math.positive_quadratic_intervals`), rounded outwards to the logits'
    working dtype (`candidate_bounds`), so it is the sign of the exact quadratic at x, the same
    on every device, with a few subtractions per entry. Zero log-odds is not a candidate, and
    neither is an entry whose gap is not finite (NaN or infinite logits). The positive is made
    +0.0 if it is -0.0, so that no gap is -0.0: equal gaps have equal keys and the owner row is the
    lowest, as in the method's dense definition that the tests check against.
    """
    bounds = _candidate_bounds(coefficients, lower, working_dtype(logits.dtype))
    return _keys_within(logits, positive, positive_col, bounds, fused_passes)


def _keys_within(
    logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor, bounds: torch.Tensor, fused_passes: bool
) -> Tuple[Keys, torch.Tensor, torch.Tensor]:
    """`candidate_keys` of the candidates within `bounds` (`_candidate_bounds`), which the selection computes
    once for all its passes."""
    if fused_passes:
        return _compiled_candidate_keys(logits, positive, positive_col, bounds)
    keys = KeyBlocks(logits, positive, positive_col, bounds)
    high_counts = torch.zeros(HIGH_BINS, dtype=torch.int64, device=logits.device)
    for start, stop, block in keys.blocks():
        high_counts += high_histogram(block, out=keys.scratch.get("bins", torch.int32, stop - start))
    return keys, _count_candidates(high_counts, keys.numel()), high_counts


def _compiled_candidate_keys(
    logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor, bounds: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`candidate_keys` by the two compiled passes; raises `fused.Unavailable`."""
    keys = torch.empty(logits.shape, dtype=torch.int32, device=logits.device)
    with one_cpu_thread(logits.device):
        fused.run(_keys_pass, logits, positive, positive_col, bounds, keys)
        high_counts = fused.run(high_histogram_pass, keys)
    return keys, _count_candidates(high_counts, keys.numel()), high_counts


class KeyBlocks:
    """`candidate_keys`'s keys computed by the chunked eager passes one row chunk at a time, anew each time
    a pass reads them (`radix_select.key_blocks`), into one chunk-sized buffer: a few ops per entry instead
    of a rows x C int32 matrix held from the first pass to the last. The AdaCL loss selects its two
    directions side by side, and two such matrices alive at once were the eager path's peak memory
    (docs/THROUGHPUT.md). A block is valid until the next one is made; a pass that asks again for the rows
    of the block made last gets it as it is, so that rows that fit one chunk (every row of a batch of up to
    4096 on a GPU) have their keys computed once for all the passes."""

    def __init__(self, logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor, bounds: torch.Tensor):
        self.logits, self.positive_col = logits, positive_col
        self.shape, self.device = logits.shape, logits.device
        self.dtype = working_dtype(logits.dtype)
        self.positive = positive.to(self.dtype)[:, None] + 0.0
        self.bounds = _bounds_to_test(bounds)
        self.scratch = ChunkScratch(*logits.shape, logits.device)
        self._made: Optional[Tuple[int, int, torch.Tensor]] = None  # the last block made: (start, stop, keys)

    def numel(self) -> int:
        return self.logits.numel()

    def blocks(self) -> Iterator[Tuple[int, int, torch.Tensor]]:
        """(start, stop, keys of rows start:stop) over this rank's rows, in row chunks. The passes only read
        the blocks, so the block made last is still valid."""
        for start, stop in row_chunks(*self.shape, self.device):
            if self._made is None or self._made[:2] != (start, stop):
                self._made = (start, stop, self._block(start, stop))
            yield self._made

    def _block(self, start: int, stop: int) -> torch.Tensor:
        x = self.logits[start:stop].to(self.dtype)
        keys = self.scratch.get("keys", torch.int32, stop - start)
        gap = torch.sub(self.positive[start:stop], x, out=keys.view(torch.float32))
        if self.dtype != torch.float32:
            gap.add_(0.0)  # a negative float64 gap too small for float32 rounds to -0.0
        bits = self.scratch.get("bits", torch.int32, stop - start)
        if _outside_bits(x, self.bounds, bits, self.scratch):
            keys |= bits
        keys[torch.arange(stop - start, device=self.device), self.positive_col[start:stop]] = NOT_CANDIDATE_BITS
        return keys


# The keys of `candidate_keys`: one rows x C int32 tensor (the compiled passes) or `KeyBlocks`.
Keys = Union[torch.Tensor, KeyBlocks]


def _candidate_bounds(
    coefficients: Tuple[torch.Tensor, torch.Tensor, torch.Tensor], lower: Optional[torch.Tensor], dtype: torch.dtype
) -> torch.Tensor:
    """`candidate_bounds` of the GDA log-odds' positive set (above `lower` when given)."""
    return candidate_bounds(adacl_math.positive_quadratic_intervals(*coefficients, lower=lower), dtype)


def _count_candidates(high_counts: torch.Tensor, num_entries: int) -> torch.Tensor:
    """This rank's number of candidates, from the first-pass histogram of all its `num_entries` keys,
    whose not-candidate bins (those of non-finite floats: `NOT_CANDIDATE_BITS`) it then empties."""
    return num_entries - drop_non_finite(high_counts)


def masked_keys(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Keys as `candidate_keys` writes them (-0.0 stored as +0.0), for float32 `values` selected by a
    bool `mask`."""
    bits = values.float().add(0.0).view(torch.int32)
    return torch.where(mask, bits, bits | NOT_CANDIDATE_BITS)


def candidate_gaps(keys: torch.Tensor, fill: float) -> torch.Tensor:
    """The candidates' gaps as float32, `fill` for the other entries."""
    return keys.view(torch.float32).nan_to_num(nan=fill, posinf=fill, neginf=fill)


# --- the compiled passes over the logits (fused.py), and the median without a key matrix ----------


def _fused_keys(
    logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor, bounds: torch.Tensor
) -> torch.Tensor:
    """`candidate_keys`'s keys as one elementwise expression that a compiler fuses into the pass that
    consumes them. `bounds`: `candidate_bounds`, both intervals tested as they are (no read-back).

    Comparisons replace the eager sign-bit arithmetic: they test the same closed bounds (see
    `candidate_bounds`) and cost nothing extra in a fused pass. A -0.0 gap is made +0.0 by a `where`,
    since a compiler may drop the eager `+ 0.0` as an identity."""
    dtype = working_dtype(logits.dtype)
    x = logits.to(dtype)
    gap = (positive.to(dtype)[:, None] - x).to(torch.float32)
    bits = torch.where(gap == 0, 0.0, gap).view(torch.int32)
    inside = ((x >= bounds[0, 0]) & (x <= bounds[0, 1])) | ((x >= bounds[1, 0]) & (x <= bounds[1, 1]))
    keys = torch.where(inside, bits, bits | NOT_CANDIDATE_BITS)
    positive_entry = torch.arange(x.shape[1], device=x.device) == positive_col[:, None]
    return torch.where(positive_entry, NOT_CANDIDATE_BITS, keys)


def _keys_pass(
    logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor, bounds: torch.Tensor, out: torch.Tensor
) -> None:
    """Writes the keys into `out` (rows x C int32)."""
    out.copy_(_fused_keys(logits, positive, positive_col, bounds))


def _high_histogram_of_logits(
    logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor, bounds: torch.Tensor
) -> torch.Tensor:
    """`high_histogram` of the keys, computed on the fly from the logits."""
    return high_histogram_pass(_fused_keys(logits, positive, positive_col, bounds))


def _low_histogram_of_logits(
    logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor, bounds: torch.Tensor, high: torch.Tensor
) -> torch.Tensor:
    """`low_histogram_pass` of the keys, computed on the fly from the logits."""
    return low_histogram_pass(_fused_keys(logits, positive, positive_col, bounds), high)


def _row_min_xor_of_logits(
    logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor, bounds: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """`row_min_xor_pass` of the keys, computed on the fly from the logits."""
    return row_min_xor_pass(_fused_keys(logits, positive, positive_col, bounds), mask)


def _lower_median_from_logits(
    logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor, bounds: torch.Tensor, rows: RowGroup
) -> Optional[Tuple[torch.Tensor, ...]]:
    """(global candidate count, key of the lower median, its lowest global row) as `candidate_keys` and
    the device path of `lower_median` give them, by three compiled passes over the logits (high
    histogram, low histogram of the median's high bin, owner search) and no key matrix: where reading
    values back would make a device wait, the eager passes write rows x C int32 keys and read them
    three times. None when the passes cannot be compiled; they are all compiled before the first
    collective, so that a rank that falls back to the eager passes still runs the same collectives.
    """
    args = (logits, positive, positive_col, bounds)
    some_key = torch.zeros((), dtype=torch.int32, device=logits.device)
    try:
        high_counts = fused.run(_high_histogram_of_logits, *args)
        for later_pass in (_low_histogram_of_logits, _row_min_xor_of_logits):
            fused.prepare(later_pass, *args, some_key)
    except fused.Unavailable:
        return None
    count = rows.sum(_count_candidates(high_counts, logits.numel()))
    high, rank_in_bin = high_bin(high_counts, ((count - 1) // 2).clamp(min=0), rows)
    key = key_in_bin(fused.run(_low_histogram_of_logits, *args, high), high, rank_in_bin, rows)
    row_min = fused.run(_row_min_xor_of_logits, *args, key ^ INT32_MIN)
    return count, key, first_row_holding(row_min, positive_col, rows)


def _median_without_keys(
    logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor, bounds: torch.Tensor, rows: RowGroup
) -> Optional[Tuple[torch.Tensor, ...]]:
    """`_lower_median_from_logits` where the fused passes are wanted, else None (the caller writes keys).
    `auto` times both ways on this rank's rows alone (no collective), so that ranks choosing
    differently still run the same collectives."""
    alone = RowGroup(split_across_ranks=False)

    def compiled():
        if _lower_median_from_logits(logits, positive, positive_col, bounds, alone) is None:
            raise fused.Unavailable("median")

    def eager():
        _anchor_search(logits, positive, positive_col, bounds, "median", alone, fused_passes=False)

    if not fused.wanted(logits, "median", compiled, eager):
        return None
    return _lower_median_from_logits(logits, positive, positive_col, bounds, rows)


# --- the anchor among the candidates by mean, min or max (the median: radix_select.lower_median) ---


def masked_extreme(keys: Keys, largest: bool, rows: RowGroup) -> torch.Tensor:
    """Key of the global max (or min) candidate gap."""
    fill = float("-inf") if largest else float("inf")
    extremes = torch.stack(
        [torch.full((), fill, device=keys.device)]
        + [
            candidate_gaps(block, fill).max() if largest else candidate_gaps(block, fill).min()
            for _, _, block in key_blocks(keys)
        ]
    )
    extreme = rows.max(extremes.max()) if largest else rows.min(extremes.min())
    return extreme.view(torch.int32)


def masked_mean(keys: Keys, count: torch.Tensor, rows: RowGroup) -> torch.Tensor:
    """Global mean of the candidate gaps, float64 (per-rank sums all-reduced)."""
    total = sum(
        (candidate_gaps(block, 0.0).double().sum() for _, _, block in key_blocks(keys)),
        torch.zeros((), dtype=torch.float64, device=keys.device),
    )
    return rows.sum(total) / count.clamp(min=1)


def nearest_key(
    keys: Keys, target: torch.Tensor, row_index: torch.Tensor, rows: RowGroup
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(row, key) of the candidate gap nearest to `target` (float64 distances), the lowest
    (row, column) among equally near ones."""
    distance = torch.empty(keys.shape[0], dtype=torch.float64, device=keys.device)
    nearest = torch.empty(keys.shape[0], dtype=torch.int32, device=keys.device)
    for start, stop, block in key_blocks(keys):
        gaps = (candidate_gaps(block, float("inf")).double() - target).abs()
        distance[start:stop], column = gaps.min(dim=1)  # the first minimum: the lowest column
        nearest[start:stop] = block.gather(1, column[:, None]).squeeze(1)
    best = rows.min(min_or(distance, float("inf")))
    row = rows.min(min_or(torch.where(distance == best, row_index, NO_ROW), NO_ROW))
    return row, row_value_from_owner(nearest, row, row_index, rows)


# --- the whole selection --------------------------------------------------------------------------


@dataclass
class AnchorSelection:
    """One direction's anchor, identical on every rank. Logit units."""

    row: torch.Tensor  # 0-dim int64: global row u owning the anchor element (-1: no candidate)
    gap: torch.Tensor  # 0-dim float32: the anchor element's gap, positive - negative logit (NaN: none)
    num_candidates: torch.Tensor  # 0-dim int64: |S~|
    reference: torch.Tensor  # (4,) float64: mu_c, sigma_c, mu_n, sigma_n
    flat_reference: torch.Tensor  # 0-dim bool: a reference fit is at the std floor


def _anchor_search(
    logits: torch.Tensor,
    positive: torch.Tensor,
    positive_col: torch.Tensor,
    bounds: torch.Tensor,
    anchor_stat: str,
    rows: RowGroup,
    *,
    fused_passes: bool,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(global candidate count, anchor key, its lowest global row): `candidate_keys` within `bounds` and the
    search among them, by the compiled passes (`fused_passes`; raises `fused.Unavailable` before any
    collective) or the eager ones."""
    candidates = _keys_within(logits, positive, positive_col, bounds, fused_passes)
    return _anchor_from_keys(candidates, anchor_stat, positive_col, rows, fused_passes)


def _anchor(
    logits: torch.Tensor,
    positive: torch.Tensor,
    positive_col: torch.Tensor,
    bounds: torch.Tensor,
    anchor_stat: str,
    rows: RowGroup,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_anchor_search` by the passes `fused.wanted` picks for the whole search (keys and anchor). `auto`
    times both ways on this rank's rows alone (no collective), so that ranks choosing differently still
    run the same collectives."""
    args = (logits, positive, positive_col, bounds, anchor_stat)
    alone = RowGroup(split_across_ranks=False)
    if fused.wanted(
        logits,
        f"{anchor_stat} anchor",
        lambda: _anchor_search(*args, alone, fused_passes=True),
        lambda: _anchor_search(*args, alone, fused_passes=False),
    ):
        try:
            return _anchor_search(*args, rows, fused_passes=True)
        except fused.Unavailable:
            pass
    return _anchor_search(*args, rows, fused_passes=False)


def _anchor_from_keys(
    candidates: Tuple[Keys, torch.Tensor, torch.Tensor],
    anchor_stat: str,
    row_index: torch.Tensor,
    rows: RowGroup,
    fused_passes: bool,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(global candidate count, anchor key, its lowest global row) from this rank's `candidate_keys`."""
    keys, count, high_counts = candidates
    count = rows.sum(count)
    if anchor_stat == "median":
        key, row = lower_median(keys, count, high_counts, row_index, rows, fused_passes=fused_passes)
    elif anchor_stat == "mean":
        row, key = nearest_key(keys, masked_mean(keys, count, rows), row_index, rows)
    else:
        key = masked_extreme(keys, anchor_stat == "max", rows)
        row = first_row_with_key(keys, key, row_index, rows)
    return count, key, row


@torch.no_grad()
def batch_reference(
    logits: torch.Tensor, summary: RowSummary, positive_col: torch.Tensor, rows: RowGroup, *, salient: str, std_floor
) -> torch.Tensor:
    """docs/method.md §3.1-3.2 over the global batch: (mu_c, sigma_c, mu_n, sigma_n), float64 (4,), the Gaussians
    of the least and the most salient row's negatives, exactly as `select_anchor` fits them (its first step)."""
    if salient not in adacl_math.SALIENT_KINDS:
        raise ValueError(f"salient must be one of {adacl_math.SALIENT_KINDS}, got {salient!r}")
    with one_cpu_thread(logits.device):
        return _batch_reference(logits, summary, positive_col, rows, salient, std_floor)


def _batch_reference(
    logits: torch.Tensor, summary: RowSummary, positive_col: torch.Tensor, rows: RowGroup, salient: str, std_floor
) -> torch.Tensor:
    negative_term = summary.negative_max if salient == "max" else summary.negative_mean
    salient_row, clone_row = global_reference_rows(summary.positive - negative_term, positive_col, rows)
    return reference_fits(logits, positive_col, clone_row, salient_row, rows, std_floor)


def select_anchor(
    logits: torch.Tensor,
    summary: RowSummary,
    positive_col: torch.Tensor,
    rows: RowGroup,
    *,
    salient: str,
    anchor_stat: str,
    prior_ratio: float,
    std_floor,
    region: str = "gda",
) -> AnchorSelection:
    """docs/method.md §3.1-3.5 over the global batch: salient scores, reference rows, GDA, candidates, and
    the anchor element (median / mean / min / max of the candidate gaps) with its owner row.
    `region`: the candidate region (`adacl_math.clone_candidate_mask`).

    `std_floor` is in logit units (the loss passes floor * t).
    An empty candidate set (num_candidates = 0) returns row -1, which no rank owns, and a NaN gap;
    the caller falls back to vanilla CL.

    Ranks may hold different numbers of rows, none included: every rank runs the same collectives.
    """
    if salient not in adacl_math.SALIENT_KINDS:
        raise ValueError(f"salient must be one of {adacl_math.SALIENT_KINDS}, got {salient!r}")
    if anchor_stat not in adacl_math.ANCHOR_STATS:
        raise ValueError(f"anchor_stat must be one of {adacl_math.ANCHOR_STATS}, got {anchor_stat!r}")
    if region not in adacl_math.CANDIDATE_REGIONS:
        raise ValueError(f"candidate_region must be one of {adacl_math.CANDIDATE_REGIONS}, got {region!r}")
    with one_cpu_thread(logits.device):
        reference = _batch_reference(logits, summary, positive_col, rows, salient, std_floor)
        floor = torch.as_tensor(std_floor, dtype=torch.float64, device=logits.device)
        flat_reference = (reference[1] <= floor) | (reference[3] <= floor)
        if region == "all":  # log-odds 0 s^2 + 0 s + 1 > 0: every negative
            coefficients = tuple(torch.full((), c, dtype=torch.float64, device=logits.device) for c in (0.0, 0.0, 1.0))
        else:
            coefficients = adacl_math.gda_log_odds_coefficients(*reference, prior_ratio=prior_ratio)
        lower = reference[2] if region == "upper" else None
        bounds = _candidate_bounds(coefficients, lower, working_dtype(logits.dtype))
        median = None
        if anchor_stat == "median" and not row_passes.reading_back_is_free(logits.device):
            median = _median_without_keys(logits, summary.positive, positive_col, bounds, rows)
        count, key, row = median or _anchor(logits, summary.positive, positive_col, bounds, anchor_stat, rows)
    found = count > 0
    return AnchorSelection(
        torch.where(found, row, -1),
        torch.where(found, key.view(torch.float32), float("nan")),
        count,
        reference,
        flat_reference,
    )
