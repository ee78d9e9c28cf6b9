"""Training mistakes a user makes in the first week, each refused in one `error:` line with exit status 2 before
anything is written (or, for a shell's escaped tab, understood): `python -m training.main` (`training.main.cli`)."""

import tarfile

import pytest

from helpers.cli_errors import one_line_error
from helpers.run_utils import tiny_argv
from training.main import cli, main
from training.trainer import distributed


def write_tsv(demo_shards, folder, *, image_folder):
    """A tsv of the first training shard's 128 images (extracted into `folder`) and captions, whose image paths
    point into `image_folder` (`folder` itself, or one without the images)."""
    folder.mkdir()
    rows = []
    with tarfile.open(demo_shards / "train" / "shard-000000.tar") as shard:
        for member in shard.getmembers():
            if member.name.endswith(".png"):
                (folder / member.name).write_bytes(shard.extractfile(member).read())
                caption = shard.extractfile(member.name.replace(".png", ".txt")).read().decode()
                rows.append(f"{image_folder / member.name}\t{caption}")
    path = folder / "data.tsv"
    path.write_text("\n".join(["filepath\ttitle", *rows]) + "\n")
    return path


def argv(logs, train_data, *extra):
    return tiny_argv(logs, "run", *extra, data=train_data)


def training_cli_error(arguments, monkeypatch, capsys) -> str:
    """What `python -m training.main ARGUMENTS` prints when it refuses: status 2, one line, nothing on stdout."""
    return one_line_error(cli, "training.main", arguments, monkeypatch, capsys)


def test_a_tab_typed_as_an_escape_is_a_tab_and_a_longer_separator_is_one_line(
    demo_shards, tmp_path, monkeypatch, capsys
):
    tsv = write_tsv(demo_shards, tmp_path / "data", image_folder=tmp_path / "data")
    logs = tmp_path / "logs"
    main(argv(logs, tsv, "--dataset-type", "csv", "--csv-separator", "\\t", "--dry-run"))
    assert capsys.readouterr().out.splitlines()[-1].startswith("dry run OK: ")
    error = training_cli_error(argv(logs, tsv, "--dataset-type", "csv", "--csv-separator", "ab"), monkeypatch, capsys)
    assert error == (
        "error: --csv-separator ab: a separator is one character (a tab: --csv-separator '\\t'; a comma: "
        "--csv-separator ,)"
    )
    assert not logs.exists()


def test_csv_mistakes_are_named_before_anything_is_written(demo_shards, tmp_path, monkeypatch, capsys):
    logs = tmp_path / "logs"
    shard = demo_shards / "train" / "shard-000000.tar"
    error = training_cli_error(argv(logs, shard, "--dataset-type", "csv"), monkeypatch, capsys)
    assert error == (
        f"error: training data: train_data (--train-data): {shard} is a tar archive, not a csv file: "
        "pass --dataset-type webdataset (or auto)"
    )
    moved = write_tsv(demo_shards, tmp_path / "data", image_folder=tmp_path / "elsewhere")
    for extra in (["--dry-run"], []):  # the dry run finds what the run would meet at its first batch
        error = training_cli_error(argv(logs, moved, "--dataset-type", "csv", *extra), monkeypatch, capsys)
        assert error.startswith(
            f"error: train_data (--train-data): none of 16 rows sampled from {moved} is usable "
            f"(missing_image 16); row 0 has image '{tmp_path / 'elsewhere'}/"
        )
    assert not logs.exists()


def test_no_epochs_and_a_missing_device_are_refused(demo_shards, tmp_path, monkeypatch, capsys):
    logs, shard = tmp_path / "logs", demo_shards / "train" / "shard-000000.tar"
    error = training_cli_error(argv(logs, shard, "--epochs", "0"), monkeypatch, capsys)
    assert error == (
        "error: --epochs must be >= 1, got 0: such a run trains nothing (to evaluate a checkpoint: "
        "python -m training.evaluation --checkpoint CKPT)"
    )
    # A machine without CUDA, whatever this one has; only the device typed by name is refused.
    monkeypatch.setattr(distributed, "is_device_available", lambda device_type: (device_type == "cpu", True))
    error = training_cli_error([*argv(logs, shard), "--device", "cuda"], monkeypatch, capsys)
    assert error == (
        "error: --device cuda: no cuda device is available on this machine; pass --device cpu to train "
        "on the CPU, or leave --device out to use a GPU when there is one"
    )
    assert not logs.exists()


@pytest.mark.slow
def test_a_resume_with_another_weight_decay_names_it_in_the_dry_run_and_the_run(demo_shards, tmp_path, capsys):
    logs, shard = tmp_path / "logs", demo_shards / "train" / "shard-000000.tar"
    main(argv(logs, shard, "--wd", "0.1"))
    checkpoint = logs / "run" / "checkpoints" / "epoch_1.pt"
    again = argv(logs, shard, "--wd", "0.5", "--epochs", "2", "--resume", "latest")
    expected = [
        f"Resuming {checkpoint} with --{flag}: from step 4 on {what} (the run no longer matches the one the "
        "checkpoint began)"
        for flag, what in (
            ("epochs 1 -> 2", "this changes the run's length and its learning-rate schedule"),
            ("wd 0.1 -> 0.5", "the run goes on with the new value"),
        )
    ]
    capsys.readouterr()
    main([*again, "--dry-run"])
    assert [line for line in capsys.readouterr().err.splitlines() if "Resuming" in line] == [
        f"warning: {line}" for line in expected
    ]
    main(again)
    logged = [
        line.split(" | ")[-1]
        for line in (logs / "run" / "out.log").read_text().splitlines()
        if "| WARNING | Resuming" in line
    ]
    assert logged == expected
