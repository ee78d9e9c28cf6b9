"""Synthetic inputs for the loss comparison's tests (tests/studies/comparison/): a tiny budget, data
paths, run outcomes and a report context."""

import math

from studies.comparison.data import QUICK, Budget, data_from_manifest
from studies.comparison.report import ReportContext
from studies.comparison.stats import assess_run

# The sizes of the `demo_shards` fixture (tests/conftest.py), so the runner reuses it as its data.
TINY = Budget(
    num_train=512,
    num_val=128,
    num_test=128,
    shard_size=128,
    batch_size=32,
    epochs=1,
    lr=2e-3,
    warmup=2,
    wd=0.1,
    workers=0,
    device="cpu",
    jobs=1,
    log_every_n_steps=1,
)


def fake_data(root, *, num_train, num_val):
    """ComparisonData as `prepare_data` reads it from a manifest (train keys first, then val)."""
    return data_from_manifest(
        root,
        {
            "splits": {
                "train": {"data": "train/shard.tar", "num_samples": num_train, "keys": [0, num_train]},
                "val": {"data": "val/shard.tar", "num_samples": num_val, "keys": [num_train, num_train + num_val]},
            }
        },
    )


def outcome(
    label="clip",
    seed=0,
    *,
    status="ok",
    loss=1.2,
    val_loss=1.5,
    i2t=0.3,
    t2i=0.3,
    batch=64,
    code="git 0123456789",
    **metrics,
):
    values = {
        "train/final_loss": loss,
        "val/clip_loss": val_loss,
        "val/i2t_R@1": i2t,
        "val/t2i_R@1": t2i,
        "clone/color": 0.7,
        "clone/overall": 0.6,
        **metrics,
    }
    return {
        "label": label,
        "loss": label.split(":")[0],
        "options": {},
        "seed": seed,
        "name": f"{label}-seed{seed}",
        "status": status,
        "error": None if status == "ok" else "boom",
        "batch_size": batch,
        "train_seconds": 10.0,
        "eval_seconds": 2.0,
        "wall_seconds": 15.0,
        "val_num_samples": 512,
        "code": code,
        "metrics": values,
    }


def assessed_outcomes():
    """A: 2 ok runs and 1 collapsed run with wild numbers; B: 3 ok; C: all collapsed; D: one failed of two."""
    chance = 1 / 512
    return [
        assess_run(r)
        for r in [
            outcome("A", 0, i2t=0.30, **{"clone/overall": 0.60}),
            outcome("A", 1, i2t=0.34, **{"clone/overall": 0.64}),
            outcome("A", 2, val_loss=math.log(64), i2t=chance, t2i=chance, **{"clone/overall": 0.99}),
            outcome("B", 0, i2t=0.20, **{"clone/overall": 0.70}),
            outcome("B", 1, i2t=0.22, **{"clone/overall": 0.72}),
            outcome("B", 2, i2t=0.24, **{"clone/overall": 0.74}),
            outcome("C", 0, val_loss=math.log(64), i2t=chance, t2i=chance),
            outcome("C", 1, val_loss=math.log(64), i2t=chance, t2i=chance),
            outcome("D", 0, status="failed"),
            outcome("D", 1, i2t=0.1),
        ]
    ]


def report_context(tmp_path):
    data = fake_data(tmp_path / "data", num_train=4096, num_val=512)
    machine = {
        "cpu": "Test CPU",
        "cores": "2",
        "python": "3.11",
        "torch": "2.x",
        "open_clip": "3.3.0",
        "clip_benchmark": "1.6.2",
        "load": "1.0",
        "code": "git abc",
    }
    return ReportContext(
        command="python -m studies.comparison --quick --seeds 0,1,2",
        budget=QUICK,
        data=data,
        data_seed=0,
        seeds=[0, 1, 2],
        wall_seconds=600.0,
        machine=machine,
        started="today",
    )
