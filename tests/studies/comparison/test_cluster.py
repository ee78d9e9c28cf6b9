"""The cluster path on the demo shards as the user's own data: emit the jobs, run the SLURM array script as a
plain local loop over task ids (each task: torchrun training, then evaluation and its outcome), then
--report-only pairs the runs; before the last tasks it lists the missing runs."""

import csv
import json
import os
import subprocess
import sys

import pytest

from studies.comparison.cli import main
from training.evaluation.clone_selection import read_clone_selection

ENDPOINT = "clone_mean=clone/color+clone/shape+clone/size+clone/relation"


def write_sugar_crepe(root, demo, task="replace_att", edit="color"):
    """A clip-benchmark `sugar_crepe/<task>` set (SugarCrepe's layout: val2017/ images and <task>.json of
    caption and negative caption) from the demo's clone-selection images and their one-edit clones."""
    (root / "val2017").mkdir(parents=True)
    annotations = {}
    for index, (image, caption, clones) in enumerate(read_clone_selection(demo / "clone_selection")):
        if edit in clones:
            image.save(root / "val2017" / f"{index:06d}.png")
            annotations[str(index)] = {
                "filename": f"{index:06d}.png",
                "caption": caption,
                "negative_caption": clones[edit],
            }
    (root / f"{task}.json").write_text(json.dumps(annotations))


def emit_argv(demo, jobs_dir, output_dir, *extra):
    # 4 epochs of 16 steps: enough for these runs to leave chance level (not collapsed), so that they pair.
    return [
        "--losses",
        "clip,adacl",
        "--seeds",
        "0,1",
        "--device",
        "cpu",
        "--workers",
        "0",
        "--batch-size",
        "32",
        "--epochs",
        "4",
        "--lr",
        "2e-3",
        "--warmup",
        "4",
        "--train-data",
        str(demo / "train" / "shard-{000000..000003}.tar"),
        "--train-num-samples",
        "512",
        "--val-data",
        str(demo / "val" / "shard-000000.tar"),
        "--dataset-type",
        "webdataset",
        "--caption-key",
        "txt",
        "--train-args",
        "--log-every-n-steps 1",
        "--benchmark-datasets",
        "wds/scenes_shape,wds/scenes_retrieval",
        "--benchmark-root",
        str(demo / "benchmark" / "{dataset}"),
        "--clone-selection-dir",
        str(demo / "clone_selection"),
        "--emit-jobs",
        str(jobs_dir),
        "--output-dir",
        str(output_dir),
        *extra,
    ]


@pytest.mark.slow  # 4 torchrun runs of 64 steps, each evaluated: about 100 s of CPU on a 2-core AMD EPYC
def test_emitted_jobs_run_as_an_array_then_report_only_pairs_them(demo_shards, tmp_path):
    jobs_dir, output_dir = tmp_path / "jobs", tmp_path / "comparison"
    # The user's sets: two of the demo's wds sets and a SugarCrepe-format caption-selection set.
    benchmark = tmp_path / "benchmark"
    benchmark.mkdir()
    for name in ("scenes_shape", "scenes_retrieval"):
        (benchmark / name).symlink_to(demo_shards / "benchmark" / name)
    write_sugar_crepe(benchmark / "sugar_crepe" / "replace_att", demo_shards)
    main(
        emit_argv(
            demo_shards,
            jobs_dir,
            output_dir,
            "--primary-endpoint",
            ENDPOINT,
            "--equivalence-margin",
            "0.05",
            "--benchmark-datasets",
            "wds/scenes_shape,wds/scenes_retrieval,sugar_crepe/replace_att",
            "--benchmark-root",
            str(benchmark / "{dataset}"),
        )
    )
    array = (jobs_dir / "array.sh").read_text()
    assert "#SBATCH --array=0-3" in array and "--gpus-per-node" not in array  # a CPU budget asks for no GPU
    with (jobs_dir / "jobs.tsv").open() as f:
        tasks = list(csv.DictReader(f, delimiter="\t"))
    assert [(t["task"], t["variant"], t["seed"]) for t in tasks] == [
        ("0", "clip", "0"),
        ("1", "adacl", "0"),
        ("2", "clip", "1"),
        ("3", "adacl", "1"),
    ]
    script = (jobs_dir / "jobs" / "001-adacl-seed0.sh").read_text()
    assert (
        "-m training.torchrun --standalone --nproc-per-node 1 -m training.main -- --train-data" in script
        and "--loss adacl" in script
        and "--resume latest" in script
        and "--finish-job" in script
    )
    assert "--dataset-type webdataset --caption-key txt" in script and "--log-every-n-steps 1" in script

    def run_tasks(ids):
        """The array's tasks as a plain loop, two at a time (as a scheduler would run them)."""
        tasks = [
            subprocess.Popen(
                ["bash", str(jobs_dir / "array.sh")],
                env={**os.environ, "OMP_NUM_THREADS": "1", "SLURM_ARRAY_TASK_ID": str(task)},
            )
            for task in ids
        ]
        assert [task.wait(timeout=300) for task in tasks] == [0] * len(ids)

    run_tasks([0, 1])  # seed 0 of both losses; seed 1 not yet
    partial = tmp_path / "partial.md"
    outcomes = main(["--report-only", "--output-dir", str(output_dir), "--results-md", str(partial)])
    assert len(outcomes) == 2 and all(outcome["status"] == "ok" for outcome in outcomes), [r["error"] for r in outcomes]
    assert "`clip-seed1`: **missing**: no outcome (not finished, or not started)" in partial.read_text()
    assert "`adacl-seed1`: **missing**" in partial.read_text()
    # --losses and --seeds pick the runs to report on: the finished seed alone has nothing missing.
    seed0 = tmp_path / "seed0.md"
    outcomes = main(["--report-only", "--output-dir", str(output_dir), "--results-md", str(seed0), "--seeds", "0"])
    assert (
        sorted(r["name"] for r in outcomes) == ["adacl-seed0", "clip-seed0"] and "**missing**" not in seed0.read_text()
    )
    outcomes = main(["--report-only", "--output-dir", str(output_dir), "--results-md", str(seed0), "--losses", "clip"])
    assert [r["name"] for r in outcomes] == ["clip-seed0"] and "`clip-seed1`: **missing**" in seed0.read_text()

    run_tasks([2, 3])
    results_md = tmp_path / "cluster.md"
    outcomes = main(["--report-only", "--output-dir", str(output_dir), "--results-md", str(results_md)])
    assert len(outcomes) == 4 and "**missing**" not in results_md.read_text()
    outcome = json.loads((output_dir / "outcomes" / "adacl-seed1.json").read_text())
    assert outcome["status"] == "ok" and outcome["world_size"] == 1 and outcome["metrics"]["train/steps"] == 64
    assert {
        "cls/scenes_shape/acc1",
        "ret/scenes_retrieval/image_R@1",
        "sel/replace_att/text_acc",
        "clone/shape",
        "clone/shape_cos_margin_p10",
        "val/i2t_R@1",
    } <= set(outcome["metrics"])
    assert outcome["loss_options"]["queue_size"] == 0 and outcome["machine"]["cores"]
    markdown = results_md.read_text()
    assert "## Primary endpoint" in markdown and "equivalence margin ±0.05; reference `clip`" in markdown
    # Each adacl run is paired with clip's of the same seed where both are ok.
    ok = {(r["label"], r["seed"]) for r in outcomes if r["verdict"] == "ok"}
    pairs = sum(("clip", seed) in ok and ("adacl", seed) in ok for seed in (0, 1))
    (verdict,) = [line for line in markdown.splitlines() if line.startswith("| `adacl` | clone_mean | ±0.05 |")]
    assert verdict.startswith(f"| `adacl` | clone_mean | ±0.05 | {pairs} |")
    assert "## Paired against `clip`" in markdown and "each run one cluster job" in markdown
    assert f"training data `{demo_shards / 'train' / 'shard-{000000..000003}.tar'}` (512 samples per epoch)" in markdown
    assert "clip-benchmark sets `wds/scenes_shape`, `wds/scenes_retrieval`, `sugar_crepe/replace_att`" in markdown
    assert "| `adacl` | sel/replace_att/text_acc | 2 |" in markdown or pairs < 2


def test_emitting_checks_the_users_data_flags(demo_shards, tmp_path):
    base = emit_argv(demo_shards, tmp_path / "jobs", tmp_path / "out")
    without = lambda flag: [a for i, a in enumerate(base) if a != flag and (i == 0 or base[i - 1] != flag)]  # noqa
    with pytest.raises(ValueError, match="--train-data needs --val-data"):
        main(without("--val-data"))
    with pytest.raises(ValueError, match="--benchmark-datasets needs --benchmark-root"):
        main(without("--benchmark-root"))
    with pytest.raises(ValueError, match="glofnd keep per-sample state: give --data-size"):
        main(base + ["--losses", "clip,glofnd"])
    with pytest.raises(ValueError, match="--train-num-samples is for your own data: give --train-data too"):
        main(without("--train-data"))
    with pytest.raises(ValueError, match="reference variant 'siglip' is not in --losses"):
        main(base + ["--reference", "siglip"])
    with pytest.raises(
        ValueError, match="--pretrain-epochs pretrains on the demo data, here; with --train-data or --emit-jobs"
    ):
        main(base + ["--pretrain-epochs", "2"])
    assert not (tmp_path / "jobs").exists()


@pytest.mark.slow  # about 20 s on 2 cores: each array task a process that imports the trainer
def test_each_array_task_runs_its_job_and_a_failed_training_gets_a_failed_record(demo_shards, tmp_path):
    """The scripts' plumbing without training: PYTHON is a stub that logs each call, fails the torchrun
    step with status 3 and runs the real --finish-job, which outcomes the run as failed."""
    jobs_dir, output_dir = tmp_path / "jobs", tmp_path / "comparison"
    main(emit_argv(demo_shards, jobs_dir, output_dir, "--nproc-per-node", "2", "--device", "cuda"))
    assert "#SBATCH --gpus-per-node=2" in (jobs_dir / "array.sh").read_text()
    calls, stub = tmp_path / "calls.txt", tmp_path / "python"
    stub.write_text(
        f'#!/usr/bin/env bash\nprintf "%s\\n" "$*" >> {calls}\n'
        f'if [ "$2" = training.torchrun ]; then echo "training failed"; exit 3; fi\nexec {sys.executable} "$@"\n'
    )
    stub.chmod(0o755)
    for task in (2, 1):
        subprocess.run(
            ["bash", str(jobs_dir / "array.sh")],
            check=True,
            timeout=120,
            env={**os.environ, "PYTHON": str(stub), "SLURM_ARRAY_TASK_ID": str(task)},
        )
    train, finish, *_ = calls.read_text().splitlines()
    assert train.startswith("-m training.torchrun --standalone --nproc-per-node 2 -m training.main -- --train-data")
    assert "--seed 1 " in train and "--loss clip" in train and train.endswith("--resume latest")
    assert finish.startswith(
        f"-m studies.comparison --finish-job {output_dir / 'outcomes' / 'clip-seed1.job.json'} "
        "--train-status 3 --train-seconds "
    )
    assert "training failed" in (output_dir / "logs" / "clip-seed1.log").read_text()
    outcome = json.loads((output_dir / "outcomes" / "clip-seed1.json").read_text())
    assert outcome["status"] == "failed" and outcome["world_size"] == 2
    assert outcome["error"].startswith("training exited with status 3")
    with pytest.raises(subprocess.CalledProcessError):  # a task id beyond the array
        subprocess.run(
            ["bash", str(jobs_dir / "array.sh")],
            check=True,
            capture_output=True,
            env={**os.environ, "SLURM_ARRAY_TASK_ID": "4"},
        )
    outcomes = main(["--report-only", "--output-dir", str(output_dir), "--results-md", str(tmp_path / "r.md")])
    assert sorted(r["name"] for r in outcomes) == ["adacl-seed0", "clip-seed1"]
    report = (tmp_path / "r.md").read_text()
    assert "`clip-seed1`: **failed**: training exited with status 3" in report
    assert "`clip-seed0`: **missing**" in report and "`adacl-seed1`: **missing**" in report
    assert "2 ranks x 32" in report  # the global batch of a 2-process run
    assert "## Primary endpoint" not in report  # none was registered at emission
    # --report-only may report on a registration given now (or a file); the report says where it came from.
    main(
        [
            "--report-only",
            "--output-dir",
            str(output_dir),
            "--results-md",
            str(tmp_path / "r.md"),
            "--primary-endpoint",
            "colour=clone/color",
            "--reference",
            "adacl",
        ]
    )
    assert (
        "`colour`: the per-run mean of clone/color; equivalence margin ±0.02; reference `adacl`; given on the "
        "command line"
    ) in (tmp_path / "r.md").read_text()


@pytest.mark.slow  # one run of 16 steps and its evaluation: about 30 s of CPU
def test_own_data_runs_locally_too(demo_shards, tmp_path):
    """Without --emit-jobs the user's data and sets train and evaluate here, as the demo data does."""
    argv = emit_argv(demo_shards, tmp_path / "jobs", tmp_path / "out")
    argv = argv[: argv.index("--emit-jobs")]
    for flag, value in (("--losses", "clip"), ("--seeds", "0"), ("--epochs", "1")):
        argv[argv.index(flag) + 1] = value
    (run,) = main(
        argv + ["--output-dir", str(tmp_path / "out"), "--results-md", str(tmp_path / "local.md"), "--jobs", "1"]
    )
    assert run["status"] == "ok", run["error"]
    assert {"cls/scenes_shape/acc1", "ret/scenes_retrieval/text_R@5", "clone/color_cos_margin"} <= set(run["metrics"])
    assert "(512 samples per epoch)" in (tmp_path / "local.md").read_text()
    assert not (tmp_path / "jobs").exists()
