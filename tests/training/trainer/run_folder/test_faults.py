"""Faults a cluster run meets, each injected for real in a tiny CPU run: a full or unwritable logs folder
(records held back and retried, the final checkpoint written), a full disk named as such when a checkpoint
save fails, damaged checkpoints refused by their digest, a second launch of one run, a restart from
scratch that keeps each step recorded once, and a `pipe:` shard whose command stalls."""

import errno
import io
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.run
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

import training.torchrun
from helpers.run_utils import (
    catches,
    children,
    flip_bits,
    kill_run,
    processes_running,
    race_for_a_stale_lock,
    single_rank_argv,
    torchrun_command,
    wait_for_step,
)
from training import ConfigError, RunDir
from training.export import model_card
from training.main import main
from training.trainer.run_folder import lock as lock_module
from training.trainer.run_folder import safe_write
from training.trainer.run_folder.checkpoint_digest import CheckpointDamaged
from training.trainer.run_folder.checkpoint_files import load_checkpoint, save_atomic
from training.trainer.run_folder.lock import RunInUse, RunLock

STEPS_PER_EPOCH = 4  # 128 samples per epoch, batch 32
FIXTURE = Path(__file__).parents[2] / "fixtures" / "legacy_checkpoint"


def argv(demo_shards, logs, name, *extra):
    return single_rank_argv(demo_shards, logs, name, *extra, samples=128)


@pytest.fixture(scope="module")
def base_run(demo_shards, module_tmp):
    """2 epochs of 4 steps, validated after each: step_3.pt, epoch_1.pt, step_6.pt, epoch_2.pt."""
    logs = module_tmp("faults")
    assert main(argv(demo_shards, logs, "base")).step == 2 * STEPS_PER_EPOCH
    return logs / "base"


def train_steps(run_dir):
    return [record["step"] for record in RunDir(run_dir).metrics("train")]


def result_epochs(run_dir):
    return [record["epoch"] for record in RunDir(run_dir).results()]


# ---------------------------------------------------------------------------------------------
# A full or unwritable logs folder
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_full_disk_and_a_revoked_permission_for_the_records_do_not_stop_training(
    demo_shards, tmp_path, monkeypatch, caplog
):
    """metrics.jsonl meets a full disk for its writes 3..6, results.jsonl a permission error for good: training
    goes on, each failure is one line naming the file and the cause, the held-back steps reach metrics.jsonl
    once the disk has room, and the run ends with its final checkpoint, naming what was never written."""
    real_open, metrics_writes = open, []

    def failing_open(path, mode="r", *args, **kwargs):
        if str(path).endswith("metrics.jsonl") and "a" in mode:
            metrics_writes.append(path)
            if 3 <= len(metrics_writes) <= 6:
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
        if str(path).endswith("results.jsonl"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(safe_write, "open", failing_open, raising=False)
    with caplog.at_level(logging.INFO):
        summary = main(argv(demo_shards, tmp_path, "full"))
    run_dir = tmp_path / "full"
    assert summary.step == 2 * STEPS_PER_EPOCH and (run_dir / "checkpoints" / "epoch_2.pt").exists()
    metrics_file = run_dir / "metrics.jsonl"
    assert caplog.text.count(f"Could not write {metrics_file} (disk full ([Errno 28] No space left on device))") == 1
    assert f"{metrics_file} is written again (4 record(s) held back are in it now)" in caplog.text
    assert train_steps(run_dir) == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    results_file = run_dir / "checkpoints" / "results.jsonl"
    assert caplog.text.count(f"Could not write {results_file} (permission denied") == 1
    assert summary.unwritten == [f"{results_file}: 2 record(s) (permission denied ([Errno 13] Permission denied))"]
    assert f"NOT WRITTEN: {results_file}: 2 record(s)" in caplog.text
    assert "1 record file(s) NOT fully written" in caplog.text.splitlines()[-1]


class FullDisk(io.RawIOBase):
    """A file on a disk that fills up after `room` bytes."""

    def __init__(self, file, room):
        self.file, self.room = file, room

    def write(self, data):
        if self.room < len(data):
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.file.write(data)

    def flush(self):
        self.file.flush()

    def fileno(self):
        return self.file.fileno()

    def close(self):
        super().close()
        self.file.close()


def test_a_checkpoint_save_on_a_full_disk_is_reported_as_disk_full(tmp_path, monkeypatch):
    """torch.save reports a failed write as `inline_container.cc ... unexpected pos`; the save names ENOSPC."""
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, mode: FullDisk(real_fdopen(fd, mode), room=100_000))
    with pytest.raises(OSError) as failure:
        save_atomic({"state_dict": {"w": torch.zeros(100_000)}}, tmp_path / "step_1.pt")
    assert failure.value.errno == errno.ENOSPC
    assert safe_write.cause_of(failure.value) == "disk full ([Errno 28] No space left on device)"
    assert list(tmp_path.iterdir()) == []  # the temporary file is gone


# ---------------------------------------------------------------------------------------------
# Damaged checkpoints
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_bit_flipped_checkpoint_is_refused_and_resume_latest_falls_back_past_it(
    demo_shards, base_run, tmp_path, caplog
):
    run_dir = tmp_path / "flipped"
    shutil.copytree(base_run, run_dir)
    newest = run_dir / "checkpoints" / "epoch_2.pt"
    flip_bits(newest)
    with pytest.raises(CheckpointDamaged, match="contents do not match the digest written with it"):
        load_checkpoint(newest)
    with pytest.raises(
        ConfigError,
        match=rf"--resume {newest}: cannot read the checkpoint \(CheckpointDamaged: its "
        "contents do not match the digest",
    ):
        main(argv(demo_shards, tmp_path, "flipped", "--resume", str(newest)))

    summary = main(argv(demo_shards, tmp_path, "flipped", "--resume", "latest"))
    assert summary.step == 2 * STEPS_PER_EPOCH
    log = (run_dir / "out.log").read_text()
    assert f"Skipping unreadable checkpoint {newest} (CheckpointDamaged: its contents do not match" in log
    assert f"Resumed from {run_dir / 'checkpoints' / 'step_6.pt'}" in log
    assert train_steps(run_dir) == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    assert result_epochs(run_dir) == [1, 2]
    load_checkpoint(newest)  # written again, whole


def test_a_checkpoint_without_a_digest_loads_with_one_line(caplog):
    with caplog.at_level(logging.INFO):
        checkpoint = load_checkpoint(FIXTURE / "step_3.pt")
    assert checkpoint["step"] == 3
    assert (
        caplog.text.count(
            "carries no content digest (written before checkpoints had one, or by OpenCLIP); "
            "loaded without verifying its contents"
        )
        == 1
    )


# ---------------------------------------------------------------------------------------------
# One owner per run, one record per step
# ---------------------------------------------------------------------------------------------


HOLD_THE_RUN = (
    "import sys, time; from training.trainer.run_folder.lock import RunLock; "
    "RunLock().acquire(sys.argv[1]); print(flush=True); time.sleep(600)"
)


def test_a_second_launch_of_a_running_run_is_refused_in_one_line(demo_shards, base_run, tmp_path):
    """Another live process holds the run folder (as a first launch does): refused; once it is killed (its
    lock left behind), the next launch takes the run over."""
    run_dir = tmp_path / "twice"
    shutil.copytree(base_run, run_dir)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_RUN, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        holder.stdout.readline()  # the lock is taken
        with pytest.raises(
            ConfigError,
            match=rf"^{run_dir} is in use by PID {holder.pid} on .* \(since .*\): this run "
            "is already training there; wait for that launch to end, or stop it, "
            "before launching the run again$",
        ):
            main(argv(demo_shards, tmp_path, "twice", "--resume", "latest"))
    finally:
        kill_run(holder)
    summary = main(argv(demo_shards, tmp_path, "twice", "--resume", "latest", "--epochs", "3"))
    assert summary.step == 3 * STEPS_PER_EPOCH
    assert f"Taking over {run_dir / 'run.lock'}: its owner, PID {holder.pid}" in (run_dir / "out.log").read_text()
    assert not (run_dir / "run.lock").exists()


@pytest.mark.slow
def test_a_restart_from_scratch_records_each_step_once(demo_shards, base_run, tmp_path):
    """Every checkpoint unreadable: --resume latest starts over and the earlier records go aside."""
    run_dir = tmp_path / "over"
    shutil.copytree(base_run, run_dir)
    for path in (run_dir / "checkpoints").glob("*.pt"):
        path.write_bytes(path.read_bytes()[:4096])
    summary = main(argv(demo_shards, tmp_path, "over", "--resume", "latest"))
    assert summary.step == 2 * STEPS_PER_EPOCH
    assert train_steps(run_dir) == list(range(1, 2 * STEPS_PER_EPOCH + 1))
    assert result_epochs(run_dir) == [1, 2]
    [aside] = run_dir.glob("started_over_*")
    assert sorted(p.name for p in aside.iterdir()) == [
        "epoch_1.pt",
        "epoch_2.pt",
        "metrics.jsonl",
        "results.jsonl",
        "step_3.pt",
        "step_6.pt",
    ]
    assert train_steps(aside) == list(range(1, 2 * STEPS_PER_EPOCH + 1))


def test_a_run_folder_without_a_checkpoint_does_not_block_a_rerun(demo_shards, tmp_path):
    run_dir = tmp_path / "again"
    run_dir.mkdir()
    (run_dir / "out.log").write_text("a launch that stopped before its first checkpoint\n")
    (run_dir / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "epoch": 0, "loss": 9.0}\n')
    summary = main(argv(demo_shards, tmp_path, "again", "--epochs", "1"))
    assert summary.step == STEPS_PER_EPOCH and train_steps(run_dir) == list(range(1, STEPS_PER_EPOCH + 1))
    assert len(list(run_dir.glob("started_over_*/metrics.jsonl"))) == 1


@pytest.mark.slow
def test_a_roll_back_trims_results_and_the_model_card_takes_the_checkpoints_epoch(demo_shards, base_run, tmp_path):
    run_dir = tmp_path / "rolled"
    shutil.copytree(base_run, run_dir)
    main(argv(demo_shards, tmp_path, "rolled", "--resume", str(run_dir / "checkpoints" / "step_3.pt")))
    assert result_epochs(run_dir) == [1, 2]
    assert "results.jsonl: removed 2 lines after epoch 0" in (run_dir / "out.log").read_text()
    results = RunDir(run_dir).results()
    card = model_card(load_checkpoint(run_dir / "checkpoints" / "epoch_1.pt"), results, "org/run")
    assert "Validation after epoch 1 (the trainer's results.jsonl)" in str(card)
    assert "after epoch 2" not in str(card)


# ---------------------------------------------------------------------------------------------
# A stalled pipe: shard
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_stalled_pipe_shard_is_ended_and_skipped_within_the_timeout(demo_shards, tmp_path):
    train = demo_shards / "train"
    shards = [f"pipe:cat {train}/shard-00000{k}.tar" for k in range(2)] + ["pipe:sleep 617"]
    start = time.time()
    summary = main(
        argv(
            demo_shards,
            tmp_path,
            "stalled",
            "--train-data",
            "::".join(shards),
            "--dataset-type",
            "webdataset",
            "--train-num-samples",
            "256",
            "--epochs",
            "1",
            "--shard-timeout",
            "2",
            "--val-data",
            str(demo_shards / "val" / "shard-000000.tar"),
        )
    )
    seconds = time.time() - start
    assert summary.step == 2 * STEPS_PER_EPOCH
    log = (tmp_path / "stalled" / "out.log").read_text()
    assert (
        "shard pipe:sleep 617 ended early (unreadable_shard): ShardStalled('`sleep 617` sent no data for 2 s "
        "(--shard-timeout); it was ended and the shard skipped')"
    ) in log
    [epoch] = RunDir(tmp_path / "stalled").metrics("epoch")
    assert epoch["skipped/unreadable_shard"] == 1
    assert processes_running(b"sleep 617") == []
    assert seconds < 400, seconds  # the stall cost the timeout, not the sleep


# ---------------------------------------------------------------------------------------------
# Changes that alter the run, and exit statuses that tell the truth
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_resume_that_changes_the_schedule_epochs_or_clipping_names_each_change(demo_shards, base_run, tmp_path):
    summary = main(
        argv(
            demo_shards,
            tmp_path,
            "changed",
            "--lr",
            "1e-2",
            "--epochs",
            "3",
            "--grad-clip-norm",
            "1.0",
            "--resume",
            str(base_run / "checkpoints" / "step_3.pt"),
        )
    )
    assert summary.step == 3 * STEPS_PER_EPOCH
    warnings = [
        line.split(" | ")[-1]
        for line in (tmp_path / "changed" / "out.log").read_text().splitlines()
        if "| WARNING | Resuming " in line
    ]
    checkpoint = base_run / "checkpoints" / "step_3.pt"
    changes = [
        ("--lr 0.002 -> 0.01", "the learning-rate schedule"),
        ("--epochs 2 -> 3", "the run's length and its learning-rate schedule"),
        ("--grad-clip-norm None -> 1.0", "gradient clipping"),
    ]
    assert warnings == [
        f"Resuming {checkpoint} with {change}: from step 3 on this changes {what} (the run no longer "
        "matches the one the checkpoint began)"
        for change, what in changes
    ]


@pytest.mark.slow  # 12 s: the trainer's imports, in a process of its own
def test_a_signal_during_startup_stops_the_run_after_its_first_step_with_status_75(demo_shards, tmp_path):
    """SIGTERM while `python -m training.main` still imports torch: remembered, not fatal."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "training.main", *argv(demo_shards, tmp_path, "early")],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not catches(proc.pid, signal.SIGTERM):
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 75, stderr[-3000:]
    assert "Preempted by SIGTERM at step 1 " in (tmp_path / "early" / "out.log").read_text()
    assert (tmp_path / "early" / "checkpoints" / "step_1.pt").exists() and "Traceback" not in stderr


def test_torchrun_ends_with_the_failed_workers_status_in_one_line(monkeypatch, capsys):
    def workers_fail(config):
        raise ChildFailedError(
            "training.main",
            {
                1: ProcessFailure(local_rank=1, pid=7, exitcode=2, error_file=""),
                0: ProcessFailure(local_rank=0, pid=8, exitcode=-15, error_file=""),
            },
        )

    monkeypatch.setattr(torch.distributed.run, "run", workers_fail)
    with pytest.raises(SystemExit) as stop:
        training.torchrun.cli(["--nproc_per_node", "2", "-m", "training.main", "--epochs", "1"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "torchrun: rank 1 exited with status 2 (a configuration error: its `error:` line above says what to change); "
        "the other workers were stopped"
    )


@pytest.mark.slow  # 17 s: two workers import torch
def test_torchrun_keeps_a_workers_configuration_error_status_in_one_line(demo_shards, tmp_path):
    command, env = torchrun_command(demo_shards, tmp_path, "--resume", str(tmp_path / "missing.pt"))
    command[command.index("torch.distributed.run")] = "training.torchrun"
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"error: --resume {tmp_path / 'missing.pt'}: no such file" in result.stderr
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("torchrun: rank ") and last.endswith(
        "exited with status 2 (a configuration error: its `error:` line above says what to change); the other "
        "workers were stopped"
    )


@pytest.mark.slow  # 25 s: a 2-rank run under torchrun
def test_a_rank_that_dies_is_reported_in_one_line_by_the_survivor(demo_shards, tmp_path):
    command, env = torchrun_command(demo_shards, tmp_path, "--epochs", "2", "--dist-timeout", "30")
    command[command.index("torch.distributed.run")] = "training.torchrun"
    with open(tmp_path / "run.log", "w") as output:
        proc = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
        wait_for_step(tmp_path / "ddp", proc, 3)
        os.kill(sorted(children(proc.pid))[1], signal.SIGKILL)
        assert proc.wait(timeout=300) == 128 + signal.SIGKILL
    output = (tmp_path / "run.log").read_text()
    assert "Traceback" not in output, output[-3000:]
    assert "| ERROR | rank 0: a collective with the other ranks failed (" in output
    assert "another rank died or did not answer within --dist-timeout" in output
    assert output.strip().splitlines()[-1] == "torchrun: rank 1 was killed by SIGKILL; the other workers were stopped"


# ---------------------------------------------------------------------------------------------
# A stalled first shard at start-up, dashboards and out.log on a full disk, the stale-lock race,
# surprising run folders
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_stalled_pipe_shard_listed_first_is_skipped_by_the_startup_check(demo_shards, tmp_path, caplog):
    """The start-up field check reads under --shard-timeout as training does: the stalled first shard is ended,
    counted and the next one read; the run trains on the shard that streams."""
    shards = f"pipe:sleep 619::{demo_shards / 'train' / 'shard-000000.tar'}"
    start = time.time()
    with caplog.at_level(logging.WARNING):  # the check runs before out.log exists
        summary = main(
            argv(
                demo_shards,
                tmp_path,
                "first",
                "--train-data",
                shards,
                "--dataset-type",
                "webdataset",
                "--train-num-samples",
                "128",
                "--epochs",
                "1",
                "--shard-timeout",
                "3",
            )
        )
    assert summary.step == STEPS_PER_EPOCH
    assert time.time() - start < 400  # the stall cost the timeout, not the sleep
    assert (
        "shard pipe:sleep 619 ended early (unreadable_shard): ShardStalled('`sleep 619` sent no data for 3 s "
        "(--shard-timeout); it was ended and the shard skipped')"
    ) in caplog.text
    assert processes_running(b"sleep 619") == []


@pytest.mark.slow  # 15 s: the trainer's imports, in a process of its own
def test_sigterm_during_a_stalled_startup_read_stops_the_run_with_status_75(demo_shards, tmp_path):
    """SIGTERM while the start-up check waits on a stalled `pipe:` shard (default --shard-timeout, 300 s): the
    read is ended within seconds, the run takes its first step, saves it and exits with 75."""
    shards = f"pipe:sleep 623::{demo_shards / 'train' / 'shard-000000.tar'}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "training.main",
            *argv(
                demo_shards,
                tmp_path,
                "term",
                "--train-data",
                shards,
                "--dataset-type",
                "webdataset",
                "--train-num-samples",
                "128",
                "--epochs",
                "1",
            ),
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not processes_running(b"sleep 623"):
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    time.sleep(1)  # the check now waits in its read
    proc.send_signal(signal.SIGTERM)
    signalled = time.time()
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 75, stderr[-3000:]
    assert time.time() - signalled < 60
    assert (
        "ShardInterrupted('`sleep 623` was ended while the run waited for its data, for a preemption signal" in stderr
    )  # the check runs before out.log exists
    assert "Preempted by SIGTERM at step 1 " in (tmp_path / "term" / "out.log").read_text()
    assert "Traceback" not in stderr
    assert processes_running(b"sleep 623") == []


@pytest.mark.slow
def test_tensorboard_and_out_log_on_a_full_disk_do_not_stop_training(
    demo_shards, tmp_path, monkeypatch, caplog, capsys
):
    """TensorBoard's writer thread meets a full disk at its 20th record and out.log is /dev/full (every write:
    ENOSPC): one line each naming the file and the cause, training goes on to its final checkpoint, and the
    run's last lines list what was not written."""
    from tensorboard.summary.writer import record_writer

    real_write, records = record_writer.RecordWriter.write, []

    def fills_up(self, data):
        records.append(data)
        if len(records) >= 20:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", fills_up)
    run_dir = tmp_path / "full"
    run_dir.mkdir()
    (run_dir / "out.log").symlink_to("/dev/full")
    with caplog.at_level(logging.INFO):
        summary = main(argv(demo_shards, tmp_path, "full", "--report-to", "tensorboard"))
    assert summary.step == 2 * STEPS_PER_EPOCH and (run_dir / "checkpoints" / "epoch_2.pt").exists()
    tensorboard = run_dir / "tensorboard"
    assert (
        caplog.text.count(
            f"Could not write {tensorboard} (disk full ([Errno 28] No space left on device)); "
            "training goes on without it, the TensorBoard events from step "
        )
        == 1
    )
    assert caplog.text.count(f"Could not write {run_dir / 'out.log'} (disk full") == 1
    assert "--- Logging error ---" not in caplog.text
    [tensorboard_line, log_line] = summary.unwritten
    assert tensorboard_line.startswith(f"{tensorboard}: the TensorBoard events from step ")
    assert log_line.startswith(f"{run_dir / 'out.log'}: ") and " log line(s) (disk full" in log_line
    assert "2 record file(s) NOT fully written" in caplog.records[-1].getMessage()
    assert "Traceback" not in capsys.readouterr().err  # nor the writer thread's own report


@pytest.mark.slow
def test_two_launches_racing_for_a_stale_lock_never_both_hold_it(tmp_path):
    """Twenty trials of two processes taking a dead owner's run.lock at the same moment: one holds it each time."""
    outcomes = race_for_a_stale_lock(tmp_path, trials=20, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert outcomes == ["held+refused"] * 20


def test_a_run_folder_that_takes_no_lock_file_is_one_error_line(demo_shards, base_run, tmp_path):
    """--resume latest into a folder where run.lock cannot be written (here: a folder in its place; a read-only
    folder fails the same way, tests/fault_table.py mounts one): one line, before any step."""
    run_dir = tmp_path / "locked"
    shutil.copytree(base_run, run_dir)
    (run_dir / "run.lock").mkdir()
    with pytest.raises(
        ConfigError,
        match=rf"^cannot write the run's lock {run_dir / 'run.lock'} \(IsADirectoryError: "
        r".*\): a run writes into its folder; make it writable, or choose another "
        r"--logs or --name$",
    ):
        main(argv(demo_shards, tmp_path, "locked", "--resume", "latest"))


def test_a_cut_writes_leftover_in_a_folder_that_refuses_removal_is_named_as_that_folders_problem(
    demo_shards, base_run, tmp_path, monkeypatch
):
    """checkpoints/ read-only (here: removing in it fails with EROFS; tests/fault_table.py mounts one) while it holds
    a killed save's temporary file: the line names that file and the read-only file system, not the run's lock."""
    run_dir = tmp_path / "read-only"
    shutil.copytree(base_run, run_dir)
    leftover = run_dir / "checkpoints" / ".step_5.pt.abcd1234.tmp"
    leftover.write_bytes(b"cut")
    real_unlink = Path.unlink

    def read_only_unlink(path, *args, **kwargs):
        if path.parent == leftover.parent:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", read_only_unlink)
    with pytest.raises(
        ConfigError,
        match=rf"^cannot remove {leftover} that a cut write left \(read-only file system \(\[Errno 30\] "
        r"Read-only file system\)\): the run writes its checkpoints beside it; make that folder writable",
    ):
        main(argv(demo_shards, tmp_path, "read-only", "--resume", "latest"))


def test_a_file_system_out_of_inodes_is_named_so_at_the_start_and_at_a_failed_write(demo_shards, tmp_path, monkeypatch):
    """Bytes free but no inode left (the statvfs of every folder says so here; tests/fault_table.py mounts such a
    tmpfs): the start-up check and a failed write's cause say "no free inodes", not "disk full"."""
    real_statvfs = os.statvfs

    def no_inodes(path):
        stats = list(real_statvfs(path))
        stats[5], stats[6], stats[7] = 16, 0, 0  # f_files, f_ffree, f_favail
        return os.statvfs_result(stats)

    monkeypatch.setattr(os, "statvfs", no_inodes)
    with pytest.raises(ConfigError, match=r"but its file system has no free inodes \(\d+ MB free, but no file can be "):
        main(argv(demo_shards, tmp_path, "no-inodes", "--dry-run"))
    cause = safe_write.cause_of(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "metrics.jsonl")))
    assert re.match(r"^no free inodes \(\d+ MB free, but no file can be created there\) \(\[Errno 28\]", cause)


def test_a_name_outside_logs_is_warned_about_and_an_empty_name_refused(demo_shards, tmp_path, capsys):
    logs = tmp_path / "logs"
    assert main(argv(demo_shards, logs, "../outside", "--dry-run")) is None
    assert (
        f"warning: --name ../outside puts the run outside --logs {logs}: it writes to {tmp_path / 'outside'}; "
        "pass a name inside --logs"
    ) in capsys.readouterr().err
    for name in ("", " ", "."):
        with pytest.raises(ConfigError, match=rf"^--name '{name}' names the --logs folder itself"):
            main(argv(demo_shards, logs, name, "--dry-run"))


@pytest.mark.slow
def test_an_empty_checkpoint_is_named_in_plain_words(demo_shards, base_run, tmp_path, caplog):
    run_dir = tmp_path / "empty"
    shutil.copytree(base_run, run_dir)
    (run_dir / "checkpoints" / "epoch_2.pt").write_bytes(b"")
    with pytest.raises(
        ConfigError,
        match=r"cannot read the checkpoint \(CheckpointEmpty: it is empty \(0 bytes\): a "
        r"save or a copy that stopped before writing anything\)",
    ):
        main(argv(demo_shards, tmp_path, "empty", "--resume", str(run_dir / "checkpoints" / "epoch_2.pt")))
    with caplog.at_level(logging.WARNING):
        assert main(argv(demo_shards, tmp_path, "empty", "--resume", "latest")).step == 2 * STEPS_PER_EPOCH
    assert (
        f"Ignoring unreadable checkpoint {run_dir / 'checkpoints' / 'epoch_2.pt'}: CheckpointEmpty: it is empty (0 "
        "bytes)"
    ) in caplog.text


_HOST_A = """
import fcntl, socket, sys, time
from training.trainer.run_folder import lock
socket.gethostname = lambda: "node-a"
fcntl.flock = lambda fd, operation: None  # a shared file system whose OS locks do not reach other hosts
lock.HEARTBEAT_S = 0.2
lock.RunLock().acquire(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""


def test_a_lock_of_another_host_is_taken_over_only_once_its_heartbeat_is_older_than_the_bound(
    tmp_path, monkeypatch, caplog
):
    """Two fake hosts: node-a holds the run (its heartbeat every 0.2 s) on a file system without shared OS locks;
    node-b is refused while the heartbeat is fresh, and takes the run over, in one line, once node-a's process is
    killed (its node dies) and the heartbeat is older than STALE_AFTER_S (here 1 s)."""
    monkeypatch.setattr(socket, "gethostname", lambda: "node-b")
    monkeypatch.setattr(lock_module, "STALE_AFTER_S", 1.0)
    host_a = subprocess.Popen(
        [sys.executable, "-c", _HOST_A, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        assert host_a.stdout.readline() == "held\n"
        time.sleep(1.5)  # longer than the bound: only the heartbeat keeps the lock young
        refused = r"in use by PID \d+ on node-a .*, another host, whose heartbeat .* is [01] s old: it is taken over "
        with pytest.raises(RunInUse, match=refused + r"once older than 1.0 s"):
            RunLock().acquire(tmp_path)
    finally:
        kill_run(host_a)
    time.sleep(1.5)
    with caplog.at_level(logging.WARNING), RunLock() as held:
        held.acquire(tmp_path)
        owner = json.loads((tmp_path / "run.lock").read_text())
    assert owner["host"] == "node-b" and owner["pid"] == os.getpid()
    assert re.search(
        r"Taking over .*run.lock: its owner, PID \d+ on node-a .*, another host, has not refreshed its "
        r"heartbeat for \d+ s \(more than 1.0 s\): that run is over",
        caplog.text,
    )


class _CallsPrint:
    def __reduce__(self):
        return print, ("this ran while loading",)


@pytest.mark.parametrize("case", ["lr", "beta2", "dev_zero", "fifo", "folder", "architecture", "pickle"])
def test_bad_input_is_one_line_in_plain_words(demo_shards, base_run, tmp_path, case):
    """Each refused before any step in one line naming the problem: AdamW's rules, a --resume that is no regular
    file, weights of another architecture, and a pickle, whose refusal never quotes torch's advice to load it anyway."""
    os.mkfifo(tmp_path / "fifo")
    torch.save({"state_dict": _CallsPrint()}, tmp_path / "code.pt")
    extra, expected = {
        "lr": (["--lr", "-1"], r"^--lr must be >= 0 \(AdamW's rule\), got -1.0$"),
        "beta2": (["--beta2", "1"], r"^--beta2 must be in \[0, 1\) \(AdamW's rule\), got 1.0$"),
        "dev_zero": (["--resume", "/dev/zero"], r"^--resume /dev/zero: not a regular file \(a device or a pipe\)"),
        "fifo": (
            ["--resume", str(tmp_path / "fifo")],
            r": not a regular file \(a device or a pipe\), not a checkpoint",
        ),
        "folder": (["--resume", str(tmp_path)], r": a folder, not a checkpoint file; pass an existing checkpoint"),
        "architecture": (
            ["--model", "ViT-B-32", "--pretrained", str(base_run / "checkpoints" / "epoch_2.pt")],
            r"was trained as --model adacl-tiny, and --model is ViT-B-32: its weights do not fit that "
            r"architecture; pass --model adacl-tiny, or weights of ViT-B-32$",
        ),
        "pickle": (
            ["--pretrained", str(tmp_path / "code.pt")],
            r"\(UnpicklingError: not a file of tensors and plain values, all a checkpoint is loaded as \(a "
            r"pickle's code never runs here\): Unsupported global: GLOBAL print was not an allowed "
            r"global by default\); pass an epoch_N.pt",
        ),
    }[case]
    with pytest.raises(ConfigError, match=expected) as refusal:
        main(argv(demo_shards, tmp_path, "bad", *extra))
    assert "weights_only" not in str(refusal.value) and "\n" not in str(refusal.value)


def test_automatic_run_names_of_the_same_second_differ_by_job_or_pid(monkeypatch):
    """Launches without --name in one second (a job array's tasks) once shared a folder and all but one were
    refused: the automatic name ends with the SLURM job id, or outside SLURM rank 0's PID. The clock it reads is
    stopped here at one instant (tests/fault_table.py's same_second_launches row launches three for real)."""
    from datetime import datetime

    from training.trainer.distributed import DistributedEnv
    from training.trainer.launch import folder
    from training.trainer.launch.params import config_from_values, given_values

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 1, 1, 12, 0, 0, tzinfo=tz)

    monkeypatch.setattr(folder, "datetime", Frozen)
    cfg = config_from_values(given_values(["--train-data", "/data/shard.tar", "--model", "adacl-tiny"]))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    outside_slurm = folder.default_run_name(cfg, DistributedEnv())
    monkeypatch.setenv("SLURM_JOB_ID", "4243")
    in_a_job = folder.default_run_name(cfg, DistributedEnv())
    assert outside_slurm.startswith("2026_01_01-12_00_00-model_adacl-tiny-") and in_a_job.startswith(
        "2026_01_01-12_00_00"
    )
    assert outside_slurm.endswith(f"-p_fp32-pid_{os.getpid()}") and in_a_job.endswith("-p_fp32-job_4243")
