"""Name -> data source: the values of `--dataset-type`, and which source "auto" picks for the data given. A
source declares the file endings `auto` picks it for; registration refuses a name or an ending another
source already has, so `auto` never has to choose. What a source is (`DataSource`) and the decorator that
registers one are in `source`, which builds on these names, as the flags (`config`) do."""

from __future__ import annotations

import inspect
from typing import Tuple

from open_clip_adacl.registry import Registry

from ..flags import check_component_options

AUTO = "auto"


def _check_declaration(name: str, cls: type) -> None:
    """What registration refuses beyond a taken name: `source.register_data_source` has already checked that
    `cls` is a `DataSource`."""
    if name == AUTO:
        raise ValueError(f"data source {name!r} is already --dataset-type's own value")
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
            raise ValueError(
                f"data source {name!r}: --dataset-type auto already picks {owner!r} for data ending in {suffix!r}"
            )


# The registered `DataSource` subclasses (training.trainer.data.source), by name.
SOURCES: Registry[type] = Registry("data source", check=_check_declaration)


def registered_dataset_types() -> Tuple[str, ...]:
    """The values --dataset-type accepts: every registered source, "auto", then the old names that still select
    a source."""
    return (*sorted(SOURCES.names()), AUTO, *SOURCES.aliases())


def dataset_type_help() -> str:
    """--dataset-type's help, from what each registered source declares."""
    sources = "; ".join(f"{name}: {source.description}" for name, source in sorted(SOURCES.items()))
    return f"{sources}; auto (the default): by the data's ending, {_auto_suffixes()}."


def source_class(name: str) -> type:
    """The `DataSource` subclass registered as `name` (or an old name of it)."""
    if name not in SOURCES:
        raise ValueError(f"dataset_type {name!r} is not supported; choose one of {registered_dataset_types()}")
    return SOURCES.get(name)


def makes_its_own_samples(dataset_type: str) -> bool:
    """A registered source that reads no --train-data / --val-data (synthetic); False for "auto"."""
    return dataset_type != AUTO and not source_class(dataset_type).reads_data


def resolve_dataset_type(dataset_type: str, data: str | None) -> str:
    """The source that reads `data` (--train-data or --val-data): `dataset_type` itself, or for "auto"
    the source declaring the suffix the data ends in."""
    if makes_its_own_samples(dataset_type):
        return dataset_type
    if data is None:
        own_samples = ", ".join(name for name, source in sorted(SOURCES.items()) if not source.reads_data)
        raise ValueError(
            f"no data given: pass --train-data/--val-data, or a --dataset-type that makes its own "
            f"samples ({own_samples})"
        )
    if dataset_type != AUTO:
        return dataset_type
    for name, source in SOURCES.items():
        if data.endswith(source.suffixes):
            return name
    readers = ", ".join(name for name, source in sorted(SOURCES.items()) if source.reads_data)
    raise ValueError(
        f"cannot infer the dataset type of {data!r}: --dataset-type auto picks {_auto_suffixes()}; "
        f"pass --dataset-type {readers}"
    )


def _auto_suffixes() -> str:
    """ "webdataset for .tar, csv for .csv/.tsv"."""
    return ", ".join(
        f"{name} for {'/'.join(source.suffixes)}" for name, source in sorted(SOURCES.items()) if source.suffixes
    )
