"""Launch recipes (scripts/launch/*) and SLURM launches: dry runs on img2dataset-named shards, clear
failures on bad input, the srun line, and ranks started with srun's variables training together."""

import json
import os
import random
import shlex
import socket
import subprocess
import sys
import textwrap
from unittest import mock

import pytest
from open_clip_train.data import expand_urls
from torch.distributed.run import parse_args as torchrun_parse_args

from helpers import REPO, TESTS
from helpers.run_utils import digest
from training.trainer.launch.params import parse_args, validate_args
from training.trainer.run_folder.checkpoint_files import load_checkpoint

LAUNCH = REPO / "scripts" / "launch"
NUM_SHARDS = 4
LAUNCHER_VARIABLES = (
    "SLURM_",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_",
    "GPUS",
    "NNODES",
    "DATA_DIR",
    "GLOBAL_BATCH",
    "RECIPE",
    "WORKERS",
    "NUM_SAMPLES",
    "VAL_",
    "IMAGENET_VAL",
    "LOGS",
    "NAME",
)


def clean_env(**variables):
    """This environment without launcher variables, with this interpreter's `python` and `torchrun` first on PATH."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(LAUNCHER_VARIABLES)}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return {**env, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", **variables}


def run_recipe(script, env, *args):
    return subprocess.run(
        ["bash", str(LAUNCH / script), *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def img2dataset_dir(demo_shards, tmp_path):
    """The demo training shards as img2dataset names them: 00000.tar ... with 00000_stats.json."""
    directory = tmp_path / "cc3m"
    directory.mkdir()
    for index in range(NUM_SHARDS):
        (directory / f"{index:05d}.tar").symlink_to(demo_shards / "train" / f"shard-{index:06d}.tar")
        (directory / f"{index:05d}_stats.json").write_text(json.dumps({"successes": 128}))
    return directory


def launch_command(stdout):
    """The command a dry run prints after "launch command: ", split as the shell would."""
    [line] = [line for line in stdout.splitlines() if line.startswith("launch command: ")]
    return shlex.split(line[len("launch command: ") :])


def assert_recipe_arguments(trainer_argv, *, shards_dir, model, batch_size, world_size, logs):
    """The trainer arguments of a recipe: the expected recipe, all shards, valid for `world_size` ranks."""
    with mock.patch.dict(os.environ, {"WORLD_SIZE": str(world_size), "RANK": "0", "LOCAL_RANK": "0"}):
        args = parse_args(trainer_argv)  # a recipe splits its global batch over the ranks each one is told of
    validate_args(args, world_size)
    assert (args.model, args.loss, args.batch_size, args.resume) == (model, "adacl", batch_size, "latest")
    assert args.local_loss and args.gather_with_grad and args.logs == str(logs)
    assert args.dist_timeout == 1800  # a rank that dies is reported after 30 min, not torch's default
    urls, _ = expand_urls(args.train_data)
    assert urls == [str(shards_dir / f"{index:05d}.tar") for index in range(NUM_SHARDS)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, variables, model, batch_size, rendezvous",
    [
        ("cc3m_rn50_torchrun.sh", {"GPUS": "2"}, "RN50", 512, {"standalone": True}),
        # The two-node rendezvous (about 20 s on 2 cores, as the first): in the slow tests.
        pytest.param(
            "cc12m_vitb32_torchrun.sh",
            {"GPUS": "1", "NNODES": "2", "MASTER_ADDR": "node0"},
            "ViT-B-32",
            1024,
            {"rdzv_backend": "c10d", "rdzv_endpoint": "node0:29500", "rdzv_id": "cc12m-vitb32"},
            marks=pytest.mark.slow,
        ),
    ],
)
def test_torchrun_recipe_dry_run_checks_arguments_and_shards(
    img2dataset_dir, tmp_path, script, variables, model, batch_size, rendezvous
):
    env = clean_env(DATA_DIR=str(img2dataset_dir), WORKERS="1", LOGS=str(tmp_path / "logs"), **variables)
    result = run_recipe(script, env, "--device", "cpu", "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    # The plan is the one of the whole world (2 ranks), although the check ran in one process here.
    assert f"dry run OK: --model {model} --loss adacl" in result.stdout
    assert f"2 rank(s) x batch {batch_size} x accum 1" in result.stdout
    assert not (tmp_path / "logs").exists()

    command = launch_command(result.stdout)
    assert command[0] == "torchrun"
    launch = torchrun_parse_args(command[1:])
    assert (launch.module, launch.training_script) == (True, "training.main")
    assert int(launch.nproc_per_node) == int(variables["GPUS"]) and launch.nnodes == variables.get("NNODES", "1")
    for name, value in rendezvous.items():
        assert getattr(launch, name) == value, name
    # Every trainer flag reached the trainer (torchrun claims none of them, e.g. --logs).
    assert_recipe_arguments(
        launch.training_script_args,
        shards_dir=img2dataset_dir,
        model=model,
        batch_size=batch_size,
        world_size=2,
        logs=tmp_path / "logs",
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe, model, batch_size, name, val_samples",
    [
        ("cc3m", "RN50", 512, "cc3m-rn50-adacl", "13000"),  # CC3M's val split: 13000 samples unless VAL_NUM_SAMPLES
        pytest.param("cc12m", "ViT-B-32", 1024, "cc12m-vitb32-adacl", None, marks=pytest.mark.slow),
    ],
)
def test_slurm_recipe_dry_run_plans_for_slurm_ntasks(
    img2dataset_dir, tmp_path, recipe, model, batch_size, name, val_samples
):
    """Each recipe of slurm.sbatch, dry run for SLURM_NTASKS ranks: its model and per-rank batch, the name the torchrun
    script of the recipe uses, and the settings docs/cluster.md lists reaching the trainer."""
    val_shard = str(img2dataset_dir.parent / "val.tar")
    os.symlink(img2dataset_dir / "00000.tar", val_shard)
    env = clean_env(
        DATA_DIR=str(img2dataset_dir),
        RECIPE=recipe,
        SLURM_NTASKS="2",
        WORKERS="1",
        LOGS=str(tmp_path / "logs"),
        VAL_DATA=val_shard,
    )
    result = run_recipe("slurm.sbatch", env, "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"dry run OK: --model {model} --loss adacl" in result.stdout
    assert f"2 rank(s) x batch {batch_size}" in result.stdout
    command = launch_command(result.stdout)
    assert command[:4] == ["srun", "--cpu-bind=none", "--kill-on-bad-exit=1", sys.executable]
    args = parse_args(command[7:])
    assert (args.name, args.resume, args.slurm_requeue, args.workers) == (name, "latest", True, 1)
    assert (args.val_data, args.val_num_samples) == (val_shard, val_samples and int(val_samples))


@pytest.mark.parametrize(
    "script, variables",
    [
        ("slurm.sbatch", {"SLURM_NTASKS": "1", "RECIPE": "cc3m"}),
        pytest.param("cc3m_rn50_torchrun.sh", {"GPUS": "1"}, marks=pytest.mark.slow),
    ],
)
def test_a_missing_imagenet_val_stops_the_dry_run(img2dataset_dir, tmp_path, script, variables):
    env = clean_env(DATA_DIR=str(img2dataset_dir), WORKERS="1", IMAGENET_VAL=str(tmp_path / "no-imagenet"))
    result = run_recipe(script, {**env, **variables}, "--device", "cpu", "--dry-run")
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: --imagenet-val: {tmp_path / 'no-imagenet'} is not a directory"), last


def doc_block_after(text, heading):
    """The first ```bash block after `heading` in a Markdown text, as lines."""
    start = text.index("```bash\n", text.index(heading)) + len("```bash\n")
    return text[start : text.index("```", start)].splitlines()


def test_the_docs_slurm_snippets_are_the_scripts_lines():
    """docs/cluster.md shows slurm.sbatch's lines as the script has them: its SLURM lines (#SBATCH and the srun line's
    flags, the same --name) and its submit and dry-run commands, the one-node (8 GPUs) and CC3M ones included."""
    doc = (REPO / "docs" / "cluster.md").read_text()
    script = (LAUNCH / "slurm.sbatch").read_text()
    script_lines = [line.strip() for line in script.splitlines()]
    snippet = [line.split("  #")[0].strip() for line in doc_block_after(doc, "**The SLURM lines**")]
    shown = [line for line in snippet if line and line != "..."]
    assert len(shown) >= 6 and [line for line in shown if line not in script_lines] == []
    submits = [line.strip() for line in doc_block_after(doc, "## 2. Launch") if "slurm.sbatch" in line]
    assert any("sbatch --nodes=1" in line and "RECIPE=cc3m" in line for line in submits), submits
    assert [line for line in submits if f"#   {line}" not in script] == []  # the script's own usage lines


STUB_SRUN = """#!/usr/bin/env bash
# Records what the job script asked srun to run, and the rendezvous it exported.
printf '%s\\n' "MASTER_ADDR=${MASTER_ADDR:-}" "MASTER_PORT=${MASTER_PORT:-}" "$@" > "$SRUN_RECORD"
"""
STUB_SCONTROL = """#!/usr/bin/env bash
[ "$1 $2" = "show hostnames" ] && printf 'gpu003\\ngpu004\\n'
"""


def test_slurm_recipe_runs_srun_with_the_first_host_as_master(img2dataset_dir, tmp_path):
    """The job script as sbatch runs it (stub srun and scontrol): one srun line, valid for SLURM_NTASKS ranks."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, text in (("srun", STUB_SRUN), ("scontrol", STUB_SCONTROL)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    record = tmp_path / "srun.txt"
    env = clean_env(
        DATA_DIR=str(img2dataset_dir),
        RECIPE="cc12m",
        SLURM_NTASKS="16",
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="gpu[003-004]",
        SLURM_SUBMIT_DIR=str(REPO),
        SRUN_RECORD=str(record),
        LOGS=str(tmp_path / "logs"),
        VAL_DATA="/data/cc12m/val.tar",
        VAL_NUM_SAMPLES="9000",
        IMAGENET_VAL="/data/imagenet/val",
        NAME="cc12m-run",
    )
    env["PATH"] = os.pathsep.join([str(stubs), env["PATH"]])
    result = subprocess.run(
        ["bash", str(LAUNCH / "slurm.sbatch"), "--epochs", "1"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    master_addr, master_port, *srun_argv = record.read_text().splitlines()
    # MASTER_PORT is left to training.trainer.distributed, which derives it from SLURM_JOB_ID.
    assert (master_addr, master_port) == ("MASTER_ADDR=gpu003", "MASTER_PORT=")
    assert srun_argv[:5] == ["--cpu-bind=none", "--kill-on-bad-exit=1", sys.executable, "-u", "-m"]
    trainer_argv = srun_argv[6:]
    assert_recipe_arguments(
        trainer_argv,
        shards_dir=img2dataset_dir,
        model="ViT-B-32",
        batch_size=128,
        world_size=16,
        logs=tmp_path / "logs",
    )
    args = parse_args(trainer_argv)
    assert args.epochs == 1  # extra flags come last, so they override
    assert (args.val_data, args.val_num_samples, args.imagenet_val, args.name) == (
        "/data/cc12m/val.tar",
        9000,
        "/data/imagenet/val",
        "cc12m-run",
    )


@pytest.mark.parametrize(
    "script, variables, message",
    [
        ("cc3m_rn50_torchrun.sh", {"DATA_DIR": None}, "set DATA_DIR to the img2dataset output folder"),
        ("cc3m_rn50_torchrun.sh", {"DATA_DIR": "/no/such/dir"}, "DATA_DIR=/no/such/dir is not a directory"),
        ("cc12m_vitb32_torchrun.sh", {"DATA_DIR": "{empty}"}, "no NNNNN.tar shards in"),
        ("cc3m_rn50_torchrun.sh", {"GPUS": "3"}, "the global batch 1024 does not split evenly over 3 ranks"),
        ("cc12m_vitb32_torchrun.sh", {"GPUS": "2", "NNODES": "2"}, "NNODES=2: set MASTER_ADDR"),
        ("slurm.sbatch", {}, "SLURM_NTASKS is not set"),
        ("slurm.sbatch", {"SLURM_NTASKS": "2", "RECIPE": "cc15m"}, "RECIPE must be cc3m or cc12m"),
    ],
)
def test_recipes_refuse_bad_settings_before_launching(img2dataset_dir, tmp_path, script, variables, message):
    variables = {"DATA_DIR": str(img2dataset_dir), **variables}  # None: unset; {empty}: a folder without shards
    env = clean_env(**{name: value.format(empty=tmp_path) for name, value in variables.items() if value is not None})
    result = run_recipe(script, env, "--dry-run")
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "launch command" not in result.stdout  # nothing was launched


@pytest.mark.slow
def test_recipe_dry_run_names_a_missing_shard(img2dataset_dir):
    (img2dataset_dir / "00002.tar").unlink()  # a shard img2dataset failed to write
    result = run_recipe(
        "cc3m_rn50_torchrun.sh",
        clean_env(DATA_DIR=str(img2dataset_dir), GPUS="1", WORKERS="1"),
        "--device",
        "cpu",
        "--dry-run",
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: training data: 1 of the 4 shards")
    assert "00002.tar" in result.stderr and "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------
# Ranks started by srun (SLURM's variables only) train together
# ---------------------------------------------------------------------------------------------

# `python -m training.main`, plus a digest of the model and the loss state after each epoch on
# every rank (a checkpoint only holds rank 0's).
SLURM_TASK = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import training.main as entry
    import training.trainer.launch.trainer as run_owner
    from helpers.run_utils import digest
    from training.trainer.distributed import unwrap_model

    digests = {}
    train_one_epoch = run_owner.train_one_epoch

    def train_and_digest(trainer, data):
        result = train_one_epoch(trainer, data)
        digests.update(model=digest(unwrap_model(trainer.model).state_dict()), loss=digest(trainer.loss_fn.state_dict()))
        return result

    run_owner.train_one_epoch = train_and_digest
    summary = entry.main(sys.argv[2:])
    print("RESULT " + json.dumps({"step": summary.step, "epoch": summary.epoch, **digests}))
""")


def _slurm_job_id_with_free_port():
    """A SLURM_JOB_ID whose derived MASTER_PORT (29500 + id % 10000) is free here."""
    for _ in range(100):
        port = random.randrange(29500, 39500)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return 7_000_000 + port - 29500
    raise RuntimeError("no free port in 29500..39499")


@pytest.mark.slow
def test_ranks_started_by_srun_train_together(demo_shards, tmp_path):
    """Two processes with only srun's variables (SLURM_JOB_NODELIST, no MASTER_ADDR/PORT) run
    `training.main` with --loss adacl as ranks 0 and 1 of one DDP job."""
    job_id = _slurm_job_id_with_free_port()
    argv = [
        "--train-data",
        str(demo_shards / "train" / "shard-{000000..000003}.tar"),
        "--train-num-samples",
        "128",
        "--model",
        "adacl-tiny",
        "--loss",
        "adacl",
        "--local-loss",
        "--gather-with-grad",
        "--batch-size",
        "16",
        "--lr",
        "1e-3",
        "--warmup",
        "1",
        "--workers",
        "1",
        "--device",
        "cpu",
        "--logs",
        str(tmp_path),
        "--name",
        "srun",
        "--log-every-n-steps",
        "1",
        "--epochs",
        "1",
    ]
    base = clean_env()
    procs = []
    for rank in range(2):
        env = {
            **base,
            "SLURM_PROCID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": str(rank),
            "SLURM_JOB_NODELIST": "localhost",
            "SLURM_JOB_ID": str(job_id),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", SLURM_TASK, str(TESTS), *argv],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    results = [json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:]) for out in outputs]
    # 128 samples / (2 ranks x 16) = 4 steps: the world has 2 ranks (alone, each would take 8).
    assert results[0]["step"] == results[1]["step"] == 4
    # DDP kept the replicas identical, and AdaCL's state (from global statistics) is the same on both.
    assert results[0]["model"] == results[1]["model"] and results[0]["loss"] == results[1]["loss"]
    checkpoint = load_checkpoint(tmp_path / "srun" / "checkpoints" / "epoch_1.pt")
    assert digest(checkpoint["state_dict"]) == results[0]["model"]
    assert "Rank 0 of 2 on cpu" in (tmp_path / "srun" / "out.log").read_text()
