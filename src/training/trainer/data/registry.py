"""Name -> data source, the values of `--dataset-type`. A source declares the file endings `auto`
picks it for; registration refuses a name or an ending another source already has, so `auto` never
has to choose."""
from __future__ import annotations

import abc
import inspect
from typing import TYPE_CHECKING, Callable, ClassVar, Sequence, Tuple, Type

from open_clip_adacl.registry import Registry

from ..flags import NoOptions, check_component_options
from .ordered import OrderedPass

if TYPE_CHECKING:  # the config and loader modules import this registry
    from .config import DataConfig
    from .loader import LoaderInfo

# The registry is the bottom of training.trainer.data: `DataConfig` (training.trainer.data.config) and `LoaderInfo`
# (training.trainer.data.loader) import it, so the sources' signatures below name them without importing them.

AUTO = "auto"


class DataSource(abc.ABC):
    """A kind of data `--dataset-type` names: how its training and validation loaders are built.

    The loaders yield OpenCLIP-style batches `(images, texts, sample_index, skip_counts)` (see
    `training.trainer.data`); `training.trainer.data.loader` has the helpers that make one from a stream of whole
    batches (`stream_data`) or from a map-style dataset of samples (`indexed_data`).
    """

    description: ClassVar[str] = ""
    """What --dataset-type's help says of this source (a short phrase)."""
    suffixes: ClassVar[Tuple[str, ...]] = ()
    """Endings of --train-data / --val-data (".tar") for which --dataset-type auto picks this source."""
    reads_data: ClassVar[bool] = True
    """False for a source that makes its own samples and needs no --train-data / --val-data."""
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
        raise ValueError(f"{type(self).__name__} has no ordered pass (training.trainer.data.ordered), so only training "
                        "reads it; give data of another --dataset-type")

    def check_fields(self, cfg: DataConfig) -> None:
        """Before any work: the first samples of `cfg.train_data` (and `cfg.val_data`) carry the fields the run
        reads, else a ValueError naming the flag and the fields present. Nothing to check by default."""


def register_data_source(name: str, aliases: Sequence[str] = ()) -> Callable[[Type[DataSource]], Type[DataSource]]:
    """`@register_data_source("name")`: `--dataset-type name`; `aliases` are old names that still select it."""
    return SOURCES.register(name, aliases)


def _check_declaration(name: str, cls: type) -> None:
    if name == AUTO:
        raise ValueError(f"data source {name!r} is already --dataset-type's own value")
    if not (isinstance(cls, type) and issubclass(cls, DataSource)):
        raise TypeError(f"data source {name!r}: {cls!r} is not a subclass of training.trainer.data.DataSource")
    check_component_options("data source", name, cls.Options)
    if inspect.isabstract(cls):
        raise TypeError(f"data source {name!r}: {cls.__name__} must implement train_data and val_data")
    if not cls.description:
        raise TypeError(f"data source {name!r}: {cls.__name__}.description must say what it reads, for --help")
    for suffix in cls.suffixes:
        if not suffix.startswith("."):
            raise TypeError(f"data source {name!r}: suffix {suffix!r} must start with '.', e.g. '.tar'")
        owner = next((other for other, source in SOURCES.items() if suffix in source.suffixes), None)
        if owner is not None:
            raise ValueError(f"data source {name!r}: --dataset-type auto already picks {owner!r} for data "
                             f"ending in {suffix!r}")


SOURCES: Registry[Type[DataSource]] = Registry("data source", check=_check_declaration)


def registered_dataset_types() -> Tuple[str, ...]:
    """The values --dataset-type accepts: every registered source, "auto", then the old names that still select
    a source."""
    return (*sorted(SOURCES.names()), AUTO, *SOURCES.aliases())


def dataset_type_help() -> str:
    """--dataset-type's help, from what each registered source declares."""
    sources = "; ".join(f"{name}: {source.description}" for name, source in sorted(SOURCES.items()))
    return f"{sources}; auto (the default): by the data's ending, {_auto_suffixes()}."


def get_data_source(name: str) -> DataSource:
    if name not in SOURCES:
        raise ValueError(f"dataset_type {name!r} is not supported; choose one of {registered_dataset_types()}")
    return SOURCES.get(name)()


def resolve_dataset_type(dataset_type: str, data: str | None) -> str:
    """The source that reads `data` (--train-data or --val-data): `dataset_type` itself, or for "auto"
    the source declaring the suffix the data ends in."""
    if dataset_type != AUTO and not get_data_source(dataset_type).reads_data:
        return dataset_type
    if data is None:
        own_samples = ", ".join(name for name, source in sorted(SOURCES.items()) if not source.reads_data)
        raise ValueError(f"no data given: pass --train-data/--val-data, or a --dataset-type that makes its own "
                         f"samples ({own_samples})")
    if dataset_type != AUTO:
        return dataset_type
    for name, source in SOURCES.items():
        if data.endswith(source.suffixes):
            return name
    readers = ", ".join(name for name, source in sorted(SOURCES.items()) if source.reads_data)
    raise ValueError(f"cannot infer the dataset type of {data!r}: --dataset-type auto picks {_auto_suffixes()}; "
                     f"pass --dataset-type {readers}")


def _auto_suffixes() -> str:
    """"webdataset for .tar, csv for .csv/.tsv"."""
    return ", ".join(f"{name} for {'/'.join(source.suffixes)}" for name, source in sorted(SOURCES.items())
                     if source.suffixes)
