"""The one registry helper behind losses, LR schedules and data sources: names and old names (aliases), refused
twice, and an old name that selects its component on the command line and in a resumed run's checkpoint."""

import pytest

from helpers.registries import scratch_entries
from open_clip_adacl.losses.clip import ClipLoss
from open_clip_adacl.losses.registry import LOSSES, register_loss
from open_clip_adacl.registry import Registry
from training import SCHEDULES, SOURCES
from training.trainer.launch.config import with_canonical_names
from training.trainer.launch.params import parse_args
from training.trainer.launch.resume import ResumeRequest, check_resume, run_changes


def test_a_name_or_an_alias_resolves_and_neither_is_taken_twice():
    shapes = Registry("shape")
    shapes.add("circle", object(), aliases=("round",))
    assert shapes.canonical("round") == "circle" and shapes.get("round") is shapes.get("circle")
    assert "round" in shapes and shapes.names() == ("circle",) and shapes.aliases() == ("round",)
    for taken in ("circle", "round"):
        with pytest.raises(ValueError, match=f"shape '{taken}' is already registered"):
            shapes.add(taken, object())
    with pytest.raises(ValueError, match="unknown shape 'square'; choose one of: circle"):
        shapes.get("square")


def test_the_trainers_three_registries_are_that_helper():
    assert all(isinstance(registry, Registry) for registry in (LOSSES, SOURCES, SCHEDULES))


def test_a_renamed_loss_keeps_its_old_name_on_the_command_line_and_in_checkpoints(monkeypatch, tmp_path):
    scratch_entries(monkeypatch, LOSSES)
    register_loss("clip-renamed", aliases=("clip-before",))(type("Renamed", (ClipLoss,), {}))
    args = parse_args(["--train-data", "x.tar", "--loss", "clip-before"])
    assert args.loss == "clip-renamed"  # params.txt records today's name
    recorded = {"loss": "clip-before", "model": "RN50", "batch_size": 64, "lr_scheduler": "cosine"}
    request = ResumeRequest(args={**recorded, "loss": "clip-renamed"}, world_size=1)
    assert check_resume({"args": recorded}, tmp_path / "epoch_1.pt", request) == {}  # not "another --loss"
    assert run_changes(with_canonical_names(recorded), request.args) == {}
