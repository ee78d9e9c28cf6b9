"""Checkpoints: atomic writes, crash safety, finding the latest, and exact resume of a training run."""

import logging
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from helpers.counting_loss import COUNTING_LOSS, TESTS_DIR, register_counting_loss
from helpers.run_utils import assert_same_final_state, losses_by_step, tiny_argv
from training import RunDir
from training.main import main
from training.trainer.distributed import DistributedEnv
from training.trainer.engine import checkpoint as ckpt
from training.trainer.engine.checkpoint import CheckpointConfig, Checkpointer, TrainState, run_components
from training.trainer.run_folder.checkpoint_files import (
    checkpoint_candidates,
    load_checkpoint,
    remove_stale_temporary_files,
    save_atomic,
)


def test_rng_states_round_trip_and_load_weights_only(tmp_path):
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    save_atomic({"rng": [ckpt.rng_state()]}, tmp_path / "rng.pt")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(2), np.random.seed(2), random.seed(2)
    ckpt.restore_rng_state(load_checkpoint(tmp_path / "rng.pt")["rng"][0])
    assert torch.equal(torch.rand(3), expected[0])
    assert np.array_equal(np.random.rand(3), expected[1])
    assert random.random() == expected[2]


def test_failed_save_leaves_the_previous_checkpoint_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "epoch_1.pt"
    save_atomic({"step": 1}, path)

    def torch_save_dies_midway(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", torch_save_dies_midway)
    with pytest.raises(OSError, match="No space left"):
        save_atomic({"step": 2}, path)
    assert load_checkpoint(path) == {"step": 1}
    assert os.listdir(tmp_path) == ["epoch_1.pt"]


SLOW_SAVE = textwrap.dedent("""
    import sys, time, torch
    from training.trainer.engine.checkpoint import save_atomic

    class SlowToPickle:
        # torch.save pickles this after writing part of the file; the test kills us meanwhile.
        def __reduce__(self):
            open(sys.argv[2], "w").close()
            time.sleep(60)
            return (int, (0,))

    save_atomic({"step": 2, "weights": torch.zeros(1000), "slow": SlowToPickle()}, sys.argv[1])
""")


@pytest.mark.slow
def test_kill_during_checkpoint_write_leaves_the_previous_checkpoint_loadable(tmp_path):
    path = tmp_path / "step_1.pt"
    save_atomic({"step": 1}, path)
    marker = tmp_path / "writing"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SAVE, str(tmp_path / "step_2.pt"), str(marker)])
    deadline = time.time() + 120
    while not marker.exists():
        assert proc.poll() is None and time.time() < deadline, "the writer never started"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert load_checkpoint(path) == {"step": 1}
    assert not (tmp_path / "step_2.pt").exists()
    assert checkpoint_candidates(tmp_path)[0] == path  # the half-written temp file is ignored


def test_latest_checkpoint_is_the_one_with_most_steps(tmp_path):
    save_atomic({"epoch": 1, "step": 10}, tmp_path / "epoch_1.pt")
    save_atomic({"epoch": 2, "step": 20}, tmp_path / "epoch_2.pt")
    save_atomic({"epoch": 2, "step": 25}, tmp_path / "step_25.pt")
    save_atomic({"epoch": 1, "step": 15}, tmp_path / "step_15.pt")
    save_atomic({"epoch": 2, "step": 20}, tmp_path / "epoch_latest.pt")
    (tmp_path / "notes.pt.txt").write_text("not a checkpoint")
    assert checkpoint_candidates(tmp_path)[0] == tmp_path / "step_25.pt"
    (tmp_path / "step_25.pt").unlink()
    assert checkpoint_candidates(tmp_path)[0].name in ("epoch_2.pt", "epoch_latest.pt")
    (tmp_path / "epoch_3.pt").write_bytes(b"truncated")
    (tmp_path / "step_30.pt").write_bytes((tmp_path / "step_15.pt").read_bytes()[:40])  # named newest, unreadable
    assert checkpoint_candidates(tmp_path)[0].name in ("epoch_2.pt", "epoch_latest.pt")
    assert [p.name for p in checkpoint_candidates(tmp_path)][2:] == ["step_15.pt", "epoch_1.pt"]
    assert checkpoint_candidates(tmp_path / "missing") == []


def test_checkpointer_names_files_like_openclip_and_prunes_with_delete_previous(tmp_path):
    model = torch.nn.Linear(2, 2)
    model.logit_scale = torch.nn.Parameter(torch.zeros(()))
    cfg = CheckpointConfig(
        save_frequency=2, save_most_recent=True, save_every_n_steps=3, delete_previous=True, total_epochs=3
    )
    state = TrainState()
    components = run_components(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        scaler=None,
        loss=torch.nn.Module(),
        state=state,
    )
    checkpointer = Checkpointer(
        cfg,
        checkpoint_dir=str(tmp_path),
        components=components,
        env=DistributedEnv(),
        name="n",
        args={"model": "m"},
        model_cfg={},
        preprocess_cfg={},
    )
    state.start_epoch(num_skip_reasons=1)
    names = []
    for state.step in range(1, 10):  # 3 steps per epoch
        state.position.batches_in_epoch = state.step % 3
        if state.position.batches_in_epoch:
            checkpointer.maybe_save_step()
        else:
            state.finish_epoch()
            checkpointer.save_epoch()
        names.append(sorted(p.name for p in tmp_path.iterdir()))
    # step_3: the end of epoch 1 (not saved every 2 epochs, but epoch_latest); step_6 with epoch_2.pt;
    # step_9 with epoch_3.pt (the last epoch always), each removing the previous step_N.pt and epoch_N.pt.
    assert names[2] == ["epoch_latest.pt", "step_3.pt"]
    assert names[5] == ["epoch_2.pt", "epoch_latest.pt", "step_6.pt"]
    assert names[8] == ["epoch_3.pt", "epoch_latest.pt", "step_9.pt"]
    last = load_checkpoint(tmp_path / "epoch_3.pt")
    assert (last["epoch"], last["step"], last["data"]["epoch"], last["data"]["batches_in_epoch"]) == (3, 9, 3, 0)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_checkpoints_get_the_umask_mode_not_mkstemps(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        save_atomic({"step": 1}, tmp_path / "step_1.pt")
    finally:
        os.umask(previous)
    assert (tmp_path / "step_1.pt").stat().st_mode & 0o777 == mode
    assert load_checkpoint(tmp_path / "step_1.pt") == {"step": 1}


def test_keep_step_checkpoints_keeps_the_newest_k_and_every_epoch_checkpoint(demo_shards, tmp_path):
    previous = os.umask(0o022)
    try:
        main(
            tiny_argv(
                tmp_path,
                "keep",
                *("--save-every-n-steps", "1", "--keep-step-checkpoints", "2"),
                data=demo_shards / "train" / "shard-{000000..000003}.tar",
                samples=64,
                epochs=3,
            )
        )
    finally:
        os.umask(previous)
    checkpoints = tmp_path / "keep" / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("*.pt")) == [
        "epoch_1.pt",
        "epoch_2.pt",
        "epoch_3.pt",
        "step_5.pt",
        "step_6.pt",
    ]  # 2 steps per epoch
    assert {p.stat().st_mode & 0o777 for p in checkpoints.glob("*.pt")} == {0o644}
    assert checkpoint_candidates(checkpoints)[0].name in ("epoch_3.pt", "step_6.pt")


def test_a_run_keeps_three_step_checkpoints_by_default_and_says_the_disk_it_needs(demo_shards, tmp_path, capsys):
    argv = tiny_argv(
        tmp_path,
        "bounded",
        "--save-every-n-steps",
        "1",
        data=demo_shards / "train" / "shard-{000000..000003}.tar",
        samples=64,
        epochs=3,
    )
    main([*argv, "--dry-run"])
    planned = [line for line in capsys.readouterr().out.splitlines() if line.startswith("checkpoints: ")]
    main(argv)
    checkpoints = tmp_path / "bounded" / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("*.pt")) == [
        "epoch_1.pt",
        "epoch_2.pt",
        "epoch_3.pt",
        "step_4.pt",
        "step_5.pt",
        "step_6.pt",
    ]  # 2 steps per epoch
    size = max(p.stat().st_size for p in checkpoints.glob("*.pt")) / 1e9
    logged = [  # the disk is part of the run's plan line, its log's first: "Plan: ...; checkpoints: ..."
        "checkpoints: " + line.split("; checkpoints: ", 1)[1]
        for line in (tmp_path / "bounded" / "out.log").read_text().splitlines()
        if "; checkpoints: " in line
    ]
    assert len(planned) == 1 and logged[0].split(" in ")[0] == planned[0].split(" in ")[0]
    assert re.fullmatch(
        r"checkpoints: about (\d+\.\d\d) GB each, up to 7 at once \(3 epoch_N\.pt, 3 step_N\.pt, one "
        rf"being written\): about \d+\.\d GB in {re.escape(str(checkpoints))}, \d+\.\d GB free there",
        logged[0],
    )
    estimate = float(re.search(r"about (\S+) GB each", logged[0]).group(1))
    assert size / 2 <= max(estimate, 0.005) and estimate <= 2 * size + 0.005  # the estimate sizes the real files


# ---------------------------------------------------------------------------------------------
# Resuming a training run
# ---------------------------------------------------------------------------------------------


def run_argv(demo_shards, logs, name, *extra):
    # 2 epochs of 8 steps (256 samples per epoch, batch 32).
    return tiny_argv(
        logs,
        name,
        *("--loss", COUNTING_LOSS, "--lr", "2e-3", "--log-every-n-steps", "1", "--save-every-n-steps", "3"),
        *("--keep-step-checkpoints", "0", *extra),
        data=demo_shards / "train" / "shard-{000000..000003}.tar",
        samples=256,
        epochs=2,
        warmup=3,
    )


@pytest.fixture(scope="module")
def reference_run(demo_shards, module_tmp):
    """An uninterrupted run; its step checkpoints are the resume points."""
    register_counting_loss()
    logs = module_tmp("reference")
    summary = main(run_argv(demo_shards, logs, "reference"))
    return logs / "reference", summary


@pytest.mark.slow
def test_resume_mid_epoch_continues_exactly(demo_shards, reference_run, tmp_path):
    reference_dir, reference = reference_run
    assert reference.step == 16 and sorted(p.name for p in (reference_dir / "checkpoints").glob("step_*")) == [
        "step_12.pt",
        "step_15.pt",
        "step_3.pt",
        "step_6.pt",
        "step_9.pt",
    ]
    resume_from = reference_dir / "checkpoints" / "step_6.pt"  # 6 of epoch 0's 8 batches consumed
    position = load_checkpoint(resume_from)["data"]
    assert (position["epoch"], position["batches_in_epoch"]) == (0, 6)

    summary = main(run_argv(demo_shards, tmp_path, "resumed", "--resume", str(resume_from)))
    assert (summary.epoch, summary.step) == (2, 16)
    expected, resumed = losses_by_step(reference_dir), losses_by_step(tmp_path / "resumed")
    assert sorted(resumed) == list(range(7, 17))
    for step, loss in resumed.items():
        assert loss == pytest.approx(expected[step], rel=1e-5, abs=1e-6), step
    assert_same_final_state(tmp_path / "resumed", reference_dir)
    # The interrupted epoch's summary counts the steps before the interruption too.
    reference_epochs = RunDir(reference_dir).metrics("epoch")
    resumed_epochs = RunDir(tmp_path / "resumed").metrics("epoch")
    assert resumed_epochs[0]["loss"] == pytest.approx(reference_epochs[0]["loss"], rel=1e-5)


KILLABLE_RUN = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from helpers.counting_loss import register_counting_loss
    register_counting_loss()
    from training.main import main
    main(sys.argv[2:])
""")


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_latest_finishes_the_run(demo_shards, reference_run, tmp_path):
    reference_dir, _ = reference_run
    argv = run_argv(demo_shards, tmp_path, "killed")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLABLE_RUN, TESTS_DIR, *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    checkpoints = tmp_path / "killed" / "checkpoints"
    deadline = time.time() + 240
    while not (checkpoints / "step_9.pt").exists():  # mid-epoch 1
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (checkpoints / "epoch_2.pt").exists()

    summary = main(argv + ["--resume", "latest"])
    assert (summary.epoch, summary.step) == (2, 16)
    assert "Resumed from" in (tmp_path / "killed" / "out.log").read_text()
    assert_same_final_state(tmp_path / "killed", reference_dir)


def test_a_failed_save_is_logged_and_training_continues(demo_shards, tmp_path, monkeypatch):
    register_counting_loss()
    real_save = ckpt.save_atomic

    def step_saves_fail(payload, path):
        if path.name.startswith("step_"):
            raise OSError("No space left on device")
        real_save(payload, path)

    monkeypatch.setattr(ckpt, "save_atomic", step_saves_fail)
    summary = main(run_argv(demo_shards, tmp_path, "full-disk", "--epochs", "1"))
    assert summary.step == 8 and summary.checkpoint.endswith("epoch_1.pt")
    log = (tmp_path / "full-disk" / "out.log").read_text()
    assert log.count("CHECKPOINT SAVE FAILED") == 2 and "No space left on device" in log
    assert sorted(p.name for p in (tmp_path / "full-disk" / "checkpoints").iterdir()) == ["epoch_1.pt"]


def test_the_temporary_files_of_killed_writes_are_removed_and_nothing_else(tmp_path, caplog):
    """A save killed mid-write leaves `.step_5.pt.<8 characters>.tmp` (atomic_file's naming); start-up removes
    those of the run folder and its checkpoints, in one line, and leaves every other file."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    stale = [checkpoints / ".step_5.pt.ny40rcg1.tmp", tmp_path / ".params.txt.a_b3c4d5.tmp"]
    kept = [
        checkpoints / "step_5.pt",
        checkpoints / ".notes.tmp",
        tmp_path / "scratch.tmp",
        checkpoints / ".step_5.pt.short.tmp",
    ]
    for path in stale + kept:
        path.write_bytes(b"x" * 1000)
    with caplog.at_level(logging.INFO):
        assert remove_stale_temporary_files([tmp_path, checkpoints]) == sorted(stale[1:]) + stale[:1]
    assert [path.exists() for path in stale + kept] == [False, False, True, True, True, True]
    [line] = [record.getMessage() for record in caplog.records]
    assert line.startswith("Removed 2 temporary file(s) that a write cut short left (0.0 MB): ")
