"""Trainer flags are declared once, on the config dataclasses: a second declaration of a flag, or a
reference to a flag no config declares, fails when the configs are collected."""
from dataclasses import dataclass
from typing import ClassVar, Optional

import pytest

from training.config import CONFIGS, FLAGS
from training.data import DataConfig
from training.flags import HelpGroup, declared_flags, flag, from_flag


@dataclass(frozen=True)
class _Epochs:
    FLAG_GROUP: ClassVar[str] = HelpGroup.OPTIMISATION
    epochs: int = flag(1, "epochs")


def test_a_flag_declared_by_two_configs_is_refused():
    @dataclass(frozen=True)
    class AlsoEpochs:
        FLAG_GROUP: ClassVar[str] = HelpGroup.OPTIMISATION
        total: int = flag(1, "epochs again", name="--epochs")

    with pytest.raises(TypeError, match=r"--epochs is declared by both _Epochs.epochs and AlsoEpochs.total; declare "
                                        r"it once and give the other field from_flag\('epochs'\)"):
        declared_flags([_Epochs, AlsoEpochs])


def test_a_reference_to_no_flag_is_refused():
    @dataclass(frozen=True)
    class Schedule:
        steps: int = from_flag("num_steps", default=1)

    with pytest.raises(TypeError, match=r"Schedule.steps takes from_flag\('num_steps'\), but no config declares "
                                        r"--num-steps"):
        declared_flags([_Epochs, Schedule])


def test_a_flag_whose_type_cannot_be_read_from_its_field_is_refused():
    @dataclass(frozen=True)
    class Sizes:
        FLAG_GROUP: ClassVar[str] = HelpGroup.MODEL
        sizes: Optional[tuple] = flag(None, "sizes")

    with pytest.raises(TypeError, match="Sizes.sizes: give flag"):
        declared_flags([Sizes])


def test_the_run_declares_every_flag_once_and_references_resolve():
    assert declared_flags(CONFIGS) == FLAGS  # collected at import, so a violation fails `import training.config`
    assert FLAGS["batch_size"].owner == "DataConfig" and FLAGS["epochs"].owner == "RunConfig"
    assert DataConfig().workers == 1 and FLAGS["workers"].default == 4  # the library default vs OpenCLIP's flag
