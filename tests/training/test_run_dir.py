import json
import subprocess
import sys

import pytest

from training.run_dir import RunDir


def _run_folder(tmp_path, epochs=(1, 2, 10), steps=(5, 40)):
    run = RunDir(tmp_path / "run")
    run.checkpoint_dir.mkdir(parents=True)
    for name in [f"epoch_{n}.pt" for n in epochs] + [f"step_{n}.pt" for n in steps] + ["epoch_latest.pt", "x.pt"]:
        (run.checkpoint_dir / name).write_bytes(b"")
    return run


def test_checkpoints_are_ordered_by_their_number_not_their_name(tmp_path):
    run = _run_folder(tmp_path)
    assert [path.name for path in run.epoch_checkpoints()] == ["epoch_1.pt", "epoch_2.pt", "epoch_10.pt"]
    assert [path.name for path in run.step_checkpoints()] == ["step_5.pt", "step_40.pt"]
    assert run.final_checkpoint() == run.checkpoint_dir / "epoch_10.pt" == run.epoch_checkpoint(10)


def test_a_run_without_epoch_checkpoints_names_its_folder_and_log(tmp_path):
    run = _run_folder(tmp_path, epochs=())
    with pytest.raises(FileNotFoundError, match=r"left no epoch_N\.pt checkpoint .*out\.log"):
        run.final_checkpoint()
    result = subprocess.run([sys.executable, "-m", "training.run_dir", str(run.path), "--final-checkpoint"],
                            capture_output=True, text=True)
    assert result.returncode == 1 and "left no epoch_N.pt checkpoint" in result.stderr and not result.stdout


def test_the_shell_form_prints_the_final_checkpoint(tmp_path):
    run = _run_folder(tmp_path)
    result = subprocess.run([sys.executable, "-m", "training.run_dir", str(run.path), "--final-checkpoint"],
                            capture_output=True, text=True, check=True)
    assert result.stdout.strip() == str(run.checkpoint_dir / "epoch_10.pt")


def test_records_by_kind_leave_out_a_line_still_being_written(tmp_path):
    run = RunDir(tmp_path)
    assert run.metrics() == [] and run.results() == []  # nothing logged yet
    lines = [{"kind": "train", "step": 1, "epoch": 0}, {"kind": "val", "step": 1, "epoch": 1},
             {"kind": "train", "step": 2, "epoch": 1}]
    run.metrics_path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"kind": "tra')
    assert run.metrics("train") == [lines[0], lines[2]] and run.steps() == [1, 2]
    assert run.metrics() == lines
