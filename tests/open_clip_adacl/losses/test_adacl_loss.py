"""The `adacl` loss: against dense references built from adacl_math.py, against ClipLoss, on degenerate
batches, and through its state; plus the two AdaCL scripts. (Its selection: tests/open_clip_adacl/test_selection.py.)"""

import io

import open_clip
import pytest
import torch
import torch.nn.functional as F

from helpers import adacl_reference as reference
from helpers.bench_scripts import bench_script
from open_clip_adacl import adacl_math, create_loss
from open_clip_adacl.losses.adacl import FALLBACK_REASONS

SCALE = 14.3


def _features(n=32, d=16, seed=0, noise=0.8, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = F.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1)
    y = F.normalize(x + noise * torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1)
    return x.to(dtype), y.to(dtype)


def _value_and_grads(loss_fn, x, y, scale=SCALE, bias=None):
    x, y = x.clone().requires_grad_(), y.clone().requires_grad_()
    scale = torch.tensor(scale, dtype=x.dtype, requires_grad=True)
    args = (x, y, scale) if bias is None else (x, y, scale, torch.tensor(bias, dtype=x.dtype))
    value = loss_fn(*args)
    value.backward()
    return value.detach(), x.grad, y.grad, scale.grad


def _training_step(loss_fn, x, y, scale=SCALE, bias=None):
    """`_value_and_grads`, then the commit of the loss's state update the trainer makes after the step."""
    result = _value_and_grads(loss_fn, x, y, scale, bias)
    loss_fn.commit()
    return result


# --- the loss ------------------------------------------------------------------------------------------


def test_modulation_off_is_clip_bit_for_bit():
    x, y = _features(seed=1)
    for bias in (None, -2.0):
        ours = _value_and_grads(create_loss("adacl", modulate=False), x, y, bias=bias)
        ref = _value_and_grads(open_clip.ClipLoss(), x, y, bias=bias)
        for a, b in zip(ours, ref):
            assert torch.equal(a, b)


def test_one_matmul_gives_both_directions_logits_unless_modulation_is_off():
    x, y = _features()
    scale = torch.tensor(SCALE)
    shared = create_loss("adacl").build_batch(x, y, scale)
    assert shared.logits_per_text.data_ptr() == shared.logits_per_image.data_ptr()  # the transpose, not a product
    assert torch.equal(shared.logits_per_text, shared.logits_per_image.T)
    separate = create_loss("adacl", modulate=False).build_batch(x, y, scale)  # ClipLoss's own second matmul
    assert separate.logits_per_text.data_ptr() != separate.logits_per_image.data_ptr()
    assert torch.equal(separate.logits_per_text, scale * y @ x.T)


# "on" compiles the fused passes (about 50 s on 2 cores with an empty compile cache): in the slow tests.
@pytest.mark.parametrize("fused_passes", ["off", pytest.param("on", marks=pytest.mark.slow)])
def test_no_key_matrix_outlives_the_selection(fused_passes, monkeypatch):
    # The backward pass, where the loss's peak memory lies, must not hold the selection's rows x N int32 keys.
    import gc

    monkeypatch.setenv("OPEN_CLIP_ADACL_FUSED", fused_passes)
    n = 64
    x, y = _features(n=n)
    loss_fn = create_loss("adacl", candidate_region="gda")
    value = loss_fn(x.clone().requires_grad_(), y.clone().requires_grad_(), torch.tensor(SCALE))
    assert loss_fn.stats["i2t/candidates"] > 0 and loss_fn.stats["t2i/candidates"] > 0  # keys were written
    gc.collect()
    key_matrices = [
        obj
        for obj in gc.get_objects()
        if type(obj) is torch.Tensor and obj.dtype == torch.int32 and obj.numel() >= n * n
    ]  # no compiler fakes
    assert key_matrices == []
    value.backward()


def _dense_modulated_loss(x, y, scale, stats, bias=0.0, positive_grad="scaled"):
    """CE over materialised logits whose diagonal is m1 (s_ii - m2), m1 and m2 from the loss's stats."""
    total = 0
    for direction, (q, c) in (("i2t", (x, y)), ("t2i", (y, x))):
        logits = scale * q @ c.T + bias
        s = (q * c).sum(-1)
        m1 = stats[f"{direction}/m1"].float()
        m2 = stats[f"{direction}/m2"].float()
        positive = adacl_math.modulated_positive(s, scale, m1, m2, positive_grad) + bias
        logits = torch.where(torch.eye(len(s), dtype=torch.bool), positive[:, None].expand_as(logits), logits)
        total = total + F.cross_entropy(logits, torch.arange(len(s)))
    return total / 2


@pytest.mark.parametrize("mode", ["literal", "calibrated"])
@pytest.mark.parametrize("bias", [0.0, -1.5])
@pytest.mark.parametrize("positive_grad", adacl_math.POSITIVE_GRADS)
def test_loss_and_gradients_match_dense_modulated_cross_entropy(mode, bias, positive_grad):
    x, y = _features(seed=3)
    # The `gda` region: on these features its anchor gives valid literal closed forms in both directions.
    loss_fn = create_loss("adacl", mode=mode, positive_grad=positive_grad, candidate_region="gda")
    value, gx, gy, gs = _value_and_grads(loss_fn, x, y, bias=bias)
    assert loss_fn.stats["i2t/modulated"] == 1 and loss_fn.stats["t2i/modulated"] == 1
    xr, yr = x.clone().requires_grad_(), y.clone().requires_grad_()
    scale = torch.tensor(SCALE, requires_grad=True)
    reference = _dense_modulated_loss(xr, yr, scale, loss_fn.stats, bias, positive_grad)
    reference.backward()
    torch.testing.assert_close(value, reference.detach(), rtol=1e-5, atol=1e-5)
    for ours, ref in ((gx, xr.grad), (gy, yr.grad), (gs, scale.grad)):
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)


def test_without_clone_candidates_the_loss_is_vanilla_and_the_fallback_is_counted():
    x, y = _features(seed=4)
    loss_fn = create_loss("adacl", prior_ratio=1e30)  # the posterior never reaches 1/2
    ours = _training_step(loss_fn, x, y)
    ref = _value_and_grads(open_clip.ClipLoss(), x, y)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    reason = FALLBACK_REASONS.index("no_candidates")
    assert loss_fn.fallback_counts[:, reason].tolist() == [1, 1]
    assert loss_fn.stats["i2t/modulated"] == 0 and loss_fn.stats["i2t/fallback_no_candidates"] == 1
    # vanilla's (t, 0) was applied, but no margin was chosen: the stats have no value (NaN), not 1 and 0
    assert loss_fn.stats["i2t/m1_over_scale"].isnan() and loss_fn.stats["i2t/m2"].isnan()
    assert loss_fn.stats["i2t/candidates"] == 0


def _degenerate_batches():
    x, y = _features(16, 8, seed=6)
    same = F.normalize(torch.ones(16, 8), dim=-1)
    antipodal = torch.cat([same[:8], -same[8:]])
    return {
        "all_equal": (same, same.clone(), SCALE),
        "one": (x[:1], y[:1], SCALE),
        "two": (x[:2], y[:2], SCALE),
        "cosines_plus_minus_one": (antipodal, antipodal.clone(), SCALE),
        "huge_scale": (x, y, 1e4),
        "tiny_scale": (x, y, 1e-4),
    }


@pytest.mark.parametrize("name", list(_degenerate_batches()))
@pytest.mark.parametrize("mode", ["literal", "calibrated"])
@pytest.mark.parametrize("anchor_stat", ["median", "mean"])
def test_degenerate_batches_stay_finite(name, mode, anchor_stat):
    x, y, scale = _degenerate_batches()[name]
    loss_fn = create_loss("adacl", mode=mode, anchor_stat=anchor_stat, anchor_prob="progressive")
    for _ in range(2):  # the second step also exercises the progressive / moving-average state
        value, gx, gy, gs = _training_step(loss_fn, x, y, scale=scale)
        assert torch.isfinite(value) and torch.isfinite(gx).all() and torch.isfinite(gy).all() and torch.isfinite(gs)
        for name, v in loss_fn.stats.items():  # NaN only for what has no value at a fallback step
            direction, _, stat = name.rpartition("/")
            fell_back = direction and loss_fn.stats[f"{direction}/modulated"] == 0
            assert torch.isfinite(v) or (
                fell_back and stat not in ("modulated", "candidates", "fallbacks") and not stat.startswith("fallback_")
            ), name
    if name in ("all_equal", "one", "two"):
        assert loss_fn.modulated_steps.sum() == 0 and loss_fn.fallback_counts.sum() == 4


def test_calibrated_margins_stay_in_their_bounds():
    """m1 in [t, max_scale_ratio t], m2 >= 0: the positive logit m1 (s - m2) is then at or below
    vanilla's t s below the anchor and above it beyond (docs/adacl.md)."""
    ratio = create_loss("adacl").options.max_scale_ratio
    checked = 0
    for seed in range(6):
        for scale in (5.0, SCALE, 60.0, 100.0):
            x, y = _features(seed=seed, noise=0.3 + 0.3 * seed)
            loss_fn = create_loss("adacl", anchor_prob="progressive" if seed % 2 else "vanilla", ema=0.5)
            for _ in range(2):
                _training_step(loss_fn, x, y, scale=scale)
                for direction in ("i2t", "t2i"):
                    if loss_fn.stats[f"{direction}/modulated"] == 0:
                        continue  # no margins chosen (NaN): the bounds hold vacuously
                    assert loss_fn.stats[f"{direction}/m1"] >= scale * (1 - 1e-6)
                    assert loss_fn.stats[f"{direction}/m1_over_scale"] <= ratio + 1e-9
                    assert loss_fn.stats[f"{direction}/m2"] >= 0
                    checked += 1
    assert checked >= 24  # most of the 48 directions are modulated


def test_state_moves_only_on_training_steps():
    x, y = _features(seed=7)
    loss_fn = create_loss("adacl", queue_size=8)
    with torch.no_grad():
        loss_fn(x, y, torch.tensor(SCALE))
    loss_fn.eval()
    _training_step(loss_fn, x, y)
    assert all(not value.any() for value in loss_fn.state_dict().values())
    loss_fn.train()
    _training_step(loss_fn, x, y)
    assert loss_fn.modulated_steps.tolist() == [1, 1] and loss_fn.queue_filled == 8


def test_moving_average_and_progressive_probability_use_the_previous_step():
    first, second = _features(seed=8), _features(seed=9)
    loss_fn = create_loss("adacl", ema=0.75, anchor_prob="progressive", max_scale_ratio=2.0, max_offset=1.0)
    _training_step(loss_fn, *first)
    ratio_1, m2_1 = loss_fn.stats["i2t/m1_over_scale"], loss_fn.stats["i2t/m2"]
    previous = loss_fn.previous_margins[0].clone()
    fresh = create_loss("adacl", ema=0.0, anchor_prob="progressive", max_scale_ratio=2.0, max_offset=1.0)
    fresh.previous_margins.copy_(loss_fn.previous_margins)
    fresh.previous_valid.copy_(loss_fn.previous_valid)
    _training_step(fresh, *second)  # this batch's own (bounded) margins, p_u from the previous margins
    _training_step(loss_fn, *second)
    torch.testing.assert_close(
        loss_fn.stats["i2t/m1_over_scale"], 0.75 * ratio_1 + 0.25 * fresh.stats["i2t/m1_over_scale"]
    )
    torch.testing.assert_close(loss_fn.stats["i2t/m2"], 0.75 * m2_1 + 0.25 * fresh.stats["i2t/m2"])
    p_u = reference.anchor_probability(fresh.stats["i2t/anchor_used"], fresh.stats["i2t/log_z_u"], SCALE, *previous)
    torch.testing.assert_close(fresh.stats["i2t/p_u"], p_u)


def test_queue_adds_negatives_and_round_trips_through_state_dict():
    batches = [_features(8, 16, seed=10 + i) for i in range(4)]
    options = dict(queue_size=12)
    uninterrupted = create_loss("adacl", **options)
    values = [_training_step(uninterrupted, *batch)[0] for batch in batches]
    assert not torch.equal(values[1], _training_step(create_loss("adacl"), *batches[1])[0])  # queue columns count
    first = create_loss("adacl", **options)
    for batch in batches[:2]:
        _training_step(first, *batch)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = create_loss("adacl", **options)
    resumed.load_state_dict(torch.load(buffer))
    assert resumed.queue_image.shape == (12, 16)
    for batch, expected in zip(batches[2:], values[2:]):
        assert torch.equal(_training_step(resumed, *batch)[0], expected)
    for key, value in uninterrupted.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key
    with pytest.raises(ValueError, match="queue"):
        create_loss("adacl", queue_size=4).load_state_dict(uninterrupted.state_dict())
    resumed.reset_state()
    assert all(not value.any() for value in resumed.state_dict().values())


def test_stats_are_0_dim_tensors_per_direction():
    x, y = _features(seed=11)
    loss_fn = create_loss("adacl")
    _value_and_grads(loss_fn, x, y)
    names = {"m1", "m2", "anchor", "p_u", "candidates", "modulated", "m1_over_scale", "fallbacks"}
    names |= {f"fallback_{reason}" for reason in FALLBACK_REASONS}
    for direction in ("i2t", "t2i"):
        assert {f"{direction}/{name}" for name in names} <= set(loss_fn.stats)
    assert all(torch.is_tensor(v) and v.dim() == 0 for v in loss_fn.stats.values())


def test_invalid_options_are_clear_errors():
    with pytest.raises(ValueError, match="rho"):
        create_loss("adacl", rho=1.5)
    with pytest.raises(ValueError, match="mode"):
        create_loss("adacl", mode="paper")
    with pytest.raises(ValueError, match="anchor_max"):
        create_loss("adacl", anchor_max=1.0)


# --- scripts -------------------------------------------------------------------------------------------


def test_bench_loss_measures_every_case(monkeypatch):
    monkeypatch.setenv("OPEN_CLIP_ADACL_FUSED", "auto")  # the benchmark sets it per case
    bench = bench_script("bench_loss")
    for rounds in bench.time_cases(64, 16, "cpu", 2, "trained-50", ("auto", "eager")):  # wall clock, CPU time
        assert list(rounds) == [
            "clip",
            "adacl-literal/auto",
            "adacl-literal/eager",
            "adacl-calibrated/auto",
            "adacl-calibrated/eager",
        ]
        assert all(len(times) == 2 and min(times) > 0 for times in rounds.values())
    assert bench.peak_memory_worker("adacl-calibrated/eager", 256, 16, "cpu", "random") >= 0
    row = {
        "inputs": "random",
        "N": 64,
        "loss": "adacl-literal",
        "path": "auto",
        "seconds": 0.01,
        "cpu_seconds": 0.02,
        "cpu_ratio": 1.0,
        "time_ratio": 1.0,
        "auto_over_best": 1.25,
        "auto_over_best_cpu": 0.5,
    }
    assert (
        "| random | 64 | adacl-literal | auto | 10.0 | 1.000 | 20.0 | 1.000 | 1.250 | 0.500 |"
        in bench.markdown_table([row])
    )
    memory = {
        "inputs": "random",
        "N": 64,
        "loss": "adacl-literal",
        "path": "eager",
        "peak_bytes": 2**21,
        "memory_ratio": 1.05,
    }
    assert bench.memory_table([{**memory, "ranks": 1, "rank_peak_bytes": [2**21]}]).endswith(
        "| random | 64 | 1 | adacl-literal | eager | 2.0 | - | 1.050 | +5.0% |"
    )
    assert bench.memory_table([{**memory, "ranks": 2, "rank_peak_bytes": [2**20, 2**21]}]).endswith(
        "| 2.0 | 1 / 2 | 1.050 | +5.0% |"
    )
    seconds = {
        bench.case_name("calibrated", path): value for path, value in (("auto", 1.1), ("fused", 1.0), ("eager", 2.0))
    }
    assert bench.auto_over_best(seconds, "calibrated") == pytest.approx(1.1)
    assert bench.auto_over_best(seconds, "literal") is None
    assert bench.best_path(seconds, "calibrated") == "fused" and bench.best_path(seconds, "literal") is None
    paired = {**row, "paired_ratio": (1.1, 1.0, 1.2), "paired_auto_over_best": (1.01, 0.98, 1.04), "best_path": "fused"}
    assert (
        "| 1.000 | 1.100 [1.000, 1.200] | 20.0 | 1.000 | 1.250 | 1.010 [0.980, 1.040] vs fused | 0.500 |"
        in bench.markdown_table([paired])
    )
    assert "| 1.100 [1.000, 1.200] | 20.0 | 1.000 | 0.900 [0.800, 1.000] | 1.250 |" in bench.markdown_table(
        [{**paired, "paired_cpu_ratio": (0.9, 0.8, 1.0)}]
    )
    assert [bench.rotated(["a", "b", "c"], index) for index in (0, 1, 5)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
    ]
    machine = bench.describe_machine("cpu", 2)
    assert machine.startswith("CPU ") and " cores, 2 torch thread(s)" in machine


def test_bench_loss_trained_like_inputs_have_the_cosines_it_names():
    image, text = bench_script("bench_loss").make_features(512, 512, "cpu", "trained-50")
    cosines = image @ text.T
    cluster = torch.arange(512) // 8
    same_cluster = cluster[:, None] == cluster[None, :]
    siblings = same_cluster & ~torch.eye(512, dtype=torch.bool)
    assert cosines.diag().mean() == pytest.approx(0.35, abs=0.02)
    assert cosines[siblings].mean() == pytest.approx(0.31, abs=0.02)
    assert cosines[~same_cluster].mean() == pytest.approx(0.14, abs=0.02)


def test_positive_gradient_defaults_follow_the_mode():
    assert create_loss("adacl", mode="literal").positive_grad == "fixed"  # Algorithm 1 as written
    assert create_loss("adacl", mode="calibrated").positive_grad == "balanced"
    assert create_loss("adacl", mode="literal", positive_grad="scaled").positive_grad == "scaled"


def test_committing_nonfinite_features_into_the_queue_is_refused_and_writes_nothing():
    x, y = _features(seed=12)
    loss_fn = create_loss("adacl", queue_size=8)
    poisoned = x.clone()
    poisoned[0] = float("nan")
    _value_and_grads(loss_fn, poisoned, y)
    with pytest.raises(ValueError, match="not finite and cannot enter the feature queue"):
        loss_fn.commit()
    assert all(not value.any() for value in loss_fn.state_dict().values())
    value = _training_step(loss_fn, x, y)[0]
    assert torch.isfinite(value) and loss_fn.queue_filled == 8 and torch.isfinite(loss_fn.queue_image).all()


def test_each_direction_alone_gives_its_half_of_the_symmetric_loss():
    # `direction_loss` (the contract of every contrastive loss) makes its direction's selection alone;
    # `symmetric_loss` makes both at once.
    x, y = _features()
    loss_fn = create_loss("adacl")
    batch = loss_fn.build_batch(x, y, torch.tensor(SCALE))
    both = loss_fn.symmetric_loss(batch)
    stats = dict(loss_fn.stats)
    alone = (loss_fn.direction_loss(batch, "i2t") + loss_fn.direction_loss(batch, "t2i")) / 2
    assert torch.equal(alone, both) and loss_fn.stats.keys() == stats.keys()
    assert all(
        torch.equal(value, stats[name]) or value.isnan() & stats[name].isnan() for name, value in loss_fn.stats.items()
    )
