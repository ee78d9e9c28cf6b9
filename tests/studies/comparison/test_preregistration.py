"""The pre-registration (endpoint, margin, reference) from flags or a committed file, and the report's verdict table."""

import json

import pytest

from helpers import REPO
from helpers.comparison_outcomes import outcome, report_context
from studies.comparison.preregistration import Preregistration, from_file, resolve
from studies.comparison.report import write_report
from studies.comparison.stats import assess_run

ENDPOINT = "clone_learnable=clone/color+clone/shape+clone/size"


def test_flags_give_the_endpoint_margin_and_reference():
    registration = resolve(None, ENDPOINT, 0.01, "adacl")
    assert registration == Preregistration(
        "clone_learnable", ("clone/color", "clone/shape", "clone/size"), 0.01, "adacl", None
    )
    assert registration.key == "primary/clone_learnable" and registration.definition == ENDPOINT
    assert (
        resolve(None, ENDPOINT, None, None).margin == 0.02 and resolve(None, ENDPOINT, None, None).reference == "clip"
    )
    assert resolve(None, None, None, "siglip") == Preregistration(reference="siglip")  # pairing only, no verdict


@pytest.mark.parametrize(
    "endpoint, margin, message",
    [
        ("clone/color+clone/shape", None, "write NAME=metric1"),
        ("x=", None, "write NAME=metric1"),
        ("x=clone/color+clone/color", None, "lists a metric twice"),
        (ENDPOINT, 0.0, "must be > 0"),
        (None, 0.02, "--equivalence-margin needs --primary-endpoint"),
    ],
)
def test_bad_flags_are_one_line_errors(endpoint, margin, message):
    with pytest.raises(ValueError, match=message):
        resolve(None, endpoint, margin, None)


def test_a_markdown_file_holds_one_registration_per_regime(tmp_path):
    page = tmp_path / "preregistration.md"
    blocks = [
        {"name": "scratch", "primary_endpoint": ENDPOINT, "equivalence_margin": 0.02},
        {"name": "weak", "primary_endpoint": "shape=clone/shape", "equivalence_margin": 0.03, "reference": "x"},
    ]
    page.write_text(
        "# Pre-registration\n\nText.\n\n"
        + "\n".join(f"## {block['name']}\n\n```json\n{json.dumps(block, indent=1)}\n```\n" for block in blocks)
    )
    scratch = from_file(f"{page}#scratch")
    assert (scratch.endpoint, scratch.margin, scratch.reference, scratch.source) == (
        "clone_learnable",
        0.02,
        "clip",
        f"{page}#scratch",
    )
    weak = resolve(f"{page}#weak", None, None, None)
    assert (weak.metrics, weak.margin, weak.reference) == (("clone/shape",), 0.03, "x")
    with pytest.raises(ValueError, match="found 2 registrations where one is needed; pick one with FILE#NAME"):
        from_file(str(page))
    with pytest.raises(ValueError, match="found 0 registration named 'nosuch's"):
        from_file(f"{page}#nosuch")
    with pytest.raises(ValueError, match="fixes the endpoint, margin and reference; drop --equivalence-margin"):
        resolve(f"{page}#weak", None, 0.05, None)


def test_a_json_file_and_its_errors(tmp_path):
    path = tmp_path / "prereg.json"
    path.write_text(json.dumps({"primary_endpoint": ENDPOINT, "equivalence_margin": 0.015, "reference": "clip"}))
    assert from_file(str(path)).margin == 0.015 and from_file(str(path)).source == str(path)
    path.write_text(json.dumps({"primary_endpoint": ENDPOINT, "margin": 0.015}))
    with pytest.raises(ValueError, match=r"unknown: margin"):
        from_file(str(path))
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        from_file(str(path))
    with pytest.raises(ValueError, match="no such file"):
        from_file(str(tmp_path / "missing.json"))


def test_a_registration_can_fix_the_verdict_rule_and_the_secondary_family(tmp_path):
    path = tmp_path / "prereg.json"
    path.write_text(
        json.dumps(
            {
                "primary_endpoint": ENDPOINT,
                "helps_beyond_margin": True,
                "secondary_family": ["clone/mark", "clone/*_cos_margin"],
            }
        )
    )
    registration = from_file(str(path))
    assert registration.helps_beyond_margin and registration.secondary_family == ("clone/mark", "clone/*_cos_margin")
    assert not from_file(f"{REPO / 'docs' / 'preregistration.md'}#scratch").helps_beyond_margin
    for wrong in ({"helps_beyond_margin": "yes"}, {"secondary_family": []}, {"secondary_family": "clone/mark"}):
        path.write_text(json.dumps({"primary_endpoint": ENDPOINT, **wrong}))
        with pytest.raises(ValueError, match="helps_beyond_margin is true or false and secondary_family a non-empty"):
            from_file(str(path))


def test_the_glyph_benchmark_registers_the_margin_rule_and_its_102_secondary_tests():
    """Its committed runs, tested on the family docs/preregistration_glyphs.md names: 17 metrics x 6 variants."""
    from studies.comparison.findings import secondary_keys
    from studies.comparison.report import read_runs_csv
    from studies.comparison.stats import secondary_tests, summarize

    registration = from_file(f"{REPO / 'docs' / 'preregistration_glyphs.md'}#glyphs_finetune_gold")
    assert registration.helps_beyond_margin
    outcomes = read_runs_csv(REPO / "docs" / "results" / "glyphs_finetune_gold_runs.csv")
    summaries = summarize(outcomes)
    keys = secondary_keys(summaries, registered=True, family=registration.secondary_family)
    assert len(keys) == 17 and "clone/family_cos_margin" in keys and "clone/mark_cos_margin_p10" not in keys
    assert secondary_keys(summaries, registered=True) == ["val/i2t_R@1", "val/t2i_R@1"]  # the scenes' family
    tests = secondary_tests(outcomes, [summary.label for summary in summaries], "clip", keys)
    assert sum(len(by_key) for by_key in tests.values()) == 102


def test_the_report_gives_each_variant_one_verdict_on_the_endpoint(tmp_path):
    def runs(label, shift, spread):
        # The endpoint's three metrics move together; `shift` is the variant's effect, `spread` its seed noise.
        return [
            outcome(
                label,
                seed,
                **{
                    f"clone/{edit}": 0.6 + 0.05 * seed + shift + spread * (-1) ** seed
                    for edit in ("color", "shape", "size")
                },
            )
            for seed in range(5)
        ]

    outcomes = [
        assess_run(r)
        for r in runs("clip", 0, 0)
        + runs("better", 0.05, 0.003)
        + runs("equal", 0, 0.003)
        + runs("noisy", 0.0, 0.05)
        + runs("lonely", 0.01, 0)[:1]
    ]
    registration = Preregistration(
        "clone_learnable", ("clone/color", "clone/shape", "clone/size"), 0.02, source="docs/prereg.md#scratch"
    )
    markdown = write_report(outcomes, report_context(tmp_path), tmp_path / "R.md", tmp_path / "out", registration)
    assert (
        "`clone_learnable`: the per-run mean of clone/color, clone/shape, clone/size; equivalence margin ±0.02; "
        "reference `clip`; pre-registered in `docs/prereg.md#scratch`."
    ) in markdown
    rows = {
        line.split(" | ")[0]: line
        for line in markdown.splitlines()
        if line.startswith("| `") and "| clone_learnable | ±0.02 |" in line
    }
    assert set(rows) == {"| `better`", "| `equal`", "| `noisy`", "| `lonely`"}
    # differences 0.053, 0.047, ... : mean 0.0506, sd 0.003286; t(0.975, 4) 2.776, t(0.95, 4) 2.132
    assert "| 5 | +0.0506 | [+0.0465, +0.0547] | [+0.0475, +0.0537] | **helps**" in rows["| `better`"]
    assert "**no effect** (TOST: the 90% interval is inside ±0.02)" in rows["| `equal`"]
    assert "**inconclusive**" in rows["| `noisy`"]
    assert "| 1 | +0.0100 | n/a (1 pair) | n/a (1 pair) | **inconclusive** (1 pair" in rows["| `lonely`"]
    # The endpoint's per-run value is a metric of the summary, and the endpoint needs metrics that exist.
    assert "primary/clone_learnable" in markdown.split("## What this shows")[0]
    typo = Preregistration("x", ("clone/colour",), 0.02)
    with pytest.raises(ValueError, match="clone/colour is in no ok run's metrics; choose from"):
        write_report(outcomes, report_context(tmp_path), tmp_path / "R.md", tmp_path / "out", typo)
    with pytest.raises(ValueError, match="reference variant 'siglip' is not among the variants"):
        write_report(
            outcomes, report_context(tmp_path), tmp_path / "R.md", tmp_path / "out", Preregistration(reference="siglip")
        )
