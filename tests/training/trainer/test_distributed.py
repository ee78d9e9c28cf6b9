"""Distributed training: DDP gradients vs one process, SLURM/torchrun detection, a 2-rank torchrun run."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from helpers.distributed_utils import free_port, run_on_ranks
from helpers.run_utils import torchrun_command
from open_clip_adacl import DistributedSetup, create_loss
from training.trainer.data import Batch
from training.trainer.data.samples import no_skips
from training.trainer.distributed import DistributedEnv, first_slurm_host, unwrap_model, wrap_ddp
from training.trainer.engine.loop import forward_backward
from training.trainer.engine.model import ModelConfig, build_model
from training.trainer.engine.precision import build_precision

BATCH = 8


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(BATCH, 3, 32, 32, generator=g)
    texts = torch.randint(1, 1000, (BATCH, 24), generator=g)
    return Batch(images, texts, torch.arange(BATCH), no_skips())


def _trainer_step(model, world_size=1, rank=0, local_loss=False, gather_with_grad=False, batch=None):
    """One trainer step's loss and gradients (the trainer's own model builder and forward/backward)."""
    loss_fn = create_loss(
        "clip",
        dist=DistributedSetup(
            rank=rank, world_size=world_size, local_loss=local_loss, gather_with_grad=gather_with_grad
        ),
    )
    out = forward_backward(model, loss_fn, [batch], build_precision("fp32", torch.device("cpu")))
    grads = {name: p.grad.clone() for name, p in unwrap_model(model).named_parameters() if p.grad is not None}
    return {"loss": out.loss, **grads}


def _fresh_model():
    torch.manual_seed(0)
    return build_model(ModelConfig("adacl-tiny"), torch.device("cpu")).model


REGIMES = [(True, True), (False, False)]  # (local_loss, gather_with_grad)


def _ddp_rank(rank, world_size):
    """This rank's gradients after one DDP step on its half of the batch, in both regimes."""
    torch.set_num_threads(1)
    full = _batch()
    per_rank = BATCH // world_size
    own = slice(rank * per_rank, (rank + 1) * per_rank)
    results = {}
    for local_loss, gather_with_grad in REGIMES:
        model = wrap_ddp(_fresh_model(), DistributedEnv(rank=rank, world_size=world_size))
        results[local_loss, gather_with_grad] = _trainer_step(
            model,
            world_size,
            rank,
            local_loss,
            gather_with_grad,
            Batch(full.images[own], full.texts[own], full.sample_index[own], no_skips()),
        )
    return results


@pytest.fixture(scope="module")
def ddp_gradients():
    return run_on_ranks(_ddp_rank, 2)


@pytest.mark.parametrize("local_loss, gather_with_grad", REGIMES)
def test_ddp_step_gradients_match_one_process_on_the_concatenated_batch(ddp_gradients, local_loss, gather_with_grad):
    torch.set_num_threads(1)
    reference = _trainer_step(_fresh_model(), batch=_batch())
    ranks = [dict(results[local_loss, gather_with_grad]) for results in ddp_gradients]
    # The loss: with --local-loss each rank's covers its own rows (their mean is the global loss);
    # otherwise every rank computes the global loss.
    losses = torch.stack([r.pop("loss") for r in ranks])
    torch.testing.assert_close(losses.mean() if local_loss else losses[0], reference.pop("loss"))
    if not local_loss:
        assert losses[0] == losses[1]
    # DDP averages gradients, so both ranks hold the same ones.
    for name in reference:
        torch.testing.assert_close(ranks[0][name], ranks[1][name], rtol=0, atol=0)
    for name, expected in reference.items():
        if not gather_with_grad and name != "logit_scale":
            # OpenCLIP's default regime: every rank computes the global loss but its gradient reaches
            # only the rank's own features, so after DDP's averaging the towers get 1/world_size of
            # the single-process gradient (logit_scale, local to every rank, gets all of it).
            expected = expected / 2
        # atol 5e-6: sums taken in another order (gather, DDP's all-reduce) move single elements of the
        # token embedding's gradient by ~1.3e-6 on some CPUs (1 of its 3.2M entries, seen on an AMD EPYC).
        torch.testing.assert_close(ranks[0][name], expected, rtol=1e-4, atol=5e-6, msg=lambda m: f"{name}: {m}")


def test_gradient_accumulation_matches_one_large_batch():
    batch = _batch()
    reference = _trainer_step(_fresh_model(), batch=batch)
    reference.pop("loss")
    model = _fresh_model()
    loss_fn = create_loss("clip")
    halves = [
        Batch(batch.images[s], batch.texts[s], batch.sample_index[s], no_skips()) for s in (slice(0, 4), slice(4, 8))
    ]
    forward_backward(model, loss_fn, halves, build_precision("fp32", torch.device("cpu")))
    for name, p in model.named_parameters():
        # As in OpenCLIP, the loss runs once per micro-batch, each time with the live logit_scale.
        expected = reference[name] * (2 if name == "logit_scale" else 1)
        torch.testing.assert_close(p.grad, expected, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "nodelist, host",
    [
        ("gpu[003-005,9],cpu1", "gpu003"),
        ("node7", "node7"),
        ("a[1,2]", "a1"),
        ("localhost", "localhost"),
    ],
)
def test_first_slurm_host(nodelist, host):
    assert first_slurm_host(nodelist) == host


SLURM_RANK = textwrap.dedent("""
    import torch, torch.distributed as dist
    from training.trainer.distributed import init_distributed
    env = init_distributed("cpu")
    total = torch.tensor([float(env.rank)])
    dist.all_reduce(total)
    print(f"rank={env.rank} local={env.local_rank} world={env.world_size} sum={int(total.item())} "
          f"backend={dist.get_backend()}")
    dist.destroy_process_group()
""")


def test_slurm_environment_is_detected():
    """Two processes with srun's variables (no RANK/WORLD_SIZE; MASTER_ADDR from SLURM_NODELIST) form a group."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))
    }
    port = free_port()
    procs = []
    for rank in range(2):
        env = {
            **base,
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": str(rank),
            "SLURM_NODELIST": "localhost",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", SLURM_RANK], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    for rank, output in enumerate(outputs):
        assert f"rank={rank} local={rank} world=2 sum=1 backend=gloo" in output, output


def _torchrun(demo_shards, logs, *extra):
    command, env = torchrun_command(demo_shards, logs, *extra)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def _first_epoch(demo_shards, logs):
    from training import RunDir
    from training.trainer.run_folder.checkpoint_files import load_checkpoint

    result = _torchrun(demo_shards, logs, "--epochs", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    run = logs / "ddp"
    steps = RunDir(run).metrics("train")
    assert [r["step"] for r in steps] == list(range(1, 9))  # 256 samples / (2 ranks x 16) per epoch
    assert steps[0]["samples_per_second"] == pytest.approx(32 / steps[0]["batch_time"])
    checkpoint = load_checkpoint(run / "checkpoints" / "epoch_1.pt")
    assert not any(key.startswith("module.") for key in checkpoint["state_dict"])
    assert len(checkpoint["rng"]) == 2 and checkpoint["step"] == 8
    return run


@pytest.mark.slow
def test_torchrun_two_ranks_train_and_checkpoint(demo_shards, tmp_path):
    _first_epoch(demo_shards, tmp_path)


@pytest.mark.slow
def test_torchrun_two_ranks_resume_latest(demo_shards, tmp_path):
    from training import RunDir
    from training.trainer.run_folder.checkpoint_files import load_checkpoint

    run = _first_epoch(demo_shards, tmp_path)
    result = _torchrun(demo_shards, tmp_path, "--epochs", "2", "--resume", "latest")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in RunDir(run).metrics("train")] == list(range(1, 17))
    assert load_checkpoint(run / "checkpoints" / "epoch_2.pt")["step"] == 16


@pytest.mark.slow
def test_ranks_announced_by_slurm_that_never_arrive_stop_the_run_within_dist_timeout(demo_shards, tmp_path):
    """`SLURM_NTASKS=2 SLURM_PROCID=0 python -m training.main` without srun: rank 1 never comes."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))
    }
    env.update(
        SLURM_NTASKS="2",
        SLURM_PROCID="0",
        SLURM_LOCALID="0",
        SLURM_NODELIST="localhost",
        MASTER_PORT=str(free_port()),
        OMP_NUM_THREADS="1",
    )
    argv = [
        "--train-data",
        str(demo_shards / "train" / "shard-{000000..000003}.tar"),
        "--train-num-samples",
        "256",
        "--model",
        "adacl-tiny",
        "--batch-size",
        "16",
        "--workers",
        "0",
        "--device",
        "cpu",
        "--logs",
        str(tmp_path),
        "--name",
        "alone",
        "--dist-timeout",
        "2",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "training.main", *argv], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.startswith(
        "error: rank 0 of 2 (SLURM_NTASKS=2): the other ranks did not join the rendezvous at localhost:"
    ), result.stderr
    assert "within --dist-timeout 2 s" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
