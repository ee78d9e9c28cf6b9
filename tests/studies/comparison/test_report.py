"""The report from synthetic outcomes: Markdown, plot and CSVs, findings, and the hand-written tail it keeps."""

import csv

import pytest

from helpers.comparison_outcomes import assessed_outcomes, outcome, report_context
from studies.comparison.findings import compare
from studies.comparison.report import (
    KEEP_MARKER,
    PairedPoint,
    chance_level,
    paired_axis_limits,
    paired_points,
    plot_keys,
    write_report,
)
from studies.comparison.stats import assess_run, summarize


def test_comparisons_say_whether_a_lead_exceeds_the_seed_spread():
    summaries = summarize(assessed_outcomes())
    clone = compare(summaries, "clone/overall")
    assert clone.startswith("`B` is best on clone/overall (0.720 ± 0.020)") and "ahead of `D`" not in clone
    assert "ahead of `A` (0.620 ± 0.028) by 0.100, larger than" in clone
    close = summarize(
        [
            assess_run(r)
            for r in [
                outcome("X", 0, i2t=0.30),
                outcome("X", 1, i2t=0.40),
                outcome("Y", 0, i2t=0.33),
                outcome("Y", 1, i2t=0.35),
            ]
        ]
    )
    assert "not a clear difference" in compare(close, "val/i2t_R@1")


def test_report_markdown_csv_and_plot_from_synthetic_outcomes(tmp_path):
    outcomes = assessed_outcomes()
    results_md = tmp_path / "docs" / "RESULTS.md"
    markdown = write_report(outcomes, report_context(tmp_path), results_md, tmp_path / "out")
    assert results_md.read_text() == markdown
    assert "python -m studies.comparison --quick --seeds 0,1,2" in markdown and "Test CPU, 2 cores" in markdown
    assert (
        "**10.0 min** for 10 runs (2.5 min of run time in all); one run (its process: start, train, evaluate) took 15 s"
        in markdown
    )
    assert "**192 steps** at batch 64" in markdown
    assert "| `A` | 2/3 ok (1 collapsed) | 0.320 ± 0.028 |" in markdown
    assert "| `C` | 0/2 ok (2 collapsed) | - |" in markdown
    assert "`A-seed2`: **collapsed**: val CLIP loss" in markdown and "`D-seed0`: **failed**: boom" in markdown
    assert "![main metrics" in markdown and "(RESULTS.png)" in markdown and "[RESULTS_runs.csv]" in markdown
    assert "`B` is best on clone/overall" in markdown and "Against `A`" in markdown  # no clip row: first is baseline

    png = results_md.with_suffix(".png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    with (tmp_path / "docs" / "RESULTS_runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(outcomes) and rows[2]["verdict"] == "collapsed" and rows[2]["clone/overall"] == "0.99"
    for name in ("results.md", "runs.csv", "results.png", "summary.csv"):
        assert (tmp_path / "out" / name).is_file()


def test_the_difference_panel_spans_three_equivalence_margins_so_a_small_difference_looks_small():
    tiny = [PairedPoint("B", "clone/overall", -0.002, (-0.004, 0.0), 5)]
    assert paired_axis_limits(tiny, 0.02) == (pytest.approx(-0.06), pytest.approx(0.06))
    large = [
        PairedPoint("B", "clone/overall", -0.099, (-0.163, -0.035), 5),
        PairedPoint("C", "clone/overall", 0.01, None, 1),
    ]
    low, high = paired_axis_limits(large, 0.02)
    assert low == pytest.approx(-0.163 - 0.0173) and high == pytest.approx(0.06)


def test_the_plot_draws_chance_where_known_and_the_paired_differences_with_their_intervals():
    outcomes = assessed_outcomes()
    keys = plot_keys(summarize(outcomes))
    assert {key: chance_level(key) for key in keys} == {  # recall's chance depends on the set's size
        "clone/color": 0.5,
        "clone/overall": 0.5,
        "val/i2t_R@1": None,
        "val/t2i_R@1": None,
    }
    assert chance_level("clone/family") is None  # picking among a whole family: chance depends on its size
    points = {(p.label, p.key): p for p in paired_points(outcomes, ["A", "B", "C", "D"], "A", keys)}
    # B - A on the seeds where both are ok (A's seed 2 collapsed): 0.70 - 0.60 and 0.72 - 0.64
    b = points["B", "clone/overall"]
    assert (b.pairs, b.mean) == (2, pytest.approx(0.09))
    half = 12.706 * 0.02 / 2**0.5 / 2**0.5  # t(0.975, 1 df) x sd of (0.10, 0.08) / sqrt(2 pairs)
    assert b.interval == (pytest.approx(0.09 - half, abs=1e-4), pytest.approx(0.09 + half, abs=1e-4))
    assert points["D", "clone/overall"].pairs == 1 and points["D", "clone/overall"].interval is None  # a point only
    assert not any(label in ("A", "C") for label, _ in points)  # the reference itself; C has no ok run


def test_rewriting_the_report_keeps_the_hand_written_sections_below_the_marker(tmp_path):
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("old generated table\n\n" + KEEP_MARKER + "\n## Throughput\nratio 1.14\n")
    markdown = write_report(assessed_outcomes(), report_context(tmp_path), results_md, tmp_path / "out")
    text = results_md.read_text()
    assert "old generated table" not in text and text.startswith(markdown)
    assert text.endswith(KEEP_MARKER + "\n## Throughput\nratio 1.14\n")


def test_the_findings_name_hard_edit_types_ties_and_variants_that_change_nothing(tmp_path):
    clip = [
        outcome("clip", seed, **{"clone/color": 0.95, "clone/size": 0.85, "clone/shape": 0.52 + seed / 100})
        for seed in range(2)
    ]
    # Another loss whose runs differ from clip's by at most 0.002 on any metric: it changed nothing.
    same = [{**r, "label": "same", "metrics": {k: v + 0.002 for k, v in r["metrics"].items()}} for r in clip]
    markdown = write_report(
        [assess_run(r) for r in clip + same], report_context(tmp_path), tmp_path / "R.md", tmp_path / "out"
    )
    assert (
        "`clip` is below 0.9 on 2 of 3 clone edit types (shape, size), and within 0.05 of chance (0.5) on shape."
    ) in markdown
    assert "`same` matches `clip` seed for seed (largest difference on any metric 0.0020)" in markdown
    assert "All 4 runs finished with finite losses and above-chance recall" in markdown
    tie = summarize([assess_run(outcome("X", 0)), assess_run(outcome("Y", 0))])
    assert compare(tie, "clone/overall") == "`X` and `Y` tie for best on clone/overall (0.600 (1 run))."


def test_family_accuracy_near_a_half_is_not_called_chance():
    """Family accuracy's chance is 1 / (family size), not 0.5: the difficulty line names only two-caption metrics."""
    from studies.comparison.findings import baseline_difficulty
    from studies.comparison.stats import MetricStats, VariantSummary

    baseline = VariantSummary(
        "clip", {"ok": 2}, {"clone/family": MetricStats(0.51, 0.01, 2), "clone/mark": MetricStats(0.52, 0.01, 2)}
    )
    assert baseline_difficulty(baseline).endswith("within 0.05 of chance (0.5) on mark.")


def test_every_committed_report_states_the_collapse_rule_its_verdicts_follow():
    """The footer of each comparison report in docs/results (a report with its per-run CSV beside it; the
    earlier design's, in earlier_scenes/, keep their first rule) names the rule `assess_run` judges by, 3 x chance
    clause included."""
    from helpers import REPO
    from studies.comparison.report import collapse_rule_text

    results = REPO / "docs" / "results"
    comparisons = sorted(csv.with_name(csv.name.replace("_runs.csv", ".md")) for csv in results.glob("*_runs.csv"))
    stating = sorted(path for path in results.glob("*.md") if "Collapse criteria:" in path.read_text())
    assert len(comparisons) >= 17
    assert stating == comparisons
    assert [path.name for path in comparisons if collapse_rule_text() not in path.read_text()] == []
    assert "below 3 x chance" in collapse_rule_text()
