"""The exact k-th smallest of float32 values spread over the ranks that share the rows, and the lowest
global row holding it, without gathering the values (docs/method.md §5).

The values come as keys: each float32's bits read as int32 (rows x C). A key whose float is not finite
(every exponent bit set: NaN or +-inf) never takes part, which is how a caller leaves entries out
(`selection.NOT_CANDIDATE_BITS`). Float bit patterns read as int32 order positive floats upwards and
negative floats downwards, so the select is two radix passes over the bits, the high 16 then the low
16, each one histogram all-reduce of about 0.5 MB whatever the number of values (`radix_select`); the
owner is one more pass and one all-reduce (`first_row_with_key`). `lower_median` is the select at the
lower median, with the CPU's shortcut. The passes also exist as traceable functions (`*_pass`) that
`fused.run` compiles, and the steps that read a histogram (`high_bin`, `key_in_bin`) stand alone, for
a caller that computes the histograms its own way (`selection._lower_median_from_logits`, which never
writes the keys). Everything here runs under `torch.no_grad()`, with tensor ops only where reading
back would make a device wait (`row_passes.reading_back_is_free`); every rank ends with the same bits.
"""

from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch

from . import fused, row_passes
from .distributed import RowGroup
from .row_passes import NO_ROW, ChunkScratch, min_or, row_chunks

# Radix digit width: two passes of 16 bits resolve a float32 exactly; each pass's histogram
# (65,536 bins, 66,048 in the second pass) is one all-reduce of 0.5 MB, whatever N is.
RADIX_BITS = 16
_RADIX = 1 << RADIX_BITS
_HALF = _RADIX // 2
_LOW_MASK = _RADIX - 1
HIGH_BINS = _RADIX  # bins of the first pass's histogram (`high_histogram`)
INT32_MIN = torch.iinfo(torch.int32).min
# Counters per bin of the GPU path's histograms at most (`_histogram`): 65,536 bins x 32 lanes of int32 is 8 MB.
HISTOGRAM_LANES = 32
# The first-pass bins of non-finite floats: high 16 bits 0x7f80-0x7fff and 0xff80-0xffff (every exponent bit
# set), which hold no finite float (`high_histogram` indices).
_NON_FINITE_BINS = (slice(_HALF - 128, _HALF), slice(_RADIX - 128, _RADIX))


def _lane_histogram(
    bins: torch.Tensor, num_bins: int, offset: int = 0, weights: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """The GPU path's histogram (int64, `num_bins`) of a rows x C block of bin indices plus `offset`, each entry
    counted `weights` (int32, the block's shape) times, or once. `torch.bincount` on CUDA reads the maximum back
    to the host, so this scatters instead, each bin spread over `_lanes` counters by the entry's column and the
    lanes summed after: trained logits put about 1% of all keys into one bin, and atomic adds to one address take
    turns (docs/THROUGHPUT.md, the GPU section). The counts are the same whatever the lanes (integer sums)."""
    lanes = _lanes(bins.numel(), num_bins)
    lane = torch.arange(bins.shape[-1], dtype=torch.int32, device=bins.device).remainder_(lanes).add_(offset * lanes)
    spread = torch.add(lane, bins, alpha=lanes)  # one op: (bin + offset) * lanes + the column's lane
    # int32 counters: a block holds fewer than 2^31 entries (a row chunk: row_passes.CHUNK_ELEMENTS).
    counts = torch.zeros(num_bins * lanes, dtype=torch.int32, device=bins.device)
    if weights is None:
        weights = torch.ones((), dtype=torch.int32, device=bins.device).expand(spread.shape)
    return counts.index_add_(0, spread.view(-1), weights.reshape(-1)).view(num_bins, lanes).sum(1, dtype=torch.int64)


def _lanes(num_entries: int, num_bins: int) -> int:
    """Counters per bin: up to `HISTOGRAM_LANES`, and no more counters than entries, so that a small block (a
    batch of 256 has 65,536 keys) is not outweighed by zeroing and summing 2^21 counters."""
    return max(1, min(HISTOGRAM_LANES, num_entries // num_bins))


def _scatter_histogram(bins: torch.Tensor, num_bins: int) -> torch.Tensor:
    """`_histogram` of bins of any shape as one scatter-add, for the compiled passes (bincount's output
    size depends on the values, which a compiled graph cannot have); inductor fuses it with the ops
    that compute the bins."""
    counts = torch.zeros(num_bins, dtype=torch.int64, device=bins.device)
    return counts.index_put_((bins.long(),), torch.ones((), dtype=torch.int64, device=bins.device), accumulate=True)


# --- the keys, a row chunk at a time ----------------------------------------------------------------


def key_blocks(keys) -> Iterator[Tuple[int, int, torch.Tensor]]:
    """(start, stop, the keys of rows start:stop) over all the rows of `keys`, in row chunks: either a
    rows x C int32 tensor, or a source with `blocks()` yielding the same, such as `selection.KeyBlocks`,
    which computes each chunk's keys when it is read instead of storing them all. A block is read before
    the next is asked for: a source may reuse its buffer."""
    if isinstance(keys, torch.Tensor):
        return ((start, stop, keys[start:stop]) for start, stop in row_chunks(*keys.shape, keys.device))
    return keys.blocks()


# --- the two passes' histograms --------------------------------------------------------------------


def high_histogram(keys: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Histogram (65,536 bins, index = high 16 bits + 2^15) of a rows x C block of int32 keys; `out` (int32,
    keys' shape) receives the bin indices (on a GPU: the high 16 bits)."""
    if row_passes.reading_back_is_free(keys.device):
        return torch.bincount(_high_bins(keys, out).reshape(-1), minlength=_RADIX)
    return _lane_histogram(torch.bitwise_right_shift(keys, RADIX_BITS, out=out), _RADIX, offset=_HALF)


def _high_bins(keys: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    return torch.bitwise_right_shift(keys, RADIX_BITS, out=out).add_(_HALF)


def drop_non_finite(high_counts: torch.Tensor) -> torch.Tensor:
    """Empty the first-pass bins of non-finite keys, which are never selected; returns how many keys they
    held (0-dim int64)."""
    dropped = sum(high_counts[bins].sum() for bins in _NON_FINITE_BINS)
    for bins in _NON_FINITE_BINS:
        high_counts[bins] = 0
    return dropped


# Bins of the second radix pass: 256 + the low 16 bits for keys in the selected high bin, and 512 dump
# bins (0-255 below, 65,792-66,047 above) spread by the keys' lowest 8 bits for all others: nearly every key
# is dumped, and a histogram whose increments keep hitting the same few counters stalls (see
# selection.NOT_CANDIDATE_BITS). With 16 dump bins the compiled pass over 4096 x 4096 keys took 48 ms on an
# AMD EPYC (family 25, model 17), one thread; with these 512, 12 ms.
_LOW_OFFSET = 256
_LOW_BINS = _RADIX + 2 * _LOW_OFFSET


def _low_histogram(keys: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """Histogram (`_LOW_BINS`) of the low 16 bits of the keys whose high 16 bits equal `high`. On a GPU every key
    is counted in the bin of its low 16 bits, 1 or 0 times as its high bits are `high` or not: a rows x C block
    whose keys lie nearly all outside that bin then spreads its adds over every bin, with no bins to dump them
    in (`_low_bins`)."""
    if row_passes.reading_back_is_free(keys.device):
        return torch.bincount(_low_bins(keys, high).reshape(-1), minlength=_LOW_BINS)
    in_bin = torch.eq(keys >> RADIX_BITS, high).to(torch.int32)
    return _lane_histogram(keys & _LOW_MASK, _LOW_BINS, offset=_LOW_OFFSET, weights=in_bin)


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


# --- the select -------------------------------------------------------------------------------------


def _locate(counts: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(bin holding the k-th element (0-based) of a histogram in value order, k's rank inside it)."""
    cumulative = counts.cumsum(0)
    position = torch.searchsorted(cumulative, k.view(1), right=True).clamp(max=counts.numel() - 1).squeeze(0)
    below = cumulative[position] - counts[position]
    return position, k - below


@torch.no_grad()
def radix_select(keys, k: torch.Tensor, rows: RowGroup, high_counts: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The exact k-th smallest (0-based) of the finite floats whose bits `keys` (rows x C int32, or a source
    of row blocks: `key_blocks`) holds, over all ranks; returned as its key (0-dim int32).

    Two passes over the float bits, high 16 then low 16, each one histogram all-reduce. Each
    histogram is read with its negative half reversed instead of transforming every key. Ties
    count like `torch.sort`; -0.0 sorts just before +0.0. `high_counts`: this rank's first-pass
    histogram, its non-finite bins dropped, when the caller already has it. Needs 0 <= k < count;
    otherwise the result is meaningless but no index is out of range.
    """
    if high_counts is None:
        high_counts = sum(
            (high_histogram(block) for _, _, block in key_blocks(keys)),
            torch.zeros(_RADIX, dtype=torch.int64, device=keys.device),
        )
        drop_non_finite(high_counts)
    high, rank_in_bin = high_bin(high_counts, k, rows)
    low_counts = sum(
        (_low_histogram(block, high) for _, _, block in key_blocks(keys)),
        torch.zeros(_LOW_BINS, dtype=torch.int64, device=keys.device),
    )
    return key_in_bin(low_counts, high, rank_in_bin, rows)


def high_bin(high_counts: torch.Tensor, k: torch.Tensor, rows: RowGroup) -> Tuple[torch.Tensor, torch.Tensor]:
    """(signed high 16 bits of the k-th smallest key, its rank among the keys with those bits), from
    this rank's first-pass histogram (one all-reduce)."""
    high_counts = rows.sum(high_counts)
    position, rank_in_bin = _locate(torch.cat([high_counts[:_HALF].flip(0), high_counts[_HALF:]]), k)
    return torch.where(position < _HALF, -1 - position, position - _HALF), rank_in_bin


def key_in_bin(low_counts: torch.Tensor, high: torch.Tensor, rank_in_bin: torch.Tensor, rows: RowGroup) -> torch.Tensor:
    """The key of rank `rank_in_bin` among those with high bits `high`, from this rank's second-pass
    histogram (`_low_histogram`; one all-reduce)."""
    low_counts = rows.sum(low_counts)[_LOW_OFFSET : _LOW_OFFSET + _RADIX]
    negative = high < 0
    low_position, _ = _locate(torch.where(negative, low_counts.flip(0), low_counts), rank_in_bin)
    low = torch.where(negative, _LOW_MASK - low_position, low_position)
    return (high * _RADIX + low).to(torch.int32)


@torch.no_grad()
def lower_median(
    keys,
    count: torch.Tensor,
    high_counts: torch.Tensor,
    row_index: torch.Tensor,
    rows: RowGroup,
    *,
    fused_passes: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(key of the lower median, the (count - 1) // 2-th smallest of all ranks; the lowest global row
    holding it). `keys`: a rows x C int32 tensor or a source of row blocks (`key_blocks`); `count`: the
    global number of finite keys; `high_counts`: this rank's first-pass histogram, its non-finite bins
    dropped. `row_index`: the global index of each of this rank's rows.

    On a GPU: `radix_select`'s second pass and `first_row_with_key`, two more passes over the keys
    with nothing read back. On the CPU, where reading back is free, either the same two passes
    compiled (`_compiled_key_in_bin`, with `fused_passes` and a keys tensor), or one chunked pass that
    collects the keys of the median's high bin, after which the second histogram and the owner search
    run on those alone (`_eager_key_in_bin`); the result is the same.
    """
    k = ((count - 1) // 2).clamp(min=0)
    if not row_passes.reading_back_is_free(keys.device):
        key = radix_select(keys, k, rows, high_counts)
        return key, first_row_with_key(keys, key, row_index, rows)
    high, rank_in_bin = high_bin(high_counts, k, rows)
    if fused_passes and isinstance(keys, torch.Tensor):
        try:
            return _compiled_key_in_bin(keys, high, rank_in_bin, row_index, rows)
        except fused.Unavailable:
            pass
    return _eager_key_in_bin(keys, high, rank_in_bin, row_index, rows)


def _compiled_key_in_bin(
    keys: torch.Tensor, high: torch.Tensor, rank_in_bin: torch.Tensor, row_index: torch.Tensor, rows: RowGroup
) -> Tuple[torch.Tensor, torch.Tensor]:
    """`lower_median`'s (key, row) from its high bin by two compiled passes over all the keys (the bin's low
    histogram, the owner search); raises `fused.Unavailable` before any collective."""
    low_counts = fused.run(low_histogram_pass, keys, high)
    fused.prepare(row_min_xor_pass, keys, keys.new_zeros(()))
    key = key_in_bin(low_counts, high, rank_in_bin, rows)
    return key, first_row_holding(fused.run(row_min_xor_pass, keys, key ^ INT32_MIN), row_index, rows)


def _eager_key_in_bin(
    keys, high: torch.Tensor, rank_in_bin: torch.Tensor, row_index: torch.Tensor, rows: RowGroup
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The same from the keys of the high bin, collected by one chunked pass (a small fraction of the keys)."""
    bin_keys, bin_rows = _keys_with_high_bits(keys, int(high), row_index)
    key = key_in_bin(_low_histogram(bin_keys, high), high, rank_in_bin, rows)
    return key, rows.min(min_or(torch.where(bin_keys == key, bin_rows, NO_ROW), NO_ROW))


def _keys_with_high_bits(keys, high: int, row_index: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(the keys whose signed high 16 bits are `high`, the global row of each), in row order.

    key ^ (high << 16) lies in [0, 2^16) exactly for those keys, and flipping the sign bit as well
    maps that range to the 2^16 smallest int32 values. So per chunk one xor and a min per row find
    the rows that hold such keys, and only those rows, still in cache, are searched for them.
    """
    flip = (high << RADIX_BITS) ^ INT32_MIN
    bound = INT32_MIN + _RADIX
    found_keys, found_rows = [], []
    scratch = ChunkScratch(*keys.shape, keys.device)
    for start, stop, block in key_blocks(keys):
        flipped = torch.bitwise_xor(block, flip, out=scratch.get("xor", torch.int32, stop - start))
        holding = (flipped.amin(dim=1) < bound).nonzero().squeeze(1)
        held = flipped.index_select(0, holding)
        row, col = (held < bound).nonzero(as_tuple=True)
        found_keys.append(held[row, col] ^ flip)
        found_rows.append(row_index[start:stop].index_select(0, holding)[row])
    if not found_keys:  # no rows on this rank
        return torch.empty(0, dtype=torch.int32, device=keys.device), row_index.new_empty(0)
    return torch.cat(found_keys), torch.cat(found_rows)


# --- the owner ----------------------------------------------------------------------------------------


def first_row_with_key(keys, key: torch.Tensor, row_index: torch.Tensor, rows: RowGroup) -> torch.Tensor:
    """Lowest global row holding `key` (one all-reduce)."""
    return first_row_holding(_row_min_xor(keys, key.to(torch.int32) ^ INT32_MIN), row_index, rows)


def first_row_holding(row_min: torch.Tensor, row_index: torch.Tensor, rows: RowGroup) -> torch.Tensor:
    """Lowest global row whose `row_min`, the min over the row of keys ^ key ^ INT32_MIN, is INT32_MIN:
    the lowest row holding `key` (one all-reduce).

    keys ^ key is 0 exactly where the key matches; flipping the sign bit too maps that 0 to the
    smallest int32 (one xor and one min per entry: cheaper than == and .any() on CPUs)."""
    return rows.min(min_or(torch.where(row_min == INT32_MIN, row_index, NO_ROW), NO_ROW))


def _row_min_xor(keys, mask) -> torch.Tensor:
    """Per row, min over the row of keys ^ mask (int32)."""
    row_min = torch.empty(keys.shape[0], dtype=torch.int32, device=keys.device)
    scratch = ChunkScratch(*keys.shape, keys.device)
    for start, stop, block in key_blocks(keys):
        flipped = torch.bitwise_xor(block, mask, out=scratch.get("xor", torch.int32, stop - start))
        row_min[start:stop] = flipped.amin(dim=1)
    return row_min


# --- the compiled passes (fused.py) ---------------------------------------------------------------------


def high_histogram_pass(keys: torch.Tensor) -> torch.Tensor:
    """`high_histogram` of the keys."""
    return _scatter_histogram(_high_bins(keys), _RADIX)


def low_histogram_pass(keys: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """`_low_histogram` of the keys."""
    return _scatter_histogram(_low_bins(keys, high), _LOW_BINS)


def row_min_xor_pass(keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`_row_min_xor` of the keys."""
    return (keys ^ mask).amin(dim=1)
