"""Every command writes only under the folders its flags name (`--logs`, `--output`, `--output-dir`, ...): each is
run here from an empty current folder, with those flags pointing elsewhere, and the current folder stays empty."""

import json
from pathlib import Path

import pytest

from helpers.comparison_outcomes import outcome, report_context
from studies.comparison.cli import main as comparison_main
from studies.comparison.jobs import outcome_file
from studies.glyphs.cli import main as glyphs_main
from training.discover.cli import main as discover_main
from training.evaluation.zero_shot import main as evaluation_main
from training.export import main as export_main
from training.main import main as train_main
from training.synthetic_scenes.cli import main as scenes_main
from training.trainer.run_folder.margins import main as margins_main


@pytest.fixture
def empty_cwd(tmp_path, monkeypatch):
    """An empty current folder; the test fails if a command leaves anything in it."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield cwd
    assert sorted(path.name for path in cwd.iterdir()) == []


@pytest.fixture(scope="module")
def trained_run(demo_shards, module_tmp):
    """One AdaCL epoch of adacl-tiny on the demo data, run from an empty current folder."""
    logs, cwd = module_tmp("logs"), module_tmp("train-cwd")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        summary = train_main(
            [
                "--train-data",
                str(demo_shards / "train" / "shard-{000000..000003}.tar"),
                "--model",
                "adacl-tiny",
                "--loss",
                "adacl",
                "--batch-size",
                "64",
                "--epochs",
                "1",
                "--workers",
                "0",
                "--device",
                "cpu",
                "--precision",
                "fp32",
                "--val-data",
                str(demo_shards / "val" / "shard-000000.tar"),
                "--logs",
                str(logs),
                "--name",
                "run",
                "--save-every-n-steps",
                "4",
                "--report-to",
                "tensorboard",
            ]
        )
    return summary, logs / "run", sorted(path.name for path in cwd.iterdir())


@pytest.mark.slow
def test_training_writes_only_under_logs(trained_run):
    summary, run_dir, left_in_cwd = trained_run
    assert left_in_cwd == []
    assert Path(summary.checkpoint).parent == run_dir / "checkpoints"


@pytest.mark.slow
def test_export_evaluation_discovery_and_margins_write_only_where_named(trained_run, demo_shards, tmp_path, empty_cwd):
    summary, run_dir, _ = trained_run
    out = tmp_path / "out"
    export_main(["--checkpoint", str(summary.checkpoint), "--output", str(out / "export")])
    export_main(["--checkpoint", str(summary.checkpoint), "--hf-dir", str(out / "hub")])
    evaluation_main(
        [
            "--checkpoint",
            str(summary.checkpoint),
            "--demo-root",
            str(demo_shards),
            "--output-dir",
            str(out / "eval"),
            "--num-workers",
            "0",
            "--in-process",
        ]
    )
    discover_main(
        [
            "--checkpoint",
            str(summary.checkpoint),
            "--data",
            str(demo_shards / "train" / "shard-000000.tar"),
            "--max-batches",
            "1",
            "--batch-size",
            "64",
            "--workers",
            "0",
            "--device",
            "cpu",
            "--output",
            str(out / "discover"),
        ]
    )
    margins_main([str(run_dir)])
    assert {path.name for path in out.iterdir()} == {"export", "hub", "eval", "discover"}


@pytest.mark.slow
def test_data_writers_write_only_under_output(tmp_path, empty_cwd):
    scenes_main(
        [
            "--output",
            str(tmp_path / "scenes"),
            "--num-train",
            "16",
            "--num-val",
            "8",
            "--num-test",
            "8",
            "--shard-size",
            "8",
            "--family-size",
            "4",
        ]
    )
    glyphs_main(["--output", str(tmp_path / "glyphs"), "--num-train", "48", "--shard-size", "24", "--family-size", "4"])
    assert (tmp_path / "scenes" / "manifest.json").is_file() and any((tmp_path / "glyphs").iterdir())


def test_the_loss_comparison_writes_its_report_under_output_dir(demo_shards, tmp_path, empty_cwd):
    """Without --results-md the report goes into --output-dir: run from a checkout, the committed docs/RESULTS.md
    stays as it is."""
    output_dir = tmp_path / "comparison"
    comparison_main(
        [
            "--losses",
            "clip,adacl",
            "--seeds",
            "0",
            "--emit-jobs",
            str(tmp_path / "jobs"),
            "--output-dir",
            str(output_dir),
            "--train-data",
            str(demo_shards / "train" / "shard-000000.tar"),
            "--train-num-samples",
            "128",
            "--val-data",
            str(demo_shards / "val" / "shard-000000.tar"),
        ]
    )
    machine = report_context(tmp_path).machine  # what a finished job records about where it ran
    for label in ("clip", "adacl"):
        path = outcome_file(output_dir, f"{label}-seed0")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**outcome(label, 0), "machine": machine}))
    comparison_main(["--report-only", "--output-dir", str(output_dir)])
    assert (output_dir / "results.md").read_text().startswith("#")
