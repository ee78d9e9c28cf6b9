"""Measure what the trainer does under the faults a cluster delivers: tiny runs on 1 and 2 gloo ranks
(CPU), each fault injected for real (signals, truncated, bit-flipped and empty files, a file-size limit, a
full tmpfs, /dev/full, failing and stalling pipes, cut and lying tars, device files as images, absent ranks, a
second launch, two launches racing for a stale lock, launches without --name in the same second, a diverging loss,
a read-only run folder; a new user's bad numbers, environment variables, model folders and samples, declared in
`helpers.fault_rows`), printing the "fault -> what happens -> what is lost" table of docs/cluster.md. Rows
that check a promise say so at their end (e.g. "the epoch summary names both shards: True"); run against an
earlier tree (PYTHONPATH=<that tree>/src) they show what it did instead. It lives beside the tests because it is built on their harness
(`helpers.run_utils`, `helpers.distributed_utils`, importable here as for any script in this folder).

    PYTHONPATH=src OMP_NUM_THREADS=1 python tests/fault_table.py [--work DIR]

Every run: adacl-tiny, --loss adacl, the demo set (512 samples, 32 px), 256 samples per epoch, 2 epochs
of 8 steps (1 rank, batch 32; 2 ranks, batch 16 each), --save-every-n-steps 5, signals sent at step 11.
The full-disk rows mount small tmpfs folders, the read-only row a read-only bind mount, the other-host row
makes two host names with `unshare --uts` and the bad-input rows an immutable folder with `chattr +i` (root only;
skipped otherwise). The huge-member row writes a sparse shard whose image member has FAULT_TABLE_HUGE_MEMBER_BYTES
(default 6 GiB; it takes no disk) and compares the runs' peak RSS (`os.wait4`). The same-second row stops the
clock of the automatic run name (FROZEN_CLOCK_LAUNCH) so that its launches share their start second for certain.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import math
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np
import torch
from PIL import Image

from helpers.data_utils import write_shard_with_a_huge_member
from helpers.distributed_utils import free_port
from helpers.fault_rows import ROWS, grey16_png, launcher_free, write_fault_inputs
from helpers.run_utils import catches, children, flip_bits, kill_run, processes_running, race_for_a_stale_lock, running
from training import RunDir
from training.synthetic_scenes.writers import write_demo_dataset
from training.trainer.data.samples import decode_image
from training.trainer.launch.params import argv_from_values
from training.trainer.run_folder.layout import RESULTS_NAME, read_json_lines, step_checkpoint_number

STEPS = 16  # 2 epochs of 8 steps
SAVE_EVERY = 5
SIGNAL_AT = 11  # mid-epoch 1
NAN_LR = 1e3  # a learning rate that makes the loss non-finite from step 3 on (--warmup 1)
PREEMPTED = 75
HUGE_MEMBER_BYTES = int(float(os.environ.get("FAULT_TABLE_HUGE_MEMBER_BYTES", 6 * 2**30)))
# training.main with the clock of the automatic run name (training.trainer.launch.folder's `datetime`) stopped at
# one instant, so that launches started together share their start second for certain: `python -c THIS ARGS...`.
FROZEN_CLOCK_LAUNCH = """
import datetime, runpy
import training.trainer.launch.folder as folder


class Frozen(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(2026, 1, 1, 12, 0, 0, tzinfo=tz)


folder.datetime = Frozen
runpy.run_module("training.main", run_name="__main__", alter_sys=True)
"""


class Bench:
    def __init__(self, work: Path):
        self.work = work
        self.data = work / "demo"
        if not (self.data / "manifest.json").exists():
            write_demo_dataset(self.data, seed=0, num_train=512, num_val=128, num_test=128, shard_size=128)
        self.stubs = work / "bin"
        self.stubs.mkdir(exist_ok=True)
        self.scontrol_record = work / "scontrol.txt"
        (self.stubs / "scontrol").write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$*" >> {self.scontrol_record}\n')
        (self.stubs / "scontrol").chmod(0o755)
        self.env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "TORCHELASTIC"))
        }
        self.env.update(
            OMP_NUM_THREADS="1", PATH=os.pathsep.join([str(self.stubs), os.environ["PATH"]]), SLURM_JOB_ID="4242"
        )
        self.rows: List[tuple] = []
        self.val = str(self.data / "val" / "shard-000000.tar")

    def values(self, name: str, ranks: int = 1, **overrides: Any) -> Dict[str, Any]:
        """The trainer's flag values (by destination) of run `name` on `ranks` ranks; None drops a flag."""
        values = dict(
            train_data=str(self.data / "train" / "shard-{000000..000003}.tar"),
            train_num_samples=256,
            model="adacl-tiny",
            loss="adacl",
            adacl_queue_size=48,
            batch_size=32 // ranks,
            epochs=2,
            lr=2e-3,
            warmup=3,
            workers=0,
            device="cpu",
            logs=str(self.work / "logs"),
            name=name,
            log_every_n_steps=1,
            save_every_n_steps=SAVE_EVERY,
            slurm_requeue=True,
            local_loss=ranks > 1,
            gather_with_grad=ranks > 1,
        )
        return {**values, **overrides}

    def command(self, ranks: int, values: Dict[str, Any]) -> List[str]:
        """The run's command line: it runs in a process of its own, to be signalled, killed and timed."""
        argv = argv_from_values(values)
        if ranks == 1:
            return [sys.executable, "-m", "training.main", *argv]
        return [
            sys.executable,
            "-m",
            "training.torchrun",
            "--nproc_per_node",
            str(ranks),
            "--master_port",
            str(free_port()),
            "-m",
            "training.main",
            *argv,
        ]

    def run(
        self, ranks: int, values: Dict[str, Any], *, env: Optional[dict] = None, preexec: Optional[Callable] = None
    ):
        start = time.time()
        result = subprocess.run(
            self.command(ranks, values),
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=900,
            preexec_fn=preexec,
        )
        return result, time.time() - start

    def run_dir(self, name: str) -> Path:
        return self.work / "logs" / name

    def steps(self, name: str) -> List[int]:
        return RunDir(self.run_dir(name)).steps()

    def start_and_signal(self, name: str, ranks: int, target: str, sig: signal.Signals):
        """Start a run, send `sig` to `target` (trainer / torchrun / rank1 / all: srun's way) at SIGNAL_AT."""
        proc = subprocess.Popen(
            self.command(ranks, self.values(name, ranks)),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        while not (self.steps(name) or [0])[-1] >= SIGNAL_AT:
            assert proc.poll() is None, proc.communicate()[0][-2000:]
            time.sleep(0.05)
        workers = children(proc.pid) if ranks > 1 else []
        signalled = time.time()
        targets = {"trainer": [proc.pid], "torchrun": [proc.pid], "rank1": sorted(workers)[1:], "all": workers}[target]
        for pid in targets:
            os.kill(pid, sig)
        output = proc.communicate(timeout=300)[0]
        stopped = time.time() - signalled
        deadline = time.time() + 120
        while any(running(pid) for pid in workers) and time.time() < deadline:
            time.sleep(0.05)
        orphans = [pid for pid in workers if running(pid)]
        return proc.returncode, stopped, output, orphans

    def add(self, fault: str, happens: str, lost: str) -> None:
        happens = re.sub(r"/[^\s`']*/(?=[\w.-]+\.(pt|lock|jsonl)\b)", ".../", happens)  # paths of the work folder
        happens = happens.replace(str(self.work / "logs"), "<logs>")
        self.rows.append((fault, happens, lost))
        print(f"| {fault} | {happens} | {lost} |", flush=True)

    # -----------------------------------------------------------------------------------------

    def preemption(self, ranks: int, target: str, sig: signal.Signals, label: str) -> None:
        name = f"pre-{ranks}-{target}-{sig.name}"
        self.scontrol_record.unlink(missing_ok=True)
        rc, stopped, output, orphans = self.start_and_signal(name, ranks, target, sig)
        last = (self.steps(name) or [0])[-1]
        log = (self.run_dir(name) / "out.log").read_text()
        line = next((line.split(" | ")[-1] for line in log.splitlines() if "Preempted by" in line), "no line")
        saved = [step_checkpoint_number(path) for path in RunDir(self.run_dir(name)).step_checkpoints()]
        requeues = self.scontrol_record.read_text().count("requeue 4242") if self.scontrol_record.exists() else 0
        resumed, _ = self.run(ranks, self.values(name, ranks, resume="latest"))
        steps = self.steps(name)
        traceback = "Traceback" in output
        self.add(
            label,
            f"rc {rc} after {stopped:.1f} s; `{line[:60]}...`; step_{saved[-1] if saved else '-'}.pt saved; "
            f"scontrol requeue called {requeues}x; {len(orphans)} orphan workers; traceback: {traceback}; "
            f"resume rc {resumed.returncode}",
            f"{last - (saved[-1] if saved else 0)} steps (last logged {last}); metrics steps after resume "
            f"{'1..16 once each' if steps == list(range(1, STEPS + 1)) else steps}",
        )

    def ctrl_c_twice(self) -> None:
        name = "ctrl-c-twice-1"
        proc = subprocess.Popen(
            self.command(1, self.values(name, 1)),
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        while not (self.steps(name) or [0])[-1] >= SIGNAL_AT:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.02)
        signalled = time.time()
        proc.send_signal(signal.SIGINT)
        stderr = proc.communicate(timeout=300)[1]
        self.add(
            "Ctrl-C twice (SIGINT, then SIGINT 20 ms later), 1 rank",
            f"rc {proc.returncode} after {time.time() - signalled:.2f} s; stderr: "
            f"`{next((line for line in stderr.splitlines() if 'Ctrl-C' in line), 'no line')[:110]}...`; "
            f"traceback: {'Traceback' in stderr}",
            "the steps since the last checkpoint (as asked)",
        )

    def sigkill(self) -> None:
        name = "kill-1"
        rc, _, _, _ = self.start_and_signal(name, 1, "trainer", signal.SIGKILL)
        last = self.steps(name)[-1]
        resumed, _ = self.run(1, self.values(name, 1, resume="latest"))
        line = next(
            line for line in (self.run_dir(name) / "out.log").read_text().splitlines() if "Resumed from" in line
        )
        start = int(line.split("step_")[1].split(".pt")[0])
        self.add(
            "SIGKILL, 1 rank (node dies)",
            f"rc {rc}; resume rc {resumed.returncode} from step_{start}.pt",
            f"{last - start} steps redone (< --save-every-n-steps {SAVE_EVERY})",
        )

    def base_run(self, ranks: int) -> Path:
        """base-<ranks>: the uninterrupted run the resume rows start from (run once)."""
        name = f"base-{ranks}"
        if not (RunDir(self.run_dir(name)).epoch_checkpoint(2)).exists():
            result, _ = self.run(ranks, self.values(name, ranks))
            assert result.returncode == 0, result.stderr[-2000:]
        return self.run_dir(name)

    def changed_resumes(self) -> None:
        source = "base-1"
        self.base_run(1)
        checkpoint = RunDir(self.run_dir(source)).step_checkpoint(5)
        for label, changed in [
            ("resume mid-epoch with --batch-size 32 -> 16", dict(batch_size=16)),
            ("resume mid-epoch with --workers 0 -> 1", dict(workers=1)),
            ("resume mid-epoch with another --train-num-samples", dict(train_num_samples=384)),
            ("resume with --loss clip (was adacl)", dict(loss="clip", adacl_queue_size=None)),
            ("resume with --adacl-queue-size 40 (was 48)", dict(adacl_queue_size=40)),
            ("resume with another architecture (--force-context-length 16)", dict(force_context_length=16)),
        ]:
            result, _ = self.run(1, self.values(f"changed-{len(self.rows)}", 1, **changed, resume=str(checkpoint)))
            self.add(
                label,
                f"rc {result.returncode}: `{last_line(result.stderr)[:160]}...`",
                "nothing (refused before any step)",
            )
        # 2 ranks -> 1 mid-epoch, and 1 -> 2 at the epoch boundary.
        self.base_run(2)
        result, _ = self.run(
            1,
            self.values(
                "changed-world", 1, batch_size=16, resume=str(RunDir(self.run_dir("base-2")).step_checkpoint(5))
            ),
        )
        self.add(
            "resume a 2-rank mid-epoch checkpoint on 1 rank",
            f"rc {result.returncode}: `{last_line(result.stderr)[:160]}...`",
            "nothing (refused)",
        )
        result, _ = self.run(
            2, self.values("boundary-world", 2, resume=str(RunDir(self.run_dir(source)).epoch_checkpoint(1)))
        )
        reference = {r["step"]: r["lr"] for r in RunDir(self.run_dir(source)).metrics("train")}
        lrs = [r["lr"] for r in RunDir(self.run_dir("boundary-world")).metrics("train")]
        same = all(abs(lr - reference[9 + k]) <= 1e-12 * max(1.0, lr) for k, lr in enumerate(lrs))
        self.add(
            "resume a 1-rank epoch_1.pt on 2 ranks (epoch boundary)",
            f"rc {result.returncode}; allowed, logged; LR of steps 9..16 equal to the 1-rank run's: {same}",
            "nothing",
        )

    def broken_checkpoints(self) -> None:
        for case in ("latest", "path"):
            name = f"trunc-{case}"
            shutil.copytree(self.run_dir("base-1"), self.run_dir(name))
            newest = RunDir(self.run_dir(name)).epoch_checkpoint(2)  # cut short, as by a full disk or a dying copy
            newest.write_bytes(newest.read_bytes()[:4096])
            result, _ = self.run(1, self.values(name, 1, resume="latest" if case == "latest" else str(newest)))
            log = (self.run_dir(name) / "out.log").read_text()
            fallback = next((line.split(" | ")[-1] for line in log.splitlines() if "Ignoring unreadable" in line), "")
            resumed = next((line.split(" | ")[-1] for line in log.splitlines() if "Resumed from" in line), "")
            if case == "latest":
                start = int(resumed.split("step ")[1].split(",")[0]) if resumed else 0
                self.add(
                    "truncated newest checkpoint (epoch_2.pt), --resume latest",
                    f"rc {result.returncode}; warns `{fallback[:70]}...`; `{resumed[:90]}`",
                    f"{STEPS - start} steps redone",
                )
            else:
                self.add(
                    "truncated checkpoint given as --resume PATH",
                    f"rc {result.returncode}: `{last_line(result.stderr)[:150]}...`",
                    "nothing (refused)",
                )

        def small_files():  # a full disk as far as checkpoints go: files over 20 MB fail with EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (20_000_000, 20_000_000))

        result, _ = self.run(1, self.values("full-1", 1, epochs=1), preexec=small_files)
        log = (self.run_dir("full-1") / "out.log").read_text()
        self.add(
            "disk full for checkpoints (every save fails: file-size limit)",
            f"rc {result.returncode}; {log.count('retrying once')} retries, "
            f"{log.count('CHECKPOINT SAVE FAILED: could not write')} logged failures; `{last_line(log)[30:150]}...`",
            "the run's model (reported, non-zero status)",
        )
        (self.work / "logs-file").write_text("a file where the logs folder should be")
        for extra in (dict(dry_run=True), {}):
            result, _ = self.run(1, self.values("x", 1, logs=str(self.work / "logs-file"), **extra))
            self.add(
                f"--logs is a file{' (--dry-run)' if extra else ''}",
                f"rc {result.returncode}: `{last_line(result.stderr)[:140]}...`",
                "nothing (refused at start)",
            )
        name = "rollback-1"
        shutil.copytree(self.run_dir("base-1"), self.run_dir(name))
        result, _ = self.run(1, self.values(name, 1, resume=str(RunDir(self.run_dir(name)).step_checkpoint(5))))
        log = (self.run_dir(name) / "out.log").read_text()
        moved = next((line.split(" | ")[-1] for line in log.splitlines() if "Rolled back" in line), "")
        self.add(
            "--resume step_5.pt into the same --name (roll back)",
            f"rc {result.returncode}; `{moved.split(': ', 1)[-1][:110]}...`; metrics steps "
            f"{'1..16 once each' if self.steps(name) == list(range(1, STEPS + 1)) else self.steps(name)}; "
            f"params.txt launches: {(self.run_dir(name) / 'params.txt').read_text().count('# launch at')}",
            "nothing (newer checkpoints kept aside)",
        )

    def pipes(self) -> None:
        shards = [f"pipe:cat {self.data}/train/shard-{index:06d}.tar" for index in range(3)]
        values = self.values(
            "pipes-1", 1, train_data="::".join([*shards, "pipe:false"]), dataset_type="webdataset", epochs=1
        )
        result, _ = self.run(1, values)
        line = next(
            (
                line.split(" | ")[-1]
                for line in (self.run_dir("pipes-1") / "out.log").read_text().splitlines()
                if "Epoch 0 done" in line
            ),
            "",
        )
        self.add(
            "a failing `pipe:` shard (pipe:false among 3 good ones)",
            f"rc {result.returncode}; `{line[line.index('skipped shard') : line.rindex(',')]}`",
            "that shard's samples",
        )

    def absent_ranks(self) -> None:
        env = {
            **self.env,
            "SLURM_NTASKS": "2",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODELIST": "localhost",
            "MASTER_PORT": str(free_port()),
        }
        result, seconds = self.run(1, self.values("alone", 1, dist_timeout=10), env=env)
        self.add(
            "SLURM_NTASKS=2 SLURM_PROCID=0 without srun, --dist-timeout 10",
            f"rc {result.returncode} after {seconds:.0f} s (startup included): `{last_line(result.stderr)[:120]}...`",
            "nothing",
        )

    # -----------------------------------------------------------------------------------------
    # Full disks, damaged checkpoints, two launches, starting over, stalls, changed resumes, exits

    def log(self, name: str) -> str:
        return (self.run_dir(name) / "out.log").read_text()

    def records_on_a_full_disk(self, ranks: int) -> None:
        """metrics.jsonl and results.jsonl on a full 1 MB tmpfs (symlinks from the run folder), freed after
        epoch 0's validation; checkpoints and out.log on the roomy disk."""
        name = f"records-full-{ranks}"
        run_dir = self.run_dir(name)
        with tmpfs(self.work / f"tmpfs-{name}", "1m") as disk:
            (run_dir / "checkpoints").mkdir(parents=True)
            (run_dir / "metrics.jsonl").symlink_to(disk / "metrics.jsonl")
            (run_dir / "checkpoints" / "results.jsonl").symlink_to(disk / "results.jsonl")
            fill(disk / "filler")
            proc = subprocess.Popen(
                self.command(ranks, self.values(name, ranks, val_data=self.val)),
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            wait_for_text(run_dir / "out.log", "Eval Epoch: 1", proc)
            time.sleep(1)
            (disk / "filler").unlink()  # room again: the held-back records go in with the next one
            _, stderr = proc.communicate(timeout=900)
            log = self.log(name)
            results = read_json_lines(disk / RESULTS_NAME)
            steps = self.steps(name)
        self.add(
            f"`metrics.jsonl` and `results.jsonl` on a full disk (1 MB tmpfs) until epoch 0 is validated, "
            f"{ranks} rank(s)",
            f"rc {proc.returncode}; one line per file: `{message(log, 'Could not write')[:110]}...`; then "
            f"`...{message(log, 'is written again')[-55:]}`; traceback: {'Traceback' in stderr}",
            f"nothing: metrics steps {'1..16 once each' if steps == list(range(1, STEPS + 1)) else steps}, "
            f"results epochs {[r['epoch'] for r in results]}",
        )

    def checkpoints_on_a_full_disk(self) -> None:
        """The checkpoint folder on a 60 MB tmpfs: room for one checkpoint (41 MB), not for the next one's temp file."""
        name = "ckpt-full-1"
        with tmpfs(self.work / f"tmpfs-{name}", "60m") as disk:
            self.run_dir(name).mkdir(parents=True)
            (self.run_dir(name) / "checkpoints").symlink_to(disk)
            result, _ = self.run(1, self.values(name, 1, epochs=1))
            saved = sorted(p.name for p in disk.glob("*.pt"))
        log = self.log(name)
        self.add(
            "disk full for checkpoints (a 60 MB tmpfs: step_5.pt fits, epoch_1.pt does not)",
            f"rc {result.returncode}; `{message(log, 'CHECKPOINT SAVE FAILED')[:125]}...`; "
            f"`{last_line(log).split(' | ')[-1][:90]}...`",
            f"the final model, reported (status 1); kept: {saved}",
        )

    def damaged_checkpoint(self, ranks: int) -> None:
        name = f"flipped-{ranks}"
        shutil.copytree(self.base_run(ranks), self.run_dir(name))
        flip_bits(RunDir(self.run_dir(name)).epoch_checkpoint(2))
        result, _ = self.run(ranks, self.values(name, ranks, resume="latest"))
        log = self.log(name)
        self.add(
            f"64 flipped bits inside the newest checkpoint (`epoch_2.pt`), `--resume latest`, {ranks} rank(s)",
            f"rc {result.returncode}; `{message(log, 'Skipping unreadable')[:150]}...`; "
            f"`{message(log, 'Resumed from').split(':')[0][:90]}`",
            f"{STEPS - 15} step redone (from step_15.pt)",
        )

    def second_launch(self, ranks: int) -> None:
        name = f"twice-{ranks}"
        first = subprocess.Popen(
            self.command(ranks, self.values(name, ranks, epochs=20)),
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while not self.steps(name):
                assert first.poll() is None
                time.sleep(0.05)
            second, seconds = self.run(ranks, self.values(name, ranks, resume="latest"))
            still = first.poll() is None
        finally:
            kill_run(first)
        third, _ = self.run(ranks, self.values(name, ranks, resume="latest"))
        taken = message(self.log(name), "Taking over")
        self.add(
            f"a second `--resume latest` launch while the run trains, {ranks} rank(s)",
            f"rc {second.returncode} after {seconds:.0f} s: `{last_line(second.stderr)[:150]}...`; the first "
            f"launch trains on: {still}. After SIGKILL of the first: `{taken[:80]}...`, rc {third.returncode}",
            "nothing (refused before any step)",
        )

    def start_over(self) -> None:
        name = "over-1"
        shutil.copytree(self.base_run(1), self.run_dir(name))
        for path in (self.run_dir(name) / "checkpoints").glob("*.pt"):
            path.write_bytes(path.read_bytes()[:4096])
        result, _ = self.run(1, self.values(name, 1, resume="latest"))
        moved = message(self.log(name), "Starting over")
        self.add(
            "every checkpoint unreadable, `--resume latest` (starts over)",
            f"rc {result.returncode}; `{moved[:150]}...`; metrics steps "
            f"{'1..16 once each' if self.steps(name) == list(range(1, STEPS + 1)) else self.steps(name)}",
            "the run's training (restarted; the earlier records kept aside)",
        )

    def stalled_pipe(self, ranks: int) -> None:
        name = f"stalled-{ranks}"
        shards = [f"pipe:cat {self.data}/train/shard-{index:06d}.tar" for index in range(3)] + ["pipe:sleep 600"]
        result, seconds = self.run(
            ranks,
            self.values(
                name, ranks, train_data="::".join(shards), dataset_type="webdataset", epochs=1, shard_timeout=5
            ),
        )
        line = message(self.log(name), "Epoch 0 done")
        self.add(
            f"a stalled `pipe:` shard (`pipe:sleep 600` among 3 good ones), `--shard-timeout 5`, {ranks} rank(s)",
            f"rc {result.returncode} after {seconds:.0f} s (startup included); "
            f"`{message(self.log(name), 'ShardStalled')[:150]}...`; "
            f"`{line[line.index('skipped shard') : line.rindex(',')]}`"
            f"; `sleep 600` processes left: {len(processes_running(b'sleep 600'))}",
            "that shard's samples",
        )

    def changed_schedule(self) -> None:
        name = "changed-schedule-1"
        result, _ = self.run(
            1,
            self.values(
                name, 1, lr=1e-2, epochs=3, grad_clip_norm=1, resume=str(RunDir(self.base_run(1)).step_checkpoint(5))
            ),
        )
        warnings = [line.split(" | ")[-1] for line in self.log(name).splitlines() if "| WARNING | Resuming " in line]
        self.add(
            "resume mid-epoch with `--lr 2e-3 -> 1e-2 --epochs 2 -> 3 --grad-clip-norm None -> 1`",
            f"rc {result.returncode}; {len(warnings)} warning lines, one per flag, e.g. "
            f"`{warnings[0].split(': ', 1)[-1] if warnings else ''}`",
            "nothing (accepted, named)",
        )

    def signal_at_startup(self, ranks: int) -> None:
        name = f"early-{ranks}"
        proc = subprocess.Popen(
            self.command(ranks, self.values(name, ranks)),
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        targets = [proc.pid] if ranks == 1 else []
        while ranks > 1 and len(targets) < ranks:
            targets = children(proc.pid)
            time.sleep(0.01)
        while not all(catches(pid, signal.SIGTERM) for pid in targets):
            time.sleep(0.01)
        signalled = time.time()
        for pid in targets:
            os.kill(pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=600)
        line = message(self.log(name), "Preempted by")
        self.add(
            f"SIGTERM {'to both ranks ' if ranks > 1 else ''}during startup (while importing torch), {ranks} rank(s)",
            f"rc {proc.returncode} after {time.time() - signalled:.0f} s; `{line[:70]}...`; traceback: "
            f"{'Traceback' in stderr}",
            "nothing (step_1.pt saved)",
        )

    def rank_dies(self) -> None:
        name = "dies-2"
        proc = subprocess.Popen(
            self.command(2, self.values(name, 2, dist_timeout=30)),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        while (self.steps(name) or [0])[-1] < 3:
            assert proc.poll() is None
            time.sleep(0.05)
        os.kill(sorted(children(proc.pid))[1], signal.SIGKILL)
        output = proc.communicate(timeout=600)[0]
        line = message(output, "a collective with the other ranks failed")
        self.add(
            "rank 1 killed (SIGKILL) mid-epoch, 2 ranks under torchrun",
            f"rc {proc.returncode}; rank 0: `{line[:150]}...`; then `{last_line(output)}`; traceback: "
            f"{'Traceback' in output}",
            "the steps since the last step_N.pt (`--resume latest`)",
        )

    def torchrun_config_error(self) -> None:
        result, _ = self.run(2, self.values("bad-2", 2, resume=str(self.work / "missing.pt")))
        lines = [line for line in result.stderr.splitlines() if line.startswith(("error:", "torchrun:"))]
        self.add(
            "a configuration error under `python -m training.torchrun`, 2 ranks",
            f"rc {result.returncode}; `{lines[0][:80]}` (each rank), then `{lines[-1][:110]}...`; traceback: "
            f"{'Traceback' in result.stderr}",
            "nothing",
        )

    # -----------------------------------------------------------------------------------------
    # A stalled first shard, dashboards on a full disk, hostile csv paths, the stale-lock race, a NaN streak,
    # surprising run folders

    def good_shards(self) -> List[str]:
        return [str(self.data / "train" / f"shard-{index:06d}.tar") for index in range(4)]

    def first_shard_values(self, name: str, ranks: int, first: str, **overrides: Any) -> Dict[str, Any]:
        """Run `name` (1 epoch) on `first` listed before the 4 good shards."""
        return self.values(
            name,
            ranks,
            train_data="::".join([first, *self.good_shards()]),
            dataset_type="webdataset",
            epochs=1,
            **overrides,
        )

    def stalled_first_shard(self, ranks: int) -> None:
        name = f"stalled-first-{ranks}"
        result, seconds = self.run(ranks, self.first_shard_values(name, ranks, "pipe:sleep 600", shard_timeout=5))
        self.add(
            f"a stalled `pipe:` shard listed first (`pipe:sleep 600` then 4 good ones), `--shard-timeout 5`, "
            f"{ranks} rank(s)",
            f"rc {result.returncode} after {seconds:.0f} s (startup included); the start-up check: "
            f"`{message(result.stderr, 'ShardStalled')[:110]}...`; steps logged {len(self.steps(name))}; "
            f"`sleep 600` processes left: {len(processes_running(b'sleep 600'))}",
            "that shard's samples",
        )

    def signal_during_a_stalled_read(self, ranks: int) -> None:
        name = f"stalled-term-{ranks}"
        proc = subprocess.Popen(
            self.command(ranks, self.first_shard_values(name, ranks, "pipe:sleep 601")),
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        while len(processes_running(b"sleep 601")) < ranks:  # every rank's start-up check waits on it
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.05)
        time.sleep(1)
        signalled = time.time()
        for pid in [proc.pid] if ranks == 1 else children(proc.pid):
            os.kill(pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=600)
        seconds = time.time() - signalled
        ended, stopped = message(stderr, "ShardInterrupted")[:100], message(self.log(name), "Preempted by")[:60]
        who = "to both ranks " if ranks > 1 else ""
        self.add(
            f"SIGTERM {who}while the start-up check waits on a stalled `pipe:` shard (default `--shard-timeout` "
            f"300), {ranks} rank(s)",
            f"rc {proc.returncode} after {seconds:.1f} s; `{ended}...`; `{stopped}...`; "
            f"traceback: {'Traceback' in stderr}",
            "nothing (step_1.pt saved)",
        )

    def dashboards_on_a_full_disk(self, ranks: int) -> None:
        """TensorBoard's folder on a full 1 MB tmpfs, out.log a link to /dev/full (every write: ENOSPC)."""
        name = f"dashboards-full-{ranks}"
        run_dir = self.run_dir(name)
        with tmpfs(self.work / f"tmpfs-{name}", "1m") as disk:
            run_dir.mkdir(parents=True)
            (disk / "tensorboard").mkdir()
            (run_dir / "tensorboard").symlink_to(disk / "tensorboard")
            (run_dir / "out.log").symlink_to("/dev/full")
            fill(disk / "filler")
            result, _ = self.run(ranks, self.values(name, ranks, report_to="tensorboard"))
        output = result.stderr
        self.add(
            f"`--report-to tensorboard` on a full disk (1 MB tmpfs) and `out.log` on `/dev/full`, {ranks} rank(s)",
            f"rc {result.returncode}; one line each: `{message(output, 'tensorboard (disk full')[:120]}...`, "
            f"`{message(output, 'out.log (disk full')[:100]}...`; `Logging error` blocks: "
            f"{output.count('--- Logging error ---')}; last line `...{last_line(output)[-60:]}`; traceback: "
            f"{'Traceback' in output}; epoch_2.pt written: {RunDir(run_dir).epoch_checkpoint(2).exists()}",
            "the TensorBoard events and log lines after the disk filled (listed as NOT WRITTEN)",
        )

    def csv_device_paths(self) -> None:
        """A csv whose image paths include /dev/zero and a FIFO, and a caption of 10 MB."""
        name = "csv-devices-1"
        folder = self.work / "csv-devices"
        folder.mkdir(exist_ok=True)
        rows = []
        with tarfile.open(self.data / "train" / "shard-000000.tar") as tar:
            for member in tar.getmembers():
                if member.name.endswith(".png"):
                    path = folder / Path(member.name).name
                    path.write_bytes(tar.extractfile(member).read())
                    rows.append([str(path), f"a scene {len(rows)}"])
        fifo = folder / "fifo.png"
        if not fifo.exists():
            os.mkfifo(fifo)
        rows += [["/dev/zero", "zeros"], [str(fifo), "a fifo"], [rows[0][0], "x" * 10_000_000]]
        with open(folder / "train.csv", "w", newline="") as f:
            csv.writer(f).writerows([["filepath", "title"], *rows])
        result, seconds = self.run(
            1,
            self.values(
                name,
                1,
                train_data=str(folder / "train.csv"),
                dataset_type="csv",
                csv_separator=",",
                train_num_samples=None,
                epochs=1,
            ),
        )
        epoch = (RunDir(self.run_dir(name)).metrics("epoch") or [{}])[0]
        counts = {reason: epoch.get(f"skipped/{reason}") for reason in ("not_a_file", "oversized_caption")}
        self.add(
            "csv image paths `/dev/zero` and a FIFO, and a 10 MB caption, among 128 good rows",
            f"rc {result.returncode} after {seconds:.0f} s; skipped unread, counted {counts}; traceback: "
            f"{'Traceback' in result.stderr}",
            "those 3 rows",
        )

    def lock_race(self) -> None:
        folder = self.work / "lock-race"
        folder.mkdir(exist_ok=True)
        start = time.time()
        outcomes = race_for_a_stale_lock(folder, 200, env=self.env)
        self.add(
            "two launches taking a dead owner's `run.lock` at the same moment (200 trials of two processes)",
            f"{outcomes.count('held+held')} trials with two holders, {outcomes.count('held+refused')} with one "
            f"holder and one refusal ({time.time() - start:.0f} s)",
            "nothing (the loser stops in one line)",
        )

    def nan_streak(self, ranks: int) -> None:
        name = f"nan-{ranks}"
        result, _ = self.run(
            ranks, self.values(name, ranks, lr=NAN_LR, warmup=1, max_nonfinite_steps=10, save_every_n_steps=2)
        )
        log = self.log(name)
        saved = sorted(path.name for path in (self.run_dir(name) / "checkpoints").glob("*.pt"))
        warnings = [line.split(" | ")[-1].split(":")[0] for line in log.splitlines() if "non-finite loss (" in line]
        warnings = warnings or ["-"]
        self.add(
            f"a diverged loss from step 3 on, across the end of epoch 0 (`--lr {NAN_LR:g} --warmup 1 "
            f"--max-nonfinite-steps 10 --save-every-n-steps 2`), {ranks} rank(s)",
            f"rc {result.returncode}; warnings `{warnings[0]}`..`{warnings[-1]}` (metrics.jsonl steps up to "
            f"{self.steps(name)[-1]}); `{message(log, 'Not writing')[:90]}...`; "
            f"`...{message(log, 'consecutive steps had')[-130:]}`; checkpoints {saved}",
            "the diverged steps (nothing written of them)",
        )

    def nan_resume(self, ranks: int) -> None:
        """From base's epoch_1.pt (step 8) with --lr 1000: step 10's loss is still finite but its update overflows,
        at a step_N.pt step; the checkpoint the stop line names resumes at --lr 2e-3 and trains."""
        name = f"nan-resume-{ranks}"
        start = RunDir(self.base_run(ranks)).epoch_checkpoint(1)
        result, _ = self.run(
            ranks, self.values(name, ranks, lr=NAN_LR, warmup=1, max_nonfinite_steps=3, resume=str(start))
        )
        named = re.search(r"with --resume (\S+) after changing them", self.log(name))
        resumed, status, losses = f"{name}-resumed", "-", []
        if named:  # a fresh run in a folder of its own, from that file
            again, _ = self.run(ranks, self.values(resumed, ranks, resume=named.group(1)))
            status = again.returncode
            losses = [record["loss"] for record in RunDir(self.run_dir(resumed)).metrics("train")]
        finite = sum(1 for loss in losses if math.isfinite(float(loss)))  # metrics.jsonl writes NaN as "nan"
        self.add(
            f"an update that overflows after a finite loss at a `step_N.pt` step (from `epoch_1.pt` with `--lr "
            f"{NAN_LR:g} --warmup 1`), then a resume from the checkpoint the stop line names with `--lr 2e-3`, "
            f"{ranks} rank(s)",
            f"rc {result.returncode}; `{message(self.log(name), 'Not writing')[:120]}...`; the stop line names "
            f"`{Path(named.group(1)).name if named else 'no checkpoint'}`; resumed: rc {status}, "
            f"{finite} of {len(losses)} steps finite",
            "the diverged steps (no checkpoint of a non-finite state is written)",
        )

    def peak_rss(self, values: Dict[str, Any]) -> tuple:
        """(the run's result code, its peak resident memory in MB): one rank, a process of its own."""
        proc = subprocess.Popen(
            self.command(1, values), env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        return proc.returncode, usage.ru_maxrss / 1024

    def huge_member(self) -> None:
        """A shard with a member of HUGE_MEMBER_BYTES (a sparse file: no disk) among its 128 samples, read as a file
        and through `pipe:cat`, against the same shard without it: peak RSS of each run."""
        huge = self.work / "huge-member.tar"
        write_shard_with_a_huge_member(huge, self.data / "train" / "shard-000000.tar", HUGE_MEMBER_BYTES)
        try:
            runs = {}
            for label, shard in (
                ("without", self.data / "train" / "shard-000000.tar"),
                ("file", huge),
                ("pipe", f"pipe:cat {huge}"),
            ):
                name = f"huge-member-{label}"
                rc, peak = self.peak_rss(
                    self.values(
                        name, 1, train_data=str(shard), dataset_type="webdataset", train_num_samples=128, epochs=1
                    )
                )
                epoch = (RunDir(self.run_dir(name)).metrics("epoch") or [{}])[0]
                runs[label] = (rc, peak, epoch.get("skipped/oversized_image"))
        finally:
            huge.unlink(missing_ok=True)
        baseline = runs["without"][1]
        for label in ("file", "pipe"):
            rc, peak, oversized = runs[label]
            self.add(
                f"a {HUGE_MEMBER_BYTES / 2**30:g} GiB image member in a shard of 128 samples, read as a "
                f"{'file' if label == 'file' else '`pipe:cat` stream'}",
                f"rc {rc}; skipped unread, counted oversized_image {oversized}; peak RSS {peak:.0f} MB against "
                f"{baseline:.0f} MB for the shard without it ({peak / baseline:.2f}x)",
                "that sample",
            )

    def cut_shards(self, ranks: int) -> None:
        """A copy of shard 0 cut at the member boundary halfway (an interrupted copy: no end-of-archive blocks),
        and a copy of shard 1 whose appended last header claims 50 GB with 1 kB of data after it, trained alone
        (on 2 ranks each rank reads one of them). Checks that the epoch summary names both shards."""
        cut, lying = self.work / "cut.tar", self.work / "lying.tar"
        with tarfile.open(self.data / "train" / "shard-000000.tar") as tar:
            members = tar.getmembers()
        boundary = members[len(members) // 2].offset
        cut.write_bytes((self.data / "train" / "shard-000000.tar").read_bytes()[:boundary])
        with tarfile.open(self.data / "train" / "shard-000001.tar") as tar:
            end = max(
                member.offset_data + -(-member.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
                for member in tar.getmembers()
            )
        info = tarfile.TarInfo("999999999.png")
        info.size = 50 * 10**9
        lying.write_bytes((self.data / "train" / "shard-000001.tar").read_bytes()[:end] + info.tobuf() + b"x" * 1024)
        name = f"cut-shards-{ranks}"
        result, _ = self.run(
            ranks,
            self.values(
                name, ranks, train_data=f"{cut}::{lying}", dataset_type="webdataset", train_num_samples=192, epochs=1
            ),
        )  # every sample of both
        log = self.log(name)
        line = message(log, "Epoch 0 done")
        summary = line[line.find("skipped shard") : line.rindex(",")].replace(f"{self.work}/", "")
        names_both = all(f"{shard}: bad_tar" in line for shard in (cut, lying))
        warnings = [message(log, f"{shard.name} ended early") for shard in (cut, lying)]
        self.add(
            f"a shard cut at a member boundary (half its samples, no end-of-archive blocks) and one whose last "
            f"header claims 50 GB with 1 kB after it, trained alone, {ranks} rank{'s' if ranks > 1 else ''}",
            f"rc {result.returncode}; "
            + "; ".join(f"`{warning[:130]}...`" for warning in warnings if warning)
            + f" (out.log: rank 0's warnings); `{summary}`; the epoch summary names both shards: {names_both}",
            "the samples after the cut",
        )

    def killed_during_a_save(self) -> None:
        """SIGKILL the moment a checkpoint's temporary file appears (a save in progress), then `--resume latest`."""
        name = "killed-saving-1"
        checkpoints = self.run_dir(name) / "checkpoints"
        proc = subprocess.Popen(
            self.command(1, self.values(name, 1)), env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        left = []
        while not left and proc.poll() is None:
            left = [path.name for path in checkpoints.glob(".*.tmp")] if checkpoints.is_dir() else []
        proc.kill()
        proc.wait()
        left = [path.name for path in checkpoints.glob(".*.tmp")]
        result, _ = self.run(1, self.values(name, 1, resume="latest"))
        self.add(
            "SIGKILL while a checkpoint is being written (its temporary file exists), then `--resume latest`",
            f"rc {proc.returncode}, left {left}; resume rc {result.returncode}: "
            f"`{message(self.log(name), 'temporary file(s)')[:120]}...`; temporary files after: "
            f"{[path.name for path in checkpoints.glob('.*.tmp')]}",
            "the steps since the last checkpoint",
        )

    def on_host(self, host: str, values: Dict[str, Any]) -> List[str]:
        """The run's command in a UTS namespace whose host name is `host` (root): a launch on another node."""
        return ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$0" "$@"', *self.command(1, values)]

    def lock_of_another_host(self) -> None:
        """node-a trains; node-b's `--resume latest` while it lives, after node-a dies (SIGKILL) with a fresh
        heartbeat, and once the heartbeat is older than the bound (the lock's mtime set back 130 s: that wait)."""
        name = "other-host-1"
        lock = self.run_dir(name) / "run.lock"
        first = subprocess.Popen(
            self.on_host("node-a", self.values(name, 1, epochs=20)),
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            while not self.steps(name):
                assert first.poll() is None
                time.sleep(0.05)
            live = subprocess.run(
                self.on_host("node-b", self.values(name, 1, resume="latest")),
                env=self.env,
                capture_output=True,
                text=True,
                timeout=900,
            )
        finally:
            kill_run(first)
        dead = subprocess.run(
            self.on_host("node-b", self.values(name, 1, resume="latest")),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        aged = time.time() - 130
        os.utime(lock, (aged, aged))
        later = subprocess.run(
            self.on_host("node-b", self.values(name, 1, resume="latest")),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        self.add(
            "a `--resume latest` launch on node-b (a UTS namespace) while node-a trains the run, right after "
            "node-a dies (SIGKILL), and 130 s later",
            f"live: rc {live.returncode} `{last_line(live.stderr)[:90]}...`; just dead: rc {dead.returncode} "
            f"`...{last_line(dead.stderr)[-150:]}`; 130 s later: rc {later.returncode}, "
            f"`{message(self.log(name), 'has not refreshed its heartbeat')[:150]}...`",
            "nothing (refused, then taken over)",
        )

    def one_line_errors(self) -> None:
        """Bad input that ended in a traceback or misleading words: each command's status and last line."""
        checkpoint = RunDir(self.base_run(1)).epoch_checkpoint(2)
        fifo, pickle_file = self.work / "fifo.pt", self.work / "code.pt"
        if not fifo.exists():
            os.mkfifo(fifo)
        torch.save({"state_dict": CallsPrint()}, pickle_file)
        evaluation = [
            sys.executable,
            "-m",
            "training.evaluation",
            "--demo-root",
            str(self.data),
            "--output-dir",
            str(self.work / "evaluation"),
            "--in-process",
            "--model",
        ]
        cases = [
            ("`--lr -1`", self.command(1, self.values("lr", 1, lr=-1))),
            (
                "`--model ViT-B-32 --pretrained` an adacl-tiny `epoch_2.pt`",
                self.command(1, self.values("arch", 1, model="ViT-B-32", pretrained=str(checkpoint))),
            ),
            (
                "`training.evaluation --in-process --pretrained` a file that is no checkpoint",
                [*evaluation, "adacl-tiny", "--pretrained", str(self.work / "bin" / "scontrol")],
            ),
            (
                "`--pretrained` a pickle that would call `print`",
                self.command(1, self.values("code", 1, pretrained=str(pickle_file))),
            ),
            *[
                (f"`--resume {label}`", self.command(1, self.values("resume-odd", 1, resume=str(path))))
                for label, path in (("/dev/zero", "/dev/zero"), ("a FIFO", fifo), ("a folder", self.work))
            ],
        ]
        for label, command in cases:
            result = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=900)
            self.add(
                label,
                f"rc {result.returncode}: `{last_line(result.stderr)[:170]}...`; traceback: "
                f"{'Traceback' in result.stderr}",
                "nothing",
            )
        name = "immutable-1"
        shutil.copytree(self.base_run(1), self.run_dir(name))
        (self.run_dir(name) / "run.lock").write_text('{"pid": 999999999, "host": "%s"}' % socket.gethostname())
        subprocess.run(["chattr", "+i", str(self.run_dir(name))], check=True)
        try:
            result, _ = self.run(1, self.values(name, 1, resume="latest"))
        finally:
            subprocess.run(["chattr", "-i", str(self.run_dir(name))], check=True)
        self.add(
            "`--resume latest` into an immutable run folder (`chattr +i`) holding a dead launch's `run.lock`",
            f"rc {result.returncode}: `{last_line(result.stderr).split(' | ')[-1][:170]}...`; traceback: "
            f"{'Traceback' in result.stderr}",
            "nothing",
        )

    def same_second_launches(self) -> None:
        """Three launches without --name started together (a job array's tasks), outside SLURM, in the same second
        for sure: each runs training.main under FROZEN_CLOCK_LAUNCH, which stops the clock the automatic run name
        reads (`datetime` in training.trainer.launch.folder) at one instant. Their folders and exit statuses."""
        logs = self.work / "logs-same-second"
        env = {key: value for key, value in self.env.items() if key != "SLURM_JOB_ID"}
        values = {**self.values(None, 1, logs=str(logs), epochs=1, train_num_samples=64), "name": None}
        command = [sys.executable, "-c", FROZEN_CLOCK_LAUNCH, *argv_from_values(values)]
        launches = [
            subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for _ in range(3)
        ]
        outcomes = [(proc.wait(timeout=900), last_line(proc.stderr.read())) for proc in launches]
        folders = sorted(path.name for path in logs.iterdir()) if logs.is_dir() else []
        refused = next((line.split(" | ")[-1][:150] for rc, line in outcomes if rc), "")
        self.add(
            "three launches without `--name` in the same second (a job array), outside SLURM (the name's clock "
            "frozen at one instant)",
            f"rc {[rc for rc, _ in outcomes]}; folders {[re.sub(r'-model_.*-p_fp32', '-...', f) for f in folders]}"
            f"{'; `' + refused + '`' if refused else ''}; one folder per launch: "
            f"{len(folders) == len(launches) and not any(rc for rc, _ in outcomes)}",
            "nothing" if len(folders) == len(launches) else "the refused launches' runs",
        )

    def read_only_resume(self, ranks: int) -> None:
        name = f"read-only-{ranks}"
        shutil.copytree(self.base_run(ranks), self.run_dir(name))
        with read_only(self.run_dir(name)):
            result, _ = self.run(ranks, self.values(name, ranks, resume="latest"))
        lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        self.add(
            f"`--resume latest` into a read-only run folder (a read-only bind mount), {ranks} rank(s)",
            f"rc {result.returncode}: `{(lines or [''])[0][:150]}...`; traceback: {'Traceback' in result.stderr}",
            "nothing (refused before any step)",
        )

    def surprising_names(self) -> None:
        for label, name in (("`--name ../outside` (outside `--logs`), `--dry-run`", "../outside"), ('`--name ""`', "")):
            result, _ = self.run(1, self.values(name, 1, dry_run=True))
            line = next((line for line in result.stderr.splitlines() if line.startswith(("warning:", "error:"))), "")
            self.add(label, f"rc {result.returncode}: `{line[:150]}...`", "nothing")

    def empty_checkpoint(self) -> None:
        name = "empty-1"
        shutil.copytree(self.base_run(1), self.run_dir(name))
        RunDir(self.run_dir(name)).epoch_checkpoint(2).write_bytes(b"")
        result, _ = self.run(1, self.values(name, 1, resume="latest"))
        log = self.log(name)
        self.add(
            "a zero-byte newest checkpoint (`epoch_2.pt`), `--resume latest`",
            f"rc {result.returncode}; `{message(log, 'unreadable checkpoint')[:150]}...`; "
            f"`{message(log, 'Resumed from').split(':')[0][:90]}`",
            f"{STEPS - 15} step redone (from step_15.pt)",
        )

    def text_only_first_shard(self) -> None:
        name = "text-first-1"
        text_only = self.work / "text-only.tar"
        with tarfile.open(text_only, "w") as tar:
            for key in range(128):
                data = f"caption {key}".encode()
                info = tarfile.TarInfo(f"{key:09d}.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        result, _ = self.run(1, self.first_shard_values(name, 1, str(text_only)))
        line = message(self.log(name), "Epoch 0 done")
        self.add(
            "a first shard of captions only (no images) before 4 good shards",
            f"rc {result.returncode}; trained {len(self.steps(name))} steps; "
            f"`{line[line.find('skipped samples') : line.rindex(',')]}`",
            "that shard's samples",
        )

    def new_user_faults(self) -> None:
        """The rows of `helpers.fault_rows` (a new user's mistakes and odd inputs), each its command in a process of
        its own: its status, its line, and whether the row's promise holds."""
        inputs = write_fault_inputs(self.work / "new-user", self.data, self.train_in_a_process)
        for row in ROWS:
            limit = row.file_size_limit
            result = subprocess.run(
                [sys.executable, "-m", row.tool, *row.argv(inputs)],
                env={**launcher_free(self.env), **row.env},
                capture_output=True,
                text=True,
                timeout=900,
                preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))) if limit else None,
            )
            output = result.stdout + result.stderr
            problems = row.problems(inputs, result.returncode, output)
            self.add(
                row.fault,
                f"rc {result.returncode}: `{row.outcome(inputs, output)[:190]}...`; traceback: "
                f"{'Traceback' in output}; the row holds: {not problems}{'' if not problems else f' ({problems})'}",
                row.lost,
            )

        png = grey16_png()
        clipped = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
        trained = np.asarray(decode_image(png, max_pixels=10**6)[0])
        self.add(
            "a 16-bit grey PNG (a ramp from 0 to 65535), decoded as training decodes it",
            f"RGB of mean {trained.mean():.1f} of 255, {100 * (trained == 255).mean():.1f}% white (PIL's own "
            f"conversion: mean {clipped.mean():.1f}, {100 * (clipped == 255).mean():.1f}% white)",
            "nothing",
        )

    def train_in_a_process(self, argv: List[str]) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "training.main", *argv], env=self.env, capture_output=True, text=True, timeout=900
        )
        assert result.returncode == 0, result.stderr[-2000:]

    def inodes_and_read_only(self) -> None:
        """A run folder on a tmpfs out of inodes (bytes free), and a read-only checkpoints/ (a read-only bind mount)
        holding the temporary file of a killed save: the lines name the inodes and the read-only folder."""
        folder = self.work / "no-inodes"
        with tmpfs(folder, "200m,nr_inodes=16"):
            for index in range(64):
                try:
                    (folder / f"file-{index}").touch()
                except OSError:
                    break
            for label, extra in (("`--dry-run`", {"dry_run": True}), ("a real run", {})):
                result, _ = self.run(1, self.values("inodes", 1, logs=str(folder), **extra))
                self.add(
                    f"`--logs` on a file system out of inodes (a tmpfs of 200 MB, 16 inodes, all used), {label}",
                    f"rc {result.returncode}: `{last_line(result.stderr)[:190]}...`; traceback: "
                    f"{'Traceback' in result.stderr}",
                    "nothing (refused before any step)",
                )
        name = "read-only-checkpoints"
        shutil.copytree(self.base_run(1), self.run_dir(name))
        (self.run_dir(name) / "run.lock").unlink(missing_ok=True)
        (self.run_dir(name) / "checkpoints" / ".step_5.pt.abcd1234.tmp").write_bytes(b"cut")
        with read_only(self.run_dir(name) / "checkpoints"):
            result, _ = self.run(1, self.values(name, 1, resume="latest"))
        self.add(
            "`--resume latest` with a read-only `checkpoints/` (a read-only bind mount) holding a killed save's "
            "temporary file",
            f"rc {result.returncode}: `{last_line(result.stderr)[:190]}...`; traceback: {'Traceback' in result.stderr}",
            "nothing (refused before any step)",
        )


class CallsPrint:
    """Pickled as a call of `print`: what a malicious checkpoint holds in place of tensors."""

    def __reduce__(self):
        return print, ("this ran while loading",)


@contextlib.contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (e.g. "1m") mounted at `folder` while the block runs: a disk that fills up for real."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """`folder` read-only while the block runs (a read-only bind mount over itself: root writes nothing either)."""
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def fill(path: Path) -> None:
    """Write `path` until its disk is full."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def wait_for_text(path: Path, text: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not (path.exists() and text in path.read_text()):
        assert proc.poll() is None and time.time() < deadline, f"{text!r} never appeared in {path}"
        time.sleep(0.05)


def message(log: str, text: str) -> str:
    """The message of the first log line holding `text` ('' when none)."""
    return next((line.split(" | ")[-1] for line in log.splitlines() if text in line), "")


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one)")
    parser.add_argument("--cases", nargs="*", help="the groups of rows to measure (default: all), e.g. stalled_pipe")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="fault-table-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = Bench(work)

    def on_1_and_2_ranks(case: Callable[[int], Any]) -> Callable[[], List[Any]]:
        return lambda: [case(ranks) for ranks in (1, 2)]

    cases = {
        "preemption": lambda: [
            bench.preemption(*case)
            for case in (
                (1, "trainer", signal.SIGTERM, "SIGTERM, 1 rank"),
                (1, "trainer", signal.SIGUSR1, "SIGUSR1, 1 rank"),
                (2, "all", signal.SIGUSR1, "SIGUSR1 to both ranks (srun's delivery), 2 ranks under torchrun"),
                (2, "rank1", signal.SIGTERM, "SIGTERM to rank 1 only, 2 ranks"),
                (2, "torchrun", signal.SIGTERM, "SIGTERM to torchrun, 2 ranks"),
                (2, "torchrun", signal.SIGUSR1, "SIGUSR1 to torchrun only (it dies), 2 ranks"),
            )
        ],
        "interactive_stops": lambda: [
            bench.preemption(*case)
            for case in (
                (1, "trainer", signal.SIGINT, "SIGINT (Ctrl-C), 1 rank"),
                (1, "trainer", signal.SIGHUP, "SIGHUP, 1 rank"),
            )
        ],
        "ctrl_c_twice": bench.ctrl_c_twice,
        "sigkill": bench.sigkill,
        "changed_resumes": bench.changed_resumes,
        "broken_checkpoints": bench.broken_checkpoints,
        "pipes": bench.pipes,
        "absent_ranks": bench.absent_ranks,
        "damaged_checkpoint": on_1_and_2_ranks(bench.damaged_checkpoint),
        "second_launch": on_1_and_2_ranks(bench.second_launch),
        "stalled_pipe": on_1_and_2_ranks(bench.stalled_pipe),
        "signal_at_startup": on_1_and_2_ranks(bench.signal_at_startup),
        "records_on_a_full_disk": on_1_and_2_ranks(bench.records_on_a_full_disk),
        "checkpoints_on_a_full_disk": bench.checkpoints_on_a_full_disk,
        "start_over": bench.start_over,
        "changed_schedule": bench.changed_schedule,
        "torchrun_config_error": bench.torchrun_config_error,
        "stalled_first_shard": on_1_and_2_ranks(bench.stalled_first_shard),
        "signal_during_a_stalled_read": on_1_and_2_ranks(bench.signal_during_a_stalled_read),
        "dashboards_on_a_full_disk": on_1_and_2_ranks(bench.dashboards_on_a_full_disk),
        "csv_device_paths": bench.csv_device_paths,
        "lock_race": bench.lock_race,
        "nan_streak": on_1_and_2_ranks(bench.nan_streak),
        "nan_resume": on_1_and_2_ranks(bench.nan_resume),
        "huge_member": bench.huge_member,
        "cut_shards": on_1_and_2_ranks(bench.cut_shards),
        "killed_during_a_save": bench.killed_during_a_save,
        "lock_of_another_host": bench.lock_of_another_host,
        "one_line_errors": bench.one_line_errors,
        "same_second_launches": bench.same_second_launches,
        "read_only_resume": on_1_and_2_ranks(bench.read_only_resume),
        "surprising_names": bench.surprising_names,
        "empty_checkpoint": bench.empty_checkpoint,
        "text_only_first_shard": bench.text_only_first_shard,
        "rank_dies": bench.rank_dies,
        "new_user_faults": bench.new_user_faults,
        "inodes_and_read_only": bench.inodes_and_read_only,
    }
    needs_root = {
        "records_on_a_full_disk",
        "checkpoints_on_a_full_disk",
        "dashboards_on_a_full_disk",
        "read_only_resume",
        "lock_of_another_host",
        "one_line_errors",
        "inodes_and_read_only",
    }  # they mount a folder, or name a host
    print("| fault | what happens | what is lost |\n|---|---|---|", flush=True)
    for name in args.cases or cases:
        if name in needs_root and os.geteuid() != 0:
            print(f"skipped {name}: mounting a folder needs root", file=sys.stderr)
            continue
        cases[name]()


if __name__ == "__main__":
    main()
