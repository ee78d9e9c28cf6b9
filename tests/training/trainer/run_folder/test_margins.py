"""margins.png: an AdaCL run draws it at each epoch end, fallback steps are gaps in the margin traces (as many as
the loss counted), and the fallback share per window adds up to the loss's counters."""

import logging
import math
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from training import RunDir
from training.main import main
from training.trainer.run_folder.checkpoint_files import load_checkpoint
from training.trainer.run_folder.margins import (
    DIRECTIONS,
    MARGIN_PANELS,
    fallback_windows,
    margin_traces,
    window_size,
    write_margins_plot,
)


def adacl_run(demo_shards, logs, name, *extra):
    """The demo's recipe (families of 8 kept whole in a batch, AdaCL) on the test shards, 2 epochs of 16 steps."""
    return main(
        [
            "--train-data",
            str(demo_shards / "train" / "shard-{000000..000003}.tar"),
            "--model",
            "adacl-tiny",
            "--loss",
            "adacl",
            "--batch-size",
            "32",
            "--epochs",
            "2",
            "--lr",
            "2e-3",
            "--warmup",
            "4",
            "--workers",
            "0",
            "--device",
            "cpu",
            "--precision",
            "fp32",
            "--seed",
            "0",
            "--train-group-size",
            "8",
            "--logs",
            str(logs),
            "--name",
            name,
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def every_step_logged(demo_shards, module_tmp):
    return adacl_run(
        demo_shards, module_tmp("margins"), "every-step", "--log-every-n-steps", "1", "--report-to", "tensorboard"
    )


def counted_fallbacks(summary):
    """The loss's own cumulative fallback counters, per direction, from the final checkpoint."""
    counts = load_checkpoint(summary.checkpoint)["loss"]["fallback_counts"]
    return {direction: int(counts[index].sum()) for index, direction in enumerate(DIRECTIONS)}


@pytest.mark.slow
def test_the_run_writes_margins_png_and_fallbacks_are_gaps_as_many_as_the_loss_counted(every_step_logged):
    run = Path(every_step_logged.run_dir)
    assert (run / "margins.png").read_bytes().startswith(b"\x89PNG")
    traces = margin_traces(RunDir(run).metrics())
    assert traces.steps == list(range(1, 33))
    counted = counted_fallbacks(every_step_logged)
    assert sum(counted.values()) > 0  # the recipe does fall back (at the first steps, before the anchor fits)
    for direction in DIRECTIONS:
        for name in MARGIN_PANELS:  # every step is logged: a gap per fallback, in every margin panel
            assert sum(map(math.isnan, traces.values[f"{direction}/{name}"])) == counted[direction], (direction, name)
        assert traces.fallbacks[direction] == counted[direction]
        assert sum(traces.fallback_share[direction]) == counted[direction]  # windows of one step
        # the candidate counts are real numbers at every step, fallbacks included
        assert not any(map(math.isnan, traces.values[f"{direction}/candidates"]))


@pytest.mark.slow
def test_a_fallback_step_has_no_margin_in_metrics_or_tensorboard(every_step_logged):
    """At a fallback step vanilla's (t, 0) is applied but no margin was chosen: no point, rather than 1 and 0."""
    run = Path(every_step_logged.run_dir)
    records = RunDir(run).metrics("train")
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    counted = counted_fallbacks(every_step_logged)
    for direction in DIRECTIONS:
        modulated = [r["step"] - 1 for r in records if r[f"stats/{direction}/modulated"] == 1]  # tensorboard's step
        fell_back = [r for r in records if r[f"stats/{direction}/modulated"] == 0]
        assert len(fell_back) == counted[direction] > 0
        assert not any(f"stats/{direction}/{name}" in r for r in fell_back for name in MARGIN_PANELS)
        assert all(f"stats/{direction}/candidates" in r for r in records)  # a count is a value at every step
        for name in ("m2", "m1_over_scale"):
            assert [event.step for event in events.Scalars(f"loss_stats/{direction}/{name}")] == modulated


def test_sampled_logging_draws_the_fallback_share_from_the_counters(every_step_logged):
    # What --log-every-n-steps 5 writes: the same run's records at steps 5, 10, 15 and each epoch's last, 16.
    records = RunDir(Path(every_step_logged.run_dir)).metrics()
    sampled = [r for r in records if r["kind"] == "train" and (r["step"] % 5 == 0 or r["step"] % 16 == 0)]
    traces = margin_traces(sampled)
    windows = [step - previous for previous, step in zip([0, *traces.steps], traces.steps)]
    counted = counted_fallbacks(every_step_logged)
    for direction in DIRECTIONS:
        shares = traces.fallback_share[direction]
        assert sum(share * window for share, window in zip(shares, windows)) == pytest.approx(counted[direction])
        gaps = sum(map(math.isnan, traces.values[f"{direction}/m2"]))
        assert gaps <= counted[direction]  # only the logged steps' own fallbacks are gaps


def test_the_fallback_share_is_drawn_over_windows_of_the_usual_logging_gap():
    # --log-every-n-steps 5 in epochs of 16 steps: records at 5, 10, 15, 16 (an epoch's end), 20, ..., 32.
    steps = [5, 10, 15, 16, 20, 25, 30, 32]
    counts = [5, 5, 5, 6, 6, 6, 6, 7]  # the first 5 steps fell back, then step 16 and step 32 only
    assert window_size(steps) == 5
    edges, shares = fallback_windows(steps, counts, 5)
    # The one-step window at 16 joins the next, the two-step tail the last: no share of 0 or 1 from one step.
    assert edges == [0, 5, 10, 15, 20, 25, 32]
    assert shares == [1.0, 0.0, 0.0, pytest.approx(0.2), 0.0, pytest.approx(1 / 7)]
    assert sum(share * (end - start) for share, start, end in zip(shares, edges, edges[1:])) == counts[-1]
    assert fallback_windows(list(range(1, 5)), [1, 1, 2, 2], window_size(list(range(1, 5)))) == (
        [0, 1, 2, 3, 4],
        [1.0, 0.0, 1.0, 0.0],
    )  # every step logged: windows of one step, as logged


def test_the_console_line_keeps_adacls_stats_short(every_step_logged):
    lines = [
        line
        for line in (Path(every_step_logged.run_dir) / "out.log").read_text().splitlines()
        if "INFO | Step " in line
    ]
    stats = [line.rsplit(" | ", 1)[-1] for line in lines]  # the line after OpenCLIP's: the progress, then the stats
    assert all(text.startswith("i2t/t2i m2: ") and " fallbacks: " in text and len(text) < 120 for text in stats)
    assert any("m2: -/" in line or "/-" in line for line in lines)  # a fallback step's margin: no value


def test_without_matplotlib_the_plot_is_one_log_line(every_step_logged, tmp_path, monkeypatch, caplog):
    (tmp_path / "metrics.jsonl").write_bytes((Path(every_step_logged.run_dir) / "metrics.jsonl").read_bytes())
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with caplog.at_level(logging.INFO):
        assert write_margins_plot(tmp_path) is None
    assert [record.getMessage() for record in caplog.records] == [
        "margins.png not drawn: matplotlib is missing (pip install 'open_clip_adacl[eval]')"
    ]
    assert not (tmp_path / "margins.png").exists()
