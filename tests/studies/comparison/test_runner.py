"""A whole comparison, end to end on the demo fixture; then the report again from its outcomes alone."""

import json
import math
import time

import pytest

from helpers.comparison_outcomes import TINY
from studies.comparison import runner
from studies.comparison.cli import main
from studies.comparison.runner import comparison_eta, run_all, run_comparison, saved_comparison
from studies.comparison.variants import LossVariant


@pytest.mark.slow  # about 20 s on 2 cores: trains, exports and evaluates a run
def test_one_tiny_comparison_end_to_end_then_reused(demo_shards, tmp_path):
    """1 loss x 1 seed x 16 steps on the fixture's data: an outcome with every metric, and the report."""
    results_md, output_dir = tmp_path / "RESULTS.md", tmp_path / "comparison"
    outcomes = run_comparison(
        [LossVariant("clip")],
        [0],
        TINY,
        output_dir=output_dir,
        results_md=results_md,
        data_dir=demo_shards,
        command="python -m studies.comparison (test)",
        echo=lambda _: None,
    )
    (run,) = outcomes
    assert run["status"] == "ok", run["error"]
    assert run["verdict"] in ("ok", "collapsed")  # 16 steps may or may not leave chance level; either is reported
    metrics = run["metrics"]
    assert metrics["train/steps"] == 16 and 0 < metrics["train/final_loss"] < 2 * math.log(32)
    expected = {
        "val/i2t_R@1",
        "val/t2i_R@5",
        "cls/scenes_shape/acc1",
        "cls/scenes_color/acc1",
        "ret/scenes_retrieval/image_R@1",
        "ret/scenes_retrieval/text_R@5",
        "clone/color",
        "clone/relation",
        "clone/shape",
        "clone/size",
        "clone/overall",
    }
    assert expected <= set(metrics) and all(0 <= metrics[key] <= 1 for key in expected)
    assert run["val_num_samples"] == 128
    assert (output_dir / "runs" / "clip-seed0" / "export" / "open_clip_config.json").is_file()
    assert (output_dir / "logs" / "clip-seed0.log").stat().st_size > 0
    markdown = results_md.read_text()
    assert "| `clip` | 1/1 ok |" in markdown or "| `clip` | 0/1 ok (1 collapsed) |" in markdown
    # --report-only writes the same report from the outcomes, training nothing.
    main(["--report-only", "--output-dir", str(output_dir), "--results-md", str(tmp_path / "again.md")])
    assert (tmp_path / "again.md").read_text() == markdown.replace("RESULTS", "again")
    # --losses and --seeds replace the saved call's: the runs of several calls into one folder, or a part.
    outcomes = main(
        [
            "--report-only",
            "--output-dir",
            str(output_dir),
            "--results-md",
            str(tmp_path / "more.md"),
            "--losses",
            "clip,adacl",
            "--seeds",
            "0,1",
        ]
    )
    assert [outcome["name"] for outcome in outcomes] == ["clip-seed0"]
    assert all(
        f"`{name}`: **missing**" in (tmp_path / "more.md").read_text()
        for name in ("adacl-seed0", "clip-seed1", "adacl-seed1")
    )

    # The same call again reuses the finished run instead of training it again.
    again = run_comparison(
        [LossVariant("clip")],
        [0],
        TINY,
        output_dir=output_dir,
        results_md=results_md,
        data_dir=demo_shards,
        command="(test)",
        echo=lambda _: None,
    )
    assert again[0]["reused"] and again[0]["metrics"] == metrics

    # An output dir written before the comparison had its package (benchmark.json, the command
    # `python -m training.benchmark ...`) still gives its report, with the command as it is spelled now.
    saved = json.loads((output_dir / "comparison.json").read_text())
    saved["context"]["command"] = "python -m training.benchmark --quick --seeds 0"
    (output_dir / "benchmark.json").write_text(json.dumps(saved))
    (output_dir / "comparison.json").unlink()
    assert saved_comparison(output_dir)["context"]["command"] == "python -m studies.comparison --quick --seeds 0"
    main(["--report-only", "--output-dir", str(output_dir), "--results-md", str(tmp_path / "legacy.md")])
    assert "python -m studies.comparison --quick --seeds 0\n" in (tmp_path / "legacy.md").read_text()


def test_each_finished_run_prints_runs_done_of_total_and_the_time_left(monkeypatch):
    """Four runs, one at a time: the first reused (free, so no estimate yet), the others 0.2 s each (an estimate
    under a second)."""

    def launch(job, **_):
        if job != "reused":
            time.sleep(0.2)
        return {"label": job, "seed": 0, "verdict": "ok", "metrics": {}, "reused": job == "reused", "wall_seconds": 0.2}

    monkeypatch.setattr(runner, "launch_job", launch)
    monkeypatch.setattr(runner, "assess_run", lambda outcome: outcome)
    lines = []
    run_all(["reused", "a", "b", "c"], parallel=1, timeout=None, echo=lines.append)
    assert lines == [
        "[1/4] reused seed 0: ok, reused (ETA unknown)",
        "[2/4] a seed 0: ok, 0 s (ETA 0 s)",
        "[3/4] b seed 0: ok, 0 s (ETA 0 s)",
        "[4/4] c seed 0: ok, 0 s (done)",
    ]
    assert comparison_eta(elapsed=3600, trained=4, remaining=8) == "ETA 2 h 00 min"
    assert comparison_eta(elapsed=10, trained=0, remaining=3) == "ETA unknown"
