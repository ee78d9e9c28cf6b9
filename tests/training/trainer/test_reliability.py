"""Reliability end to end: a 2-rank AdaCL run that crashes, resumes and exports; SIGKILL at any step
loses less than --save-every-n-steps and restores AdaCL's state exactly; hostile shards; clear stops."""

import os
import struct
import subprocess
import sys
import textwrap
import zlib

import pytest

from helpers.data_utils import good, png, write_hostile_shards, write_tar
from helpers.run_utils import assert_same_final_state, kill_run, losses_by_step, torchrun_command, wait_for_step
from training import ConfigError, RunDir
from training.main import main
from training.trainer.run_folder.checkpoint_files import load_checkpoint

STEPS_PER_EPOCH = 8  # in both kinds of killed runs: 256 samples per epoch, global batch 32
SAVE_EVERY = {"torchrun": 5, "single": 3}  # their --save-every-n-steps


def assert_bounded_loss_of_work(run_dir, killed_at, save_every):
    """The resumed run started from the newest step checkpoint, less than `save_every` steps back."""
    log = (run_dir / "out.log").read_text()
    resumed_line = next(line for line in log.splitlines() if "Resumed from" in line)
    resumed_from = int(resumed_line.split("step_")[1].split(".pt")[0])
    assert 0 <= killed_at - resumed_from < save_every, (killed_at, resumed_line)
    steps = [r["step"] for r in RunDir(run_dir).metrics("train")]
    # The killed run's steps up to the checkpoint, then the resumed run's: each step once, none skipped
    # (the killed run's lines after the checkpoint were removed at the resume).
    assert steps == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    return resumed_from


STOCK_OPEN_CLIP_LOAD = textwrap.dedent("""
    import sys, torch, open_clip
    export_dir, checkpoint = sys.argv[1:3]
    model, _, _ = open_clip.create_model_and_transforms("local-dir:" + export_dir)
    assert "open_clip_adacl" not in sys.modules, "the export must load without our package"
    trained = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    loaded = model.state_dict()
    assert sorted(loaded) == sorted(trained)
    assert all(torch.equal(loaded[name], trained[name]) for name in trained)
    features = model.encode_image(torch.zeros(1, 3, *model.visual.image_size))
    print("loaded", tuple(features.shape))
""")


@pytest.mark.slow  # about 65 s on 2 cores: two 2-rank torchrun launches and an export
def test_two_rank_adacl_run_crashes_resumes_and_exports(demo_shards, tmp_path):
    """CI's multi-rank run: torchrun, 2 CPU ranks, --loss adacl with its feature queue; the node dies
    mid-epoch 2 (SIGKILL), `--resume latest` finishes the run, and the export loads in stock open_clip."""
    queue_size = 48
    command, env = torchrun_command(
        demo_shards, tmp_path, "--loss", "adacl", "--adacl-queue-size", str(queue_size), "--epochs", "2"
    )
    run_dir = tmp_path / "ddp"
    with open(tmp_path / "killed.log", "w") as output:
        proc = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_for_step(run_dir, proc, 2 * SAVE_EVERY["torchrun"] + 1)
        finally:
            kill_run(proc)
    killed_at = RunDir(run_dir).steps()[-1]
    assert not (run_dir / "checkpoints" / "epoch_2.pt").exists()

    resume_command, env = torchrun_command(
        demo_shards,
        tmp_path,
        "--loss",
        "adacl",
        "--adacl-queue-size",
        str(queue_size),
        "--epochs",
        "2",
        "--resume",
        "latest",
    )
    result = subprocess.run(resume_command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_bounded_loss_of_work(run_dir, killed_at, SAVE_EVERY["torchrun"])

    final = run_dir / "checkpoints" / "epoch_2.pt"
    checkpoint = load_checkpoint(final)
    assert (checkpoint["epoch"], checkpoint["step"]) == (2, 2 * STEPS_PER_EPOCH)
    loss_state = checkpoint["loss"]
    # Every one of the 16 steps was counted once per direction (modulated or fallen back): the loss's
    # state came back from the checkpoint, neither reset nor counted twice.
    per_direction = loss_state["modulated_steps"] + loss_state["fallback_counts"].sum(dim=1)
    assert per_direction.tolist() == [2 * STEPS_PER_EPOCH] * 2
    assert loss_state["modulated_steps"].min() > 0 and bool(loss_state["ema_valid"].all())
    # The queue took the 32 global features of each of the 16 steps.
    assert int(loss_state["queue_ptr"]) == 2 * STEPS_PER_EPOCH * 32 % queue_size
    assert int(loss_state["queue_filled"]) == queue_size

    export_dir = tmp_path / "export"
    exported = subprocess.run(
        [sys.executable, "-m", "training.export", "--checkpoint", str(final), "--output", str(export_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    loaded = subprocess.run(
        [sys.executable, "-c", STOCK_OPEN_CLIP_LOAD, str(export_dir), str(final)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert "loaded (1, 64)" in loaded.stdout


def adacl_argv(demo_shards, logs, name, *extra):
    """A single-process AdaCL run with its stateful options on: 2 epochs of 8 steps, step_N.pt every 3."""
    return [
        "--train-data",
        str(demo_shards / "train" / "shard-{000000..000003}.tar"),
        "--train-num-samples",
        "256",
        "--model",
        "adacl-tiny",
        "--loss",
        "adacl",
        "--adacl-queue-size",
        "40",
        "--adacl-anchor-prob",
        "progressive",
        "--batch-size",
        "32",
        "--epochs",
        "2",
        "--lr",
        "2e-3",
        "--warmup",
        "3",
        "--workers",
        "0",
        "--device",
        "cpu",
        "--logs",
        str(logs),
        "--name",
        name,
        "--log-every-n-steps",
        "1",
        "--save-every-n-steps",
        str(SAVE_EVERY["single"]),
        *extra,
    ]


@pytest.mark.slow  # about 25 s on 2 cores: an uninterrupted run, a killed process and its resume
def test_sigkill_between_checkpoints_loses_less_than_n_steps_and_restores_adacl_state(demo_shards, tmp_path):
    """Killed between two step checkpoints, `--resume latest` redoes fewer than
    --save-every-n-steps steps and ends exactly where an uninterrupted run ends: same losses, weights,
    optimizer and AdaCL state (smoothed margins, progressive margins, queue, counters)."""
    reference = main(adacl_argv(demo_shards, tmp_path, "reference"))
    assert reference.step == 2 * STEPS_PER_EPOCH

    argv = adacl_argv(demo_shards, tmp_path, "killed")
    run_dir = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "killed.log", "w") as output:
        proc = subprocess.Popen(
            [sys.executable, "-m", "training.main", *argv], env=env, stdout=output, stderr=subprocess.STDOUT
        )
        try:
            # Step 11: two steps after step_9.pt (--save-every-n-steps 3), in epoch 1.
            wait_for_step(run_dir, proc, 3 * SAVE_EVERY["single"] + 2)
        finally:
            kill_run(proc)
    killed_at = RunDir(run_dir).steps()[-1]

    summary = main(argv + ["--resume", "latest"])
    assert (summary.epoch, summary.step) == (2, 2 * STEPS_PER_EPOCH)
    resumed_from = assert_bounded_loss_of_work(run_dir, killed_at, SAVE_EVERY["single"])
    expected, resumed = losses_by_step(tmp_path / "reference"), losses_by_step(run_dir)
    for step in range(resumed_from + 1, 2 * STEPS_PER_EPOCH + 1):
        assert resumed[step] == pytest.approx(expected[step], rel=1e-5, abs=1e-6), step
    assert_same_final_state(run_dir, tmp_path / "reference")  # loss buffers compared with torch.equal
    state = load_checkpoint(run_dir / "checkpoints" / "epoch_2.pt")["loss"]
    assert bool(state["previous_valid"].all()) and int(state["queue_filled"]) == 40


# ---------------------------------------------------------------------------------------------
# Hostile shards end to end
# ---------------------------------------------------------------------------------------------


def bomb_png(side):
    """A PNG whose header claims side x side pixels (a decompression bomb as PIL sees it)."""
    data = bytearray(png())
    data[16:24] = struct.pack(">II", side, side)  # IHDR width, height
    data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))  # IHDR's CRC over type and data
    return bytes(data)


def write_hostile_set(directory):
    """write_hostile_shards' a.tar (bad image, empty / non-UTF-8 / missing caption, missing image, bad json,
    duplicate key), b.tar (truncated), c.tar (a folder), plus d.tar with two decompression bombs and
    e.tar of garbage bytes. Returns (urls, number of good samples, skips per pass over all of them)."""
    urls, good_keys, expected = write_hostile_shards(directory)
    # At the trainer's default limit (PIL's MAX_IMAGE_PIXELS) write_hostile_shards' 40 x 40 "huge"
    # image is a good sample; the bombs: over 2x the limit (PIL raises), and between 1x and 2x (PIL warns).
    write_tar(
        directory / "d.tar", [{**good(200), "png": bomb_png(30000)}, {**good(201), "png": bomb_png(10000)}, good(202)]
    )
    (directory / "e.tar").write_bytes(b"\x00garbage, not a tar" * 64)
    expected = {**expected, "huge_image": 2, "bad_tar": expected["bad_tar"] + 1}
    urls = "::".join([urls, str(directory / "d.tar"), str(directory / "e.tar")])
    return urls, len(good_keys) + 1 + 1, expected  # + the 40 x 40 image, + sample 202


@pytest.mark.slow
def test_training_on_hostile_shards_completes_and_reports_every_skip(demo_shards, tmp_path):
    urls, num_good, expected = write_hostile_set(tmp_path / "hostile")
    num_samples = 512 + num_good
    batch_size = 40
    assert num_samples % batch_size == 0
    # Each epoch takes every good sample, so it reads every shard to its end: the counts are one pass's.
    # (Only a damaged image that the shuffle buffer happens to hold back until after the last good
    # sample would go unread; with this seed none is.)
    summary = main(
        [
            "--train-data",
            f"{demo_shards}/train/shard-{{000000..000003}}.tar::{urls}",
            "--train-num-samples",
            str(num_samples),
            "--dataset-type",
            "webdataset",
            "--model",
            "adacl-tiny",
            "--loss",
            "adacl",
            "--batch-size",
            str(batch_size),
            "--epochs",
            "2",
            "--lr",
            "1e-3",
            "--workers",
            "0",
            "--device",
            "cpu",
            "--logs",
            str(tmp_path),
            "--name",
            "hostile",
        ]
    )
    assert (summary.epoch, summary.step) == (2, 2 * num_samples // batch_size)
    cut_shards = {"b.tar": "bad_tar", "c.tar": "unreadable_shard", "e.tar": "bad_tar"}  # each epoch names them
    epochs = RunDir(tmp_path / "hostile").metrics("epoch")
    log = (tmp_path / "hostile" / "out.log").read_text()
    for epoch, record in enumerate(epochs):
        reported = {name[len("skipped/") :]: count for name, count in record.items() if name.startswith("skipped/")}
        assert reported == {reason: expected.get(reason, 0) for reason in reported}, epoch
        line = next(line for line in log.splitlines() if f"Epoch {epoch} done" in line)
        assert all(f"{reason} {count}" in line for reason, count in expected.items()), line
        cut = {tmp_path / "hostile" / name: reason for name, reason in cut_shards.items()}
        assert record["skipped_shards"] == {str(path): {reason: 1} for path, reason in cut.items()}, epoch
        assert all(f"{path}: {reason} 1" in line for path, reason in cut.items()), line


# ---------------------------------------------------------------------------------------------
# Where training cannot go on: a clear message, no traceback
# ---------------------------------------------------------------------------------------------


def run_cli(*argv):
    return subprocess.run(
        [sys.executable, "-m", "training.main", *argv],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def cli_argv(train_data, logs, *extra):
    return [
        "--train-data",
        train_data,
        "--train-num-samples",
        "16",
        "--model",
        "adacl-tiny",
        "--batch-size",
        "4",
        "--epochs",
        "1",
        "--device",
        "cpu",
        "--logs",
        str(logs),
        "--name",
        "stop",
        *extra,
    ]


def test_no_readable_shard_stops_before_training(tmp_path):
    directory = tmp_path / "shards"
    directory.mkdir()
    (directory / "0.tar").write_bytes(b"garbage" * 100)
    (directory / "1.tar").mkdir()
    # A ConfigError: the command line prints it as one line and exits with status 2 (test_params).
    with pytest.raises(
        ConfigError,
        match=r"training data: none of the 2 shards given by train_data \(--train-data\) "
        "can be read as a tar",
    ):
        main(cli_argv(f"{directory}/{{0..1}}.tar", tmp_path, "--workers", "1"))
    assert not (tmp_path / "stop").exists()


@pytest.mark.slow
def test_shards_without_a_usable_sample_stop_the_run_with_a_clear_message(tmp_path):
    """The shards open and have the fields, but no sample in them is usable (no caption is UTF-8): found in a
    DataLoader worker mid-run. (A field missing from every sample is refused at startup: test_startup.)"""
    directory = tmp_path / "shards"
    directory.mkdir()
    write_tar(directory / "0.tar", [{**good(n), "txt": b"\xff\xfe"} for n in range(8)])
    result = run_cli(*cli_argv(str(directory / "0.tar"), tmp_path, "--workers", "1"))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "| ERROR | training data: rank 0 reader 0 (shards: " in result.stderr
    assert "none of its shards yielded a usable sample" in result.stderr and "non_utf8_caption=8" in result.stderr
    assert "none of its shards yielded a usable sample" in (tmp_path / "stop" / "out.log").read_text()


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--train-num-samples", "40", "--batch-size", "32", "--workers", "2"],
            "40 samples per epoch do not fill one batch per reader",
        ),
        (
            ["--train-num-samples", "64", "--batch-size", "32", "--accum-freq", "4"],
            "an epoch has 2 batches per rank, fewer than --accum-freq 4",
        ),
        (["--loss", "glofnd", "--data-size", "100"], "--data-size 100 is smaller than --train-num-samples 512"),
        (["--loss", "glofnd", "--dry-run"], "--loss glofnd: .*data_size"),  # the dry run builds the loss
        (
            ["--loss", "adacl", "--adacl-anchor-max", "1.5", "--dry-run"],
            "--loss adacl: a fixed --adacl-boundary must lie above --adacl-anchor-max",
        ),
        (
            ["--loss", "adacl", "--adacl-bank-size", "64", "--data-size", "100"],
            "--data-size 100 is smaller than --train-num-samples 512",
        ),
        (["--loss", "adacl", "--adacl-bank-size", "64", "--dry-run"], "--loss adacl: data_size"),
        (
            [
                "--loss",
                "adacl",
                "--adacl-bank-size",
                "64",
                "--adacl-queue-size",
                "64",
                "--data-size",
                "512",
                "--dry-run",
            ],
            "--loss adacl: --adacl-queue-size and --adacl-bank-size are two kinds of extra negatives; set one of them, not "
            "both",
        ),
    ],
)
def test_invalid_settings_are_rejected_before_any_work(demo_shards, tmp_path, extra, message):
    argv = [
        "--train-data",
        str(demo_shards / "train" / "shard-{000000..000003}.tar"),
        "--train-num-samples",
        "512",
        "--model",
        "adacl-tiny",
        "--workers",
        "0",
        "--device",
        "cpu",
        "--logs",
        str(tmp_path),
        "--name",
        "bad",
        *extra,
    ]
    with pytest.raises(ConfigError, match=message):
        main(argv)
    assert not (tmp_path / "bad").exists()


def test_an_unknown_loss_is_named_with_the_choices():
    with pytest.raises(
        ConfigError, match=r"argument --loss: invalid choice: 'adcl' \(choose from 'adacl', 'adaclw', 'clip'"
    ):
        main(["--train-data", "x.tar", "--loss", "adcl"])
