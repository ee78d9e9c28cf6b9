"""Verdicts (collapsed, failed, nonfinite), means over the ok runs only, and paired differences over seeds."""

import math

import pytest

from helpers.comparison_outcomes import assessed_outcomes, outcome, report_context
from studies.comparison.report import write_report
from studies.comparison.stats import (
    CollapseCriteria,
    PairedDifference,
    assess_run,
    check_same_code,
    holm,
    paired_difference,
    primary_verdict,
    secondary_tests,
    summarize,
    val_chance_loss,
)


def test_healthy_runs_are_ok():
    assert assess_run(outcome())["verdict"] == "ok"
    # The trained loss's own value is no collapse signal (siglip's, or AdaCL's progressive positive logit).
    assert assess_run(outcome("siglip", loss=10.0))["verdict"] == "ok"
    assert assess_run(outcome("adacl:paper", loss=0.001))["verdict"] == "ok"


def test_a_val_clip_loss_at_its_chance_value_is_collapsed_whatever_the_training_loss():
    # The collapsed paper runs: training loss 0.001-0.04, val CLIP loss ~ ln 64, recall above 2x chance.
    verdict = assess_run(outcome("adacl:paper", loss=0.02, val_loss=math.log(64) * 0.96, i2t=0.004, t2i=0.004))
    assert verdict["verdict"] == "collapsed" and "val CLIP loss" in verdict["reasons"][0]
    at_chance = {"i2t": 0.004, "t2i": 0.004}  # 2 x chance of 512 val pairs: no retrieval above chance
    assert assess_run(outcome(val_loss=math.log(64) * 0.9, **at_chance))["verdict"] == "ok"  # below 95%: learning
    strict = CollapseCriteria(loss_band=0.15)
    assert assess_run(outcome(val_loss=math.log(64) * 0.9, **at_chance), strict)["verdict"] == "collapsed"
    # Far above chance with recall above chance: a confidently wrong model (pseudo captions), not a collapse.
    assert assess_run(outcome(val_loss=math.log(64) * 3, i2t=0.01, t2i=0.01))["verdict"] == "ok"
    assert assess_run(outcome(val_loss=math.log(64) * 1.04, **at_chance))["verdict"] == "collapsed"


def test_a_loss_near_chance_with_retrieval_above_chance_is_no_collapse():
    # The pseudo-caption run that the loss band alone called collapsed: val CLIP loss 4.131, R@1 4 x chance.
    near = outcome("adacl:positive_grad=fixed", val_loss=4.131, i2t=0.0078125, t2i=0.0078125)
    assert assess_run(near)["verdict"] == "ok"
    at_three = outcome(val_loss=4.131, i2t=3 / 512, t2i=3 / 512)
    assert assess_run(at_three)["verdict"] == "ok"
    below = assess_run(outcome(val_loss=4.131, i2t=2.5 / 512, t2i=2.5 / 512))
    assert below["verdict"] == "collapsed" and "below 3 x chance" in below["reasons"][0]


def test_the_chance_value_is_the_one_the_trainer_recorded_else_ln_of_the_val_batch():
    assert val_chance_loss(outcome()) == pytest.approx(math.log(64))
    assert val_chance_loss(outcome(batch=1024)) == pytest.approx(math.log(512))  # the val set is one batch
    recorded = outcome(**{"val/clip_loss_chance": 3.5})
    assert val_chance_loss(recorded) == 3.5
    low_recall = {"val/clip_loss": 3.4, "val/i2t_R@1": 0.004, "val/t2i_R@1": 0.004}
    assert assess_run({**recorded, "metrics": {**recorded["metrics"], **low_recall}})["verdict"] == "collapsed"


def test_pairs_of_different_code_are_refused_in_one_line():
    outcomes = [assess_run(outcome("clip", 0)), assess_run(outcome("adacl", 0, code="git 0123456789 + diff abc"))]
    with pytest.raises(ValueError, match=r"1 pair\(s\) ran different or unknown code, e\.g\. adacl seed 0"):
        check_same_code(outcomes, ["clip", "adacl"], "clip")
    check_same_code([assess_run(outcome("clip", 0)), assess_run(outcome("adacl", 0))], ["clip", "adacl"], "clip")
    with pytest.raises(ValueError, match="unknown"):
        check_same_code(
            [assess_run(outcome("clip", 0, code=None)), assess_run(outcome("adacl", 0, code=None))],
            ["clip", "adacl"],
            "clip",
        )


def test_recall_at_chance_is_collapsed_for_every_loss():
    chance = 1 / 512
    verdict = assess_run(outcome("siglip", loss=5.0, i2t=chance, t2i=2.5 * chance))
    assert verdict["verdict"] == "collapsed" and "chance" in verdict["reasons"][0]
    assert assess_run(outcome(i2t=2 * chance, t2i=2.5 * chance))["verdict"] == "ok"


def test_failed_nonfinite_and_incomplete_runs_are_flagged():
    assert assess_run(outcome(status="failed"))["verdict"] == "failed"
    assert assess_run(outcome(status="nonfinite"))["verdict"] == "nonfinite"
    nan_metric = assess_run(outcome(**{"clone/overall": math.nan}))
    assert nan_metric["verdict"] == "nonfinite" and "clone/overall" in nan_metric["reasons"][0]
    incomplete = outcome()
    del incomplete["metrics"]["val/i2t_R@1"]
    assert assess_run(incomplete)["verdict"] == "failed"


def test_means_exclude_flagged_runs_and_rows_count_them():
    summaries = {s.label: s for s in summarize(assessed_outcomes())}
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
    # Seeds move both losses together (0.1 apart per seed); `noisy` alternates around clip.
    outcomes = [
        assess_run(r)
        for seed in range(5)
        for r in (
            outcome("clip", seed, i2t=0.3 + 0.1 * seed),
            outcome("noisy", seed, i2t=0.3 + 0.1 * seed + (0.05 if seed % 2 else -0.05)),
            outcome("collapsed", seed, loss=10.0, i2t=0.0, t2i=0.0),
        )
    ]
    noisy = paired_difference(outcomes, "noisy", "clip", "val/i2t_R@1")
    # differences -0.05, +0.05, -0.05, +0.05, -0.05: mean -0.01, sd 0.0548, t(0.975, 4) = 2.776
    half = 2.776 * 0.05477 / 5**0.5
    assert noisy.n == 5 and noisy.mean == pytest.approx(-0.01)
    assert noisy.interval(0.95) == pytest.approx((-0.01 - half, -0.01 + half), rel=1e-3)
    assert noisy.p_value == pytest.approx(0.7040, abs=1e-3)  # t = -0.408 on 4 degrees of freedom
    assert paired_difference(outcomes, "collapsed", "clip", "val/i2t_R@1") is None  # no ok run: no pair
    # A collapsed run drops its seed from the pairs.
    outcomes[3] = assess_run(outcome("noisy", 1, loss=10.0, i2t=0.0, t2i=0.0))
    assert paired_difference(outcomes, "noisy", "clip", "val/i2t_R@1").n == 4


def test_a_zero_variance_difference_is_never_significant(tmp_path):
    # `steady` is 0.02 above clip on every seed (up to float rounding), `same` scores exactly what clip does,
    # `tiny` is a steady float-noise offset, `single` has one pair.
    outcomes = [
        assess_run(r)
        for seed in range(5)
        for r in (
            outcome("clip", seed, i2t=0.3 + 0.1 * seed),
            outcome("steady", seed, i2t=0.32 + 0.1 * seed),
            outcome("same", seed, i2t=0.3 + 0.1 * seed),
            outcome("tiny", seed, i2t=0.3 + 0.1 * seed + 1e-7 * seed),
        )
    ]
    outcomes.append(assess_run(outcome("single", 0, i2t=0.5)))
    steady = paired_difference(outcomes, "steady", "clip", "val/i2t_R@1")
    assert steady.n == 5 and steady.mean == pytest.approx(0.02) and steady.zero_variance and not steady.testable
    rounded = PairedDifference((0.02, 0.020000000000000018, 0.019999999999999997))  # float rounding is no spread
    assert 0 < rounded.sd < 1e-15 and rounded.zero_variance and rounded.p_value is None
    assert steady.interval(0.95) is None and steady.p_value is None
    assert steady.interval_text(0.95) == "n/a (zero variance)"
    assert primary_verdict(steady, margin=0.05)[0] == "inconclusive"
    same = paired_difference(outcomes, "same", "clip", "val/i2t_R@1")
    assert same.identical and primary_verdict(same, margin=0.02) == (
        "no effect",
        "identical to the reference on every pair",
    )
    single = paired_difference(outcomes, "single", "clip", "val/i2t_R@1")
    assert single.n == 1 and primary_verdict(single, 0.02) == ("inconclusive", "1 pair (a paired interval needs 2)")
    assert primary_verdict(None, 0.02)[0] == "inconclusive"
    tests = secondary_tests(outcomes, ["clip", "steady", "same", "tiny", "single"], "clip", ["val/i2t_R@1"])
    assert not any(test["val/i2t_R@1"].significant for test in tests.values())
    assert tests["steady"]["val/i2t_R@1"].p_value is None and tests["steady"]["val/i2t_R@1"].adjusted == 1.0
    # `tiny` has a real spread and p < 0.05, but a difference below the tables' resolution is no finding.
    assert tests["tiny"]["val/i2t_R@1"].p_value < 0.05
    markdown = write_report(outcomes, report_context(tmp_path), tmp_path / "RESULTS.md", tmp_path / "out")
    assert "| `steady` | val/i2t_R@1 | 5 | +0.0200 | n/a (zero variance) | n/a | 1.000 |  |" in markdown
    assert "`steady` vs `clip`: no secondary difference survives the Holm correction" in markdown


def test_holm_matches_a_hand_computed_example():
    # Sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> max(0.06, 0.04) = 0.06.
    adjusted, rejected = holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert rejected == [True, False, False, True]
    assert holm([0.3, 0.9], alpha=0.05) == ([0.6, 0.9], [False, False])  # capped at 1, monotone
    assert holm([]) == ([], [])


def test_secondary_tests_are_holm_corrected_over_every_variant_and_metric(tmp_path):
    # Two variants x two metrics = a family of 4. `a`'s gain on val/i2t_R@1 is clear (p ~ 1e-7); `b`'s on
    # clone/color has raw p 0.045 < 0.05, second smallest of 4, so Holm p = 3 x 0.045 > 0.05.
    gains = {"a": [0.101, 0.099, 0.1, 0.102, 0.098], "b": [0.02, 0.05, 0.005, 0.04, 0.01]}
    outcomes = [assess_run(outcome("clip", seed, i2t=0.3, **{"clone/color": 0.7})) for seed in range(5)]
    outcomes += [
        assess_run(
            outcome(
                label,
                seed,
                i2t=0.3 + (gain[seed] if label == "a" else 0.01 * (seed % 2)),
                **{"clone/color": 0.7 + (gain[seed] if label == "b" else 0.0)},
            )
        )
        for label, gain in gains.items()
        for seed in range(5)
    ]
    tests = secondary_tests(outcomes, ["clip", "a", "b"], "clip", ["clone/color", "val/i2t_R@1"])
    b_color, a_recall = tests["b"]["clone/color"], tests["a"]["val/i2t_R@1"]
    assert b_color.p_value == pytest.approx(0.0448, abs=1e-3)  # mean 0.025, sd 0.01936, t 2.887, 4 df
    assert a_recall.p_value < 1e-5 and a_recall.significant
    raw = [tests[label][key].p_value or 1.0 for label in ("a", "b") for key in ("clone/color", "val/i2t_R@1")]
    assert [
        tests[label][key].adjusted for label in ("a", "b") for key in ("clone/color", "val/i2t_R@1")
    ] == pytest.approx(holm(raw)[0])
    assert b_color.adjusted == pytest.approx(3 * b_color.p_value) and not b_color.significant  # raw p < 0.05, not Holm
    markdown = write_report(outcomes, report_context(tmp_path), tmp_path / "RESULTS.md", tmp_path / "out")
    assert "`a` vs `clip`: better on val/i2t_R@1 +0.100 (Holm p" in markdown
    assert "`b` vs `clip`: no secondary difference survives the Holm correction" in markdown


@pytest.mark.parametrize(
    "differences, margin, verdict",
    [
        ((0.03, 0.04, 0.05, 0.035, 0.045), 0.02, "helps"),
        ((-0.03, -0.04, -0.05, -0.035, -0.045), 0.02, "hurts"),
        ((0.001, -0.002, 0.0015, -0.001, 0.0005), 0.02, "no effect"),
        ((0.03, -0.03, 0.02, -0.025, 0.01), 0.02, "inconclusive"),
        ((0.001, -0.002, 0.0015, -0.001, 0.0005), 0.001, "inconclusive"),  # a tight margin: cannot show equivalence
    ],
)
def test_primary_verdicts_helps_hurts_no_effect_inconclusive(differences, margin, verdict):
    assert primary_verdict(PairedDifference(differences), margin)[0] == verdict


def test_the_registered_reading_needs_the_interval_outside_the_margin():
    """docs/preregistration_glyphs.md: helps is "interval above 0 and outside the margin"."""
    inside = PairedDifference((0.004, 0.005, 0.006, 0.0045, 0.0055))  # above 0, well inside ±0.02
    assert primary_verdict(inside, 0.02)[0] == "helps"
    assert primary_verdict(inside, 0.02, beyond_margin=True) == ("no effect", "TOST: the 90% interval is inside ±0.02")
    straddling = PairedDifference((0.005, 0.03, 0.012, 0.025, 0.008))  # above 0, its 90% interval reaches past 0.02
    assert primary_verdict(straddling, 0.02)[0] == "helps"
    assert primary_verdict(straddling, 0.02, beyond_margin=True) == (
        "inconclusive",
        "the 95% interval is not outside ±0.02 and the 90% interval is not inside it",
    )
    beyond = PairedDifference((0.03, 0.04, 0.05, 0.035, 0.045))
    assert primary_verdict(beyond, 0.02, beyond_margin=True) == ("helps", "the 95% interval is above +0.02")
    assert primary_verdict(PairedDifference(tuple(-d for d in beyond.differences)), 0.02, beyond_margin=True) == (
        "hurts",
        "the 95% interval is below -0.02",
    )


def test_the_equivalence_test_uses_the_90_percent_interval():
    difference = PairedDifference((0.001, -0.002, 0.0015, -0.001, 0.0005))
    # mean 0, sd 0.001458; t(0.95, 4) = 2.132 -> 90% half width 0.001390; t(0.975, 4) = 2.776 -> 0.001811
    assert difference.interval(0.90) == pytest.approx((-0.001390, 0.001390), abs=2e-6)
    assert difference.interval(0.95) == pytest.approx((-0.001811, 0.001811), abs=2e-6)
    # A margin between the two half widths: equivalent by TOST (90%), which a 95% interval would not show.
    assert primary_verdict(difference, 0.0016) == ("no effect", "TOST: the 90% interval is inside ±0.0016")
    # Significant but smaller than the margin: helps, and the reason says so.
    assert primary_verdict(PairedDifference((0.004, 0.005, 0.006)), 0.02) == (
        "helps",
        "the 95% interval is above 0 (inside the margin)",
    )


@pytest.mark.slow
def test_pairs_needed_follow_the_observed_spread():
    from studies.comparison.stats import pairs_needed

    # mean -0.037, sd 0.0286 (the scratch default's endpoint): 5 pairs just detect it; equivalence within 0.02
    # is out of reach, the mean lies outside the margin.
    difference = PairedDifference((-0.0738 + 0.03, -0.02, -0.06, -0.01, -0.0197))
    detect, equivalent = pairs_needed(difference, 0.02)
    assert (detect, equivalent) == (6, None)
    # A small spread around 0: detection never, equivalence in a few pairs; a wider spread needs more.
    tight = PairedDifference((0.001, -0.002, 0.0015, -0.001, 0.0005))
    assert pairs_needed(tight, 0.02) == (None, 2)
    wide = PairedDifference((0.01, -0.02, 0.015, -0.01, 0.005))
    assert pairs_needed(wide, 0.02)[1] > pairs_needed(tight, 0.02)[1]
    assert pairs_needed(PairedDifference((0.01,)), 0.02) == (None, None)


def test_fieller_interval_is_the_set_where_the_ratio_is_not_rejected():
    """The endpoints solve (mean_a - theta mean_b)^2 = t^2 var(mean_a - theta mean_b); the share lies inside, a
    value beyond an endpoint is rejected; an unresolved denominator gives no bounded interval."""
    import statistics

    from scipy import stats

    from studies.comparison.stats import fieller_interval

    gains = [0.021, 0.034, 0.012, 0.030, 0.025, 0.018, 0.027, 0.040, 0.015, 0.022]
    oracle = [0.048, 0.060, 0.041, 0.055, 0.052, 0.044, 0.058, 0.066, 0.039, 0.050]
    low, high = fieller_interval(gains, oracle, 0.95)
    t = stats.t.ppf(0.975, 9)

    def excess(theta):  # <= 0 inside the confidence set
        differences = [a - theta * b for a, b in zip(gains, oracle)]
        return statistics.fmean(differences) ** 2 - t * t * statistics.variance(differences) / len(differences)

    share = statistics.fmean(gains) / statistics.fmean(oracle)
    assert low < share < high and excess(share) < 0
    assert abs(excess(low)) < 1e-12 and abs(excess(high)) < 1e-12
    assert excess(low - 0.01) > 0 and excess(high + 0.01) > 0
    assert fieller_interval(gains, [0.01, -0.02, 0.015, -0.01, 0.02, 0.0, -0.015, 0.01, 0.005, -0.004], 0.95) is None
    assert fieller_interval(gains[:2], oracle[:2], 0.95) is None


def test_share_of_gain_pairs_the_three_runs_of_each_seed():
    from studies.comparison import share_of_gain

    values = {"clip": [0.40, 0.42, 0.41, 0.39], "oracle": [0.46, 0.47, 0.47, 0.45], "mine": [0.43, 0.45, 0.44, 0.9]}
    outcomes = [
        {
            "label": label,
            "seed": seed,
            "verdict": "ok" if (label, seed) != ("mine", 3) else "collapsed",
            "metrics": {"m": value},
        }
        for label, per_seed in values.items()
        for seed, value in enumerate(per_seed)
    ]
    share = share_of_gain(outcomes, "mine", "oracle", "clip", "m")
    assert share.n == 3 and abs(share.share - (0.09 / 3) / (0.17 / 3)) < 1e-12  # seed 3 is not ok: left out
    assert share.interval is not None and share.interval[0] < share.share < share.interval[1]
    assert share.text().startswith("+53% [")
