"""The measurements' commands: each runs through `python -m training.studies <command>`."""

from training.studies.cli import main


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
