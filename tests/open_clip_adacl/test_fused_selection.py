"""The compiled (fused) selection passes of fused.py: bit-identical to the eager passes on random and
adversarial cases, on both code paths and every dtype; the mode variable; and the fallback to the eager
passes when nothing can be compiled. (The multi-rank tests run through them in their own modules.)"""

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from helpers import TESTS
from helpers.selection_cases import random_logits, select_anchor
from open_clip_adacl import adacl_math, create_loss, fused, row_passes, selection
from open_clip_adacl.radix_select import key_blocks

FIELDS = ("row", "gap", "num_candidates", "reference", "flat_reference")
# The compiled median on the device path: three passes over the logits, no key matrix.
DEVICE_MEDIAN_PASSES = ("_high_histogram_of_logits", "_low_histogram_of_logits", "_row_min_xor_of_logits")
# On the CPU: the keys and their histogram, then the median's second radix pass and owner search over the keys.
CPU_PASSES = ("_keys_pass", "high_histogram_pass", "low_histogram_pass", "row_min_xor_pass")


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Eager passes over several chunks, the last one partial (as in test_selection.py)."""
    monkeypatch.setitem(row_passes.CHUNK_ELEMENTS, "cpu", 5 * 48)


# `device` compiles passes of its own (about 30 s on 2 cores with an empty compile cache): in the slow tests.
@pytest.fixture(params=["cpu", pytest.param("device", marks=pytest.mark.slow)])
def path(request, monkeypatch):
    """Both code paths on the CPU, as in test_selection.py: `device` never reads a value back."""
    if request.param == "device":
        monkeypatch.setattr(row_passes, "reading_back_is_free", lambda device: False)
    return request.param


def _random_cases():
    """Random batches of several sizes and spreads, one with NaN, infinite and signed-zero logits."""
    cases = [
        random_logits(n=n, d=d, seed=seed, noise=noise)
        for n, d, seed, noise in ((48, 16, 2, 0.8), (37, 8, 11, 0.3), (64, 32, 5, 1.5), (20, 4, 7, 0.05))
    ]
    odd = random_logits(n=40, seed=9)
    odd[3, 7], odd[4, 9], odd[5, 11], odd[6, 2], odd[8, 8] = float("nan"), float("inf"), -float("inf"), -0.0, -0.0
    odd[10, :5] = odd[10, 10]  # ties with the positive: zero gaps
    return cases + [odd]


def _same_bits(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Equal bit patterns (NaN included)."""
    if first.dtype != second.dtype or not first.is_floating_point():
        return torch.equal(first, second)
    as_int = {8: torch.int64, 4: torch.int32, 2: torch.int16}[first.element_size()]
    return torch.equal(first.view(as_int), second.view(as_int))


def _both_selections(monkeypatch, logits, **kwargs):
    monkeypatch.setenv(fused.ENV_VARIABLE, "off")
    eager = select_anchor(logits, torch.arange(logits.shape[0]), **kwargs)
    monkeypatch.setenv(fused.ENV_VARIABLE, "on")
    compiled = select_anchor(logits, torch.arange(logits.shape[0]), **kwargs)
    return eager, compiled


@pytest.mark.parametrize("region", adacl_math.CANDIDATE_REGIONS)
@pytest.mark.parametrize("anchor_stat", adacl_math.ANCHOR_STATS)
def test_fused_selections_are_bit_identical_to_eager(anchor_stat, region, path, monkeypatch):
    for case, logits in enumerate(_random_cases()):
        for salient in adacl_math.SALIENT_KINDS:
            eager, compiled = _both_selections(
                monkeypatch, logits, salient=salient, anchor_stat=anchor_stat, region=region
            )
            for field in FIELDS:
                assert _same_bits(getattr(eager, field), getattr(compiled, field)), (case, salient, field)
    passes = (DEVICE_MEDIAN_PASSES if path == "device" else CPU_PASSES) if anchor_stat == "median" else CPU_PASSES[:2]
    assert {name for name, device, dtype in fused._ready} >= set(passes)
    assert not fused._failed


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])  # float16 takes bfloat16's path
def test_fused_selections_are_bit_identical_in_every_dtype(dtype, path, monkeypatch):
    for case, logits in enumerate(_random_cases()[:2]):
        for anchor_stat in ("median", "max"):
            eager, compiled = _both_selections(monkeypatch, logits.to(dtype), anchor_stat=anchor_stat)
            for field in FIELDS:
                assert _same_bits(getattr(eager, field), getattr(compiled, field)), (case, anchor_stat, field)
    assert (CPU_PASSES[0], "cpu", dtype) in fused._ready


def test_fused_keys_are_the_eager_keys_bit_for_bit(monkeypatch):
    # Including the keys of NaN, infinite and -0.0 logits, which no selection reads.
    logits = _random_cases()[-1]
    positive_col = torch.arange(logits.shape[0])
    positive = logits.gather(1, positive_col[:, None]).squeeze(1)
    for coefficients, lower in (
        ((0.3, -0.2, -1.0), None),
        ((0.3, -0.2, -1.0), 0.5),
        ((0.0, 0.0, 1.0), None),
        ((-1.0, 0.0, -1.0), None),
    ):
        coefficients = tuple(torch.tensor(c, dtype=torch.float64) for c in coefficients)
        lower = None if lower is None else torch.tensor(lower, dtype=torch.float64)
        results = []
        for mode in ("off", "on"):
            monkeypatch.setenv(fused.ENV_VARIABLE, mode)
            keys, count, high_counts = selection.candidate_keys(
                logits, positive, positive_col, coefficients, lower=lower, fused_passes=mode == "on"
            )
            results.append([torch.cat([block.clone() for _, _, block in key_blocks(keys)]), count, high_counts])
        for eager, compiled in zip(*results):
            assert _same_bits(eager, compiled)


# Several ranks through the fused passes: test_selection.py and test_adacl_distributed.py run their
# multi-rank tests with the passes off and on.


# --- when the passes are used ------------------------------------------------------------------------


def _wanted(logits, passes="test", compiled=lambda: None, eager=lambda: None):
    return fused.wanted(logits, passes, compiled, eager)


@pytest.fixture
def fresh_decisions(monkeypatch):
    """`auto` as in a fresh process: no choice made."""
    monkeypatch.setattr(fused, "_decisions", {})
    monkeypatch.delenv(fused.ENV_VARIABLE, raising=False)


def test_the_mode_variable_selects_the_passes(monkeypatch, fresh_decisions):
    large = torch.empty(2048, 2048)
    small = torch.empty(64, 64)

    def never():
        raise AssertionError("a small matrix is never compiled")

    assert fused.mode() == "auto" and _wanted(large, eager=lambda: time.sleep(0.002))  # auto: the faster
    assert not _wanted(small, compiled=never)
    monkeypatch.setenv(fused.ENV_VARIABLE, "on")
    assert _wanted(small) and not _wanted(torch.empty(0, 64))  # a rank without rows
    assert not _wanted(small.long()) and not _wanted(small.to("meta"))  # a dtype no pass takes, a device
    monkeypatch.setenv(fused.ENV_VARIABLE, "OFF")
    assert not _wanted(large)
    monkeypatch.setenv(fused.ENV_VARIABLE, "yes")
    with pytest.raises(ValueError, match="OPEN_CLIP_ADACL_FUSED='yes' is not one of auto, on, off"):
        _wanted(large)


def test_auto_times_both_passes_once_per_shape_keeps_the_faster_and_logs_both(fresh_decisions, caplog):
    calls = {"fused": 0, "eager": 0}

    def path(name, seconds):
        def run():
            calls[name] += 1
            time.sleep(seconds)

        return run

    large = torch.empty(2048, 2048)
    with caplog.at_level("INFO", logger=fused.__name__):
        assert _wanted(large, "a", path("fused", 0.0), path("eager", 0.01))
        assert _wanted(large, "a", path("fused", 0.0), path("eager", 0.01))  # decided: not timed again
        assert not _wanted(large, "b", path("fused", 0.01), path("eager", 0.0))  # other passes: their own choice
        assert not _wanted(torch.empty(64, 64), "a", path("fused", 0.0), path("eager", 0.01))
    per_decision = fused.DECISION_WARMUPS + fused.DECISION_ROUNDS
    assert calls == {"fused": 2 * per_decision, "eager": 3 * per_decision}
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3 and lines[0].startswith("AdaCL: a selection passes for 2048 x 2048 float32 on cpu: fused ")
    assert re.search(
        r"fused \d+\.\d ms, eager \d+\.\d ms; using the fused passes \(OPEN_CLIP_ADACL_FUSED=auto, "
        r"which keeps the fused passes only when they take under 90% of the eager ones' time",
        lines[0],
    )
    assert "using the eager passes" in lines[1] and "fused not compiled (below 2048 squared entries" in lines[2]
    choices = fused.decisions()
    assert [(c["passes"], c["rows"], c["choice"]) for c in choices] == [
        ("a", 2048, "fused"),
        ("b", 2048, "eager"),
        ("a", 64, "eager"),
    ]
    assert choices[0]["fused_ms"] < choices[0]["eager_ms"] and choices[2]["fused_ms"] is None
    assert json.loads(json.dumps(choices)) == choices


def test_auto_keeps_the_eager_passes_unless_the_fused_ones_win_by_the_margin(fresh_decisions, monkeypatch):
    # Made-up timings (fused, eager alternating), so that the rule decides rather than this machine's noise.
    timings = []
    monkeypatch.setattr(fused, "_timed", lambda path, device_type: timings.pop(0))
    timings[:] = [0.095, 0.1] * fused.DECISION_ROUNDS  # fused at 95% of eager: a tie, kept eager
    assert not _wanted(torch.empty(2048, 2048), "a")
    timings[:] = [0.085, 0.1] * fused.DECISION_ROUNDS  # at 85%: fused
    assert _wanted(torch.empty(2048, 2048), "b")
    assert [(d["fused_ms"], d["eager_ms"], d["choice"]) for d in fused.decisions()] == [
        (pytest.approx(95.0), pytest.approx(100.0), "eager"),
        (pytest.approx(85.0), pytest.approx(100.0), "fused"),
    ]
    assert not timings


def test_auto_keeps_the_eager_passes_where_nothing_compiles(fresh_decisions):
    def cannot():
        raise fused.Unavailable("test")

    assert not _wanted(torch.empty(2048, 2048), compiled=cannot)
    assert fused.decisions()[0]["fused_ms"] is None and fused.decisions()[0]["choice"] == "eager"


@pytest.mark.slow
def test_without_a_compiler_the_eager_passes_run_after_one_log_line(tmp_path):
    # A fresh process with no C++ compiler and an empty compile cache: the selection falls back.
    script = textwrap.dedent("""
        import logging, torch
        from open_clip_adacl import selection
        from helpers.selection_cases import random_logits, select_anchor
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
        logits = random_logits()
        first = select_anchor(logits, torch.arange(48), anchor_stat="median")
        second = select_anchor(logits, torch.arange(48), anchor_stat="median")
        print("selected", first.row.item(), first.gap.item(), second.row.item(), second.gap.item())
    """)
    env = {
        **os.environ,
        fused.ENV_VARIABLE: "on",
        "CXX": str(tmp_path / "no-such-compiler"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if "cannot compile the fused selection pass" in line]
    assert len(warnings) == 1 and warnings[0].startswith("WARNING AdaCL: cannot compile"), result.stderr[-3000:]
    assert "using the eager passes" in warnings[0] and "compiled the fused" not in result.stderr
    expected = select_anchor(random_logits(), torch.arange(48), anchor_stat="median")
    row, gap = expected.row.item(), expected.gap.item()
    assert result.stdout.split() == ["selected", str(row), repr(gap), str(row), repr(gap)]


def test_the_compile_time_is_logged_once_per_pass(monkeypatch, caplog):
    monkeypatch.setattr(fused, "_ready", set())  # as in a fresh process (the compiled code itself is reused)
    monkeypatch.setenv(fused.ENV_VARIABLE, "on")
    with caplog.at_level("INFO", logger=fused.__name__):
        for _ in range(2):
            select_anchor(random_logits(), torch.arange(48))
    lines = [record.getMessage() for record in caplog.records if record.name == fused.__name__]
    assert len(lines) == len(CPU_PASSES), lines
    passes = [
        re.fullmatch(r"AdaCL: compiled the fused selection pass (\w+) for cpu torch\.\w+ in [\d.]+ s", line)
        for line in lines
    ]
    assert all(passes) and sorted(match.group(1) for match in passes) == sorted(CPU_PASSES), lines


# --- the two directions side by side ---------------------------------------------------------------------


def _step_values(loss_fn, image, text):
    """A training step's loss, gradients and stats (then its commit)."""
    image, text = image.clone().requires_grad_(), text.clone().requires_grad_()
    scale = torch.tensor(14.3, requires_grad=True)
    loss = loss_fn(image, text, scale)
    loss.backward()
    loss_fn.commit()
    return [loss.detach(), image.grad, text.grad, scale.grad, *loss_fn.stats.values()]


@pytest.mark.parametrize("fused_mode", ["off", pytest.param("on", marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "options",
    [{}, {"anchor_stat": "mean", "candidate_region": "gda", "queue_size": 16}],
    ids=["median", "mean_gda_queue"],
)
def test_both_directions_selected_side_by_side_train_as_one_after_the_other(fused_mode, options, monkeypatch):
    # Two torch threads: the loss selects both directions' anchors at once, one thread each, the compiled
    # passes included (they release the GIL); with one thread, in turn. Every value agrees to the bit.
    monkeypatch.setenv(fused.ENV_VARIABLE, fused_mode)
    calls = []
    side_by_side = row_passes.side_by_side
    monkeypatch.setattr(
        row_passes, "side_by_side", lambda device, run: calls.append(len(run)) or side_by_side(device, run)
    )
    g = torch.Generator().manual_seed(4)
    image = torch.nn.functional.normalize(torch.randn(48, 16, generator=g), dim=-1)
    text = torch.nn.functional.normalize(image + 0.8 * torch.randn(48, 16, generator=g), dim=-1)
    before = torch.get_num_threads()
    steps = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            loss_fn = create_loss("adacl", **options)
            steps[threads] = [_step_values(loss_fn, image, text) for _ in range(3)]  # the queue fills
    finally:
        torch.set_num_threads(before)
    assert calls == [2, 2, 2]  # both directions at once at each step with 2 threads, never with 1
    assert steps[1][-1][-1].numel() == 1 and len(steps[1][0]) > 10
    for one_thread, two_threads in zip(steps[1], steps[2]):
        for first, second in zip(one_thread, two_threads):
            assert _same_bits(first, second)


def test_two_threads_meeting_a_new_shape_time_it_once(fresh_decisions):
    import threading

    calls = {"fused": 0, "eager": 0}
    lock = threading.Lock()

    def path(name):
        def run():
            with lock:
                calls[name] += 1
            time.sleep(0.001)

        return run

    large = torch.empty(2048, 2048)
    start = threading.Barrier(2)

    def meet():
        start.wait()
        return _wanted(large, "a", path("fused"), path("eager"))

    results = []
    threads = [threading.Thread(target=lambda: results.append(meet())) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    per_decision = fused.DECISION_WARMUPS + fused.DECISION_ROUNDS
    assert calls == {"fused": per_decision, "eager": per_decision} and len(set(results)) == 1
    assert len(fused.decisions()) == 1
