"""A new data source is one module: this file declares one that reads a small format of its own
(`.pairs`: one "r,g,b<TAB>caption" line per sample, a solid-colour image), registers it and trains
and validates on it through `training.main`, with no edit anywhere else. It becomes a value of
`--dataset-type` (in --help and params.txt), `auto` picks it by its suffix, its own option is a flag
of the trainer (`--pairs-separator`), and the run reads exactly its samples. Its ordered pass (one more
method) lets `python -m training.discover` read it too."""

import io
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from PIL import Image
from torch.utils.data import Dataset

from helpers.registries import scratch_entries
from helpers.run_utils import tiny_argv
from training import RunDir
from training.discover import main as discover
from training.main import main
from training.trainer.data import DataSource, register_data_source, registry, resolve_dataset_type
from training.trainer.data.loader import indexed_data
from training.trainer.data.ordered import OrderedPass, PassSample
from training.trainer.flags import HelpGroup, NoOptions, flag
from training.trainer.launch.params import build_parser

NAME = "pairs"
SERVED = []  # sample indices the training loader's dataset handed out, in order (workers=0: this process)


def read_lines(path, separator):
    with open(path) as f:
        return [line.rstrip("\n").split(separator) for line in f if line.strip()]


def solid_image(rgb):
    return Image.new("RGB", (32, 32), tuple(int(channel) for channel in rgb.split(",")))


class PairsFile(Dataset):
    """The lines of a .pairs file; item i is (preprocessed solid-colour image, caption, i)."""

    def __init__(self, path, preprocess, *, record, separator="\t"):
        self.lines = read_lines(path, separator)
        self.preprocess = preprocess
        self.record = record

    def __len__(self):
        return len(self.lines)

    def __getitem__(self, index):
        rgb, caption = self.lines[index]
        if self.record:
            SERVED.append(index)
        return self.preprocess(solid_image(rgb)), caption, index


@dataclass(frozen=True)
class PairsPass(OrderedPass):
    """The lines in file order, each image PNG-encoded."""

    path: str
    lines: tuple
    num_samples: int
    caption_field: str = "the caption after the colour"

    def items(self, events):
        for number, (rgb, caption) in enumerate(self.lines):
            png = io.BytesIO()
            solid_image(rgb).save(png, format="PNG")
            yield PassSample(f"line {number + 1}", self.path, caption, png.getvalue())


class Pairs(DataSource):
    description = "a .pairs file: one 'r,g,b<TAB>caption' line per solid-colour image"
    suffixes = (".pairs",)

    @dataclass(frozen=True)
    class Options:
        FLAG_GROUP: ClassVar[str] = HelpGroup.DATA

        pairs_separator: str = flag("\t", "Between a .pairs line's colour and its caption.")

    def train_data(self, cfg, preprocess, tokenizer, epoch):
        lines = PairsFile(cfg.train_data, preprocess, record=True, separator=self.options(cfg).pairs_separator)
        return indexed_data(lines, cfg, tokenizer, epoch, train=True, source=NAME)

    def val_data(self, cfg, preprocess, tokenizer):
        lines = PairsFile(cfg.val_data, preprocess, record=False, separator=self.options(cfg).pairs_separator)
        return indexed_data(lines, cfg, tokenizer, 0, train=False, source=NAME)

    def ordered_pass(self, cfg, data, data_flag):
        lines = tuple(map(tuple, read_lines(data, self.options(cfg).pairs_separator)))
        return PairsPass(data, lines, num_samples=len(lines))


@pytest.fixture
def registered(monkeypatch):
    """The source registered with the real decorator, in a copy of the registry this test throws away."""
    scratch_entries(monkeypatch, registry.SOURCES)
    register_data_source(NAME)(Pairs)
    SERVED.clear()


def write_pairs(path, count, separator="\t"):
    colours = [(255 * (i % 2), 255 * (i // 2 % 2), 255 * (i // 4 % 2)) for i in range(count)]
    lines = (f"{r},{g},{b}{separator}solid colour number {i}\n" for i, (r, g, b) in enumerate(colours))
    path.write_text("".join(lines))
    return path


def test_a_data_source_declared_in_one_file_trains_through_the_trainer(registered, tmp_path):
    help_text = " ".join(build_parser().format_help().split())
    assert "{csv,pairs,synthetic,webdataset,auto}" in help_text and Pairs.description in help_text
    assert "--pairs-separator PAIRS_SEPARATOR Between a .pairs line's colour and its caption." in help_text
    train, val = write_pairs(tmp_path / "train.pairs", 24, "|"), write_pairs(tmp_path / "val.pairs", 10, "|")
    summary = main(
        tiny_argv(
            tmp_path,
            "pairs",
            *("--dataset-type", NAME, "--val-data", str(val), "--lr", "1e-3", "--pairs-separator", "|"),
            data=train,
            batch_size=8,
            epochs=2,
        )
    )
    run = tmp_path / "pairs"
    assert f"dataset_type: {NAME}" in (run / "params.txt").read_text()
    assert "pairs_separator: |" in (run / "params.txt").read_text()
    # The epoch's size is the file's: 24 lines, batches of 8, two epochs; each line read once per epoch.
    assert summary.step == 6 and [r["num_steps"] for r in RunDir(run).metrics("epoch")] == [3, 3]
    assert Counter(SERVED) == {index: 2 for index in range(24)}
    assert sorted(SERVED[:24]) == list(range(24)) and SERVED[:24] != SERVED[24:]  # reshuffled per epoch
    # Validation read the val file: all of its 10 lines (the last batch partial).
    assert [r["val/num_samples"] for r in RunDir(run).metrics("val")] == [10, 10]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in RunDir(run).metrics("train"))


def test_auto_picks_it_by_its_suffix_and_suffixes_stay_unambiguous(registered):
    assert resolve_dataset_type("auto", "data/train.pairs") == NAME
    assert resolve_dataset_type("auto", "data/shard-{000000..000003}.tar") == "webdataset"

    class Shards(Pairs):
        suffixes = (".tar",)

    with pytest.raises(ValueError, match="auto already picks 'webdataset' for data ending in '.tar'"):
        register_data_source("more-shards")(Shards)
    with pytest.raises(ValueError, match="'pairs' is already registered"):
        register_data_source(NAME)(Pairs)
    with pytest.raises(TypeError, match="is not a subclass of training.trainer.data.DataSource"):
        register_data_source("not-a-source")(object)


def test_discovery_reads_it_through_its_ordered_pass(registered, tmp_path):
    data = write_pairs(tmp_path / "data.pairs", 20, "|")
    summary = discover(
        [
            "--model",
            "adacl-tiny",
            "--data",
            str(data),
            "--pairs-separator",
            "|",
            "--batch-size",
            "8",
            "--output",
            str(tmp_path / "out"),
            "--device",
            "cpu",
            "--workers",
            "0",
        ]
    )
    assert summary["samples"] == 20 and summary["batches"] == 3 and summary["skipped"] == {}
    assert summary["settings"]["dataset_type"] == NAME

    class TrainOnly(Pairs):  # a source without an ordered pass is refused by name, before any work
        suffixes = ()
        Options = NoOptions
        ordered_pass = DataSource.ordered_pass

    register_data_source("train-only")(TrainOnly)
    with pytest.raises(ValueError, match="TrainOnly has no ordered pass"):
        discover(
            [
                "--model",
                "adacl-tiny",
                "--data",
                str(data),
                "--dataset-type",
                "train-only",
                "--output",
                str(tmp_path / "refused"),
                "--device",
                "cpu",
            ]
        )
