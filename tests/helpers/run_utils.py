"""Helpers for tests that run the trainer as a process and interrupt it: torchrun commands, waiting for a
logged step, killing a run with its workers, comparing a resumed run's end with an uninterrupted one, and two
launches racing for a stale run lock."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from helpers.distributed_utils import free_port
from training import RunDir
from training.trainer.launch.params import argv_from_values
from training.trainer.run_folder.checkpoint_files import load_checkpoint


def torchrun_command(demo_shards, logs, *extra, name="ddp"):
    """(command, environment) of `torchrun --nproc_per_node 2 -m training.main -- ...` on the CPU: run
    `name` under `logs`, 8 steps per epoch (`--` keeps --logs ours)."""
    values = {
        "train_data": str(demo_shards / "train" / "shard-{000000..000003}.tar"),
        "train_num_samples": 256,
        "model": "adacl-tiny",
        "batch_size": 16,
        "lr": 1e-3,
        "warmup": 2,
        "workers": 0,
        "device": "cpu",
        "logs": str(logs),
        "name": name,
        "log_every_n_steps": 1,
        "save_every_n_steps": 5,
        "local_loss": True,
        "gather_with_grad": True,
    }
    argv = [*argv_from_values(values), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for variable in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(variable, None)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "-m",
        "training.main",
        "--",
        *argv,
    ]
    return command, env


def children(pid):
    """Direct child processes of `pid` (torchrun starts its workers in their own sessions)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def wait_for_step(run_dir, proc, step, timeout=300):
    """Wait until the run in `run_dir` has logged `step` (or more)."""
    deadline = time.time() + timeout
    while not (RunDir(run_dir).steps() or [0])[-1] >= step:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert time.time() < deadline, f"step {step} not reached in {timeout} s"
        time.sleep(0.05)


def running(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until_gone(pids, timeout=60):
    """Wait until none of `pids` runs (they need not be our children: init reaps orphans)."""
    deadline = time.time() + timeout
    while any(running(pid) for pid in pids):
        assert time.time() < deadline, f"still running after {timeout} s: {[p for p in pids if running(p)]}"
        time.sleep(0.05)


def kill_run(proc, timeout=60):
    """SIGKILL a run and its workers at once, as when its node dies; returns when all are gone."""
    if proc.poll() is not None:
        return  # it ended by itself (the test has failed already)
    workers = children(proc.pid)
    for pid in [*workers, proc.pid]:
        os.kill(pid, signal.SIGKILL)
    proc.wait()
    wait_until_gone(workers, timeout)


def losses_by_step(run_dir):
    return {r["step"]: r["loss"] for r in RunDir(run_dir).metrics("train")}


def assert_same_final_state(run_dir, reference_dir, checkpoint="epoch_2.pt"):
    """The run ended where the reference ended: same step, loss state (exactly), weights and optimizer."""
    ours = load_checkpoint(run_dir / "checkpoints" / checkpoint)
    theirs = load_checkpoint(reference_dir / "checkpoints" / checkpoint)
    assert (ours["epoch"], ours["step"]) == (theirs["epoch"], theirs["step"])
    for key, value in theirs["loss"].items():
        assert torch.equal(ours["loss"][key], value), key
    for key, value in theirs["state_dict"].items():
        torch.testing.assert_close(ours["state_dict"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    for index, state in theirs["optimizer"]["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(ours["optimizer"]["state"][index][key], value, rtol=1e-5, atol=1e-7)


def digest(state_dict):
    """sha256 of a state dict's names and values."""
    h = hashlib.sha256()
    for name, tensor in sorted(state_dict.items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def tiny_argv(logs, name, *extra, data=None, samples=None, batch_size=32, epochs=1, warmup=1):
    """A tiny run of adacl-tiny in one process on the CPU (no loader workers), named `name` under `logs`: on `data`
    (`--train-data`, when given), `samples` an epoch (`--train-num-samples`, when given: else all of `data`),
    `epochs` of them (None: the trainer's default), then `extra` (a flag given again there wins)."""
    return [
        *(["--train-data", str(data)] if data is not None else []),
        *(["--train-num-samples", str(samples)] if samples is not None else []),
        *(["--epochs", str(epochs)] if epochs is not None else []),
        "--model",
        "adacl-tiny",
        "--batch-size",
        str(batch_size),
        "--warmup",
        str(warmup),
        "--workers",
        "0",
        "--device",
        "cpu",
        "--logs",
        str(logs),
        "--name",
        name,
        *extra,
    ]


def single_rank_argv(demo_shards, logs, name, *extra, samples=256, batch_size=32, epochs=2, save_every=3):
    """A single-process AdaCL run (its queue on) on the demo shards with validation: `samples` / `batch_size`
    steps per epoch, step_N.pt every `save_every` steps, each kept (the resume tests start from early ones)."""
    return tiny_argv(
        logs,
        name,
        *("--val-data", str(demo_shards / "val" / "shard-000000.tar"), "--loss", "adacl", "--adacl-queue-size", "40"),
        *("--lr", "2e-3", "--log-every-n-steps", "1", "--save-every-n-steps", str(save_every)),
        *("--keep-step-checkpoints", "0", *extra),
        data=demo_shards / "train" / "shard-{000000..000003}.tar",
        samples=samples,
        batch_size=batch_size,
        epochs=epochs,
        warmup=3,
    )


def flip_bits(path, count=64):
    """Flip `count` bits spread over the middle half of the file (tensor bytes, as a bad disk or copy would)."""
    data = bytearray(path.read_bytes())
    for k in range(count):
        position = len(data) // 4 + k * (len(data) // 2 // count)
        data[position] ^= 1 << (k % 8)
    path.write_bytes(bytes(data))


def processes_running(command_line):
    """The PIDs of processes whose command line is exactly `command_line` (bytes, arguments joined by spaces)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().replace(b"\0", b" ").strip() == command_line:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def catches(pid, sig):
    """Whether process `pid` has a handler for `sig` (/proc's SigCgt mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (sig - 1) & 1)


# Takes the run lock of argv[1] once the file argv[2] exists (so that two of them start at the same moment),
# prints whether it holds it, and holds it until its stdin closes.
_LOCK_CONTENDER = """
import os, sys
from training.trainer.run_folder.lock import RunInUse, RunLock
print("ready", flush=True)
while not os.path.exists(sys.argv[2]):
    pass
lock = RunLock()
try:
    lock.acquire(sys.argv[1])
    print("held", flush=True)
except RunInUse:
    print("refused", flush=True)
sys.stdin.read()
"""


def dead_pid():
    """The PID of a process that has ended (a stale lock's owner)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(proc.stdout)


def race_for_a_stale_lock(run_dir, trials, env=None):
    """Per trial: a dead owner's run.lock in `run_dir`, two processes taking it at the same moment, each holding
    what it got until both have answered. Returns the outcomes, e.g. ["held+refused", ...] ("held+held": two
    owners at once)."""
    outcomes = []
    go = Path(run_dir) / "go"
    for _ in range(trials):
        go.unlink(missing_ok=True)
        (Path(run_dir) / "run.lock").write_text(
            json.dumps({"pid": dead_pid(), "host": socket.gethostname(), "since": "2026-01-01T00:00:00"})
        )
        contenders = [
            subprocess.Popen(
                [sys.executable, "-c", _LOCK_CONTENDER, str(run_dir), str(go)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=env,
            )
            for _ in range(2)
        ]
        for proc in contenders:
            assert proc.stdout.readline() == "ready\n"
        go.touch()
        outcomes.append("+".join(sorted(proc.stdout.readline().strip() for proc in contenders)))
        for proc in contenders:
            proc.communicate(timeout=60)
    return outcomes


def stock_argv(demo_shards, logs, name, *extra, samples=128, batch_size=32, epochs=1, workers=0):
    """Flags of stock open_clip_train (which our trainer takes too) for a tiny webdataset run on the demo shards:
    `samples` / `batch_size` steps an epoch, every step logged, no evaluation unless `extra` asks for it."""
    return [
        "--train-data",
        str(demo_shards / "train" / "shard-{000000..000003}.tar"),
        "--train-num-samples",
        str(samples),
        "--dataset-type",
        "webdataset",
        "--model",
        "adacl-tiny",
        "--batch-size",
        str(batch_size),
        "--lr",
        "1e-3",
        "--warmup",
        "1",
        "--workers",
        str(workers),
        "--device",
        "cpu",
        "--logs",
        str(logs),
        "--name",
        name,
        "--epochs",
        str(epochs),
        "--log-every-n-steps",
        "1",
        *extra,
    ]
