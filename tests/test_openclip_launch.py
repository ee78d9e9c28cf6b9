"""OpenCLIP launch scripts run: --torchcompile, one-line errors for unknown flags, torchrun's `--`."""
import subprocess
import sys

import pytest
import torch

from training.checkpoint import load_checkpoint
from training.logger import read_metrics
from training.main import main


@pytest.mark.slow  # about 60 s on 2 cores, nearly all of it compiling
def test_torchcompile_trains_on_the_cpu_and_saves_plain_weights(demo_shards, tmp_path):
    summary = main(["--train-data", str(demo_shards / "train" / "shard-{000000..000003}.tar"),
                    "--train-num-samples", "64", "--model", "adacl-tiny", "--batch-size", "32", "--warmup", "1",
                    "--workers", "0", "--device", "cpu", "--logs", str(tmp_path), "--name", "compiled", "--epochs", "1",
                    "--log-every-n-steps", "1", "--torchcompile"])
    assert "Compiling model..." in (tmp_path / "compiled" / "out.log").read_text()
    losses = [record["loss"] for record in read_metrics(tmp_path / "compiled" / "metrics.jsonl", "train")]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    state_dict = load_checkpoint(summary.checkpoint)["state_dict"]
    assert "logit_scale" in state_dict and not any(key.startswith(("_orig_mod.", "module.")) for key in state_dict)
