"""The measurements' commands: each runs through `python -m studies <command>`."""

import csv
import gzip
import json

from studies.cli import main


def test_the_siblings_command_prints_one_line_per_group_size(demo_shards, capsys):
    main(
        [
            "siblings",
            "--train-data",
            str(demo_shards / "train/shard-{000000..000003}.tar"),
            "--batch-size",
            "32",
            "--group-sizes",
            "1,8",
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("--train-group-size   1:")
    assert lines[1] == (
        "--train-group-size   8: 7.00 siblings per row at batch 32 (22.58% of in-batch negatives), 16 batches"
    )


def test_traces_name_every_run_uniquely_across_comparisons(tmp_path):
    runs_dirs = []
    for comparison in ("controls", "bank"):
        run = tmp_path / comparison / "runs" / "clip-seed0"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(
            "".join(
                json.dumps({"kind": "train", "step": step, "loss": 4.0 - step, "stats/mean_cosine": 0.1}) + "\n"
                for step in (1, 2)
            )
        )
        runs_dirs.append(tmp_path / comparison / "runs")
    traces = tmp_path / "traces.csv.gz"
    main(
        [
            "traces",
            "--runs-dir",
            *map(str, runs_dirs),
            "--traces",
            str(traces),
            "--mechanism",
            str(tmp_path / "mechanism.md"),
        ]
    )
    with gzip.open(traces, "rt") as handle:
        names = [row["run"] for row in csv.DictReader(handle)]
    assert names == ["controls/clip-seed0"] * 2 + ["bank/clip-seed0"] * 2
