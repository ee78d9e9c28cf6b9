"""What a data source is: the `DataSource` contract a `--dataset-type` value names, the `LoaderInfo` its
loaders come in, and `register_data_source`, which checks a source against the contract and adds it to the
names `--dataset-type` accepts (`registry`)."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence, Tuple, Type

from open_clip_train.data import DataInfo

from ..flags import NoOptions
from .config import DataConfig
from .ordered import OrderedPass
from .registry import SOURCES, source_class


@dataclass
class LoaderInfo(DataInfo):
    """OpenCLIP's DataInfo (dataloader, set_epoch, shared_epoch) plus the epoch's size per rank."""

    num_samples: int = 0
    num_batches: int = 0
    data_size: int | None = None  # the samples the data holds when known without reading it (sizes.json, rows)
    sample_ids_below: int | None = None  # every sample_index is below it, when known before reading (a csv's rows)


class DataSource(abc.ABC):
    """A kind of data `--dataset-type` names: how its training and validation loaders are built.

    The loaders yield `Batch`es (`training.trainer.data.batch`: OpenCLIP-style `(images, texts, ...)` tuples with
    named fields); `training.trainer.data.loader` has the helpers that make one from a stream of whole
    batches (`stream_data`) or from a map-style dataset of samples (`indexed_data`).
    """

    description: ClassVar[str] = ""
    """What --dataset-type's help says of this source (a short phrase)."""
    suffixes: ClassVar[Tuple[str, ...]] = ()
    """Endings of --train-data / --val-data (".tar") for which --dataset-type auto picks this source."""
    reads_data: ClassVar[bool] = True
    """False for a source that makes its own samples and needs no --train-data / --val-data."""
    one_caption: ClassVar[bool] = False
    """True for a source whose samples all have the same caption (a loss reading the captions learns nothing)."""
    Options: ClassVar[type] = NoOptions
    """The source's own flags (a frozen dataclass of `flag(...)` fields, e.g. csv's --csv-separator); the run's
    values reach it as `cfg.source_options`."""

    def options(self, cfg: DataConfig):
        """This source's options in `cfg` (its declared defaults when `cfg` carries another's or none)."""
        return cfg.source_options if isinstance(cfg.source_options, self.Options) else self.Options()

    @abc.abstractmethod
    def train_data(self, cfg: DataConfig, preprocess: Callable, tokenizer: Callable, epoch: int) -> LoaderInfo:
        """The training loader of `cfg.train_data`, positioned at `epoch` and `cfg.skip_batches` batches into it.

        Every epoch has the same number of batches per rank; a batch's samples depend only on the
        data, the seed, the epoch and the batch's position, so a resumed run reads what the
        interrupted one would have.
        """

    @abc.abstractmethod
    def val_data(self, cfg: DataConfig, preprocess: Callable, tokenizer: Callable) -> LoaderInfo:
        """One unshuffled pass over `cfg.val_data`."""

    def ordered_pass(self, cfg: DataConfig, data: str | None, data_flag: str) -> OrderedPass:
        """One pass over `data` in its own order, checked as training checks it (training.trainer.data.ordered), for
        tools that read a dataset (discovery); `data_flag` names the flag that gave `data` in errors. A source
        that cannot give one says so."""
        raise ValueError(
            f"{type(self).__name__} has no ordered pass (training.trainer.data.ordered), so only training "
            "reads it; give data of another --dataset-type"
        )

    def check_fields(self, cfg: DataConfig) -> None:
        """Before any work: the first samples of `cfg.train_data` (and `cfg.val_data`) carry the fields the run
        reads, else a ValueError naming the flag and the fields present. Nothing to check by default."""


def register_data_source(name: str, aliases: Sequence[str] = ()) -> Callable[[Type[DataSource]], Type[DataSource]]:
    """`@register_data_source("name")`: `--dataset-type name`; `aliases` are old names that still select it."""

    def register(cls: Type[DataSource]) -> Type[DataSource]:
        if not (isinstance(cls, type) and issubclass(cls, DataSource)):
            raise TypeError(f"data source {name!r}: {cls!r} is not a subclass of training.trainer.data.DataSource")
        return SOURCES.add(name, cls, aliases)

    return register


def get_data_source(name: str) -> DataSource:
    """The source `--dataset-type name` selects (not "auto": `registry.resolve_dataset_type` resolves that)."""
    return source_class(name)()
