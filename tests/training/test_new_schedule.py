"""A new LR schedule is one module: this file declares one, registers it and trains with it through
`training.main`, with no edit anywhere else. It appears in --help and params.txt, and the learning rates
the run logged are the ones it computes."""
import pytest

from training import schedule
from training.run_dir import RunDir
from training.main import main
from training.params import ConfigError, build_parser
from training.schedule import SchedulerConfig, register_schedule, registered_schedules
from helpers.registries import scratch_entries

NAME = "halving"


def halving(optimizer, cfg: SchedulerConfig, steps_per_epoch: float, total_steps: float):
    """--lr at the first step, halved at every step after it (no warmup)."""
    def set_lr(step):
        lr = cfg.lr * 0.5 ** step
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr

    return set_lr


@pytest.fixture
def registered(monkeypatch):
    """The schedule registered with the real decorator, in a copy of the registry this test throws away."""
    scratch_entries(monkeypatch, schedule.SCHEDULES)
    register_schedule(NAME, "halves the learning rate at every step")(halving)


def test_a_schedule_declared_in_one_file_trains_through_the_trainer(registered, tmp_path):
    assert NAME in registered_schedules()
    help_text = " ".join(build_parser().format_help().split())  # argparse wraps lines
    assert "'halving' (halves the learning rate at every step)" in help_text
    main(["--dataset-type", "synthetic", "--train-num-samples", "32", "--model", "adacl-tiny", "--batch-size", "8",
          "--epochs", "1", "--lr", "1e-3", "--workers", "0", "--device", "cpu", "--log-every-n-steps", "1",
          "--logs", str(tmp_path), "--name", "halving", "--lr-scheduler", NAME])
    run = tmp_path / "halving"
    assert f"lr_scheduler: {NAME}" in (run / "params.txt").read_text().splitlines()
    steps = sorted(RunDir(run).metrics("train"), key=lambda record: record["step"])
    assert [record["lr"] for record in steps] == pytest.approx([1e-3, 5e-4, 2.5e-4, 1.25e-4])


def test_an_unregistered_schedule_is_refused_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match=f"--lr-scheduler '{NAME}' is unknown; choose one of cosine, const"):
        main(["--dataset-type", "synthetic", "--model", "adacl-tiny", "--device", "cpu", "--logs", str(tmp_path),
              "--lr-scheduler", NAME, "--dry-run"])


def test_a_name_registered_twice_is_refused(registered):
    with pytest.raises(ValueError, match="LR schedule 'halving' is already registered"):
        register_schedule(NAME, "again")(halving)
