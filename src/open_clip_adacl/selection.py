"""Exact global anchor selection over the ranks that share the rows (docs/method.md §5).

Input: this rank's rows x C logits (C = the N columns of the global batch, plus queue columns),
`positive_col`, the global column of each row's positive, which is also the row's global index,
and a `RowGroup`. In OpenCLIP's full-logits regime every rank holds all N rows and RowGroup's
reductions are the identity; with `--local-loss` each rank holds its own b rows and they are
all-reduces. Nothing of size N x N crosses ranks: the reductions move a few scalars, and the exact
median is a radix select whose two passes each all-reduce one 65,537-bin histogram.

Everything runs under `torch.no_grad()`. On a GPU it uses tensor ops only: no `.item()`, no boolean
indexing, no data-dependent Python branch, no tensor made from host values, so the device never
waits for the host. On the CPU,
where reading a value back costs nothing (`reading_back_is_free`), a few values are read to skip
work they show to be unneeded (an empty interval of the candidate test, the keys outside the
median's radix bin); the results are the same. Every rank ends with bit-identical results: each
value either comes out of an all-reduce (min/max/integer sums are exact; a sum in which only the
owner contributes a non-zero is exact) or is computed from such values by the same ops.

The selection reads the logits the loss already has: every decision it makes is invariant under
the positive affine map cos -> t cos + bias (see adacl.py), so no second matmul is needed. Rows are
processed in chunks small enough to stay in the CPU cache (large on a GPU); the only rows x C buffer
is the int32 keys of `candidate_keys`, which the loss reuses from step to step.

The passes over the logits and the keys also exist as traceable functions (`_fused_keys` and the
`*_pass` functions) that `fused.run` compiles: each then reads its input once. On the CPU they
write the keys and histogram them in two compiled passes; on a GPU the median needs no keys at all
(three passes over the logits: `_lower_median_from_logits`). They give the same bits as the eager
passes, which remain the reference and the fallback (see fused.py).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

import torch

from . import adacl, fused
from .distributed import RowGroup

# Radix digit width: two passes of 16 bits resolve a float32 exactly; each pass's histogram
# (65,536 bins, 66,048 in the second pass) is one all-reduce of 0.5 MB, whatever N is.
RADIX_BITS = 16
_RADIX = 1 << RADIX_BITS
_HALF = _RADIX // 2
_LOW_MASK = _RADIX - 1
# Elements per chunk; on the CPU per thread, since each op splits its chunk between the threads.
# Chunks should be few, since every op on a chunk costs a dispatch and, with several threads, a
# fork-join; within a chunk the ops reuse chunk-sized scratch buffers (`ChunkScratch`), which stay
# in the last-level cache. 2^20 per thread (4 MiB of float32) is the middle of a flat optimum
# (sizes tried: docs/THROUGHPUT.md). On a GPU bigger chunks only bound the temporaries.
CHUNK_ELEMENTS = {"cpu": 1 << 20, "cuda": 1 << 24}
_NO_ROW = torch.iinfo(torch.int64).max
_INT32_MIN = torch.iinfo(torch.int32).min


@contextmanager
def one_cpu_thread(device: torch.device) -> Iterator[None]:
    """On the CPU, run the block on one thread (torch's intra-op threads restored after it).

    For the selection's passes: integer and comparison ops that memory traffic bounds, so a second
    thread gains little, while every op costs a fork-join that waits for any thread another process
    has preempted; on a shared machine one thread is the faster choice (measured: docs/THROUGHPUT.md).
    """
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def row_chunks(num_rows: int, num_cols: int, device: torch.device) -> Iterator[Tuple[int, int]]:
    """(start, stop) row ranges covering `num_rows`, each about one cache-sized chunk."""
    step = _chunk_rows(num_cols, device)
    for start in range(0, num_rows, step):
        yield start, min(start + step, num_rows)


def _chunk_rows(num_cols: int, device: torch.device) -> int:
    elements = CHUNK_ELEMENTS.get(device.type, CHUNK_ELEMENTS["cuda"])
    if device.type == "cpu":
        elements *= torch.get_num_threads()
    return max(1, elements // max(num_cols, 1))


class ChunkScratch:
    """Buffers of one chunk's shape (see `row_chunks`), reused from chunk to chunk of a pass: a
    chunk's temporaries then stay in cache instead of being allocated (and, when large,
    page-faulted) anew for every op."""

    def __init__(self, num_rows: int, num_cols: int, device: torch.device):
        self.shape, self.device = (min(num_rows, _chunk_rows(num_cols, device)), num_cols), device
        self._buffers = {}

    def get(self, name: str, dtype: torch.dtype, rows: int) -> torch.Tensor:
        """The first `rows` rows of buffer `name` (made on first use)."""
        buffer = self._buffers.get(name)
        if buffer is None:
            buffer = self._buffers[name] = torch.empty(self.shape, dtype=dtype, device=self.device)
        return buffer[:rows]


def working_dtype(dtype: torch.dtype) -> torch.dtype:
    """Selection statistics run in float32, or float64 for float64 logits (bf16/fp16 are upcast)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _histogram(bins: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Counts of each bin index (int64). `torch.bincount` on CUDA reads the maximum back to the host,
    so the GPU path scatters instead."""
    if reading_back_is_free(bins.device):
        return torch.bincount(bins, minlength=num_bins)
    counts = torch.zeros(num_bins, dtype=torch.int64, device=bins.device)
    return counts.index_add_(0, bins.long(), torch.ones_like(bins, dtype=torch.int64))


def _scatter_histogram(bins: torch.Tensor, num_bins: int) -> torch.Tensor:
    """`_histogram` of bins of any shape as one scatter-add, for the compiled passes (bincount's output
    size depends on the values, which a compiled graph cannot have); inductor fuses it with the ops
    that compute the bins."""
    counts = torch.zeros(num_bins, dtype=torch.int64, device=bins.device)
    return counts.index_put_((bins.long(),), torch.ones((), dtype=torch.int64, device=bins.device), accumulate=True)


# --- per-row summaries ----------------------------------------------------------------------------

@dataclass
class RowSummary:
    """Per-row quantities of this rank's rows, from one pass over the logits."""

    positive: torch.Tensor       # rows: the positive logit, working dtype
    negative_max: torch.Tensor   # rows: max over the row's negatives (-inf without negatives)
    negative_mean: torch.Tensor  # rows, float64: mean over the negatives (NaN unless requested)
    negative_lse: torch.Tensor   # rows: log sum_{j negative} exp(logit_ij) (-inf without negatives)


@torch.no_grad()
def summarize_rows(logits: torch.Tensor, positive_col: torch.Tensor, with_mean: bool = False) -> RowSummary:
    """One chunked pass: positive logit, negatives' max, mean (if `with_mean`) and log-sum-exp.

    The log-sum-exp over the negatives is the loss's denominator without the positive (the loss
    adds its modulated positive to it); the max doubles as the `max` salient score's term. Runs on
    one CPU thread, as the selection (`one_cpu_thread`), with the same results: its chunked ops are
    many short parallel regions, and when other jobs load the cores each waits for a preempted
    thread (measured: docs/THROUGHPUT.md).
    """
    with one_cpu_thread(logits.device):
        return _summarize_rows(logits, positive_col, with_mean)


def _summarize_rows(logits: torch.Tensor, positive_col: torch.Tensor, with_mean: bool) -> RowSummary:
    num_rows, num_cols = logits.shape
    dtype = working_dtype(logits.dtype)
    positive = logits.gather(1, positive_col[:, None]).squeeze(1).to(dtype)
    negative_max = torch.empty(num_rows, dtype=dtype, device=logits.device)
    negative_lse = torch.empty_like(negative_max)
    row_sum = torch.full((num_rows,), float("nan"), dtype=torch.float64, device=logits.device)
    scratch = ChunkScratch(num_rows, num_cols, logits.device)
    for start, stop in row_chunks(num_rows, num_cols, logits.device):
        chunk = scratch.get("chunk", dtype, stop - start).copy_(logits[start:stop])  # modified in place below
        if with_mean:
            row_sum[start:stop] = chunk.sum(dim=1, dtype=torch.float64)
        chunk[torch.arange(stop - start, device=logits.device), positive_col[start:stop]] = float("-inf")
        chunk_max = chunk.amax(dim=1)
        shift = torch.where(torch.isfinite(chunk_max), chunk_max, torch.zeros_like(chunk_max))
        negative_max[start:stop] = chunk_max
        negative_lse[start:stop] = shift + chunk.sub_(shift[:, None]).exp_().sum(dim=1).log()
    negative_mean = (row_sum - positive.double()) / max(num_cols - 1, 1)
    return RowSummary(positive, negative_max, negative_mean, negative_lse)


# --- global reductions over rows ------------------------------------------------------------------

def _owned_row(values: torch.Tensor, row: torch.Tensor, row_index: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(values[local position of global `row`], whether this rank holds that row). `row_index`
    (contiguous) is the global index of each local row; a rank that does not hold the row gets some
    other row of `values` (zeros when it has no rows at all), which callers mask out."""
    if row_index.numel() == 0:
        return values.new_zeros(values.shape[1:]), torch.zeros((), dtype=torch.bool, device=values.device)
    local = (row - row_index[0]).clamp(0, row_index.shape[0] - 1).view(1)
    return values.index_select(0, local).squeeze(0), row_index.index_select(0, local).squeeze(0) == row


def _min_or(values: torch.Tensor, empty: float) -> torch.Tensor:
    """values.min(), or `empty` when a rank has no rows (the number of rows is known on the host)."""
    return values.min() if values.numel() else torch.full((), empty, dtype=values.dtype, device=values.device)


def row_value_from_owner(values: torch.Tensor, row: torch.Tensor, row_index: torch.Tensor,
                         rows: RowGroup) -> torch.Tensor:
    """values[global row] on every rank, bit-exactly, from this rank's per-row vector `values`."""
    return rows.from_owner(*_owned_row(values, row, row_index))


def global_reference_rows(salient: torch.Tensor, row_index: torch.Tensor,
                          rows: RowGroup) -> Tuple[torch.Tensor, torch.Tensor]:
    """Global (most salient, least salient) row, ties to the lowest global row: the max/min of the
    value, then the min of the indices attaining it (two all-reduces for both)."""
    extremes = rows.max(torch.stack([-_min_or(-salient, float("inf")), -_min_or(salient, float("inf"))]))
    attains = torch.stack([salient == extremes[0], salient == -extremes[1]])
    unattained = torch.full((2, 1), _NO_ROW, dtype=row_index.dtype, device=row_index.device)
    index = torch.cat([torch.where(attains, row_index, _NO_ROW), unattained], dim=1).amin(dim=1)
    index = rows.min(index)
    return index[0], index[1]


def reference_fits(logits: torch.Tensor, positive_col: torch.Tensor, clone_row: torch.Tensor,
                   salient_row: torch.Tensor, rows: RowGroup, std_floor) -> torch.Tensor:
    """(mu_c, sigma_c, mu_n, sigma_n), float64 (4,): Gaussians of the least salient row's negatives
    (class clone) and of the most salient row's (class not clone), fitted by each row's owner and
    shared bit-exactly (one all-reduce)."""
    fits, owned = [], []
    cols = torch.arange(logits.shape[1], device=logits.device)
    for row in (clone_row, salient_row):
        # A row's global index is its positive column.
        row_logits, is_owner = _owned_row(logits, row, positive_col)
        row_positive, _ = _owned_row(positive_col, row, positive_col)
        fits.extend(adacl.gaussian_fit(row_logits, cols != row_positive, std_floor))
        owned.extend([is_owner, is_owner])
    return rows.from_owner(torch.stack(fits), torch.stack(owned))


# --- candidates and their gaps --------------------------------------------------------------------

# Keys of entries that are not clone candidates have all exponent bits set, so they read as +-inf
# or NaN: they never equal a finite gap's key, and their high 16 bits fall in the 256 bins
# 0x7f80-0x7fff and 0xff80-0xffff, which hold no finite float, so the radix select simply empties
# those bins. An entry whose gap is not finite (a non-finite logit, or an overflow) has these bits
# already, so it is never a candidate whatever its GDA test says. Sign and mantissa are left as
# they were so that these keys spread over the 256 bins: a histogram that increments one counter
# over and over stalls on the store-to-load dependency on CPUs.
NOT_CANDIDATE_BITS = 0x7F800000
_NOT_CANDIDATE_BINS = (slice(_HALF - 128, _HALF), slice(_RADIX - 128, _RADIX))  # `_high_histogram` indices


def candidate_bounds(intervals: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The open float64 intervals (a, b) of `adacl.positive_quadratic_intervals` as closed bounds
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


Bounds = List[Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]]


def _bounds_to_test(bounds: torch.Tensor) -> Bounds:
    """The (lo, hi) pairs that `_outside_bits` tests; None: that side needs no test.

    On a GPU both intervals are tested as they are (reading the bounds back would make the device
    wait). On the CPU, where reading them back costs nothing, an empty interval is dropped and an
    unbounded side (every finite x passes it) is not tested, which saves whole passes over the
    logits and gives the same keys.
    """
    if not reading_back_is_free(bounds.device):
        return [(lo, hi) for lo, hi in bounds]
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

    An interval's margin min(x - lo, hi - x) has its sign bit clear exactly when x is inside (see
    `candidate_bounds`), and so does the max of the intervals' margins for their union. Arithmetic
    and one shift instead of comparisons and `torch.where`, which cost more on CPUs.
    """
    if not bounds:
        out.fill_(NOT_CANDIDATE_BITS)
        return True
    if any(lo is None and hi is None for lo, hi in bounds):
        return False
    rows = x.shape[0]
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
def candidate_keys(logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor,
                   coefficients: Tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                   workspace: Optional["KeyWorkspace"] = None,
                   lower: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(keys, count, high_counts) of this rank's rows (docs/method.md §3.4-3.5), in one pass.

    keys (rows x C int32): for a clone candidate (a negative whose GDA log-odds A x^2 + B x + C is
    positive, x its logit) the float32 bits of its gap, positive logit - x; for every other entry
    the same bits with `NOT_CANDIDATE_BITS` set. `candidate_gaps(keys)` reads the gaps back.
    count: this rank's number of candidates. high_counts: this rank's first radix histogram
    (see `radix_select`). `workspace` keeps the keys' buffer from step to step, so that no fresh
    rows x C buffer (and its page faults) is needed each step. `lower`
    (0-dim, logit units): only entries above it are candidates (the `upper` candidate region).

    The log-odds test is done as "x lies in one of two intervals" whose float64 bounds are the
    quadratic's roots (`adacl.positive_quadratic_intervals`), rounded outwards to the logits'
    working dtype (`candidate_bounds`), so it is the sign of the exact quadratic at x, the same
    on every device, with a few subtractions per entry. Zero log-odds is not a candidate, and
    neither is an entry whose gap is not finite (NaN or infinite logits). The positive is made
    +0.0 if it is -0.0, so that no gap is -0.0: equal gaps have equal keys and the owner row is the
    lowest, as in `adacl.anchor_statistic`.
    """
    num_rows, num_cols = logits.shape
    bounds = _candidate_bounds(coefficients, lower, working_dtype(logits.dtype))
    keys = (workspace or KeyWorkspace()).get(num_rows * num_cols, logits.device).view(num_rows, num_cols)
    args = (logits, positive, positive_col, bounds, keys)
    if fused.wanted(logits, "keys", lambda: _compiled_candidate_keys(*args), lambda: _eager_candidate_keys(*args)):
        try:
            return _compiled_candidate_keys(*args)
        except fused.Unavailable:
            pass
    return _eager_candidate_keys(*args)


def _compiled_candidate_keys(logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor,
                             bounds: torch.Tensor, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`candidate_keys` by the two compiled passes; raises `fused.Unavailable`."""
    with one_cpu_thread(logits.device):
        fused.run(_keys_pass, logits, positive, positive_col, bounds, keys)
        high_counts = fused.run(_high_histogram_pass, keys)
    return keys, _count_candidates(high_counts, keys.numel()), high_counts


def _eager_candidate_keys(logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor,
                          bounds: torch.Tensor, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`candidate_keys` by the chunked eager passes."""
    num_rows, num_cols = logits.shape
    dtype = working_dtype(logits.dtype)
    bounds = _bounds_to_test(bounds)
    positive = positive.to(dtype)[:, None] + 0.0
    high_counts = torch.zeros(_RADIX, dtype=torch.int64, device=logits.device)
    scratch = ChunkScratch(num_rows, num_cols, logits.device)
    for start, stop in row_chunks(num_rows, num_cols, logits.device):
        x = logits[start:stop].to(dtype)
        chunk_keys = keys[start:stop]
        gap = torch.sub(positive[start:stop], x, out=chunk_keys.view(torch.float32))
        if dtype != torch.float32:
            gap.add_(0.0)  # a negative float64 gap too small for float32 rounds to -0.0
        bits = scratch.get("bits", torch.int32, stop - start)
        if _outside_bits(x, bounds, bits, scratch):
            chunk_keys |= bits
        chunk_keys[torch.arange(stop - start, device=logits.device), positive_col[start:stop]] = NOT_CANDIDATE_BITS
        high_counts += _high_histogram(chunk_keys, out=bits)
    return keys, _count_candidates(high_counts, keys.numel()), high_counts


def _candidate_bounds(coefficients: Tuple[torch.Tensor, torch.Tensor, torch.Tensor], lower: Optional[torch.Tensor],
                      dtype: torch.dtype) -> torch.Tensor:
    """`candidate_bounds` of the GDA log-odds' positive set (above `lower` when given)."""
    return candidate_bounds(adacl.positive_quadratic_intervals(*coefficients, lower=lower), dtype)


def _count_candidates(high_counts: torch.Tensor, num_entries: int) -> torch.Tensor:
    """This rank's number of candidates, from the first-pass histogram of all its `num_entries` keys,
    whose not-candidate bins it then empties (see `radix_select`)."""
    count = num_entries - sum(high_counts[bins].sum() for bins in _NOT_CANDIDATE_BINS)
    _drop_not_candidate_bins(high_counts)
    return count


def _drop_not_candidate_bins(high_counts: torch.Tensor) -> None:
    for bins in _NOT_CANDIDATE_BINS:
        high_counts[bins] = 0


# --- the compiled passes (fused.py) ----------------------------------------------------------------

def _fused_keys(logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor,
                bounds: torch.Tensor) -> torch.Tensor:
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


def _keys_pass(logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor, bounds: torch.Tensor,
               out: torch.Tensor) -> None:
    """Writes the keys into `out` (rows x C int32)."""
    out.copy_(_fused_keys(logits, positive, positive_col, bounds))


def _high_histogram_pass(keys: torch.Tensor) -> torch.Tensor:
    """`_high_histogram` of the keys."""
    return _scatter_histogram(_high_bins(keys), _RADIX)


def _low_histogram_pass(keys: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """`_low_histogram` of the keys."""
    return _scatter_histogram(_low_bins(keys, high), _LOW_BINS)


def _row_min_xor_pass(keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`_row_min_xor` of the keys."""
    return (keys ^ mask).amin(dim=1)


def _high_histogram_of_logits(logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor,
                              bounds: torch.Tensor) -> torch.Tensor:
    """`_high_histogram` of the keys, computed on the fly from the logits."""
    return _high_histogram_pass(_fused_keys(logits, positive, positive_col, bounds))


def _low_histogram_of_logits(logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor,
                             bounds: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """`_low_histogram` of the keys, computed on the fly from the logits."""
    return _low_histogram_pass(_fused_keys(logits, positive, positive_col, bounds), high)


def _row_min_xor_of_logits(logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor,
                           bounds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`_row_min_xor` of the keys, computed on the fly from the logits."""
    return _row_min_xor_pass(_fused_keys(logits, positive, positive_col, bounds), mask)


def _lower_median_from_logits(logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor,
                              bounds: torch.Tensor, rows: RowGroup) -> Optional[Tuple[torch.Tensor, ...]]:
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
    high, rank_in_bin = _high_bin(high_counts, ((count - 1) // 2).clamp(min=0), rows)
    key = _key_in_bin(fused.run(_low_histogram_of_logits, *args, high), high, rank_in_bin, rows)
    row_min = fused.run(_row_min_xor_of_logits, *args, key ^ _INT32_MIN)
    return count, key, _first_row_holding(row_min, positive_col, rows)


def _median_without_keys(logits: torch.Tensor, positive: torch.Tensor, positive_col: torch.Tensor,
                         coefficients: Tuple[torch.Tensor, torch.Tensor, torch.Tensor], lower: Optional[torch.Tensor],
                         rows: RowGroup) -> Optional[Tuple[torch.Tensor, ...]]:
    """`_lower_median_from_logits` where the fused passes are wanted, else None (the caller writes keys).
    `auto` times both ways on this rank's rows alone (no collective), so that ranks choosing
    differently still run the same collectives."""
    bounds = _candidate_bounds(coefficients, lower, working_dtype(logits.dtype))
    alone = RowGroup(split_across_ranks=False)

    def compiled():
        if _lower_median_from_logits(logits, positive, positive_col, bounds, alone) is None:
            raise fused.Unavailable("median")

    def eager():  # its keys are freed after the timing: the fused median needs none
        keys = torch.empty(logits.shape, dtype=torch.int32, device=logits.device)
        _anchor_from_keys(_eager_candidate_keys(logits, positive, positive_col, bounds, keys), "median",
                          positive_col, alone)

    if not fused.wanted(logits, "median", compiled, eager):
        return None
    return _lower_median_from_logits(logits, positive, positive_col, bounds, rows)


class KeyWorkspace:
    """The int32 buffer that `candidate_keys` writes its keys into, kept from step to step (by the loss)
    and allocated at its first use: a median from the logits (`_lower_median_from_logits`) needs none."""

    def __init__(self):
        self._buffer: Optional[torch.Tensor] = None

    def get(self, num_elements: int, device: torch.device) -> torch.Tensor:
        """The first `num_elements` of the buffer (flat), grown or moved to `device` when needed."""
        if self._buffer is None or self._buffer.numel() < num_elements or self._buffer.device != device:
            self._buffer = torch.empty(num_elements, dtype=torch.int32, device=device)
        return self._buffer[:num_elements]


def masked_keys(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Keys as `candidate_keys` writes them (-0.0 stored as +0.0), for float32 `values` selected by a
    bool `mask`."""
    bits = values.float().add(0.0).view(torch.int32)
    return torch.where(mask, bits, bits | NOT_CANDIDATE_BITS)


def candidate_gaps(keys: torch.Tensor, fill: float) -> torch.Tensor:
    """The candidates' gaps as float32, `fill` for the other entries."""
    return keys.view(torch.float32).nan_to_num(nan=fill, posinf=fill, neginf=fill)


def _high_histogram(keys: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Histogram (65,536 bins, index = high 16 bits + 2^15) of int32 keys; `out` (int32, keys'
    shape) receives the bin indices."""
    return _histogram(_high_bins(keys, out).reshape(-1), _RADIX)


def _high_bins(keys: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    return torch.bitwise_right_shift(keys, RADIX_BITS, out=out).add_(_HALF)


# Bins of the second radix pass: 256 + the low 16 bits for keys in the selected high bin, and 512 dump
# bins (0-255 below, 65,792-66,047 above) spread by the keys' lowest 8 bits for all others: nearly every key
# is dumped, and a histogram whose increments keep hitting the same few counters stalls (see
# NOT_CANDIDATE_BITS). With 16 dump bins the compiled pass over 4096 x 4096 keys took 48 ms on an AMD EPYC
# (family 25, model 17), one thread; with these 512, 12 ms.
_LOW_OFFSET = 256
_LOW_BINS = _RADIX + 2 * _LOW_OFFSET


def _low_histogram(keys: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Histogram (`_LOW_BINS`) of the low 16 bits of the keys whose high 16 bits equal `high`."""
    return _histogram(_low_bins(keys, high).reshape(-1), _LOW_BINS)


def _low_bins(keys: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """`_low_histogram`'s bin of each key.

    relative = key ^ (high << 16) lies in [0, 2^16) exactly for those keys (the xor clears their
    high bits and leaves a high bit, or the sign, set in every other key): they go to 256 + relative,
    the others below (relative < 0) to their own low 8 bits, above to 2^16 + 256 + those bits.
    """
    relative = keys ^ (high << RADIX_BITS).to(torch.int32)
    spread = relative & (_LOW_OFFSET - 1)
    dump = torch.where(relative < 0, spread, spread + (_RADIX + _LOW_OFFSET))
    return torch.where((relative >= 0) & (relative < _RADIX), relative + _LOW_OFFSET, dump)


def _locate(counts: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(bin holding the k-th element (0-based) of a histogram in value order, k's rank inside it)."""
    cumulative = counts.cumsum(0)
    position = torch.searchsorted(cumulative, k.view(1), right=True).clamp(max=counts.numel() - 1).squeeze(0)
    below = cumulative[position] - counts[position]
    return position, k - below


@torch.no_grad()
def radix_select(keys: torch.Tensor, k: torch.Tensor, rows: RowGroup,
                 high_counts: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The exact k-th smallest (0-based) float32 among the candidate `keys` (rows x C int32, see
    `candidate_keys` / `masked_keys`; the candidates must be finite) of all ranks; returned as its
    key (0-dim int32).

    Two passes over the float bits, high 16 then low 16, each one histogram all-reduce. Float bit
    patterns read as int32 order positive floats upwards and negative floats downwards, so each
    histogram is read with its negative half reversed instead of transforming every key. Ties
    count like `torch.sort`; -0.0 sorts just before +0.0. `high_counts`: this rank's first-pass
    histogram when the caller already has it. Needs 0 <= k < count; otherwise the result is
    meaningless but no index is out of range.
    """
    if high_counts is None:
        high_counts = sum((_high_histogram(keys[start:stop]) for start, stop in row_chunks(*keys.shape, keys.device)),
                          torch.zeros(_RADIX, dtype=torch.int64, device=keys.device))
        _drop_not_candidate_bins(high_counts)
    high, rank_in_bin = _high_bin(high_counts, k, rows)
    low_counts = sum((_low_histogram(keys[start:stop], high) for start, stop in row_chunks(*keys.shape, keys.device)),
                     torch.zeros(_LOW_BINS, dtype=torch.int64, device=keys.device))
    return _key_in_bin(low_counts, high, rank_in_bin, rows)


def _high_bin(high_counts: torch.Tensor, k: torch.Tensor, rows: RowGroup) -> Tuple[torch.Tensor, torch.Tensor]:
    """(signed high 16 bits of the k-th smallest key, its rank among the keys with those bits), from
    this rank's first-pass histogram (one all-reduce)."""
    high_counts = rows.sum(high_counts)
    position, rank_in_bin = _locate(torch.cat([high_counts[:_HALF].flip(0), high_counts[_HALF:]]), k)
    return torch.where(position < _HALF, -1 - position, position - _HALF), rank_in_bin


def _key_in_bin(low_counts: torch.Tensor, high: torch.Tensor, rank_in_bin: torch.Tensor,
                rows: RowGroup) -> torch.Tensor:
    """The key of rank `rank_in_bin` among those with high bits `high`, from this rank's second-pass
    histogram (`_low_histogram`; one all-reduce)."""
    low_counts = rows.sum(low_counts)[_LOW_OFFSET:_LOW_OFFSET + _RADIX]
    negative = high < 0
    low_position, _ = _locate(torch.where(negative, low_counts.flip(0), low_counts), rank_in_bin)
    low = torch.where(negative, _LOW_MASK - low_position, low_position)
    return (high * _RADIX + low).to(torch.int32)


@torch.no_grad()
def lower_median(keys: torch.Tensor, count: torch.Tensor, high_counts: torch.Tensor, row_index: torch.Tensor,
                 rows: RowGroup) -> Tuple[torch.Tensor, torch.Tensor]:
    """(key of the lower median candidate, the (count - 1) // 2-th smallest of all ranks; the lowest
    global row holding it). `count`: the global number of candidates; `high_counts`: this rank's
    first-pass histogram from `candidate_keys`.

    On a GPU: `radix_select`'s second pass and `first_row_with_key`, two more passes over the keys
    with nothing read back. On the CPU, where reading back is free, either the same two passes
    compiled (`_compiled_key_in_bin`), or one chunked pass that collects the keys of the median's
    high bin, after which the second histogram and the owner search run on those alone
    (`_eager_key_in_bin`), whichever `fused.wanted` picks; the result is the same.
    """
    k = ((count - 1) // 2).clamp(min=0)
    if not reading_back_is_free(keys.device):
        key = radix_select(keys, k, rows, high_counts)
        return key, first_row_with_key(keys, key, row_index, rows)
    high, rank_in_bin = _high_bin(high_counts, k, rows)
    # `auto` times both ways on this rank's rows alone (no collective), so that ranks choosing differently
    # still run the same collectives.
    alone = RowGroup(split_across_ranks=False)
    if fused.wanted(keys, "median", lambda: _compiled_key_in_bin(keys, high, rank_in_bin, row_index, alone),
                    lambda: _eager_key_in_bin(keys, high, rank_in_bin, row_index, alone)):
        try:
            return _compiled_key_in_bin(keys, high, rank_in_bin, row_index, rows)
        except fused.Unavailable:
            pass
    return _eager_key_in_bin(keys, high, rank_in_bin, row_index, rows)


def _compiled_key_in_bin(keys: torch.Tensor, high: torch.Tensor, rank_in_bin: torch.Tensor, row_index: torch.Tensor,
                         rows: RowGroup) -> Tuple[torch.Tensor, torch.Tensor]:
    """`lower_median`'s (key, row) from its high bin by two compiled passes over all the keys (the bin's low
    histogram, the owner search); raises `fused.Unavailable` before any collective."""
    low_counts = fused.run(_low_histogram_pass, keys, high)
    fused.prepare(_row_min_xor_pass, keys, keys.new_zeros(()))
    key = _key_in_bin(low_counts, high, rank_in_bin, rows)
    return key, _first_row_holding(fused.run(_row_min_xor_pass, keys, key ^ _INT32_MIN), row_index, rows)


def _eager_key_in_bin(keys: torch.Tensor, high: torch.Tensor, rank_in_bin: torch.Tensor, row_index: torch.Tensor,
                      rows: RowGroup) -> Tuple[torch.Tensor, torch.Tensor]:
    """The same from the keys of the high bin, collected by one chunked pass (a small fraction of the keys)."""
    bin_keys, bin_rows = _keys_with_high_bits(keys, int(high), row_index)
    key = _key_in_bin(_low_histogram(bin_keys, high), high, rank_in_bin, rows)
    return key, rows.min(_min_or(torch.where(bin_keys == key, bin_rows, _NO_ROW), _NO_ROW))


def _keys_with_high_bits(keys: torch.Tensor, high: int, row_index: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(the keys whose signed high 16 bits are `high`, the global row of each), in row order.

    key ^ (high << 16) lies in [0, 2^16) exactly for those keys, and flipping the sign bit as well
    maps that range to the 2^16 smallest int32 values. So per chunk one xor and a min per row find
    the rows that hold such keys, and only those rows, still in cache, are searched for them.
    """
    flip = (high << RADIX_BITS) ^ _INT32_MIN
    bound = _INT32_MIN + _RADIX
    found_keys, found_rows = [], []
    scratch = ChunkScratch(*keys.shape, keys.device)
    for start, stop in row_chunks(*keys.shape, keys.device):
        flipped = torch.bitwise_xor(keys[start:stop], flip, out=scratch.get("xor", torch.int32, stop - start))
        holding = (flipped.amin(dim=1) < bound).nonzero().squeeze(1)
        held = flipped.index_select(0, holding)
        row, col = (held < bound).nonzero(as_tuple=True)
        found_keys.append(held[row, col] ^ flip)
        found_rows.append(row_index[start:stop].index_select(0, holding)[row])
    if not found_keys:  # no rows on this rank
        return keys.new_empty(0), row_index.new_empty(0)
    return torch.cat(found_keys), torch.cat(found_rows)


def reading_back_is_free(device: torch.device) -> bool:
    """Whether the host may read a tensor's values (`.item()`, `.tolist()`, `nonzero`) without making
    a device wait: on the CPU, where the ops have already run. The selection then skips work that
    the values show to be unneeded; elsewhere it runs the same ops whatever the values."""
    return device.type == "cpu"


def first_row_with_key(keys: torch.Tensor, key: torch.Tensor, row_index: torch.Tensor, rows: RowGroup) -> torch.Tensor:
    """Lowest global row holding `key` (one all-reduce)."""
    return _first_row_holding(_row_min_xor(keys, key.to(torch.int32) ^ _INT32_MIN), row_index, rows)


def _first_row_holding(row_min: torch.Tensor, row_index: torch.Tensor, rows: RowGroup) -> torch.Tensor:
    """Lowest global row whose `row_min`, the min over the row of keys ^ key ^ INT32_MIN, is INT32_MIN:
    the lowest row holding `key` (one all-reduce).

    keys ^ key is 0 exactly where the key matches; flipping the sign bit too maps that 0 to the
    smallest int32 (one xor and one min per entry: cheaper than == and .any() on CPUs)."""
    return rows.min(_min_or(torch.where(row_min == _INT32_MIN, row_index, _NO_ROW), _NO_ROW))


def _row_min_xor(keys: torch.Tensor, mask) -> torch.Tensor:
    """Per row, min over the row of keys ^ mask (int32)."""
    row_min = torch.empty(keys.shape[0], dtype=torch.int32, device=keys.device)
    scratch = ChunkScratch(*keys.shape, keys.device)
    for start, stop in row_chunks(*keys.shape, keys.device):
        flipped = torch.bitwise_xor(keys[start:stop], mask, out=scratch.get("xor", torch.int32, stop - start))
        row_min[start:stop] = flipped.amin(dim=1)
    return row_min


def masked_extreme(keys: torch.Tensor, largest: bool, rows: RowGroup) -> torch.Tensor:
    """Key of the global max (or min) candidate gap."""
    fill = float("-inf") if largest else float("inf")
    extremes = torch.stack([torch.full((), fill, device=keys.device)] + [
        candidate_gaps(keys[start:stop], fill).max() if largest else candidate_gaps(keys[start:stop], fill).min()
        for start, stop in row_chunks(*keys.shape, keys.device)])
    extreme = rows.max(extremes.max()) if largest else rows.min(extremes.min())
    return extreme.view(torch.int32)


def masked_mean(keys: torch.Tensor, count: torch.Tensor, rows: RowGroup) -> torch.Tensor:
    """Global mean of the candidate gaps, float64 (per-rank sums all-reduced)."""
    total = sum((candidate_gaps(keys[start:stop], 0.0).double().sum() for start, stop in row_chunks(*keys.shape, keys.device)),
                torch.zeros((), dtype=torch.float64, device=keys.device))
    return rows.sum(total) / count.clamp(min=1)


def nearest_key(keys: torch.Tensor, target: torch.Tensor, row_index: torch.Tensor,
                rows: RowGroup) -> Tuple[torch.Tensor, torch.Tensor]:
    """(row, key) of the candidate gap nearest to `target` (float64 distances), the lowest
    (row, column) among equally near ones."""
    distance = torch.empty(keys.shape[0], dtype=torch.float64, device=keys.device)
    nearest = torch.empty(keys.shape[0], dtype=torch.int32, device=keys.device)
    for start, stop in row_chunks(*keys.shape, keys.device):
        gaps = (candidate_gaps(keys[start:stop], float("inf")).double() - target).abs()
        distance[start:stop], column = gaps.min(dim=1)  # the first minimum: the lowest column
        nearest[start:stop] = keys[start:stop].gather(1, column[:, None]).squeeze(1)
    best = rows.min(_min_or(distance, float("inf")))
    row = rows.min(_min_or(torch.where(distance == best, row_index, _NO_ROW), _NO_ROW))
    return row, row_value_from_owner(nearest, row, row_index, rows)


# --- the whole selection ----------------------------------------------------------------------------

@dataclass
class AnchorSelection:
    """One direction's anchor, identical on every rank. Logit units."""

    row: torch.Tensor             # 0-dim int64: global row u owning the anchor element (-1: no candidate)
    gap: torch.Tensor             # 0-dim float32: the anchor element's gap, positive - negative logit (NaN: none)
    num_candidates: torch.Tensor  # 0-dim int64: |S~|
    reference: torch.Tensor       # (4,) float64: mu_c, sigma_c, mu_n, sigma_n
    flat_reference: torch.Tensor  # 0-dim bool: a reference fit is at the std floor


def _anchor_from_keys(candidates: Tuple[torch.Tensor, torch.Tensor, torch.Tensor], anchor_stat: str,
                      row_index: torch.Tensor, rows: RowGroup) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(global candidate count, anchor key, its lowest global row) from this rank's `candidate_keys`."""
    keys, count, high_counts = candidates
    count = rows.sum(count)
    if anchor_stat == "median":
        key, row = lower_median(keys, count, high_counts, row_index, rows)
    elif anchor_stat == "mean":
        row, key = nearest_key(keys, masked_mean(keys, count, rows), row_index, rows)
    else:
        key = masked_extreme(keys, anchor_stat == "max", rows)
        row = first_row_with_key(keys, key, row_index, rows)
    return count, key, row


@torch.no_grad()
def batch_reference(logits: torch.Tensor, summary: RowSummary, positive_col: torch.Tensor, rows: RowGroup, *,
                    salient: str, std_floor) -> torch.Tensor:
    """docs/method.md §3.1-3.2 over the global batch: (mu_c, sigma_c, mu_n, sigma_n), float64 (4,), the Gaussians
    of the least and the most salient row's negatives, exactly as `select_anchor` fits them (its first step)."""
    if salient not in adacl.SALIENT_KINDS:
        raise ValueError(f"salient must be one of {adacl.SALIENT_KINDS}, got {salient!r}")
    with one_cpu_thread(logits.device):
        return _batch_reference(logits, summary, positive_col, rows, salient, std_floor)


def _batch_reference(logits: torch.Tensor, summary: RowSummary, positive_col: torch.Tensor, rows: RowGroup,
                     salient: str, std_floor) -> torch.Tensor:
    negative_term = summary.negative_max if salient == "max" else summary.negative_mean
    salient_row, clone_row = global_reference_rows(summary.positive - negative_term, positive_col, rows)
    return reference_fits(logits, positive_col, clone_row, salient_row, rows, std_floor)


def select_anchor(logits: torch.Tensor, summary: RowSummary, positive_col: torch.Tensor, rows: RowGroup, *,
                  salient: str, anchor_stat: str, prior_ratio: float, std_floor,
                  workspace: Optional[KeyWorkspace] = None, region: str = "gda") -> AnchorSelection:
    """docs/method.md §3.1-3.5 over the global batch: salient scores, reference rows, GDA, candidates, and
    the anchor element (median / mean / min / max of the candidate gaps) with its owner row.
    `region`: the candidate region (`adacl.clone_candidate_mask`).

    `std_floor` is in logit units (the loss passes floor * t); `workspace` see `candidate_keys`.
    An empty candidate set (num_candidates = 0) returns row -1, which no rank owns, and a NaN gap;
    the caller falls back to vanilla CL.

    Ranks may hold different numbers of rows, none included: every rank runs the same collectives.
    """
    if salient not in adacl.SALIENT_KINDS:
        raise ValueError(f"salient must be one of {adacl.SALIENT_KINDS}, got {salient!r}")
    if anchor_stat not in adacl.ANCHOR_STATS:
        raise ValueError(f"anchor_stat must be one of {adacl.ANCHOR_STATS}, got {anchor_stat!r}")
    if region not in adacl.CANDIDATE_REGIONS:
        raise ValueError(f"candidate_region must be one of {adacl.CANDIDATE_REGIONS}, got {region!r}")
    with one_cpu_thread(logits.device):
        row_index = positive_col
        reference = _batch_reference(logits, summary, positive_col, rows, salient, std_floor)
        floor = torch.as_tensor(std_floor, dtype=torch.float64, device=logits.device)
        flat_reference = (reference[1] <= floor) | (reference[3] <= floor)
        if region == "all":  # log-odds 0 s^2 + 0 s + 1 > 0: every negative
            coefficients = tuple(torch.full((), c, dtype=torch.float64, device=logits.device) for c in (0.0, 0.0, 1.0))
        else:
            coefficients = adacl.gda_log_odds_coefficients(*reference, prior_ratio=prior_ratio)
        lower = reference[2] if region == "upper" else None
        median = None
        if anchor_stat == "median" and not reading_back_is_free(logits.device):
            median = _median_without_keys(logits, summary.positive, positive_col, coefficients, lower, rows)
        count, key, row = median or _anchor_from_keys(
            candidate_keys(logits, summary.positive, positive_col, coefficients, workspace, lower), anchor_stat,
            row_index, rows)
    found = count > 0
    return AnchorSelection(torch.where(found, row, -1), torch.where(found, key.view(torch.float32), float("nan")),
                           count, reference, flat_reference)
