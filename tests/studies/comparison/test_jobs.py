"""Jobs: the trainer arguments of a run and of the fine-tuning regime's pretraining run, each run's
process (its thread share, a failed outcome when it dies) and AdaCL's mechanism metrics from its log."""

import json
from dataclasses import replace

import pytest

from helpers.comparison_outcomes import fake_data
from open_clip_adacl import get_loss_class
from studies.comparison.data import QUICK
from studies.comparison.jobs import (
    RunJob,
    final_checkpoint,
    launch_job,
    mechanism_metrics,
    plan_jobs,
    pretrain_job,
    train_values,
    worker_environment,
)
from studies.comparison.stats import assess_run
from studies.comparison.variants import parse_loss_variant
from training.trainer.launch import params


def test_generated_flags_are_accepted_by_the_trainer(tmp_path):
    data = fake_data(tmp_path, num_train=512, num_val=64)
    variant = parse_loss_variant("adacl:literal,eps=0.01,modulate=false")
    values = train_values(variant, 3, "run", QUICK, data, tmp_path)
    args = params.args_from_values(values)
    assert vars(params.parse_args(params.argv_from_values(values))) == vars(args)  # the same run as a command line
    assert args.loss == "adacl" and args.seed == 3 and args.batch_size == QUICK.batch_size
    assert (args.loss_options["mode"], args.loss_options["eps"], args.loss_options["modulate"]) == (
        "literal",
        0.01,
        False,
    )
    glofnd = params.args_from_values(train_values(parse_loss_variant("glofnd"), 0, "run", QUICK, data, tmp_path))
    assert glofnd.loss_options["data_size"] == 512


def test_each_run_gets_its_share_of_threads_capped_by_the_callers(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert worker_environment(4)["OMP_NUM_THREADS"] == "4" and worker_environment(32)["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # this machine's rule: oversubscribed OpenMP is ~10x slower
    assert worker_environment(1)["OMP_NUM_THREADS"] == "1" and worker_environment(1)["MKL_NUM_THREADS"] == "1"


@pytest.mark.slow
def test_a_run_whose_process_fails_gets_a_failed_record(tmp_path):
    job = RunJob(
        label="clip",
        loss="clip",
        options={},
        seed=0,
        name="broken",
        train_values={
            "train_data": str(tmp_path / "missing-{0..1}.tar"),
            "model": "adacl-tiny",
            "device": "cpu",
            "workers": 0,
            "logs": str(tmp_path / "runs"),
            "name": "broken",
        },
        logs_dir=str(tmp_path / "runs"),
        data_root=str(tmp_path),
        batch_size=32,
        device="cpu",
        outcome_path=str(tmp_path / "outcomes" / "broken.json"),
    )
    result = assess_run(launch_job(job, jobs=1, timeout=120))
    assert result["verdict"] == "failed" and "do not exist" in result["error"] and result["wall_seconds"] > 0
    assert "do not exist" in (tmp_path / "logs" / "broken.log").read_text()  # with the traceback
    assert json.loads((tmp_path / "outcomes" / "broken.json").read_text())["status"] == "failed"


def test_mechanism_metrics_count_bound_activity_and_margin_spread():
    steps = [
        {
            "stats/i2t/scale_bounded": 1.0,
            "stats/t2i/scale_bounded": 0.0,
            "stats/i2t/m1_over_scale": 1.2,
            "stats/t2i/m1_over_scale": 1.4,
            "stats/i2t/modulated": 1.0,
            "stats/t2i/modulated": 1.0,
        },
        {
            "stats/i2t/scale_bounded": 0.0,
            "stats/t2i/scale_bounded": 0.0,
            "stats/i2t/m1_over_scale": 1.6,
            "stats/t2i/m1_over_scale": 1.8,
            "stats/i2t/modulated": 1.0,
            "stats/t2i/modulated": 0.0,
        },
    ]
    metrics = mechanism_metrics(steps, get_loss_class("adacl").mechanism_stats)
    assert metrics["adacl/scale_bounded"] == 0.25 and metrics["adacl/modulated"] == 0.75
    assert metrics["adacl/m1_over_scale_mean"] == pytest.approx(1.5)
    assert metrics["adacl/m1_over_scale_std"] == pytest.approx(0.2236, rel=1e-3)
    assert mechanism_metrics([{"loss": 1.0}], get_loss_class("adacl").mechanism_stats) == {}
    assert mechanism_metrics(steps, get_loss_class("clip").mechanism_stats) == {}  # clip declares none


def test_fine_tuning_jobs_start_from_the_pretraining_runs_checkpoint(tmp_path):
    data = fake_data(tmp_path, num_train=512, num_val=64)
    budget = replace(
        QUICK, epochs=2, lr=5e-4, pretrain_epochs=8, pretrain_lr=2e-3, trainer_values={"train_group_size": 8}
    )
    pretrain = pretrain_job(budget, data, tmp_path)
    args = params.args_from_values(pretrain.train_values)
    assert (pretrain.loss, args.epochs, args.lr, args.train_group_size) == ("clip", 8, 2e-3, 8)
    with pytest.raises(ValueError, match="left no checkpoint"):
        final_checkpoint(pretrain)
    for epoch in (2, 8):
        (pretrain.run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        (pretrain.run_dir / "checkpoints" / f"epoch_{epoch}.pt").write_bytes(b"")
    checkpoint = final_checkpoint(pretrain)
    assert checkpoint.endswith("epoch_8.pt")
    (job,) = plan_jobs([parse_loss_variant("adacl")], [0], budget, data, tmp_path, checkpoint)
    args = params.parse_args(job.train_argv)  # as an emitted job's torchrun reads it
    assert (args.pretrained, args.epochs, args.lr, args.train_group_size) == (checkpoint, 2, 5e-4, 8)
