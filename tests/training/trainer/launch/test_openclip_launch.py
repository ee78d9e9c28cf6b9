"""OpenCLIP launch scripts run: --torchcompile, one-line errors for unknown flags, torchrun's `--`."""

import subprocess
import sys

import pytest
import torch

from helpers.run_utils import tiny_argv
from training import RunDir
from training.main import main
from training.torchrun import with_separator
from training.trainer.run_folder.checkpoint_files import load_checkpoint


@pytest.mark.slow  # about 60 s on 2 cores, nearly all of it compiling
def test_torchcompile_trains_on_the_cpu_and_saves_plain_weights(demo_shards, tmp_path):
    summary = main(
        tiny_argv(
            tmp_path,
            "compiled",
            *("--log-every-n-steps", "1", "--torchcompile"),
            data=demo_shards / "train" / "shard-{000000..000003}.tar",
            samples=64,
        )
    )
    assert "Compiling model..." in (tmp_path / "compiled" / "out.log").read_text()
    losses = [record["loss"] for record in RunDir(tmp_path / "compiled").metrics("train")]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    state_dict = load_checkpoint(summary.checkpoint)["state_dict"]
    assert "logit_scale" in state_dict and not any(key.startswith(("_orig_mod.", "module.")) for key in state_dict)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (
            ["--nproc_per_node", "2", "-m", "training.main", "--logs", "L"],
            ["--nproc_per_node", "2", "-m", "training.main", "--", "--logs", "L"],
        ),
        (
            ["--standalone", "--module", "training.main", "--", "--logs", "L"],
            ["--standalone", "--module", "training.main", "--", "--logs", "L"],
        ),
    ],
)
def test_the_launcher_puts_a_separator_after_the_trainer_module(argv, expected):
    assert with_separator(argv) == expected


@pytest.mark.slow
def test_torchrun_launcher_runs_the_trainer_without_a_separator(demo_shards, tmp_path):
    """`--logs` right after the module: plain torchrun refuses it as ambiguous, training.torchrun passes it on."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.torchrun",
            "--standalone",
            "--nproc_per_node",
            "1",
            "-m",
            "training.main",
            "--logs",
            str(tmp_path),
            "--train-data",
            str(demo_shards / "train" / "shard-{000000..000003}.tar"),
            "--model",
            "adacl-tiny",
            "--batch-size",
            "32",
            "--workers",
            "0",
            "--device",
            "cpu",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "dry run OK: --model adacl-tiny --loss clip" in result.stdout
