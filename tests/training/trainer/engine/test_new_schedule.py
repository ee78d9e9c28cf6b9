"""A new LR schedule is one module: this file declares one, registers it and trains with it through
`training.main`, with no edit anywhere else. It appears in --help and params.txt with its own option
(`--halving-factor`), and the learning rates the run logged are the ones it computes."""

from dataclasses import dataclass
from typing import ClassVar

import pytest

from helpers.registries import scratch_entries
from training import ConfigError, RunDir
from training.main import main
from training.trainer.engine import schedule
from training.trainer.engine.schedule import SchedulerConfig, register_schedule, registered_schedules
from training.trainer.flags import HelpGroup, flag
from training.trainer.launch.params import build_parser

NAME = "halving"


@dataclass(frozen=True)
class HalvingOptions:
    FLAG_GROUP: ClassVar[str] = HelpGroup.OPTIMISATION

    halving_factor: float = flag(0.5, "With --lr-scheduler halving: the factor applied at every step.")


def halving(optimizer, cfg: SchedulerConfig, steps_per_epoch: float, total_steps: float):
    """--lr at the first step, times --halving-factor at every step after it (no warmup)."""

    def set_lr(step):
        lr = cfg.lr * cfg.schedule_options.halving_factor**step
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr

    return set_lr


@pytest.fixture
def registered(monkeypatch):
    """The schedule registered with the real decorator, in a copy of the registry this test throws away."""
    scratch_entries(monkeypatch, schedule.SCHEDULES)
    register_schedule(NAME, "halves the learning rate at every step", options=HalvingOptions)(halving)


def test_a_schedule_declared_in_one_file_trains_through_the_trainer(registered, tmp_path):
    assert NAME in registered_schedules()
    help_text = " ".join(build_parser().format_help().split())  # argparse wraps lines
    assert "'halving' (halves the learning rate at every step)" in help_text
    assert (
        "--halving-factor HALVING_FACTOR With --lr-scheduler halving: the factor applied at every step. "
        "(default: 0.5)" in help_text
    )
    main(
        [
            "--dataset-type",
            "synthetic",
            "--train-num-samples",
            "32",
            "--model",
            "adacl-tiny",
            "--batch-size",
            "8",
            "--epochs",
            "1",
            "--lr",
            "1e-3",
            "--workers",
            "0",
            "--device",
            "cpu",
            "--log-every-n-steps",
            "1",
            "--logs",
            str(tmp_path),
            "--name",
            "halving",
            "--lr-scheduler",
            NAME,
            "--halving-factor",
            "0.25",
        ]
    )
    run = tmp_path / "halving"
    assert {f"lr_scheduler: {NAME}", "halving_factor: 0.25"} <= set((run / "params.txt").read_text().splitlines())
    steps = sorted(RunDir(run).metrics("train"), key=lambda record: record["step"])
    assert [record["lr"] for record in steps] == pytest.approx([1e-3, 2.5e-4, 6.25e-5, 1.5625e-5])


def test_an_unregistered_schedule_is_refused_before_any_work(tmp_path):
    with pytest.raises(ConfigError, match=f"--lr-scheduler '{NAME}' is unknown; choose one of cosine, const"):
        main(
            [
                "--dataset-type",
                "synthetic",
                "--model",
                "adacl-tiny",
                "--device",
                "cpu",
                "--logs",
                str(tmp_path),
                "--lr-scheduler",
                NAME,
                "--dry-run",
            ]
        )


def test_a_name_registered_twice_is_refused(registered):
    with pytest.raises(ValueError, match="LR schedule 'halving' is already registered"):
        register_schedule(NAME, "again")(halving)
    with pytest.raises(TypeError, match="LR schedule 'plain': declare factor with flag"):
        register_schedule(
            "plain",
            "options without flags",
            options=dataclass(frozen=True)(type("Plain", (), {"__annotations__": {"factor": float}, "factor": 0.5})),
        )(halving)
