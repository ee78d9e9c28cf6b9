"""Verdicts (collapsed, failed, nonfinite), means over the ok runs only, and paired differences over seeds."""
import math

import pytest

from loss_comparison.report import write_report
from loss_comparison.stats import CollapseCriteria, assess_run, paired_difference, summarize
from comparison_records import assessed_records, record, report_context


def test_healthy_runs_are_ok():
    assert assess_run(record())["verdict"] == "ok"
    # A non-softmax loss (siglip) has no ln(batch) chance level: its loss value is not a collapse signal.
    assert assess_run(record("siglip", loss=10.0, softmax=False))["verdict"] == "ok"


def test_a_loss_pinned_at_log_batch_is_collapsed():
    verdict = assess_run(record(loss=math.log(64) * 0.97, i2t=0.2, t2i=0.2))
    assert verdict["verdict"] == "collapsed" and "ln(64)" in verdict["reasons"][0]
    assert assess_run(record(loss=math.log(64) * 0.9))["verdict"] == "ok"  # below 95% of chance: learning
    strict = CollapseCriteria(loss_fraction=0.85)
    assert assess_run(record(loss=math.log(64) * 0.9), strict)["verdict"] == "collapsed"


def test_recall_at_chance_is_collapsed_for_every_loss():
    chance = 1 / 512
    verdict = assess_run(record("siglip", loss=5.0, softmax=False, i2t=chance, t2i=2.5 * chance))
    assert verdict["verdict"] == "collapsed" and "chance" in verdict["reasons"][0]
    assert assess_run(record(i2t=2 * chance, t2i=2.5 * chance))["verdict"] == "ok"


def test_failed_nonfinite_and_incomplete_runs_are_flagged():
    assert assess_run(record(status="failed"))["verdict"] == "failed"
    assert assess_run(record(status="nonfinite"))["verdict"] == "nonfinite"
    nan_metric = assess_run(record(**{"clone/overall": math.nan}))
    assert nan_metric["verdict"] == "nonfinite" and "clone/overall" in nan_metric["reasons"][0]
    incomplete = record()
    del incomplete["metrics"]["val/i2t_R@1"]
    assert assess_run(incomplete)["verdict"] == "failed"


def test_means_exclude_flagged_runs_and_rows_count_them():
    summaries = {s.label: s for s in summarize(assessed_records())}
    a = summaries["A"]
    assert a.runs_text() == "2/3 ok (1 collapsed)"
    assert a.metrics["clone/overall"].mean == pytest.approx(0.62) and a.metrics["clone/overall"].n == 2
    assert a.metrics["val/i2t_R@1"].std == pytest.approx(0.0282843, rel=1e-5)  # sample std of 0.30, 0.34
    assert summaries["B"].runs_text() == "3/3 ok"
    assert summaries["B"].metrics["clone/overall"].mean == pytest.approx(0.72)
    assert summaries["C"].runs_text() == "0/2 ok (2 collapsed)" and summaries["C"].metrics == {}
    assert summaries["D"].runs_text() == "1/2 ok (1 failed)" and math.isnan(summaries["D"].metrics["val/i2t_R@1"].std)
    assert list(summaries) == ["A", "B", "C", "D"]


def test_paired_differences_use_same_seed_pairs_and_a_t_interval(tmp_path):
    # Seeds move both losses together (0.1 apart per seed); the variant is 0.02 above clip on every seed.
    records = [assess_run(r) for seed in range(5) for r in (
        record("clip", seed, i2t=0.3 + 0.1 * seed), record("adacl", seed, i2t=0.32 + 0.1 * seed),
        record("noisy", seed, i2t=0.3 + 0.1 * seed + (0.05 if seed % 2 else -0.05)),
        record("collapsed", seed, loss=10.0, i2t=0.0, t2i=0.0),
        record("same", seed, i2t=0.3 + 0.1 * seed + 1e-7))]
    steady = paired_difference(records, "adacl", "clip", "val/i2t_R@1")
    assert steady.n == 5 and steady.mean == pytest.approx(0.02) and steady.half_width < 1e-9 and steady.clear
    noisy = paired_difference(records, "noisy", "clip", "val/i2t_R@1")
    # differences -0.05, +0.05, -0.05, +0.05, -0.05: mean -0.01, sd 0.0548, t(0.975, 4) = 2.776
    assert noisy.mean == pytest.approx(-0.01) and noisy.half_width == pytest.approx(2.776 * 0.05477 / 5 ** 0.5, rel=1e-3)
    assert not noisy.clear
    # A collapsed run drops its seed from the pairs.
    records[6] = assess_run(record("adacl", 1, loss=10.0, i2t=0.0, t2i=0.0))  # seed 1 of `adacl`
    assert paired_difference(records, "adacl", "clip", "val/i2t_R@1").n == 4
    markdown = write_report(records, report_context(tmp_path), tmp_path / "RESULTS.md", tmp_path / "out")
    assert "## Paired against `clip`" in markdown
    assert "| `adacl` | 4 |" in markdown and "+0.020 ± 0.000 *" in markdown
    assert "`adacl` vs `clip`: better on val/i2t_R@1 +0.020" in markdown
    assert "`noisy` vs `clip`: no paired difference excludes 0." in markdown
    # Float noise between runs that compute the same thing is a tie, however steady.
    assert "`same` vs `clip`: no paired difference excludes 0." in markdown
    assert "`collapsed` vs `clip`: no seed where both runs are ok (0/5 ok (5 collapsed))." in markdown
