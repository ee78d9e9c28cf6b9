"""Trainer flags are declared once, on the config dataclasses: a second declaration of a flag, or a
reference to a flag no config declares, fails when the configs are collected."""

from dataclasses import dataclass
from typing import ClassVar, Optional

import pytest

from training.trainer.data import DataConfig
from training.trainer.flags import HelpGroup, declared_flags, flag, from_flag
from training.trainer.launch.config import CONFIGS, component_options, run_flags


@dataclass(frozen=True)
class _Epochs:
    FLAG_GROUP: ClassVar[str] = HelpGroup.OPTIMISATION
    epochs: int = flag(1, "epochs")


def test_a_flag_declared_by_two_configs_is_refused():
    @dataclass(frozen=True)
    class AlsoEpochs:
        FLAG_GROUP: ClassVar[str] = HelpGroup.OPTIMISATION
        total: int = flag(1, "epochs again", name="--epochs")

    with pytest.raises(
        TypeError,
        match=r"--epochs is declared by both _Epochs.epochs and AlsoEpochs.total; declare "
        r"it once and give the other field from_flag\('epochs'\)",
    ):
        declared_flags([_Epochs, AlsoEpochs])


def test_a_reference_to_no_flag_is_refused():
    @dataclass(frozen=True)
    class Schedule:
        steps: int = from_flag("num_steps", default=1)

    with pytest.raises(
        TypeError,
        match=r"Schedule.steps takes from_flag\('num_steps'\), but no config declares "
        r"--num-steps",
    ):
        declared_flags([_Epochs, Schedule])


def test_a_flag_whose_type_cannot_be_read_from_its_field_is_refused():
    @dataclass(frozen=True)
    class Sizes:
        FLAG_GROUP: ClassVar[str] = HelpGroup.MODEL
        sizes: Optional[tuple] = flag(None, "sizes")

    with pytest.raises(TypeError, match="Sizes.sizes: give flag"):
        declared_flags([Sizes])


def test_the_run_declares_every_flag_once_and_references_resolve():
    flags = run_flags()  # also called at import, so a violation fails `import training.trainer.launch.config`
    assert flags == declared_flags((*CONFIGS, *component_options()))
    assert flags["batch_size"].owner == "DataConfig" and flags["epochs"].owner == "RunConfig"
    # a component's own options: csv's flags on the csv source, the cooldown's on its schedule
    assert flags["csv_separator"].owner == "Options" and flags["epochs_cooldown"].owner == "CooldownOptions"
    assert DataConfig().workers == 1 and flags["workers"].default == 4  # the library default vs OpenCLIP's flag


def test_help_shows_each_flags_default_unless_unset_or_said():
    from training.trainer.launch.params import build_parser

    help_text = " ".join(build_parser().format_help().split())  # argparse wraps lines
    assert "Batch size per GPU. (default: 64)" in help_text
    assert "--csv-separator CSV_SEPARATOR For csv-like datasets, which separator to use. (default: '\\t')" in help_text
    assert "--train-group-size" in help_text and "as OpenCLIP. (default: 1)" in help_text
    # unset (None), a store_true flag, and a help that says its default itself get no suffix
    assert "Validation shards. --train-num-samples" in help_text
    assert "Sample shards with replacement. --caption-key" in help_text
    assert "(default: the first of --caption-key)" in help_text and "--caption-key), e.g." in help_text
    flags_with_defaults = [f for f in run_flags().values() if f.default not in (None, False)]
    assert all("default" in f.help_text().lower() for f in flags_with_defaults)
