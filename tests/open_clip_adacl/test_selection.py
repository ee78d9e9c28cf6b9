"""`selection.py`: the exact global anchor selection, against the dense single-process definitions of
adacl_math.py (in fp64 for low-precision inputs), on NaN, signed zeros and empty candidate sets, and on
3 gloo ranks holding unequal numbers of rows (one of them none)."""

import pytest
import torch
import torch.nn.functional as F

from helpers import adacl_reference as reference
from helpers.distributed_utils import run_on_ranks
from helpers.selection_cases import LOCAL, SCALE, random_logits, select_anchor
from open_clip_adacl import DistributedSetup, adacl_math, create_loss, fused, row_passes, selection
from open_clip_adacl.distributed import RowGroup
from open_clip_adacl.radix_select import first_row_with_key, key_blocks, radix_select


def _dense_anchor(logits, positive_col, salient, anchor_stat, std_floor, region="gda"):
    """docs/method.md §3.1-3.5 with adacl_math.py's dense functions."""
    scores = reference.salient_scores(logits.double(), positive_col, salient)
    most, least = reference.reference_rows(scores)
    negatives = adacl_math.negative_mask(*logits.shape, positive_col)
    mu_c, sigma_c = adacl_math.gaussian_fit(logits[least], negatives[least], std_floor)
    mu_n, sigma_n = adacl_math.gaussian_fit(logits[most], negatives[most], std_floor)
    mask = adacl_math.clone_candidate_mask(logits, positive_col, mu_c, sigma_c, mu_n, sigma_n, region=region)
    gap, row, _ = reference.anchor_statistic(reference.positive_gaps(logits, positive_col), mask, anchor_stat)
    return gap, row, mask.sum()


def _dense(keys):
    """The rows x C keys of `candidate_keys` as one tensor (the eager passes give them a block at a time)."""
    return torch.cat([block.clone() for _, _, block in key_blocks(keys)])


def _candidates(keys):
    return ~torch.isnan(selection.candidate_gaps(_dense(keys), float("nan")))


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of 5 rows of 48 columns: every pass runs over several chunks, the last one partial."""
    monkeypatch.setitem(row_passes.CHUNK_ELEMENTS, "cpu", 5 * 48)


@pytest.fixture(params=["cpu", "device"])
def path(request, monkeypatch):
    """Both code paths on the CPU: `cpu` reads values back to skip work (what the CPU runs); `device`
    runs the same ops whatever the values, as on a GPU."""
    if request.param == "device":
        monkeypatch.setattr(row_passes, "reading_back_is_free", lambda device: False)
    return request.param


# --- per-row summaries and the radix select ---------------------------------------------------------


def test_summarize_rows_matches_dense():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 11, generator=g) * 5
    positive_col = torch.tensor([3, 0, 7, 10, 1, 5])
    summary = selection.summarize_rows(logits, positive_col, with_mean=True)
    negatives = adacl_math.negative_mask(6, 11, positive_col)
    torch.testing.assert_close(summary.positive, logits.gather(1, positive_col[:, None]).squeeze(1))
    torch.testing.assert_close(summary.negative_max, logits.masked_fill(~negatives, float("-inf")).amax(1))
    torch.testing.assert_close(summary.negative_lse, logits.masked_fill(~negatives, float("-inf")).logsumexp(1))
    torch.testing.assert_close(summary.negative_mean, (logits.double() * negatives).sum(1) / 10)


@pytest.mark.parametrize("threads", [2, 3])
def test_summarize_rows_split_between_threads_gives_what_one_thread_gives(threads):
    logits = random_logits(n=300, seed=6)
    positive_col = torch.arange(300)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        on_one = selection.summarize_rows(logits, positive_col, with_mean=True)
        torch.set_num_threads(threads)  # each thread walks a share of the rows
        split = selection.summarize_rows(logits, positive_col, with_mean=True)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)
    for field in ("positive", "negative_max", "negative_mean", "negative_lse"):
        assert torch.equal(getattr(on_one, field), getattr(split, field)), field


def _radix_cases():
    g = torch.Generator().manual_seed(5)
    ties = (torch.randint(-6, 7, (9, 13), generator=g) / 8).float()  # duplicates and negatives
    signed_zeros = torch.tensor([[0.0, -0.0, 1e-30, -1e-30, 3.0, -3.0, 0.0]])
    wide = torch.randn(17, 23, generator=g) * torch.logspace(-20, 20, 23)
    return [
        (ties, torch.rand(9, 13, generator=g) > 0.4),
        (signed_zeros, torch.ones(1, 7, dtype=torch.bool)),
        (wide, torch.rand(17, 23, generator=g) > 0.5),
        (torch.tensor([[2.5]]), torch.tensor([[True]])),
    ]


@pytest.mark.parametrize("values,mask", _radix_cases())
def test_radix_select_equals_sort(values, mask, path):
    keys = selection.masked_keys(values, mask)
    ordered = torch.sort(values[mask]).values
    for k in sorted({0, (len(ordered) - 1) // 2, len(ordered) - 1, len(ordered) // 3}):
        key = radix_select(keys, torch.tensor(k), LOCAL)
        assert key.view(torch.float32).item() == ordered[k].item()
        assert torch.kthvalue(values[mask], k + 1).values.item() == key.view(torch.float32).item()


# --- candidates: NaN, signed zeros, empty sets --------------------------------------------------------


def _nan(sign_bit):
    """A quiet NaN with the sign bit set or clear (CPU and CUDA kernels produce either)."""
    return torch.tensor([-0x400000 if sign_bit else 0x7FC00000], dtype=torch.int32).view(torch.float32)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_candidate_bounds_are_the_open_intervals_exactly(dtype):
    g = torch.Generator().manual_seed(7)
    tiny = torch.finfo(dtype).tiny
    ends = torch.tensor(
        [
            [-0.3, 2.5],
            [0.0, 1.0],
            [-1.0, 0.0],
            [1e-300, 1e300],
            [-float("inf"), -7.25],
            [3.0, float("inf")],
            [2.0, 2.0],
            [5.0, -5.0],
            [-float("inf"), float("inf")],
        ],
        dtype=torch.float64,
    )
    x = torch.cat(
        [
            torch.randn(4000, generator=g, dtype=torch.float64) * 4,
            ends.flatten().clamp(-1e30, 1e30),
            torch.tensor([0.0, -0.0, tiny, -tiny, tiny / 4, 1e-40]),
        ]
    ).to(dtype)
    x = torch.cat(
        [
            x,
            torch.nextafter(x, torch.tensor(float("inf"), dtype=dtype)),
            torch.nextafter(x, torch.tensor(-float("inf"), dtype=dtype)),
        ]
    )
    x = torch.cat([x, ends.to(dtype).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).flatten()])
    for pair in ends.split(2):
        bounds = selection.candidate_bounds(pair, dtype)
        for (a, b), (lo, hi) in zip(pair, bounds):
            expected = (x.double() > a) & (x.double() < b)
            margin = torch.minimum(x - lo, hi - x)
            assert torch.equal(~torch.signbit(margin), expected), (a, b)


@pytest.mark.parametrize(
    "coefficients,lower",
    [
        ((0.3, -0.2, -1.0), None),
        ((0.3, -0.2, -1.0), 0.5),
        ((-0.3, 0.1, 2.0), -1.0),
        ((0.0, 0.0, 1.0), None),
        ((-1.0, 0.0, -1.0), None),
        ((0.0, -2.0, 1.0), None),
        ((0.02, 0.0, -0.5), -30.0),
    ],
)
def test_both_paths_write_the_keys_of_the_dense_candidate_set(coefficients, lower, monkeypatch):
    logits = random_logits(seed=5)
    logits[3, 7], logits[4, 9], logits[5, 11], logits[6, 2] = float("nan"), float("inf"), -float("inf"), -0.0
    positive_col = torch.arange(48)
    positive = logits.gather(1, positive_col[:, None]).squeeze(1)
    coefficients = tuple(torch.tensor(c, dtype=torch.float64) for c in coefficients)
    lower = None if lower is None else torch.tensor(lower, dtype=torch.float64)
    on_cpu = selection.candidate_keys(logits, positive, positive_col, coefficients, lower=lower, fused_passes=False)
    monkeypatch.setattr(row_passes, "reading_back_is_free", lambda device: False)
    as_on_device = selection.candidate_keys(
        logits, positive, positive_col, coefficients, lower=lower, fused_passes=False
    )
    assert torch.equal(_dense(on_cpu[0]), _dense(as_on_device[0]))
    for cpu_result, device_result in zip(on_cpu[1:], as_on_device[1:]):
        assert torch.equal(cpu_result, device_result)
    x = logits.double()
    log_odds = (coefficients[0] * x + coefficients[1]) * x + coefficients[2]
    expected = (log_odds > 0) & adacl_math.negative_mask(48, 48, positive_col)
    expected &= torch.isfinite(positive[:, None] - logits) & ((x > lower) if lower is not None else True)
    assert torch.equal(_candidates(on_cpu[0]), expected)
    assert on_cpu[1] == expected.sum()


def test_nan_and_zero_log_odds_are_never_candidates(path):
    # With coefficients (0, 1, 0) an entry's log-odds is its logit: only the strictly positive,
    # finite-gap negatives are candidates, exactly as the dense `log_odds > 0`.
    nan_pos, nan_neg, inf = _nan(False), _nan(True), float("inf")
    logits = torch.tensor(
        [[5.0, 0.0, -0.0, nan_pos, nan_neg, 1.0, -1.0, 1e-40], [nan_pos, 5.0, 2.0, -0.0, inf, 0.0, nan_neg, 3.0]]
    )
    positive_col = torch.tensor([0, 1])
    positive = logits.gather(1, positive_col[:, None]).squeeze(1)
    coefficients = tuple(torch.tensor(c, dtype=torch.float64) for c in (0.0, 1.0, 0.0))
    keys, count, _ = selection.candidate_keys(logits, positive, positive_col, coefficients, fused_passes=False)
    gaps = positive[:, None] - logits
    expected = (logits > 0) & adacl_math.negative_mask(*logits.shape, positive_col) & torch.isfinite(gaps)
    assert torch.equal(_candidates(keys), expected)
    assert count == expected.sum() == 4  # 1.0, 1e-40 (a subnormal), 2.0, 3.0


def test_signed_zero_gaps_pick_the_owner_the_dense_reference_picks(path):
    # Row 0's gap is +0.0, row 1's -0.0 (a -0.0 positive minus +0.0): equal gaps, so the lowest row owns them.
    logits = torch.tensor([[0.0, 0.0, -4.0], [0.0, -0.0, -5.0], [-6.0, -7.0, 9.0]])
    positive_col = torch.tensor([0, 1, 2])
    positive = logits.gather(1, positive_col[:, None]).squeeze(1)
    coefficients = tuple(torch.tensor(c, dtype=torch.float64) for c in (0.0, 0.0, 1.0))  # all negatives
    keys, count, high_counts = selection.candidate_keys(
        logits, positive, positive_col, coefficients, fused_passes=False
    )
    gaps = reference.positive_gaps(logits, positive_col)
    for anchor_stat, k in (("min", torch.tensor(0)), ("median", (count - 1) // 2)):
        key = radix_select(keys, k, LOCAL, high_counts)
        row = first_row_with_key(keys, key, positive_col, LOCAL)
        dense_gap, dense_row, _ = reference.anchor_statistic(
            gaps, adacl_math.negative_mask(3, 3, positive_col), anchor_stat
        )
        assert (row.item(), key.view(torch.float32).item()) == (dense_row.item(), dense_gap.item()), anchor_stat
    assert not torch.signbit(selection.candidate_gaps(_dense(keys), 1.0)[1, 0])  # stored as +0.0


@pytest.mark.parametrize("anchor_stat", adacl_math.ANCHOR_STATS)
def test_an_empty_candidate_set_has_no_owner_and_a_nan_gap(anchor_stat, path):
    logits = random_logits()
    chosen = select_anchor(logits, torch.arange(48), anchor_stat=anchor_stat, prior_ratio=1e30)  # posterior < 1/2
    assert chosen.num_candidates == 0 and chosen.row == -1 and torch.isnan(chosen.gap)


# --- the whole selection against the dense pipeline ---------------------------------------------------


@pytest.mark.parametrize("salient", adacl_math.SALIENT_KINDS)
@pytest.mark.parametrize("anchor_stat", adacl_math.ANCHOR_STATS)
def test_select_anchor_matches_dense_pipeline(salient, anchor_stat, path):
    logits = random_logits()
    positive_col = torch.arange(48)
    chosen = select_anchor(logits, positive_col, salient=salient, anchor_stat=anchor_stat)
    gap, row, count = _dense_anchor(logits, positive_col, salient, anchor_stat, 1e-3)
    assert 0 < count < 48 * 47
    assert chosen.num_candidates.item() == count.item()
    assert chosen.row.item() == row.item()
    assert chosen.gap.item() == gap.item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("anchor_stat", adacl_math.ANCHOR_STATS)
def test_low_precision_logits_select_what_fp64_selects(dtype, anchor_stat, path):
    logits = random_logits(seed=3).to(dtype)
    positive_col = torch.arange(48)
    chosen = select_anchor(logits, positive_col, anchor_stat=anchor_stat)
    gap, row, count = _dense_anchor(logits.double(), positive_col, "max", anchor_stat, 1e-3)
    assert 0 < count < 48 * 47
    assert (chosen.num_candidates.item(), chosen.row.item()) == (count.item(), row.item())
    assert chosen.gap.item() == gap.item()  # a difference of two bf16/fp16 values is exact in float32


# --- ranks holding unequal numbers of rows ------------------------------------------------------------

ROW_SPLIT = (7, 0, 5)  # rank 1 holds no row


def _rank_selects(rank, world_size, logits):
    start = sum(ROW_SPLIT[:rank])
    rows = slice(start, start + ROW_SPLIT[rank])
    positive_col = torch.arange(logits.shape[0])[rows]
    results = {
        (salient, stat): select_anchor(logits[rows], positive_col, RowGroup(split_across_ranks=True), salient, stat)
        for salient in adacl_math.SALIENT_KINDS
        for stat in adacl_math.ANCHOR_STATS
    }
    loss_fn = create_loss(
        "adacl", dist=DistributedSetup(rank=rank, world_size=world_size, local_loss=True, gather_with_grad=True)
    )
    features = F.normalize(torch.randn(ROW_SPLIT[rank], 8), dim=-1)
    try:
        loss_fn(features, features, torch.tensor(SCALE))
    except ValueError as error:
        results["loss"] = str(error)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("fused_passes", ["off", "on"])
def test_three_ranks_with_unequal_rows_select_exactly_and_the_loss_refuses_them(fused_passes, monkeypatch):
    # Through the fused passes too (docs/adacl.md §6.1): rank 1 holds no row and runs the eager passes.
    monkeypatch.setenv(fused.ENV_VARIABLE, fused_passes)  # the spawned ranks inherit it
    logits = random_logits(n=sum(ROW_SPLIT), seed=4)
    per_rank = run_on_ranks(_rank_selects, len(ROW_SPLIT), logits)
    for salient in adacl_math.SALIENT_KINDS:
        for stat in adacl_math.ANCHOR_STATS:
            expected = select_anchor(logits, torch.arange(logits.shape[0]), salient=salient, anchor_stat=stat)
            assert expected.num_candidates > 0
            for result in per_rank:
                chosen = result[salient, stat]
                for field in ("row", "gap", "num_candidates", "reference", "flat_reference"):
                    assert torch.equal(getattr(chosen, field), getattr(expected, field)), (salient, stat, field)
    for result in per_rank:
        assert "different local batch sizes (between 0 and 7 rows)" in result["loss"]


@pytest.mark.parametrize("region", adacl_math.CANDIDATE_REGIONS)
def test_select_anchor_matches_dense_pipeline_in_every_candidate_region(region, path):
    logits = random_logits(seed=3)
    positive_col = torch.arange(48)
    chosen = select_anchor(logits, positive_col, region=region)
    gap, row, count = _dense_anchor(logits, positive_col, "max", "median", 1e-3, region)
    assert chosen.num_candidates.item() == count.item()
    assert (chosen.row.item(), chosen.gap.item()) == (row.item(), gap.item())
    if region == "all":
        assert count.item() == 48 * 47
