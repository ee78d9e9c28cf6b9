import json
import subprocess
import sys

import pytest

from open_clip_adacl import get_loss_class
from training import ConfigError, RunDir
from training.trainer.distributed import DistributedEnv
from training.trainer.launch.config import LossConfig
from training.trainer.launch.folder import LossJournals, RunPaths
from training.trainer.launch.trainer import build_loss

ClipLoss = get_loss_class("clip")


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
    result = subprocess.run(
        [sys.executable, "-m", "training.trainer.run_folder.layout", str(run.path), "--final-checkpoint"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1 and "left no epoch_N.pt checkpoint" in result.stderr and not result.stdout


def test_the_shell_form_prints_the_final_checkpoint(tmp_path):
    run = _run_folder(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "training.trainer.run_folder.layout", str(run.path), "--final-checkpoint"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == str(run.checkpoint_dir / "epoch_10.pt")


def test_lines_by_kind_leave_out_a_line_still_being_written(tmp_path):
    run = RunDir(tmp_path)
    assert run.metrics() == [] and run.results() == []  # nothing logged yet
    lines = [
        {"kind": "train", "step": 1, "epoch": 0},
        {"kind": "val", "step": 1, "epoch": 1},
        {"kind": "train", "step": 2, "epoch": 1},
    ]
    run.metrics_path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"kind": "tra')
    assert run.metrics("train") == [lines[0], lines[2]] and run.steps() == [1, 2]
    assert run.metrics() == lines


class JournalingLoss:
    """A loss's `journals()` as the trainer sees it: whatever the test sets."""

    def __init__(self):
        self.now = {}

    def journals(self):
        return self.now


def test_the_loss_journals_are_written_when_they_change_on_rank_0_only(tmp_path):
    loss = JournalingLoss()
    journals = LossJournals(loss, RunPaths("run", str(tmp_path), None, None), DistributedEnv())
    path = RunDir(tmp_path).loss_journal_path("choices")
    journals.update()
    assert not path.exists()  # nothing recorded yet: no file
    loss.now = {"choices": [{"rows": 32, "choice": "eager"}]}
    journals.update()
    assert json.loads(path.read_text()) == [{"rows": 32, "choice": "eager"}]
    path.write_text("left alone")
    journals.update()  # unchanged: not rewritten
    assert path.read_text() == "left alone"
    loss.now = {"choices": [{"rows": 32, "choice": "eager"}, {"rows": 16, "choice": "eager"}]}
    journals.update()
    assert len(json.loads(path.read_text())) == 2
    other_rank = LossJournals(loss, RunPaths("run", str(tmp_path / "rank1"), None, None), DistributedEnv(rank=1))
    other_rank.update()
    assert not (tmp_path / "rank1").exists()


def test_a_loss_journal_that_cannot_be_written_is_logged_not_raised(tmp_path, caplog):
    loss = JournalingLoss()
    loss.now = {"choices": [1]}
    journals = LossJournals(loss, RunPaths("run", str(tmp_path / "gone"), None, None), DistributedEnv())
    with caplog.at_level("WARNING"):
        journals.update()
        journals.update()  # the same journal: not tried again, nor logged again
    assert caplog.text.count("Could not write") == 1 and "training goes on" in caplog.text


def test_a_loss_that_asks_for_a_plot_the_trainer_does_not_draw_is_refused(monkeypatch):
    monkeypatch.setattr(ClipLoss, "plots", ("histogram",))
    with pytest.raises(
        ConfigError,
        match=r"--loss clip asks for the plot\(s\) histogram, which the trainer does not "
        r"draw \(it draws: margins\)",
    ):
        build_loss(LossConfig(name="clip", options=ClipLoss.Options()), DistributedEnv())
