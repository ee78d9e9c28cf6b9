"""Resumes that refuse what they cannot honour (data order, model, loss), the LR schedule across a batch
change, and checkpoints that never crash-loop or fake success: fallback past unreadable files, a clear
error for an unreadable --resume PATH, retried saves, a failing final save, space checks, roll-back."""

import logging
import shutil
import sys
from collections import namedtuple

import pytest
import torch

from helpers.run_utils import losses_by_step, tiny_argv
from training import ConfigError, RunDir
from training import main as entry
from training.main import main
from training.trainer.data import DataPosition
from training.trainer.distributed import DistributedEnv
from training.trainer.engine import checkpoint as ckpt
from training.trainer.engine.checkpoint import CheckpointConfig, Checkpointer, TrainState, run_components
from training.trainer.launch.resume import ResumeError, ResumeRequest, check_resume, translated_position
from training.trainer.run_folder import safe_write
from training.trainer.run_folder.checkpoint_files import load_checkpoint

STEPS_PER_EPOCH = 8


def argv(demo_shards, logs, name, *extra):
    """AdaCL with a 40-feature queue, 2 epochs of 8 steps (batch 32), step_N.pt every 3 steps, each kept."""
    return tiny_argv(
        logs,
        name,
        *("--loss", "adacl", "--adacl-queue-size", "40", "--lr", "2e-3", "--log-every-n-steps", "1"),
        *("--save-every-n-steps", "3", "--keep-step-checkpoints", "0", *extra),
        data=demo_shards / "train" / "shard-{000000..000003}.tar",
        samples=256,
        epochs=2,
        warmup=3,
    )


@pytest.fixture(scope="module")
def base_run(demo_shards, module_tmp):
    """An uninterrupted run: step_{3,6,9,12,15}.pt, epoch_{1,2}.pt."""
    logs = module_tmp("base")
    assert main(argv(demo_shards, logs, "base")).step == 2 * STEPS_PER_EPOCH
    return logs / "base"


def step_checkpoint(base_run, step):
    return str(base_run / "checkpoints" / f"step_{step}.pt")


# ---------------------------------------------------------------------------------------------
# What a resume refuses, and what it allows
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--batch-size", "16"],
            r"step_3.pt is 3 batches into epoch 0 and this run changes --batch-size 32 -> 16: the "
            r"rest of the epoch would see some samples twice and others never; resume with the "
            r"checkpoint's settings, or from a checkpoint at an epoch boundary \(epoch_N.pt\), or "
            r"pass --resume-anyway",
        ),
        (["--workers", "1"], r"changes --workers 0 -> 1: the rest of the epoch"),
        (["--train-num-samples", "384"], r"changes --train-num-samples 256 -> 384: the rest"),
        (["--seed", "1"], r"changes --seed 0 -> 1: the rest"),
        (
            ["--force-context-length", "16"],
            r"holds weights of another architecture \(--force-context-length None -> 16\): "
            r"they cannot load; resume with the checkpoint's values",
        ),
        (
            ["--loss", "clip", "--adacl-queue-size", None],
            r"was trained with --loss adacl, this run has --loss clip: the loss's state cannot carry over; add "
            r"--reset-loss-state to start it afresh \(weights and optimizer are restored\), or resume with --loss adacl",
        ),
        (
            ["--adacl-queue-size", "48"],
            r"its loss state does not fit this run's loss: the loss options changed "
            r"\(queue_size 40 -> 48\); add --reset-loss-state",
        ),
    ],
)
def test_a_resume_that_cannot_be_honoured_is_refused_in_one_line(demo_shards, base_run, tmp_path, extra, message):
    args = argv(demo_shards, tmp_path, "changed", "--resume", step_checkpoint(base_run, 3))
    for flag, value in zip(extra[::2], extra[1::2]):
        position = args.index(flag) if flag in args else None
        if value is None:
            del args[position : position + 2]
        elif position is not None:
            args[position + 1] = value
        else:
            args += [flag, value]
    with pytest.raises(ConfigError, match=message) as refusal:
        main(args)
    assert "\n" not in str(refusal.value)
    assert not (tmp_path / "changed" / "metrics.jsonl").exists()  # refused before training


@pytest.mark.slow
def test_reset_loss_state_accepts_another_loss_or_loss_options(demo_shards, base_run, tmp_path):
    summary = main(
        argv(
            demo_shards,
            tmp_path,
            "reset",
            "--adacl-queue-size",
            "48",
            "--reset-loss-state",
            "--resume",
            step_checkpoint(base_run, 15),
        )
    )
    assert summary.step == 2 * STEPS_PER_EPOCH
    assert "The loss's state starts afresh (--reset-loss-state)" in (tmp_path / "reset" / "out.log").read_text()


def fake_checkpoint(world_size, batches_in_epoch, **args):
    base = {"batch_size": 32, "workers": 0, "model": "adacl-tiny", "loss": "clip", "loss_options": {}}
    return {
        "args": {**base, **args},
        "world_size": world_size,
        "epoch": 1,
        "data": {"epoch": 1, "batches_in_epoch": batches_in_epoch},
    }


def test_a_world_size_change_is_refused_mid_epoch_and_allowed_at_an_epoch_boundary():
    request = ResumeRequest(args=fake_checkpoint(1, 0)["args"], world_size=1)
    with pytest.raises(
        ResumeError,
        match="step_40.pt is 40 batches into epoch 1 and this run changes the world size "
        "2 -> 1: the rest of the epoch would see some samples twice",
    ):
        check_resume(fake_checkpoint(2, 40), "step_40.pt", request)
    assert check_resume(fake_checkpoint(2, 0), "epoch_1.pt", request) == {"world_size": (2, 1)}
    anyway = ResumeRequest(args=request.args, world_size=1, resume_anyway=True)
    assert check_resume(fake_checkpoint(2, 40), "step_40.pt", anyway) == {"world_size": (2, 1)}
    # 40 batches of 2 x 32 samples = 2560 samples into the epoch: batch 80 of 32 samples.
    assert translated_position(fake_checkpoint(2, 40), anyway) == 80


@pytest.mark.slow
def test_resume_anyway_continues_at_the_same_number_of_samples_into_the_epoch(demo_shards, base_run, tmp_path):
    summary = main(
        argv(
            demo_shards,
            tmp_path,
            "anyway",
            "--batch-size",
            "16",
            "--resume-anyway",
            "--resume",
            step_checkpoint(base_run, 3),
        )
    )
    # 3 batches of 32 = 96 samples into epoch 0: batch 6 of 16 samples; 16 batches per epoch now.
    log = (tmp_path / "anyway" / "out.log").read_text()
    assert "continues at batch 6, in its own sample order" in log
    assert summary.step == 3 + (16 - 6) + 16


@pytest.mark.slow
def test_an_epoch_boundary_batch_change_keeps_the_lr_schedule_of_the_samples_trained(demo_shards, base_run, tmp_path):
    """Batch 32 -> 64 after epoch 1: the schedule goes on from the 256 samples trained (OpenCLIP's
    schedule in units of the first launch's global batch), each step now moving it by two units."""
    main(
        argv(
            demo_shards,
            tmp_path,
            "bigger",
            "--batch-size",
            "64",
            "--resume",
            str(base_run / "checkpoints" / "epoch_1.pt"),
        )
    )
    reference = {r["step"]: r["lr"] for r in RunDir(base_run).metrics("train")}
    resumed = [r["lr"] for r in RunDir(tmp_path / "bigger").metrics("train")]
    assert len(resumed) == 4  # 256 samples / 64
    # The k-th step of the resumed epoch (k = 0..3) starts at 256 + 64 k samples = schedule position 8 + 2 k,
    # where the reference's step 9 + 2 k started.
    assert resumed == pytest.approx([reference[9 + 2 * k] for k in range(4)], rel=1e-9)
    assert "Resuming at an epoch boundary with --batch-size 32 -> 64" in (tmp_path / "bigger" / "out.log").read_text()


# ---------------------------------------------------------------------------------------------
# Checkpoints that never crash-loop or fake success
# ---------------------------------------------------------------------------------------------


def copy_run(base_run, tmp_path, name):
    run_dir = tmp_path / name
    shutil.copytree(base_run, run_dir)
    return run_dir


@pytest.mark.slow
def test_resume_latest_falls_back_past_unreadable_checkpoints_naming_them(demo_shards, base_run, tmp_path):
    run_dir = copy_run(base_run, tmp_path, "truncated")
    for name in ("epoch_2.pt", "step_15.pt"):  # the newest two, cut short as by a full disk or a dying copy
        path = run_dir / "checkpoints" / name
        path.write_bytes(path.read_bytes()[:4096])
    summary = main(argv(demo_shards, tmp_path, "truncated", "--resume", "latest"))
    assert summary.step == 2 * STEPS_PER_EPOCH
    log = (run_dir / "out.log").read_text()
    for name in ("epoch_2.pt", "step_15.pt"):
        assert f"Ignoring unreadable checkpoint {run_dir / 'checkpoints' / name}" in log
    assert f"Resumed from {run_dir / 'checkpoints' / 'step_12.pt'}" in log
    assert [r["step"] for r in RunDir(run_dir).metrics("train")] == list(range(1, 17))


def test_an_unreadable_resume_path_is_one_error_naming_it(demo_shards, tmp_path):
    broken = tmp_path / "step_5.pt"
    broken.write_bytes(b"PK\x03\x04 not a whole checkpoint")
    with pytest.raises(
        ConfigError,
        match=rf"--resume {broken}: cannot read the checkpoint \(RuntimeError: .*\); "
        "pass another checkpoint, or --resume latest",
    ):
        main(argv(demo_shards, tmp_path, "broken", "--resume", str(broken)))


@pytest.mark.slow
def test_resume_path_into_its_own_run_rolls_back_and_keeps_the_newer_files(demo_shards, base_run, tmp_path):
    run_dir = copy_run(base_run, tmp_path, "rolled")
    summary = main(argv(demo_shards, tmp_path, "rolled", "--resume", str(run_dir / "checkpoints" / "step_6.pt")))
    assert summary.step == 2 * STEPS_PER_EPOCH
    [folder] = (run_dir / "checkpoints").glob("rolled_back_after_step_6_*")
    assert sorted(p.name for p in folder.iterdir()) == [
        "epoch_1.pt",
        "epoch_2.pt",
        "step_12.pt",
        "step_15.pt",
        "step_9.pt",
    ]
    assert (
        f"moved the newer checkpoints (epoch_1.pt, epoch_2.pt, step_12.pt, step_15.pt, step_9.pt) to {folder}"
        in (run_dir / "out.log").read_text()
    )
    # metrics.jsonl: each step once, the replayed ones with the same losses; params.txt: both launches.
    assert sorted(losses_by_step(run_dir)) == list(range(1, 17))
    assert losses_by_step(run_dir) == pytest.approx(losses_by_step(base_run), rel=1e-5, abs=1e-6)
    assert len(RunDir(run_dir).metrics("epoch")) == 2
    params_txt = (run_dir / "params.txt").read_text()
    assert params_txt.count("# launch at ") == 2 and "resumed from " in params_txt.split("# launch at ")[2]


def tiny_checkpointer(tmp_path, state, **cfg):
    model = torch.nn.Linear(2, 2)
    components = run_components(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        scaler=None,
        loss=torch.nn.Module(),
        state=state,
    )
    return Checkpointer(
        CheckpointConfig(**cfg),
        checkpoint_dir=str(tmp_path),
        components=components,
        env=DistributedEnv(),
        name="n",
        args={},
        model_cfg={},
        preprocess_cfg={},
    )


def test_a_failed_save_is_retried_once(tmp_path, monkeypatch, caplog):
    real_save, attempts = ckpt.save_atomic, []

    def fails_once(payload, path):
        attempts.append(path.name)
        if len(attempts) == 1:
            raise OSError("Stale file handle")
        real_save(payload, path)

    monkeypatch.setattr(ckpt, "save_atomic", fails_once)
    state = TrainState(position=DataPosition(epoch=1), step=8)
    state.start_epoch(num_skip_reasons=1)
    with caplog.at_level(logging.INFO):
        assert tiny_checkpointer(tmp_path, state, total_epochs=1).save_epoch()
    assert attempts == ["epoch_1.pt", "epoch_1.pt"] and load_checkpoint(tmp_path / "epoch_1.pt")["step"] == 8
    assert "retrying once" in caplog.text and "CHECKPOINT SAVE FAILED" not in caplog.text


def test_a_run_whose_final_save_fails_exits_non_zero(demo_shards, tmp_path, monkeypatch, capsys):
    """The final save fails (status 1) while metrics.jsonl cannot be written either: its held-back records get their
    last try and a NOT WRITTEN line before the run stops."""
    real_save, real_open = ckpt.save_atomic, open

    def epoch_saves_fail(payload, path):
        if path.name.startswith("epoch_"):
            raise OSError(28, "No space left on device")
        real_save(payload, path)

    def metrics_refused(path, mode="r", *args, **kwargs):
        if str(path).endswith("metrics.jsonl") and "a" in mode:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(ckpt, "save_atomic", epoch_saves_fail)
    monkeypatch.setattr(safe_write, "open", metrics_refused, raising=False)
    monkeypatch.setattr(sys, "argv", ["training.main", *argv(demo_shards, tmp_path, "full", "--epochs", "1")])
    with pytest.raises(SystemExit) as stop:
        entry.cli()
    assert stop.value.code == 1
    log = (tmp_path / "full" / "out.log").read_text()
    assert log.count("CHECKPOINT SAVE FAILED: could not write") == 1 and log.count("retrying once") == 1
    assert "the run trained all 1 epochs, but its final checkpoint could not be written" in log
    assert f"NOT WRITTEN: {tmp_path / 'full' / 'metrics.jsonl'}: " in log


Usage = namedtuple("Usage", "total used free")


@pytest.mark.parametrize("dry_run", [True, False])
def test_the_checkpoint_folder_must_take_one_checkpoint(demo_shards, tmp_path, monkeypatch, dry_run):
    """12 bytes per parameter of adacl-tiny (3.4 M) plus the queue: about 41 MB; 10 MB free is too little."""
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 10**12 - 10**7, 10**7))
    with pytest.raises(
        ConfigError,
        match=r"checkpoints go to .*/space/checkpoints: one checkpoint needs about "
        r"0.04 GB, 0.01 GB are free there; free space or choose another --logs",
    ):
        main(argv(demo_shards, tmp_path, "space", *(["--dry-run"] if dry_run else [])))
    assert not (tmp_path / "space" / "metrics.jsonl").exists()


def test_logs_that_cannot_hold_a_folder_are_refused_before_training(demo_shards, tmp_path):
    (tmp_path / "logs").write_text("a file where the logs folder should be")
    for extra in (["--dry-run"], []):
        with pytest.raises(ConfigError, match=r"(is a file, not a folder|cannot create .*Not a directory)"):
            main(argv(demo_shards, tmp_path / "logs", "run", *extra))
