"""Graceful preemption: SIGTERM / SIGUSR1 mid-epoch on 1 and 2 gloo ranks save the step that was running,
requeue the SLURM job (stub scontrol), exit with status 75, and `--resume latest` ends exactly where an
uninterrupted run ends; torchrun's workers never outlive it; the SLURM recipe forwards the warning signal.
(On 2 ranks, one run takes both signals in turn: SIGUSR1 on one rank, then SIGTERM from the kernel when
torchrun dies.)"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import REPO
from helpers.run_utils import (
    assert_same_final_state,
    children,
    losses_by_step,
    torchrun_command,
    wait_for_step,
    wait_until_gone,
)
from training import RunDir
from training.main import main
from training.trainer.launch.recipes import recipe_values
from training.trainer.preemption import PREEMPTED_EXIT_CODE, PreemptionFlag, parse_preempt_signals

JOB_ID = "4242"
STEPS_PER_EPOCH = 8


@pytest.fixture
def slurm_job(tmp_path):
    """The environment of a SLURM job whose `scontrol` is a stub recording its arguments, and that record."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    record = tmp_path / "scontrol.txt"
    (stubs / "scontrol").write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$*" >> {record}\n')
    (stubs / "scontrol").chmod(0o755)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "SLURM_JOB_ID": JOB_ID,
        "PATH": os.pathsep.join([str(stubs), os.environ["PATH"]]),
    }
    return env, record


def assert_preempted(run_dir, signal_name, stops=1):
    """One log line per stop (`stops` so far), the last at the last step the run logged, whose step_N.pt
    was saved and whose job was requeued."""
    stopped_at = RunDir(run_dir).steps()[-1]
    lines = [line for line in (run_dir / "out.log").read_text().splitlines() if "Preempted by" in line]
    assert len(lines) == stops, lines
    assert f"Preempted by {signal_name} at step {stopped_at} " in lines[-1], lines[-1]
    assert f"requeued SLURM job {JOB_ID}; exiting with status {PREEMPTED_EXIT_CODE}" in lines[-1], lines[-1]
    assert (run_dir / "checkpoints" / f"step_{stopped_at}.pt").exists()
    return stopped_at


def assert_resumed_without_loss(run_dir, reference_dir, stopped_at, total_steps, checkpoint):
    """The resumed run started at the saved step and ended with the reference's weights, optimizer and loss state."""
    assert f"Resumed from {run_dir / 'checkpoints' / f'step_{stopped_at}.pt'}" in (run_dir / "out.log").read_text()
    # Each step once in metrics.jsonl, the same losses as the uninterrupted run.
    assert [r["step"] for r in RunDir(run_dir).metrics("train")] == list(range(1, total_steps + 1))
    expected, resumed = losses_by_step(reference_dir), losses_by_step(run_dir)
    for step in range(stopped_at + 1, total_steps + 1):
        assert resumed[step] == pytest.approx(expected[step], rel=1e-5, abs=1e-6), step
    assert_same_final_state(run_dir, reference_dir, checkpoint)


# ---------------------------------------------------------------------------------------------
# One rank: the signal sent to the trainer process, as SLURM sends it to each task
# ---------------------------------------------------------------------------------------------


def single_argv(demo_shards, logs, name, *extra):
    """AdaCL with its queue, 2 epochs of 8 steps, no periodic step checkpoints (a preemption must lose nothing)."""
    return [
        "--train-data",
        str(demo_shards / "train" / "shard-{000000..000003}.tar"),
        "--train-num-samples",
        "256",
        "--model",
        "adacl-tiny",
        "--loss",
        "adacl",
        "--adacl-queue-size",
        "40",
        "--batch-size",
        "32",
        "--epochs",
        "2",
        "--lr",
        "2e-3",
        "--warmup",
        "3",
        "--workers",
        "0",
        "--device",
        "cpu",
        "--logs",
        str(logs),
        "--name",
        name,
        "--log-every-n-steps",
        "1",
        *extra,
    ]


@pytest.fixture(scope="module")
def single_reference(demo_shards, module_tmp):
    logs = module_tmp("reference")
    assert main(single_argv(demo_shards, logs, "reference")).step == 2 * STEPS_PER_EPOCH
    return logs / "reference"


# SIGUSR1 takes the same path as SIGTERM (about 17 s each on 2 cores): in the slow tests.
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_mid_epoch_saves_that_step_requeues_and_the_resume_loses_nothing(
    demo_shards, single_reference, slurm_job, tmp_path, sig
):
    env, scontrol_record = slurm_job
    argv = single_argv(demo_shards, tmp_path, "preempted", "--slurm-requeue")
    run_dir = tmp_path / "preempted"
    with open(tmp_path / "run.log", "w") as output:
        proc = subprocess.Popen(
            [sys.executable, "-m", "training.main", *argv], env=env, stdout=output, stderr=subprocess.STDOUT
        )
        wait_for_step(run_dir, proc, STEPS_PER_EPOCH + 3)  # mid-epoch 1
        proc.send_signal(sig)
        assert proc.wait(timeout=120) == PREEMPTED_EXIT_CODE
    stopped_at = assert_preempted(run_dir, sig.name)
    assert STEPS_PER_EPOCH < stopped_at < 2 * STEPS_PER_EPOCH
    assert "Traceback" not in (tmp_path / "run.log").read_text()
    assert scontrol_record.read_text() == f"requeue {JOB_ID}\n"

    summary = main(argv + ["--resume", "latest"])
    assert (summary.epoch, summary.step) == (2, 2 * STEPS_PER_EPOCH)
    assert_resumed_without_loss(run_dir, single_reference, stopped_at, 2 * STEPS_PER_EPOCH, "epoch_2.pt")
    params_txt = (run_dir / "params.txt").read_text()
    assert params_txt.count("# launch at ") == 2
    assert (
        f"resumed from {run_dir / 'checkpoints' / f'step_{stopped_at}.pt'} at epoch 1, step {stopped_at}" in params_txt
    )


# ---------------------------------------------------------------------------------------------
# Two ranks under torchrun (our launcher, which reports a preemption as status 75)
# ---------------------------------------------------------------------------------------------

TWO_RANK_ARGS = (
    "--loss",
    "adacl",
    "--adacl-queue-size",
    "48",
    "--epochs",
    "2",
    "--save-every-n-steps",
    "100",
    "--slurm-requeue",
)


def two_rank_command(demo_shards, logs, *extra):
    command, env = torchrun_command(demo_shards, logs, *TWO_RANK_ARGS, *extra)
    command[command.index("torch.distributed.run")] = "training.torchrun"
    return command, env


@pytest.fixture(scope="module")
def two_rank_reference(demo_shards, module_tmp):
    logs = module_tmp("reference2")
    command, env = two_rank_command(demo_shards, logs)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return logs / "ddp"


def interrupt_two_ranks(demo_shards, tmp_path, slurm_env, at_step, target, sig, *extra):
    """Start (or resume) the 2-rank run, send `sig` to torchrun or to rank 1 once `at_step` is logged; returns
    torchrun's exit status after every worker is gone."""
    command, env = two_rank_command(demo_shards, tmp_path, *extra)
    with open(tmp_path / "run.log", "w") as output:
        proc = subprocess.Popen(command, env={**env, **slurm_env}, stdout=output, stderr=subprocess.STDOUT)
        wait_for_step(tmp_path / "ddp", proc, at_step)
        workers = sorted(children(proc.pid))
        os.kill(proc.pid if target == "torchrun" else workers[1], sig)
        returncode = proc.wait(timeout=120)
    wait_until_gone(workers)  # no worker outlives the launcher
    assert "Traceback" not in (tmp_path / "run.log").read_text(), (tmp_path / "run.log").read_text()[-3000:]
    return returncode


@pytest.mark.slow  # about 75 s on 2 cores: four 2-rank torchrun launches, the reference included
def test_two_ranks_stop_together_at_signals_and_end_like_an_uninterrupted_run(
    demo_shards, two_rank_reference, slurm_job, tmp_path
):
    env, scontrol_record = slurm_job
    slurm_env = {"SLURM_JOB_ID": JOB_ID, "PATH": env["PATH"]}
    run_dir = tmp_path / "ddp"
    # SIGUSR1 to rank 1 only, mid-epoch 0: the ranks agree at the next step, rank 0 saves and requeues,
    # and our torchrun launcher reports the preemption as status 75.
    assert interrupt_two_ranks(demo_shards, tmp_path, slurm_env, 3, "rank 1", signal.SIGUSR1) == PREEMPTED_EXIT_CODE
    first_stop = assert_preempted(run_dir, "a signal to another rank")
    assert first_stop < STEPS_PER_EPOCH
    # Resumed, then SIGUSR1 to torchrun alone, mid-epoch 1: torchrun has no handler and dies; the kernel
    # sends its workers SIGTERM (parent-death signal), so they save and stop instead of training on.
    returncode = interrupt_two_ranks(
        demo_shards, tmp_path, slurm_env, STEPS_PER_EPOCH + 3, "torchrun", signal.SIGUSR1, "--resume", "latest"
    )
    assert returncode == -signal.SIGUSR1
    second_stop = assert_preempted(run_dir, "SIGTERM", stops=2)
    assert STEPS_PER_EPOCH < second_stop < 2 * STEPS_PER_EPOCH
    assert scontrol_record.read_text() == f"requeue {JOB_ID}\n" * 2

    command, env = two_rank_command(demo_shards, tmp_path, "--resume", "latest")
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_resumed_without_loss(run_dir, two_rank_reference, second_stop, 2 * STEPS_PER_EPOCH, "epoch_2.pt")
    assert losses_by_step(run_dir) == pytest.approx(losses_by_step(two_rank_reference), rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_sigterm_to_torchrun_reaches_both_workers(demo_shards, two_rank_reference, slurm_job, tmp_path):
    """torchrun passes SIGTERM on to its workers, which save and stop; it ends with 128 + 15, in one line."""
    env, _ = slurm_job
    returncode = interrupt_two_ranks(
        demo_shards, tmp_path, {"SLURM_JOB_ID": JOB_ID, "PATH": env["PATH"]}, 3, "torchrun", signal.SIGTERM
    )
    assert returncode == 128 + signal.SIGTERM
    stopped_at = assert_preempted(tmp_path / "ddp", "SIGTERM")
    command, env = two_rank_command(demo_shards, tmp_path, "--resume", "latest")
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_resumed_without_loss(tmp_path / "ddp", two_rank_reference, stopped_at, 2 * STEPS_PER_EPOCH, "epoch_2.pt")


# ---------------------------------------------------------------------------------------------
# Signals, and the SLURM recipe passing the warning signal on to srun
# ---------------------------------------------------------------------------------------------


def test_preempt_signals_parse_and_refuse_what_cannot_be_caught():
    assert parse_preempt_signals("TERM,USR1") == (signal.SIGTERM, signal.SIGUSR1)
    assert parse_preempt_signals("sigusr2, 2") == (signal.SIGUSR2, signal.SIGINT)
    assert parse_preempt_signals("none") == ()
    with pytest.raises(ValueError, match="unknown signal 'TERMINATE'"):
        parse_preempt_signals("TERMINATE")
    with pytest.raises(ValueError, match="cannot be caught"):
        parse_preempt_signals("KILL")


# A stand-in for srun: reports which signals reach it, and exits as a preempted trainer would.
STUB_SRUN = textwrap.dedent("""\
    import os, signal, sys, time
    record = os.environ["SRUN_RECORD"]
    def stop(signum, frame):
        with open(record, "a") as f:
            f.write(f"srun got {signal.Signals(signum).name}\\n")
        sys.exit(75)
    signal.signal(signal.SIGUSR1, stop)
    signal.signal(signal.SIGTERM, stop)
    open(record, "a").write("srun started\\n")
    time.sleep(120)
    """)


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_slurm_recipe_passes_the_signal_on_to_srun_and_its_status_back(tmp_path, sig):
    """`#SBATCH --signal=B:USR1@120` signals the job script only: it must reach srun (and the tasks)."""
    script = (REPO / "scripts" / "launch" / "slurm.sbatch").read_text()
    assert "#SBATCH --signal=B:USR1@120" in script and "--slurm-requeue" in script and "recipe_flags" in script
    for recipe in ("cc3m-rn50", "cc12m-vitb32"):  # the recipes it starts keep step checkpoints and resume them
        values = recipe_values(recipe, world_size=32)
        assert values["keep_step_checkpoints"] and values["save_every_n_steps"] and values["resume"] == "latest"
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "srun").write_text(f"#!{sys.executable}\n{STUB_SRUN}")
    (stubs / "srun").chmod(0o755)
    data = tmp_path / "data"
    data.mkdir()
    (data / "00000.tar").write_bytes(b"")
    record = tmp_path / "record.txt"
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(stubs), os.environ["PATH"]]),
        "SLURM_NTASKS": "1",
        "SLURM_SUBMIT_DIR": str(REPO),
        "DATA_DIR": str(data),
        "SRUN_RECORD": str(record),
        "MASTER_ADDR": "x",
    }
    proc = subprocess.Popen(
        ["bash", str(REPO / "scripts" / "launch" / "slurm.sbatch")],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not (record.exists() and "srun started" in record.read_text()):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == PREEMPTED_EXIT_CODE, stderr
    assert record.read_text() == f"srun started\nsrun got {sig.name}\n"
    assert f"launch: forwarding SIG{sig.name[3:]} to srun" in stderr


def test_ctrl_c_and_a_closed_terminal_stop_as_a_preemption_without_requeue_and_a_second_ctrl_c_quits(capfd):
    """Whatever --preempt-signal says: the first Ctrl-C sets the flag and says so in one line, after which SIGINT
    has its default action (a second one ends the process at once); SIGHUP sets the flag; neither requeues."""
    for sig, first_line in (
        (signal.SIGINT, "Ctrl-C: the run stops after this step with a checkpoint (status 75"),
        (signal.SIGHUP, ""),
    ):
        before = signal.getsignal(sig)
        with PreemptionFlag().watching(parse_preempt_signals("TERM")) as flag:
            signal.raise_signal(sig)
            assert flag.requested and flag.signal_name == sig.name and flag.stopped_by_a_person()
            assert (signal.getsignal(sig) == signal.SIG_DFL) == (sig == signal.SIGINT)
        assert signal.getsignal(sig) == before
        assert capfd.readouterr().err.startswith(first_line)
    with PreemptionFlag().watching(parse_preempt_signals("TERM,INT")) as flag:
        signal.raise_signal(signal.SIGINT)
        assert not flag.stopped_by_a_person()  # a preemption signal of this run: requeued as the others
    capfd.readouterr()
