"""The comparison's runs as cluster jobs: one shell script per (variant, seed), a SLURM array script, a jobs list.

`python -m studies.comparison ... --emit-jobs DIR` writes, instead of running anything:

    DIR/jobs/NNN-<run>.sh   one run: `python -m training.torchrun --standalone --nproc-per-node N -m
                            training.main -- <the run's trainer arguments> --resume latest`, then
                            `python -m studies.comparison --finish-job <run>.job.json` (evaluates the final
                            checkpoint and writes the run's outcome where `--report-only` reads it);
                            its output goes to OUTPUT_DIR/logs/<run>.log
    DIR/jobs.tsv            task id, run name, variant, seed, script, outcome (task id = array index)
    DIR/array.sh            `#SBATCH --array=0-K`: task i runs the script of task id i

`--resume latest` makes a requeued or re-submitted task continue its run (add `--save-every-n-steps`
to --train-args to lose little on preemption). The scripts `cd` to the folder the jobs were written
from, so relative paths mean what they meant there, and put the repository that holds the lab on PYTHONPATH
(`--finish-job` is the lab's); `PYTHON` in the environment overrides the interpreter (default: the one that
wrote the jobs).
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import asdict
from pathlib import Path
from typing import List, Sequence

from .jobs import LAB_PATH, RunJob, job_file, log_file

JOBS_LIST = "jobs.tsv"
ARRAY_SCRIPT = "array.sh"


def job_script(job: RunJob, *, index: int, total: int, nproc_per_node: int, workdir: Path) -> str:
    """The shell script of one emitted run: torchrun training, then `--finish-job` (evaluation, outcome)."""
    log = shlex.quote(str(log_file(job)))
    train = [
        "-m",
        "training.torchrun",
        "--standalone",
        "--nproc-per-node",
        str(nproc_per_node),
        "-m",
        "training.main",
        "--",
        *job.train_argv,
        "--resume",
        "latest",
    ]
    return "\n".join(
        [
            "#!/usr/bin/env bash",
            f"# Loss comparison run {index + 1} of {total}: {job.label}, seed {job.seed} (written by python -m "
            "studies.comparison --emit-jobs).",
            f"# Trains on {nproc_per_node} process(es) of this node, evaluates the final checkpoint and writes the outcome",
            f"# {job.outcome_path}. Output: {log_file(job)}",
            "set -u",
            f"cd {shlex.quote(str(workdir))}",
            f'export PYTHONPATH={shlex.quote(str(LAB_PATH))}"${{PYTHONPATH:+:$PYTHONPATH}}"  # the lab (studies/)',
            f'PYTHON="${{PYTHON:-{sys.executable}}}"',
            f"mkdir -p {shlex.quote(str(log_file(job).parent))}",
            "start=$(date +%s)",
            f'"$PYTHON" {shlex.join(train)} >> {log} 2>&1',
            "status=$?",
            f'exec "$PYTHON" -m studies.comparison --finish-job {shlex.quote(str(job_file(job)))} --train-status "$status" '
            f'--train-seconds "$(( $(date +%s) - start ))" >> {log} 2>&1',
            "",
        ]
    )


def array_script(emit_dir: Path, num_jobs: int, *, nproc_per_node: int, gpus: bool) -> str:
    jobs_list = shlex.quote(str(emit_dir / JOBS_LIST))
    header = [
        "#!/usr/bin/env bash",
        "#SBATCH --job-name=loss-comparison",
        f"#SBATCH --array=0-{num_jobs - 1}",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
    ]
    if gpus:
        header.append(f"#SBATCH --gpus-per-node={nproc_per_node}")
    return "\n".join(
        [
            *header,
            f"#SBATCH --output={emit_dir}/slurm-%A_%a.out",
            f"# One task per (loss variant, seed) run of {emit_dir / JOBS_LIST}; add --partition, --time, --account,",
            "# --cpus-per-task as your cluster needs on the sbatch command line. Without SLURM, run task i with",
            f"# SLURM_ARRAY_TASK_ID=i bash {emit_dir / ARRAY_SCRIPT}",
            "set -eu",
            ': "${SLURM_ARRAY_TASK_ID:?submit with sbatch, or set SLURM_ARRAY_TASK_ID to the task id}"',
            f"script=$(awk -F '\\t' -v id=\"$SLURM_ARRAY_TASK_ID\" 'NR > 1 && $1 == id {{print $5}}' {jobs_list})",
            f'[ -n "$script" ] || {{ echo "no task $SLURM_ARRAY_TASK_ID in {emit_dir / JOBS_LIST}" >&2; exit 2; }}',
            'exec bash "$script"',
            "",
        ]
    )


def emit_jobs(jobs: Sequence[RunJob], emit_dir: Path, *, nproc_per_node: int, workdir: Path) -> List[Path]:
    """Write every job's script and JSON, the jobs list and the array script; returns the scripts."""
    if any(char in str(emit_dir) for char in "\t\n"):
        raise ValueError(f"--emit-jobs {emit_dir!r}: a folder name with a tab or newline cannot go in the jobs list")
    (emit_dir / "jobs").mkdir(parents=True, exist_ok=True)
    scripts, rows = [], ["task\trun\tvariant\tseed\tscript\trecord"]
    for index, job in enumerate(jobs):
        script = emit_dir / "jobs" / f"{index:03d}-{job.name}.sh"
        script.write_text(job_script(job, index=index, total=len(jobs), nproc_per_node=nproc_per_node, workdir=workdir))
        script.chmod(0o755)
        job_file(job).parent.mkdir(parents=True, exist_ok=True)
        job_file(job).write_text(json.dumps(asdict(job), indent=1))
        scripts.append(script)
        rows.append(f"{index}\t{job.name}\t{job.label}\t{job.seed}\t{script}\t{job.outcome_path}")
    (emit_dir / JOBS_LIST).write_text("\n".join(rows) + "\n")
    array = emit_dir / ARRAY_SCRIPT
    array.write_text(
        array_script(emit_dir, len(jobs), nproc_per_node=nproc_per_node, gpus=jobs[0].device.startswith("cuda"))
    )
    array.chmod(0o755)
    return scripts
